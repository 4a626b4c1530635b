/* rt_comm.c - the communication of a run, as the rest of the runtime and
 * the generated step see it: setting up the groups and the requests a
 * program needs, the progress call between kernels, and a step's
 * bookkeeping.  It sits on top of the module's other files, which never
 * call it:
 *
 *   rt_comm.c ----> rt_collective.c  bucket allreduces, stage group sums,
 *            \                       the run's reductions
 *             `---> rt_p2p.c         sends and receives between stages
 *   all three ----> rt_group.c       MPI start and end, every rank, the
 *                                    replicas of a stage, stage neighbours
 *   rt_agree.c ---> rt_group.c       start-up, agreeing on failures and
 *                                    rows, --check-replicas
 *
 * Every plan is D replicas x P stages; a data-parallel program is D x 1,
 * whose gradient buckets are summed over the replicas of its one stage as
 * a hybrid program's are over those of each stage.  Only the requests a
 * program uses are set up: buckets when it has replicas (only then has
 * its metadata buckets), sends when it has stages. */
#include "rt.h"
#include "rt_comm.h"

bool rt_comm_setup(char *arena, const RtMeta *m, RtErr *e) {
    rt_comm_free();
    rt_group_setup(m);
    if (m->layout.dp > 1 && !rt_coll_init(arena, m, e)) return false;
    if (m->layout.stages > 1 && !rt_p2p_init(m, e)) return false;
    return true;
}

void rt_comm_groups(void) { rt_group_split(); }

void rt_comm_free(void) {
    rt_p2p_free();
    rt_coll_free();
    rt_group_free();
}

void cleave_rt_progress(void) {
    rt_p2p_progress();
    rt_coll_progress();
}

void rt_comm_step_begin(void) {
    rt_p2p_step_begin();
    rt_coll_step_begin();
}

bool rt_comm_step_end(RtStepComm *c, RtErr *e) {
    RtStepComm p2p, coll;
    rt_p2p_step_end(&p2p);
    bool ok = rt_coll_step_end(&coll, e);
    if (c) *c = (RtStepComm){p2p.wait_s + coll.wait_s, p2p.allreduce_s + coll.allreduce_s};
    return ok;
}
