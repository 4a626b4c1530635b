/* plan.h - what each rank runs, in which order, and where every tensor
 * lives.
 *
 * Requires: the training graph (autodiff/train.h).  Provides: per rank the
 * ordered steps of a training step and of an eval step, and a memory plan:
 * one arena per program, with a persistent region (parameters, constants,
 * optimizer state, inputs, runtime scalars) copied from the program's
 * initial image, and a transient region where intermediate tensors share
 * bytes when their lifetimes do not overlap.
 *
 * Every plan has one shape: D data-parallel replicas x P stages x M
 * micro-batches on D * P ranks (single is 1 x 1 x 1, dp D x 1 x 1, layer
 * 1 x P x 1), made by one planner (pipeline.c, see pipeline.h), with one
 * memory planner (memplan.c) and one JSON writer (plan_json.c).  A rank's
 * program is one sequence of steps: compute a node, send, receive, start
 * or wait a collective over a group of ranks, accumulate; a collective may
 * stand anywhere in it.  Codegen reads only plans. */
#ifndef CLEAVE_PLAN_H
#define CLEAVE_PLAN_H

#include "../autodiff/train.h"
#include "../ir/ir.h"
#include "strategy.h"

#define PLAN_ALIGN 64

typedef enum {
    STEP_COMPUTE = 0,
    STEP_ALLREDUCE_START, /* non-blocking sum of a bucket over the replicas */
    STEP_ALLREDUCE_WAIT,  /* completes a bucket's allreduce */
    STEP_SEND,       /* non-blocking send of `value` (micro-batch `micro`) to rank `peer` with `tag` */
    STEP_RECV,       /* receive `value` from rank `peer` with `tag`; complete before the next step */
    STEP_ACCUMULATE, /* add micro-batch `micro`'s gradient `value` into that gradient's accumulator */
    STEP_ALLREDUCE,  /* blocking in-place sum of `value` over the ranks of Plan.groups[group] */
    STEP_SEND_WAIT,  /* complete the send of `value` (micro-batch `micro`) to `peer` with `tag`; its buffer is free after */
} StepKind;

typedef struct PlanStep {
    StepKind kind;
    Node *node; /* STEP_COMPUTE */
    int bucket; /* allreduce steps */
    /* micro: the micro-batch a step works on, or -1 for
     * what runs once per global batch (optimizer updates, and the exchange
     * and reduction of accumulated gradients before them). */
    int micro;
    int peer;      /* STEP_SEND, STEP_RECV: the other rank */
    int tag;       /* STEP_SEND, STEP_RECV: unique per (micro-batch, tensor, direction) */
    int group;     /* STEP_ALLREDUCE: index in Plan.groups (a stage's replicas or a replica's stages) */
    int xfer;      /* STEP_SEND, STEP_RECV: index in Plan.xfers */
    Value *value;  /* STEP_SEND, STEP_RECV, STEP_ACCUMULATE, STEP_ALLREDUCE */
    int64_t bytes; /* STEP_SEND, STEP_RECV, STEP_ALLREDUCE */
} PlanStep;

/* Ranks taking part in a collective. */
typedef struct PlanGroup {
    int n;
    int *ranks;
} PlanGroup;

/* Direction of a value crossing pipeline stages. */
typedef enum {
    XFER_ACTIVATION = 0, /* forward or loss value, sent in its micro-batch's forward */
    XFER_GRADIENT,       /* backward value (gradient contribution), sent in its micro-batch's backward */
    XFER_GRAD_SUM,       /* a shared weight's gradient, summed over micro-batches, sent once per step */
} XferDir;

/* One value sent from one stage to another (between the ranks of the
 * same data-parallel replica).  Transfers of the same value and direction
 * share a channel; a step's tag is channel * (microbatches + 1) + micro + 1. */
typedef struct PlanXfer {
    Value *value;
    XferDir dir;
    int src_stage, dst_stage;
    int channel;
    bool eval; /* also needed by the eval step (a forward or loss node reads it) */
} PlanXfer;

/* RankPlan.holds: how a rank comes to hold a value (bit flags). */
enum {
    HOLD_PERSISTENT = 1, /* input, parameter, constant or state: its own copy */
    HOLD_COMPUTED = 2,   /* produced by the rank's own steps */
    HOLD_RECEIVED = 4,   /* received from another rank */
    HOLD_ACCUM = 8,      /* gradient accumulated over micro-batches */
};

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
    /* The stage and data-parallel replica this rank runs, the most
     * micro-batches whose activations it keeps at once, and by value id
     * the HOLD_* flags of every value it holds. */
    int stage, replica, max_inflight;
    unsigned char *holds;
    int n_held;
    /* Memory (memplan.c).  A value has an instance per micro-batch it is computed,
     * received or fed in, and one for micro -1 when it exists once per step
     * (parameter, constant, state, gradient accumulator, or computed or
     * received at micro -1).  inst[v * (Plan.microbatches + 1) + micro + 1]
     * is the byte offset of value id v's instance for `micro` (-1: none).
     * A step of micro-batch m uses v's instance for m; when there is none,
     * a step with m >= 0 uses the micro -1 instance, and a step with
     * m == -1 the micro-batch 0 instance (pipeline_buffer does this).
     * The instances of an input, and of the loss and outputs on the rank
     * computing them, are back to back in micro-batch order in the
     * persistent region [0, init_bytes); `offset` above then holds each
     * value's micro -1 instance, or its micro-batch 0 instance when it has
     * none.  peak_act_bytes: the most bytes of activations (instances of
     * forward and loss values) alive at once, each from the step defining
     * it to the last step reading it, reached first at train step
     * peak_act_step (-1: none).  send_pinned_bytes: bytes of the
     * instances the rank sends (each kept until its send completes). */
    int64_t *inst;
    int64_t peak_act_bytes;
    int peak_act_step;
    int64_t send_pinned_bytes;
} RankPlan;

/* How a staged plan's (replica, stage) pairs map to MPI ranks: by replica
 * (rank = replica * stages + stage: a replica's stages on consecutive
 * ranks, so pipeline neighbours share a node) or by stage (rank = stage *
 * replicas + replica: a stage's replicas together, so its allreduce stays
 * within a node).  The cost model tries both on multi-node clusters. */
typedef enum { PLACE_BY_REPLICA = 0, PLACE_BY_STAGE } Placement;

typedef struct Plan {
    Graph *g;
    const TrainGraph *t;
    Strategy strategy;
    int64_t batch;       /* global batch */
    int64_t local_batch; /* rows each rank computes per step */
    int n_ranks;
    int replicas;        /* data-parallel replicas (1: none) */
    double bucket_mb;
    /* How the gradient buckets are summed over a stage's replicas: 0, one
     * allreduce over them all (flat); K > 0, hierarchically over nodes of
     * K ranks (MPI rank r on node r / K, as cluster files number them):
     * reduced to one leader per node, allreduced among the leaders,
     * broadcast within each node.  A decision of the search or the user,
     * not of the planner: the steps are the same, the runtime and the cost
     * model read it. */
    int allreduce_node;
    /* Threads each rank runs its large matrix products on (--threads; 0
     * or 1: one).  A program option rather than a decision of the
     * planner: the driver sets it, codegen splits the products by it
     * (cg_gemm.c), and the plan file records it. */
    int threads;
    RankPlan *ranks;
    /* Stages (pipeline.h).  ranks[] is
     * indexed by MPI rank; plan_rank_of gives the rank of a (replica,
     * stage), and step peers and groups are MPI ranks. */
    Placement placement;
    int n_stages, microbatches;
    int64_t micro_batch;  /* rows per micro-batch */
    const char *schedule; /* "layer", "gpipe" or "1f1b" */
    int n_fwd;
    Node **fwd_order;     /* forward nodes in the order stages split */
    int *stage_begin;     /* stage s: fwd_order[stage_begin[s] .. stage_begin[s+1]) */
    double *stage_flops;  /* training FLOPs per stage (forward, loss, backward, optimizer) */
    int *node_stage;      /* by node id; optimizer updates of a shared weight run on more stages (see steps) */
    int n_xfers;
    PlanXfer *xfers;
    /* groups[s] for s < n_stages: the replicas of stage s; after them, in
     * plans with stages that sum over the stages (OpDef.stage_sums),
     * groups[n_stages + r]: the stages of replica r. */
    int n_groups;
    PlanGroup *groups;
    int tag_bound; /* every tag is below this */
} Plan;

/* One process (plan.c): 1 x 1 x 1. */
bool plan_single(Graph *g, const TrainGraph *t, int64_t batch, Plan *p, Diag *d);
/* Data parallelism, D x 1 x 1: `replicas` ranks run the same step on
 * batch/replicas rows each (g is built at that local batch); gradients are
 * summed in buckets of about bucket_mb MiB, each started as soon as the
 * backward pass has produced it and awaited before its first optimizer
 * update. */
bool plan_dp(Graph *g, const TrainGraph *t, int64_t batch, int replicas, double bucket_mb, Plan *p, Diag *d);
/* Inference only: every node of g in topological order (its eval and train
 * sequences are the same); graph outputs stay live to the end. */
bool plan_forward(Graph *g, Plan *p, Diag *d);
/* The MPI rank running `stage` of `replica`. */
int plan_rank_of(const Plan *p, int replica, int stage);
/* The plan of stage s's replica-0 rank: what that stage's program is
 * generated from. */
const RankPlan *plan_stage_rank(const Plan *p, int s);
const char *plan_placement_name(Placement pl);
/* Buffer bytes of a value at run time (float32 for every float type). */
int64_t plan_value_bytes(const Value *v);
/* The plan as JSON (plan_json.c, docs/plan.md): the same fields for every
 * plan; the optimizer and loss when o is set.  plan_json gives the jansson
 * object (NULL when out of memory), plan_to_json its text (malloc'd). */
struct json_t;
struct json_t *plan_json(const Plan *p, const TrainOptions *o);
char *plan_to_json(const Plan *p, const TrainOptions *o);
/* FNV-1a over the plan's JSON, the head and then each rank's entry, built
 * one at a time: what the ranks of a program compare at start-up. */
bool plan_hash(const Plan *p, const TrainOptions *o, uint64_t *hash);

#endif
