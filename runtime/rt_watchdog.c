/* rt_watchdog.c - --timeout S: a rank that waits for another rank longer
 * than S seconds stops every rank.
 *
 * Without it, a rank that stops (SIGSTOP, a hung node) leaves every other
 * rank blocked in MPI for ever: MPI has no time-outs of its own.  The main
 * thread marks each blocking wait for other ranks (rt_watch_begin/_end);
 * a thread started once per run looks at the mark a few times a second and,
 * when the same wait is still open after S seconds, prints one line saying
 * who waited for whom, where and for what, and ends the process with
 * _exit(1).  mpirun then ends the job: Open MPI kills every rank when one
 * exits non-zero without MPI_Finalize, the stopped one included (SIGKILL
 * works on a stopped process).  MPI_Abort is not an option: with
 * MPI_THREAD_FUNNELED only the main thread may call MPI, and it is the one
 * stuck in it.
 *
 * The marks must cost the step next to nothing (a step of a small model
 * takes some tens of microseconds and has several waits), so a mark is a
 * few relaxed stores and one release store of a sequence number, and the
 * main thread never reads the clock for it: the watchdog times a wait from
 * the first tick it saw it open, which makes a time-out fire between S and
 * S plus two ticks after the wait began.  The sequence number is odd while a
 * wait is open and grows with every mark, so the watchdog tells a long
 * wait from a series of short ones, and a description it read while the
 * main thread was rewriting it (the number moved meanwhile) is dropped
 * (a seqlock).
 *
 * The file calls nothing else of the runtime (rt_util.c calls it when a
 * run ends): its own clock, the rank and the program's name are given to
 * it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"

static struct {
    /* Written by the main thread only. */
    atomic_uint seq;                 /* odd while a wait is open */
    _Atomic(const char *) what;      /* the open wait, as rt_watch_begin took it */
    atomic_int arg, peer;
    _Atomic(const char *) phase;     /* NULL: inside step `step` */
    atomic_int_fast64_t step;
    atomic_int stage, replica, stages;
    /* The thread. */
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool stop;                       /* under mu */
    double timeout;
    int rank;
    char prog[256];
} W = {.phase = "start-up", .stages = 1, .mu = PTHREAD_MUTEX_INITIALIZER};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rt_watch_begin(const char *what, int arg, int peer) {
    unsigned s = atomic_load_explicit(&W.seq, memory_order_relaxed);
    atomic_store_explicit(&W.what, what, memory_order_relaxed);
    atomic_store_explicit(&W.arg, arg, memory_order_relaxed);
    atomic_store_explicit(&W.peer, peer, memory_order_relaxed);
    /* Odd, and published after the description it covers. */
    atomic_store_explicit(&W.seq, (s | 1u) + 2u, memory_order_release);
}

void rt_watch_end(void) {
    unsigned s = atomic_load_explicit(&W.seq, memory_order_relaxed);
    atomic_store_explicit(&W.seq, (s + 1u) & ~1u, memory_order_release);
}

void rt_watch_step(int64_t step) {
    atomic_store_explicit(&W.step, step, memory_order_relaxed);
    atomic_store_explicit(&W.phase, NULL, memory_order_relaxed);
}

void rt_watch_phase(const char *phase) { atomic_store_explicit(&W.phase, phase, memory_order_relaxed); }

void rt_watch_layout(int stages, int stage, int replica) {
    atomic_store_explicit(&W.stages, stages, memory_order_relaxed);
    atomic_store_explicit(&W.stage, stage, memory_order_relaxed);
    atomic_store_explicit(&W.replica, replica, memory_order_relaxed);
}

/* The line for a wait that timed out: "PROG: error: rank 1: waited 3 s for
 * a receive from rank 0 (step 4); stopping every rank (--timeout 3)". */
static int describe(char *buf, size_t size, const char *what, int arg, int peer, const char *phase, int64_t step) {
    char who[96], when[96], num[24] = "";
    int stages = atomic_load_explicit(&W.stages, memory_order_relaxed);
    if (arg >= 0) snprintf(num, sizeof num, " %d", arg);
    if (peer >= 0) snprintf(who, sizeof who, " rank %d", peer);
    else if (peer == RT_WATCH_STAGES)
        snprintf(who, sizeof who, " over the stages of replica %d", atomic_load_explicit(&W.replica, memory_order_relaxed));
    else if (peer == RT_WATCH_REPLICAS && stages > 1)
        snprintf(who, sizeof who, " over the replicas of stage %d", atomic_load_explicit(&W.stage, memory_order_relaxed));
    else snprintf(who, sizeof who, " over every rank"); /* with one stage its replicas are every rank */
    if (!phase) snprintf(when, sizeof when, "step %lld", (long long)step);
    else if (step > 0) snprintf(when, sizeof when, "%s after step %lld", phase, (long long)step);
    else snprintf(when, sizeof when, "%s", phase);
    return snprintf(buf, size, "%s: error: rank %d: waited %g s for %s%s%s (%s); stopping every rank (--timeout %g)\n",
                    W.prog, W.rank, W.timeout, what, num, who, when, W.timeout);
}

/* The wait timed out: one line, then the process ends.  A rank waiting for
 * a rank that waits for the stopped one times out too, at about the same
 * moment; rank r first pauses r tenths of a second (at most one second) so
 * that, as a rule, the lowest waiting rank speaks and mpirun ends the others
 * before they do. */
static _Noreturn void expire(const char *what, int arg, int peer, const char *phase, int64_t step) {
    int pause_ms = W.rank < 10 ? W.rank * 100 : 1000;
    nanosleep(&(struct timespec){.tv_sec = pause_ms / 1000, .tv_nsec = (pause_ms % 1000) * 1000000L}, NULL);
    char line[1024];
    int n = describe(line, sizeof line, what, arg, peer, phase, step);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    /* rank 0's progress bar may hold the line: start a new one */
    if (W.rank == 0 && isatty(STDERR_FILENO)) (void)!write(STDERR_FILENO, "\n", 1);
    /* write(2), not stdio: the main thread may hold stderr's lock */
    (void)!write(STDERR_FILENO, line, (size_t)n);
    _exit(1);
}

static void *watch(void *unused) {
    (void)unused;
    double tick = W.timeout / 4 < 0.2 ? W.timeout / 4 : 0.2;
    if (tick < 0.01) tick = 0.01;
    unsigned seen = 0;
    double since = 0, last = mono_now();
    pthread_mutex_lock(&W.mu);
    while (!W.stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + (long)(tick * 1e9);
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&W.wake, &W.mu, &until);
        if (W.stop) break;
        unsigned s = atomic_load_explicit(&W.seq, memory_order_acquire);
        double now = mono_now();
        /* A tick far later than due means this process itself was stopped
         * (SIGSTOP, a suspended machine): that time was not spent waiting
         * for a peer.  mpirun continues a stopped rank before it kills it,
         * and the rank must not then report its own stop as a time-out. */
        bool resumed = now - last > 5 * tick + 0.5;
        last = now;
        if (!(s & 1u) || s != seen || resumed) {
            seen = s;
            since = now;
            continue;
        }
        if (now - since < W.timeout) continue;
        const char *what = atomic_load_explicit(&W.what, memory_order_relaxed);
        int arg = atomic_load_explicit(&W.arg, memory_order_relaxed);
        int peer = atomic_load_explicit(&W.peer, memory_order_relaxed);
        const char *phase = atomic_load_explicit(&W.phase, memory_order_relaxed);
        int64_t step = atomic_load_explicit(&W.step, memory_order_relaxed);
        /* Still the same wait: the description belongs to it. */
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&W.seq, memory_order_relaxed) != s) continue;
        pthread_mutex_unlock(&W.mu);
        expire(what, arg, peer, phase, step);
    }
    pthread_mutex_unlock(&W.mu);
    return NULL;
}

bool rt_watch_start(double timeout, const char *prog, int rank, RtErr *e) {
    if (W.running || timeout <= 0) return true;
    W.timeout = timeout;
    W.rank = rank;
    snprintf(W.prog, sizeof W.prog, "%s", prog);
    W.stop = false;
    /* The ticks follow the monotonic clock: a change of the wall clock
     * neither fires nor delays a time-out. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&W.wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc == 0) {
        rc = pthread_create(&W.thread, NULL, watch, NULL);
        if (rc != 0) pthread_cond_destroy(&W.wake);
    }
    if (rc != 0) return rt_error(e, "--timeout: cannot start the watchdog thread: %s", strerror(rc));
    W.running = true;
    return true;
}

void rt_watch_stop(void) {
    if (!W.running) return;
    pthread_mutex_lock(&W.mu);
    W.stop = true;
    pthread_cond_signal(&W.wake);
    pthread_mutex_unlock(&W.mu);
    pthread_join(W.thread, NULL);
    pthread_cond_destroy(&W.wake);
    W.running = false;
}
