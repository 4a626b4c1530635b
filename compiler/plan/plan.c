/* plan.c - the plans without stages, as the one planner (pipeline.c)
 * makes them: single is 1 replica x 1 stage x 1 micro-batch, dp D x 1 x 1,
 * and the inference plan 1 x 1 x 1 over a graph with no training nodes. */
#include "plan.h"
#include "pipeline.h"

bool plan_single(Graph *g, const TrainGraph *t, int64_t batch, Plan *p, Diag *d) {
    if (!plan_hybrid_weighted(g, t, batch, 1, 1, 1, "layer", NULL, 0, 0, NULL, PLACE_BY_REPLICA, p, d)) return false;
    p->strategy = STRATEGY_SINGLE;
    return true;
}

bool plan_dp(Graph *g, const TrainGraph *t, int64_t batch, int replicas, double bucket_mb, Plan *p, Diag *d) {
    if (!plan_hybrid_weighted(g, t, batch, replicas, 1, 1, "layer", NULL, 0, bucket_mb, NULL, PLACE_BY_REPLICA, p, d))
        return false;
    p->strategy = STRATEGY_DP;
    return true;
}

bool plan_forward(Graph *g, Plan *p, Diag *d) {
    if (!plan_hybrid_weighted(g, NULL, 0, 1, 1, 1, "layer", NULL, 0, 0, NULL, PLACE_BY_REPLICA, p, d)) return false;
    p->strategy = STRATEGY_FORWARD;
    return true;
}
