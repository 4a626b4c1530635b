/* test_dropout.c - Dropout in training mode (ops_dropout.c): its gradient
 * by finite differences, the share of elements its masks drop, the scale
 * of those it keeps, masks that follow (seed, step, row position) and
 * nothing else, the eval step's identity, and ratio 0's.
 *
 * Each case trains y = Dropout(X, ratio, training_mode=1) over a float
 * initializer X [rows, cols] (so the program has a gradient to compute),
 * with a graph input of `rows` rows, which gives the training graph its
 * batch: the row positions input has as many rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static bool agree(double fd, double an, double rtol) {
    return fabs(fd - an) <= 1e-3 + rtol * fmax(fabs(fd), fabs(an));
}

static const GradRules rules = {"dropout_case", grad_rand_xorshift, 0x2545f4914f6cdd1dull, agree};

#define D(...) ((int64_t[]){__VA_ARGS__})

/* y = Dropout(X) with X [rows, cols] a parameter; returns y. */
static Value *dropout_case(GradCase *k, int64_t rows, int64_t cols, float ratio) {
    grad_case_init(k, &rules);
    test_graph_input(k->g, "batch", DT_FLOAT, 1, D(rows));
    Value *in[3] = {grad_param(k, "X", 2, D(rows, cols)), gb_const_f(&k->gc, ratio), gb_const_f(&k->gc, 1)};
    return grad_finish(k, grad_node(k, "Dropout", 3, in));
}

START_TEST(dropout_grad) {
    GradCase k;
    Value *y = dropout_case(&k, 4, 6, 0.5f);
    grad_check(&k, gb_op2(&k.gc, "Mul", y, y), 2e-2);
}
END_TEST

/* A compiled program of loss = ReduceSum(y), with its positions
 * 0..rows-1.  Its gradient of X is the mask times 1 / (1 - ratio): the
 * forward value's buffer is reused by the backward pass, the loss and the
 * gradient are read after the step. */
typedef struct Case {
    GradCase k;
    TestProg tp;
    Value *x, *loss, *dx;
    int64_t n;
} Case;

static void case_build(Case *c, int64_t rows, int64_t cols, float ratio) {
    Value *in[1] = {dropout_case(&c->k, rows, cols, ratio)};
    c->x = graph_find_value(c->k.g, "X");
    Node *sum = grad_node(&c->k, "ReduceSum", 1, in);
    gb_attr_i(&c->k.gc, sum, "keepdims", 0);
    c->loss = grad_finish(&c->k, sum);
    c->k.g->outputs[c->k.g->n_outputs++] = c->loss;
    TrainOptions o = {.loss = LOSS_MODEL, .optimizer = OPT_SGD, .lr = 0};
    char msg[1024];
    ck_assert_msg(test_prog_train(&c->tp, c->k.g, &o, msg, sizeof msg), "compile: %s", msg);
    c->dx = c->tp.t.grads[0];
    ck_assert_ptr_nonnull(c->dx);
    c->n = rows * cols;
    int64_t *pos = c->tp.t.positions ? test_buf(&c->tp, c->tp.t.positions) : NULL;
    for (int64_t r = 0; pos && r < rows; r++) pos[r] = r;
}

/* Runs a train step at optimizer step `step` with `seed`; copies the
 * gradient of X (mask / (1 - ratio)) and returns the loss. */
static float case_step(Case *c, float step, int64_t seed, float *dx) {
    *(float *)test_buf(&c->tp, c->tp.t.step) = step;
    *(int64_t *)test_buf(&c->tp, c->tp.t.seed) = seed;
    c->tp.train(c->tp.arena);
    memcpy(dx, test_buf(&c->tp, c->dx), sizeof *dx * (size_t)c->n);
    return *(float *)test_buf(&c->tp, c->loss);
}

static int64_t count_dropped(const float *y, int64_t n) {
    int64_t z = 0;
    for (int64_t i = 0; i < n; i++) z += y[i] == 0;
    return z;
}

/* About ratio of the elements are dropped (within 5 standard deviations of
 * the binomial count), the others scaled by 1 / (1 - ratio), and the masks
 * differ with the step, the seed and the row's position only. */
START_TEST(dropout_masks) {
    const float ratio = 0.3f;
    Case c;
    case_build(&c, 64, 1000, ratio);
    ck_assert_ptr_nonnull(c.tp.t.positions);
    const float *x = test_buf(&c.tp, c.x);
    float *a = malloc(sizeof *a * (size_t)c.n), *b = malloc(sizeof *b * (size_t)c.n);
    ck_assert(a && b);
    float loss = case_step(&c, 1, 7, a);
    double n = (double)c.n, want = ratio * n, sd = sqrt(n * ratio * (1 - ratio));
    int64_t dropped = count_dropped(a, c.n);
    ck_assert_msg(fabs((double)dropped - want) <= 5 * sd, "dropped %lld of %.0f, expected %.0f +- %.0f",
                  (long long)dropped, n, want, 5 * sd);
    float scale = (float)(1.0 / (1.0 - ratio));
    double kept = 0, size = 0;
    for (int64_t i = 0; i < c.n; i++) {
        ck_assert_msg(a[i] == 0 || a[i] == scale, "element %lld: gradient %g", (long long)i, a[i]);
        kept += a[i] ? (double)(x[i] * scale) : 0;
        size += fabs(x[i] * scale);
    }
    ck_assert_msg(fabs(loss - kept) <= 1e-5 * size, "loss %g, the kept elements sum to %g", loss, kept);

    /* the same key draws the same mask */
    case_step(&c, 1, 7, b);
    ck_assert(memcmp(a, b, sizeof *a * (size_t)c.n) == 0);
    /* another step, seed, or row position, another mask: two independent
     * masks disagree on 2 ratio (1 - ratio) of the elements */
    double diff_want = 2 * ratio * (1 - ratio) * n, diff_sd = sqrt(n * 2 * ratio * (1 - ratio));
    for (int change = 0; change < 3; change++) {
        int64_t *pos = test_buf(&c.tp, c.tp.t.positions);
        if (change == 2)
            for (int64_t r = 0; r < 64; r++) pos[r] = r + 64; /* the rows of a second replica */
        case_step(&c, change == 0 ? 2 : 1, change == 1 ? 8 : 7, b);
        int64_t differ = 0;
        for (int64_t i = 0; i < c.n; i++) differ += (a[i] == 0) != (b[i] == 0);
        ck_assert_msg(fabs((double)differ - diff_want) <= 5 * diff_sd, "change %d: %lld masks differ, expected %.0f",
                      change, (long long)differ, diff_want);
    }
    /* the eval step does not drop */
    c.tp.eval(c.tp.arena);
    double all = 0;
    for (int64_t i = 0; i < c.n; i++) all += x[i];
    float eval_loss = *(float *)test_buf(&c.tp, c.loss);
    ck_assert_msg(fabs(eval_loss - all) <= 1e-5 * size, "eval loss %g, the elements sum to %g", eval_loss, all);
    free(a);
    free(b);
    test_prog_free(&c.tp);
}
END_TEST

/* Ratio 0 keeps the node the identity: no mask, no positions. */
START_TEST(dropout_ratio_zero) {
    Case c;
    case_build(&c, 8, 16, 0.0f);
    ck_assert_ptr_null(c.tp.t.positions);
    c.tp.train(c.tp.arena);
    const float *dx = test_buf(&c.tp, c.dx);
    for (int64_t i = 0; i < c.n; i++) ck_assert_msg(dx[i] == 1, "element %lld: gradient %g", (long long)i, dx[i]);
    test_prog_free(&c.tp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("dropout");
    TCase *tc = tcase_create("dropout");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, dropout_grad);
    tcase_add_test(tc, dropout_masks);
    tcase_add_test(tc, dropout_ratio_zero);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
