/* train.h - the training graph: loss, reverse-mode gradients, optimizer.
 *
 * Requires: a graph after shape inference with the batch bound, every op
 * supported.  Provides: loss nodes (PHASE_LOSS), gradient nodes
 * (PHASE_BACKWARD) built from each op's gradient rule, one optimizer update
 * node per trainable parameter (PHASE_OPTIMIZER), and the runtime scalars
 * the program reads (learning rate, step count). */
#ifndef CLEAVE_TRAIN_H
#define CLEAVE_TRAIN_H

#include "../ir/ir.h"

typedef enum { LOSS_CE, LOSS_MSE, LOSS_MODEL } LossKind;
typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAMW } OptKind;
/* How the learning rate moves over a run (the runtime computes it before
 * each step, docs/cli.md "Learning-rate schedules"); the graph only reads
 * the lr slot. */
typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE } LrSchedule;

typedef struct TrainOptions {
    LossKind loss;
    OptKind optimizer;
    float lr, momentum, weight_decay, beta1, beta2, eps;
    bool nesterov;
    int n_freeze;
    const char *const *freeze; /* initializer names kept fixed */
    /* --no-decay: weight decay stays off the parameters whose names match
     * one of these patterns (train_name_matches); each must match one. */
    int n_no_decay;
    const char *const *no_decay;
    /* --clip-grad-norm: the gradients are scaled so that their global
     * 2-norm is at most this, as torch.nn.utils.clip_grad_norm_ (0: off). */
    float clip_grad_norm;
    /* The schedule the program applies by default (its own flags override);
     * the graph does not depend on it.  lr_schedule_set: --lr-schedule was
     * given (the program then accepts --warmup-steps alone); warmup_steps
     * 0: none. */
    LrSchedule lr_schedule;
    bool lr_schedule_set;
    int64_t warmup_steps;
    /* Data parallelism: the loss gradient is seeded with 1/replicas so that
     * summing the replicas' gradients averages them; each parameter's
     * gradient gets a buffer of its own that an allreduce may update in
     * place. */
    int replicas;
    /* Layout the graph trains under: batch statistics (BatchNormalization's
     * training form) cover the rows of stat_replicas data-parallel replicas
     * (1: each replica's own, as PyTorch DDP); microbatches per step. */
    int stat_replicas, microbatches;
    /* --bn-stats local: each replica normalises with its own rows'
     * statistics, as PyTorch DDP without SyncBatchNorm (the driver then
     * gives stat_replicas 1) */
    bool bn_local;
    /* --loss ce: labels equal to this count for nothing (torch's -100) */
    int64_t ignore_index;
    /* --accumulate K: each optimizer step sums the gradients of K batches
     * (0 or 1: one).  The layout runs K times the micro-batches
     * (compile_options.c), so the graph itself does not change. */
    int64_t accumulate;
} TrainOptions;

typedef struct TrainGraph {
    Value *loss;   /* float32 scalar */
    Value *output; /* the model's first output */
    Value *labels; /* added input, NULL for LOSS_MODEL */
    Value *lr, *step;
    /* --loss ce: the float scalar the runtime sets before each step, the
     * number of labels of the global batch that count (not ignore_index)
     * divided by the shares of the batch (replicas x micro-batches) */
    Value *label_count;
    /* For dropout masks, made by the first rule that asks
     * (train_positions, train_seed): int64 [rows] input holding each row's
     * position in the global batch, filled by the runtime, and the int64
     * scalar --seed.  NULL when nothing draws a mask. */
    Value *positions, *seed;
    int n_batch_stats; /* BatchNormalization nodes trained on batch statistics */
    int n_params;
    Value **params; /* float initializers read as weights, and those updated
                       in place as state (running statistics) */
    Value **grads;  /* gradient per param, NULL if frozen or unused */
    /* The optimizer's state (momentum buffers, Adam's moments): values
     * named PARAM.SLOT, each with the index of its parameter in params.
     * Checkpoints save and restore them by name. */
    int n_state;
    Value **state;
    int *state_param;
} TrainGraph;

bool train_build(Graph *g, const TrainOptions *o, TrainGraph *t, Diag *d);
/* The positions input and the seed of c->train, made on first use. */
struct GradCtx;
Value *train_positions(struct GradCtx *c);
Value *train_seed(struct GradCtx *c);
const char *loss_kind_name(LossKind k);
const char *optimizer_name(OptKind k);
bool optimizer_parse(const char *name, OptKind *k);
const char *lr_schedule_name(LrSchedule s);
bool lr_schedule_parse(const char *name, LrSchedule *s);
/* --no-decay's match: `pattern` occurs in `name`, where each '*' of the
 * pattern stands for any run of characters (so "bias" matches "fc1.bias"
 * and "ln*.weight" matches "ln_f.weight"). */
bool train_name_matches(const char *pattern, const char *name);

#endif
