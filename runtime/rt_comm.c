/* rt_comm.c - everything that talks to MPI: start and end, how an error
 * ends every rank, the start-up checks, the reductions of a data-parallel
 * run, the gradient buckets behind the collectives of rt_abi.h, and
 * --check-replicas.
 *
 * A program runs alone or under mpirun.  Two rules keep a run of several
 * ranks from hanging:
 *   - a rank that fails on its own (a file only it cannot read, an internal
 *     error) either reaches the next agreement point (rt_comm_agree), where
 *     every rank learns of it and all exit together, or aborts the whole job
 *     with MPI_Abort (rt_die);
 *   - every collective is reached by every rank: the start-up exchange
 *     (rt_comm_startup) makes sure all ranks run the same program with the
 *     same options and the row counts are compared after loading, so the
 *     number of steps and collectives is the same everywhere.
 *
 * The collectives use a duplicate of MPI_COMM_WORLD (g_comm), so nothing
 * else in the process can match their messages. */
#include <inttypes.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"
#include "rt_mpi.h"

static int g_rank = 0;
static int g_ranks = 1;
static bool g_mpi_up = false;
static MPI_Comm g_comm = MPI_COMM_NULL;
static const char *g_prog = "cleave-program";

void rt_comm_init(int *argc, char ***argv) {
    if (*argc > 0 && (*argv)[0] && (*argv)[0][0]) {
        const char *slash = strrchr((*argv)[0], '/');
        g_prog = slash ? slash + 1 : (*argv)[0];
    }
    /* MPI_Init's default error handler aborts with Open MPI's own message,
     * which is all that can be said when the MPI environment is broken.
     * FUNNELED: with --threads the process has worker threads (rt_pool.c),
     * but only this one ever calls MPI. */
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    g_mpi_up = true;
    MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    MPI_Comm_rank(g_comm, &g_rank);
    MPI_Comm_size(g_comm, &g_ranks);
}

MPI_Comm rt_comm_world(void) { return g_comm; }
int rt_rank(void) { return g_rank; }
int rt_ranks(void) { return g_ranks; }
const char *rt_prog_name(void) { return g_prog; }

void rt_comm_finalize(void) {
    if (!g_mpi_up) return;
    if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
    MPI_Finalize();
    g_mpi_up = false;
}

void rt_die(const RtErr *e) {
    int status = e && e->status ? e->status : 1;
    const char *msg = e && e->msg[0] ? e->msg : "unknown error";
    if (g_ranks > 1 && e && e->every) {
        /* Every rank is here: one line, then each exits on its own. */
        if (e->origin == g_rank || (e->origin < 0 && g_rank == 0)) {
            rt_log_break_line();
            if (e->origin < 0) fprintf(stderr, "%s: error: %s\n", g_prog, msg);
            else fprintf(stderr, "%s: error: rank %d: %s\n", g_prog, g_rank, msg);
            fflush(stderr);
        }
        rt_dp_free();
        rt_comm_finalize();
        exit(status);
    }
    if (g_ranks > 1) {
        /* Every rank usually fails the same way (same flags, same files).
         * Ranks other than 0 wait a moment so rank 0's abort ends them first
         * and the user reads one line, not one per rank; an error that only
         * this rank sees is still printed after the pause. */
        if (g_rank != 0) nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 300000000L}, NULL);
        rt_log_break_line();
        fprintf(stderr, "%s: error: rank %d: %s\n", g_prog, g_rank, msg);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
        exit(status); /* MPI_Abort does not return; this keeps the promise */
    }
    rt_log_break_line();
    fprintf(stderr, "%s: error: %s\n", g_prog, msg);
    fflush(stderr);
    rt_dp_free();
    rt_comm_finalize();
    exit(status);
}

void rt_warn(const char *fmt, ...) {
    if (g_rank != 0) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt_log_break_line();
    fprintf(stderr, "%s: warning: %s\n", g_prog, msg);
    fflush(stderr);
}

uint64_t rt_fnv1a64(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ---- agreeing ------------------------------------------------------------ */

/* What one rank tells the others at an agreement point. */
typedef struct Report {
    int64_t status; /* the rank's error so far, 0 for none */
    uint64_t msg;   /* hash of its message */
    int64_t help;
    int64_t ranks;  /* the ranks its program is compiled for; 0 without metadata */
    int64_t dp;
    int64_t train_rows, eval_rows;
    uint64_t options;
    char hash[RT_HASH_MAX + 8]; /* NUL-padded */
} Report;

/* Gathers every rank's report.  NULL only when out of memory, which this
 * rank cannot tell the others: the caller aborts. */
static Report *gather(const Report *mine) {
    Report *all = calloc((size_t)g_ranks, sizeof *all);
    if (!all) return NULL;
    MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, g_comm);
    return all;
}

/* This rank's part of a report: its error so far. */
static Report report(const RtErr *e) {
    Report mine = {.status = e->status};
    if (e->status) mine.msg = rt_fnv1a64(RT_FNV1A64_INIT, e->msg, strlen(e->msg));
    return mine;
}

/* The first rank that reported an error: every rank then fails with that
 * rank's status and it alone prints its message, naming itself; when every
 * rank failed the same way (the same flags, the same missing file), rank 0
 * prints the message without a rank. */
static bool settle(const Report *all, RtErr *e) {
    for (int r = 0; r < g_ranks; r++) {
        if (!all[r].status) continue;
        if (g_ranks == 1) return false; /* e holds it; rt_die prints it */
        bool same = true;
        for (int q = 0; q < g_ranks && same; q++) same = all[q].status == all[r].status && all[q].msg == all[r].msg;
        if (r != g_rank && !same) {
            memset(e, 0, sizeof *e);
            snprintf(e->msg, sizeof e->msg, "rank %d failed", r);
        }
        e->status = (int)all[r].status;
        e->every = true;
        e->origin = same ? -1 : r;
        return false;
    }
    return true;
}

static _Noreturn void die_no_memory(void) {
    RtErr e = {0};
    rt_error(&e, "out of memory for %d ranks' reports", g_ranks);
    rt_die(&e);
}

bool rt_comm_startup(const RtHello *h, bool *any_help, RtErr *e) {
    Report mine = report(e);
    mine.help = h->help;
    mine.options = h->options;
    const RtMeta *m = h->meta;
    if (m) {
        mine.ranks = m->ranks;
        mine.dp = m->dp;
        snprintf(mine.hash, sizeof mine.hash, "%s", m->plan_hash);
    }
    Report *all = gather(&mine);
    if (!all) die_no_memory();
    bool ok = settle(all, e);
    *any_help = false;
    for (int r = 0; ok && r < g_ranks; r++) *any_help |= all[r].help != 0;
    if (!ok || *any_help) {
        free(all);
        return ok;
    }
    /* No rank failed and none asked for help: each has its metadata. */
    for (int r = 1; r < g_ranks && ok; r++) {
        if (strcmp(all[r].hash, all[0].hash) != 0)
            ok = rt_error_all(e, "ranks run different programs (plan hash %s on rank 0, %s on rank %d): start the same "
                              "program on every rank", all[0].hash, all[r].hash, r);
        else if (all[r].options != all[0].options)
            ok = rt_error_all(e, "rank %d was started with other options than rank 0 (--steps, --epochs, --shuffle, "
                              "--lr, --eval-data, --predict, --check-replicas and --trace must be the same on every rank)", r);
    }
    free(all);
    if (!ok) return false;
    if ((m->dp || m->staged.on) && m->ranks != g_ranks) {
        if (g_ranks == 1)
            return rt_error_all(e, "%s was compiled for %d ranks but runs alone; start it with mpirun -np %d %s ...",
                                g_prog, m->ranks, m->ranks, g_prog);
        return rt_error_all(e, "%s was compiled for %d ranks but runs on %d (mpirun -np %d); start it with mpirun "
                            "-np %d", g_prog, m->ranks, g_ranks, g_ranks, m->ranks);
    }
    return true;
}

bool rt_comm_agree_rows(int64_t train_rows, int64_t eval_rows, RtErr *e) {
    Report mine = report(e);
    mine.train_rows = train_rows;
    mine.eval_rows = eval_rows;
    Report *all = gather(&mine);
    if (!all) die_no_memory();
    bool ok = settle(all, e);
    for (int r = 1; r < g_ranks && ok; r++) {
        if (all[r].train_rows != all[0].train_rows)
            ok = rt_error_all(e, "rank %d's --data files have %" PRId64 " rows but rank 0's have %" PRId64
                              ": every rank must read the same data", r, all[r].train_rows, all[0].train_rows);
        else if (all[r].eval_rows != all[0].eval_rows)
            ok = rt_error_all(e, "rank %d's --eval-data files have %" PRId64 " rows but rank 0's have %" PRId64
                              ": every rank must read the same data", r, all[r].eval_rows, all[0].eval_rows);
    }
    free(all);
    return ok;
}

bool rt_comm_agree(RtErr *e) { return rt_comm_agree_rows(0, 0, e); }

/* ---- reductions ---------------------------------------------------------- */

void rt_comm_sum(double *x, int n) {
    if (g_ranks > 1) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, g_comm);
}

void rt_comm_gather(const float *send, int count, float *recv) {
    MPI_Gather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, 0, g_comm);
}

/* ---- gradient buckets ---------------------------------------------------- */

typedef enum { IDLE, RUNNING, DONE } BucketState;

/* Set up by rt_dp_init before the first step; the generated step names
 * buckets by index only. */
static struct {
    char *arena;
    const RtBucket *buckets;
    int n;
    MPI_Request *req;  /* MPI_REQUEST_NULL unless RUNNING */
    BucketState *state;
    double *t_start;
    int *done;         /* MPI_Testsome's indices */
    int running;       /* started, completion not yet seen */
    int pending;       /* started, not yet waited for */
    double wait_s, allreduce_s;
    MPI_Comm comm;     /* the program's, or a hybrid program's stage group */
} g_dp = {.comm = MPI_COMM_NULL};

bool rt_dp_init(char *arena, const RtMeta *m, RtErr *e) {
    rt_dp_free();
    size_t n = (size_t)m->n_buckets + 1;
    g_dp.req = malloc(n * sizeof *g_dp.req);
    g_dp.state = calloc(n, sizeof *g_dp.state);
    g_dp.t_start = calloc(n, sizeof *g_dp.t_start);
    g_dp.done = calloc(n, sizeof *g_dp.done);
    if (!g_dp.req || !g_dp.state || !g_dp.t_start || !g_dp.done) {
        rt_dp_free();
        return rt_error(e, "out of memory for %d gradient buckets", m->n_buckets);
    }
    for (size_t b = 0; b < n; b++) g_dp.req[b] = MPI_REQUEST_NULL;
    g_dp.arena = arena;
    g_dp.buckets = m->buckets;
    g_dp.n = m->n_buckets;
    g_dp.comm = g_comm;
    return true;
}

void rt_dp_use_comm(MPI_Comm c) { g_dp.comm = c; }

void rt_dp_free(void) {
    free(g_dp.req);
    free(g_dp.state);
    free(g_dp.t_start);
    free(g_dp.done);
    memset(&g_dp, 0, sizeof g_dp);
}

void rt_dp_step_begin(void) { g_dp.wait_s = g_dp.allreduce_s = 0; }

bool rt_dp_step_end(RtStepComm *c, RtErr *e) {
    c->wait_s = g_dp.wait_s;
    c->allreduce_s = g_dp.allreduce_s;
    if (g_dp.pending)
        return rt_error(e, "internal error: the train step left %d gradient bucket%s started and never waited for",
                        g_dp.pending, g_dp.pending > 1 ? "s" : "");
    return true;
}

/* A broken program (or a runtime that was not set up) cannot go on: this
 * rank aborts the job. */
static _Noreturn void bucket_misuse(const char *fn, int32_t bucket, const char *why) {
    RtErr e = {0};
    rt_error(&e, "internal error: %s(%" PRId32 "): %s", fn, bucket, why);
    rt_die(&e);
}

static void completed(int b, double now) {
    g_dp.allreduce_s += now - g_dp.t_start[b];
    g_dp.state[b] = DONE;
    g_dp.running--;
}

/* Bucket `bucket`, which fn is about to start: it must exist and not be
 * running (`busy` says why it may not be). */
static const RtBucket *idle_bucket(const char *fn, int32_t bucket, const char *busy) {
    if (!g_dp.state) bucket_misuse(fn, bucket, "the program's metadata has no gradient buckets");
    if (bucket < 0 || bucket >= g_dp.n) bucket_misuse(fn, bucket, "no such bucket in the program's metadata");
    if (g_dp.state[bucket] != IDLE) bucket_misuse(fn, bucket, busy);
    return &g_dp.buckets[bucket];
}

void cleave_rt_allreduce_start(int32_t bucket) {
    const RtBucket *b = idle_bucket("cleave_rt_allreduce_start", bucket, "started twice without a wait");
    g_dp.t_start[bucket] = rt_now();
    MPI_Iallreduce(MPI_IN_PLACE, g_dp.arena + b->offset, b->count, MPI_FLOAT, MPI_SUM, g_dp.comm, &g_dp.req[bucket]);
    g_dp.state[bucket] = RUNNING;
    g_dp.running++;
    g_dp.pending++;
}

void cleave_rt_allreduce_wait(int32_t bucket) {
    static const char fn[] = "cleave_rt_allreduce_wait";
    if (!g_dp.state || bucket < 0 || bucket >= g_dp.n) bucket_misuse(fn, bucket, "no such bucket");
    if (g_dp.state[bucket] == IDLE) bucket_misuse(fn, bucket, "waited for but never started");
    if (g_dp.state[bucket] == RUNNING) {
        double t0 = rt_trace_wait_begin();
        MPI_Wait(&g_dp.req[bucket], MPI_STATUS_IGNORE);
        g_dp.wait_s += rt_trace_wait_end(RT_EV_ALLREDUCE, t0);
        completed(bucket, rt_now());
    }
    g_dp.state[bucket] = IDLE;
    g_dp.pending--;
}

void cleave_rt_allreduce(int32_t bucket) {
    const RtBucket *b = idle_bucket("cleave_rt_allreduce", bucket, "already started");
    double t0 = rt_trace_wait_begin();
    MPI_Allreduce(MPI_IN_PLACE, g_dp.arena + b->offset, b->count, MPI_FLOAT, MPI_SUM, g_dp.comm);
    double dt = rt_trace_wait_end(RT_EV_ALLREDUCE, t0);
    g_dp.wait_s += dt;
    g_dp.allreduce_s += dt;
}

void cleave_rt_progress(void) {
    rt_staged_progress();
    if (g_dp.running <= 0) return;
    int count = 0;
    MPI_Testsome(g_dp.n, g_dp.req, &count, g_dp.done, MPI_STATUSES_IGNORE);
    if (count == MPI_UNDEFINED || count == 0) return;
    double now = rt_now();
    for (int i = 0; i < count; i++) completed(g_dp.done[i], now);
}

/* ---- --check-replicas ---------------------------------------------------- */

bool rt_comm_check_replicas(const RtMeta *m, const char *arena, RtErr *e) {
    int n = m->n_params;
    uint64_t *mine = malloc((size_t)(n + 1) * sizeof *mine);
    uint64_t *all = malloc((size_t)(n + 1) * (size_t)g_ranks * sizeof *all);
    if (!mine || !all) {
        /* The others are about to wait in the gather below: abort. */
        free(mine);
        free(all);
        RtErr oom = {0};
        rt_error(&oom, "--check-replicas: out of memory for %d parameters", n);
        rt_die(&oom);
    }
    for (int i = 0; i < n; i++)
        mine[i] = rt_fnv1a64(RT_FNV1A64_INIT, arena + m->params[i].offset, (size_t)m->params[i].bytes);
    mine[n] = rt_fnv1a64(RT_FNV1A64_INIT, mine, (size_t)n * sizeof *mine);
    MPI_Allgather(mine, n + 1, MPI_UINT64_T, all, n + 1, MPI_UINT64_T, g_comm);
    bool ok = true;
    for (int r = 1; r < g_ranks && ok; r++) {
        const uint64_t *theirs = all + (size_t)r * (size_t)(n + 1);
        if (theirs[n] == all[n]) continue;
        int p = 0;
        while (p < n - 1 && theirs[p] == all[p]) p++;
        ok = rt_error_all(e, "replicas diverged: rank %d's parameters differ from rank 0's (first differing "
                          "parameter %s)", r, n ? m->params[p].name : "?");
    }
    free(mine);
    free(all);
    return ok;
}
