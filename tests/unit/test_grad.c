/* test_grad.c - every gradient rule checked by finite differences.
 *
 * Each case builds a small graph around one op with float parameters as
 * initializers, appends loss = sum(y * R) for a fixed random R, compiles the
 * training program (LLVM, run in-process), and compares the gradient the
 * program computes for each parameter with central differences of the
 * loss evaluated by more train steps of the same program at learning rate 0. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "support.h"
#include "ir/shapes.h"
#include "ops/ops.h"

/* |fd - g| <= tol * (1 + |fd|) */
static bool agree(double fd, double an, double tol) { return fabs(fd - an) <= tol * (1.0 + fabs(fd)); }

/* Cases draw from a 64-bit LCG seeded with 12345. */
static const GradRules rules = {"grad_case", grad_rand_lcg, 12345, agree};

static Value *op(GradCase *k, const char *name, int n_in, Value **in, const char *attr, const int64_t *ints, int n_ints,
                 float f) {
    Node *n = gb_start(&k->gc, "", name, n_in, in, 1);
    if (attr && ints) gb_attr_ints(&k->gc, n, attr, ints, n_ints);
    else if (attr && n_ints == 1) gb_attr_i(&k->gc, n, attr, (int64_t)f);
    else if (attr) gb_attr_f(&k->gc, n, attr, f);
    return gb_finish(&k->gc, n);
}

#define D(...) ((int64_t[]){__VA_ARGS__})

/* A 1-D int64 constant of n elements. */
static Value *int64_const(GradCase *k, const char *name, int64_t n, const int64_t *x) {
    return grad_int_const(k, name, DT_INT64, 1, &n, x);
}

static void gemm_case(int ta, int tb, float alpha, float beta, int bias_rank) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *a = grad_param(&k, "A", 2, ta ? D(4, 3) : D(3, 4));
    Value *b = grad_param(&k, "B", 2, tb ? D(5, 4) : D(4, 5));
    Value *c = bias_rank == 2 ? grad_param(&k, "C", 2, D(3, 5)) : bias_rank == 1 ? grad_param(&k, "C", 1, D(5)) : NULL;
    Value *in[3] = {a, b, c};
    Node *n = gb_start(&k.gc, "", "Gemm", c ? 3 : 2, in, 1);
    gb_attr_i(&k.gc, n, "transA", ta);
    gb_attr_i(&k.gc, n, "transB", tb);
    gb_attr_f(&k.gc, n, "alpha", alpha);
    gb_attr_f(&k.gc, n, "beta", beta);
    grad_check(&k, gb_finish(&k.gc, n), 2e-2);
}

START_TEST(gemm) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) gemm_case(ta, tb, 1.0f, 1.0f, 1);
    gemm_case(0, 1, 0.5f, 2.0f, 2);
    gemm_case(1, 0, 1.5f, 1.0f, 0);
}
END_TEST

START_TEST(matmul_broadcast) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[2] = {grad_param(&k, "A", 3, D(2, 3, 4)), grad_param(&k, "B", 2, D(4, 5))};
    grad_check(&k, op(&k, "MatMul", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

/* The gradient's products (MatMulT, transposes read in place) large
 * enough for the packed GEMM, with A broadcast over B's batch. */
START_TEST(matmul_packed) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[2] = {grad_param(&k, "A", 2, D(24, 32)), grad_param(&k, "B", 3, D(2, 32, 40))};
    grad_check(&k, op(&k, "MatMul", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

static void binary_case(const char *name, const int64_t *da, int ra, const int64_t *db, int rb, Fill fill_b) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[2] = {grad_param(&k, "A", ra, da), grad_tensor(&k, "B", VAL_INITIALIZER, rb, db, fill_b)};
    grad_check(&k, op(&k, name, 2, in, NULL, NULL, 0, 0), 2e-2);
}

START_TEST(arithmetic_broadcast) {
    binary_case("Add", D(3, 4), 2, D(4), 1, FILL_UNIFORM);
    binary_case("Sub", D(3, 1), 2, D(1, 4), 2, FILL_UNIFORM);
    binary_case("Mul", D(2, 3, 4), 3, D(3, 1), 2, FILL_UNIFORM);
    binary_case("Div", D(3, 4), 2, D(4), 1, FILL_POSITIVE);
}
END_TEST

/* Sum and Mean of three broadcast operands, and Expand: each operand's
 * gradient summed back over the dimensions it was broadcast along. */
START_TEST(variadic_and_expand) {
    for (int mean = 0; mean < 2; mean++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[3] = {grad_param(&k, "A", 2, D(3, 4)), grad_param(&k, "B", 1, D(4)), grad_param(&k, "C", 2, D(3, 1))};
        grad_check(&k, op(&k, mean ? "Mean" : "Sum", 3, in, NULL, NULL, 0, 0), 2e-2);
    }
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[2] = {grad_param(&k, "X", 2, D(3, 1)), gb_const_ints(&k.gc, D(2, 3, 4), 3)};
    grad_check(&k, op(&k, "Expand", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

static void unary_case(const char *name, Fill fill, const char *attr, float f) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[1] = {grad_tensor(&k, "X", VAL_INITIALIZER, 2, D(3, 5), fill)};
    grad_check(&k, op(&k, name, 1, in, attr, NULL, 0, f), 2e-2);
}

START_TEST(activations) {
    unary_case("Relu", FILL_UNIFORM, NULL, 0);
    unary_case("LeakyRelu", FILL_UNIFORM, "alpha", 0.2f);
    unary_case("Sigmoid", FILL_UNIFORM, NULL, 0);
    unary_case("Tanh", FILL_UNIFORM, NULL, 0);
    unary_case("Exp", FILL_UNIFORM, NULL, 0);
    unary_case("Log", FILL_POSITIVE, NULL, 0);
    unary_case("Sqrt", FILL_POSITIVE, NULL, 0);
    unary_case("Erf", FILL_UNIFORM, NULL, 0);
    unary_case("Neg", FILL_UNIFORM, NULL, 0);
    unary_case("Reciprocal", FILL_POSITIVE, NULL, 0);
    unary_case("Identity", FILL_UNIFORM, NULL, 0);
}
END_TEST

START_TEST(softmax_family) {
    for (int axis = 0; axis < 2; axis++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[1] = {grad_param(&k, "X", 3, D(2, 3, 4))};
        Node *n = gb_start(&k.gc, "", axis ? "LogSoftmax" : "Softmax", 1, in, 1);
        gb_attr_i(&k.gc, n, "axis", axis ? -1 : 1);
        grad_check(&k, gb_finish(&k.gc, n), 2e-2);
    }
}
END_TEST

START_TEST(pow_by_constant) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *e = grad_tensor(&k, "e", VAL_CONSTANT, 0, NULL, FILL_UNIFORM);
    const_set_f(e->konst, 0, 2.0);
    Value *in[2] = {grad_param(&k, "X", 2, D(3, 4)), e};
    grad_check(&k, op(&k, "Pow", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

START_TEST(shape_ops) {
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[1] = {grad_param(&k, "X", 3, D(2, 3, 4))};
        grad_check(&k, op(&k, "Transpose", 1, in, "perm", D(2, 0, 1), 3, 0), 1e-2);
    }
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[1] = {grad_param(&k, "X", 3, D(2, 3, 4))};
        grad_check(&k, op(&k, "Flatten", 1, in, "axis", NULL, 1, 2), 1e-2);
    }
}
END_TEST

/* Concat's rule: each input's gradient is its stretch of the output's,
 * checked by finite differences at 15 inputs (the most one kernel takes
 * today: 15 buffers in, 1 out), also past a constant input that needs no
 * gradient, along either axis.  Inputs have lengths 1, 2, 3, 1, ... */
static Value *concat_inputs(GradCase *k, int64_t axis, int n_params, int constant_at, Value **in, int *n_in) {
    int n = 0;
    for (int i = 0; i < n_params; i++) {
        char name[16];
        snprintf(name, sizeof name, "X%d", i);
        int64_t len = 1 + i % 3;
        in[n++] = grad_param(k, name, 2, axis == 0 ? D(len, 3) : D(2, len));
        if (i == constant_at)
            in[n++] = grad_tensor(k, "C", VAL_CONSTANT, 2, axis == 0 ? D(2, 3) : D(2, 2), FILL_UNIFORM);
    }
    *n_in = n;
    return op(k, "Concat", n, in, "axis", NULL, 1, (float)axis);
}

START_TEST(concat) {
    const struct {
        int64_t axis;
        int n_params, constant_at;
    } cases[] = {{1, 15, -1}, {0, 14, 6}, {-1, 14, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[16];
        int n_in;
        Value *y = concat_inputs(&k, cases[c].axis, cases[c].n_params, cases[c].constant_at, in, &n_in);
        ck_assert_int_eq(n_in, 15);
        grad_check(&k, y, 1e-2);
    }
}
END_TEST

/* More inputs than the backward sweep once had room for (16): the training
 * graph gives each of 20 parameters its own Slice of the output's gradient,
 * [offset, offset + length) along the axis, the ones past the 16th too. */
START_TEST(concat_gradients_past_16_inputs) {
    enum { N_PARAMS = 20 };
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[N_PARAMS + 1];
    int n_in;
    Value *y = concat_inputs(&k, 1, N_PARAMS, 17, in, &n_in);
    ck_assert_int_eq(n_in, N_PARAMS + 1);
    Node *sum = grad_node(&k, "ReduceSum", 1, &y);
    gb_attr_i(&k.gc, sum, "keepdims", 0);
    Value *loss = grad_finish(&k, sum);
    loss->is_output = true;
    k.g->outputs[k.g->n_outputs++] = loss;
    TrainOptions o = {.loss = LOSS_MODEL, .optimizer = OPT_SGD, .lr = 0};
    TrainGraph t;
    ck_assert_msg(train_build(k.g, &o, &t, &k.d), "%s", k.d.msg);
    ck_assert_int_eq(t.n_params, N_PARAMS);
    const Value *dy = NULL;
    int64_t at = 0;
    for (int i = 0; i < n_in; i++) {
        if (in[i]->kind == VAL_CONSTANT) {
            at += in[i]->dims[1].k;
            continue;
        }
        int p = 0;
        while (p < t.n_params && t.params[p] != in[i]) p++;
        ck_assert_int_lt(p, t.n_params);
        const Value *gw = t.grads[p];
        ck_assert_msg(gw != NULL, "no gradient for %s (input %d of %d)", in[i]->name, i, n_in);
        const Node *slice = gw->producer;
        ck_assert_msg(slice && strcmp(slice->op_type, "Slice") == 0, "gradient of %s made by %s", in[i]->name,
                      slice ? slice->op_type : "nothing");
        if (!dy) dy = slice->in[0];
        ck_assert_msg(slice->in[0] == dy, "%s: slices another value than the other inputs", in[i]->name);
        int64_t len = in[i]->dims[1].k;
        ck_assert_int_eq(const_get_i(slice->in[1]->konst, 0), at);
        ck_assert_int_eq(const_get_i(slice->in[2]->konst, 0), at + len);
        ck_assert_int_eq(const_get_i(slice->in[3]->konst, 0), 1);
        ck_assert_int_eq(gw->dims[0].k, 2);
        ck_assert_int_eq(gw->dims[1].k, len);
        at += len;
    }
    ck_assert_int_eq(at, y->dims[1].k);
    graph_free(k.g);
}
END_TEST

/* A 1-D parameter holding vals. */
static Value *param_of(GradCase *k, const char *name, int64_t n, const double *vals) {
    Value *x = grad_param(k, name, 1, &n);
    for (int64_t i = 0; i < n; i++) const_set_f(x->konst, i, vals[i]);
    return x;
}

/* A scalar float constant. */
static Value *scalar_const(GradCase *k, const char *name, double v) {
    Value *c = grad_tensor(k, name, VAL_CONSTANT, 0, NULL, FILL_UNIFORM);
    const_set_f(c->konst, 0, v);
    return c;
}

/* Inputs on both sides of the bounds -0.5 and 0.5 and at least 0.05 from
 * them, so that the finite differences (step 0.01) see one slope. */
static const double clip_x[] = {-0.9, -0.62, -0.45, -0.3, -0.05, 0.1, 0.28, 0.44, 0.57, 0.8, 1.3, -1.5};
enum { CLIP_N = sizeof clip_x / sizeof *clip_x };

static void clip_case(int64_t opset, bool with_min, bool with_max) {
    GradCase k;
    grad_case_init(&k, &rules);
    k.g->opsets[0].version = opset;
    Value *in[3] = {param_of(&k, "X", CLIP_N, clip_x), NULL, NULL};
    if (opset >= 11) {
        if (with_min) in[1] = scalar_const(&k, "min", -0.5);
        if (with_max) in[2] = scalar_const(&k, "max", 0.5);
    }
    Node *n = grad_node(&k, "Clip", opset >= 11 ? 3 : 1, in);
    if (opset < 11 && with_min) gb_attr_f(&k.gc, n, "min", -0.5f);
    if (opset < 11 && with_max) gb_attr_f(&k.gc, n, "max", 0.5f);
    grad_check(&k, grad_finish(&k, n), 1e-2);
}

/* Clip away from its bounds: both bounds, either alone, none, as inputs
 * (opset 17) and as attributes (opset 10). */
START_TEST(clip_away_from_bounds) {
    for (int opset = 10; opset <= 17; opset += 7) {
        clip_case(opset, true, true);
        clip_case(opset, true, false);
        clip_case(opset, false, true);
        clip_case(opset, false, false);
    }
}
END_TEST

/* HardSigmoid (ONNX's default alpha and beta, and torch's 1/6 and 1/2) and
 * HardSwish over their flat and sloped parts, away from the kinks at
 * +-2.5 and +-3. */
START_TEST(hard_activations) {
    static const double x[] = {-4.6, -3.4, -2.8, -2.2, -1.1, -0.3, 0.4, 1.7, 2.2, 2.8, 3.5, 4.9};
    for (int c = 0; c < 3; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[1] = {param_of(&k, "X", 12, x)};
        Node *n = grad_node(&k, c < 2 ? "HardSigmoid" : "HardSwish", 1, in);
        if (c == 1) {
            gb_attr_f(&k.gc, n, "alpha", 1.0f / 6);
            gb_attr_f(&k.gc, n, "beta", 0.5f);
        }
        grad_check(&k, grad_finish(&k, n), 1e-2);
    }
}
END_TEST

/* The program's gradient of ReduceSum(y) with respect to the parameter x
 * (dy = 1 everywhere) against want, at the kinks, where finite differences
 * straddle two slopes and PyTorch's backward rule decides. */
static void unit_gradient(GradCase *k, const Value *x, Value *y, const double *want) {
    Node *sum = grad_node(k, "ReduceSum", 1, &y);
    gb_attr_i(&k->gc, sum, "keepdims", 0);
    Value *loss = grad_finish(k, sum);
    loss->is_output = true;
    k->g->outputs[k->g->n_outputs++] = loss;
    TrainOptions o = {.loss = LOSS_MODEL, .optimizer = OPT_SGD, .lr = 0};
    TestProg tp;
    char msg[1024];
    ck_assert_msg(test_prog_train(&tp, k->g, &o, msg, sizeof msg), "compile: %s", msg);
    tp.train(tp.arena);
    ck_assert_int_eq(tp.t.n_params, 1);
    const float *g = test_buf(&tp, tp.t.grads[0]);
    for (int64_t i = 0; i < value_numel(x); i++)
        ck_assert_msg(fabs(g[i] - want[i]) < 1e-6, "%s at x = %g: gradient %g, PyTorch's %g", y->producer->op_type,
                      const_get_f(x->konst, i), (double)g[i], want[i]);
    test_prog_free(&tp);
}

/* At the kinks the gradients are PyTorch's: Clip(x, 0, 6) as nn.ReLU6
 * (hardtanh_backward: 0 at both bounds), HardSigmoid(1/6, 1/2) as
 * nn.Hardsigmoid (0 at -3 and 3), HardSwish as nn.Hardswish (x/3 + 1/2 at
 * -3 and 3 inclusive: -0.5 and 1.5). */
START_TEST(kinks_follow_pytorch) {
    static const double x[] = {-4, -3, -1, 0, 3, 6, 7};
    static const double relu6[] = {0, 0, 0, 0, 1, 0, 0};
    static const double hardsigmoid[] = {0, 0, 1.0 / 6, 1.0 / 6, 0, 0, 0};
    static const double hardswish[] = {0, -0.5, 1.0 / 6, 0.5, 1.5, 1, 1};
    for (int c = 0; c < 3; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[3] = {param_of(&k, "X", 7, x), scalar_const(&k, "min", 0), scalar_const(&k, "max", 6)};
        Node *n = grad_node(&k, c == 0 ? "Clip" : c == 1 ? "HardSigmoid" : "HardSwish", c == 0 ? 3 : 1, in);
        if (c == 1) {
            gb_attr_f(&k.gc, n, "alpha", 1.0f / 6);
            gb_attr_f(&k.gc, n, "beta", 0.5f);
        }
        unit_gradient(&k, in[0], grad_finish(&k, n), c == 0 ? relu6 : c == 1 ? hardsigmoid : hardswish);
    }
}
END_TEST

typedef struct PadCase {
    const char *mode;
    int64_t opset;
    int64_t pads[6]; /* X is [2, 3, 4]: begins, then ends */
    const int64_t *axes; /* opset 18: pads covers these axes only */
    int n_axes;
} PadCase;

static void pad_case(const PadCase *pc) {
    GradCase k;
    grad_case_init(&k, &rules);
    k.g->opsets[0].version = pc->opset;
    int n_pads = 2 * (pc->axes ? pc->n_axes : 3);
    Value *in[4] = {grad_param(&k, "X", 3, D(2, 3, 4)), NULL, NULL, NULL};
    if (pc->opset >= 11) {
        in[1] = int64_const(&k, "pads", n_pads, pc->pads);
        if (!strcmp(pc->mode, "constant")) in[2] = scalar_const(&k, "value", 0.5);
        if (pc->axes) in[3] = int64_const(&k, "axes", pc->n_axes, pc->axes);
    }
    Node *n = grad_node(&k, "Pad", pc->opset < 11 ? 1 : pc->axes ? 4 : 3, in);
    gb_attr_s(&k.gc, n, "mode", pc->mode);
    if (pc->opset < 11) gb_attr_ints(&k.gc, n, "pads", pc->pads, n_pads);
    grad_check(&k, grad_finish(&k, n), 1e-2);
}

/* Pad in each mode, with negative pads (crops) among positive ones, wrap
 * by more than the axis holds, the attribute form (opset 10) and opset
 * 18's axes input. */
START_TEST(pad_modes) {
    static const int64_t axes[] = {-2, 2};
    static const PadCase cases[] = {
        {"constant", 17, {0, 1, 2, 1, 0, -1}},
        {"reflect", 17, {0, 2, 1, 0, 1, 3}},
        {"edge", 17, {1, 2, 2, 0, 3, -1}},
        {"wrap", 19, {0, 4, 1, 0, 2, -2}},
        {"constant", 10, {1, 0, -1, 0, 2, 1}},
        {"reflect", 10, {0, 1, 2, 1, 1, 0}},
        {"edge", 18, {-1, 2, 1, 3}, axes, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) pad_case(&cases[c]);
}
END_TEST

typedef struct SliceCase {
    int64_t opset;
    int n;
    int64_t starts[2], ends[2], axes[2], steps[2];
    bool with_axes, with_steps;
} SliceCase;

/* Slice of X [4, 6]: its gradient scatters dy back where it was read. */
static void slice_case(const SliceCase *sc) {
    GradCase k;
    grad_case_init(&k, &rules);
    k.g->opsets[0].version = sc->opset;
    Value *in[5] = {grad_param(&k, "X", 2, D(4, 6))};
    int n_in = 1;
    if (sc->opset >= 10) {
        in[1] = int64_const(&k, "starts", sc->n, sc->starts);
        in[2] = int64_const(&k, "ends", sc->n, sc->ends);
        in[3] = sc->with_axes ? int64_const(&k, "axes", sc->n, sc->axes) : NULL;
        in[4] = sc->with_steps ? int64_const(&k, "steps", sc->n, sc->steps) : NULL;
        n_in = sc->with_steps ? 5 : sc->with_axes ? 4 : 3;
    }
    Node *n = grad_node(&k, "Slice", n_in, in);
    if (sc->opset < 10) {
        gb_attr_ints(&k.gc, n, "starts", sc->starts, sc->n);
        gb_attr_ints(&k.gc, n, "ends", sc->ends, sc->n);
        if (sc->with_axes) gb_attr_ints(&k.gc, n, "axes", sc->axes, sc->n);
    }
    grad_check(&k, grad_finish(&k, n), 1e-2);
}

/* Starts and ends from either end and past them, default axes and steps,
 * steps of 2 and 3, negative steps (reversal), and opset 9's attributes. */
START_TEST(slice) {
    static const SliceCase cases[] = {
        {13, 2, {1, 0}, {3, 5}},
        {13, 1, {0}, {6}, {1}, {2}, true, true},
        {13, 1, {-1}, {-100}, {1}, {-1}, true, true},
        {13, 1, {4}, {0}, {-1}, {-2}, true, true},
        {13, 2, {3, -2}, {-100, 100}, {0, 1}, {-2, -3}, true, true},
        {13, 2, {-3, 1}, {-1, 100}, {1, 0}, {2, 1}, true, true},
        {9, 1, {1}, {-1}, {1}, {0}, true, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) slice_case(&cases[c]);
}
END_TEST

/* Split of X [3, 7] along axis 1; y concatenates some outputs, so the
 * others get zeros as gradients. */
static void split_case(int64_t opset, const int64_t *parts, int n_out, const int *used, int n_used) {
    GradCase k;
    grad_case_init(&k, &rules);
    k.g->opsets[0].version = opset;
    Value *in[2] = {grad_param(&k, "X", 2, D(3, 7)), parts ? int64_const(&k, "split", n_out, parts) : NULL};
    Node *n = gb_start(&k.gc, "", "Split", parts ? 2 : 1, in, n_out);
    gb_attr_i(&k.gc, n, "axis", -1);
    if (!parts) gb_attr_i(&k.gc, n, "num_outputs", n_out);
    grad_finish(&k, n);
    Value *ys[4];
    for (int i = 0; i < n_used; i++) ys[i] = n->out[used[i]];
    Node *cat = grad_node(&k, "Concat", n_used, ys);
    gb_attr_i(&k.gc, cat, "axis", 1);
    grad_check(&k, grad_finish(&k, cat), 1e-2);
}

/* Uneven parts: by the split input (1, 4, 2) with the middle one unread,
 * and opset 18's num_outputs (3, 3, 1), all read, out of order. */
START_TEST(split) {
    split_case(13, D(1, 4, 2), 3, (int[]){2, 0}, 2);
    split_case(18, NULL, 3, (int[]){1, 2, 0}, 3);
}
END_TEST

START_TEST(reductions) {
    const char *ops[] = {"ReduceMean", "ReduceSum"};
    for (int i = 0; i < 2; i++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *x = grad_param(&k, "X", 3, D(2, 3, 4));
        Value *in[2] = {x, int64_const(&k, "axes", 1, D(1))};
        /* opset 17: ReduceMean takes axes as an attribute, ReduceSum as an input */
        Value *y = i == 0 ? op(&k, ops[i], 1, in, "axes", D(1), 1, 0) : op(&k, ops[i], 2, in, NULL, NULL, 0, 0);
        grad_check(&k, y, 1e-2);
    }
}
END_TEST

START_TEST(softmax_cross_entropy) {
    GradCase k;
    grad_case_init(&k, &rules);
    Value *x = grad_param(&k, "X", 2, D(4, 5));
    Value *in[2] = {x, int64_const(&k, "labels", 4, D(0, 3, 1, 4))}; /* (i * 3) % 5 */
    Node *n = gb_start(&k.gc, "", "SoftmaxCrossEntropyLoss", 2, in, 1);
    Value *loss = gb_finish(&k.gc, n);
    /* scale so the check's R multiplies a scalar */
    grad_check(&k, loss, 2e-2);
}
END_TEST

/* ---- transformer blocks ----
 *
 * The gradients GPT-2, BERT and ViT style models exported by PyTorch in
 * training mode rely on: embeddings and index picks (Gather), causal masks
 * (Trilu, Where with a bool mask, -inf or float32's lowest before
 * Softmax), and GELU written out in its erf and tanh forms. */

/* An int64 constant of any rank holding x. */
static Value *ints_of(GradCase *k, const char *name, int rank, const int64_t *dims, const int64_t *x) {
    return grad_int_const(k, name, DT_INT64, rank, dims, x);
}

/* A bool constant of at most 64 elements: element i true where keep(i). */
static Value *mask_of(GradCase *k, const char *name, int rank, const int64_t *dims, bool (*keep)(int64_t i)) {
    int64_t bits[64], n = 1;
    for (int j = 0; j < rank; j++) n *= dims[j];
    ck_assert_int_le(n, 64);
    for (int64_t i = 0; i < n; i++) bits[i] = keep(i);
    return grad_int_const(k, name, DT_BOOL, rank, dims, bits);
}

static Value *gather(GradCase *k, Value *x, Value *idx, int64_t axis) {
    Value *in[2] = {x, idx};
    Node *n = grad_node(k, "Gather", 2, in);
    gb_attr_i(&k->gc, n, "axis", axis);
    return grad_finish(k, n);
}

/* nn.Embedding: a [7, 12] table read by [2, 5] token ids that repeat
 * (3 three times; 0 twice more as -7; 6 as -1 and 6), so the gradient
 * sums the rows of dY that share an id; 12 columns are a vector of 8 and a
 * tail.  Then GPT-2's sum of token and position embeddings, the position
 * table's 1-D indices broadcast over the batch. */
START_TEST(gather_embedding) {
    static const int64_t ids[] = {3, 0, 6, 3, -1, 2, 3, 0, -7, 5};
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *table = grad_param(&k, "table", 2, D(7, 12));
        grad_check(&k, gather(&k, table, ints_of(&k, "ids", 2, D(2, 5), ids), 0), 1e-2);
    }
    {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *wte = grad_param(&k, "wte", 2, D(7, 12)), *wpe = grad_param(&k, "wpe", 2, D(6, 12));
        Value *tok = gather(&k, wte, ints_of(&k, "ids", 2, D(2, 5), ids), 0);
        Value *pos = gather(&k, wpe, ints_of(&k, "pos", 1, D(5), D(0, 1, 2, 3, 4)), 0);
        grad_check(&k, gb_op2(&k.gc, "Add", tok, pos), 1e-2);
    }
}
END_TEST

/* ViT's class token x[:, 0] (a scalar index on axis 1), the last element
 * of each row by a negative index on a negative axis, and 1-D indices
 * with a repeat in the middle of three axes; a product after each, so the
 * loss is not linear in X. */
START_TEST(gather_pick) {
    static const struct {
        int idx_rank;
        int64_t idx[3], axis;
    } cases[] = {{0, {0}, 1}, {0, {-1}, -1}, {1, {2, 0, 2}, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *x = grad_param(&k, "X", 3, D(3, 4, 10));
        Value *y = gather(&k, x, ints_of(&k, "idx", cases[c].idx_rank, D(3), cases[c].idx), cases[c].axis);
        grad_check(&k, gb_op2(&k.gc, "Mul", y, y), 1e-2);
    }
}
END_TEST

/* torch.tril and torch.triu: both triangles, k omitted, a scalar or a
 * one-element k, above and below the diagonal and beyond the matrix. */
START_TEST(trilu) {
    static const struct {
        int upper, k_rank;
        int64_t k;
    } cases[] = {{1, -1, 0}, {0, -1, 0}, {1, 0, 2}, {0, 0, -1}, {1, 1, -2}, {0, 1, 3}, {1, 0, 9}, {0, 0, -9}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *in[2] = {grad_param(&k, "X", 3, D(2, 5, 6)), NULL};
        if (cases[c].k_rank >= 0) in[1] = ints_of(&k, "k", cases[c].k_rank, D(1), &cases[c].k);
        Node *n = grad_node(&k, "Trilu", in[1] ? 2 : 1, in);
        gb_attr_i(&k.gc, n, "upper", cases[c].upper);
        Value *y = grad_finish(&k, n);
        grad_check(&k, gb_op2(&k.gc, "Mul", y, y), 1e-2);
    }
}
END_TEST

static bool every_third_false(int64_t i) { return i % 3 != 1; }

/* Where with a bool mask: the condition gets no gradient, each branch gets
 * dY where it was chosen, summed over the dimensions it was broadcast
 * along (B [5] across both leading axes; the mask itself broadcast). */
START_TEST(where_bool_mask) {
    for (int c = 0; c < 2; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *cond = c ? mask_of(&k, "mask", 3, D(3, 1, 5), every_third_false)
                        : mask_of(&k, "mask", 2, D(4, 5), every_third_false);
        Value *in[3] = {cond, grad_param(&k, "A", 3, c ? D(3, 4, 1) : D(3, 4, 5)), grad_param(&k, "B", 1, D(5))};
        Value *y = grad_finish(&k, grad_node(&k, "Where", 3, in));
        grad_check(&k, gb_op2(&k.gc, "Mul", y, y), 1e-2);
    }
}
END_TEST

/* Causal mask of a 4 x 4 score matrix: keep (i, j) for j <= i. */
static bool causal_4x4(int64_t e) { return e % 4 <= e / 4; }

static Value *softmax_last(GradCase *k, Value *x) {
    Value *in[1] = {x};
    Node *n = grad_node(k, "Softmax", 1, in);
    gb_attr_i(&k->gc, n, "axis", -1);
    return grad_finish(k, n);
}

/* Masked attention scores: GPT-2's Where(mask, scores, lowest float32)
 * and the same with -inf, and BERT's additive mask (0 or -inf added)
 * before Softmax over the last axis.  Masked scores get gradient 0, and
 * every row keeps at least its diagonal, so no row is fully masked. */
START_TEST(masked_softmax) {
    for (int c = 0; c < 3; c++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *scores = grad_param(&k, "scores", 3, D(2, 4, 4)), *z;
        if (c < 2) {
            Value *in[3] = {mask_of(&k, "mask", 2, D(4, 4), causal_4x4), scores,
                            scalar_const(&k, "fill", c ? -INFINITY : -FLT_MAX)};
            z = grad_finish(&k, grad_node(&k, "Where", 3, in));
        } else {
            Value *add = grad_tensor(&k, "mask_add", VAL_CONSTANT, 2, D(4, 4), FILL_UNIFORM);
            for (int64_t e = 0; e < 16; e++) const_set_f(add->konst, e, causal_4x4(e) ? 0 : -INFINITY);
            z = gb_op2(&k.gc, "Add", scores, add);
        }
        grad_check(&k, softmax_last(&k, z), 1e-2);
    }
}
END_TEST

/* Softmax as ONNX defines it, exp(x - max) / sum(exp(x - max)) per row,
 * in double: the reference PyTorch's and ONNX Runtime's kernels follow. */
static void softmax_reference(const float *x, int64_t rows, int64_t len, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * len;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < len; j++) m = fmax(m, row[j]);
        for (int64_t j = 0; j < len; j++) s += exp((double)row[j] - m);
        for (int64_t j = 0; j < len; j++) y[r * len + j] = exp((double)row[j] - m) / s;
    }
}

/* Forward rows with -inf entries: partly masked rows give 0 where masked;
 * a fully masked row gives NaN everywhere (max - max is -inf - -inf), as
 * torch.softmax and ONNX Runtime compute it.  Rows of 3 (scalar only) and
 * 19 (vectors and a tail). */
START_TEST(softmax_masked_rows_forward) {
    for (int c = 0; c < 2; c++) {
        int64_t len = c ? 19 : 3, rows = 4;
        Graph *g = test_graph_new("grad_case", 17, 1, 1);
        Value *x = test_graph_input(g, "x", DT_FLOAT, 2, D(rows, len));
        Node *n = test_graph_op(g, "Softmax", 1, (Value *[]){x});
        Diag d = {0};
        ShapeOptions so = {.batch = 0, .fold = true};
        ck_assert_msg(ir_verify(g, &d) && ir_infer_shapes(g, &so, &d), "%s", d.msg);
        TestProg tp;
        char msg[1024];
        ck_assert_msg(test_prog_forward(&tp, g, msg, sizeof msg), "compile: %s", msg);
        float *xb = test_buf(&tp, x);
        uint64_t rng = 7;
        for (int64_t e = 0; e < rows * len; e++) {
            int64_t r = e / len, j = e % len;
            /* row 0 whole, row 1 masked past its first element, row 2
             * every other element, row 3 fully masked */
            bool masked = (r == 1 && j > 0) || (r == 2 && j % 2) || r == 3;
            xb[e] = masked ? -INFINITY : 3 * grad_rand_lcg(&rng);
        }
        double want[4 * 19];
        softmax_reference(xb, rows, len, want);
        tp.eval(tp.arena);
        const float *yb = test_buf(&tp, n->out[0]);
        for (int64_t e = 0; e < rows * len; e++) {
            bool same = isnan(want[e]) ? isnan(yb[e]) : fabs(yb[e] - want[e]) <= 1e-6 + 1e-5 * fabs(want[e]);
            ck_assert_msg(same, "row %lld of %lld, element %lld: %g, reference %g", (long long)(e / len),
                          (long long)len, (long long)(e % len), (double)yb[e], want[e]);
        }
        ck_assert(isnan(want[3 * len])); /* the reference agrees that a fully masked row is NaN */
        test_prog_free(&tp);
    }
}
END_TEST

/* F.gelu as PyTorch exports it, x * 0.5 * (1 + erf(x / sqrt 2)), and the
 * tanh form of GPT-2's NewGELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))) with Pow(x, 3.0), on X spread over [-3, 3]. */
START_TEST(gelu_forms) {
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        GradCase k;
        grad_case_init(&k, &rules);
        Value *x = grad_param(&k, "X", 2, D(3, 10));
        for (int64_t e = 0; e < 30; e++) const_set_f(x->konst, e, 3 * const_get_f(x->konst, e));
        Value *inner;
        if (!tanh_form) {
            inner = gb_op1(&k.gc, "Erf", gb_op2(&k.gc, "Div", x, scalar_const(&k, "sqrt2", sqrt(2.0))));
        } else {
            Value *cube = gb_op2(&k.gc, "Pow", x, scalar_const(&k, "three", 3.0));
            Value *poly = gb_op2(&k.gc, "Add", x, gb_op2(&k.gc, "Mul", cube, scalar_const(&k, "c", 0.044715)));
            inner = gb_op1(&k.gc, "Tanh", gb_op2(&k.gc, "Mul", poly, scalar_const(&k, "s", sqrt(2.0 / M_PI))));
        }
        Value *one_plus = gb_op2(&k.gc, "Add", inner, scalar_const(&k, "one", 1.0));
        Value *y = gb_op2(&k.gc, "Mul", gb_op2(&k.gc, "Mul", x, one_plus), scalar_const(&k, "half", 0.5));
        grad_check(&k, y, 1e-2);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("grad");
    TCase *tc = tcase_create("grad");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gemm);
    tcase_add_test(tc, matmul_broadcast);
    tcase_add_test(tc, matmul_packed);
    tcase_add_test(tc, variadic_and_expand);
    tcase_add_test(tc, arithmetic_broadcast);
    tcase_add_test(tc, activations);
    tcase_add_test(tc, softmax_family);
    tcase_add_test(tc, pow_by_constant);
    tcase_add_test(tc, shape_ops);
    tcase_add_test(tc, concat);
    tcase_add_test(tc, concat_gradients_past_16_inputs);
    tcase_add_test(tc, clip_away_from_bounds);
    tcase_add_test(tc, hard_activations);
    tcase_add_test(tc, kinks_follow_pytorch);
    tcase_add_test(tc, pad_modes);
    tcase_add_test(tc, slice);
    tcase_add_test(tc, split);
    tcase_add_test(tc, reductions);
    tcase_add_test(tc, softmax_cross_entropy);
    tcase_add_test(tc, gather_embedding);
    tcase_add_test(tc, gather_pick);
    tcase_add_test(tc, trilu);
    tcase_add_test(tc, where_bool_mask);
    tcase_add_test(tc, masked_softmax);
    tcase_add_test(tc, softmax_masked_rows_forward);
    tcase_add_test(tc, gelu_forms);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
