/* rt_group.c - the groups of ranks a program talks to: every rank (the
 * program's communicator, a duplicate of MPI_COMM_WORLD so nothing else
 * in the process can match its messages), the replicas of this rank's
 * stage, the stages of its replica (sums over the stages: gradient
 * clipping's norm), and the neighbour stages of its replica.
 *
 * Every plan is D replicas of a P-stage pipeline on D x P ranks.  A
 * data-parallel program is D x 1: the replicas of its one stage are all
 * the ranks, so its replica group is the program's communicator itself
 * and no split is needed.  A program with stages (layer, pipeline,
 * hybrid) splits the ranks by stage once every rank got past its start-up
 * (rt_group_split); its peers are the ranks of the other stages of its
 * replica, placed as the plan says (rt_layout_rank).  A single program
 * is 1 x 1.
 *
 * A program whose buckets are summed hierarchically (allreduce_node K)
 * also splits each stage's replicas by node, rank r on node r / K as the
 * plan's cluster numbers them: whether the ranks really share a node only
 * changes the speed, never the sum. */
#include <mpi.h>
#include <stdlib.h>

#include "rt.h"
#include "rt_comm.h"

static struct {
    bool mpi_up;
    MPI_Comm world;    /* the program's communicator */
    MPI_Comm replicas; /* this stage's replicas after the split (else world) */
    MPI_Comm stages;   /* this replica's stages after the split (else none) */
    MPI_Comm node_reduce, node_bcast, leaders; /* rt_mpi.h */
    RtLayout layout;   /* stages, dp, placement, this rank's stage and replica
                          (all 0 before rt_group_setup: no stage to send to) */
} g = {.world = MPI_COMM_NULL, .replicas = MPI_COMM_NULL, .stages = MPI_COMM_NULL, .node_reduce = MPI_COMM_NULL,
       .node_bcast = MPI_COMM_NULL, .leaders = MPI_COMM_NULL};

void rt_comm_init(int *argc, char ***argv) {
    /* MPI_Init's default error handler aborts with Open MPI's own message,
     * which is all that can be said when the MPI environment is broken.
     * FUNNELED: with --threads the process has worker threads (rt_pool.c),
     * but only this one ever calls MPI. */
    int provided = MPI_THREAD_SINGLE, rank = 0, ranks = 1;
    /* The gradient buckets are summed in place by MPI_Iallreduce, for
     * which Open MPI's libnbc picks a binomial tree (as it does for fewer
     * than 4 ranks): the whole bucket goes up the tree and back down,
     * 2 log2(n) times its bytes over the slowest link, where a ring sends
     * 2 (n - 1) / n times them.  The cost model prices a ring (and so
     * does the hierarchical sum for its leaders), so the programs ask
     * libnbc for its ring, which sums in place as well; a value the user
     * set in the environment is left alone. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    g.mpi_up = true;
    MPI_Comm_dup(MPI_COMM_WORLD, &g.world);
    MPI_Comm_rank(g.world, &rank);
    MPI_Comm_size(g.world, &ranks);
    rt_set_rank(rank, ranks);
}

void rt_comm_finalize(void) {
    if (!g.mpi_up) return;
    rt_group_free();
    if (g.world != MPI_COMM_NULL) MPI_Comm_free(&g.world);
    rt_end_mpi();
    g.mpi_up = false;
}

MPI_Comm rt_comm_world(void) { return g.world; }

MPI_Comm rt_comm_replicas(void) { return g.replicas != MPI_COMM_NULL ? g.replicas : g.world; }

MPI_Comm rt_comm_stages(void) { return g.stages; }

MPI_Comm rt_comm_node_reduce(void) { return g.node_reduce; }

MPI_Comm rt_comm_node_bcast(void) { return g.node_bcast; }

MPI_Comm rt_comm_leaders(void) { return g.layout.allreduce_node > 0 ? g.leaders : rt_comm_replicas(); }

/* The replicas of this stage by node, and their leaders (rt_mpi.h). */
static void split_nodes(void) {
    MPI_Comm replicas = rt_comm_replicas();
    int rank = rt_rank(), mine = 0;
    rt_watch_begin("the grouping of replicas by node", -1, RT_WATCH_REPLICAS);
    MPI_Comm_split(replicas, rank / g.layout.allreduce_node, rank, &g.node_reduce);
    MPI_Comm_dup(g.node_reduce, &g.node_bcast);
    MPI_Comm_rank(g.node_reduce, &mine);
    MPI_Comm_split(replicas, mine == 0 ? 0 : MPI_UNDEFINED, rank, &g.leaders);
    rt_watch_end();
}

void rt_group_setup(const RtMeta *m) {
    g.layout = m->layout;
    rt_watch_layout(m->layout.stages, m->layout.stage, m->layout.replica);
}

void rt_group_split(void) {
    if (g.layout.stages > 1 && g.replicas == MPI_COMM_NULL) {
        rt_watch_begin("the grouping of ranks by stage", -1, RT_WATCH_EVERY);
        MPI_Comm_split(g.world, g.layout.stage, g.layout.replica, &g.replicas);
        /* ranked by stage, so that a sum over them adds the stages in order */
        MPI_Comm_split(g.world, g.layout.replica, g.layout.stage, &g.stages);
        rt_watch_end();
    }
    if (g.layout.allreduce_node > 0 && g.layout.dp > 1 && g.node_reduce == MPI_COMM_NULL) split_nodes();
}

void rt_group_free(void) {
    if (g.replicas != MPI_COMM_NULL) MPI_Comm_free(&g.replicas);
    if (g.stages != MPI_COMM_NULL) MPI_Comm_free(&g.stages);
    if (g.node_reduce != MPI_COMM_NULL) MPI_Comm_free(&g.node_reduce);
    if (g.node_bcast != MPI_COMM_NULL) MPI_Comm_free(&g.node_bcast);
    if (g.leaders != MPI_COMM_NULL) MPI_Comm_free(&g.leaders);
    g.layout = (RtLayout){0};
}

int rt_group_stage(void) { return g.layout.stage; }

int rt_group_stages(void) { return g.layout.stages; }

int rt_group_peer(int32_t stage) {
    if (stage < 0 || stage >= g.layout.stages || stage == g.layout.stage)
        rt_fatal("a transfer names stage %d, not another of the %d stages", stage, g.layout.stages);
    return rt_layout_rank(&g.layout, g.layout.replica, stage);
}
