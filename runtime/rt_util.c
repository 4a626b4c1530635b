/* rt_util.c - who this process is (program name, rank, ranks), how it
 * ends on an error (rt_die, rt_fatal), warnings, and the one hash of the
 * runtime (FNV-1a).
 *
 * It sits below every other runtime file that calls it: it calls nothing
 * of the communication module.  The rank is told to it once MPI is up
 * (rt_set_rank, from rt_comm_init); before that, and in the unit tests, a
 * process is rank 0 of 1.  The only MPI it calls is what ending a run
 * needs: MPI_Abort for an error one rank found alone, MPI_Finalize before
 * exiting otherwise (mpirun reports a rank that exits without it as
 * failed, whatever its status). */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"

static int g_rank = 0;
static int g_ranks = 1;
static const char *g_prog = "cleave-program";

void rt_set_prog_name(const char *argv0) {
    if (!argv0 || !argv0[0]) return;
    const char *slash = strrchr(argv0, '/');
    g_prog = slash ? slash + 1 : argv0;
}

void rt_set_rank(int rank, int ranks) {
    g_rank = rank;
    g_ranks = ranks;
}

int rt_rank(void) { return g_rank; }
int rt_ranks(void) { return g_ranks; }
const char *rt_prog_name(void) { return g_prog; }

/* Ends MPI if it is running: the communicators still held need no freeing
 * first (MPI_Finalize releases them), and nothing runs after this.  The
 * watchdog keeps watching MPI_Finalize, which waits for every rank, and is
 * joined after it. */
void rt_end_mpi(void) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    if (up) MPI_Finalized(&down);
    if (up && !down) {
        rt_watch_phase("the end of the run");
        rt_watch_begin("the end of MPI", -1, RT_WATCH_EVERY);
        MPI_Finalize();
        rt_watch_end();
    }
    rt_watch_stop();
}

void rt_die(const RtErr *e) {
    int status = e && e->status ? e->status : 1;
    const char *msg = e && e->msg[0] ? e->msg : "unknown error";
    if (g_ranks > 1 && e && e->every) {
        /* Every rank is here: one line, then each exits on its own. */
        if (e->origin == g_rank || (e->origin < 0 && g_rank == 0)) {
            rt_log_break_line();
            if (e->origin < 0) fprintf(stderr, "%s: error: %s\n", g_prog, msg);
            else fprintf(stderr, "%s: error: rank %d: %s\n", g_prog, g_rank, msg);
            fflush(stderr);
        }
        rt_end_mpi();
        exit(status);
    }
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
    rt_end_mpi();
    exit(status);
}

void rt_fatal(const char *fmt, ...) {
    char msg[sizeof ((RtErr *)0)->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    RtErr e = {0};
    rt_error(&e, "%s", msg); /* one line, as every recorded error */
    rt_die(&e);
}

void rt_warn(const char *fmt, ...) {
    if (g_rank != 0) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt_log_break_line();
    fprintf(stderr, "%s: warning: %s\n", g_prog, msg);
    fflush(stderr);
}

uint64_t rt_fnv1a64(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
