/* plan_report.h - what `cleave plan` prints: the plan the cost model
 * chooses (or the one the flags name) with its predictions, and the
 * alternatives with why each lost. */
#ifndef CLEAVE_PLAN_REPORT_H
#define CLEAVE_PLAN_REPORT_H

#include "../search.h"

/* format "text" or "json"; returns the exit status. */
int plan_report(const CompileOptions *o, const char *format);

#endif
