/* ops_window.h - the window geometry of Conv, ConvTranspose and the pools
 * (NCHW), the LLVM index arithmetic their kernels share, and the shape and
 * gradient helpers of both families (ops_nn.c, ops_pool.c; defined in
 * ops_window.c). */
#ifndef CLEAVE_OPS_WINDOW_H
#define CLEAVE_OPS_WINDOW_H

#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "ops.h"

/* Conv and the pools slide a window over the spatial dims.  Along spatial
 * axis j, output position o and kernel offset k read input position
 * i = o*s - pb + k*d, which exists when 0 <= i < in; positions outside are
 * padding (skipped: zeros for Conv, excluded for MaxPool and AveragePool).
 * Loops run only over the valid ranges, so no kernel tests bounds per
 * element. */

typedef struct Win {
    int nsp; /* spatial dims */
    int64_t in[MAX_RANK], out[MAX_RANK], k[MAX_RANK], s[MAX_RANK], d[MAX_RANK], pb[MAX_RANK], pe[MAX_RANK];
    int64_t in_sz, out_sz, k_sz; /* elements of one spatial plane / kernel */
} Win;

/* The sizes, strides and dilations of node n's window between input-shaped
 * x and output-shaped y (both NCHW), no padding yet. */
void win_init(const Node *n, const Value *x, const Value *y, const int64_t *kernel, Win *w);

/* Geometry of node n whose input-shaped value is x and output-shaped value
 * y (both NCHW), with the given kernel sizes: strides, dilations, and the
 * padding auto_pad or pads amount to. */
void win_resolve(const Node *n, const Value *x, const Value *y, const int64_t *kernel, Win *w);

/* A pointwise convolution's window (1x1 kernel, stride 1, no padding)
 * maps each plane element to itself: rewrites it as one contiguous row,
 * which the kernels walk in one run.  Other windows stay as they are. */
void win_flatten_pointwise(Win *w);

/* Row-major strides of dims[0..r). */
void strides_of(const int64_t *dims, int r, int64_t *st);

/* max(a, b) and min(a, b) of signed i64 values. */
LLVMValueRef imax(Cg *c, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef imin(Cg *c, LLVMValueRef a, LLVMValueRef b);

/* a + x*m for constants a and m. */
LLVMValueRef affine(Cg *c, int64_t a, LLVMValueRef x, int64_t m);

/* a / k (signed, truncating) for a constant k. */
LLVMValueRef sdiv_k(Cg *c, LLVMValueRef a, int64_t k);

/* Smallest j >= 0 with j*div >= t: max(0, ceil(t/div)). */
LLVMValueRef lo_bound(Cg *c, LLVMValueRef t, int64_t div);

/* One past the largest j < limit with j*div <= u: clamp(floor(u/div)+1,
 * 0, limit); 0 when u < 0. */
LLVMValueRef hi_bound(Cg *c, LLVMValueRef u, int64_t div, int64_t limit);

/* Kernel offsets k of axis j that read inside the input at output o. */
void kernel_range(Cg *c, const Win *w, int j, LLVMValueRef o, LLVMValueRef *lo, LLVMValueRef *hi);

/* Output positions o of axis j whose kernel offset k reads inside. */
void output_range(Cg *c, const Win *w, int j, LLVMValueRef k, LLVMValueRef *lo, LLVMValueRef *hi);

/* Input position o*s - pb + k*d of axis j. */
LLVMValueRef in_pos(Cg *c, const Win *w, int j, LLVMValueRef o, LLVMValueRef k);

/* ---- shared by ops_nn.c and ops_pool.c ---- */

/* Spatial output sizes of Conv and the pools, honouring auto_pad, pads,
 * strides, dilations and ceil_mode; kernel[] holds the window size per
 * spatial axis, out[] receives the nsp spatial dims. */
bool window_out(OpCtx *c, const Node *n, const Value *x, const int64_t *kernel, int nsp, bool ceil_mode,
                Dim *out);

/* [N, C, spatial...] as output 0 of n, N from its first input, the
 * channels ch, the spatial dims from its "spatial" attribute. */
bool spatial_out(OpCtx *c, Node *n, Dim ch);

/* sum over t < len of a[ab + t] * b[bb + t*bs] (of a[ab + t] alone when b
 * is NULL), len known at run time; the order of the sum is fixed. */
LLVMValueRef dot_rt(Cg *c, const Value *a, LLVMValueRef ab, const Value *b, LLVMValueRef bb, int64_t bs,
                    LLVMValueRef len);

/* Refuses node n's gradient as unsupported, saying why. */
bool grad_refuse(GradCtx *c, const Node *n, const char *why);

/* Window w as explicit attributes of gradient node g. */
void win_attrs(GradCtx *c, Node *g, const Win *w);

/* Whether v has rank >= 3 and known spatial dims. */
bool spatial_known(const Value *v);

#endif
