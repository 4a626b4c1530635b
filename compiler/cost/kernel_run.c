/* kernel_run.c - generated code timed in this process (kernel_run.h). */
#include "kernel_run.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "../ir/shapes.h"
#include "../plan/plan.h"
#include "../util/sort.h"

void kernel_run_free(KernelRun *k) {
    cg_jit_free(k->jit);
    free(k->arena);
    graph_free(k->g);
    memset(k, 0, sizeof *k);
}

bool kernel_run_build(Graph *g, KernelRun *k, Diag *d) {
    memset(k, 0, sizeof *k);
    k->g = g;
    if (!g) return diag_error(d, DIAG_NOMEM, "out of memory");
    /* No folding: a node whose inputs are all constant must still run. */
    ShapeOptions so = {.batch = 0, .fold = false};
    Plan p;
    if (!ir_verify(g, d) || !ir_infer_shapes(g, &so, d)) return false;
    ir_prune(g);
    if (!plan_forward(g, &p, d)) return false;
    CgOptions co = {.emit = "obj"};
    CgModule *m = cg_build(&p, &co, d);
    if (!m) return false;
    k->jit = cg_jit(m, d);
    cg_module_free(m);
    if (!k->jit) return false;
    k->eval = (void (*)(char *))cg_jit_lookup(k->jit, "cleave_eval_step", d);
    const unsigned char *init = cg_jit_lookup(k->jit, "cleave_init", d);
    if (!k->eval || !init) return false;
    const RankPlan *rp = &p.ranks[0];
    size_t bytes = (size_t)((rp->arena_bytes + 63) / 64 * 64 + 64);
    k->arena = aligned_alloc(64, bytes);
    if (!k->arena) return diag_error(d, DIAG_NOMEM, "out of memory for a %zu-byte arena", bytes);
    k->arena_bytes = bytes;
    memset(k->arena, 0, bytes);
    memcpy(k->arena, init, (size_t)rp->init_bytes);
    for (int i = 0; i < g->n_inputs; i++) {
        const Value *v = g->inputs[i];
        if (!dtype_is_float(v->dtype) || rp->offset[v->id] < 0) continue; /* integers stay 0 */
        float *x = (float *)(k->arena + rp->offset[v->id]);
        for (int64_t j = 0, n = value_numel(v); j < n; j++) x[j] = 0.5f;
    }
    return true;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


size_t kernel_run_cache_bytes(void) {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 && l2 <= (32L << 20) ? (size_t)l2 : (size_t)2 << 20;
}

/* Nanoseconds per cache line of reading n bytes at b again and again
 * (the best of three passes after one). */
static double line_ns(const unsigned char *b, size_t n) {
    volatile unsigned char sink = 0;
    double best = 1e30;
    for (int pass = 0; pass < 4; pass++) {
        unsigned char x = 0;
        double t0 = now_s();
        for (size_t i = 0; i < n; i += 64) x ^= b[i];
        double t = now_s() - t0;
        sink ^= x;
        if (pass > 0 && t < best) best = t;
    }
    (void)sink;
    return best * 1e9 / (double)(n / 64);
}

/* Rounds of the last-level cache probe below: each reads every size
 * once, and each size keeps its fastest round. */
enum { LLC_ROUNDS = 5, LLC_MAX_SIZES = 16 };

/* The largest buffer of twice the L2 cache times a power of two, up to
 * twice the last-level cache the system reports (taken as at most 64
 * MiB), that reads at most 1.5 times slower per line than the fastest:
 * what the last-level cache keeps for this process.  On a virtual
 * machine that shares it with other tenants that is less than its size:
 * the 32 MiB of the development machine's L3 kept 16
 * (docs/costmodel.md).  Slowness of the moment only adds time, so each
 * size keeps its fastest of LLC_ROUNDS rounds (the sizes interleaved),
 * the yardstick is the fastest size, and the answer the largest size
 * within 1.5 times it.  (With one pass of each size against the
 * smallest's time, the probe said 16 MiB in half of its runs here and
 * 64 or 128 in the others: the 2 MiB buffer read at 0.85-1.05 ns a line
 * in some runs and 0.5-0.6 in others, where 8 and 16 MiB read at
 * 0.5-0.7 and 32 MiB at 1.0-1.2 in every run.)  Measured once per
 * process, in about 0.2 s. */
size_t kernel_run_llc_bytes(void) {
    static size_t measured;
    if (measured) return measured;
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    /* a virtual machine may report the host's whole L3 (384 MiB here) */
    size_t stated = l3 > 0 && l3 <= (64L << 20) ? (size_t)l3 : (size_t)64 << 20, lo = 2 * kernel_run_cache_bytes();
    unsigned char *b = malloc(2 * stated);
    if (!b || lo >= stated) {
        free(b);
        return measured = stated;
    }
    memset(b, 1, 2 * stated);
    size_t size[LLC_MAX_SIZES];
    double best[LLC_MAX_SIZES];
    int n = 0;
    for (size_t z = lo; z <= 2 * stated && n < LLC_MAX_SIZES; z *= 2) {
        size[n] = z;
        best[n++] = 1e30;
    }
    for (int round = 0; round < LLC_ROUNDS; round++)
        for (int i = 0; i < n; i++) {
            double t = line_ns(b, size[i]);
            if (t < best[i]) best[i] = t;
        }
    double fastest = best[0];
    for (int i = 1; i < n; i++) fastest = best[i] < fastest ? best[i] : fastest;
    measured = lo;
    for (int i = 1; i < n; i++)
        if (best[i] <= 1.5 * fastest) measured = size[i];
    free(b);
    return measured;
}

/* Writes a byte of every cache line of the first `bytes` of a buffer
 * kept for this (grown when a larger walk is asked for), pushing other
 * data out of the caches that hold less. */
static void walk_buffer(size_t bytes) {
    static unsigned char *junk;
    static size_t n;
    if (bytes > n) {
        unsigned char *grown = calloc(bytes, 1);
        if (!grown) return;
        free(junk);
        junk = grown;
        n = bytes;
    }
    for (size_t i = 0; i < bytes; i += 64) junk[i]++;
}

/* Flushes the arena from every cache level, so that the next call reads
 * its inputs from memory; where there is no flush instruction, walks a
 * buffer twice the last-level cache's size instead. */
static void flush_arena(const KernelRun *k) {
#if defined(__x86_64__) || defined(__i386__)
    for (size_t i = 0; i < k->arena_bytes; i += 64) _mm_clflush(k->arena + i);
    _mm_mfence();
#else
    (void)k;
    walk_buffer(2 * kernel_run_llc_bytes());
#endif
}

/* Walks a buffer four times the size of this core's L2 cache, so that the
 * next call finds its data where a kernel inside a training step finds
 * it: evicted by the kernels before it. */
static void evict_caches(void) { walk_buffer(4 * kernel_run_cache_bytes()); }

double kernel_run_time_cold(KernelRun *k, int calls, int reps, bool memory) {
    k->eval(k->arena);
    double per[16];
    if (reps > 16) reps = 16;
    if (reps < 1) reps = 1;
    if (calls < 1) calls = 1;
    for (int r = 0; r < reps; r++) {
        double sum = 0;
        for (int i = 0; i < calls; i++) {
            evict_caches();
            if (memory) flush_arena(k);
            double t0 = now_s();
            k->eval(k->arena);
            sum += now_s() - t0;
        }
        per[r] = sum / calls;
    }
    sort_doubles(per, (size_t)reps);
    return per[reps / 2];
}

double kernel_run_time(KernelRun *k, double min_s, int reps) {
    k->eval(k->arena);
    long calls = 1;
    for (;;) {
        double t0 = now_s();
        for (long i = 0; i < calls; i++) k->eval(k->arena);
        double t = now_s() - t0;
        if (t >= min_s || calls > (1L << 40)) break;
        /* aim a little past min_s so the next round is usually the last */
        double scale = t > 0 ? 1.2 * min_s / t : 16;
        calls = (long)((double)calls * (scale < 2 ? 2 : scale > 16 ? 16 : scale));
    }
    double per[16];
    if (reps > 16) reps = 16;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (long i = 0; i < calls; i++) k->eval(k->arena);
        per[r] = (now_s() - t0) / (double)calls;
    }
    sort_doubles(per, (size_t)reps);
    return per[reps / 2];
}
