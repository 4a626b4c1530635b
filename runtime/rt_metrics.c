/* rt_metrics.c - what a run reports: the --metrics JSON Lines file, and on
 * stderr either a progress bar (a terminal) or plain log lines (a file or a
 * pipe, where a bar redrawn with \r would be noise).  Only rank 0 reports.
 *
 * Lines are written with fprintf rather than built with jansson so that the
 * step loop allocates nothing. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"

/* Whether a progress bar line is on screen without its newline; rt_die
 * ends it first so the error starts on a line of its own. */
static bool g_bar_open = false;

double rt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Lines reach the file as they are logged; the first failure's errno
 * (ENOSPC, say) is kept for the message at the end. */
static void flush_metrics(RtLog *l) {
    if (fflush(l->metrics) != 0 && !l->metrics_out.err) l->metrics_out.err = errno ? errno : EIO;
}

bool rt_log_open(RtLog *l, const char *metrics_path, bool quiet, bool tty, int64_t total,
                 int64_t batch, int64_t log_every, RtErr *e) {
    memset(l, 0, sizeof *l);
    l->quiet = quiet;
    l->tty = tty;
    l->total = total;
    l->batch = batch;
    l->log_every = log_every;
    l->metrics_path = metrics_path;
    if (metrics_path && !quiet) {
        /* The lines go to a temporary beside the target, renamed over it
         * at the end: a file of an earlier run stays whole until then. */
        int err = out_file_open(&l->metrics_out, metrics_path);
        if (err) return rt_error(e, "--metrics %s: cannot write: %s", metrics_path, out_file_why(err));
        l->metrics = l->metrics_out.f;
        /* stdio would allocate its buffer at the first line, inside the
         * step loop; give it one now. */
        l->metrics_buf = malloc(RT_METRICS_BUF);
        if (!l->metrics_buf || setvbuf(l->metrics, l->metrics_buf, _IOFBF, RT_METRICS_BUF) != 0) {
            out_file_abort(&l->metrics_out);
            l->metrics = NULL;
            free(l->metrics_buf);
            l->metrics_buf = NULL;
            return rt_error(e, "--metrics %s: out of memory", metrics_path);
        }
    }
    l->t_start = l->t_mark = rt_now();
    l->t_drawn = l->t_start - 1.0;
    return true;
}

/* JSON has no NaN or infinity: those become null. */
static void json_num(FILE *f, const char *fmt, double x) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("null", f);
}

static void draw_bar(RtLog *l, int64_t step, double loss, double now) {
    double elapsed = now - l->t_start;
    int64_t done = step - l->start; /* by this run */
    double rate = elapsed > 0 ? (double)(done * l->batch) / elapsed : 0;
    double eta = done > 0 ? elapsed / (double)done * (double)(l->total - step) : 0;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1];
    int filled = (int)((double)WIDTH * (double)step / (double)l->total);
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '-';
    bar[WIDTH] = 0;
    long s = (long)(eta + 0.5);
    fprintf(stderr, "\rstep %" PRId64 "/%" PRId64 " [%s] loss %.4f %.1f samples/s ETA %ld:%02ld:%02ld\033[K",
            step, l->total, bar, loss, rate, s / 3600, s / 60 % 60, s % 60);
    g_bar_open = true;
    if (step == l->total) {
        fputc('\n', stderr);
        g_bar_open = false;
    }
    fflush(stderr);
}

void rt_log_step(RtLog *l, int64_t step, double loss, float lr, double step_seconds, const RtStepComm *comm) {
    double now = rt_now();
    if (l->metrics) {
        fprintf(l->metrics, "{\"step\": %" PRId64 ", \"loss\": ", step);
        json_num(l->metrics, "%.9g", loss);
        fputs(", \"lr\": ", l->metrics);
        json_num(l->metrics, "%.9g", (double)lr);
        fputs(", \"samples_per_s\": ", l->metrics);
        json_num(l->metrics, "%.6g", step_seconds > 0 ? (double)l->batch / step_seconds : NAN);
        fprintf(l->metrics, ", \"elapsed_s\": %.6f", now - l->t_start);
        if (comm) fprintf(l->metrics, ", \"comm_wait_s\": %.9f, \"allreduce_s\": %.9f", comm->wait_s, comm->allreduce_s);
        fputs("}\n", l->metrics);
        /* Flushed per line so a run can be followed with tail -f (on the
         * temporary .NAME.tmp-XXXXXX beside the target until the end). */
        flush_metrics(l);
    }
    if (l->quiet) return;
    bool last = step == l->total;
    if (l->tty) {
        if (last || now - l->t_drawn >= 0.1) {
            draw_bar(l, step, loss, now);
            l->t_drawn = now;
        }
        return;
    }
    if (!last && (l->log_every == 0 || step % l->log_every != 0)) return;
    double dt = now - l->t_mark;
    double rate = dt > 0 ? (double)((step - l->step_mark) * l->batch) / dt : 0;
    fprintf(stderr, "step %" PRId64 "/%" PRId64 " loss %.4f %.1f samples/s\n", step, l->total, loss, rate);
    fflush(stderr);
    l->t_mark = now;
    l->step_mark = step;
}

void rt_log_eval(RtLog *l, int64_t epoch, double eval_loss, bool has_accuracy, double accuracy) {
    if (l->metrics) {
        fprintf(l->metrics, "{\"epoch\": %" PRId64 ", \"eval_loss\": ", epoch);
        json_num(l->metrics, "%.9g", eval_loss);
        if (has_accuracy) {
            fputs(", \"accuracy\": ", l->metrics);
            json_num(l->metrics, "%.9g", accuracy);
        }
        fputs("}\n", l->metrics);
        flush_metrics(l);
    }
    if (l->quiet) return;
    if (g_bar_open) {
        fputs("\r\033[K", stderr);
        g_bar_open = false;
    }
    if (has_accuracy)
        fprintf(stderr, "epoch %" PRId64 " eval_loss %.4f accuracy %.4f\n", epoch, eval_loss, accuracy);
    else
        fprintf(stderr, "epoch %" PRId64 " eval_loss %.4f\n", epoch, eval_loss);
    fflush(stderr);
}

bool rt_log_close(RtLog *l, RtErr *e) {
    rt_log_break_line();
    if (!l->metrics) return true;
    int err = out_file_finish(&l->metrics_out);
    l->metrics = NULL;
    free(l->metrics_buf);
    l->metrics_buf = NULL;
    if (err) return rt_error(e, "--metrics %s: write failed: %s", l->metrics_path, out_file_why(err));
    return true;
}

void rt_log_discard(RtLog *l) {
    if (l->metrics) out_file_finish(&l->metrics_out);
    l->metrics = NULL;
    free(l->metrics_buf);
    l->metrics_buf = NULL;
}

void rt_log_break_line(void) {
    if (!g_bar_open) return;
    fputc('\n', stderr);
    fflush(stderr);
    g_bar_open = false;
}
