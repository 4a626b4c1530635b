/* cluster_stages.h - what a staged plan's stages weigh on a cluster, for
 * balancing them by time (--balance time, and every candidate of the
 * search).
 *
 * Requires: the training graph at a micro-batch's rows, the layout's
 * replicas, stages, micro-batches, schedule and placement, and the cluster
 * file (NULL: this machine's calibration or the stated defaults).
 * Provides: a StageWeight (plan/pipeline.h) charging each node its
 * simulated seconds per micro-batch (cold for the first micro-batch, warm
 * for the others, as the simulator charges them over a step), each stage
 * boundary the link between replica 0's ranks of the two stages, and each
 * stage the memory of its parameters and of the activations its schedule
 * keeps, against the cluster's memory per rank. */
#ifndef CLEAVE_CLUSTER_STAGES_H
#define CLEAVE_CLUSTER_STAGES_H

#include "../plan/pipeline.h"
#include "cluster.h"
#include "profile.h"

typedef struct ClusterStages {
    Cluster cl;
    int replicas, microbatches;
    bool by_stage;
    double act[64]; /* per stage: micro-batches of activations kept at once */
    StageWeight weight;
} ClusterStages;

/* Opens the cluster for replicas x stages ranks and fills cs->weight;
 * profile (may be NULL) is bound to g and prices the nodes.  Beyond 64
 * stages the weight is compute alone.  Close with cluster_stages_close. */
bool cluster_stages_open(ClusterStages *cs, const char *cluster_path, KernelProfile *profile, const Graph *g,
                         int replicas, int stages, int microbatches, SchedKind schedule, Placement placement,
                         const TrainOptions *train, Diag *d);
void cluster_stages_close(ClusterStages *cs);

#endif
