/* driver.h - the compiler pipeline, one stage after another.
 *
 *   load (frontend/onnx_load.c) -> verify -> shapes + folding (ir/shapes.c)
 *   -> prune -> verify -> training graph (autodiff/train.c) -> verify
 *   -> plan (plan/plan.c) -> codegen (codegen/cg_module.c) -> link
 *
 * Each stage's header says what it requires and provides. */
#ifndef CLEAVE_DRIVER_H
#define CLEAVE_DRIVER_H

#include "autodiff/train.h"
#include "ir/ir.h"

typedef struct DriverOptions {
    const char *model;
    int64_t batch;       /* 0: leave the batch dimension symbolic */
    bool require_supported; /* unsupported ops are an error */
} DriverOptions;

/* Runs the front end; NULL with a Diag on failure. */
Graph *driver_front_end(const DriverOptions *opt, Diag *d);
typedef struct CompileOptions {
    const char *model, *output, *emit, *plan_out, *target_cpu;
    const char *strategy; /* "single", "dp", "layer", "pipeline", "hybrid" or "auto" */
    int64_t batch, ranks;
    /* --threads: threads per rank for the large matrix products (0: 1);
     * the results are the same bits for any value (docs/perf.md) */
    int64_t threads;
    double bucket_mb;
    /* layer, pipeline, hybrid: micro-batches (0: default), schedule (NULL:
     * gpipe), the first node of every stage after the first (n_cuts = 0:
     * balanced by FLOPs), data-parallel replicas and stages (0: derived
     * from the ranks) */
    int64_t microbatches, dp, pp;
    const char *schedule;
    const char *placement; /* "by_replica" (NULL: the default) or "by_stage": how (replica, stage) map to ranks */
    const char *const *cuts;
    int n_cuts;
    const char *cluster; /* --strategy auto: the cluster file (NULL: defaults) */
    bool balance_time;   /* stages balanced by predicted time on `cluster`, not FLOPs (--balance time) */
    /* --profile: the cost model times the model's own kernels here
     * (cost/profile.h); kernel_profile is the live cache, made by whoever
     * first needs it (driver_search, driver_predict, plan_report) */
    bool profile;
    struct KernelProfile *kernel_profile;
    TrainOptions train;
    bool verbose;
    bool no_fuse; /* --no-fuse: no element-wise chains fused (codegen/cg_fuse.h) */
    /* --plan FILE: the decisions above came from this plan file, whose
     * derived fields are checked against the plan they give (plan_file.h) */
    const struct PlanFile *plan_file;
} CompileOptions;

/* The whole pipeline: front end, training graph, plan, codegen, link.
 * Strategy "auto" compiles the plan driver_choose picks. */
bool driver_compile(const CompileOptions *o, Diag *d);

struct Plan;
/* The front end, training graph and plan of o, without code generation:
 * *g (free with graph_free) holds what the plan points to. */
bool driver_build_plan(const CompileOptions *o, Graph **g, TrainGraph *t, struct Plan *p, Diag *d);

/* ---- choosing a plan (search.c) ---- */

/* One way to run o on o->ranks ranks, and what the cost model predicts. */
typedef struct Candidate {
    char strategy[16];   /* single, dp, layer, pipeline, hybrid */
    int dp, stages, microbatches;
    char schedule[8];    /* layer, gpipe, 1f1b; "" without stages */
    bool by_stage;       /* hybrid: placement by_stage (a stage's replicas on consecutive ranks) */
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
} Candidate;

typedef struct Search {
    int n;
    Candidate *c;        /* fastest feasible first, then the infeasible */
    int best;            /* 0, or -1 when none is feasible */
    char cluster[1100];  /* which cluster description was used, for people */
    int64_t memory_per_rank;
} Search;

/* Plans every strategy, factorisation D x P = o->ranks, micro-batch count
 * and schedule that applies to o, simulates each on the cluster
 * (o->cluster, or this machine's calibration or the stated defaults when NULL) and orders them. */
bool driver_search(const CompileOptions *o, Search *s, Diag *d);
void search_free(Search *s);
/* The prediction for o's own strategy alone (one candidate). */
bool driver_predict(const CompileOptions *o, Search *s, Diag *d);
/* o set up to compile candidate c (strings static, not the search's). */
void search_options(const CompileOptions *o, const Candidate *c, CompileOptions *x);
/* o with the strategy of the search's best candidate, for --strategy auto
 * (o->cluster names the cluster file, may be NULL). */
bool driver_choose(const CompileOptions *o, CompileOptions *chosen, Diag *d);

/* The program description the runtime reads (runtime/rt_abi.h),
 * malloc'd JSON text; NULL when out of memory (program_meta.c). */
char *program_meta(const struct Plan *p, const CompileOptions *o);

/* Fails naming the first node whose op is unsupported. */
bool driver_check_supported(Graph *g, Diag *d);

#endif
