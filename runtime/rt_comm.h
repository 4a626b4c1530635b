/* rt_comm.h - between the files of the communication module (rt.h says
 * what the rest of the runtime calls).  Each part below calls only the
 * parts listed before it: groups, then collectives and point-to-point,
 * then rt_comm.c, which calls them all. */
#ifndef CLEAVE_RT_COMM_H
#define CLEAVE_RT_COMM_H

#include "rt.h"
#include "rt_mpi.h"

/* ---- groups: rt_group.c -------------------------------------------------- */

/* Records the program's layout (stages, placement, this rank's stage and
 * replica); local. */
void rt_group_setup(const RtMeta *m);
/* Collective over every rank for a program with stages: splits the ranks
 * into the replicas of each stage (nothing otherwise, nor a second time). */
void rt_group_split(void);
void rt_group_free(void);
/* This rank's stage (0 before rt_group_setup), and the program's number
 * of stages. */
int rt_group_stage(void);
int rt_group_stages(void);
/* The rank that runs `stage` in this rank's replica; a stage that is not
 * another of the program's ends the job (a broken program). */
int rt_group_peer(int32_t stage);

/* ---- collectives: rt_collective.c ---------------------------------------- */

/* The gradient buckets of m (cleave_rt_allreduce_start and friends). */
bool rt_coll_init(char *arena, const RtMeta *m, RtErr *e);
void rt_coll_free(void);
/* Tests the running bucket allreduces. */
void rt_coll_progress(void);
void rt_coll_step_begin(void);
/* c gets the step's time blocked in collectives and spent in them; fails
 * if a bucket started and was never waited for. */
bool rt_coll_step_end(RtStepComm *c, RtErr *e);

/* ---- point-to-point: rt_p2p.c -------------------------------------------- */

/* The sends of a program with stages: checks its tags against MPI_TAG_UB. */
bool rt_p2p_init(const RtMeta *m, RtErr *e);
void rt_p2p_free(void);
/* Tests the outstanding sends. */
void rt_p2p_progress(void);
void rt_p2p_step_begin(void);
/* Completes every send of the step; c gets the step's time blocked in
 * transfers. */
void rt_p2p_step_end(RtStepComm *c);

#endif
