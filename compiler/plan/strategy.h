/* strategy.h - how the ranks share a training step, as one value.
 *
 * The command line (cli/cmd_compile.c) and plan files (plan_file.c) parse
 * a strategy name once; everything below works on the enum, and plans,
 * program metadata and reports print it by name again.  "auto" is not a
 * strategy but a request to search for one (search.h), so it is not here. */
#ifndef CLEAVE_STRATEGY_H
#define CLEAVE_STRATEGY_H

#include <stdbool.h>

/* In the order of strategy_names (strategy.c). */
typedef enum {
    STRATEGY_SINGLE,   /* one rank */
    STRATEGY_DP,       /* N replicas of the whole model */
    STRATEGY_LAYER,    /* N stages, the whole batch through them in turn */
    STRATEGY_PIPELINE, /* N stages fed with micro-batches */
    STRATEGY_HYBRID,   /* D replicas of a P-stage pipeline */
    STRATEGY_FORWARD,  /* inference: the forward graph alone on one rank (plan_forward) */
} Strategy;

/* "single", "dp", "layer", "pipeline", "hybrid" or "forward". */
const char *strategy_name(Strategy s);
/* One of the five training strategies by name; false for anything else
 * ("forward" included: no user input names it). */
bool strategy_parse(const char *name, Strategy *out);
/* Layer, pipeline and hybrid: the model is cut into stages. */
bool strategy_staged(Strategy s);

#endif
