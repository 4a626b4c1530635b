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
typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM } OptKind;

typedef struct TrainOptions {
    LossKind loss;
    OptKind optimizer;
    float lr, momentum, weight_decay, beta1, beta2, eps;
    bool nesterov;
    int n_freeze;
    const char *const *freeze; /* initializer names kept fixed */
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
} TrainGraph;

bool train_build(Graph *g, const TrainOptions *o, TrainGraph *t, Diag *d);
/* The positions input and the seed of c->train, made on first use. */
struct GradCtx;
Value *train_positions(struct GradCtx *c);
Value *train_seed(struct GradCtx *c);
const char *loss_kind_name(LossKind k);

#endif
