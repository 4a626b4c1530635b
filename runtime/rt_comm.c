/* rt_comm.c - MPI start and end, and how an error ends the program.
 *
 * A program runs alone or under mpirun.  For now every rank does the same
 * work; what matters here is that a failure on any rank ends every rank
 * promptly with a non-zero status, and that nothing waits for a dead rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"

static int g_rank = 0;
static int g_ranks = 1;
static bool g_mpi_up = false;
static const char *g_prog = "cleave-program";

void rt_comm_init(int *argc, char ***argv) {
    if (*argc > 0 && (*argv)[0] && (*argv)[0][0]) {
        const char *slash = strrchr((*argv)[0], '/');
        g_prog = slash ? slash + 1 : (*argv)[0];
    }
    /* MPI_Init's default error handler aborts with Open MPI's own message,
     * which is all that can be said when the MPI environment is broken. */
    MPI_Init(argc, argv);
    g_mpi_up = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_ranks);
}

int rt_rank(void) { return g_rank; }
int rt_ranks(void) { return g_ranks; }
const char *rt_prog_name(void) { return g_prog; }

void rt_die(const RtErr *e) {
    int status = e && e->status ? e->status : 1;
    const char *msg = e && e->msg[0] ? e->msg : "unknown error";
    if (g_ranks > 1) {
        /* Every rank usually fails the same way (same flags, same files).
         * Ranks other than 0 wait a moment so rank 0's abort ends them first
         * and the user reads one line, not one per rank; an error that only
         * this rank sees is still printed after the pause. */
        if (g_rank != 0) nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 300000000L}, NULL);
        rt_log_break_line();
        fprintf(stderr, "%s: error: rank %d: %s\n", g_prog, g_rank, msg);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
        exit(status); /* MPI_Abort does not return; this keeps the promise */
    }
    rt_log_break_line();
    fprintf(stderr, "%s: error: %s\n", g_prog, msg);
    fflush(stderr);
    if (g_mpi_up) MPI_Finalize();
    exit(status);
}

void rt_comm_finalize(void) {
    if (g_mpi_up) MPI_Finalize();
    g_mpi_up = false;
}
