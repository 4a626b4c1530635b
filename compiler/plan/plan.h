/* plan.h - what each rank runs, in which order, and where every tensor
 * lives.
 *
 * Requires: the training graph (autodiff/train.h).  Provides: per rank the
 * ordered steps of a training step and of an eval step, and a memory plan:
 * one arena per program, with a persistent region (parameters, constants,
 * optimizer state, inputs, runtime scalars) copied from the program's
 * initial image, and a transient region where intermediate tensors share
 * bytes when their lifetimes do not overlap.  Single-process compilation is
 * the plan with one rank; codegen reads only plans. */
#ifndef CLEAVE_PLAN_H
#define CLEAVE_PLAN_H

#include "../autodiff/train.h"
#include "../ir/ir.h"

#define PLAN_ALIGN 64

typedef enum {
    STEP_COMPUTE = 0,
    STEP_ALLREDUCE_START, /* non-blocking sum of a bucket over the replicas */
    STEP_ALLREDUCE_WAIT,  /* completes a bucket's allreduce */
} StepKind;

typedef struct PlanStep {
    StepKind kind;
    Node *node; /* STEP_COMPUTE */
    int bucket; /* allreduce steps */
} PlanStep;

/* Gradients reduced together, laid out contiguously in the persistent
 * region so one in-place collective covers them. */
typedef struct Bucket {
    int n;
    Value **grads;
    int64_t offset, bytes;
} Bucket;

typedef struct RankPlan {
    int rank;
    int n_train, n_eval;
    PlanStep *train; /* forward, loss, backward, optimizer */
    PlanStep *eval;  /* forward and loss */
    /* memory plan: byte offset of each value id, -1 when it has no buffer */
    int64_t *offset;
    int64_t init_bytes;  /* persistent region, copied from the image */
    int64_t arena_bytes; /* persistent + transient */
    int64_t transient_naive; /* bytes without reuse, for the report */
    int inplace;             /* outputs that took their input's buffer */
    int n_buckets;
    Bucket *buckets;
} RankPlan;

typedef struct Plan {
    Graph *g;
    const TrainGraph *t;
    const char *strategy;
    int64_t batch;       /* global batch */
    int64_t local_batch; /* rows each rank computes per step */
    int n_ranks;
    int replicas;        /* data-parallel replicas (1: none) */
    double bucket_mb;
    RankPlan *ranks;
} Plan;

bool plan_single(Graph *g, const TrainGraph *t, int64_t batch, Plan *p, Diag *d);
/* Data parallelism: `replicas` ranks run the same step on batch/replicas
 * rows each (g is built at that local batch); gradients are summed in
 * buckets of about bucket_mb MiB, each started as soon as the backward pass
 * has produced it and awaited before its first optimizer update. */
bool plan_dp(Graph *g, const TrainGraph *t, int64_t batch, int replicas, double bucket_mb, Plan *p, Diag *d);
/* Inference only: every node of g in topological order (its eval and train
 * sequences are the same); graph outputs stay live to the end. */
bool plan_forward(Graph *g, Plan *p, Diag *d);
/* Buffer bytes of a value at run time (float32 for every float type). */
int64_t plan_value_bytes(const Value *v);
/* JSON text of the plan (malloc'd); see docs/plan.md. */
char *plan_to_json(const Plan *p, const TrainOptions *o);

#endif
