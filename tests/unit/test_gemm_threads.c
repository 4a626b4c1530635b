/* test_gemm_threads.c - packed products split among threads (--threads,
 * codegen/cg_gemm.c) give the bits of one thread.
 *
 * Each case builds one graph holding the four transA/transB forms of an
 * M x N x K Gemm (and one with alpha), compiles it in this process once
 * with Plan.threads = 1 and once each with 2 and 3, and runs the eval step
 * on the runtime's own thread pool (runtime/rt_pool.c, linked into this
 * test; the JIT finds cleave_rt_parallel among the executable's symbols).
 * Every output must equal the one-thread output byte for byte, and the
 * one-thread output must match a double-precision sum of products (the
 * tolerance of test_gemm.c).  A split program also runs on a pool of a
 * different size (no workers, or more workers than parts), which deals
 * the same panels out differently and must still give the same bits.
 *
 * The split threshold is lowered to one multiply-add so that small shapes
 * are split, and the shapes are run with the default blocks, with tiny
 * blocks (KC = 16, NC = one panel: every thread's part crosses several K
 * and N blocks and edge kernels) and with 8-float vectors (6 x 16 tiles).
 * The generated IR is checked for split products, by columns and by rows,
 * so the test cannot pass by leaving everything on one thread. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"
#include "codegen/cg_gemm.h"
#include "ir/shapes.h"
#include "ops/ops.h"
#include "rt.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float rnd(void) { return grad_rand_xorshift(&rng); }

typedef enum { MODE_DEFAULT, MODE_TINY, MODE_W8 } Mode;
static const char *mode_name[] = {"default blocks", "tiny blocks", "8-float vectors"};

static void configure(Mode mode) {
    CgGemmConfig cfg = {.force = 1, .par_volume = 1};
    if (mode == MODE_TINY) cfg.kc = 16, cfg.nc = 1;
    if (mode == MODE_W8) cfg.w = 8, cfg.kc = 40;
    cg_gemm_configure(&cfg);
}

#define FORMS 5 /* the four transA/transB forms, and NN with alpha */

/* The graph of an M x N x K case; its input and output values. */
typedef struct Case {
    Graph *g;
    Value *A, *At, *B, *Bt;
    Node *nodes[FORMS];
} Case;

static Case build(int64_t M, int64_t N, int64_t K) {
    Case k;
    k.g = test_graph_new("gemm_threads.onnx", 17, 4, 8);
    k.A = test_graph_input(k.g, "A", DT_FLOAT, 2, (int64_t[]){M, K});
    k.At = test_graph_input(k.g, "At", DT_FLOAT, 2, (int64_t[]){K, M});
    k.B = test_graph_input(k.g, "B", DT_FLOAT, 2, (int64_t[]){K, N});
    k.Bt = test_graph_input(k.g, "Bt", DT_FLOAT, 2, (int64_t[]){N, K});
    for (int v = 0; v < FORMS; v++) {
        int ta = v < 4 ? v & 1 : 0, tb = v < 4 ? (v >> 1) & 1 : 0;
        Value *in[2] = {ta ? k.At : k.A, tb ? k.Bt : k.B};
        k.nodes[v] = test_graph_op(k.g, "Gemm", 2, in);
        test_attr_i(k.nodes[v], "transA", ta);
        test_attr_i(k.nodes[v], "transB", tb);
        if (v == 4) test_attr_f(k.nodes[v], "alpha", -0.75f);
    }
    Diag d = {0};
    ShapeOptions so = {.batch = 0, .fold = true};
    ck_assert_msg(ir_verify(k.g, &d) && ir_infer_shapes(k.g, &so, &d), "front end: %s", d.msg);
    ir_prune(k.g);
    return k;
}

/* The inputs, the same for every build of a case. */
typedef struct Data {
    int64_t M, N, K;
    float *a, *b;
} Data;

static void feed(TestProg *tp, const Case *k, const Data *x) {
    float *a = test_buf(tp, k->A), *at = test_buf(tp, k->At), *b = test_buf(tp, k->B), *bt = test_buf(tp, k->Bt);
    for (int64_t i = 0; i < x->M; i++)
        for (int64_t j = 0; j < x->K; j++) a[i * x->K + j] = at[j * x->M + i] = x->a[i * x->K + j];
    for (int64_t i = 0; i < x->K; i++)
        for (int64_t j = 0; j < x->N; j++) b[i * x->N + j] = bt[j * x->K + i] = x->b[i * x->N + j];
}

/* y against alpha * a b in double. */
static void check_reference(const char *what, const float *y, const Data *x, float alpha) {
    for (int64_t i = 0; i < x->M; i++)
        for (int64_t j = 0; j < x->N; j++) {
            double s = 0, s2 = 0;
            for (int64_t k = 0; k < x->K; k++) {
                double p = (double)x->a[i * x->K + k] * (double)x->b[k * x->N + j];
                s += p;
                s2 += p * p;
            }
            double want = (double)alpha * s;
            double tol = 16.0 * FLT_EPSILON * (double)(x->K + 2) * sqrt(s2 / (double)x->K) * fabs((double)alpha) + 1e-30;
            ck_assert_msg(fabs((double)y[i * x->N + j] - want) <= tol, "%s: y[%lld,%lld] = %.9g, expected %.9g", what,
                          (long long)i, (long long)j, (double)y[i * x->N + j], want);
        }
}

/* Counts the products of the case's module split by columns and by rows
 * at `threads` (their functions end in .t<T>c / .t<T>r). */
static void count_splits(int64_t M, int64_t N, int64_t K, int threads, int *cols, int *rows) {
    Case k = build(M, N, K);
    Plan p;
    Diag d = {0};
    ck_assert_msg(plan_forward(k.g, &p, &d), "plan: %s", d.msg);
    p.threads = threads;
    char path[] = "/tmp/cleave_gemm_threads_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    CgOptions co = {.emit = "llvm", .output = path, .passes = "default<O0>"};
    CgModule *m = cg_build(&p, &co, &d);
    ck_assert_msg(m && cg_emit(m, &co, &d), "emitting IR: %s", d.msg);
    cg_module_free(m);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096], c_tag[16], r_tag[16];
    snprintf(c_tag, sizeof c_tag, ".t%dc.task", threads);
    snprintf(r_tag, sizeof r_tag, ".t%dr.task", threads);
    *cols = *rows = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "define", 6) == 0) {
            *cols += strstr(line, c_tag) != NULL;
            *rows += strstr(line, r_tag) != NULL;
        }
    fclose(f);
    unlink(path);
    graph_free(k.g);
}

/* Runs the case's program built for `threads` on a pool of `pool` threads;
 * returns the FORMS outputs, malloc'd back to back. */
static float *run(const Data *x, int threads, int pool) {
    Case k = build(x->M, x->N, x->K);
    TestProg tp;
    char msg[1024];
    ck_assert_msg(test_prog_forward_threads(&tp, k.g, threads, msg, sizeof msg), "compiling: %s", msg);
    RtErr e = {0};
    ck_assert_msg(rt_pool_start(pool, &e), "pool of %d: %s", pool, e.msg);
    ck_assert_int_eq(rt_pool_threads(), pool);
    feed(&tp, &k, x);
    size_t n = (size_t)(x->M * x->N);
    float *out = malloc(FORMS * n * sizeof *out);
    ck_assert_ptr_nonnull(out);
    tp.eval(tp.arena);
    for (int v = 0; v < FORMS; v++) memcpy(out + v * n, test_buf(&tp, k.nodes[v]->out[0]), n * sizeof *out);
    rt_pool_stop();
    test_prog_free(&tp);
    return out;
}

static void same_bits(const float *want, const float *got, const Data *x, Mode mode, int threads, int pool) {
    size_t n = (size_t)(x->M * x->N);
    for (int v = 0; v < FORMS; v++)
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&want[v * n + i], &got[v * n + i], sizeof(float)) == 0,
                          "%lldx%lldx%lld form %d (%s), %d threads on a pool of %d: y[%zu] = %.9g, one thread %.9g",
                          (long long)x->M, (long long)x->N, (long long)x->K, v, mode_name[mode], threads, pool, i,
                          (double)got[v * n + i], (double)want[v * n + i]);
}

static void threads_case(int64_t M, int64_t N, int64_t K, Mode mode) {
    configure(mode);
    Data x = {M, N, K, malloc(sizeof(float) * (size_t)(M * K)), malloc(sizeof(float) * (size_t)(K * N))};
    ck_assert(x.a && x.b);
    for (int64_t i = 0; i < M * K; i++) x.a[i] = rnd();
    for (int64_t i = 0; i < K * N; i++) x.b[i] = rnd();
    float *one = run(&x, 1, 1);
    size_t n = (size_t)(M * N);
    for (int v = 0; v < FORMS; v++) {
        char what[160];
        snprintf(what, sizeof what, "%lldx%lldx%lld form %d (%s)", (long long)M, (long long)N, (long long)K, v,
                 mode_name[mode]);
        check_reference(what, one + v * n, &x, v == 4 ? -0.75f : 1.0f);
    }
    /* built for T, run on T threads, on one and on one more than T */
    for (int t = 2; t <= 3; t++)
        for (int pool = 1; pool <= t + 1; pool += t == 2 ? 1 : 2) {
            float *got = run(&x, t, pool);
            same_bits(one, got, &x, mode, t, pool);
            free(got);
        }
    free(one);
    free(x.a);
    free(x.b);
    cg_gemm_configure(NULL);
}

static const int64_t shapes[][3] = {
    {9, 49, 33}, {130, 257, 129}, {1, 300, 70}, {300, 1, 70}, {64, 10, 100}, {31, 17, 1}, {67, 1100, 300},
};

START_TEST(test_threads_default) {
    threads_case(shapes[_i][0], shapes[_i][1], shapes[_i][2], MODE_DEFAULT);
}
END_TEST

START_TEST(test_threads_tiny_blocks) {
    threads_case(shapes[_i][0], shapes[_i][1], shapes[_i][2], MODE_TINY);
}
END_TEST

START_TEST(test_threads_w8) {
    threads_case(shapes[_i][0], shapes[_i][1], shapes[_i][2], MODE_W8);
}
END_TEST

/* The shapes above do reach both partitions: 130 x 257 is split by
 * columns (6 panels of 48), 300 x 1 by rows (38 panels of 8). */
START_TEST(test_threads_split_kinds) {
    configure(MODE_DEFAULT);
    int cols, rows;
    count_splits(130, 257, 129, 2, &cols, &rows);
    ck_assert_msg(cols == FORMS && rows == 0, "130x257x129 at 2 threads: %d split by columns, %d by rows", cols, rows);
    count_splits(300, 1, 70, 3, &cols, &rows);
    ck_assert_msg(rows == FORMS && cols == 0, "300x1x70 at 3 threads: %d split by columns, %d by rows", cols, rows);
    /* below the default threshold nothing is split */
    cg_gemm_configure(NULL);
    count_splits(9, 49, 33, 2, &cols, &rows);
    ck_assert_msg(cols == 0 && rows == 0, "9x49x33 (default threshold): %d split by columns, %d by rows", cols, rows);
    cg_gemm_configure(NULL);
}
END_TEST

/* The pool itself: every t of T runs once per call, at the same time as
 * the others, call after call. */
typedef struct Tally {
    int64_t T;
    _Atomic int64_t hits[8];
} Tally;

static void count_task(void *ctx, int64_t t, int64_t T) {
    Tally *y = ctx;
    y->T = T;
    y->hits[t]++;
}

START_TEST(test_pool_calls) {
    RtErr e = {0};
    ck_assert(rt_pool_start(4, &e));
    Tally y = {0};
    for (int i = 0; i < 1000; i++) cleave_rt_parallel(count_task, &y);
    ck_assert_int_eq(y.T, 4);
    for (int t = 0; t < 4; t++) ck_assert_int_eq(y.hits[t], 1000);
    rt_pool_stop();
    ck_assert_int_eq(rt_pool_threads(), 1);
    cleave_rt_parallel(count_task, &y);
    ck_assert_int_eq(y.T, 1);
    ck_assert_int_eq(y.hits[0], 1001);
    ck_assert(!rt_pool_start(65, &e));
    ck_assert_ptr_nonnull(strstr(e.msg, "65 threads"));
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("gemm_threads");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 600);
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    tcase_add_loop_test(tc, test_threads_default, 0, n);
    tcase_add_loop_test(tc, test_threads_tiny_blocks, 0, n);
    tcase_add_loop_test(tc, test_threads_w8, 0, n);
    tcase_add_test(tc, test_threads_split_kinds);
    tcase_add_test(tc, test_pool_calls);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return test_run_suite(suite()); }
