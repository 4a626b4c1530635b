/* rt_trace.c - --trace FILE: a Chrome trace-event JSON file (opens in
 * ui.perfetto.dev and chrome://tracing) with one track per rank.
 *
 * Each train step is a "step" event.  Inside it, the time between waits is
 * compute, attributed to the unit of work the generated step announced
 * last (cleave_rt_unit: the forward or backward of a micro-batch, or the
 * once-per-step update; "compute" in programs without units); time blocked
 * in a receive, in completing sends or in an allreduce is its own event, so
 * a rank's busy time is the sum of its compute events and the rest of its
 * steps is idle.  Events are kept in memory during the run and gathered on
 * rank 0 at the end, which writes the file.  Times are microseconds from
 * a barrier all ranks pass before the first step.
 *
 * otherData also holds, per rank, the bytes of the arena the program
 * allocated and the process's peak resident set size by the end of
 * training, so that `cleave report` can set the planned memory against
 * what the program took. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "rt.h"
#include "rt_mpi.h"

typedef struct Ev {
    double t0, t1;
    int64_t step;
    int32_t micro;
    int16_t kind;
} Ev;

#define MAX_EVENTS (4u << 20) /* about 100 MB of JSON */

static struct {
    bool on, in_step, truncated;
    Ev *ev;
    size_t n, cap;
    double origin, step_t0, seg_t0;
    int64_t step;
    int kind;
    int32_t micro;
} T;

static void add(int kind, double t0, double t1, int32_t micro) {
    if (t1 <= t0) return;
    if (T.n == T.cap) {
        size_t cap = T.cap ? T.cap * 2 : 4096;
        Ev *more = cap <= MAX_EVENTS ? realloc(T.ev, cap * sizeof *more) : NULL;
        if (!more) {
            T.truncated = true;
            return;
        }
        T.ev = more;
        T.cap = cap;
    }
    T.ev[T.n++] = (Ev){t0 - T.origin, t1 - T.origin, T.step, micro, (int16_t)kind};
}

void rt_trace_start(bool on) {
    T.on = on;
    if (!on) return;
    rt_watch_begin("the barrier that starts --trace", -1, RT_WATCH_EVERY);
    MPI_Barrier(rt_comm_world());
    rt_watch_end();
    T.origin = rt_now();
}

void rt_trace_step_begin(int64_t step) {
    if (!T.on) return;
    T.in_step = true;
    T.step = step;
    T.step_t0 = T.seg_t0 = rt_now();
    T.kind = RT_EV_COMPUTE;
    T.micro = -1;
}

void rt_trace_unit(int kind, int32_t micro) {
    if (!T.on || !T.in_step) return;
    double now = rt_now();
    add(T.kind, T.seg_t0, now, T.micro);
    T.kind = kind;
    T.micro = micro;
    T.seg_t0 = now;
}

/* The generated step's announcement of a unit (rt_abi.h). */
void cleave_rt_unit(int32_t kind, int32_t micro) { rt_trace_unit(kind, micro); }

double rt_trace_wait_begin(void) {
    double now = rt_now();
    if (T.on && T.in_step) add(T.kind, T.seg_t0, now, T.micro);
    return now;
}

double rt_trace_wait_end(int kind, double t0) {
    double now = rt_now();
    if (T.on && T.in_step) {
        add(kind, t0, now, T.micro);
        T.seg_t0 = now;
    }
    return now - t0;
}

void rt_trace_step_end(void) {
    if (!T.on || !T.in_step) return;
    double now = rt_now();
    add(T.kind, T.seg_t0, now, T.micro);
    add(RT_EV_STEP, T.step_t0, now, -1);
    T.in_step = false;
}

/* What the trace calls the layout, as `cleave report` names the plan's:
 * the schedule of stages or micro-batches, else "dp" or "single". */
static const char *layout_name(const RtLayout *l) {
    return rt_layout_pipelined(l) ? l->schedule : l->dp > 1 ? "dp" : "single";
}

/* This rank's events as JSON objects, each followed by ",\n". */
static char *format_events(int rank, const RtMeta *m, size_t *len) {
    static const char *cats[] = {"forward", "backward", "update", "compute", "wait", "wait", "allreduce", "step",
                                 "wait"};
    size_t cap = T.n * 160 + 512, at = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    char thread[96];
    if (rt_layout_pipelined(&m->layout))
        snprintf(thread, sizeof thread, "rank %d (stage %d, replica %d)", rank, m->layout.stage, m->layout.replica);
    else
        snprintf(thread, sizeof thread, "rank %d", rank);
    at += (size_t)snprintf(s + at, cap - at,
                           "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n"
                           "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":"
                           "{\"sort_index\":%d}},\n", rank, thread, rank, rank);
    for (size_t i = 0; i < T.n; i++) {
        const Ev *e = &T.ev[i];
        char name[48];
        switch (e->kind) {
        case RT_EV_FORWARD: snprintf(name, sizeof name, "F %d", (int)e->micro); break;
        case RT_EV_BACKWARD: snprintf(name, sizeof name, "B %d", (int)e->micro); break;
        case RT_EV_STEP: snprintf(name, sizeof name, "step %" PRId64, e->step); break;
        case RT_EV_RECV: snprintf(name, sizeof name, "recv"); break;
        case RT_EV_SEND: snprintf(name, sizeof name, "send"); break;
        case RT_EV_SYNC: snprintf(name, sizeof name, "loss"); break;
        default: snprintf(name, sizeof name, "%s", cats[e->kind]); break;
        }
        at += (size_t)snprintf(s + at, cap - at,
                               "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,"
                               "\"dur\":%.3f,\"args\":{\"step\":%" PRId64 "}},\n",
                               name, cats[e->kind], rank, e->t0 * 1e6, (e->t1 - e->t0) * 1e6, e->step);
    }
    *len = at;
    return s;
}

/* This rank's arena bytes, peak resident set size in bytes (Linux
 * reports ru_maxrss in KiB; 0 when getrusage fails) and pinned CPU. */
static void rank_facts(const RtMeta *m, int64_t out[3]) {
    struct rusage u;
    out[0] = (int64_t)m->arena_bytes;
    out[1] = getrusage(RUSAGE_SELF, &u) == 0 ? (int64_t)u.ru_maxrss * 1024 : 0;
    out[2] = rt_bind_cpu();
}

/* otherData's "rank_memory": mem holds rank_facts of each rank: arena,
 * peak RSS and the CPU its thread was pinned to (rt_bind.c), -1 when not. */
static void write_memory(FILE *f, const int64_t *mem, int ranks) {
    fputs(",\"rank_memory\":[", f);
    for (int r = 0; r < ranks; r++)
        fprintf(f, "%s{\"rank\":%d,\"arena_bytes\":%" PRId64 ",\"peak_rss_bytes\":%" PRId64 ",\"cpu\":%" PRId64 "}",
                r ? "," : "", r, mem[3 * r], mem[3 * r + 1], mem[3 * r + 2]);
    fputs("]", f);
}

/* Collective: gathers every rank's events on rank 0, which writes path. */
bool rt_trace_write(const char *path, const RtMeta *m, int64_t steps, RtErr *e) {
    int rank = rt_rank(), ranks = rt_ranks();
    size_t len = 0;
    char *mine = format_events(rank, m, &len);
    int n = mine && len <= INT32_MAX ? (int)len : -1;
    int *counts = rank == 0 ? calloc((size_t)ranks, sizeof *counts) : NULL;
    int *displs = rank == 0 ? calloc((size_t)ranks, sizeof *displs) : NULL;
    int64_t mine_mem[3], *mem = rank == 0 ? calloc((size_t)ranks * 3, sizeof *mem) : NULL;
    rank_facts(m, mine_mem);
    rt_watch_begin("the gather of --trace events", -1, RT_WATCH_EVERY);
    MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, rt_comm_world());
    MPI_Gather(mine_mem, 3, MPI_INT64_T, mem, 3, MPI_INT64_T, 0, rt_comm_world());
    rt_watch_end();
    int64_t total = 0;
    bool ok = true;
    if (rank == 0) {
        if (!counts || !displs || !mem) ok = false;
        for (int r = 0; ok && r < ranks; r++) {
            if (counts[r] < 0) ok = false;
            displs[r] = (int)total;
            total += ok ? counts[r] : 0;
        }
        if (total > INT32_MAX) ok = false;
    }
    /* Every rank learns whether the gather can go ahead. */
    int go = ok;
    rt_watch_begin("the gather of --trace events", -1, RT_WATCH_EVERY);
    MPI_Bcast(&go, 1, MPI_INT, 0, rt_comm_world());
    rt_watch_end();
    char *all = NULL;
    if (go && rank == 0 && !(all = malloc((size_t)total + 1))) go = 0;
    if (go) {
        rt_watch_begin("the gather of --trace events", -1, RT_WATCH_EVERY);
        MPI_Gatherv(mine, n, MPI_CHAR, all, counts, displs, MPI_CHAR, 0, rt_comm_world());
        rt_watch_end();
    }
    if (rank == 0) {
        if (!go) {
            ok = rt_error(e, "--trace %s: out of memory gathering the events of %d ranks", path, ranks);
        } else {
            OutFile out;
            int err = out_file_open(&out, path);
            FILE *f = out.f;
            if (err) {
                ok = rt_error(e, "--trace %s: cannot write: %s", path, out_file_why(err));
            } else {
                fputs("{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":"
                      "{\"name\":\"cleave program\"}},\n", f);
                /* Every rank sent at least its track name; drop the last ",\n". */
                fwrite(all, 1, (size_t)(total >= 2 ? total - 2 : 0), f);
                fprintf(f, "\n],\n"
                        "\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ranks\":%d,\"stages\":%d,\"microbatches\":%d,"
                        "\"schedule\":\"%s\",\"steps_traced\":%" PRId64 ",\"truncated\":%s",
                        ranks, m->layout.stages, m->layout.microbatches, layout_name(&m->layout), steps,
                        T.truncated ? "true" : "false");
                write_memory(f, mem, ranks);
                fputs("}}\n", f);
                err = out_file_finish(&out);
                ok = !err || rt_error(e, "--trace %s: write failed: %s", path, out_file_why(err));
            }
        }
    }
    free(all);
    free(mine);
    free(counts);
    free(displs);
    free(mem);
    free(T.ev);
    memset(&T, 0, sizeof T);
    return ok;
}
