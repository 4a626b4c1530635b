/* rt_schedule.c - the learning-rate schedules: their names, as the
 * flags and the metadata spell them, and the factor of the base rate at
 * each step (docs/cli.md, "Learning-rate schedules").  Calls no other
 * runtime file: the command line, the metadata and the step loop all
 * read it. */
#include <math.h>
#include <string.h>

#include "rt.h"

static const char *const schedule_names[] = {"constant", "linear", "cosine"};

const char *rt_lr_schedule_name(RtLrSchedule s) { return schedule_names[s]; }

bool rt_lr_schedule_parse(const char *name, RtLrSchedule *s) {
    for (int i = 0; i < (int)(sizeof schedule_names / sizeof *schedule_names); i++)
        if (strcmp(name, schedule_names[i]) == 0) return *s = (RtLrSchedule)i, true;
    return false;
}

/* In double, as the Python the formulas come from: during the warmup k / W,
 * then 1 (constant), (T - k) / (T - W) (linear), or 0.5 (1 + cos(pi p)) with
 * p = (k - W) / (T - W) (cosine, half a cycle), neither below 0, and with
 * T - W taken as at least 1. */
double rt_lr_factor(RtLrSchedule s, int64_t warmup, int64_t total, int64_t k) {
    if (k < warmup) return (double)k / (double)(warmup > 1 ? warmup : 1);
    double span = (double)(total - warmup > 1 ? total - warmup : 1);
    switch (s) {
    case RT_LR_LINEAR: return fmax(0.0, (double)(total - k) / span);
    case RT_LR_COSINE: return fmax(0.0, 0.5 * (1.0 + cos(M_PI * ((double)(k - warmup) / span))));
    default: return 1.0;
    }
}
