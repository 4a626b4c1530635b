/* rt_p2p.c - the point-to-point transfers between the stages of a
 * replica (rt_abi.h): sends in flight until their wait, or until the end
 * of the step for the last ones; blocking receives.
 *
 * A program is compiled once per stage and names its peers by stage;
 * rt_group_peer turns a stage into the rank that runs it in this rank's
 * replica.  A send is found again at its wait by (peer stage, tag), which
 * the plan keeps unique within a step. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>

#include "rt.h"
#include "rt_comm.h"

static struct {
    int64_t tag_bound;
    MPI_Request *sends; /* outstanding, or completed by rt_p2p_progress (MPI_REQUEST_NULL) */
    int32_t *send_key;  /* peer stage * tag_bound + tag of each */
    int *done;          /* MPI_Testsome's indices */
    int n_sends, cap_sends;
    double send_wait_s, recv_wait_s;
} g_p2p;

bool rt_p2p_init(const RtMeta *m, RtErr *e) {
    const RtLayout *l = &m->layout;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    /* MPI guarantees tags up to 32767; a plan with more channels needs an
     * implementation that allows them. */
    int64_t tag_ub = flag && ub ? *ub : 32767;
    if (l->tag_bound - 1 > tag_ub)
        return rt_error(e, "the plan uses message tags up to %" PRId64 " but this MPI allows %" PRId64
                        " (MPI_TAG_UB): compile with fewer micro-batches", l->tag_bound - 1, tag_ub);
    g_p2p.tag_bound = l->tag_bound;
    g_p2p.cap_sends = 64;
    g_p2p.sends = malloc(sizeof *g_p2p.sends * (size_t)g_p2p.cap_sends);
    g_p2p.send_key = malloc(sizeof *g_p2p.send_key * (size_t)g_p2p.cap_sends);
    g_p2p.done = malloc(sizeof *g_p2p.done * (size_t)g_p2p.cap_sends);
    if (!g_p2p.sends || !g_p2p.send_key || !g_p2p.done) return rt_error(e, "out of memory");
    if ((int64_t)l->stages * l->tag_bound > INT32_MAX)
        return rt_error(e, "%d stages x %" PRId64 " tags are too many", l->stages, l->tag_bound);
    return true;
}

void rt_p2p_free(void) {
    free(g_p2p.sends);
    free(g_p2p.send_key);
    free(g_p2p.done);
    g_p2p.sends = NULL;
    g_p2p.send_key = NULL;
    g_p2p.done = NULL;
    g_p2p.n_sends = g_p2p.cap_sends = 0;
}

static int message_size(int64_t bytes, int32_t tag) {
    if (tag < 0 || tag >= g_p2p.tag_bound)
        rt_fatal("message tag %d is outside [0, %" PRId64 ")", tag, g_p2p.tag_bound);
    if (bytes < 0 || bytes > INT_MAX)
        rt_fatal("a transfer of %" PRId64 " bytes (tag %d) is larger than one MPI message carries", bytes, tag);
    return (int)bytes;
}

void cleave_rt_send(int32_t peer, int32_t tag, void *buf, int64_t bytes) {
    int n = message_size(bytes, tag), to = rt_group_peer(peer);
    if (g_p2p.n_sends == g_p2p.cap_sends) {
        MPI_Request *more = realloc(g_p2p.sends, sizeof *more * (size_t)g_p2p.cap_sends * 2);
        if (more) g_p2p.sends = more;
        int32_t *keys = more ? realloc(g_p2p.send_key, sizeof *keys * (size_t)g_p2p.cap_sends * 2) : NULL;
        if (keys) g_p2p.send_key = keys;
        int *done = keys ? realloc(g_p2p.done, sizeof *done * (size_t)g_p2p.cap_sends * 2) : NULL;
        if (!done) rt_fatal("out of memory for %d outstanding sends", g_p2p.n_sends);
        g_p2p.done = done;
        g_p2p.cap_sends *= 2;
    }
    g_p2p.send_key[g_p2p.n_sends] = peer * (int32_t)g_p2p.tag_bound + tag;
    MPI_Isend(buf, n, MPI_BYTE, to, tag, rt_comm_world(), &g_p2p.sends[g_p2p.n_sends++]);
}

void cleave_rt_recv(int32_t peer, int32_t tag, void *buf, int64_t bytes) {
    int n = message_size(bytes, tag), from = rt_group_peer(peer);
    double t = rt_trace_wait_begin();
    MPI_Status status;
    rt_watch_begin("a receive from", -1, from);
    MPI_Recv(buf, n, MPI_BYTE, from, tag, rt_comm_world(), &status);
    rt_watch_end();
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != n) rt_fatal("received %d bytes with tag %d from rank %d, expected %d", got, tag, from, n);
    g_p2p.recv_wait_s += rt_trace_wait_end(RT_EV_RECV, t);
}

void cleave_rt_send_wait(int32_t peer, int32_t tag) {
    int32_t key = peer * (int32_t)g_p2p.tag_bound + tag;
    int i = 0;
    while (i < g_p2p.n_sends && g_p2p.send_key[i] != key) i++;
    if (i == g_p2p.n_sends) rt_fatal("a wait for a send to stage %d with tag %d that is not outstanding", peer, tag);
    double t = rt_trace_wait_begin();
    rt_watch_begin("a send to", -1, rt_group_peer(peer));
    MPI_Wait(&g_p2p.sends[i], MPI_STATUS_IGNORE);
    rt_watch_end();
    g_p2p.send_wait_s += rt_trace_wait_end(RT_EV_SEND, t);
    g_p2p.n_sends--;
    g_p2p.sends[i] = g_p2p.sends[g_p2p.n_sends];
    g_p2p.send_key[i] = g_p2p.send_key[g_p2p.n_sends];
}

/* Lets outstanding sends move (Open MPI has no progress thread);
 * completed requests become MPI_REQUEST_NULL and stay listed until their
 * wait. */
void rt_p2p_progress(void) {
    if (!g_p2p.n_sends) return;
    int count = 0;
    MPI_Testsome(g_p2p.n_sends, g_p2p.sends, &count, g_p2p.done, MPI_STATUSES_IGNORE);
}

/* The rank the outstanding sends go to, or the stages of the replica when
 * they go to several. */
static int last_sends_peer(void) {
    int32_t stage = g_p2p.send_key[0] / (int32_t)g_p2p.tag_bound;
    for (int i = 1; i < g_p2p.n_sends; i++)
        if (g_p2p.send_key[i] / (int32_t)g_p2p.tag_bound != stage) return RT_WATCH_STAGES;
    return rt_group_peer(stage);
}

void rt_p2p_step_begin(void) { g_p2p.send_wait_s = g_p2p.recv_wait_s = 0; }

void rt_p2p_step_end(RtStepComm *c) {
    if (g_p2p.n_sends) {
        double t = rt_trace_wait_begin();
        rt_watch_begin("the step's last sends to", -1, last_sends_peer());
        MPI_Waitall(g_p2p.n_sends, g_p2p.sends, MPI_STATUSES_IGNORE);
        rt_watch_end();
        g_p2p.n_sends = 0;
        g_p2p.send_wait_s += rt_trace_wait_end(RT_EV_SEND, t);
    }
    *c = (RtStepComm){.wait_s = g_p2p.send_wait_s + g_p2p.recv_wait_s};
}
