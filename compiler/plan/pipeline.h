/* pipeline.h - the planner of every plan, D replicas x P stages x M
 * micro-batches (plan.h): stages, micro-batch schedules, per-rank plans
 * with point-to-point transfers and collectives over replicas, and the
 * static check that every plan's communication matches up across ranks.
 * Single and dp plans are its P = 1, M = 1 case (plan.c).
 *
 * Requires: the training graph (autodiff/train.h), built at the
 * micro-batch size batch / (dp * M),
 * with TrainOptions.replicas = dp * M so that the loss gradient is seeded
 * with 1 / (dp * M) and the gradients summed over micro-batches and
 * replicas are those of the global batch's mean loss.
 *
 * Stages.  The forward nodes, in the order of the model file when that
 * order is topological (ONNX requires it) and otherwise the topological
 * order closest to it, are split into P contiguous non-empty stages.  Any
 * other node of the training graph goes with the forward node it serves
 * (Node.origin); loss nodes, and what serves them, go to the last stage.
 *
 * Ranks.  Rank replica * P + stage runs `stage` of data-parallel
 * `replica`; transfers stay inside a replica.
 *
 * A rank's training step (RankPlan.train) is its units in schedule order;
 * in the forward unit of micro-batch m it runs its stage's forward and loss
 * nodes for m, in the backward unit its backward nodes for m.  Every value
 * read on a stage other than its producer's is sent once to each consuming
 * stage, directly (a skip connection from stage 0 to stage 2 is not relayed
 * through stage 1): a SEND follows the step that computes it and a RECV
 * precedes the first step of the consuming stage that reads it for that
 * micro-batch.  With M > 1 each parameter gradient (or stage's share of
 * one, below) computed on the stage is added into its accumulator after
 * each micro-batch (STEP_ACCUMULATE).
 * Then, once per global batch (micro -1), for a weight read on several
 * stages (tied weights) and otherwise as applies:
 *   - each stage's contributions to a gradient that sums contributions
 *     from several stages are accumulated over the micro-batches and sent,
 *     once, to the stage computing the total (XFER_GRAD_SUM), which runs
 *     the Add nodes summing them then, not per micro-batch (the same sum,
 *     by linearity, with one message per step instead of one per
 *     micro-batch);
 *   - with dp > 1, the sum of each gradient the stage computes over the
 *     stage's replicas (Plan.groups[stage]): bucketed and started during
 *     the last backward (plan_hybrid), or STEP_ALLREDUCE for the sums
 *     run once per step;
 *   - the total is sent to every other stage reading the weight
 *     (XFER_GRAD_SUM), and each of them runs the weight's optimizer update
 *     too, so the copies stay identical;
 *   - the nodes adding into a sum over the stages (OpDef.stage_sums:
 *     gradient clipping's sum of squares), each on the stage where its
 *     gradient is final, and with P > 1 that sum over the stages of the
 *     replica (STEP_ALLREDUCE over Plan.groups[P + replica]); the nodes
 *     reading it (the clipping factor) run on every stage;
 *   - the optimizer updates.
 * The eval step (RankPlan.eval) is the forward units alone, with the
 * transfers forward and loss nodes read.
 *
 * What codegen and the runtime must implement for these steps:
 *   - one program per stage (replicas of a stage run the same one); the
 *     graph inputs a rank holds (RankPlan.holds) are the ones the runtime
 *     feeds it: rows [replica * B/dp + m * B/(dp*M), +B/(dp*M)) for
 *     micro-batch m;
 *   - an instance of every intermediate per micro-batch (at most
 *     RankPlan.max_inflight micro-batches hold activations at once);
 *     parameters, state and gradient accumulators once;
 *   - SEND: MPI_Isend of the value's micro-batch instance; the buffer must
 *     not be reused before the request completes (at the next
 *     STEP_SEND_WAIT, which completes every send posted so far, or at the
 *     end of the step).  RECV: MPI_Irecv may be posted
 *     as early as the buffer is free, and must be complete before the next
 *     step.  Tags are below Plan.tag_bound, to check against MPI_TAG_UB;
 *   - STEP_ACCUMULATE: acc = value for micro-batch 0, acc += value after;
 *     a step with micro -1 reads a value's accumulator when the value has
 *     STEP_ACCUMULATE steps, and otherwise its one instance (computed or
 *     received at micro -1, or of micro-batch 0 when M = 1);
 *   - the loss is on the last stage's ranks, one per micro-batch (the
 *     step's loss is their mean); RankPlan.holds says where the output is.
 *
 * Sends complete (STEP_SEND_WAIT) as early as the receiver's order
 * allows without waiting on the sender's own later work: in the train
 * step, an activation of micro-batch m before the sender's backward of m,
 * a gradient of m before its backward of m + 1; in the eval step, an
 * activation of m before the forward of m + 1; the rest at the end of the
 * step.  So a send's buffer is held about as long as the activations
 * themselves, and 1F1B's bound on live activations also bounds the
 * buffers in flight.  comm_check confirms for every plan that no wait
 * can deadlock.
 *
 * Memory.  Every rank has its own arena (RankPlan.inst, see plan.h, and
 * pipeline_memplan below): a persistent region of the inputs,
 * parameters, constants, state and gradient accumulators it holds and
 * the loss and outputs it computes (inputs, loss and outputs with one
 * instance per micro-batch, back to back), then a transient region where
 * the instances of every (value, micro-batch) it computes or receives
 * share bytes when their lifetimes over the unrolled train sequence do
 * not overlap.  A SEND's buffer stays untouched until the STEP_SEND_WAIT
 * after it (or the end of the step, where the runtime completes every
 * request); a RECV's buffer is free only from
 * the RECV step on, so MPI_Irecv cannot be posted earlier than that step.
 * The eval step uses the same placement. */
#ifndef CLEAVE_PIPELINE_H
#define CLEAVE_PIPELINE_H

#include "plan.h"

/* ---- stages (stages.c) ---- */

typedef struct StageSplit {
    int n_stages;
    int n_fwd;
    Node **order;  /* forward nodes in split order */
    int *begin;    /* n_stages + 1 entries: stage s is order[begin[s] .. begin[s+1]) */
    double *flops; /* per stage: FLOPs of every node it runs for one micro-batch */
} StageSplit;

/* What a node weighs when stages are balanced: its predicted seconds
 * (cost/simulate.h) when node_seconds is set, else its FLOPs.  With
 * boundary_link set as well, stages also pay for the values crossing
 * their boundaries and must fit memory_limit (stages_balance_costs). */
typedef struct StageWeight {
    double (*node_seconds)(const Node *n, void *ctx);
    void *ctx;
    /* The link between stage j and j + 1: seconds per message and per byte. */
    void (*boundary_link)(int j, double *latency_s, double *sec_per_byte, void *ctx);
    double memory_limit;    /* bytes a stage's rank may hold; 0: no limit */
    double param_copies;    /* bytes held per parameter byte: weight, gradient, accumulator, optimizer state */
    const double *act_copies; /* per stage: micro-batches whose activations it keeps at once */
} StageWeight;

/* The split's costs, position by position in forward order (stages_dp.c).
 * cut_bytes[x] and cut_values[x] (n + 1 entries) are the bytes and number
 * of values produced before position x and read from x on. */
typedef struct StageCosts {
    int n;
    const double *seconds;    /* compute of each position, per micro-batch */
    const double *cut_bytes, *cut_values;
    const double *latency, *sec_per_byte; /* per boundary, k - 1 entries */
    const double *param_bytes, *act_bytes; /* per position; NULL: none */
    double memory_limit, param_copies;
    const double *act_copies; /* per stage */
} StageCosts;
/* Splits into k non-empty stages minimising the costliest stage (its
 * compute plus, per micro-batch, the crossing values both ways at each of
 * its boundaries), then the sum of squared stage costs, among splits whose
 * stages fit memory_limit.  Returns 1 with begin (k + 1 entries) set, 0
 * when no split fits memory (begin: the best split ignoring memory), -1
 * when the graph is too large for this O(k n^2) search or out of memory. */
int stages_balance_costs(const StageCosts *c, int k, int *begin);

/* Splits the forward nodes into n_stages stages: at the user's cut points
 * when n_cuts > 0 (cuts[k] names the first node of stage k + 1, so there
 * are n_stages - 1 of them, in order), otherwise balanced: the most
 * expensive stage as cheap as possible, then the stages as even as
 * possible, weighing each forward node with the FLOPs of everything that
 * goes with it.  Arrays live in g's arena.  Fails with a Diag naming the
 * cut at fault: unknown node, not a forward node, out of order, a stage
 * left empty, or more stages than forward nodes. */
bool stages_split(Graph *g, int n_stages, const char *const *cuts, int n_cuts, StageSplit *s, Diag *d);
/* The same with weights (NULL: FLOPs). */
bool stages_split_weighted(Graph *g, int n_stages, const char *const *cuts, int n_cuts, const StageWeight *w,
                           StageSplit *s, Diag *d);
/* The same, as a stage per forward node: stage_of_node has g->n_nodes
 * entries, by node id; other nodes get -1.  The graph must not gain
 * forward nodes afterwards. */
bool stages_assign(Graph *g, int n_stages, const char *const *cuts, int n_cuts, int *stage_of_node, Diag *d);
/* The stage of any node of the training graph: forward nodes as
 * assigned, backward and optimizer nodes with the forward node they serve
 * (Node.origin, or for nodes the training graph adds without one, the
 * node producing what they read), loss nodes on the last stage. */
int stage_of(const Graph *g, const int *stage_of_node, const Node *n);
/* Forward nodes in split order (arena array; *count gets their number). */
Node **stages_forward_order(Graph *g, int *count, Diag *d);
/* Contiguous split of n weights (>= 0) into k non-empty parts minimising
 * the largest sum, then the sum of squared part sums (for graphs so large
 * that k * n * n > 5e7, the largest sum only); begin gets k + 1 entries.
 * False when k < 1 or k > n, or out of memory. */
bool stages_balance(const double *w, int n, int k, int *begin);

/* ---- schedules (schedule.c) ---- */

typedef enum { SCHED_LAYER, SCHED_GPIPE, SCHED_1F1B } SchedKind;

/* One unit of a stage's work: the forward or the backward of a micro-batch. */
typedef struct SchedUnit {
    bool backward;
    int micro;
} SchedUnit;

bool schedule_parse(const char *name, SchedKind *k, Diag *d);
const char *schedule_name(SchedKind k);
/* The 2 * M units of `stage` in execution order.  Layer and GPipe: every
 * forward, then every backward, in micro-batch order.  1F1B: P - stage - 1
 * forwards (at most M) to warm up, then one forward and one backward in
 * turn, then the remaining backwards. */
int schedule_units(SchedKind k, int n_stages, int stage, int microbatches, SchedUnit *out);
/* Checks an order: each micro-batch's forward once and before its
 * backward, both in micro-batch order, and at most M (GPipe) or
 * min(M, P - stage) (1F1B) micro-batches in flight; *max_inflight gets the
 * largest number in flight. */
bool schedule_check(SchedKind k, int n_stages, int stage, int microbatches, const SchedUnit *u, int n,
                    int *max_inflight, Diag *d);

/* ---- communication check (comm_check.c) ---- */

/* Walks the ranks' step sequences (walk.h: the runtime's semantics) and
 * fails on the first mismatch or potential deadlock, with one line naming
 * the ranks, step indices, peers, tags and sizes.  At the end every
 * message must have been received, and no two messages from one rank to
 * another may carry the same tag at once.  `what` prefixes the message
 * ("pipeline plan, train step"). */
bool comm_check(int n_ranks, const PlanStep *const *seq, const int *n_steps, const PlanGroup *groups, int n_groups,
                const char *what, Diag *d);
/* comm_check over a plan's train and eval sequences. */
bool comm_check_plan(const Plan *p, Diag *d);

/* ---- plans (pipeline.c) ---- */

/* Layer (schedule "layer", microbatches 1) and pipeline ("gpipe",
 * "1f1b") plans over n_stages ranks; batch is the global batch (0: not
 * bound).  The result passes comm_check_plan, or the call fails. */
bool plan_pipeline(Graph *g, const TrainGraph *t, int64_t batch, int n_stages, int microbatches,
                   const char *schedule, const char *const *cuts, int n_cuts, Plan *p, Diag *d);
/* Hybrid data x pipeline parallelism: dp replicas of the pipeline, over
 * dp * n_stages ranks; Plan.groups[s] holds the ranks running stage s.
 * Each stage's gradients (their accumulators, back to back) are summed
 * over its replicas in buckets of about bucket_mb MiB
 * (RankPlan.buckets): STEP_ALLREDUCE_START with `group` s follows the
 * last micro-batch's STEP_ACCUMULATE of the bucket's last gradient, and
 * STEP_ALLREDUCE_WAIT precedes the once-per-step work. */
bool plan_hybrid(Graph *g, const TrainGraph *t, int64_t batch, int dp, int n_stages, int microbatches,
                 const char *schedule, const char *const *cuts, int n_cuts, double bucket_mb, Plan *p, Diag *d);
/* The same with the stages balanced by `weight` (NULL: FLOPs). */
bool plan_hybrid_weighted(Graph *g, const TrainGraph *t, int64_t batch, int dp, int n_stages, int microbatches,
                          const char *schedule, const char *const *cuts, int n_cuts, double bucket_mb,
                          const StageWeight *weight, Placement placement, Plan *p, Diag *d);

/* ---- memory (memplan.c) ---- */

/* Plans the memory of rank rp of pipeline plan p from its train and eval
 * steps and RankPlan.holds: sets inst, offset, init_bytes, arena_bytes,
 * transient_naive, inplace, peak_act_bytes, peak_act_step and
 * send_pinned_bytes.  plan_pipeline and plan_hybrid call it for every
 * rank.  Fails when a value the rank holds has no static shape. */
bool pipeline_memplan(const Plan *p, RankPlan *rp, Diag *d);
/* Byte offset in rp's arena of the buffer through which a step of
 * micro-batch `micro` (-1: once per step) reads or writes v, or -1 when
 * the rank has none.  STEP_ACCUMULATE reads (v, micro) and adds into
 * (v, -1). */
int64_t pipeline_buffer(const Plan *p, const RankPlan *rp, const Value *v, int micro);

/* The unit of work a step of a staged plan belongs to: the forward or
 * backward of its micro-batch, or the once-per-step update (micro -1).
 * Traces attribute time by it, and a rank completes its sends whenever
 * its unit changes (STEP_SEND_WAIT). */
typedef enum { UNIT_FORWARD, UNIT_BACKWARD, UNIT_UPDATE } PlanUnit;
PlanUnit plan_step_unit(const Plan *p, const PlanStep *st);

/* Byte offset of program `program`'s initial image in the images of all
 * programs of p, back to back (one program per stage; each 64-aligned). */
int64_t plan_init_offset(const Plan *p, int program);

#endif
