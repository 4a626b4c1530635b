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

#endif
