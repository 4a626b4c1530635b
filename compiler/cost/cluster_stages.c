/* cluster_stages.c - stage weights priced on a cluster (cluster_stages.h). */
#include "cluster_stages.h"

#include <string.h>

#include "simulate.h"

/* A node's time per micro-batch: cold for the first micro-batch, warm for
 * the others.  The stages' balance is what counts here; the simulator
 * charges each call by what its rank touched since the kernel's last
 * one. */
static double node_seconds(const Node *n, void *ctx) {
    const ClusterStages *cs = ctx;
    double cold = sim_node_seconds(&cs->cl, 0, n, PROFILE_COLD);
    if (cs->microbatches <= 1) return cold;
    return (cold + (cs->microbatches - 1) * sim_node_seconds(&cs->cl, 0, n, PROFILE_WARM)) / cs->microbatches;
}

/* The link between stage j and j + 1 of replica 0 (plan_rank_of). */
static void boundary_link(int j, double *latency_s, double *sec_per_byte, void *ctx) {
    const ClusterStages *cs = ctx;
    const Cluster *c = &cs->cl;
    int a = cs->by_stage ? j * cs->replicas : j, b = cs->by_stage ? (j + 1) * cs->replicas : j + 1;
    const ClusterLink *link = b < cluster_ranks(c) ? cluster_link(c, a, b) : &c->intra_node;
    *latency_s = link->latency_s;
    *sec_per_byte = 1.0 / (link->bandwidth_gbps * 1e9);
}

/* Bytes a rank holds per byte of the parameters it updates: the weight,
 * its gradient, the accumulator of micro-batch gradients, and the
 * optimizer's state (a velocity; Adam's two moments). */
static double param_copies(const TrainOptions *t, int microbatches) {
    double state = t->optimizer == OPT_ADAM ? 2 : t->optimizer == OPT_MOMENTUM ? 1 : 0;
    return 2 + (microbatches > 1) + state;
}

bool cluster_stages_open(ClusterStages *cs, const char *cluster_path, KernelProfile *profile, const Graph *g,
                         int replicas, int stages, int microbatches, SchedKind schedule, Placement placement,
                         const TrainOptions *train, Diag *d) {
    memset(cs, 0, sizeof *cs);
    cs->replicas = replicas;
    cs->microbatches = microbatches;
    cs->by_stage = placement == PLACE_BY_STAGE;
    char which[1100];
    if (!cluster_open(cluster_path, replicas * stages, &cs->cl, which, sizeof which, d)) return false;
    cs->cl.profile = profile;
    profile_bind(profile, g);
    cs->weight = (StageWeight){node_seconds, cs};
    /* The activations stage s keeps: every micro-batch's under GPipe, at
     * most P - s under 1F1B.  Beyond 64 stages, compute alone. */
    if (stages <= 64) {
        for (int s = 0; s < stages; s++) {
            int keep = schedule == SCHED_1F1B ? stages - s : microbatches;
            cs->act[s] = keep < microbatches ? keep : microbatches;
        }
        cs->weight.boundary_link = boundary_link;
        cs->weight.memory_limit = (double)cs->cl.memory_per_rank_bytes;
        cs->weight.param_copies = param_copies(train, microbatches);
        cs->weight.act_copies = cs->act;
    }
    return true;
}

void cluster_stages_close(ClusterStages *cs) {
    cluster_free(&cs->cl);
}
