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
    const char *strategy; /* "single" or "dp" */
    int64_t batch, ranks;
    double bucket_mb;
    TrainOptions train;
    bool verbose;
} CompileOptions;

/* The whole pipeline: front end, training graph, plan, codegen, link. */
bool driver_compile(const CompileOptions *o, Diag *d);

/* Fails naming the first node whose op is unsupported. */
bool driver_check_supported(Graph *g, Diag *d);

#endif
