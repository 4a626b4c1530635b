/* compile_options.c - strategy flags into a layout (compile_options.h). */
#include "compile_options.h"

#include <string.h>

/* Default micro-batches for --strategy pipeline: 4 per stage (enough to
 * bring GPipe's bubble (P-1)/(M+P-1) under 20%), or the most below that
 * which divide each replica's rows. */
static int default_microbatches(int64_t rows, int stages) {
    int m = 4 * stages;
    while (m > 1 && rows % m) m--;
    return m;
}

/* single and dp: no stage flags, and dp's batch divides among the ranks. */
static bool flat_layout(const CompileOptions *o, int64_t ranks, Layout *l, Diag *d) {
    bool dp = o->strategy == STRATEGY_DP;
    if (o->microbatches || o->schedule || o->n_cuts || o->dp || o->pp)
        return diag_error(d, DIAG_USAGE, "--microbatches, --schedule, --stages, --dp and --pp need --strategy "
                          "layer, pipeline or hybrid");
    if (ranks > 1 && !dp)
        return diag_error(d, DIAG_USAGE, "--ranks %lld needs a --strategy (dp, layer, pipeline or hybrid)",
                          (long long)ranks);
    if (dp && o->batch % ranks)
        return diag_error(d, DIAG_USAGE, "--batch %lld does not divide among --ranks %lld", (long long)o->batch,
                          (long long)ranks);
    if (dp) l->replicas = (int)ranks;
    return true;
}

/* Replicas and stages of a staged strategy: hybrid's --dp x --pp make the
 * ranks; layer and pipeline have one stage per rank. */
static bool staged_shape(const CompileOptions *o, int64_t ranks, Layout *l, Diag *d) {
    if (o->strategy != STRATEGY_HYBRID) {
        if (o->dp && o->dp != 1) return diag_error(d, DIAG_USAGE, "--dp needs --strategy hybrid");
        if (o->pp && o->pp != ranks)
            return diag_error(d, DIAG_USAGE, "--pp %lld differs from --ranks %lld (use --strategy hybrid to combine "
                              "them with data parallelism)", (long long)o->pp, (long long)ranks);
        l->stages = (int)ranks;
        return true;
    }
    if (!o->dp && !o->pp) return diag_error(d, DIAG_USAGE, "--strategy hybrid needs --dp D and --pp P (ranks = D x P)");
    int64_t D = o->dp, P = o->pp;
    if (!D) D = ranks % P ? 0 : ranks / P;
    if (!P) P = ranks % D ? 0 : ranks / D;
    if (!D || !P || (o->ranks > 1 && D * P != o->ranks))
        return diag_error(d, DIAG_USAGE, "--dp %lld x --pp %lld does not make --ranks %lld", (long long)o->dp,
                          (long long)o->pp, (long long)ranks);
    l->replicas = (int)D;
    l->stages = (int)P;
    return true;
}

/* Micro-batches, schedule and cuts of a staged strategy. */
static bool staged_layout(const CompileOptions *o, int64_t ranks, Layout *l, Diag *d) {
    bool layer = o->strategy == STRATEGY_LAYER;
    if (!staged_shape(o, ranks, l, d)) return false;
    if (layer && o->microbatches > 1)
        return diag_error(d, DIAG_USAGE, "--strategy layer runs the whole batch through the stages at once; use "
                          "--strategy pipeline for %lld micro-batches", (long long)o->microbatches);
    if (layer && o->schedule && strcmp(o->schedule, "layer"))
        return diag_error(d, DIAG_USAGE, "--schedule %s needs --strategy pipeline or hybrid", o->schedule);
    if (o->batch % l->replicas)
        return diag_error(d, DIAG_USAGE, "--batch %lld does not divide among %d replicas", (long long)o->batch,
                          l->replicas);
    l->microbatches = layer ? 1 : o->microbatches ? (int)o->microbatches
                                                  : default_microbatches(o->batch / l->replicas, l->stages);
    if ((o->batch / l->replicas) % l->microbatches)
        return diag_error(d, DIAG_USAGE, "--microbatches %d does not divide the %lld rows of %s", l->microbatches,
                          (long long)(o->batch / l->replicas), l->replicas > 1 ? "each replica's batch" : "--batch");
    const char *schedule = layer ? "layer" : o->schedule ? o->schedule : "gpipe";
    if (!schedule_parse(schedule, &l->schedule, d)) return false;
    if (o->n_cuts && o->n_cuts != l->stages - 1)
        return diag_error(d, DIAG_USAGE, "--stages names %d node%s; %d stages need %d (the first node of every "
                          "stage after the first)", o->n_cuts, o->n_cuts == 1 ? "" : "s", l->stages, l->stages - 1);
    l->cuts = o->cuts;
    l->n_cuts = o->n_cuts;
    if (o->placement && strcmp(o->placement, "by_stage") == 0) l->placement = PLACE_BY_STAGE;
    return true;
}

/* --accumulate K: the batches of a step are K times the micro-batches, so
 * that the planner's gradient sums over micro-batches accumulate them.
 * single and dp run their one stage 1F1B, a batch's forward and backward
 * before the next one's, which keeps one batch of activations, as a
 * PyTorch loop of K backward() calls before step() does. */
static bool accumulate_layout(const CompileOptions *o, Layout *l, Diag *d) {
    if (o->train.accumulate <= 1) return true;
    if (o->strategy == STRATEGY_LAYER)
        return diag_error(d, DIAG_USAGE, "--accumulate runs K batches through the stages one after another; use "
                          "--strategy pipeline (or single, dp, hybrid), not layer");
    if ((int64_t)l->microbatches * o->train.accumulate > (1 << 20))
        return diag_error(d, DIAG_USAGE, "--accumulate %lld x %d micro-batches is too many", (long long)o->train.accumulate,
                          l->microbatches);
    l->microbatches *= (int)o->train.accumulate;
    if (!strategy_staged(o->strategy)) l->schedule = SCHED_1F1B;
    return true;
}

bool compile_options_layout(const CompileOptions *o, Layout *l, Diag *d) {
    int64_t ranks = o->ranks > 0 ? o->ranks : 1;
    /* balance_time is set whatever the strategy: with --profile it makes
     * `cleave compile` price the layout first (cmd_compile.c) */
    *l = (Layout){.strategy = o->strategy, .replicas = 1, .stages = 1, .microbatches = 1, .schedule = SCHED_LAYER,
                  .placement = PLACE_BY_REPLICA, .balance_time = o->balance_time && o->n_cuts == 0};
    if (o->placement && o->strategy != STRATEGY_HYBRID && strcmp(o->placement, "by_replica"))
        return diag_error(d, DIAG_USAGE, "--placement %s needs --strategy hybrid (with one replica or one stage the "
                          "placements are the same)", o->placement);
    if (!(strategy_staged(o->strategy) ? staged_layout(o, ranks, l, d) : flat_layout(o, ranks, l, d))) return false;
    if (o->allreduce_node > 0 && l->replicas < 2)
        return diag_error(d, DIAG_USAGE, "--allreduce hierarchical:%lld sums gradients over replicas; %s has none "
                          "(use --strategy dp or hybrid)", (long long)o->allreduce_node, strategy_name(o->strategy));
    l->allreduce_node = (int)o->allreduce_node;
    return accumulate_layout(o, l, d);
}
