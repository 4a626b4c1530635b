/* search.h - choosing how to split the work (search.c).
 *
 * Requires: compile options whose model, batch, ranks, training options
 * and cluster are set.  Provides: every layout (D replicas x P stages, M
 * micro-batches, schedule, placement) that applies, or one given layout,
 * planned for real through driver_build_plan and simulated on the cluster
 * (cost/simulate.h), fastest feasible first.  The search owns the
 * kernel profile (--profile, cost/profile.h) it prices on, so that the
 * plan compiled or drawn afterwards is cut on the same times. */
#ifndef CLEAVE_SEARCH_H
#define CLEAVE_SEARCH_H

#include "driver.h"

/* One way to run o on o->ranks ranks, and what the cost model predicts. */
typedef struct Candidate {
    Layout layout;       /* the search's own: no cuts, stages balanced by time */
    bool feasible;       /* planned, and fits every rank's memory */
    char why[256];       /* infeasible: why; otherwise empty */
    double step_s, bubble; /* predicted */
    int64_t comm_bytes, peak_bytes;
    int64_t *rank_bytes; /* arena of each rank (malloc'd, n_ranks) */
    double *rank_busy_s;  /* predicted compute of each rank */
    int n_ranks;
    /* Staged plans: the first node of every stage after the first, as
     * --stages takes them (malloc'd, comma-separated); NULL otherwise.
     * Compiled with --stages, the candidate is exactly the plan priced. */
    char *cuts;
    int batch_stats; /* BatchNormalization layers in training form */
} Candidate;

typedef struct Search {
    int n;
    Candidate *c;        /* fastest feasible first, then the infeasible */
    int best;            /* 0, or -1 when none is feasible */
    char cluster[1100];  /* which cluster description was used, for people */
    int64_t memory_per_rank;
    /* --profile: this machine's times of the model's kernels, kept until
     * search_free (NULL without --profile) */
    KernelProfile *profile;
} Search;

/* Plans every strategy, factorisation D x P = o->ranks, micro-batch count
 * and schedule that applies to o, simulates each on the cluster
 * (o->cluster, or this machine's calibration or the stated defaults when
 * NULL) and orders them.  On failure *s is left empty. */
bool search_all(const CompileOptions *o, Search *s, Diag *d);
/* The prediction for layout l alone (one candidate). */
bool search_one(const CompileOptions *o, const Layout *l, Search *s, Diag *d);
/* --strategy auto: search_all, and the fastest feasible layout in
 * *chosen, reported on stderr; s holds the profile to compile it with. */
bool search_choose(const CompileOptions *o, Search *s, Layout *chosen, Diag *d);
void search_free(Search *s);
/* c's schedule by name; "" for layouts without stages (single, dp). */
const char *candidate_schedule(const Candidate *c);

#endif
