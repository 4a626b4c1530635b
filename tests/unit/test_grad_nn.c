/* test_grad_nn.c - convolution, pooling and normalisation: gradients by
 * finite differences, and forward numerics against ONNX's operator tests.
 *
 * Gradient cases build one op (or a short chain) over float initializers,
 * add loss = ReduceSum(y * R) for a fixed random R, compile the training
 * program in-process, and compare the gradient of every parameter after
 * one train step (learning rate 0) with central differences of the loss
 * computed by more train steps at learning rate 0.
 *
 * The forward check runs every ../shared/onnx-node-tests folder of these
 * ops through a forward-only program and compares each output with the
 * expected tensor (rtol 1e-4, atol 1e-5).  Models refused with
 * DIAG_UNSUPPORTED are counted and listed, not failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "codegen/cg_gemm.h"
#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "ops/ops.h"
#include "ops/ops_pool.h"

/* ---- building cases ---- */

/* |fd - g| <= atol + rtol * max(|fd|, |g|), atol 1e-3 */
static bool agree(double fd, double an, double rtol) {
    const double atol = 1e-3;
    return fabs(fd - an) <= atol + rtol * fmax(fabs(fd), fabs(an));
}

/* Cases draw from xorshift64* seeded with 0x9e3779b97f4a7c15. */
static const GradRules rules = {"grad_nn_case", grad_rand_xorshift, 0x9e3779b97f4a7c15ull, agree};

static void nn_attr_s(Node *n, const char *name, const char *s) {
    ck_assert_int_lt(n->n_attr, 8);
    n->attrs[n->n_attr++] = (Attr){.name = name, .kind = ATTR_STRING, .s = s};
}

#define D(...) ((int64_t[]){__VA_ARGS__})
#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

/* ---- gradient cases ---- */

typedef struct ConvSpec {
    int rank; /* of X */
    const int64_t *x, *w;
    bool bias;
    int64_t group;
    const int64_t *pads, *strides, *dil; /* NULL: attribute absent */
    const char *auto_pad;
} ConvSpec;

static void conv_case_once(const ConvSpec *cs) {
    GradCase k;
    grad_case_init(&k, &rules);
    int nsp = cs->rank - 2;
    Value *in[3] = {grad_param(&k, "X", cs->rank, cs->x), grad_param(&k, "W", cs->rank, cs->w), NULL};
    if (cs->bias) in[2] = grad_param(&k, "B", 1, cs->w);
    Node *n = grad_node(&k, "Conv", cs->bias ? 3 : 2, in);
    if (cs->group != 1) gb_attr_i(&k.gc, n, "group", cs->group);
    if (cs->pads) gb_attr_ints(&k.gc, n, "pads", cs->pads, 2 * nsp);
    if (cs->strides) gb_attr_ints(&k.gc, n, "strides", cs->strides, nsp);
    if (cs->dil) gb_attr_ints(&k.gc, n, "dilations", cs->dil, nsp);
    if (cs->auto_pad) nn_attr_s(n, "auto_pad", cs->auto_pad);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}

/* Each Conv case four times: with the kernels the sizes pick (the
 * depthwise ones for depthwise cases, else the direct ones at these
 * sizes), with every other convolution forced onto the packed products
 * (ops_conv_gemm.c, in blocks of one and of several samples), the same
 * with vectors of 8 floats (an AVX2 machine's: the shuffles of phase
 * planes and packed filters are built for the width), and with the
 * packed and depthwise paths off (the direct loops). */
static void conv_case(const ConvSpec *cs) {
    conv_case_once(cs);
    cg_gemm_configure(&(CgGemmConfig){.force = 1});
    conv_case_once(cs);
    cg_gemm_configure(&(CgGemmConfig){.force = 1, .w = 8});
    conv_case_once(cs);
    cg_gemm_configure(&(CgGemmConfig){.force = -1});
    conv_case_once(cs);
    cg_gemm_configure(NULL);
}

START_TEST(conv_padding_stride) {
    /* asymmetric padding, unequal strides, bias */
    conv_case(&(ConvSpec){4, D(2, 3, 7, 6), D(4, 3, 3, 3), true, 1, D(1, 0, 2, 1), D(2, 1), NULL, NULL});
}
END_TEST

START_TEST(conv_groups) {
    conv_case(&(ConvSpec){4, D(2, 4, 5, 5), D(6, 2, 3, 3), true, 2, D(1, 1, 1, 1), NULL, NULL, NULL});
    /* depthwise */
    conv_case(&(ConvSpec){4, D(1, 3, 6, 5), D(3, 1, 2, 3), false, 3, D(0, 1, 1, 0), D(2, 2), NULL, NULL});
    /* pointwise (1x1): one sample, where the packed path reads the image
     * in place, and grouped over two samples */
    conv_case(&(ConvSpec){4, D(1, 4, 5, 6), D(6, 4, 1, 1), true, 1, NULL, NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 4, 3, 3), D(4, 2, 1, 1), false, 2, NULL, NULL, NULL, NULL});
}
END_TEST

/* MobileNet's depthwise 3x3 (stride 2, pads 1, a channel multiplier of 2
 * as in its first block's expansion), ShuffleNet's and RegNet's grouped 3x3
 * with dilation and uneven strides: X, W and B, every group's channels. */
START_TEST(conv_depthwise_and_grouped) {
    conv_case(&(ConvSpec){4, D(2, 3, 7, 6), D(6, 1, 3, 3), true, 3, D(1, 1, 1, 1), D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 6, 6, 7), D(4, 3, 3, 3), true, 2, D(2, 1, 2, 1), D(1, 2), D(2, 1), NULL});
    conv_case(&(ConvSpec){4, D(1, 8, 5, 5), D(8, 2, 3, 3), false, 4, NULL, D(2, 2), NULL, "SAME_UPPER"});
    conv_case(&(ConvSpec){3, D(2, 4, 9), D(4, 1, 3), true, 4, D(1, 1), D(2), NULL, NULL});
}
END_TEST

typedef struct ConvTSpec {
    int rank; /* of X */
    const int64_t *x, *w;
    bool bias;
    int64_t group;
    const int64_t *pads, *strides, *dil, *out_pad, *out_shape; /* NULL: attribute absent */
    const char *auto_pad;
} ConvTSpec;

static void convt_case(const ConvTSpec *cs) {
    GradCase k;
    grad_case_init(&k, &rules);
    int nsp = cs->rank - 2;
    int64_t m = cs->w[1] * cs->group;
    Value *in[3] = {grad_param(&k, "X", cs->rank, cs->x), grad_param(&k, "W", cs->rank, cs->w), NULL};
    if (cs->bias) in[2] = grad_param(&k, "B", 1, &m);
    Node *n = grad_node(&k, "ConvTranspose", cs->bias ? 3 : 2, in);
    if (cs->group != 1) gb_attr_i(&k.gc, n, "group", cs->group);
    if (cs->pads) gb_attr_ints(&k.gc, n, "pads", cs->pads, 2 * nsp);
    if (cs->strides) gb_attr_ints(&k.gc, n, "strides", cs->strides, nsp);
    if (cs->dil) gb_attr_ints(&k.gc, n, "dilations", cs->dil, nsp);
    if (cs->out_pad) gb_attr_ints(&k.gc, n, "output_padding", cs->out_pad, nsp);
    if (cs->out_shape) gb_attr_ints(&k.gc, n, "output_shape", cs->out_shape, nsp);
    if (cs->auto_pad) nn_attr_s(n, "auto_pad", cs->auto_pad);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}

/* nn.ConvTranspose2d(stride=2, padding=1, output_padding=1, groups=2) as a
 * U-Net's decoder uses it, and the plain 2x2 stride 2 upsampling. */
START_TEST(conv_transpose_stride_padding_groups) {
    convt_case(&(ConvTSpec){4, D(2, 4, 3, 3), D(4, 3, 3, 3), true, 2, D(1, 1, 1, 1), D(2, 2), NULL, D(1, 1), NULL,
                            NULL});
    convt_case(&(ConvTSpec){4, D(2, 3, 3, 4), D(3, 2, 2, 2), true, 1, NULL, D(2, 2), NULL, NULL, NULL, NULL});
    /* depthwise, uneven pads and strides */
    convt_case(&(ConvTSpec){4, D(1, 3, 4, 3), D(3, 1, 3, 2), false, 3, D(0, 1, 2, 0), D(2, 3), NULL, D(1, 0), NULL,
                            NULL});
}
END_TEST

/* 1-D and 3-D; dilation with output_padding past the stride (its input
 * gradient is a Conv with its extra outputs sliced off); output_shape
 * beyond the full result (zeros at the end) and auto_pad. */
START_TEST(conv_transpose_ranks_dilation_output_shape) {
    convt_case(&(ConvTSpec){3, D(2, 3, 4), D(3, 2, 3), false, 1, D(2, 1), D(3), D(2), D(2), NULL, NULL});
    convt_case(&(ConvTSpec){5, D(1, 2, 2, 3, 2), D(2, 1, 2, 2, 2), true, 2, NULL, D(2, 1, 2), NULL, NULL, NULL,
                            NULL});
    convt_case(&(ConvTSpec){4, D(1, 2, 4, 4), D(2, 3, 3, 2), true, 1, NULL, NULL, D(2, 2), D(1, 1), NULL, NULL});
    convt_case(&(ConvTSpec){4, D(1, 2, 3, 3), D(2, 2, 3, 3), false, 1, NULL, D(3, 2), NULL, NULL, D(10, 8), NULL});
    convt_case(&(ConvTSpec){4, D(2, 2, 3, 3), D(2, 1, 3, 3), true, 1, NULL, D(2, 2), NULL, NULL, NULL, "SAME_UPPER"});
    convt_case(&(ConvTSpec){4, D(2, 2, 3, 3), D(2, 1, 2, 4), false, 1, NULL, D(2, 2), NULL, NULL, NULL, "SAME_LOWER"});
}
END_TEST

/* Output rows a vector wide and more at strides 2, 3 and 4, whose patches
 * are loaded as spans and shuffled: whole vectors and a partial one,
 * padding at both ends, dilation. */
START_TEST(conv_wide_strided_rows) {
    conv_case(&(ConvSpec){3, D(2, 3, 40), D(4, 3, 5), true, 1, D(2, 2), D(2), NULL, NULL});
    conv_case(&(ConvSpec){3, D(1, 2, 70), D(4, 2, 3), false, 1, D(1, 1), D(3), NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 3, 5, 70), D(4, 3, 3, 5), true, 1, D(1, 2, 1, 2), D(2, 4), NULL, NULL});
    conv_case(&(ConvSpec){3, D(1, 2, 50), D(4, 2, 3), false, 1, D(2, 2), D(2), D(2), NULL});
}
END_TEST

START_TEST(conv_dilation) {
    conv_case(&(ConvSpec){4, D(1, 2, 8, 7), D(3, 2, 3, 2), false, 1, D(2, 1, 1, 2), D(1, 2), D(2, 3), NULL});
    /* stride 1, where the packed input gradient is a convolution of dY
     * with the flipped filters: dilation and uneven pads, and pads beyond
     * the window's reach (which keep the scatter) */
    conv_case(&(ConvSpec){4, D(2, 3, 7, 6), D(4, 3, 3, 2), true, 1, D(2, 0, 1, 1), NULL, D(2, 1), NULL});
    conv_case(&(ConvSpec){4, D(1, 2, 4, 4), D(3, 2, 2, 2), false, 1, D(2, 2, 2, 2), NULL, NULL, NULL});
}
END_TEST

/* Planes narrower than a vector, whose packed patches are whole vectors
 * of (sample, position) columns.  Strided: 2x2 and 1x1 outputs (several
 * samples per vector, the batch ending mid-vector), 5x5 (two vectors per
 * sample, the second partly empty), a 1-D row, and dilation.  At stride 1
 * with same-size planes (masked loads of contiguous positions): 4x4,
 * 2x2, 5x5 dilated; a 1x1 plane, gathered across samples. */
START_TEST(conv_small_planes) {
    conv_case(&(ConvSpec){4, D(3, 4, 4, 4), D(8, 4, 3, 3), true, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 8, 2, 2), D(8, 8, 3, 3), false, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(3, 8, 1, 1), D(8, 8, 3, 3), true, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 3, 5, 5), D(8, 3, 3, 3), true, 1, D(2, 2, 2, 2), NULL, D(2, 2), NULL});
    conv_case(&(ConvSpec){4, D(3, 4, 4, 4), D(8, 4, 3, 3), true, 1, D(1, 1, 1, 1), D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){4, D(5, 4, 4, 4), D(8, 4, 3, 3), false, 1, D(1, 1, 1, 1), D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){4, D(5, 2, 3, 3), D(8, 2, 3, 3), true, 1, NULL, D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 3, 10, 9), D(8, 3, 3, 3), true, 1, D(1, 1, 1, 0), D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){3, D(3, 4, 11), D(8, 4, 3), false, 1, D(2, 1), D(2), D(2), NULL});
}
END_TEST

/* Planes small against the window, where some kernel offsets read
 * padding at every output and the packed kernels drop them: one offset
 * kept (a 1x1 plane, also dilated: W read in place at a stride), four of
 * nine at stride 2 (a copy of the kept filters), three of five in 1-D and
 * 3x3 of 5x5 (the second at stride 1 over enough positions for the input
 * gradient's flipped filters), and a dilated window whose first kept
 * offset would pass the padding (kept whole). */
START_TEST(conv_trimmed_taps) {
    conv_case(&(ConvSpec){4, D(3, 8, 1, 1), D(8, 8, 3, 3), false, 1, D(2, 2, 2, 2), NULL, D(2, 2), NULL});
    conv_case(&(ConvSpec){4, D(3, 8, 2, 2), D(8, 8, 3, 3), true, 1, D(1, 1, 1, 1), D(2, 2), NULL, NULL});
    conv_case(&(ConvSpec){3, D(3, 4, 2), D(8, 4, 5), true, 1, D(2, 2), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(2, 4, 2, 2), D(8, 4, 5, 5), false, 1, D(2, 2, 2, 2), NULL, NULL, NULL});
    conv_case(&(ConvSpec){3, D(256, 2, 2), D(8, 2, 5), true, 1, D(2, 2), NULL, NULL, NULL});
    conv_case(&(ConvSpec){3, D(2, 4, 3), D(8, 4, 3), false, 1, D(1, 1), NULL, D(2), NULL});
}
END_TEST

/* Tap products (one product per kernel offset over the positions where it
 * reads inside): a 4x4 plane (the forward pass; the input gradient's
 * products are too shallow), a 2x2 plane with bias whose input gradient
 * reads the filters flipped in place, two groups, a channel count that is
 * not a whole number of vectors, 1-D, a 3x5 kept window of a 5x5 one, and
 * stride 2.
 * (Finite differences in float32 need few outputs: the larger shapes,
 * short last blocks among them, are checked against PyTorch by
 * py_cnn_train's resnet18 and by tests/py/test_conv_taps.py.) */
START_TEST(conv_tap_products) {
    conv_case(&(ConvSpec){4, D(1, 32, 4, 4), D(16, 32, 3, 3), false, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 32, 2, 2), D(32, 32, 3, 3), true, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 64, 2, 2), D(32, 32, 3, 3), false, 2, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 37, 3, 2), D(33, 37, 3, 3), true, 1, D(1, 1, 1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){3, D(2, 40, 2), D(40, 40, 3), true, 1, D(1, 1), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 32, 2, 3), D(32, 32, 5, 5), false, 1, D(2, 2, 2, 2), NULL, NULL, NULL});
    conv_case(&(ConvSpec){4, D(1, 32, 5, 4), D(16, 32, 3, 3), true, 1, D(1, 1, 1, 1), D(2, 2), NULL, NULL});
}
END_TEST

START_TEST(conv_auto_pad_and_ranks) {
    conv_case(&(ConvSpec){4, D(1, 2, 7, 6), D(2, 2, 3, 2), true, 1, NULL, D(2, 2), NULL, "SAME_UPPER"});
    conv_case(&(ConvSpec){3, D(2, 3, 9), D(4, 3, 4), true, 1, NULL, D(2), D(2), "SAME_LOWER"});
    conv_case(&(ConvSpec){3, D(2, 2, 8), D(3, 2, 3), false, 1, NULL, D(3), NULL, "VALID"});
    conv_case(&(ConvSpec){5, D(1, 2, 4, 5, 3), D(2, 2, 2, 3, 2), true, 1, D(1, 0, 1, 0, 1, 1), D(1, 2, 1), NULL,
                          NULL});
}
END_TEST

/* ---- Resize and Upsample ---- */

/* A 1-D constant (or initializer) of n values: Resize's scales (float32)
 * or sizes (int64). */
static Value *nn_const(GradCase *k, const char *name, ValueKind kind, DType t, int n, const double *x) {
    Value *v = graph_add_value(k->g, name);
    v->kind = kind;
    v->dtype = v->file_dtype = t;
    v->rank = 1;
    v->dims[0] = dim_const(n);
    v->konst = const_new(k->g, dtype_store(t), n);
    ck_assert_ptr_nonnull(v->konst);
    for (int i = 0; i < n; i++) const_set_f(v->konst, i, x[i]);
    return v;
}

typedef struct ResizeSpec {
    const char *op; /* Resize (opset 13 form) or Upsample (opset 9 form) */
    int rank;
    const int64_t *x;
    int n;                       /* entries of scales or sizes */
    const double *scales, *sizes; /* one of them */
    const char *mode, *coord, *nearest, *policy; /* NULL: attribute absent */
    const int64_t *axes;
    bool initializer; /* the scales are a float initializer, not a Constant */
} ResizeSpec;

#define F(...) ((double[]){__VA_ARGS__})

static void resize_case(const ResizeSpec *rs) {
    GradCase k;
    grad_case_init(&k, &rules);
    bool upsample = strcmp(rs->op, "Upsample") == 0;
    Value *in[4] = {grad_param(&k, "X", rs->rank, rs->x), NULL, NULL, NULL};
    int slot = upsample ? 1 : rs->sizes ? 3 : 2;
    in[slot] = rs->sizes ? nn_const(&k, "sizes", VAL_CONSTANT, DT_INT64, rs->n, rs->sizes)
                         : nn_const(&k, "scales", rs->initializer ? VAL_INITIALIZER : VAL_CONSTANT, DT_FLOAT, rs->n,
                                    rs->scales);
    Node *n = grad_node(&k, rs->op, slot + 1, in);
    if (rs->mode) nn_attr_s(n, "mode", rs->mode);
    if (rs->coord) nn_attr_s(n, "coordinate_transformation_mode", rs->coord);
    if (rs->nearest) nn_attr_s(n, "nearest_mode", rs->nearest);
    if (rs->policy) nn_attr_s(n, "keep_aspect_ratio_policy", rs->policy);
    if (rs->axes) gb_attr_ints(&k.gc, n, "axes", rs->axes, rs->n);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}

/* As torch exports nn.Upsample(scale_factor=2) (nearest, asymmetric,
 * floor) and F.interpolate(bilinear) with align_corners False (half_pixel)
 * and True: nearest scatters dY onto the source elements, linear adds it
 * with the weights. */
START_TEST(resize_scale_2) {
    resize_case(&(ResizeSpec){"Resize", 4, D(2, 3, 4, 5), 4, F(1, 1, 2, 2), NULL, "nearest", "asymmetric", "floor"});
    resize_case(&(ResizeSpec){"Resize", 4, D(2, 3, 4, 5), 4, F(1, 1, 2, 2), NULL, "linear", "half_pixel"});
    resize_case(&(ResizeSpec){"Resize", 4, D(1, 2, 3, 4), 4, F(1, 1, 2, 2), NULL, "linear", "align_corners"});
}
END_TEST

/* Scales that are not integers, enlarging one axis and shrinking the
 * other; sizes (pytorch_half_pixel, as F.interpolate(size=...) exports);
 * opset 18's axes and keep_aspect_ratio_policy; trilinear on 3 axes. */
START_TEST(resize_fractional_scales_and_sizes) {
    resize_case(&(ResizeSpec){"Resize", 4, D(2, 2, 4, 5), 4, F(1, 1, 1.5, 0.6), NULL, "linear", "half_pixel"});
    resize_case(&(ResizeSpec){"Resize", 4, D(2, 2, 4, 5), 4, F(1, 1, 1.7, 0.75), NULL, "nearest", "half_pixel",
                              "round_prefer_floor"});
    resize_case(&(ResizeSpec){"Resize", 4, D(1, 2, 5, 4), 4, F(1, 1, 2.5, 1.25), NULL, "linear", "align_corners"});
    resize_case(&(ResizeSpec){"Resize", 4, D(2, 2, 4, 4), 4, NULL, F(2, 2, 5, 7), "linear", "pytorch_half_pixel"});
    resize_case(&(ResizeSpec){"Resize", 4, D(1, 2, 3, 4), 2, NULL, F(7, 5), "nearest", "half_pixel", "round_prefer_ceil",
                              NULL, D(3, 2)});
    resize_case(&(ResizeSpec){"Resize", 4, D(1, 2, 3, 4), 2, NULL, F(5, 5), "linear", "half_pixel_symmetric", NULL,
                              "not_larger", D(2, 3)});
    resize_case(&(ResizeSpec){"Resize", 5, D(1, 2, 3, 2, 3), 5, F(1, 1, 2, 1.5, 2), NULL, "linear", "asymmetric"});
}
END_TEST

/* Upsample (opset 7 to 9): asymmetric coordinates, rounding down.  Scales
 * held in a float initializer (as some exporters store them) are a
 * constant operand, not a parameter to train. */
START_TEST(upsample_nearest_and_linear) {
    resize_case(&(ResizeSpec){"Upsample", 4, D(2, 3, 3, 4), 4, F(1, 1, 2, 3), NULL, "nearest"});
    resize_case(&(ResizeSpec){"Upsample", 4, D(1, 2, 3, 4), 4, F(1, 1, 2, 2), NULL, "nearest", .initializer = true});
    resize_case(&(ResizeSpec){"Resize", 4, D(1, 2, 3, 4), 4, F(1, 1, 2, 2), NULL, "linear", .initializer = true});
    resize_case(&(ResizeSpec){"Upsample", 4, D(2, 3, 3, 4), 4, F(1, 1, 2, 1.5), NULL, "linear"});
    resize_case(&(ResizeSpec){"Upsample", 3, D(2, 3, 5), 3, F(1, 1, 2.5), NULL, "nearest"});
}
END_TEST

typedef struct PoolSpec {
    const char *op;
    int rank;
    const int64_t *x, *kernel, *pads, *strides, *dil;
    int count_include_pad, ceil_mode;
} PoolSpec;

static void pool_case(const PoolSpec *ps) {
    GradCase k;
    grad_case_init(&k, &rules);
    int nsp = ps->rank - 2;
    bool max = strcmp(ps->op, "MaxPool") == 0;
    Value *in[1] = {grad_tensor(&k, "X", VAL_INITIALIZER, ps->rank, ps->x, max ? FILL_DISTINCT : FILL_UNIFORM)};
    Node *n = grad_node(&k, ps->op, 1, in);
    gb_attr_ints(&k.gc, n, "kernel_shape", ps->kernel, nsp);
    if (ps->pads) gb_attr_ints(&k.gc, n, "pads", ps->pads, 2 * nsp);
    if (ps->strides) gb_attr_ints(&k.gc, n, "strides", ps->strides, nsp);
    if (ps->dil) gb_attr_ints(&k.gc, n, "dilations", ps->dil, nsp);
    if (ps->count_include_pad) gb_attr_i(&k.gc, n, "count_include_pad", 1);
    if (ps->ceil_mode) gb_attr_i(&k.gc, n, "ceil_mode", 1);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}

START_TEST(maxpool_padding_stride) {
    pool_case(&(PoolSpec){"MaxPool", 4, D(2, 3, 7, 7), D(3, 3), D(1, 1, 1, 1), D(2, 2), NULL, 0, 0});
    pool_case(&(PoolSpec){"MaxPool", 4, D(1, 2, 8, 7), D(2, 3), D(1, 0, 0, 1), D(2, 2), D(2, 1), 0, 1});
    pool_case(&(PoolSpec){"MaxPool", 3, D(2, 2, 9), D(3), D(1, 1), D(2), NULL, 0, 0});
    /* rows wider than a vector (the vector kernels' interior loop and
     * edges), overlapping windows at stride 1; one plane each, as the
     * distinct values grow with the elements and a large loss leaves the
     * finite differences too coarse */
    pool_case(&(PoolSpec){"MaxPool", 4, D(1, 1, 3, 40), D(3, 3), NULL, NULL, NULL, 0, 0});
    pool_case(&(PoolSpec){"MaxPool", 4, D(1, 1, 5, 37), D(3, 3), D(1, 1, 1, 1), D(2, 2), NULL, 0, 0});
    pool_case(&(PoolSpec){"MaxPool", 4, D(1, 1, 4, 35), D(2, 2), NULL, D(2, 2), NULL, 0, 1});
}
END_TEST

/* ---- vector MaxPool kernels against the scalar ones, bit for bit ----
 *
 * ops_pool.c runs float32 MaxPool and MaxPoolGrad in vectors of output
 * columns.  Each lane must make the scalar kernel's comparisons in its
 * order (the first maximum in window order, NaN winning), and the
 * gradient's adds into dX, where windows overlap, must happen in the
 * scalar order.  A case builds MaxPool(X) and cleave.MaxPoolGrad(dY, X)
 * over run-time inputs full of ties (equal values, -0.0 and +0.0), NaNs
 * of distinct payloads and infinities, with dY of widely spread
 * magnitudes (so that another order of adds rounds differently), runs
 * them with the vector kernels at 4, 8 and 16 lanes and at the target's
 * width, and with the scalar kernels (cg_gemm_configure force -1), and
 * compares the bytes of Y and dX. */

typedef struct BitsSpec {
    int rank;
    const int64_t *x, *kernel, *pads, *strides, *dil; /* NULL: attribute absent */
    int ceil_mode;
} BitsSpec;

/* Output size along one axis, as MaxPool's shape rule computes it. */
static int64_t bits_out_dim(int64_t in, int64_t k, int64_t pb, int64_t pe, int64_t s, int64_t d, bool ceil) {
    int64_t span = in + pb + pe - ((k - 1) * d + 1);
    int64_t o = (ceil ? (span + s - 1) / s : span / s) + 1;
    if (ceil && (o - 1) * s >= in + pb) o--;
    return o;
}

static void bits_attr(Graph *g, Node *n, const char *name, const int64_t *v, int count) {
    int64_t *copy = ARENA_ARRAY(&g->arena, int64_t, count);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, v, sizeof *copy * (size_t)count);
    n->attrs[n->n_attr++] = (Attr){.name = name, .kind = ATTR_INTS, .n = count, .ints = copy};
}

/* The window attributes of spec b on node n (MaxPoolGrad takes them with
 * explicit pads, strides and dilations, as the gradient rule writes them). */
static void bits_window(Graph *g, Node *n, const BitsSpec *b, bool explicit) {
    int nsp = b->rank - 2;
    int64_t zeros[2 * MAX_RANK] = {0}, ones[MAX_RANK];
    for (int j = 0; j < nsp; j++) ones[j] = 1;
    bits_attr(g, n, "kernel_shape", b->kernel, nsp);
    if (b->pads || explicit) bits_attr(g, n, "pads", b->pads ? b->pads : zeros, 2 * nsp);
    if (b->strides || explicit) bits_attr(g, n, "strides", b->strides ? b->strides : ones, nsp);
    if (b->dil || explicit) bits_attr(g, n, "dilations", b->dil ? b->dil : ones, nsp);
}

/* xorshift64*: uniform bits for the inputs. */
static uint64_t bits_next(uint64_t *st) {
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* X: mostly ties from a small set (0.0 and -0.0 among them), NaNs of
 * random sign and payload, infinities, and some distinct values. */
static float bits_x(uint64_t *st) {
    static const float ties[] = {-1.0f, -0.0f, 0.0f, 0.5f, 0.5f, 2.0f, 2.0f};
    uint64_t r = bits_next(st);
    unsigned pick = (unsigned)(r % 100);
    if (pick < 60) return ties[(r >> 8) % (sizeof ties / sizeof *ties)];
    if (pick < 70) return from_bits(0x7fc00000u | (uint32_t)((r >> 8) & 0x3fffff) | (uint32_t)((r >> 40) & 1) << 31);
    if (pick < 73) return (r >> 8) & 1 ? INFINITY : -INFINITY;
    return (float)((double)(r >> 11) / 9007199254740992.0 * 4 - 2);
}

/* dY: random signs and magnitudes from 2^-20 to 2^20, and some -0.0. */
static float bits_dy(uint64_t *st) {
    uint64_t r = bits_next(st);
    if (r % 16 == 0) return -0.0f;
    float m = 1.0f + (float)((r >> 20) & 0xffff) / 65536.0f;
    return ldexpf((r >> 40) & 1 ? -m : m, (int)((r >> 8) % 41) - 20);
}

typedef struct BitsRun {
    char *y, *dx; /* the outputs' bytes */
    size_t y_bytes, dx_bytes;
} BitsRun;

/* Builds, compiles and runs spec b once under the current settings; vec:
 * whether both kernels must be the vector ones (else the scalar ones). */
static BitsRun bits_run(const BitsSpec *b, bool vec) {
    int nsp = b->rank - 2;
    int64_t ydims[MAX_RANK] = {b->x[0], b->x[1]};
    for (int j = 0; j < nsp; j++)
        ydims[2 + j] = bits_out_dim(b->x[2 + j], b->kernel[j], b->pads ? b->pads[j] : 0,
                                    b->pads ? b->pads[nsp + j] : 0, b->strides ? b->strides[j] : 1,
                                    b->dil ? b->dil[j] : 1, b->ceil_mode);
    Graph *g = test_graph_new("pool_bits.onnx", 17, 2, 2);
    Value *x = test_graph_input(g, "X", DT_FLOAT, b->rank, b->x);
    Value *dy = test_graph_input(g, "dY", DT_FLOAT, b->rank, ydims);
    Node *mp = test_graph_op(g, "MaxPool", 1, (Value *[]){x});
    mp->attrs = ARENA_ARRAY(&g->arena, Attr, 8);
    bits_window(g, mp, b, false);
    if (b->ceil_mode) mp->attrs[mp->n_attr++] = (Attr){.name = "ceil_mode", .kind = ATTR_INT, .i = 1};
    Node *gr = graph_add_node(g, NULL, "MaxPoolGrad", "cleave", 2, 1);
    ck_assert_ptr_nonnull(gr);
    gr->def = op_lookup("cleave", "MaxPoolGrad");
    ck_assert_ptr_nonnull(gr->def);
    gr->in[0] = dy;
    gr->in[1] = x;
    Value *dx = graph_add_value(g, "dX");
    dx->producer = gr;
    dx->is_output = true;
    gr->out[0] = dx;
    g->outputs[g->n_outputs++] = dx;
    gr->attrs = ARENA_ARRAY(&g->arena, Attr, 8);
    bits_window(g, gr, b, true);
    Diag d = {0};
    ShapeOptions so = {.batch = 0, .fold = true};
    ck_assert_msg(ir_verify(g, &d) && ir_infer_shapes(g, &so, &d), "front end: %s", d.msg);
    for (int j = 0; j < b->rank; j++)
        ck_assert_msg(mp->out[0]->dims[j].k == ydims[j], "Y dim %d: %lld, expected %lld", j,
                      (long long)mp->out[0]->dims[j].k, (long long)ydims[j]);
    ck_assert_msg(maxpool_vectorised(mp) == vec && maxpool_vectorised(gr) == vec,
                  "MaxPool %s, MaxPoolGrad %s the vector kernels; expected %s", maxpool_vectorised(mp) ? "takes" : "skips",
                  maxpool_vectorised(gr) ? "takes" : "skips", vec ? "both" : "neither");
    TestProg tp;
    char msg[1024];
    ck_assert_msg(test_prog_forward(&tp, g, msg, sizeof msg), "compiling: %s", msg);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    float *xb = test_buf(&tp, x), *dyb = test_buf(&tp, dy);
    for (int64_t e = 0; e < value_numel(x); e++) xb[e] = bits_x(&st);
    for (int64_t e = 0; e < value_numel(dy); e++) dyb[e] = bits_dy(&st);
    tp.eval(tp.arena);
    BitsRun r = {.y_bytes = (size_t)value_numel(mp->out[0]) * 4, .dx_bytes = (size_t)value_numel(dx) * 4};
    r.y = malloc(r.y_bytes);
    r.dx = malloc(r.dx_bytes);
    ck_assert(r.y && r.dx);
    memcpy(r.y, test_buf(&tp, mp->out[0]), r.y_bytes);
    memcpy(r.dx, test_buf(&tp, dx), r.dx_bytes);
    test_prog_free(&tp);
    return r;
}

/* First differing float of a and b, or -1. */
static int64_t bits_diff(const char *a, const char *b, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 4)
        if (memcmp(a + i, b + i, 4) != 0) return (int64_t)(i / 4);
    return -1;
}

static void bits_case(const BitsSpec *b) {
    cg_gemm_configure(&(CgGemmConfig){.force = -1});
    BitsRun want = bits_run(b, false);
    static const int widths[] = {0, 4, 8, 16};
    for (int i = 0; i < N_OF(widths); i++) {
        cg_gemm_configure(&(CgGemmConfig){.w = widths[i]});
        BitsRun got = bits_run(b, true);
        int64_t ey = bits_diff(want.y, got.y, want.y_bytes), edx = bits_diff(want.dx, got.dx, want.dx_bytes);
        float f[4] = {0};
        if (ey >= 0) memcpy(f, want.y + 4 * ey, 4), memcpy(f + 1, got.y + 4 * ey, 4);
        if (edx >= 0) memcpy(f + 2, want.dx + 4 * edx, 4), memcpy(f + 3, got.dx + 4 * edx, 4);
        ck_assert_msg(ey < 0 && edx < 0,
                      "x %lldx%lldx%lld..., %d lanes: Y differs at %lld (scalar %a, vector %a), dX at %lld "
                      "(scalar %a, vector %a)",
                      (long long)b->x[0], (long long)b->x[1], (long long)b->x[2], widths[i], (long long)ey, f[0], f[1],
                      (long long)edx, f[2], f[3]);
        free(got.y);
        free(got.dx);
    }
    cg_gemm_configure(NULL);
    free(want.y);
    free(want.dx);
}

START_TEST(maxpool_vector_bits) {
    /* resnet's stem (3x3 s2 p1) and VGG's 2x2 s2, with rows narrower and
     * wider than a vector and widths no multiple of it */
    bits_case(&(BitsSpec){4, D(2, 3, 16, 16), D(3, 3), D(1, 1, 1, 1), D(2, 2), NULL, 0});
    bits_case(&(BitsSpec){4, D(2, 4, 33, 37), D(3, 3), D(1, 1, 1, 1), D(2, 2), NULL, 0});
    bits_case(&(BitsSpec){4, D(1, 3, 5, 40), D(2, 2), NULL, D(2, 2), NULL, 0});
    bits_case(&(BitsSpec){4, D(2, 4, 33, 37), D(2, 2), NULL, D(2, 2), NULL, 0});
    /* stride 1: neighbouring windows share most of their elements */
    bits_case(&(BitsSpec){4, D(1, 3, 5, 40), D(3, 3), NULL, NULL, NULL, 0});
    bits_case(&(BitsSpec){4, D(2, 4, 33, 37), D(3, 3), D(1, 1, 1, 1), NULL, NULL, 0});
    /* ceil_mode: the last window runs past the end padding */
    bits_case(&(BitsSpec){4, D(2, 3, 12, 35), D(3, 3), D(0, 1, 0, 0), D(2, 2), NULL, 1});
    bits_case(&(BitsSpec){4, D(1, 2, 9, 50), D(2, 3), NULL, D(2, 3), NULL, 1});
    /* asymmetric padding, uneven strides and dilation */
    bits_case(&(BitsSpec){4, D(1, 2, 11, 45), D(2, 3), D(1, 2, 0, 1), D(1, 2), D(2, 2), 0});
    bits_case(&(BitsSpec){4, D(2, 2, 10, 70), D(3, 2), D(1, 1, 2, 1), D(3, 4), D(1, 3), 0});
    /* one spatial dim */
    bits_case(&(BitsSpec){3, D(2, 3, 77), D(3), D(1, 1), D(2), NULL, 0});
    bits_case(&(BitsSpec){3, D(1, 2, 19), D(4), D(2, 1), D(1), D(2), 1});
}
END_TEST

START_TEST(averagepool_count_include_pad) {
    for (int cip = 0; cip < 2; cip++) {
        pool_case(&(PoolSpec){"AveragePool", 4, D(2, 2, 6, 7), D(3, 3), D(1, 1, 1, 1), D(2, 2), NULL, cip, 0});
        pool_case(&(PoolSpec){"AveragePool", 4, D(1, 2, 7, 6), D(3, 2), D(1, 0, 1, 1), D(2, 2), NULL, cip, 1});
    }
}
END_TEST

START_TEST(global_average_pool) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[1] = {grad_param(&k, "X", 4, D(2, 3, 4, 5))};
    grad_check(&k, grad_finish(&k, grad_node(&k, "GlobalAveragePool", 1, in)), 2e-2);
}
END_TEST

START_TEST(batchnorm_inference) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[5] = {grad_param(&k, "X", 4, D(2, 3, 4, 5)), grad_param(&k, "scale", 1, D(3)), grad_param(&k, "B", 1, D(3)),
                    grad_tensor(&k, "mean", VAL_INITIALIZER, 1, D(3), FILL_UNIFORM),
                    grad_tensor(&k, "var", VAL_INITIALIZER, 1, D(3), FILL_POSITIVE)};
    Node *n = grad_node(&k, "BatchNormalization", 5, in);
    gb_attr_f(&k.gc, n, "epsilon", 1e-3f);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}
END_TEST

static void layernorm_case(const int64_t *x, int rank, int64_t axis, const int64_t *p, int prank, bool bias) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[3] = {grad_param(&k, "X", rank, x), grad_param(&k, "Scale", prank, p), NULL};
    if (bias) in[2] = grad_param(&k, "B", prank, p);
    Node *n = grad_node(&k, "LayerNormalization", bias ? 3 : 2, in);
    gb_attr_i(&k.gc, n, "axis", axis);
    grad_check(&k, grad_finish(&k, n), 2e-2);
}

START_TEST(layernorm_last_axis) {
    layernorm_case(D(3, 4, 6), 3, -1, D(6), 1, true);
    layernorm_case(D(4, 5), 2, 1, D(5), 1, false);
}
END_TEST

START_TEST(layernorm_last_two_axes) {
    layernorm_case(D(2, 3, 4), 3, 1, D(3, 4), 2, true);
    layernorm_case(D(2, 3, 4), 3, -2, D(4), 1, true); /* parameters broadcast over the normalised dims */
}
END_TEST

/* Transformer widths (768 in GPT-2 and BERT): rows of 20, two vectors of
 * 8 and a tail in the kernels' row sums, with and without bias. */
START_TEST(layernorm_transformer_rows) {
    layernorm_case(D(2, 3, 20), 3, -1, D(20), 1, true);
    layernorm_case(D(2, 3, 20), 3, -1, D(20), 1, false);
}
END_TEST

/* A scalar float constant. */
static Value *nn_scalar(GradCase *k, const char *name, double x) {
    Value *v = grad_tensor(k, name, VAL_CONSTANT, 0, NULL, FILL_UNIFORM);
    const_set_f(v->konst, 0, x);
    return v;
}

/* ReduceMean over the last axis, keeping it: the axes an attribute before
 * opset 18, an input from 18. */
static Value *mean_last(GradCase *k, Value *x) {
    int64_t last = -1;
    bool input = graph_opset(k->g, "") >= 18;
    Value *in[2] = {x, input ? gb_const_ints(&k->gc, &last, 1) : NULL};
    Node *n = grad_node(k, "ReduceMean", input ? 2 : 1, in);
    if (!input) gb_attr_ints(&k->gc, n, "axes", &last, 1);
    return grad_finish(k, n);
}

/* LayerNorm as PyTorch exports it before opset 17 (and as models written
 * out by hand compute it): (x - mean) / sqrt(mean((x - mean)^2) + eps) *
 * gamma + beta, from ReduceMean, Sub, Pow, Add, Sqrt, Div, Mul and Add, at
 * opset 17 (ReduceMean's axes an attribute) and 18 (an input). */
START_TEST(layernorm_decomposed) {
    for (int64_t opset = 17; opset <= 18; opset++) {
        GradCase k;
        grad_case_init(&k, &rules);
        k.g->opsets[0].version = opset;
        Value *x = grad_param(&k, "X", 3, D(2, 3, 12));
        Value *d = gb_op2(&k.gc, "Sub", x, mean_last(&k, x));
        Value *var = mean_last(&k, gb_op2(&k.gc, "Pow", d, nn_scalar(&k, "two", 2.0)));
        Value *sd = gb_op1(&k.gc, "Sqrt", gb_op2(&k.gc, "Add", var, nn_scalar(&k, "eps", 1e-5)));
        Value *y = gb_op2(&k.gc, "Mul", gb_op2(&k.gc, "Div", d, sd), grad_param(&k, "gamma", 1, D(12)));
        grad_check(&k, gb_op2(&k.gc, "Add", y, grad_param(&k, "beta", 1, D(12))), 2e-2);
    }
}
END_TEST

/* Conv -> BatchNormalization -> AveragePool -> GlobalAveragePool, and
 * LayerNormalization feeding MatMul, as small networks use them. */
START_TEST(chains) {
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[3] = {grad_param(&k, "X", 4, D(2, 2, 6, 6)), grad_param(&k, "W", 4, D(3, 2, 3, 3)),
                        grad_param(&k, "Bc", 1, D(3))};
        Node *conv = grad_node(&k, "Conv", 3, in);
        gb_attr_ints(&k.gc, conv, "pads", D(1, 1, 1, 1), 4);
        Value *bn_in[5] = {grad_finish(&k, conv), grad_param(&k, "scale", 1, D(3)), grad_param(&k, "B", 1, D(3)),
                           grad_tensor(&k, "mean", VAL_INITIALIZER, 1, D(3), FILL_UNIFORM),
                           grad_tensor(&k, "var", VAL_INITIALIZER, 1, D(3), FILL_POSITIVE)};
        Value *p_in[1] = {grad_finish(&k, grad_node(&k, "BatchNormalization", 5, bn_in))};
        Node *pool = grad_node(&k, "AveragePool", 1, p_in);
        gb_attr_ints(&k.gc, pool, "kernel_shape", D(2, 2), 2);
        gb_attr_ints(&k.gc, pool, "strides", D(2, 2), 2);
        Value *g_in[1] = {grad_finish(&k, pool)};
        grad_check(&k, grad_finish(&k, grad_node(&k, "GlobalAveragePool", 1, g_in)), 2e-2);
    }
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *x = grad_param(&k, "X", 3, D(2, 3, 4));
        Value *in[3] = {x, grad_param(&k, "Scale", 1, D(4)), grad_param(&k, "B", 1, D(4))};
        Value *ln = grad_finish(&k, grad_node(&k, "LayerNormalization", 3, in));
        Value *mm = gb_op2(&k.gc, "MatMul", ln, grad_param(&k, "W", 2, D(4, 4)));
        /* a residual use of X too, so its gradient accumulates */
        grad_check(&k, gb_op2(&k.gc, "Add", x, mm), 2e-2);
    }
}
END_TEST

/* The training form (batch statistics): dX, dScale and dB, where the
 * statistics' own dependence on X is part of dX. */
START_TEST(batchnorm_training_grad) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[5] = {grad_param(&k, "X", 4, D(4, 3, 2, 2)), grad_param(&k, "scale", 1, D(3)),
                    grad_param(&k, "B", 1, D(3)), grad_tensor(&k, "mean", VAL_INITIALIZER, 1, D(3), FILL_UNIFORM),
                    grad_tensor(&k, "var", VAL_INITIALIZER, 1, D(3), FILL_POSITIVE)};
    Node *n = gb_start(&k.gc, "", "BatchNormalization", 5, in, 1);
    gb_attr_i(&k.gc, n, "training_mode", 1);
    Value *y = grad_finish(&k, n);
    /* a non-linearity after it, so the loss is not linear in Y */
    grad_check(&k, gb_op2(&k.gc, "Mul", y, y), 2e-2);
}
END_TEST

/* Outside training (a forward program), the training form is refused by
 * name. */
START_TEST(batchnorm_training_refused) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[5] = {grad_tensor(&k, "X", VAL_CONSTANT, 4, D(2, 3, 2, 2), FILL_UNIFORM),
                    grad_param(&k, "scale", 1, D(3)), grad_param(&k, "B", 1, D(3)),
                    grad_tensor(&k, "mean", VAL_INITIALIZER, 1, D(3), FILL_UNIFORM),
                    grad_tensor(&k, "var", VAL_INITIALIZER, 1, D(3), FILL_POSITIVE)};
    Node *n = gb_start(&k.gc, "", "BatchNormalization", 5, in, 1);
    gb_attr_i(&k.gc, n, "training_mode", 1);
    Value *y = grad_finish(&k, n);
    y->is_output = true;
    k.g->outputs[k.g->n_outputs++] = y;
    TestProg tp;
    char msg[1024];
    ck_assert(!test_prog_forward(&tp, k.g, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "training form") && strstr(msg, n->name), "message: %s", msg);
    graph_free(k.g);
}
END_TEST

/* ---- forward numerics against ONNX's operator tests ---- */

static const char *const fwd_prefixes[] = {"test_conv_",        "test_basic_conv_",      "test_convtranspose",
                                           "test_maxpool_",     "test_averagepool_",     "test_globalaveragepool",
                                           "test_batchnorm_",   "test_layer_normalization_"};

static bool fwd_selected(const char *name) {
    if (strstr(name, "_expanded")) return false; /* function bodies of other ops */
    for (int i = 0; i < N_OF(fwd_prefixes); i++)
        if (strncmp(name, fwd_prefixes[i], strlen(fwd_prefixes[i])) == 0) return true;
    return false;
}

typedef enum { FWD_PASS, FWD_FAIL, FWD_REFUSED } FwdResult;

typedef struct FwdTally {
    char op[64];
    int pass, fail, refused;
} FwdTally;

/* Writes tensor t into a value's buffer in the program's layout. */
static void put_tensor(char *dst, const Value *v, const Value *t) {
    int64_t n = t->konst->n;
    for (int64_t i = 0; i < n; i++) {
        if (dtype_is_float(v->dtype)) {
            float f = (float)const_get_f(t->konst, i);
            memcpy(dst + 4 * i, &f, 4);
        } else if (plan_value_bytes(v) == value_numel(v)) {
            dst[i] = (char)(unsigned char)const_get_i(t->konst, i);
        } else {
            int64_t x = const_get_i(t->konst, i);
            memcpy(dst + 8 * i, &x, 8);
        }
    }
}

/* Expected outputs written by hand with 4 decimals, where rtol 1e-4 is
 * finer than the data: compared to within half their last digit. */
static const char *const rounded_outputs[] = {"test_averagepool_2d_ceil_last_window_starts_on_pad"};

/* Compares a value's buffer with the expected tensor: |got - exp| <=
 * atol + 1e-4 |exp|; first mismatch in why. */
static bool same_tensor(const char *buf, const Value *v, const Value *want, double atol, char *why, size_t len) {
    if (value_numel(v) != want->konst->n) {
        snprintf(why, len, "'%s' has %lld elements, expected %lld", v->name, (long long)value_numel(v),
                 (long long)want->konst->n);
        return false;
    }
    for (int64_t i = 0; i < want->konst->n; i++) {
        if (dtype_is_float(v->dtype)) {
            float got;
            memcpy(&got, buf + 4 * i, 4);
            double exp = const_get_f(want->konst, i);
            if (isnan(exp) && isnan(got)) continue;
            if (!(fabs(got - exp) <= atol + 1e-4 * fabs(exp))) {
                snprintf(why, len, "'%s'[%lld] = %.8g, expected %.8g", v->name, (long long)i, (double)got, exp);
                return false;
            }
        } else {
            int64_t got;
            if (plan_value_bytes(v) == value_numel(v)) {
                got = v->dtype == DT_UINT8 || v->dtype == DT_BOOL ? (int64_t)(unsigned char)buf[i]
                                                                   : (int64_t)(signed char)buf[i];
            } else {
                memcpy(&got, buf + 8 * i, 8);
            }
            if (got != const_get_i(want->konst, i)) {
                snprintf(why, len, "'%s'[%lld] = %lld, expected %lld", v->name, (long long)i, (long long)got,
                         (long long)const_get_i(want->konst, i));
                return false;
            }
        }
    }
    return true;
}

/* Loads, compiles (forward only) and runs one node test. */
static FwdResult run_node_test(const char *folder, char *op, size_t op_len, char *why, size_t why_len) {
    snprintf(op, op_len, "?");
    Diag d = {0};
    NodeTest nt;
    if (!node_test_load(&nt, folder, &d)) {
        node_test_free(&nt);
        snprintf(why, why_len, "%s", d.msg);
        return d.code == DIAG_UNSUPPORTED ? FWD_REFUSED : FWD_FAIL;
    }
    Graph *g = nt.g;
    GRAPH_FOR_NODES(g, n) { snprintf(op, op_len, "%s", n->op_type); }
    ShapeOptions so = {.batch = 0, .fold = true};
    Plan p = {0};
    CgModule *m = NULL;
    CgJit *jit = NULL;
    char *arena = NULL;
    FwdResult res = FWD_PASS;
    bool ok = driver_check_supported(g, &d) && ir_verify(g, &d) && ir_infer_shapes(g, &so, &d) &&
              plan_forward(g, &p, &d);
    if (ok) {
        CgOptions co = {.emit = "obj"};
        ok = (m = cg_build(&p, &co, &d)) != NULL && (jit = cg_jit(m, &d)) != NULL;
    }
    void (*step)(char *) = NULL;
    const unsigned char *init = NULL;
    if (ok) {
        step = (void (*)(char *))cg_jit_lookup(jit, "cleave_eval_step", &d);
        init = cg_jit_lookup(jit, "cleave_init", &d);
        ok = step && init;
    }
    if (!ok) {
        snprintf(why, why_len, "%s", d.msg);
        res = d.code == DIAG_UNSUPPORTED ? FWD_REFUSED : FWD_FAIL;
    }
    const RankPlan *rp = ok ? &p.ranks[0] : NULL;
    if (ok) {
        size_t bytes = (size_t)((rp->arena_bytes + 63) / 64 * 64 + 64);
        arena = aligned_alloc(64, bytes);
        ck_assert_ptr_nonnull(arena);
        memset(arena, 0, bytes);
        memcpy(arena, init, (size_t)rp->init_bytes);
        for (int i = 0; i < g->n_inputs && res == FWD_PASS; i++) {
            /* every input must have data */
            char path[4096];
            snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", nt.dir, i);
            const Value *t = onnx_load_tensor_file(nt.aux, path, &d);
            if (!t || t->konst->n != value_numel(g->inputs[i])) {
                snprintf(why, why_len, "input %d: %s", i, t ? "element count differs" : d.msg);
                res = FWD_FAIL;
                break;
            }
            put_tensor(arena + rp->offset[g->inputs[i]->id], g->inputs[i], t);
        }
    }
    double atol = 1e-5;
    for (int i = 0; i < N_OF(rounded_outputs); i++)
        if (strcmp(folder, rounded_outputs[i]) == 0) atol = 5e-5;
    if (ok && res == FWD_PASS) {
        step(arena);
        for (int k = 0; k < g->n_outputs && res == FWD_PASS; k++) {
            const Value *want;
            if (!node_test_expected(&nt, k, &want, &d)) {
                snprintf(why, why_len, "output %d: %s", k, d.msg);
                res = FWD_FAIL;
            } else if (!want) {
                continue; /* an omitted optional output */
            } else if (!same_tensor(arena + rp->offset[g->outputs[k]->id], g->outputs[k], want, atol, why, why_len)) {
                res = FWD_FAIL;
            }
        }
    }
    free(arena);
    cg_jit_free(jit);
    cg_module_free(m);
    node_test_free(&nt);
    return res;
}

START_TEST(forward_matches_onnx_node_tests) {
    int count = 0;
    char **names = node_test_names(fwd_selected, &count);
    if (!names) {
        test_skip("%s not found", NODE_TESTS_DIR);
        return;
    }
    FwdTally tally[16];
    int n_tally = 0, failed = 0;
    for (int i = 0; i < count; i++) {
        char op[64], why[2048] = "";
        FwdResult r = run_node_test(names[i], op, sizeof op, why, sizeof why);
        FwdTally *t = NULL;
        for (int j = 0; j < n_tally; j++)
            if (strcmp(tally[j].op, op) == 0) t = &tally[j];
        if (!t) {
            ck_assert_int_lt(n_tally, N_OF(tally));
            t = &tally[n_tally++];
            memset(t, 0, sizeof *t);
            snprintf(t->op, sizeof t->op, "%s", op);
        }
        if (r == FWD_PASS) {
            t->pass++;
        } else if (r == FWD_REFUSED) {
            t->refused++;
            printf("refused %s: %s\n", names[i], why);
        } else {
            t->fail++;
            failed++;
            printf("FAIL %s: %s\n", names[i], why);
        }
    }
    node_test_names_free(names, count);
    for (int j = 0; j < n_tally; j++)
        printf("forward %s: %d/%d match, %d refused\n", tally[j].op, tally[j].pass,
               tally[j].pass + tally[j].fail, tally[j].refused);
    fflush(stdout);
    ck_assert_msg(failed == 0, "%d ONNX node tests of conv/pool/norm ops do not match", failed);
}
END_TEST

int main(void) {
    Suite *s = suite_create("grad_nn");
    TCase *tc = tcase_create("grad_nn");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, conv_padding_stride);
    tcase_add_test(tc, conv_groups);
    tcase_add_test(tc, conv_depthwise_and_grouped);
    tcase_add_test(tc, conv_transpose_stride_padding_groups);
    tcase_add_test(tc, conv_transpose_ranks_dilation_output_shape);
    tcase_add_test(tc, conv_dilation);
    tcase_add_test(tc, resize_scale_2);
    tcase_add_test(tc, resize_fractional_scales_and_sizes);
    tcase_add_test(tc, upsample_nearest_and_linear);
    tcase_add_test(tc, conv_auto_pad_and_ranks);
    tcase_add_test(tc, conv_small_planes);
    tcase_add_test(tc, conv_trimmed_taps);
    tcase_add_test(tc, conv_tap_products);
    tcase_add_test(tc, conv_wide_strided_rows);
    tcase_add_test(tc, maxpool_padding_stride);
    tcase_add_test(tc, maxpool_vector_bits);
    tcase_add_test(tc, averagepool_count_include_pad);
    tcase_add_test(tc, global_average_pool);
    tcase_add_test(tc, batchnorm_inference);
    tcase_add_test(tc, layernorm_last_axis);
    tcase_add_test(tc, layernorm_last_two_axes);
    tcase_add_test(tc, layernorm_transformer_rows);
    tcase_add_test(tc, layernorm_decomposed);
    tcase_add_test(tc, chains);
    tcase_add_test(tc, batchnorm_training_grad);
    tcase_add_test(tc, batchnorm_training_refused);
    suite_add_tcase(s, tc);
    TCase *fw = tcase_create("forward");
    tcase_set_timeout(fw, 600);
    tcase_add_test(fw, forward_matches_onnx_node_tests);
    suite_add_tcase(s, fw);
    return test_run_suite(s);
}
