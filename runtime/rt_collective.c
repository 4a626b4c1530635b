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
 * completed for the step's metrics.
 *
 * A bucket is summed by one MPI_Iallreduce over the replicas (flat), or,
 * when the plan says so (allreduce_node), hierarchically, as a chain of
 * three non-blocking collectives: MPI_Ireduce to the node's leader,
 * MPI_Iallreduce among the leaders, MPI_Ibcast from the leader back to
 * the node (rt_group.c makes the communicators).  Testing and waiting
 * move a bucket from one link of its chain to the next as each completes,
 * so the chain still runs behind the backward pass.  MPI wants the
 * collectives of one communicator started in the same order on all its
 * members; a rank cannot tell when its peers see a link complete, so each
 * kind of link has a communicator of its own and is started in the order
 * the buckets were, a bucket waiting for those before it (`next`). */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_comm.h"

typedef enum { IDLE, RUNNING, DONE } BucketState;

/* The links of a hierarchical bucket sum, in order. */
enum { LINK_REDUCE, LINK_LEADERS, LINK_BCAST, N_LINKS };

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
    /* hierarchical (RtLayout.allreduce_node): the link each bucket runs
     * or last ran; the buckets in the order they were started since
     * nothing was pending; per link, the index in `order` of the next
     * bucket to start it */
    bool hier;
    int *link, *order;
    int n_order, next[N_LINKS];
} g_coll;

bool rt_coll_init(char *arena, const RtMeta *m, RtErr *e) {
    rt_coll_free();
    size_t n = (size_t)m->n_buckets + 1;
    g_coll.req = malloc(n * sizeof *g_coll.req);
    g_coll.state = calloc(n, sizeof *g_coll.state);
    g_coll.t_start = calloc(n, sizeof *g_coll.t_start);
    g_coll.done = calloc(n, sizeof *g_coll.done);
    g_coll.link = calloc(n, sizeof *g_coll.link);
    g_coll.order = calloc(n, sizeof *g_coll.order);
    if (!g_coll.req || !g_coll.state || !g_coll.t_start || !g_coll.done || !g_coll.link || !g_coll.order) {
        rt_coll_free();
        return rt_error(e, "out of memory for %d gradient buckets", m->n_buckets);
    }
    for (size_t b = 0; b < n; b++) g_coll.req[b] = MPI_REQUEST_NULL;
    g_coll.arena = arena;
    g_coll.buckets = m->buckets;
    g_coll.n = m->n_buckets;
    g_coll.hier = m->layout.allreduce_node > 0;
    return true;
}

void rt_coll_free(void) {
    free(g_coll.req);
    free(g_coll.state);
    free(g_coll.t_start);
    free(g_coll.done);
    free(g_coll.link);
    free(g_coll.order);
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

/* ---- hierarchical sums ---------------------------------------------------- */

static int comm_size(MPI_Comm c) {
    int n = 0;
    if (c != MPI_COMM_NULL) MPI_Comm_size(c, &n);
    return n;
}

/* Starts link k of bucket b's chain; a link with nothing to do (a node of
 * one rank, a rank that leads no node, a single leader) is done at once. */
static void start_link(int b, int k) {
    const RtBucket *bk = &g_coll.buckets[b];
    void *buf = g_coll.arena + bk->offset;
    MPI_Comm node = k == LINK_BCAST ? rt_comm_node_bcast() : rt_comm_node_reduce();
    g_coll.link[b] = k;
    g_coll.req[b] = MPI_REQUEST_NULL;
    if (k == LINK_REDUCE && comm_size(node) > 1) {
        int me = 0;
        MPI_Comm_rank(node, &me);
        MPI_Ireduce(me == 0 ? MPI_IN_PLACE : buf, me == 0 ? buf : NULL, bk->count, MPI_FLOAT, MPI_SUM, 0, node,
                    &g_coll.req[b]);
    } else if (k == LINK_LEADERS && comm_size(rt_comm_leaders()) > 1) {
        MPI_Iallreduce(MPI_IN_PLACE, buf, bk->count, MPI_FLOAT, MPI_SUM, rt_comm_leaders(), &g_coll.req[b]);
    } else if (k == LINK_BCAST && comm_size(node) > 1) {
        MPI_Ibcast(buf, bk->count, MPI_FLOAT, 0, node, &g_coll.req[b]);
    }
}

/* Whether bucket b finished link k of its chain. */
static bool link_done(int b, int k) {
    return g_coll.link[b] > k || (g_coll.link[b] == k && g_coll.req[b] == MPI_REQUEST_NULL);
}

/* Moves every bucket whose link completed to its next link, in the order
 * the buckets were started, and notes the chains that ended. */
static void advance(void) {
    for (int k = LINK_LEADERS; k < N_LINKS; k++)
        while (g_coll.next[k] < g_coll.n_order) {
            int b = g_coll.order[g_coll.next[k]];
            if (!link_done(b, k - 1)) break;
            start_link(b, k);
            g_coll.next[k]++;
        }
    double now = -1;
    for (int i = 0; i < g_coll.next[LINK_BCAST]; i++) {
        int b = g_coll.order[i];
        if (g_coll.state[b] != RUNNING || !link_done(b, LINK_BCAST)) continue;
        if (now < 0) now = rt_now();
        completed(b, now);
    }
}

static void start_chain(int b) {
    if (g_coll.pending == 0) { /* nothing outstanding: a new round of buckets */
        g_coll.n_order = 0;
        memset(g_coll.next, 0, sizeof g_coll.next);
    }
    if (g_coll.n_order >= g_coll.n)
        bucket_misuse("cleave_rt_allreduce_start", b, "more buckets started than the program has before a wait");
    g_coll.order[g_coll.n_order++] = b;
    start_link(b, LINK_REDUCE);
    g_coll.next[LINK_REDUCE] = g_coll.n_order;
}

/* Blocks until bucket b's chain ended, moving every chain along. */
static void wait_chain(int b) {
    for (;;) {
        advance();
        if (g_coll.state[b] == DONE) return;
        int any = MPI_UNDEFINED;
        MPI_Waitany(g_coll.n, g_coll.req, &any, MPI_STATUS_IGNORE);
        if (any == MPI_UNDEFINED) bucket_misuse("cleave_rt_allreduce_wait", b, "its sum stopped half way");
    }
}

void cleave_rt_allreduce_start(int32_t bucket) {
    const RtBucket *b = idle_bucket("cleave_rt_allreduce_start", bucket, "started twice without a wait");
    g_coll.t_start[bucket] = rt_now();
    g_coll.state[bucket] = RUNNING;
    g_coll.running++;
    if (g_coll.hier) {
        start_chain(bucket);
        advance();
    } else {
        MPI_Iallreduce(MPI_IN_PLACE, g_coll.arena + b->offset, b->count, MPI_FLOAT, MPI_SUM, rt_comm_replicas(),
                       &g_coll.req[bucket]);
    }
    g_coll.pending++;
}

void cleave_rt_allreduce_wait(int32_t bucket) {
    static const char fn[] = "cleave_rt_allreduce_wait";
    if (!g_coll.state || bucket < 0 || bucket >= g_coll.n) bucket_misuse(fn, bucket, "no such bucket");
    if (g_coll.state[bucket] == IDLE) bucket_misuse(fn, bucket, "waited for but never started");
    if (g_coll.state[bucket] == RUNNING) {
        double t0 = rt_trace_wait_begin();
        rt_watch_begin("the allreduce of gradient bucket", bucket, RT_WATCH_REPLICAS);
        if (g_coll.hier) {
            wait_chain(bucket);
        } else {
            MPI_Wait(&g_coll.req[bucket], MPI_STATUS_IGNORE);
        }
        rt_watch_end();
        g_coll.wait_s += rt_trace_wait_end(RT_EV_ALLREDUCE, t0);
        if (!g_coll.hier) completed(bucket, rt_now());
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
    if (g_coll.hier) { /* a completed request is one link of a chain */
        advance();
        return;
    }
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
