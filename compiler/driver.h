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
    const char *strategy; /* "single", "dp", "layer", "pipeline" or "hybrid" */
    int64_t batch, ranks;
    double bucket_mb;
    /* layer, pipeline, hybrid: micro-batches (0: default), schedule (NULL:
     * gpipe), the first node of every stage after the first (n_cuts = 0:
     * balanced by FLOPs), data-parallel replicas and stages (0: derived
     * from the ranks) */
    int64_t microbatches, dp, pp;
    const char *schedule;
    const char *const *cuts;
    int n_cuts;
    TrainOptions train;
    bool verbose;
} CompileOptions;

/* The whole pipeline: front end, training graph, plan, codegen, link. */
bool driver_compile(const CompileOptions *o, Diag *d);

/* The program description the runtime reads (runtime/rt_abi.h),
 * malloc'd JSON text; NULL when out of memory (program_meta.c). */
struct Plan;
char *program_meta(const struct Plan *p, const CompileOptions *o);

/* Fails naming the first node whose op is unsupported. */
bool driver_check_supported(Graph *g, Diag *d);

#endif
