/* ops_conv.h - the fast paths of Conv's three training kernels (forward,
 * input gradient, weight gradient): packed matrix products
 * (ops_conv_gemm.c) and depthwise vectors (ops_conv_depthwise.c).  What
 * neither takes runs the direct loops of ops_nn.c.
 *
 * A convolution of one group is the product of its filters, Mpg x K with
 * K = Cpg * kernel elements, by the patch matrix of its input, K x P with
 * one column per output position.  The kernels here write the patches of
 * a block of samples into a scratch matrix (im2col), run cg_gemm on it, and
 * for the input gradient scatter the product's columns back onto the image
 * (col2im).  Kernel offsets that read only padding are left out, and over
 * small planes the forward pass runs one product per kernel offset, over
 * the positions where it reads inside (ops_conv_gemm.c, "taps" and "tap
 * products").  Depthwise convolutions (one input channel per group) take
 * the depthwise kernels; other convolutions with few output channels per
 * group or too little work keep the direct kernels. */
#ifndef CLEAVE_OPS_CONV_H
#define CLEAVE_OPS_CONV_H

#include "ops_window.h"

/* A convolution's sizes: batch N, channels C (input) and M (output),
 * groups G, and the window w. */
typedef struct ConvShape {
    Win w;
    int64_t N, C, M, G;
} ConvShape;

/* Whether the convolution takes the product path.  x, f and y are its
 * input-, filter- and output-shaped values (all three must be float32). */
bool conv_gemm_applies(const ConvShape *s, const Value *x, const Value *f, const Value *y);

/* Y = B + X (*) W; B may be NULL.  Emitted inside an open kernel; epi
 * (or NULL) runs after each block of samples is complete (cg.h). */
void conv_gemm_forward(Cg *c, const ConvShape *s, const Value *X, const Value *W, const Value *B, const Value *Y,
                       const CgEpilogue *epi);
/* The patch matrix of samples [n0, n0+nb) of group g of the
 * input-shaped x (ops_conv_patches.c): element (ch*ksz + kernel offset,
 * nl*P + p) of cols is x[n0+nl, g*Cpg+ch] at the input position output p
 * reads through that offset.  Gathering (im2col) copies x into cols,
 * zeros where the window reads padding; scattering (col2im) adds cols
 * into x.  With nr > 0 (gathering only, where conv_patches_in_panels
 * allows it) cols is laid out as a packed product's B operand instead
 * (cg_gemm.h, CgGemm.b_packed: panels of nr columns over all K rows),
 * so the product reads the patches where the walk wrote them.  phases
 * (gathering only): scratch of conv_phase_floats(s, nb) floats for the
 * block's phase planes (below), which the walk fills from x and reads
 * instead of x, or NULL. */
void conv_patch_walk(Cg *c, const ConvShape *s, const Value *x, LLVMValueRef n0, int64_t nb, LLVMValueRef g,
                     LLVMValueRef cols, bool scatter, int64_t nr, LLVMValueRef phases);
/* Whether the walk can write nb samples' patches in panels of nr
 * columns: every vector it stores then starts at a whole vector's column
 * and so lies inside one panel. */
bool conv_patches_in_panels(const ConvShape *s, int64_t nb, int64_t nr);
/* Phase planes (ops_conv_phases.c): a strided convolution's input split
 * by position modulo the stride, each phase a plane of w.in = ceil(in /
 * s) positions; kernel offset k reads phase f(k) at the output positions
 * shifted by q(k), so that its patches are read at stride 1. */
typedef struct ConvPhases {
    Win w;         /* positions in a phase plane: w.in per axis, stride and dilation 1, no padding */
    int64_t S;     /* phases per channel */
    int64_t plane; /* floats of one phase plane */
} ConvPhases;
/* Whether the walk takes phase planes for this convolution (strides of
 * 2 to 4 whose every phase some offset reads, planes small enough to
 * copy by unrolled shuffles, whole runs of positions after). */
bool conv_phases_of(const ConvShape *s, ConvPhases *ph);
/* Scratch floats of nb samples' phase planes; 0 when not taken. */
int64_t conv_phase_floats(const ConvShape *s, int64_t nb);
/* Copies group g's channels of samples [n0, n0+nb) of x into phase
 * planes at dst: channel ch of sample nl at (nl*Cpg + ch) * S * plane,
 * its phases in row-major order of the strides, the positions past the
 * input's end zero. */
void conv_phase_copy(Cg *c, const ConvShape *s, const ConvPhases *ph, const Value *x, LLVMValueRef n0, int64_t nb,
                     LLVMValueRef g, LLVMValueRef dst);
/* Where a channel's phase planes lie: channel ch of block sample nl
 * from nl*sample + ch*chan on, its phases gap floats apart (conv_phase_copy
 * puts each channel's phases one after the other). */
typedef struct ConvPhaseLayout {
    int64_t sample, chan, gap;
} ConvPhaseLayout;
/* The reverse: x's planes of those channels and samples overwritten from
 * the phase planes at src, laid out as pl says. */
void conv_phase_back(Cg *c, const ConvShape *s, const ConvPhases *ph, LLVMValueRef src, const ConvPhaseLayout *pl,
                     const Value *x, LLVMValueRef n0, int64_t nb, LLVMValueRef g);
/* Whether col2im can add a strided convolution's patch matrix into its
 * phase planes a vector at a time (conv_phase_scatter): phase planes (ph)
 * of the output's sizes, whole planes to a vector, so that every lane of
 * a row's vector goes to the same lane of a phase's, shifted within its
 * sample by the offset's q. */
bool conv_phase_scatters(const ConvShape *s, ConvPhases *ph);
/* col2im into phase planes: for each of group g's channels ch and kernel
 * offsets k in order, acc[(f(k)*Cpg + ch)*ncols + e] += row (ch*ksz + k)
 * of cols (ncols columns: samples x P positions) at the position that
 * output reads, for the block's e < ncols; then conv_phase_back with
 * ConvPhaseLayout {plane, ncols, Cpg*ncols} copies acc onto dX.  Each
 * element adds its offsets in col2im's order. */
void conv_phase_scatter(Cg *c, const ConvShape *s, const ConvPhases *ph, LLVMValueRef cols, int64_t ncols,
                        LLVMValueRef acc);
/* to[e] = from[map[e]] (0 where map[e] < 0) for e < dst_n, from holding
 * src_n floats: the pattern fixed at compile time, each vector of `to`
 * picked by shuffles out of the vectors of `from` it needs (a gather
 * where it needs more than eight), each of those loaded once.  Unrolled:
 * for copies of some tens of vectors. */
void conv_map_copy(Cg *c, const int64_t *map, int64_t dst_n, LLVMValueRef from, int64_t src_n, LLVMValueRef to);
/* For kernel offsets k[]: the shifts kq[] at which they read their
 * phase plane, and *off, that plane's first float within a channel. */
void conv_phase_offset(Cg *c, const ConvShape *s, const ConvPhases *ph, const LLVMValueRef *k, LLVMValueRef *kq,
                       LLVMValueRef *off);
/* dX = the transposed convolution of dY by W. */
void conv_gemm_grad_input(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX);
/* dW = sum over the batch of dY correlated with X; with acc (float64
 * scratch of dW's elements) the blocks of samples are summed in float64. */
void conv_gemm_grad_weight(Cg *c, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                           const Value *acc);

/* Whether the convolution is depthwise (groups = input channels) and
 * float32: then the kernels below serve it, with any channel multiplier,
 * stride, padding and dilation. */
bool conv_depthwise_applies(const ConvShape *s, const Value *x, const Value *f, const Value *y);
void conv_depthwise_forward(Cg *c, const ConvShape *s, const Value *X, const Value *W, const Value *B, const Value *Y,
                            const CgEpilogue *epi);
void conv_depthwise_grad_input(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX);
void conv_depthwise_grad_weight(Cg *c, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                                const Value *acc);

/* Which kernels serve a convolution: depthwise ones for depthwise
 * convolutions, else packed products where they pay, else the direct
 * loops of ops_nn.c.  x, f and y are its input-, filter- and
 * output-shaped values. */
typedef enum { CONV_DIRECT, CONV_DEPTHWISE, CONV_PACKED } ConvPath;
ConvPath conv_path(const ConvShape *s, const Value *x, const Value *f, const Value *y);

/* The three kernels on path p (not CONV_DIRECT), inside an open kernel;
 * the forward pass runs epi (or NULL) after each block of samples. */
void conv_fast_forward(Cg *c, ConvPath p, const ConvShape *s, const Value *X, const Value *W, const Value *B,
                       const Value *Y, const CgEpilogue *epi);
void conv_fast_grad_input(Cg *c, ConvPath p, const ConvShape *s, const Value *dY, const Value *W, const Value *dX);
void conv_fast_grad_weight(Cg *c, ConvPath p, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                           const Value *acc);

#endif
