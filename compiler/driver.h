/* driver.h - the compiler pipeline, one stage after another.
 *
 *   load (frontend/onnx_load.c) -> verify -> shapes + folding (ir/shapes.c)
 *   -> prune -> verify -> training graph (autodiff/train.c) -> verify
 *   -> plan (plan/pipeline.c) -> codegen (codegen/cg_module.c) -> link
 *
 * Each stage's header says what it requires and provides.  The driver
 * takes a layout that is already decided and checked: the command line
 * checks flags (cli/compile_options.h) and the search chooses among
 * layouts (search.h), which plans each through driver_build_plan. */
#ifndef CLEAVE_DRIVER_H
#define CLEAVE_DRIVER_H

#include "autodiff/train.h"
#include "cost/profile.h"
#include "ir/ir.h"
#include "plan/pipeline.h"
#include "plan/strategy.h"

typedef struct DriverOptions {
    const char *model;
    int64_t batch;       /* 0: leave the batch dimension symbolic */
    bool require_supported; /* unsupported ops are an error */
} DriverOptions;

/* Runs the front end; NULL with a Diag on failure. */
Graph *driver_front_end(const DriverOptions *opt, Diag *d);
typedef struct CompileOptions {
    const char *model, *output, *emit, *plan_out, *target_cpu;
    Strategy strategy;  /* --strategy, unless strategy_auto */
    bool strategy_auto; /* --strategy auto: the search picks the layout (search.h) */
    int64_t batch, ranks;
    /* --threads: threads per rank for the large matrix products (0: 1);
     * the results are the same bits for any value (docs/perf.md) */
    int64_t threads;
    double bucket_mb;
    /* --allreduce hierarchical:K (0: flat): gradient buckets summed within
     * nodes of K ranks first (Plan.allreduce_node) */
    int64_t allreduce_node;
    /* The flags of layer, pipeline, hybrid, as given: micro-batches (0:
     * default), schedule (NULL: gpipe), the first node of every stage after
     * the first (n_cuts = 0: balanced by FLOPs), data-parallel replicas and
     * stages (0: derived from the ranks).  cli/compile_options.h checks
     * them and turns them into a Layout. */
    int64_t microbatches, dp, pp;
    const char *schedule;
    const char *placement; /* "by_replica" (NULL: the default) or "by_stage": how (replica, stage) map to ranks */
    const char *const *cuts;
    int n_cuts;
    const char *cluster; /* --strategy auto, --balance time: the cluster file (NULL: defaults) */
    bool balance_time;   /* stages balanced by predicted time on `cluster`, not FLOPs (--balance time) */
    /* --profile: the cost model times the model's own kernels here
     * (cost/profile.h), in a profile the search owns (search.h) */
    bool profile;
    TrainOptions train;
    bool verbose;
    bool no_fuse; /* --no-fuse: no element-wise chains fused (codegen/cg_fuse.h) */
    /* --plan FILE: the decisions above came from this plan file, whose
     * derived fields are checked against the plan they give (plan_file.h) */
    const struct PlanFile *plan_file;
} CompileOptions;

/* The rows one optimizer step trains on: batch x train.accumulate. */
int64_t compile_step_batch(const CompileOptions *o);

/* How the ranks split the work: D replicas x P stages on D x P ranks, each
 * replica's batch in M micro-batches.  The command line gives one
 * (cli/compile_options.h); the search enumerates them (search.h). */
typedef struct Layout {
    Strategy strategy;
    int replicas, stages, microbatches; /* D, P, M */
    SchedKind schedule;                 /* staged strategies; SCHED_LAYER otherwise */
    Placement placement;
    /* Plan.allreduce_node: 0 flat, K hierarchical over nodes of K ranks
     * (only with replicas) */
    int allreduce_node;
    /* Staged strategies: stage k + 1 begins at node cuts[k] (n_cuts =
     * stages - 1), or with n_cuts 0 the stages are balanced by FLOPs or,
     * with balance_time, by the predicted time of their nodes on the
     * cluster (cost/cluster_stages.h). */
    const char *const *cuts;
    int n_cuts;
    bool balance_time;
} Layout;

/* The whole pipeline for layout l: front end, training graph, plan,
 * codegen, link.  profile (NULL: none) prices the nodes when the stages
 * are balanced by time. */
bool driver_compile(const CompileOptions *o, const Layout *l, KernelProfile *profile, Diag *d);

struct Plan;
/* The front end, training graph and plan of o in layout l, without code
 * generation: *g (free with graph_free) holds what the plan points to. */
bool driver_build_plan(const CompileOptions *o, const Layout *l, KernelProfile *profile, Graph **g, TrainGraph *t,
                       struct Plan *p, Diag *d);

/* The program description the runtime reads (runtime/rt_abi.h),
 * malloc'd JSON text; NULL when out of memory (program_meta.c). */
char *program_meta(const struct Plan *p, const CompileOptions *o);

/* Fails naming the first node whose op is unsupported. */
bool driver_check_supported(Graph *g, Diag *d);

#endif
