/* test_grad.c - every gradient rule checked by finite differences.
 *
 * Each case builds a small graph around one op with float parameters as
 * initializers, appends loss = sum(y * R) for a fixed random R, compiles the
 * training program (LLVM, run in-process), and compares the gradient the
 * program computes for each parameter with central differences of the
 * loss evaluated by the same program's eval step. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "support.h"
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
    Value *v = graph_add_value(k->g, name);
    v->kind = VAL_CONSTANT;
    v->dtype = DT_INT64;
    v->rank = 1;
    v->dims[0] = dim_const(n);
    v->konst = const_new(k->g, DT_INT64, n);
    for (int64_t i = 0; i < n; i++) const_set_i(v->konst, i, x[i]);
    return v;
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

int main(void) {
    Suite *s = suite_create("grad");
    TCase *tc = tcase_create("grad");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gemm);
    tcase_add_test(tc, matmul_broadcast);
    tcase_add_test(tc, matmul_packed);
    tcase_add_test(tc, arithmetic_broadcast);
    tcase_add_test(tc, activations);
    tcase_add_test(tc, softmax_family);
    tcase_add_test(tc, pow_by_constant);
    tcase_add_test(tc, shape_ops);
    tcase_add_test(tc, concat);
    tcase_add_test(tc, concat_gradients_past_16_inputs);
    tcase_add_test(tc, reductions);
    tcase_add_test(tc, softmax_cross_entropy);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
