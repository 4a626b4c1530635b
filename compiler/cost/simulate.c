/* simulate.c - one training step of a plan, rank by rank, on a cluster
 * (simulate.h).  The walk is comm_check's (plan/walk.h): every rank
 * advances through its steps until it must wait for a message or for the
 * other members of a collective; here each rank also carries a clock,
 * which the walk's events move.  A message keeps when it arrives and when
 * it was received (WalkMsg.user[0] and [1]). */
#include "simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/ops.h"
#include "../plan/walk.h"
#include "nic.h"
#include "node_cost.h"
#include "profile.h"

/* A rank's part in a collective, from when its last member arrived until
 * the sum is complete: copying and adding, so CPU work. */
typedef struct Span {
    int rank;
    double t0, t1;
} Span;

typedef struct Sim {
    const Plan *p;
    const Cluster *c;
    Diag *d;
    int n;
    Walk walk; /* the plan's train sequences */
    double *t;
    double **bucket_done; /* per rank, per bucket: when its sum is complete */
    SimRank *out;
    double *share;      /* each rank's part of a core while it computes */
    double *coll_share; /* ... and while it takes part in a collective */
    Span *span;
    int n_span, cap_span;
    SimEvent *ev;
    int n_ev, cap_ev;
    bool ev_failed;
    /* The nodes' links, when the plan's ranks span more than one node:
     * transfers between nodes are booked on them (nic.h), so that
     * messages sharing a link share its bandwidth.  nic_tx, nic_rx:
     * scratch per node, a collective's seconds on each link (0 between
     * uses). */
    bool nic_used;
    Nics nic;
    double *nic_tx, *nic_rx;
    /* Per rank, per train step: where its kernel finds its data
     * (ProfileCache) and the share of its bytes read from memory
     * (mark_caches). */
    unsigned char **where;
    float **mem_frac;
} Sim;

/* What step s of a rank waits for, and on whom. */
static SimWait wait_of(const PlanStep *s, int *peer) {
    *peer = -1;
    switch (s->kind) {
    case STEP_RECV: *peer = s->peer; return SIM_WAIT_RECV;
    case STEP_SEND_WAIT: *peer = s->peer; return SIM_WAIT_SEND;
    case STEP_ALLREDUCE:
    case STEP_ALLREDUCE_START:
    case STEP_ALLREDUCE_WAIT: return SIM_WAIT_ALLREDUCE;
    default: return SIM_WAIT_NONE;
    }
}

/* Records an interval of rank r's timeline, spent on plan step s (dropped
 * when empty). */
static void event(Sim *S, int r, double t0, double t1, char kind, const PlanStep *s) {
    if (t1 <= t0 || S->ev_failed) return;
    if (S->n_ev == S->cap_ev) {
        int cap = S->cap_ev ? 2 * S->cap_ev : 256;
        SimEvent *e = realloc(S->ev, sizeof *e * (size_t)cap);
        if (!e) {
            S->ev_failed = true;
            return;
        }
        S->ev = e;
        S->cap_ev = cap;
    }
    int peer = -1;
    SimWait wait = kind == 'W' && s ? wait_of(s, &peer) : SIM_WAIT_NONE;
    S->ev[S->n_ev++] = (SimEvent){r, t0, t1, kind, s ? s->micro : -1, wait, peer};
}

static char compute_kind(const PlanStep *s) {
    if (s->micro < 0 && s->kind != STEP_COMPUTE) return 'U';
    if (s->kind != STEP_COMPUTE) return 'B'; /* accumulations */
    NodePhase ph = s->node->phase;
    return ph == PHASE_OPTIMIZER || s->micro < 0 ? 'U' : ph == PHASE_BACKWARD ? 'B' : 'F';
}

/* A send's work belongs to its micro-batch's forward (activations) or
 * backward (gradients), as the programs' traces count it. */
static char send_kind(const Plan *p, const PlanStep *s) {
    if (s->micro < 0) return 'U';
    return s->xfer >= 0 && s->xfer < p->n_xfers && p->xfers[s->xfer].dir == XFER_GRADIENT ? 'B' : 'F';
}

double sim_node_seconds(const Cluster *c, int rank, const Node *n, ProfileCache where) {
    double measured = c->profile ? profile_node_seconds(c->profile, n, where) : -1;
    if (measured >= 0) return measured / cluster_rank_speed(c, rank);
    double bytes = 0;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && plan_value_bytes(n->in[i]) > 0) bytes += (double)plan_value_bytes(n->in[i]);
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] && plan_value_bytes(n->out[k]) > 0) bytes += (double)plan_value_bytes(n->out[k]);
    double t = cluster_mem_seconds(c, rank, bytes);
    if (n->def && n->def->dense) {
        double g = n->def->dense == DENSE_CONV ? cluster_conv_seconds(c, rank, cost_node_flops(n))
                                               : cluster_gemm_seconds(c, rank, cost_node_flops(n));
        if (g > t) t = g;
    }
    return t + c->kernel_overhead_s;
}

/* The values a compute step's node reads and writes (inputs, then
 * outputs; NULL for an absent one), or an accumulation's gradient. */
static int step_values(const PlanStep *s) { return s->kind == STEP_COMPUTE ? s->node->n_in + s->node->n_out : 1; }
static const Value *step_value(const PlanStep *s, int k) {
    if (s->kind != STEP_COMPUTE) return s->value;
    const Node *n = s->node;
    return k < n->n_in ? n->in[k] : n->out[k - n->n_in];
}

/* The bytes a compute or accumulate step reads and writes (each input and
 * output once; a value one kernel writes and the next reads counts for
 * both), and in *key what tells the same kernel in another micro-batch:
 * its node's id, or n_nodes + the accumulated value's id.  -1: neither. */
static double step_bytes(const Graph *g, const PlanStep *s, int *key) {
    *key = -1;
    if (s->kind == STEP_COMPUTE && s->node->id >= 0 && s->node->id < g->n_nodes)
        *key = s->node->id;
    else if (s->kind == STEP_ACCUMULATE && s->value->id >= 0 && s->value->id < g->n_values)
        *key = g->n_nodes + s->value->id;
    else
        return 0;
    double bytes = 0;
    for (int k = 0; k < step_values(s); k++) {
        const Value *v = step_value(s, k);
        if (v && plan_value_bytes(v) > 0) bytes += (double)plan_value_bytes(v);
    }
    return s->kind == STEP_ACCUMULATE ? 2 * bytes : bytes; /* the gradient and its accumulator */
}

/* Where each of rank r's train steps finds its data.  Warm, as --profile
 * timed its kernels called again at once, when all the rank touched
 * since the same kernel's previous call, its own data included, fits in
 * the L2 cache whose contents the profile's cold timings evict: a kernel
 * of a later micro-batch (a stage of eight 512 x 512 layers touches 8 MB
 * between two micro-batches of one of them, and on the test cluster each
 * of its later micro-batches took the cold time, 20-25% above the warm
 * one, docs/costmodel.md).  Otherwise cold, and for the share of its
 * bytes (mem_frac) whose value the rank last touched more than its share
 * of the last-level cache ago, from memory: the weights, gradients and
 * optimizer state of a rank whose step touches more than that cache
 * holds, last touched a step ago, while the activations the kernel
 * before it made are still in cache.  A value not yet touched in the
 * step was last touched all the rank's steps ago.  False when out of
 * memory. */
static bool mark_caches(Sim *S, int r) {
    const Graph *g = S->p->g;
    const RankPlan *pr = &S->p->ranks[r];
    int keys = g->n_nodes + g->n_values;
    int *last = malloc(sizeof *last * (size_t)(keys > 0 ? keys : 1));
    double *upto = malloc(sizeof *upto * ((size_t)pr->n_train + 1)); /* bytes of steps [0, i) */
    double *touched = malloc(sizeof *touched * (size_t)(g->n_values > 0 ? g->n_values : 1));
    bool ok = last && upto && touched;
    for (int k = 0; ok && k < keys; k++) last[k] = -1;
    for (int v = 0; ok && v < g->n_values; v++) touched[v] = -1;
    if (ok) upto[0] = 0;
    for (int i = 0; ok && i < pr->n_train; i++) {
        int key;
        upto[i + 1] = upto[i] + step_bytes(g, &pr->train[i], &key);
    }
    /* the last-level cache is shared by the ranks of a node */
    int sharing = 0;
    for (int q = 0; q < S->n; q++) sharing += cluster_same_node(S->c, q, r);
    double l2 = (double)profile_cache_bytes(), llc = (double)profile_llc_bytes() / (sharing > 0 ? sharing : 1);
    double total = ok ? upto[pr->n_train] : 0;
    for (int i = 0; ok && i < pr->n_train; i++) {
        const PlanStep *s = &pr->train[i];
        int key;
        step_bytes(g, s, &key);
        S->where[r][i] = PROFILE_COLD;
        S->mem_frac[r][i] = 0;
        if (key < 0) continue;
        int j = last[key];
        last[key] = i;
        double since = s->micro > 0 && j >= 0 ? upto[i + 1] - upto[j + 1] : total;
        if (s->micro > 0 && j >= 0 && since <= l2) {
            S->where[r][i] = PROFILE_WARM;
            continue;
        }
        /* the step's values, each once, by when the rank last touched them */
        double all = 0, far = 0;
        for (int k = 0; k < step_values(s); k++) {
            const Value *v = step_value(s, k);
            bool seen = false;
            for (int q = 0; q < k; q++) seen |= step_value(s, q) == v;
            if (!v || seen || v->id < 0 || v->id >= g->n_values || plan_value_bytes(v) <= 0) continue;
            double b = (double)plan_value_bytes(v), t = touched[v->id];
            all += b;
            if ((t < 0 ? total : upto[i] - t) > llc) far += b;
            touched[v->id] = upto[i + 1];
        }
        if (s->kind == STEP_ACCUMULATE) { /* the accumulator, as big, touched at the same kernel's last call */
            double acc = all;
            all += acc;
            if (since > llc) far += acc;
        }
        S->mem_frac[r][i] = all > 0 ? far / all : 0;
    }
    free(last);
    free(upto);
    free(touched);
    return ok;
}

/* Seconds of rank r's train step i, its kernel's profiled time where
 * mark_caches says its data are (sim_node_seconds, or the accumulation's
 * own kernel), the share from memory charged at the memory timing. */
static double step_seconds(Sim *S, int r, const PlanStep *s) {
    int i = (int)(s - S->p->ranks[r].train);
    ProfileCache where = S->where[r][i];
    double f = S->mem_frac[r][i];
    if (s->kind == STEP_COMPUTE) {
        double t = sim_node_seconds(S->c, r, s->node, where);
        return f > 0 ? t + f * (sim_node_seconds(S->c, r, s->node, PROFILE_MEMORY) - t) : t;
    }
    KernelProfile *kp = S->c->profile;
    double t = kp ? profile_accumulate_seconds(kp, s->value, where) : -1;
    if (t >= 0 && f > 0) t += f * (profile_accumulate_seconds(kp, s->value, PROFILE_MEMORY) - t);
    return t >= 0 ? t / cluster_rank_speed(S->c, r) : cluster_mem_seconds(S->c, r, 3.0 * (double)plan_value_bytes(s->value));
}

/* Within a node, MPI moves messages by copies the ranks' cores make: when
 * the node's cores are shared, a transfer between a and b gets the
 * smaller of their shares. */
static double copy_share(const Sim *S, int a, int b) {
    if (!cluster_same_node(S->c, a, b)) return 1.0;
    double x = S->share[a], y = S->share[b];
    return x < y ? x : y;
}

/* When a message of `bytes` posted by rank a now reaches rank b.  Within
 * a node: the link's time, slowed where the ranks' cores are shared.
 * Between nodes: its bandwidth time is booked on a's node's outgoing link
 * and b's node's incoming one (nic.h), from the first moment both are
 * free, and the latency follows. */
static double arrival(Sim *S, int a, int b, double bytes) {
    const Cluster *c = S->c;
    if (!S->nic_used || cluster_same_node(c, a, b))
        return S->t[a] + cluster_p2p_seconds(c, a, b, bytes) / copy_share(S, a, b);
    const ClusterLink *l = cluster_link(c, a, b);
    double dur = bytes > 0 ? bytes / (l->bandwidth_gbps * 1e9) : 0;
    return nics_book(&S->nic, cluster_node_of(c, a), cluster_node_of(c, b), S->t[a], dur) + l->latency_s + dur;
}

/* A ring over m[0 .. n) summing `bytes` moves 2 (n - 1) chunks of bytes /
 * n along each of its edges.  The edges that cross between nodes are
 * booked (at the link's allreduce rate, cluster_ring_seconds), node by node, on the links they leave and enter, from `start`;
 * returns when the last booking ends (start when none crosses).  A ring
 * whose edges leave a node twice (ranks of two nodes taking turns) or
 * rings of several groups at once thus queue on the shared links. */
static double ring_on_links(Sim *S, const int *m, int n, double bytes, double start) {
    const Cluster *c = S->c;
    if (!S->nic_used || n < 2) return start;
    double each = 2.0 * (n - 1) * bytes / n, end = start;
    for (int i = 0; i < n; i++) {
        int a = m[i], b = m[(i + 1) % n];
        if (cluster_same_node(c, a, b)) continue;
        const ClusterLink *l = cluster_link(c, a, b);
        double dur = each / ((l->allreduce_gbps > 0 ? l->allreduce_gbps : l->bandwidth_gbps) * 1e9);
        S->nic_tx[cluster_node_of(c, a)] += dur;
        S->nic_rx[cluster_node_of(c, b)] += dur;
    }
    for (int i = 0; i < n; i++) {
        int x = cluster_node_of(c, m[i]);
        for (int rx = 0; rx < 2; rx++) {
            double *dur = rx ? &S->nic_rx[x] : &S->nic_tx[x];
            if (*dur <= 0) continue;
            double t = nics_book_one(&S->nic, x, rx, start, *dur);
            if (t > end) end = t;
            *dur = 0;
        }
    }
    return end;
}

static int ascending(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A hierarchical sum of `bytes` over m[0 .. n) (Plan.allreduce_node K,
 * rank r on node r / K), as the runtime chains it: within each node a
 * binomial reduction to its first rank (ceil(log2 k) rounds of a message
 * and an addition of the whole buffer for k ranks), a ring allreduce
 * among the leaders, and a binomial broadcast back; each part waits for
 * the slowest node.  Starting at `start`, returns when it is complete on
 * every member; the leaders' ring books its traffic between nodes on the
 * links.  -1 when out of memory. */
static double hierarchical_done(Sim *S, const int *m, int n, double bytes, double start, double share) {
    const Cluster *c = S->c;
    int K = S->p->allreduce_node, *sorted = malloc(sizeof *sorted * (size_t)n), *leaders = malloc(sizeof *leaders * (size_t)n);
    if (!sorted || !leaders) {
        free(sorted);
        free(leaders);
        return -1;
    }
    memcpy(sorted, m, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, ascending);
    int L = 0;
    double down = 0, up = 0; /* the slowest node's reduction and broadcast */
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && sorted[j] / K == sorted[i] / K) j++;
        leaders[L++] = sorted[i];
        double far = 0; /* the leader's slowest message to one of its node */
        for (int k = i + 1; k < j; k++) {
            double t = cluster_p2p_seconds(c, sorted[i], sorted[k], bytes);
            if (t > far) far = t;
        }
        int rounds = 0;
        while ((1 << rounds) < j - i) rounds++;
        double add = bytes > 0 ? 3.0 * bytes / (c->elementwise_gbps * 1e9) : 0;
        if (rounds * (far + add) > down) down = rounds * (far + add);
        if (rounds * far > up) up = rounds * far;
        i = j;
    }
    double ring = cluster_allreduce_seconds(c, leaders, L, bytes);
    double done = start + (down + ring + up) / share;
    double links = ring_on_links(S, leaders, L, bytes, start + down / share);
    if (links + up / share > done) done = links + up / share;
    free(sorted);
    free(leaders);
    return done;
}

/* Records rank r's part in a collective (dropped when out of memory,
 * which ev_failed then reports). */
static void span(Sim *S, int r, double t0, double t1) {
    if (t1 <= t0 || S->ev_failed) return;
    if (S->n_span == S->cap_span) {
        int cap = S->cap_span ? 2 * S->cap_span : 64;
        Span *x = realloc(S->span, sizeof *x * (size_t)cap);
        if (!x) {
            S->ev_failed = true;
            return;
        }
        S->span = x;
        S->cap_span = cap;
    }
    S->span[S->n_span++] = (Span){r, t0, t1};
}

/* Every member m[0 .. n) stands at collective s (the walk's collective
 * hook): it starts when the last of them arrived. */
static bool on_collective(void *ctx, const PlanStep *s, const int *m, int n) {
    Sim *S = ctx;
    double start = 0;
    for (int i = 0; i < n; i++)
        if (S->t[m[i]] > start) start = S->t[m[i]];
    int64_t bytes = s->kind == STEP_ALLREDUCE ? s->bytes
                                              : S->p->ranks[m[0]].buckets[s->bucket].bytes;
    /* The ring moves at its slowest member's part of a core, where a core
     * is shared (the ranks' copies and additions are CPU work). */
    double share = 1.0;
    for (int i = 0; i < n; i++) {
        int a = m[i], b = m[(i + 1) % n];
        if (!cluster_same_node(S->c, a, b)) continue;
        if (S->coll_share[a] < share) share = S->coll_share[a];
        if (S->coll_share[b] < share) share = S->coll_share[b];
    }
    double done;
    if (s->kind == STEP_ALLREDUCE_START && S->p->allreduce_node > 0) {
        /* a gradient bucket the runtime sums node by node */
        done = hierarchical_done(S, m, n, (double)bytes, start, share);
        if (done < 0) {
            S->ev_failed = true;
            done = start;
        }
    } else {
        done = start + cluster_allreduce_seconds(S->c, m, n, (double)bytes) / share;
        /* alone it takes `done`; its traffic between nodes may have to
         * wait for the links other transfers hold */
        double links = ring_on_links(S, m, n, (double)bytes, start);
        if (links > done) done = links;
    }
    for (int i = 0; i < n; i++) {
        int r = m[i];
        span(S, r, start, done);
        S->out[r].reduced_bytes += bytes;
        if (s->kind == STEP_ALLREDUCE) {
            S->out[r].wait_s += done - S->t[r];
            event(S, r, S->t[r], done, 'W', s);
            S->t[r] = done;
        } else {
            S->bucket_done[r][s->bucket] = done;
        }
    }
    return true;
}

/* Rank r completed step s, not a collective (the walk's step hook): its
 * clock moves by the step's work, or to when its message arrived or was
 * received (m). */
static bool on_step(void *ctx, int r, const PlanStep *s, WalkMsg *m) {
    Sim *S = ctx;
    double before = S->t[r];
    switch (s->kind) {
    case STEP_COMPUTE: {
        double dt = step_seconds(S, r, s) / S->share[r];
        event(S, r, S->t[r], S->t[r] + dt, compute_kind(s), s);
        S->t[r] += dt;
        S->out[r].busy_s += dt;
        return true;
    }
    case STEP_ACCUMULATE: {
        double dt = step_seconds(S, r, s) / S->share[r];
        event(S, r, S->t[r], S->t[r] + dt, compute_kind(s), s);
        S->t[r] += dt;
        S->out[r].busy_s += dt;
        return true;
    }
    case STEP_SEND: {
        m->user[0] = arrival(S, r, s->peer, (double)s->bytes);
        S->out[r].sent_bytes += s->bytes;
        /* the send call's own work on the sender's core; the message's
         * arrival above already holds it (the latency was timed from the
         * call), so only the sender's next work waits for it */
        double dt = cluster_send_cpu_seconds(S->c, r, s->peer, (double)s->bytes) / S->share[r];
        if (dt > 0) {
            event(S, r, S->t[r], S->t[r] + dt, send_kind(S->p, s), s);
            S->t[r] += dt;
            S->out[r].busy_s += dt;
        }
        return true;
    }
    case STEP_RECV:
        if (m->user[0] > S->t[r]) S->t[r] = m->user[0];
        m->user[1] = S->t[r];
        break;
    case STEP_SEND_WAIT:
        if (m && m->user[1] > S->t[r]) S->t[r] = m->user[1];
        break;
    case STEP_ALLREDUCE_WAIT:
        if (S->bucket_done[r][s->bucket] > S->t[r]) S->t[r] = S->bucket_done[r][s->bucket];
        break;
    case STEP_ALLREDUCE:
    case STEP_ALLREDUCE_START: break; /* collectives come to on_collective() */
    }
    S->out[r].wait_s += S->t[r] - before;
    event(S, r, before, S->t[r], 'W', s);
    return true;
}

/* Every rank's steps from the start, on S's current shares. */
static bool walk(Sim *S) {
    int n = S->n;
    for (int r = 0; r < n; r++) {
        memset(S->bucket_done[r], 0, sizeof **S->bucket_done * ((size_t)S->p->ranks[r].n_buckets + 1));
        S->out[r] = (SimRank){0};
    }
    S->n_ev = 0;
    S->n_span = 0;
    S->ev_failed = false;
    if (S->nic_used) nics_clear(&S->nic);
    /* The runtime's own work opens every rank's step (filling the batch):
     * busy, as once-per-step work ('U'). */
    for (int r = 0; r < n; r++) {
        double dt = S->c->step_overhead_s / S->share[r];
        event(S, r, 0, dt, 'U', NULL);
        S->t[r] = S->out[r].busy_s = dt;
    }
    static const WalkHooks hooks = {on_step, on_collective};
    WalkFault f;
    if (walk_run(&S->walk, &hooks, S, &f))
        return !S->nic.failed || diag_error(S->d, DIAG_NOMEM, "out of memory simulating the plan");
    if (f.kind == WALK_NOMEM) return diag_error(S->d, DIAG_NOMEM, "out of memory simulating the plan");
    if (f.kind == WALK_STUCK)
        return diag_error(S->d, DIAG_INTERNAL, "simulating the plan: rank %d is stuck at step %d", f.rank, f.step);
    return diag_error(S->d, DIAG_INTERNAL, "simulating the plan: rank %d step %d: %s (a plan comm_check rejects)",
                      f.rank, f.step, walk_fault_name(f.kind));
}

typedef struct Edge {
    double t;
    int rank, up; /* +1: a busy interval starts, -1: ends */
    int what;     /* 0: computing, 1: in a collective */
} Edge;

static int by_time(const void *a, const void *b) {
    const Edge *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->up - y->up; /* ends before starts at the same instant */
}

/* Whether ranks a and b are pinned to the same core (core[r]: r's, -1
 * for a core of its own). */
static bool same_core(const Sim *S, const int *core, int a, int b) {
    return core[a] >= 0 && core[a] == core[b] && cluster_same_node(S->c, a, b);
}

/* *share taken to `fresh`, halfway except in the first round: the shares
 * of the walk `fresh` came from made its overlaps, and jumping to the new
 * ones at once can swing back and forth.  *moved: the largest move yet. */
static void settle(double *share, double fresh, bool first_round, double *moved) {
    double x = first_round ? fresh : 0.5 * (fresh + *share);
    if (fabs(x - *share) > *moved) *moved = fabs(x - *share);
    *share = x;
}

/* Shares from the last walk's overlaps.  On a node with fewer cores than
 * ranks each rank is pinned to one core (cluster_core_of): while rank r
 * computes, on average k ranks pinned to its core compute or take part in
 * a collective (itself included), and it gets 1 / k of it; likewise
 * while it takes part in a collective.  Ranks that wait for a message do
 * not compete: Open MPI yields the core of a waiting rank when ranks
 * outnumber cores.  *moved: the largest change of a share.  False when out
 * of memory. */
static bool contended_shares(Sim *S, bool first_round, double *moved) {
    int n = S->n;
    Edge *e = malloc(sizeof *e * (2 * ((size_t)S->n_ev + (size_t)S->n_span) + 1));
    /* per rank, [0]: computing, [1]: in a collective */
    double (*weighted)[2] = calloc((size_t)n, sizeof *weighted), (*busy)[2] = calloc((size_t)n, sizeof *busy);
    int (*active)[2] = calloc((size_t)n, sizeof *active), *core = malloc(sizeof *core * (size_t)n);
    int *group = malloc(sizeof *group * (size_t)n);
    bool ok = e && weighted && busy && active && core && group;
    for (int r = 0; ok && r < n; r++) core[r] = cluster_core_of(S->c, r, n);
    /* One sweep per core: over the ranks pinned to the core of rank `first`
     * (its group, group[0 .. ng)). */
    for (int first = 0; ok && first < n; first++) {
        int ng = 0;
        bool seen = core[first] < 0;
        for (int r = 0; !seen && r < n; r++)
            if (same_core(S, core, r, first)) {
                if (r < first) seen = true;
                else group[ng++] = r;
            }
        if (seen) continue;
        int m = 0;
        for (int i = 0; i < S->n_ev; i++) {
            const SimEvent *v = &S->ev[i];
            if (v->kind == 'W' || !same_core(S, core, v->rank, first)) continue;
            e[m++] = (Edge){v->t0, v->rank, 1, 0};
            e[m++] = (Edge){v->t1, v->rank, -1, 0};
        }
        for (int i = 0; i < S->n_span; i++) {
            const Span *v = &S->span[i];
            if (!same_core(S, core, v->rank, first)) continue;
            e[m++] = (Edge){v->t0, v->rank, 1, 1};
            e[m++] = (Edge){v->t1, v->rank, -1, 1};
        }
        qsort(e, (size_t)m, sizeof *e, by_time);
        int k = 0;
        for (int i = 0; i < m; i++) {
            if (i > 0 && k > 0) {
                double len = e[i].t - e[i - 1].t;
                for (int j = 0; j < ng; j++)
                    for (int w = 0; w < 2; w++)
                        if (active[group[j]][w]) weighted[group[j]][w] += len * k, busy[group[j]][w] += len;
            }
            int before = active[e[i].rank][0] + active[e[i].rank][1];
            active[e[i].rank][e[i].what] += e[i].up;
            int after = active[e[i].rank][0] + active[e[i].rank][1];
            k += (after > 0) - (before > 0); /* a rank counts once, whatever it does */
        }
    }
    *moved = 0;
    for (int r = 0; ok && r < n; r++) {
        settle(&S->share[r], busy[r][0] > 0 ? busy[r][0] / weighted[r][0] : 1.0, first_round, moved);
        settle(&S->coll_share[r], busy[r][1] > 0 ? busy[r][1] / weighted[r][1] : 1.0, first_round, moved);
    }
    free(e);
    free(weighted);
    free(busy);
    free(active);
    free(core);
    free(group);
    return ok;
}

/* Rounds of the shares' fixed point at most: each walks the step again. */
#define SIM_SHARE_ROUNDS 8

/* Whether some node runs more of the plan's ranks than it has cores. */
static bool oversubscribed(const Cluster *c, int n) {
    for (int r = 0; r < n; r += c->ranks_per_node)
        if (cluster_core_share(c, r, n) < 1) return true;
    return false;
}

static void free_sim(Sim *S) {
    if (S->bucket_done)
        for (int r = 0; r < S->n; r++) free(S->bucket_done[r]);
    free(S->bucket_done);
    for (int r = 0; r < S->n; r++) {
        if (S->where) free(S->where[r]);
        if (S->mem_frac) free(S->mem_frac[r]);
    }
    free(S->where);
    free(S->mem_frac);
    free(S->t);
    free(S->nic_tx);
    free(S->nic_rx);
    nics_free(&S->nic);
    walk_free(&S->walk);
}

bool simulate_plan(const Plan *p, const Cluster *c, SimResult *out, Diag *d) {
    memset(out, 0, sizeof *out);
    int n = p->n_ranks;
    if (n > cluster_ranks(c))
        return diag_error(d, DIAG_USAGE, "the plan needs %d ranks but the cluster (%s) has %d", n, c->origin,
                          cluster_ranks(c));
    Sim S = {.p = p, .c = c, .d = d, .n = n};
    if (c->profile) profile_bind(c->profile, p->g);
    bool walks = walk_init_plan(&S.walk, p, false);
    S.t = calloc((size_t)n, sizeof *S.t);
    S.bucket_done = calloc((size_t)n, sizeof *S.bucket_done);
    S.where = calloc((size_t)n, sizeof *S.where);
    S.mem_frac = calloc((size_t)n, sizeof *S.mem_frac);
    S.out = calloc((size_t)n, sizeof *S.out);
    S.share = malloc(sizeof *S.share * (size_t)n);
    S.coll_share = malloc(sizeof *S.coll_share * (size_t)n);
    bool ok = walks && S.t && S.bucket_done && S.where && S.mem_frac && S.out && S.share && S.coll_share;
    int nodes = cluster_node_of(c, n - 1) + 1;
    if (ok && nodes > 1) {
        S.nic_used = true;
        S.nic_tx = calloc((size_t)nodes, sizeof *S.nic_tx);
        S.nic_rx = calloc((size_t)nodes, sizeof *S.nic_rx);
        ok = nics_init(&S.nic, nodes) && S.nic_tx && S.nic_rx;
    }
    for (int r = 0; ok && r < n; r++) {
        S.bucket_done[r] = calloc((size_t)p->ranks[r].n_buckets + 1, sizeof **S.bucket_done);
        S.where[r] = calloc((size_t)p->ranks[r].n_train + 1, sizeof **S.where);
        S.mem_frac[r] = calloc((size_t)p->ranks[r].n_train + 1, sizeof **S.mem_frac);
        ok = S.bucket_done[r] && S.where[r] && S.mem_frac[r] && (!c->profile || mark_caches(&S, r));
    }
    if (!ok) diag_error(d, DIAG_NOMEM, "out of memory simulating the plan");
    for (int r = 0; ok && r < n; r++) S.share[r] = S.coll_share[r] = 1.0;
    ok = ok && walk(&S);
    /* Ranks beyond their node's cores: walk again on the shares the last
     * walk's overlaps give, until they settle.  One round tells a pipeline,
     * whose stages take turns, from data parallelism, whose replicas all
     * compute at once; but slowing the ranks lengthens their overlaps, and
     * a hybrid of 4 micro-batches on 4 ranks pinned to 2 cores was then
     * predicted at 5.5 ms a step with 17 ms of work, 8.7 per core. */
    if (ok && oversubscribed(c, n)) {
        double moved = 1;
        for (int round = 0; ok && round < SIM_SHARE_ROUNDS && moved > 0.01; round++) {
            ok = (!S.ev_failed && contended_shares(&S, round == 0, &moved)) ||
                 diag_error(d, DIAG_NOMEM, "out of memory simulating the plan");
            ok = ok && walk(&S);
        }
    }
    if (ok) {
        double end = 0, busy = 0;
        for (int r = 0; r < n; r++) {
            S.out[r].end_s = S.t[r];
            S.out[r].arena_bytes = p->ranks[r].arena_bytes;
            if (S.t[r] > end) end = S.t[r];
            busy += S.out[r].busy_s;
            out->comm_bytes += S.out[r].sent_bytes + S.out[r].reduced_bytes;
            if (p->ranks[r].arena_bytes > out->peak_bytes) out->peak_bytes = p->ranks[r].arena_bytes;
        }
        if (n > 1) end += cluster_allreduce_seconds(c, S.walk.all, n, 16); /* the step's loss, over every rank */
        out->step_s = end;
        out->bubble = end > 0 ? 1 - busy / (n * end) : 0;
        out->n_ranks = n;
        out->ranks = S.out;
        S.out = NULL;
        if (!S.ev_failed) {
            out->events = S.ev;
            out->n_events = S.n_ev;
            S.ev = NULL;
        }
    }
    free(S.out);
    free(S.share);
    free(S.coll_share);
    free(S.span);
    free(S.ev);
    free_sim(&S);
    return ok;
}

void sim_result_free(SimResult *r) {
    free(r->ranks);
    free(r->events);
    memset(r, 0, sizeof *r);
}
