/* rt_pool.c - the program's worker threads (cleave_rt_parallel, rt_abi.h).
 *
 * A program compiled with --threads T runs its large matrix products on T
 * threads: the calling thread and T - 1 workers started once, before the
 * first step, and joined when the run ends.  The generated code decides
 * what each thread computes (a fixed share of the product, see
 * docs/perf.md); the pool only starts the T calls and waits for them.  It
 * holds no math.
 *
 * A call publishes the task, then bumps a generation counter; each worker
 * runs the task once per generation and counts itself out.  Kernels follow
 * one another closely, so a worker first spins briefly on the counter
 * (a wake-up through the kernel costs several microseconds), then sleeps on
 * a condition variable: ranks may share cores with other ranks, and a
 * thread spinning for long would take the core its peers need. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* Polls of the counter before sleeping.  A pause takes from about 10
 * cycles (older x86) to about 140 (Skylake and later), so this is some
 * microseconds to a few tens: the gap between two products of a step is
 * often shorter, a wake-up through the kernel is not. */
#define SPIN_POLLS 256

typedef void (*RtTask)(void *ctx, int64_t t, int64_t n);

static struct {
    int n;              /* threads, the caller included; 1: no pool */
    pthread_t *workers; /* n - 1 of them */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers: a new generation (or stop) */
    pthread_cond_t done; /* caller: the last worker finished */
    atomic_uint_fast64_t generation;
    uint64_t first; /* the generation when the workers started */
    atomic_int pending; /* workers still running the current task */
    atomic_bool stop;
    RtTask task;
    void *ctx;
} pool = {.n = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Waits until the generation differs from `seen`; returns the new one. */
static uint64_t wait_generation(uint64_t seen) {
    for (int i = 0; i < SPIN_POLLS; i++) {
        uint64_t g = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool.mu);
    uint64_t g;
    while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
        pthread_cond_wait(&pool.wake, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    return g;
}

static void *worker(void *arg) {
    int64_t t = (int64_t)(intptr_t)arg;
    /* A pool started again after rt_pool_stop finds the counter where the
     * last one left it; only later generations are tasks for this one. */
    uint64_t seen = pool.first;
    for (;;) {
        seen = wait_generation(seen);
        if (atomic_load_explicit(&pool.stop, memory_order_acquire)) break;
        pool.task(pool.ctx, t, pool.n);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            /* under the lock, so the caller cannot miss it between its
             * check and its wait */
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

/* Publishes a new generation to the workers. */
static void bump_generation(void) {
    pthread_mutex_lock(&pool.mu);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
}

bool rt_pool_start(int threads, RtErr *e) {
    if (pool.n > 1) rt_pool_stop();
    if (threads < 1 || threads > RT_MAX_THREADS)
        return rt_error(e, "%d threads requested; the runtime runs 1 to %d", threads, RT_MAX_THREADS);
    if (threads == 1) return true;
    pool.workers = calloc((size_t)threads - 1, sizeof *pool.workers);
    if (!pool.workers) return rt_error(e, "out of memory starting %d threads", threads);
    atomic_store(&pool.stop, false);
    pool.first = atomic_load(&pool.generation);
    pool.n = threads;
    for (int t = 1; t < threads; t++) {
        int rc = pthread_create(&pool.workers[t - 1], NULL, worker, (void *)(intptr_t)t);
        if (rc != 0) {
            /* stop the ones already running */
            pool.n = t;
            rt_pool_stop();
            return rt_error(e, "cannot start thread %d of %d: %s", t, threads, strerror(rc));
        }
    }
    return true;
}

void rt_pool_stop(void) {
    if (pool.n <= 1) return;
    atomic_store_explicit(&pool.stop, true, memory_order_release);
    bump_generation();
    for (int t = 1; t < pool.n; t++) pthread_join(pool.workers[t - 1], NULL);
    free(pool.workers);
    pool.workers = NULL;
    pool.n = 1;
}

int rt_pool_threads(void) { return pool.n; }

void cleave_rt_parallel(void (*task)(void *ctx, int64_t t, int64_t n), void *ctx) {
    if (pool.n <= 1) {
        task(ctx, 0, 1);
        return;
    }
    pool.task = task;
    pool.ctx = ctx;
    atomic_store_explicit(&pool.pending, pool.n - 1, memory_order_relaxed);
    bump_generation();
    task(ctx, 0, pool.n);
    for (int i = 0; i < SPIN_POLLS; i++) {
        if (atomic_load_explicit(&pool.pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&pool.mu);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) != 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}
