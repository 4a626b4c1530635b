/* compile_options.h - the strategy flags of `cleave compile` and `cleave
 * plan` (or of a plan file, plan_file.h) checked together and turned into
 * the layout the driver plans (driver.h).
 *
 * Which flags go with which strategy, whether the batch divides among the
 * replicas and micro-batches, and the defaults (micro-batches, schedule,
 * stages from the ranks) are decided here, once; the driver and the
 * search take a Layout that is already consistent. */
#ifndef CLEAVE_COMPILE_OPTIONS_H
#define CLEAVE_COMPILE_OPTIONS_H

#include "../driver.h"

/* o's own layout (o->strategy_auto false); a usage Diag naming the flags
 * at fault otherwise. */
bool compile_options_layout(const CompileOptions *o, Layout *l, Diag *d);

#endif
