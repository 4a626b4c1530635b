/* cg_fuse.h - element-wise chains fused into one loop (cg_fuse.c). */
#ifndef CLEAVE_CG_FUSE_H
#define CLEAVE_CG_FUSE_H

#include "cg.h"

/* Finds the chains in every program's train and eval sequences (programs
 * 0..n_programs-1, as plan_stage_rank numbers them), checks each call's
 * buffers, and builds the kernels of the chains safe in every call.  Call
 * after the nodes' own kernels exist. */
bool cg_fuse_scan(Cg *c, int n_programs);
/* The fused kernel to call at step s of program prog's train (pass 0) or
 * eval (pass 1) sequence, with the number of steps it stands for; NULL:
 * run step s's own kernel. */
const CgKernel *cg_fused_at(const Cg *c, int prog, int pass, int s, int *n_steps);
/* Element-wise chains fused, the nodes in them, those headed by a
 * convolution (or another kernel working in blocks of rows), reductions
 * taken in such a kernel's blocks, and chains left unfused because a
 * call's buffers overlap (for --verbose). */
void cg_fuse_stats(const Cg *c, int *chains, int *nodes, int *headed, int *tails, int *unfused);
void cg_fuse_free(CgFuse *f);

#endif
