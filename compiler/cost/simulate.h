/* simulate.h - the predicted step time of a plan on a cluster.
 *
 * Requires: a plan (plan/plan.h, any strategy) and a cluster description
 * (cost/cluster.h).  Provides: each rank's timeline of one training step,
 * simulated from its planned steps in order on the walk that checks plans
 * (plan/walk.h: who blocks for whom), after the runtime's fixed
 * per-step work (step_overhead_s): a kernel takes the time its FLOPs need
 * at the cluster's matrix-product or convolution rate (ops marked dense
 * in the op table) or the time its bytes need at the memory rate,
 * whichever is longer, plus a per-kernel overhead, all slowed when ranks
 * pinned to the same core compute at once (cluster_core_of); a send
 * arrives alpha + bytes/beta after it is posted over the link between
 * the two ranks' nodes, where between nodes the bytes/beta part is booked
 * on the sender's node's outgoing link and the receiver's node's incoming
 * one (cost/nic.h), so that transfers sharing a node's link take turns on
 * it; a receive
 * waits for its message; a completion of a send waits until the peer has
 * received it; a collective starts when the last member reaches it and
 * takes a ring allreduce's time, or longer when the traffic its ring
 * sends between nodes finds their links busy (non-blocking ones complete
 * in the background and are waited for); the step ends with the reduction
 * of the loss over all ranks.  What it leaves out: caches, the progress
 * of non-blocking MPI requests only inside MPI calls, and contention
 * inside a network beyond the nodes' own links (a switch is taken to
 * carry whatever the nodes send). */
#ifndef CLEAVE_SIMULATE_H
#define CLEAVE_SIMULATE_H

#include "../plan/plan.h"
#include "cluster.h"
#include "profile.h"

typedef struct SimRank {
    double end_s;        /* when the rank's last step ends */
    double busy_s;       /* computing (kernels, accumulations) */
    double wait_s;       /* blocked in receives, send completions and collectives */
    int64_t sent_bytes;  /* point to point, per step */
    int64_t reduced_bytes; /* allreduced, per step */
    int64_t arena_bytes; /* everything the rank allocates: a bound that holds */
} SimRank;

/* What a waiting interval waits for. */
typedef enum { SIM_WAIT_NONE = 0, SIM_WAIT_RECV, SIM_WAIT_SEND, SIM_WAIT_ALLREDUCE } SimWait;

/* One interval of a rank's simulated timeline.  micro and peer say which
 * unit of work and which link it belongs to, so that a report can set it
 * against the same unit or link of a measured trace. */
typedef struct SimEvent {
    int rank;
    double t0, t1;
    char kind;    /* 'F' forward, 'B' backward, 'U' update (optimizer, once-per-step sums), 'W' waiting */
    int micro;    /* the plan step's micro-batch (-1: once per step) */
    SimWait wait; /* 'W': a receive, a send's completion, or an allreduce (NONE otherwise) */
    int peer;     /* SIM_WAIT_RECV: the sender; SIM_WAIT_SEND: the receiver; -1 otherwise */
} SimEvent;

typedef struct SimResult {
    double step_s;       /* the slowest rank's end, plus the loss reduction */
    double bubble;       /* 1 - sum of busy / (ranks x step) */
    int64_t comm_bytes;  /* sent and allreduced bytes of one step, over all ranks */
    int64_t peak_bytes;  /* the largest arena */
    int n_ranks;
    SimRank *ranks;      /* malloc'd, n_ranks */
    int n_events;
    SimEvent *events;    /* malloc'd, in the order simulated (NULL when out of memory) */
} SimResult;

/* Seconds one kernel of node n takes on `rank`, its data where `where`
 * says (profile.h; it matters only with a profile). */
double sim_node_seconds(const Cluster *c, int rank, const Node *n, ProfileCache where);
/* Simulates one training step of every rank of p; fails with a Diag when
 * the plan needs more ranks than the cluster has, or its ranks cannot all
 * finish (a plan comm_check would reject). */
bool simulate_plan(const Plan *p, const Cluster *c, SimResult *out, Diag *d);
void sim_result_free(SimResult *r);

#endif
