/* rt_mpi.h - for the runtime files that call MPI themselves: the groups
 * they call it on (rt_group.c). */
#ifndef CLEAVE_RT_MPI_H
#define CLEAVE_RT_MPI_H

#include <mpi.h>

/* The program's communicator: every rank, a duplicate of MPI_COMM_WORLD. */
MPI_Comm rt_comm_world(void);
/* The replicas of this rank's stage: every rank of a program with one
 * stage; with several, the stage's group once rt_comm_groups split the
 * ranks. */
MPI_Comm rt_comm_replicas(void);
/* The stages of this rank's replica, ranked by stage, once rt_comm_groups
 * split the ranks of a program with several stages; MPI_COMM_NULL
 * otherwise. */
MPI_Comm rt_comm_stages(void);
/* A hierarchical gradient allreduce (RtLayout.allreduce_node), once
 * rt_comm_groups split the replicas by node: the replicas of this rank's
 * stage on its node, ranked by MPI rank (node rank 0 is the node's
 * leader), in two copies, one for the reductions to the leader and one
 * for the broadcasts back, so that the two kinds of collective are never
 * ordered against each other; and the leaders of every node
 * (MPI_COMM_NULL on a rank that is not one).  Without a hierarchy the
 * first two are MPI_COMM_NULL and the leaders are rt_comm_replicas(). */
MPI_Comm rt_comm_node_reduce(void);
MPI_Comm rt_comm_node_bcast(void);
MPI_Comm rt_comm_leaders(void);

#endif
