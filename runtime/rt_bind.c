/* rt_bind.c - which CPU a rank runs on when its node holds more ranks
 * than the CPUs it may use.
 *
 * Open MPI leaves ranks unbound when a node is oversubscribed, and Linux
 * then pairs them on CPUs as its load balancer sees fit: a rank waiting
 * for a message polls, so it looks as busy as one computing, and two
 * ranks that compute at the same time share a CPU in some runs and not
 * in others.  The same program measured 7.6 ms a step in one run and
 * 12 ms in the next that way.  Pinned round robin (the k-th rank of the
 * node to the (k mod C)-th of the C CPUs it may use), the pairing is
 * fixed, and it is the one the cost model assumes (cost/simulate.c), so
 * the plan it picks is the plan that runs.
 *
 * Only the rank's own thread is pinned: it is the one that computes and
 * calls MPI; workers of --threads keep the CPUs they started with.  A
 * node with a CPU per rank, and a rank mpirun has already bound to a
 * single CPU, are left as they are; ranks mpirun bound to a set of CPUs
 * (a socket) are pinned round robin within it, among the ranks bound to
 * the same set.  --no-bind leaves placement to the operating system. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_COUNT */
#endif
#include <mpi.h>
#include <sched.h>

#include "rt.h"
#include "rt_mpi.h"

static int g_cpu = -1;

int rt_bind_cpu(void) { return g_cpu; }

void rt_bind_ranks(bool enabled) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    bool have = sched_getaffinity(0, sizeof mine, &mine) == 0;
    /* The ranks of this node that may use the same CPUs as this one (all
     * of them unless mpirun bound them, say, to sockets), in rank order.
     * Collective over every rank, pinning or not, so that a rank given
     * --no-bind and one without it still meet in the same calls. */
    int color = have ? (int)(rt_fnv1a64(RT_FNV1A64_INIT, &mine, sizeof mine) & 0x7fffffff) : 0;
    MPI_Comm node, same;
    int local = 0, locals = 1;
    rt_watch_begin("the grouping of ranks by node", -1, RT_WATCH_EVERY);
    if (MPI_Comm_split_type(rt_comm_world(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        if (MPI_Comm_split(node, color, 0, &same) == MPI_SUCCESS) {
            MPI_Comm_rank(same, &local);
            MPI_Comm_size(same, &locals);
            MPI_Comm_free(&same);
        }
        MPI_Comm_free(&node);
    }
    rt_watch_end();
    if (!enabled || !have) return;
    int cpus = CPU_COUNT(&mine);
    if (cpus <= 1 || locals <= cpus) return;
    int want = local % cpus, cpu = -1;
    for (int c = 0, seen = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &mine) && seen++ == want) cpu = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) g_cpu = cpu;
    else rt_warn("could not pin rank %d to CPU %d of the %d it may use (%d ranks share them): left to the "
                 "operating system", rt_rank(), cpu, cpus, locals);
}
