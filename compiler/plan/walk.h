/* walk.h - running the ranks' step sequences against each other.
 *
 * Requires: one step sequence per rank (RankPlan.train or .eval, or any
 * hand-made PlanStep arrays) and the groups their collectives name.
 * Provides: one walk of them in the runtime's semantics, which every user
 * that follows a plan's communication shares: comm_check (pipeline.h)
 * turns the walk's faults into messages, the simulator (cost/simulate.h)
 * puts a clock on its events.
 *
 * The semantics:
 *   - STEP_SEND posts a message to `peer` and never blocks (sends are
 *     buffered); no two unreceived messages from one rank to another may
 *     carry the same tag;
 *   - STEP_RECV blocks until a message from `peer` with its tag is there
 *     (the first unreceived one), which must have the same size;
 *   - STEP_SEND_WAIT blocks until the rank's last message to `peer` with
 *     its tag has been received (none sent: it completes at once);
 *   - STEP_ALLREDUCE and STEP_ALLREDUCE_START are collectives over
 *     Plan.groups[group] (a START of group -1: every rank); a rank blocks
 *     at one until every member of the group stands at a collective of the
 *     same kind over the same group, whose sizes (ALLREDUCE) or buckets
 *     (START) must agree; then all members complete it at once, so
 *     collectives come in the same order on every member;
 *   - every other step (compute, accumulate, STEP_ALLREDUCE_WAIT, whose
 *     start already met the other members) is local and completes at once.
 * The ranks take turns in rank order, each running until it blocks or
 * ends, until none can move.  The walk succeeds when every rank ends and
 * every message has been received; otherwise it names the first fault. */
#ifndef CLEAVE_WALK_H
#define CLEAVE_WALK_H

#include "plan.h"

/* A message posted by a STEP_SEND. */
typedef struct WalkMsg {
    int src, dst, tag;
    int step; /* the sender's step index */
    int64_t bytes;
    const Value *value;
    bool received;
    /* Two numbers the walk's user keeps with the message (the simulator:
     * when it arrives and when it is received); zero when posted. */
    double user[2];
} WalkMsg;

/* Messages sent to one rank, in sending order, received ones included. */
typedef struct WalkBox {
    WalkMsg *m;
    int n, cap;
} WalkBox;

/* What a walk's user hears.  A hook returning false stops the walk
 * (WALK_ABORTED); it has reported why.  Either may be NULL. */
typedef struct WalkHooks {
    /* Rank r completed step s, which is not a collective: m is the message
     * a STEP_SEND just posted, a STEP_RECV took, or a STEP_SEND_WAIT saw
     * received (NULL for local steps and a wait with no send).  m is valid
     * during the call only. */
    bool (*step)(void *ctx, int r, const PlanStep *s, WalkMsg *m);
    /* Every member of a collective stood at it and completed it:
     * members[0 .. n) in the group's order; s is the step of the rank
     * whose arrival completed it (the members' steps agree in kind, group,
     * and bucket or size). */
    bool (*collective)(void *ctx, const PlanStep *s, const int *members, int n);
} WalkHooks;

typedef enum {
    WALK_OK = 0,
    WALK_NO_PEER,             /* a send or receive names no other rank (out of range, or itself) */
    WALK_TAG_IN_FLIGHT,       /* a send reuses the tag of its unreceived message `msg` */
    WALK_SIZE_MISMATCH,       /* a receive's bytes differ from its message `msg`'s */
    WALK_NO_GROUP,            /* a collective names no group */
    WALK_BAD_MEMBER,          /* the collective's group names rank `other`, out of range */
    WALK_NOT_MEMBER,          /* a rank stands at a collective of a group it is not in */
    WALK_COLLECTIVE_MISMATCH, /* member `other` stands at another collective, or another size or bucket */
    WALK_STUCK,               /* ranks left that cannot move; `rank` is the first */
    WALK_UNRECEIVED,          /* every rank ended, but `msg` was never received */
    WALK_NOMEM,
    WALK_ABORTED,             /* a hook stopped the walk */
} WalkFaultKind;

/* The first fault of a walk: at `rank`'s step index `step` (its step `s`),
 * and where it involves another rank, that rank's step index and step. */
typedef struct WalkFault {
    WalkFaultKind kind;
    int rank, step;
    const PlanStep *s;
    int other, other_step;
    const PlanStep *other_s;
    const WalkMsg *msg; /* valid until the walk runs again or is freed */
} WalkFault;

typedef struct Walk {
    int n_ranks;
    const PlanStep **seq; /* per rank, len[r] steps */
    int *len;
    const PlanGroup *groups;
    int n_groups;
    int *pc;      /* per rank: the index of its next step */
    WalkBox *box; /* per rank: the messages sent to it */
    /* A million replicas may meet in one collective, so the work per rank
     * must not grow with the group.  The groups of rank r are
     * member[first[r] .. first[r + 1]), listed once at init; bad[g] is a
     * member of group g that names no rank (-1: none).  A group's members
     * are scanned from where the last look stopped (scan[g], the first
     * member not yet there; scan_all for every rank). */
    int *first, *member, *bad;
    int *scan, scan_all;
    int *all; /* 0 .. n_ranks - 1: the members of a collective over every rank */
} Walk;

/* Walks over n_ranks sequences (the arrays of pointers and lengths are
 * copied, the steps are not) and the collectives' groups.  False when out
 * of memory (w is then safe to free). */
bool walk_init(Walk *w, int n_ranks, const PlanStep *const *seq, const int *n_steps, const PlanGroup *groups,
               int n_groups);
/* The same over p's train sequences (eval false) or eval sequences. */
bool walk_init_plan(Walk *w, const Plan *p, bool eval);
void walk_free(Walk *w);
/* Runs every rank from its first step; may run again.  True when all
 * ended and every message was received; otherwise false with *f set. */
bool walk_run(Walk *w, const WalkHooks *h, void *ctx, WalkFault *f);
/* Rank r's next step, NULL when it has ended. */
const PlanStep *walk_at(const Walk *w, int r);
/* The rank that blocked rank r waits for: a receive's or send-wait's
 * peer, the first member of a collective's group not standing at it; -1
 * when r has ended or waits for no one. */
int walk_waits_for(const Walk *w, int r);
/* A few words naming a fault ("size mismatch"). */
const char *walk_fault_name(WalkFaultKind k);

#endif
