/* schedule.c - the order in which a pipeline stage runs the forward and
 * backward units of its micro-batches: GPipe (all forwards, then all
 * backwards) and 1F1B (a warm-up of forwards, then one forward and one
 * backward in turn, which bounds the activations a stage keeps). */
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

bool schedule_parse(const char *name, SchedKind *k, Diag *d) {
    if (name && strcmp(name, "layer") == 0) *k = SCHED_LAYER;
    else if (name && strcmp(name, "gpipe") == 0) *k = SCHED_GPIPE;
    else if (name && strcmp(name, "1f1b") == 0) *k = SCHED_1F1B;
    else
        return diag_error(d, DIAG_USAGE, "--schedule '%s' is not a pipeline schedule (use gpipe or 1f1b)",
                          name ? name : "");
    return true;
}

const char *schedule_name(SchedKind k) { return k == SCHED_LAYER ? "layer" : k == SCHED_GPIPE ? "gpipe" : "1f1b"; }

int schedule_units(SchedKind k, int n_stages, int stage, int microbatches, SchedUnit *out) {
    int m = microbatches, n = 0;
    if (k != SCHED_1F1B) {
        for (int i = 0; i < m; i++) out[n++] = (SchedUnit){false, i};
        for (int i = 0; i < m; i++) out[n++] = (SchedUnit){true, i};
        return n;
    }
    int warm = n_stages - stage - 1;
    if (warm > m) warm = m;
    if (warm < 0) warm = 0;
    int f = 0, b = 0;
    while (f < warm) out[n++] = (SchedUnit){false, f++};
    while (f < m) {
        out[n++] = (SchedUnit){false, f++};
        out[n++] = (SchedUnit){true, b++};
    }
    while (b < m) out[n++] = (SchedUnit){true, b++};
    return n;
}

bool schedule_check(SchedKind k, int n_stages, int stage, int microbatches, const SchedUnit *u, int n,
                    int *max_inflight, Diag *d) {
    int m = microbatches;
    if (n != 2 * m)
        return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d: %d units for %d micro-batches (want %d)",
                          schedule_name(k), stage, n, m, 2 * m);
    int bound = m;
    if (k == SCHED_1F1B && n_stages - stage < bound) bound = n_stages - stage;
    int next_f = 0, next_b = 0, inflight = 0, most = 0;
    for (int i = 0; i < n; i++) {
        int mb = u[i].micro;
        if (mb < 0 || mb >= m)
            return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d: unit %d names micro-batch %d of %d",
                              schedule_name(k), stage, i, mb, m);
        if (!u[i].backward) {
            if (mb != next_f)
                return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d: unit %d runs forward %d, expected forward %d",
                                  schedule_name(k), stage, i, mb, next_f);
            next_f++;
            if (++inflight > most) most = inflight;
        } else {
            if (mb >= next_f)
                return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d: unit %d runs backward %d before its forward",
                                  schedule_name(k), stage, i, mb);
            if (mb != next_b)
                return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d: unit %d runs backward %d, expected backward %d",
                                  schedule_name(k), stage, i, mb, next_b);
            next_b++;
            inflight--;
        }
        if (inflight > bound)
            return diag_error(d, DIAG_INTERNAL, "%s schedule of stage %d of %d: %d micro-batches in flight after unit %d; at most %d allowed",
                              schedule_name(k), stage, n_stages, inflight, i, bound);
    }
    if (max_inflight) *max_inflight = most;
    return true;
}
