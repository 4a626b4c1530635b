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
#include "autodiff/grad.h"
#include "ops/ops.h"

static uint64_t rng_state;
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

typedef struct Case {
    Graph *g;
    GradCtx gc;
    Diag d;
} Case;

static void case_init(Case *k) {
    memset(k, 0, sizeof *k);
    k->g = graph_new("grad_case");
    k->g->opsets = ARENA_NEW(&k->g->arena, Opset);
    k->g->opsets[0] = (Opset){"", 17};
    k->g->n_opsets = 1;
    k->g->inputs = ARENA_ARRAY(&k->g->arena, Value *, 4);
    k->g->outputs = ARENA_ARRAY(&k->g->arena, Value *, 1);
    k->gc = (GradCtx){k->g, &k->d, PHASE_FORWARD};
    rng_state = 12345;
}

/* A float tensor of the given shape filled with random values (abs + lo
 * when lo > 0, for ops defined on positive numbers). */
static Value *tensor(Case *k, const char *name, ValueKind kind, int rank, const int64_t *dims, float lo) {
    Value *v = graph_add_value(k->g, name);
    v->kind = kind;
    v->dtype = v->file_dtype = DT_FLOAT;
    v->rank = rank;
    int64_t n = 1;
    for (int j = 0; j < rank; j++) {
        v->dims[j] = dim_const(dims[j]);
        n *= dims[j];
    }
    v->konst = const_new(k->g, DT_FLOAT, n);
    for (int64_t i = 0; i < n; i++) {
        float x = rnd();
        const_set_f(v->konst, i, lo > 0 ? fabsf(x) + lo : x);
    }
    return v;
}

static Value *param(Case *k, const char *name, int rank, const int64_t *dims) {
    return tensor(k, name, VAL_INITIALIZER, rank, dims, 0);
}

static Value *op(Case *k, const char *name, int n_in, Value **in, const char *attr, const int64_t *ints, int n_ints,
                 float f) {
    Node *n = gb_start(&k->gc, "", name, n_in, in, 1);
    if (attr && ints) gb_attr_ints(&k->gc, n, attr, ints, n_ints);
    else if (attr && n_ints == 1) gb_attr_i(&k->gc, n, attr, (int64_t)f);
    else if (attr) gb_attr_f(&k->gc, n, attr, f);
    return gb_finish(&k->gc, n);
}

/* loss = ReduceSum(y * R), compile, then compare gradients. */
static void check(Case *k, Value *y, double tol) {
    ck_assert_msg(y != NULL, "building the case failed: %s", k->d.msg);
    Value *r = tensor(k, "R", VAL_CONSTANT, y->rank, (int64_t[]){y->dims[0].k, y->rank > 1 ? y->dims[1].k : 0,
                                                                y->rank > 2 ? y->dims[2].k : 0, y->rank > 3 ? y->dims[3].k : 0}, 0);
    Value *prod = gb_op2(&k->gc, "Mul", y, r);
    Value *in[1] = {prod};
    Node *sum = gb_start(&k->gc, "", "ReduceSum", 1, in, 1);
    gb_attr_i(&k->gc, sum, "keepdims", 0);
    Value *loss = gb_finish(&k->gc, sum);
    ck_assert_msg(loss != NULL, "loss: %s", k->d.msg);
    loss->is_output = true;
    k->g->outputs[k->g->n_outputs++] = loss;
    TrainOptions o = {.loss = LOSS_MODEL, .optimizer = OPT_SGD, .lr = 0};
    TestProg tp;
    char msg[1024];
    ck_assert_msg(test_prog_train(&tp, k->g, &o, msg, sizeof msg), "compile: %s", msg);
    float *lossp = test_buf(&tp, tp.t.loss);
    tp.train(tp.arena); /* lr 0: computes gradients, changes nothing */
    /* Copy every gradient before any eval step: eval reuses the transient
     * bytes where the backward pass left them. */
    static float grads[8][4096];
    ck_assert(tp.t.n_params <= 8);
    for (int pi = 0; pi < tp.t.n_params; pi++) {
        ck_assert_msg(tp.t.grads[pi] != NULL, "no gradient for %s", tp.t.params[pi]->name);
        ck_assert(value_numel(tp.t.params[pi]) <= 4096);
        memcpy(grads[pi], test_buf(&tp, tp.t.grads[pi]), sizeof(float) * (size_t)value_numel(tp.t.params[pi]));
    }
    int checked = 0;
    for (int pi = 0; pi < tp.t.n_params; pi++) {
        Value *w = tp.t.params[pi];
        float *wb = test_buf(&tp, w), *grad = grads[pi];
        int64_t n = value_numel(w);
        for (int64_t i = 0; i < n; i++) {
            const float eps = 1e-2f;
            float saved = wb[i];
            wb[i] = saved + eps;
            tp.eval(tp.arena);
            double lp = *lossp;
            wb[i] = saved - eps;
            tp.eval(tp.arena);
            double lm = *lossp;
            wb[i] = saved;
            double fd = (lp - lm) / (2.0 * eps);
            ck_assert_msg(fabs(fd - grad[i]) <= tol * (1.0 + fabs(fd)), "%s[%lld]: program %g, finite difference %g",
                          w->name, (long long)i, (double)grad[i], fd);
            checked++;
        }
    }
    ck_assert_int_gt(checked, 0);
    test_prog_free(&tp);
}

#define D(...) ((int64_t[]){__VA_ARGS__})

static void gemm_case(int ta, int tb, float alpha, float beta, int bias_rank) {
    Case k;
    case_init(&k);
    Value *a = param(&k, "A", 2, ta ? D(4, 3) : D(3, 4));
    Value *b = param(&k, "B", 2, tb ? D(5, 4) : D(4, 5));
    Value *c = bias_rank == 2 ? param(&k, "C", 2, D(3, 5)) : bias_rank == 1 ? param(&k, "C", 1, D(5)) : NULL;
    Value *in[3] = {a, b, c};
    Node *n = gb_start(&k.gc, "", "Gemm", c ? 3 : 2, in, 1);
    gb_attr_i(&k.gc, n, "transA", ta);
    gb_attr_i(&k.gc, n, "transB", tb);
    gb_attr_f(&k.gc, n, "alpha", alpha);
    gb_attr_f(&k.gc, n, "beta", beta);
    check(&k, gb_finish(&k.gc, n), 2e-2);
}

START_TEST(gemm) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) gemm_case(ta, tb, 1.0f, 1.0f, 1);
    gemm_case(0, 1, 0.5f, 2.0f, 2);
    gemm_case(1, 0, 1.5f, 1.0f, 0);
}
END_TEST

START_TEST(matmul_broadcast) {
    Case k;
    case_init(&k);
    Value *in[2] = {param(&k, "A", 3, D(2, 3, 4)), param(&k, "B", 2, D(4, 5))};
    check(&k, op(&k, "MatMul", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

static void binary_case(const char *name, const int64_t *da, int ra, const int64_t *db, int rb, float lo) {
    Case k;
    case_init(&k);
    Value *in[2] = {tensor(&k, "A", VAL_INITIALIZER, ra, da, 0), tensor(&k, "B", VAL_INITIALIZER, rb, db, lo)};
    check(&k, op(&k, name, 2, in, NULL, NULL, 0, 0), 2e-2);
}

START_TEST(arithmetic_broadcast) {
    binary_case("Add", D(3, 4), 2, D(4), 1, 0);
    binary_case("Sub", D(3, 1), 2, D(1, 4), 2, 0);
    binary_case("Mul", D(2, 3, 4), 3, D(3, 1), 2, 0);
    binary_case("Div", D(3, 4), 2, D(4), 1, 0.5f);
}
END_TEST

static void unary_case(const char *name, float lo, const char *attr, float f) {
    Case k;
    case_init(&k);
    Value *in[1] = {tensor(&k, "X", VAL_INITIALIZER, 2, D(3, 5), lo)};
    check(&k, op(&k, name, 1, in, attr, NULL, 0, f), 2e-2);
}

START_TEST(activations) {
    unary_case("Relu", 0, NULL, 0);
    unary_case("LeakyRelu", 0, "alpha", 0.2f);
    unary_case("Sigmoid", 0, NULL, 0);
    unary_case("Tanh", 0, NULL, 0);
    unary_case("Exp", 0, NULL, 0);
    unary_case("Log", 0.5f, NULL, 0);
    unary_case("Sqrt", 0.5f, NULL, 0);
    unary_case("Erf", 0, NULL, 0);
    unary_case("Neg", 0, NULL, 0);
    unary_case("Reciprocal", 0.5f, NULL, 0);
    unary_case("Identity", 0, NULL, 0);
}
END_TEST

START_TEST(softmax_family) {
    for (int axis = 0; axis < 2; axis++) {
        Case k;
        case_init(&k);
        Value *in[1] = {param(&k, "X", 3, D(2, 3, 4))};
        Node *n = gb_start(&k.gc, "", axis ? "LogSoftmax" : "Softmax", 1, in, 1);
        gb_attr_i(&k.gc, n, "axis", axis ? -1 : 1);
        check(&k, gb_finish(&k.gc, n), 2e-2);
    }
}
END_TEST

START_TEST(pow_by_constant) {
    Case k;
    case_init(&k);
    Value *e = tensor(&k, "e", VAL_CONSTANT, 0, NULL, 0);
    const_set_f(e->konst, 0, 2.0);
    Value *in[2] = {param(&k, "X", 2, D(3, 4)), e};
    check(&k, op(&k, "Pow", 2, in, NULL, NULL, 0, 0), 2e-2);
}
END_TEST

START_TEST(shape_ops) {
    {
        Case k;
        case_init(&k);
        Value *in[1] = {param(&k, "X", 3, D(2, 3, 4))};
        check(&k, op(&k, "Transpose", 1, in, "perm", D(2, 0, 1), 3, 0), 1e-2);
    }
    {
        Case k;
        case_init(&k);
        Value *in[1] = {param(&k, "X", 3, D(2, 3, 4))};
        check(&k, op(&k, "Flatten", 1, in, "axis", NULL, 1, 2), 1e-2);
    }
}
END_TEST

START_TEST(reductions) {
    const char *ops[] = {"ReduceMean", "ReduceSum"};
    for (int i = 0; i < 2; i++) {
        Case k;
        case_init(&k);
        Value *x = param(&k, "X", 3, D(2, 3, 4));
        Value *axes = graph_add_value(k.g, "axes");
        axes->kind = VAL_CONSTANT;
        axes->dtype = DT_INT64;
        axes->rank = 1;
        axes->dims[0] = dim_const(1);
        axes->konst = const_new(k.g, DT_INT64, 1);
        const_set_i(axes->konst, 0, 1);
        Value *in[2] = {x, axes};
        /* opset 17: ReduceMean takes axes as an attribute, ReduceSum as an input */
        Value *y = i == 0 ? op(&k, ops[i], 1, in, "axes", D(1), 1, 0) : op(&k, ops[i], 2, in, NULL, NULL, 0, 0);
        check(&k, y, 1e-2);
    }
}
END_TEST

START_TEST(softmax_cross_entropy) {
    Case k;
    case_init(&k);
    Value *x = param(&k, "X", 2, D(4, 5));
    Value *lab = graph_add_value(k.g, "labels");
    lab->kind = VAL_CONSTANT;
    lab->dtype = DT_INT64;
    lab->rank = 1;
    lab->dims[0] = dim_const(4);
    lab->konst = const_new(k.g, DT_INT64, 4);
    for (int i = 0; i < 4; i++) const_set_i(lab->konst, i, (i * 3) % 5);
    Value *in[2] = {x, lab};
    Node *n = gb_start(&k.gc, "", "SoftmaxCrossEntropyLoss", 2, in, 1);
    Value *loss = gb_finish(&k.gc, n);
    /* scale so the check's R multiplies a scalar */
    check(&k, loss, 2e-2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("grad");
    TCase *tc = tcase_create("grad");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gemm);
    tcase_add_test(tc, matmul_broadcast);
    tcase_add_test(tc, arithmetic_broadcast);
    tcase_add_test(tc, activations);
    tcase_add_test(tc, softmax_family);
    tcase_add_test(tc, pow_by_constant);
    tcase_add_test(tc, shape_ops);
    tcase_add_test(tc, reductions);
    tcase_add_test(tc, softmax_cross_entropy);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
