/* rt_collective.c - the collectives of a run: the gradient bucket
 * allreduces and the group sums the generated step calls (rt_abi.h),
 * over the replicas of this rank's stage or the stages of its replica
 * (rt_group.c),
 * and the reductions over every rank that the runtime itself makes (the
 * step's loss, evaluation sums, --predict rows).
 *
 * A bucket is started and waited for, or summed at once; between the
 * two, rt_coll_progress (from cleave_rt_progress) tests the running ones
 * so that they move during the backward pass, and notes when each
 * completed for the step's metrics. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_comm.h"

typedef enum { IDLE, RUNNING, DONE } BucketState;

/* Set up by rt_coll_init before the first step; the generated step names
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
} g_coll;

bool rt_coll_init(char *arena, const RtMeta *m, RtErr *e) {
    rt_coll_free();
    size_t n = (size_t)m->n_buckets + 1;
    g_coll.req = malloc(n * sizeof *g_coll.req);
    g_coll.state = calloc(n, sizeof *g_coll.state);
    g_coll.t_start = calloc(n, sizeof *g_coll.t_start);
    g_coll.done = calloc(n, sizeof *g_coll.done);
    if (!g_coll.req || !g_coll.state || !g_coll.t_start || !g_coll.done) {
        rt_coll_free();
        return rt_error(e, "out of memory for %d gradient buckets", m->n_buckets);
    }
    for (size_t b = 0; b < n; b++) g_coll.req[b] = MPI_REQUEST_NULL;
    g_coll.arena = arena;
    g_coll.buckets = m->buckets;
    g_coll.n = m->n_buckets;
    return true;
}

void rt_coll_free(void) {
    free(g_coll.req);
    free(g_coll.state);
    free(g_coll.t_start);
    free(g_coll.done);
    memset(&g_coll, 0, sizeof g_coll);
}

void rt_coll_step_begin(void) { g_coll.wait_s = g_coll.allreduce_s = 0; }

bool rt_coll_step_end(RtStepComm *c, RtErr *e) {
    c->wait_s = g_coll.wait_s;
    c->allreduce_s = g_coll.allreduce_s;
    if (g_coll.pending)
        return rt_error(e, "internal error: the train step left %d gradient bucket%s started and never waited for",
                        g_coll.pending, g_coll.pending > 1 ? "s" : "");
    return true;
}

/* A broken program (or a runtime that was not set up) cannot go on: this
 * rank aborts the job. */
static _Noreturn void bucket_misuse(const char *fn, int32_t bucket, const char *why) {
    rt_fatal("internal error: %s(%" PRId32 "): %s", fn, bucket, why);
}

static void completed(int b, double now) {
    g_coll.allreduce_s += now - g_coll.t_start[b];
    g_coll.state[b] = DONE;
    g_coll.running--;
}

/* Bucket `bucket`, which fn is about to start: it must exist and not be
 * running (`busy` says why it may not be). */
static const RtBucket *idle_bucket(const char *fn, int32_t bucket, const char *busy) {
    if (!g_coll.state) bucket_misuse(fn, bucket, "the program's metadata has no gradient buckets");
    if (bucket < 0 || bucket >= g_coll.n) bucket_misuse(fn, bucket, "no such bucket in the program's metadata");
    if (g_coll.state[bucket] != IDLE) bucket_misuse(fn, bucket, busy);
    return &g_coll.buckets[bucket];
}

void cleave_rt_allreduce_start(int32_t bucket) {
    const RtBucket *b = idle_bucket("cleave_rt_allreduce_start", bucket, "started twice without a wait");
    g_coll.t_start[bucket] = rt_now();
    MPI_Iallreduce(MPI_IN_PLACE, g_coll.arena + b->offset, b->count, MPI_FLOAT, MPI_SUM, rt_comm_replicas(),
                   &g_coll.req[bucket]);
    g_coll.state[bucket] = RUNNING;
    g_coll.running++;
    g_coll.pending++;
}

void cleave_rt_allreduce_wait(int32_t bucket) {
    static const char fn[] = "cleave_rt_allreduce_wait";
    if (!g_coll.state || bucket < 0 || bucket >= g_coll.n) bucket_misuse(fn, bucket, "no such bucket");
    if (g_coll.state[bucket] == IDLE) bucket_misuse(fn, bucket, "waited for but never started");
    if (g_coll.state[bucket] == RUNNING) {
        double t0 = rt_trace_wait_begin();
        rt_watch_begin("the allreduce of gradient bucket", bucket, RT_WATCH_REPLICAS);
        MPI_Wait(&g_coll.req[bucket], MPI_STATUS_IGNORE);
        rt_watch_end();
        g_coll.wait_s += rt_trace_wait_end(RT_EV_ALLREDUCE, t0);
        completed(bucket, rt_now());
    }
    g_coll.state[bucket] = IDLE;
    g_coll.pending--;
}

/* A blocking sum over a group: its time is both waited and spent
 * reducing.  what, bucket and who describe it to the watchdog. */
static void sum_over(MPI_Comm group, void *buf, int count, const char *what, int bucket, int who) {
    double t0 = rt_trace_wait_begin();
    rt_watch_begin(what, bucket, who);
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, group);
    rt_watch_end();
    double dt = rt_trace_wait_end(RT_EV_ALLREDUCE, t0);
    g_coll.wait_s += dt;
    g_coll.allreduce_s += dt;
}

void cleave_rt_allreduce(int32_t bucket) {
    const RtBucket *b = idle_bucket("cleave_rt_allreduce", bucket, "already started");
    sum_over(rt_comm_replicas(), g_coll.arena + b->offset, b->count, "the allreduce of gradient bucket", bucket,
             RT_WATCH_REPLICAS);
}

void cleave_rt_group_allreduce(int32_t group, void *buf, int64_t count) {
    int stage = rt_group_stage(), stages = rt_group_stages();
    if (count < 0 || count > INT_MAX)
        rt_fatal("an allreduce of %" PRId64 " values is larger than one MPI call sums", count);
    if (group == stages && stages > 1) {
        if (rt_comm_stages() == MPI_COMM_NULL) rt_fatal("an allreduce over the stages runs before they are grouped");
        sum_over(rt_comm_stages(), buf, (int)count, "a sum in the step", -1, RT_WATCH_STAGES);
        return;
    }
    if (group != stage) rt_fatal("an allreduce over the replicas of stage %d runs on stage %d", group, stage);
    sum_over(rt_comm_replicas(), buf, (int)count, "a sum in the step", -1, RT_WATCH_REPLICAS);
}

void rt_coll_progress(void) {
    if (g_coll.running <= 0) return;
    int count = 0;
    MPI_Testsome(g_coll.n, g_coll.req, &count, g_coll.done, MPI_STATUSES_IGNORE);
    if (count == MPI_UNDEFINED || count == 0) return;
    double now = rt_now();
    for (int i = 0; i < count; i++) completed(g_coll.done[i], now);
}

/* ---- reductions over every rank ------------------------------------------ */

void rt_comm_sum(double *x, int n, const char *what) {
    if (rt_ranks() <= 1) return;
    rt_watch_begin(what, -1, RT_WATCH_EVERY);
    MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, rt_comm_world());
    rt_watch_end();
}

void rt_comm_state_from_replica0(const RtMeta *m, char *arena) {
    if (!m->state_from_replica0) return;
    for (int i = 0; i < m->n_params; i++) {
        const RtTensor *t = &m->params[i];
        if (t->trainable) continue;
        if (t->bytes > INT_MAX) rt_fatal("parameter %s of %" PRIu64 " bytes is too large to send", t->name, t->bytes);
        rt_watch_begin("the broadcast of replica 0's running statistics", -1, RT_WATCH_REPLICAS);
        MPI_Bcast(arena + t->offset, (int)t->bytes, MPI_BYTE, 0, rt_comm_replicas());
        rt_watch_end();
    }
}

void rt_comm_gather(const float *send, int count, float *recv) {
    rt_watch_begin("the gather of --predict rows", -1, RT_WATCH_EVERY);
    MPI_Gather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, 0, rt_comm_world());
    rt_watch_end();
}
