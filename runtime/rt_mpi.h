/* rt_mpi.h - for the runtime files that call MPI themselves: the
 * program's communicator (a duplicate of MPI_COMM_WORLD, rt_comm.c). */
#ifndef CLEAVE_RT_MPI_H
#define CLEAVE_RT_MPI_H

#include <mpi.h>

MPI_Comm rt_comm_world(void);
/* The communicator the gradient buckets are summed over (rt_dp_init sets
 * the program's; a hybrid program's ranks use their stage's replicas). */
void rt_dp_use_comm(MPI_Comm c);

#endif
