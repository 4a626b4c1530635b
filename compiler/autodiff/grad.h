/* grad.h - building the training graph: gradient rules construct their
 * results from ordinary graph ops with these builders, so a rule is a few
 * lines and every op it uses already has shape and codegen rules.
 *
 * Builders create a node in the backward phase, run its shape rule at once,
 * and return its first output (NULL with the Diag set on failure; callers
 * pass NULL through, so rules need not check every step). */
#ifndef CLEAVE_GRAD_H
#define CLEAVE_GRAD_H

#include "../ir/ir.h"

typedef struct GradCtx GradCtx;
struct TrainGraph;
struct GradCtx {
    Graph *g;
    Diag *d;
    NodePhase phase; /* phase given to built nodes */
    int replicas;    /* data-parallel replicas (gradient seed 1/replicas) */
    int stat_replicas; /* replicas whose rows batch statistics cover */
    int microbatches;  /* micro-batches of a step (1: the rank's rows at once) */
    Node *origin;    /* given to built nodes (see Node.origin) */
    struct TrainGraph *train; /* the training graph being built (train.h) */
};

/* A node of op (domain "" or "cleave") with the given inputs; attributes
 * are added before gb_finish runs its shape rule. */
Node *gb_start(GradCtx *c, const char *domain, const char *op, int n_in, Value *const *in, int n_out);
void gb_attr_i(GradCtx *c, Node *n, const char *name, int64_t v);
void gb_attr_f(GradCtx *c, Node *n, const char *name, float v);
void gb_attr_ints(GradCtx *c, Node *n, const char *name, const int64_t *v, int count);
void gb_attr_floats(GradCtx *c, Node *n, const char *name, const float *v, int count);
void gb_attr_s(GradCtx *c, Node *n, const char *name, const char *v);
Value *gb_finish(GradCtx *c, Node *n);
/* gb_finish for a node that replaces `old` (training forms): n's first
 * output becomes old's value, so every reader of old's output reads n's;
 * n takes old's name, and old is removed. */
Value *gb_finish_replacing(GradCtx *c, Node *n, Node *old);

Value *gb_op1(GradCtx *c, const char *op, Value *a);
Value *gb_op2(GradCtx *c, const char *op, Value *a, Value *b);
/* Internal ops of the "cleave" domain. */
Value *gb_internal2(GradCtx *c, const char *op, Value *a, Value *b);
/* Scalar float32 constant. */
Value *gb_const_f(GradCtx *c, float x);
/* 1-D int64 constant holding v[0..count). */
Value *gb_const_ints(GradCtx *c, const int64_t *v, int count);
/* float32 zeros of like's shape (an Expand of a scalar 0): the gradient of
 * an output nothing reads, where a rule needs one. */
Value *gb_zeros_like(GradCtx *c, const Value *like);
/* x scaled by s (x itself when s == 1). */
Value *gb_scale(GradCtx *c, Value *x, float s);
/* Sums x over the dimensions broadcast to reach its shape from `like`'s:
 * the gradient of an operand that was broadcast.  x itself when equal. */
Value *gb_sum_to(GradCtx *c, Value *x, const Value *like);
/* x reshaped to `like`'s shape (a copy of its shape as a constant). */
Value *gb_reshape_like(GradCtx *c, Value *x, const Value *like);
/* Transpose with the given permutation. */
Value *gb_transpose(GradCtx *c, Value *x, const int64_t *perm, int rank);

#endif
