/* test_gemm.c - the packed float32 GEMM (codegen/cg_gemm.c) against a
 * double-precision reference.
 *
 * Each case builds a graph of Gemm (or MatMul) nodes over run-time inputs,
 * compiles its forward pass in this process as test_forward_conformance.c
 * does, fills the inputs with random numbers, runs the eval step and
 * compares every element with a sum of products in double.  One graph
 * holds the four transA/transB forms of a product (A and A^T, B and B^T
 * are separate inputs with the same contents) at two values of alpha.
 *
 * The shapes are run several ways: with the packed path forced on every
 * product (so that 1x1x1 and 7x13x17 reach it), forced with tiny blocks
 * (KC = 16, NC = one panel, so that a few hundred rows already cross
 * several K and N blocks and every edge kernel), with the defaults (where
 * the small ones keep gemm_block's loops), and forced with the 8- and
 * 4-float vectors of AVX and SSE/NEON targets (6 x 16 and 6 x 8 tiles,
 * whose A panels are not a power of two and take the scalar copies), and
 * with 12 x 32 and 4 x 64 tiles for the other in-register transposes.
 *
 * Tolerance: a float32 sum of K products of random signs drifts by about
 * eps * K * rms(product); the check allows 16 times that, which a wrong,
 * missing or doubled product (of size rms) exceeds by far. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "codegen/cg_gemm.h"
#include "ir/shapes.h"
#include "ops/ops.h"

static uint64_t rng = 88172645463325252ull;

static float rnd(void) { return grad_rand_xorshift(&rng); }

static Graph *new_graph(void) { return test_graph_new("gemm.onnx", 17, 16, 16); }

/* A float32 input. */
static Value *input(Graph *g, const char *name, int rank, const int64_t *dims) {
    return test_graph_input(g, name, DT_FLOAT, rank, dims);
}

static void compile(TestProg *tp, Graph *g) {
    Diag d = {0};
    ShapeOptions so = {.batch = 0, .fold = true};
    ck_assert_msg(ir_verify(g, &d) && ir_infer_shapes(g, &so, &d), "front end: %s", d.msg);
    ir_prune(g);
    char msg[1024];
    ck_assert_msg(test_prog_forward(tp, g, msg, sizeof msg), "compiling: %s", msg);
}

static float *fill(TestProg *tp, const Value *v) {
    float *p = test_buf(tp, v);
    ck_assert_ptr_nonnull(p);
    for (int64_t i = 0; i < value_numel(v); i++) p[i] = rnd();
    return p;
}

/* y (M x N, row-major) against alpha * a b + beta * c[i*cs0 + j*cs1], with
 * a(i, k) = a[i*asi + k*ask] and b(k, j) = b[k*bsk + j*bsj]. */
static void check(const char *what, const float *y, int64_t M, int64_t N, int64_t K, const float *a, int64_t asi,
                  int64_t ask, const float *b, int64_t bsk, int64_t bsj, float alpha, const float *c, int64_t cs0,
                  int64_t cs1, float beta) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, s2 = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)a[i * asi + k * ask] * (double)b[k * bsk + j * bsj];
                s += p;
                s2 += p * p;
            }
            double want = (double)alpha * s, cterm = 0;
            if (c) cterm = (double)beta * (double)c[i * cs0 + j * cs1];
            want += cterm;
            double tol = 16.0 * FLT_EPSILON * (double)(K + 2) * sqrt(s2 / (double)K) * fabs((double)alpha) +
                         4.0 * FLT_EPSILON * fabs(cterm) + 1e-30;
            double got = y[i * N + j];
            ck_assert_msg(fabs(got - want) <= tol, "%s: y[%lld,%lld] = %.9g, expected %.9g (tolerance %.3g)", what,
                          (long long)i, (long long)j, got, want, tol);
        }
}

typedef enum { RUN_FORCED, RUN_TINY_BLOCKS, RUN_DEFAULT, RUN_W8, RUN_W4, RUN_12X2, RUN_4X4 } RunMode;

static const char *mode_name[] = {"forced",          "tiny blocks",     "default",       "8-float vectors",
                                  "4-float vectors", "12 x 2 vectors", "4 x 4 vectors"};

static void configure(RunMode mode) {
    CgGemmConfig cfg = {.force = 1};
    if (mode == RUN_TINY_BLOCKS) cfg.kc = 16, cfg.nc = 1;
    if (mode == RUN_W8) cfg.w = 8, cfg.kc = 40;
    if (mode == RUN_W4) cfg.w = 4;
    if (mode == RUN_12X2) cfg.mr = 12, cfg.nv = 2;
    if (mode == RUN_4X4) cfg.mr = 4, cfg.nv = 4, cfg.kc = 24;
    cg_gemm_configure(mode == RUN_DEFAULT ? NULL : &cfg);
}

/* The four transA/transB forms of an M x N x K product, at alpha 1 and at
 * alpha `alpha`, in one program; run twice to check the bits repeat. */
static void gemm_shape(int64_t M, int64_t N, int64_t K, float alpha, RunMode mode) {
    configure(mode);
    Graph *g = new_graph();
    Value *A = input(g, "A", 2, (int64_t[]){M, K}), *At = input(g, "At", 2, (int64_t[]){K, M});
    Value *B = input(g, "B", 2, (int64_t[]){K, N}), *Bt = input(g, "Bt", 2, (int64_t[]){N, K});
    Node *nodes[8];
    for (int v = 0; v < 8; v++) {
        int ta = v & 1, tb = (v >> 1) & 1;
        Value *in[2] = {ta ? At : A, tb ? Bt : B};
        nodes[v] = test_graph_op(g, "Gemm", 2, in);
        test_attr_i(nodes[v], "transA", ta);
        test_attr_i(nodes[v], "transB", tb);
        if (v >= 4) test_attr_f(nodes[v], "alpha", alpha);
    }
    TestProg tp;
    compile(&tp, g);
    float *a = fill(&tp, A), *b = fill(&tp, B), *at = test_buf(&tp, At), *bt = test_buf(&tp, Bt);
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) at[k * M + i] = a[i * K + k];
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < N; j++) bt[j * K + k] = b[k * N + j];
    tp.eval(tp.arena);
    size_t ybytes = sizeof(float) * (size_t)(M * N);
    float *first[8];
    for (int v = 0; v < 8; v++) {
        char what[160];
        snprintf(what, sizeof what, "%lldx%lldx%lld transA=%d transB=%d alpha=%g (%s)", (long long)M, (long long)N,
                 (long long)K, v & 1, (v >> 1) & 1, v >= 4 ? alpha : 1.0, mode_name[mode]);
        const float *y = test_buf(&tp, nodes[v]->out[0]);
        check(what, y, M, N, K, a, K, 1, b, N, 1, v >= 4 ? alpha : 1.0f, NULL, 0, 0, 0);
        first[v] = malloc(ybytes);
        ck_assert_ptr_nonnull(first[v]);
        memcpy(first[v], y, ybytes);
    }
    /* the same bits on every run */
    tp.eval(tp.arena);
    for (int v = 0; v < 8; v++) {
        ck_assert_msg(memcmp(first[v], test_buf(&tp, nodes[v]->out[0]), ybytes) == 0,
                      "%lldx%lldx%lld form %d: second run differs", (long long)M, (long long)N, (long long)K, v);
        free(first[v]);
    }
    test_prog_free(&tp);
    cg_gemm_configure(NULL);
}

static const int64_t shapes[][3] = {
    {1, 1, 1},    {7, 13, 17},   {8, 48, 16},  {9, 49, 33},   {64, 64, 64},
    {1, 300, 70}, {300, 1, 70},  {31, 17, 1},  {130, 257, 129}, {67, 1100, 800},
};
enum { N_SHAPES = sizeof shapes / sizeof *shapes };

static void all_shapes(RunMode mode) {
    for (int s = 0; s < N_SHAPES; s++) {
        /* the large one twice: it only adds blocks of the same kind */
        if (shapes[s][1] > 1000 && mode != RUN_FORCED && mode != RUN_DEFAULT) continue;
        gemm_shape(shapes[s][0], shapes[s][1], shapes[s][2], s % 2 ? -1.75f : 0.5f, mode);
    }
}

START_TEST(gemm_forced) { all_shapes(RUN_FORCED); }
END_TEST

START_TEST(gemm_tiny_blocks) { all_shapes(RUN_TINY_BLOCKS); }
END_TEST

START_TEST(gemm_default) { all_shapes(RUN_DEFAULT); }
END_TEST

/* The code for AVX (6 x 16 tiles) and SSE/NEON widths, whatever this
 * machine has: LLVM legalises any vector width. */
START_TEST(gemm_narrower_vectors) {
    all_shapes(RUN_W8);
    all_shapes(RUN_W4);
}
END_TEST

/* Other tiles: A panels of 12 rows are transposed 4 rows at a time and
 * stored in pieces, panels of 4 rows as whole vectors of 4 k's. */
START_TEST(gemm_other_tiles) {
    all_shapes(RUN_12X2);
    all_shapes(RUN_4X4);
}
END_TEST

/* Y = alpha op(A) op(B) + beta C with C a row [N], a column [M, 1] and a
 * full [M, N]: the packed product adds into what C's broadcast left in Y. */
START_TEST(gemm_with_bias) {
    for (int mode = RUN_FORCED; mode <= RUN_DEFAULT; mode++) {
        configure((RunMode)mode);
        const int64_t M = 61, N = 70, K = 90;
        Graph *g = new_graph();
        Value *At = input(g, "At", 2, (int64_t[]){K, M}), *Bt = input(g, "Bt", 2, (int64_t[]){N, K});
        Value *cs[3] = {input(g, "Crow", 1, (int64_t[]){N}), input(g, "Ccol", 2, (int64_t[]){M, 1}),
                        input(g, "Cfull", 2, (int64_t[]){M, N})};
        Node *nodes[3];
        for (int v = 0; v < 3; v++) {
            Value *in[3] = {At, Bt, cs[v]};
            nodes[v] = test_graph_op(g, "Gemm", 3, in);
            test_attr_i(nodes[v], "transA", 1);
            test_attr_i(nodes[v], "transB", 1);
            test_attr_f(nodes[v], "alpha", 0.25f);
            test_attr_f(nodes[v], "beta", v == 2 ? 1.0f : -3.0f);
        }
        TestProg tp;
        compile(&tp, g);
        float *at = fill(&tp, At), *bt = fill(&tp, Bt);
        float *c[3];
        for (int v = 0; v < 3; v++) c[v] = fill(&tp, cs[v]);
        tp.eval(tp.arena);
        const int64_t s0[3] = {0, 1, N}, s1[3] = {1, 0, 1};
        for (int v = 0; v < 3; v++)
            check(mode_name[mode], test_buf(&tp, nodes[v]->out[0]), M, N, K, at, 1, M, bt, 1, K, 0.25f, c[v], s0[v],
                  s1[v], v == 2 ? 1.0f : -3.0f);
        test_prog_free(&tp);
        cg_gemm_configure(NULL);
    }
}
END_TEST

/* Batched MatMul, batch dims broadcast both ways, and a 2-D B shared by
 * every batch: one packed product per batch element, at its offsets. */
START_TEST(matmul_batched) {
    for (int mode = RUN_FORCED; mode <= RUN_DEFAULT; mode++) {
        configure((RunMode)mode);
        Graph *g = new_graph();
        Value *A = input(g, "A", 4, (int64_t[]){2, 1, 37, 29}), *B = input(g, "B", 3, (int64_t[]){3, 29, 41});
        Value *X = input(g, "X", 3, (int64_t[]){5, 60, 70}), *W = input(g, "W", 2, (int64_t[]){70, 50});
        Node *ab = test_graph_op(g, "MatMul", 2, (Value *[]){A, B});
        Node *xw = test_graph_op(g, "MatMul", 2, (Value *[]){X, W});
        TestProg tp;
        compile(&tp, g);
        float *a = fill(&tp, A), *b = fill(&tp, B), *x = fill(&tp, X), *w = fill(&tp, W);
        tp.eval(tp.arena);
        const float *y = test_buf(&tp, ab->out[0]);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                char what[64];
                snprintf(what, sizeof what, "MatMul batch [%d,%d] (%s)", i, j, mode_name[mode]);
                check(what, y + (i * 3 + j) * 37 * 41, 37, 41, 29, a + i * 37 * 29, 29, 1, b + j * 29 * 41, 41, 1,
                      1.0f, NULL, 0, 0, 0);
            }
        y = test_buf(&tp, xw->out[0]);
        for (int i = 0; i < 5; i++) {
            char what[64];
            snprintf(what, sizeof what, "MatMul batch %d, shared B (%s)", i, mode_name[mode]);
            check(what, y + i * 60 * 50, 60, 50, 70, x + i * 60 * 70, 70, 1, w, 50, 1, 1.0f, NULL, 0, 0, 0);
        }
        test_prog_free(&tp);
        cg_gemm_configure(NULL);
    }
}
END_TEST

/* The gradient products are Gemm nodes with transposes: with every
 * product packed, Gemm's and MatMul's gradients still match finite
 * differences. */
static bool agree(double fd, double an, double tol) { return fabs(fd - an) <= tol * (1.0 + fabs(fd)); }
static const GradRules rules = {"gemm_grad", grad_rand_lcg, 4242, agree};

START_TEST(gradients_through_packed_products) {
    CgGemmConfig cfg = {.force = 1, .kc = 16, .nc = 1};
    cg_gemm_configure(&cfg);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            GradCase k;
            grad_case_init(&k, &rules);
            Value *a = grad_param(&k, "A", 2, ta ? (int64_t[]){19, 9} : (int64_t[]){9, 19});
            Value *b = grad_param(&k, "B", 2, tb ? (int64_t[]){21, 19} : (int64_t[]){19, 21});
            Value *in[2] = {a, b};
            Node *n = grad_node(&k, "Gemm", 2, in);
            gb_attr_i(&k.gc, n, "transA", ta);
            gb_attr_i(&k.gc, n, "transB", tb);
            gb_attr_f(&k.gc, n, "alpha", 0.75f);
            grad_check(&k, grad_finish(&k, n), 2e-2);
        }
    GradCase k;
    grad_case_init(&k, &rules);
    Value *in[2] = {grad_param(&k, "A", 3, (int64_t[]){2, 9, 17}), grad_param(&k, "B", 2, (int64_t[]){17, 11})};
    grad_check(&k, grad_finish(&k, grad_node(&k, "MatMul", 2, in)), 2e-2);
    cg_gemm_configure(NULL);
}
END_TEST

/* Which products take the packed path by default. */
START_TEST(packed_path_choice) {
    Graph *g = new_graph();
    Value *f = input(g, "f", 1, (int64_t[]){1});
    Value h = *f;
    h.dtype = DT_FLOAT16;
    ck_assert(cg_gemm_applies(f, f, f, 128, 1024, 784));
    ck_assert(!cg_gemm_applies(f, f, f, 7, 13, 17));
    ck_assert(!cg_gemm_applies(f, f, &h, 128, 1024, 784));
    ck_assert(!cg_gemm_applies(f, f, f, 0, 1024, 784));
    CgGemmConfig cfg = {.force = 1};
    cg_gemm_configure(&cfg);
    ck_assert(cg_gemm_applies(f, f, f, 1, 1, 1));
    ck_assert(!cg_gemm_applies(&h, f, f, 1, 1, 1));
    cfg.force = -1;
    cg_gemm_configure(&cfg);
    ck_assert(!cg_gemm_applies(f, f, f, 128, 1024, 784));
    cg_gemm_configure(NULL);
    char line[256];
    cg_gemm_describe(128, 1024, 784, line, sizeof line);
    ck_assert_msg(strstr(line, "MR=") && strstr(line, "KC="), "%s", line);
    graph_free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, packed_path_choice);
    tcase_add_test(tc, gemm_forced);
    tcase_add_test(tc, gemm_tiny_blocks);
    tcase_add_test(tc, gemm_default);
    tcase_add_test(tc, gemm_narrower_vectors);
    tcase_add_test(tc, gemm_other_tiles);
    tcase_add_test(tc, gemm_with_bias);
    tcase_add_test(tc, matmul_batched);
    tcase_add_test(tc, gradients_through_packed_products);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
