/* strategy.c - strategy names (strategy.h). */
#include "strategy.h"

#include <string.h>

/* Indexed by Strategy: keep in the order of the enum (strategy.h). */
static const char *const strategy_names[] = {"single", "dp", "layer", "pipeline", "hybrid", "forward"};

const char *strategy_name(Strategy s) {
    return (unsigned)s < sizeof strategy_names / sizeof *strategy_names ? strategy_names[s] : "?";
}

bool strategy_parse(const char *name, Strategy *out) {
    for (Strategy s = STRATEGY_SINGLE; s <= STRATEGY_HYBRID; s++)
        if (name && strcmp(name, strategy_names[s]) == 0) {
            *out = s;
            return true;
        }
    return false;
}

bool strategy_staged(Strategy s) {
    return s == STRATEGY_LAYER || s == STRATEGY_PIPELINE || s == STRATEGY_HYBRID;
}
