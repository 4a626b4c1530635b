/* rt_signal.c - SIGTERM and SIGINT end a run between steps.
 *
 * A scheduler preempting a job sends SIGTERM (mpirun forwards it, and
 * SIGINT, to every rank); a user presses Ctrl-C.  Either sets a flag that
 * the step loop reads once per step, summed over the ranks with the
 * step's loss (rt_train.c), so every rank stops after the same step, and
 * a checkpoint is written before they exit.  SA_RESETHAND: a second
 * signal finds the default action and ends the process at once. */
#include <signal.h>
#include <string.h>

#include "rt.h"

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

void rt_signal_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int rt_signal_pending(void) { return g_signal; }
