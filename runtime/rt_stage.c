/* rt_stage.c - what a staged program (strategy layer, pipeline or hybrid)
 * needs beyond a single one: the point-to-point transfers and the stage
 * group collectives its step calls (rt_abi.h), completing each send where
 * the plan needs its buffer again (and the rest at the end of the step),
 * --check-replicas within each stage's replicas, and gathering
 * every stage's parameters on rank 0 for --save.
 *
 * A program is compiled once per stage and names its peers by stage; a
 * peer stage q of this rank's replica runs on rt_staged_rank(replica, q),
 * which the plan's placement decides. */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "rt_mpi.h"

static struct {
    bool on;
    RtStaged layout; /* stages, dp and placement, for peer ranks */
    int stages, stage, replica;
    int64_t tag_bound;
    MPI_Comm group; /* the replicas of this rank's stage */
    MPI_Request *sends; /* outstanding, or completed by rt_staged_progress (MPI_REQUEST_NULL) */
    int32_t *send_key;  /* peer stage * tag_bound + tag of each */
    int *done;          /* MPI_Testsome's indices */
    int n_sends, cap_sends;
    double send_wait_s, recv_wait_s, allreduce_s;
} g_st = {.group = MPI_COMM_NULL};

/* A broken program or a resource failure in the middle of a step: the
 * peers may be waiting on this rank, so it ends the job (rt_die). */
static _Noreturn __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    RtErr e = {0};
    rt_error(&e, "%s", msg);
    rt_die(&e);
}

bool rt_staged_init(const RtMeta *m, RtErr *e) {
    const RtStaged *st = &m->staged;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    /* MPI guarantees tags up to 32767; a plan with more channels needs an
     * implementation that allows them. */
    int64_t tag_ub = flag && ub ? *ub : 32767;
    if (st->tag_bound - 1 > tag_ub)
        return rt_error(e, "the plan uses message tags up to %" PRId64 " but this MPI allows %" PRId64
                        " (MPI_TAG_UB): compile with fewer micro-batches", st->tag_bound - 1, tag_ub);
    g_st.on = true;
    g_st.layout = *st;
    g_st.stages = st->stages;
    g_st.stage = st->stage;
    g_st.replica = st->replica;
    g_st.tag_bound = st->tag_bound;
    g_st.cap_sends = 64;
    g_st.sends = malloc(sizeof *g_st.sends * (size_t)g_st.cap_sends);
    g_st.send_key = malloc(sizeof *g_st.send_key * (size_t)g_st.cap_sends);
    g_st.done = malloc(sizeof *g_st.done * (size_t)g_st.cap_sends);
    if (!g_st.sends || !g_st.send_key || !g_st.done) return rt_error(e, "out of memory");
    if ((int64_t)st->stages * st->tag_bound > INT32_MAX)
        return rt_error(e, "%d stages x %" PRId64 " tags are too many", st->stages, st->tag_bound);
    return true;
}

/* Collective over every rank (MPI_Comm_split): after rt_comm_agree. */
void rt_staged_groups(void) {
    if (!g_st.on) return;
    MPI_Comm_split(rt_comm_world(), g_st.stage, g_st.replica, &g_st.group);
    rt_dp_use_comm(g_st.group);
}

void rt_staged_free(void) {
    if (g_st.group != MPI_COMM_NULL) MPI_Comm_free(&g_st.group);
    free(g_st.sends);
    free(g_st.send_key);
    free(g_st.done);
    g_st.sends = NULL;
    g_st.send_key = NULL;
    g_st.done = NULL;
    g_st.on = false;
}

static int peer_rank(int32_t peer_stage) {
    if (peer_stage < 0 || peer_stage >= g_st.stages || peer_stage == g_st.stage)
        fail("a transfer names stage %d, not another of the %d stages", peer_stage, g_st.stages);
    return rt_staged_rank(&g_st.layout, g_st.replica, peer_stage);
}

static int message_size(int64_t bytes, int32_t tag) {
    if (tag < 0 || tag >= g_st.tag_bound) fail("message tag %d is outside [0, %" PRId64 ")", tag, g_st.tag_bound);
    if (bytes < 0 || bytes > INT_MAX)
        fail("a transfer of %" PRId64 " bytes (tag %d) is larger than one MPI message carries", bytes, tag);
    return (int)bytes;
}

void cleave_rt_send(int32_t peer, int32_t tag, void *buf, int64_t bytes) {
    int n = message_size(bytes, tag), to = peer_rank(peer);
    if (g_st.n_sends == g_st.cap_sends) {
        MPI_Request *more = realloc(g_st.sends, sizeof *more * (size_t)g_st.cap_sends * 2);
        if (more) g_st.sends = more;
        int32_t *keys = more ? realloc(g_st.send_key, sizeof *keys * (size_t)g_st.cap_sends * 2) : NULL;
        if (keys) g_st.send_key = keys;
        int *done = keys ? realloc(g_st.done, sizeof *done * (size_t)g_st.cap_sends * 2) : NULL;
        if (!done) fail("out of memory for %d outstanding sends", g_st.n_sends);
        g_st.done = done;
        g_st.cap_sends *= 2;
    }
    g_st.send_key[g_st.n_sends] = peer * (int32_t)g_st.tag_bound + tag;
    MPI_Isend(buf, n, MPI_BYTE, to, tag, rt_comm_world(), &g_st.sends[g_st.n_sends++]);
}

void cleave_rt_recv(int32_t peer, int32_t tag, void *buf, int64_t bytes) {
    int n = message_size(bytes, tag), from = peer_rank(peer);
    double t = rt_trace_wait_begin();
    MPI_Status status;
    MPI_Recv(buf, n, MPI_BYTE, from, tag, rt_comm_world(), &status);
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != n) fail("received %d bytes with tag %d from rank %d, expected %d", got, tag, from, n);
    g_st.recv_wait_s += rt_trace_wait_end(RT_EV_RECV, t);
}

void cleave_rt_group_allreduce(int32_t group, void *buf, int64_t count) {
    if (group != g_st.stage) fail("an allreduce over the replicas of stage %d runs on stage %d", group, g_st.stage);
    if (count < 0 || count > INT_MAX) fail("an allreduce of %" PRId64 " values is larger than one MPI call sums", count);
    double t = rt_trace_wait_begin();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, g_st.group);
    g_st.allreduce_s += rt_trace_wait_end(RT_EV_ALLREDUCE, t);
}

void cleave_rt_unit(int32_t kind, int32_t micro) { rt_trace_unit(kind, micro); }

/* Lets outstanding sends move (Open MPI has no progress thread);
 * completed requests become MPI_REQUEST_NULL and stay listed until their
 * wait. */
void rt_staged_progress(void) {
    if (!g_st.n_sends) return;
    int count = 0;
    MPI_Testsome(g_st.n_sends, g_st.sends, &count, g_st.done, MPI_STATUSES_IGNORE);
}

void cleave_rt_send_wait(int32_t peer, int32_t tag) {
    int32_t key = peer * (int32_t)g_st.tag_bound + tag;
    int i = 0;
    while (i < g_st.n_sends && g_st.send_key[i] != key) i++;
    if (i == g_st.n_sends) fail("a wait for a send to stage %d with tag %d that is not outstanding", peer, tag);
    double t = rt_trace_wait_begin();
    MPI_Wait(&g_st.sends[i], MPI_STATUS_IGNORE);
    g_st.send_wait_s += rt_trace_wait_end(RT_EV_SEND, t);
    g_st.n_sends--;
    g_st.sends[i] = g_st.sends[g_st.n_sends];
    g_st.send_key[i] = g_st.send_key[g_st.n_sends];
}

/* Completes every outstanding send. */
static void wait_all_sends(void) {
    if (!g_st.n_sends) return;
    double t = rt_trace_wait_begin();
    MPI_Waitall(g_st.n_sends, g_st.sends, MPI_STATUSES_IGNORE);
    g_st.n_sends = 0;
    g_st.send_wait_s += rt_trace_wait_end(RT_EV_SEND, t);
}

void rt_staged_step_begin(void) { g_st.send_wait_s = g_st.recv_wait_s = g_st.allreduce_s = 0; }

void rt_staged_step_end(RtStepComm *c) {
    wait_all_sends();
    if (c) *c = (RtStepComm){.wait_s = g_st.send_wait_s + g_st.recv_wait_s + g_st.allreduce_s,
                             .allreduce_s = g_st.allreduce_s};
}

bool rt_staged_check_replicas(const RtMeta *m, const char *arena, RtErr *e) {
    int n = m->n_params, size = 1;
    MPI_Comm_size(g_st.group, &size);
    uint64_t mine = RT_FNV1A64_INIT;
    for (int i = 0; i < n; i++)
        mine = rt_fnv1a64(mine, arena + m->params[i].offset, (size_t)m->params[i].bytes);
    uint64_t *all = malloc(sizeof *all * (size_t)size);
    if (!all) fail("--check-replicas: out of memory for %d ranks", size);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, g_st.group);
    int differ = -1;
    for (int r = 1; r < size && differ < 0; r++)
        if (all[r] != all[0]) differ = r;
    free(all);
    /* Every rank learns the first stage whose replicas differ. */
    int bad = differ >= 0 ? g_st.stage : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, rt_comm_world());
    if (first == INT_MAX) return true;
    return rt_error_all(e, "replicas diverged: the replicas of stage %d hold different parameters", first);
}

/* Rank 0 receives every parameter from the replica-0 rank of the stage
 * that holds it; the other ranks of replica 0 send theirs. */
bool rt_staged_gather_params(const RtMeta *m, const char *arena, RtMeta *view, char **buf, RtErr *e) {
    const RtStaged *st = &m->staged;
    bool rank0 = rt_rank() == 0;
    uint64_t total = 0;
    for (int i = 0; i < st->n_all_params; i++) total += (st->all_params[i].bytes + 63) / 64 * 64;
    *buf = NULL;
    if (rank0 && !(*buf = malloc(total ? total : 1))) fail("--save: out of memory for %" PRIu64 " bytes of parameters", total);
    uint64_t at = 0;
    for (int i = 0; i < st->n_all_params; i++) {
        RtTensor *t = &st->all_params[i];
        int owner = st->param_stage[i];
        const RtTensor *held = NULL;
        for (int k = 0; k < m->n_params && !held; k++)
            if (strcmp(m->params[k].name, t->name) == 0) held = &m->params[k];
        if (t->bytes > INT_MAX) fail("--save: parameter %s of %" PRIu64 " bytes is too large to send", t->name, t->bytes);
        if (rank0) {
            t->offset = at;
            if (owner == 0 && held) memcpy(*buf + at, arena + held->offset, t->bytes);
            else
                MPI_Recv(*buf + at, (int)t->bytes, MPI_BYTE, rt_staged_rank(st, 0, owner), i % 32768, rt_comm_world(),
                         MPI_STATUS_IGNORE);
            at += (t->bytes + 63) / 64 * 64;
        } else if (st->replica == 0 && st->stage == owner && owner != 0) {
            if (!held) fail("--save: stage %d does not hold parameter %s", owner, t->name);
            MPI_Send(arena + held->offset, (int)t->bytes, MPI_BYTE, 0, i % 32768, rt_comm_world());
        }
    }
    if (rank0) rt_staged_save_view(m, view);
    (void)e;
    return true;
}

void rt_staged_save_view(const RtMeta *m, RtMeta *view) {
    *view = *m;
    view->params = m->staged.all_params;
    view->n_params = m->staged.n_all_params;
}

void rt_staged_report(RtLog *l, const RtMeta *m) {
    const RtStaged *st = &m->staged;
    int ranks = rt_ranks();
    long long mine[3] = {st->stage, st->replica, (long long)st->peak_act_bytes};
    long long *all = rt_rank() == 0 ? malloc(sizeof *all * 3 * (size_t)ranks) : NULL;
    if (rt_rank() == 0 && !all) fail("out of memory for the report of %d ranks", ranks);
    MPI_Gather(mine, 3, MPI_LONG_LONG, all, 3, MPI_LONG_LONG, 0, rt_comm_world());
    if (all && l->metrics) {
        fprintf(l->metrics, "{\"plan\": {\"schedule\": \"%s\", \"stages\": %d, \"dp\": %d, \"microbatches\": %d, "
                "\"ranks\": [", st->schedule, st->stages, st->dp, st->microbatches);
        for (int r = 0; r < ranks; r++)
            fprintf(l->metrics, "%s{\"rank\": %d, \"stage\": %lld, \"replica\": %lld, \"peak_activation_bytes\": %lld}",
                    r ? ", " : "", r, all[3 * r], all[3 * r + 1], all[3 * r + 2]);
        fprintf(l->metrics, "]}}\n");
    }
    free(all);
}
