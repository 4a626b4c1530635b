/* trace_file.c - reading a program's --trace file (trace_file.h). */
#include "trace_file.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/file_util.h"

json_t *cli_read_json(const char *path, Diag *d) {
    size_t len;
    uint8_t *buf = file_read_all(path, &len, d);
    if (!buf) return NULL;
    json_error_t err;
    json_t *root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &err);
    free(buf);
    if (!root) diag_error(d, DIAG_FORMAT, "%s: not JSON: line %d, column %d: %s", path, err.line, err.column, err.text);
    return root;
}

static TraceKind kind_of(const char *cat) {
    if (!cat) return TRACE_OTHER;
    if (strcmp(cat, "step") == 0) return TRACE_STEP;
    /* "compute": programs without micro-batches do not split their work */
    if (strcmp(cat, "forward") == 0 || strcmp(cat, "backward") == 0 || strcmp(cat, "update") == 0 ||
        strcmp(cat, "compute") == 0)
        return TRACE_BUSY;
    if (strcmp(cat, "wait") == 0) return TRACE_WAIT;
    if (strcmp(cat, "allreduce") == 0) return TRACE_ALLREDUCE;
    return TRACE_OTHER;
}

static int event_cmp(const void *a, const void *b) {
    const TraceEvent *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Checks one "X" event and fills e; false with a Diag naming it. */
static bool read_event(const char *path, size_t i, json_t *ev, TraceEvent *e, Diag *d) {
    const char *name = json_string_value(json_object_get(ev, "name"));
    if (!name) name = "";
    json_t *ts = json_object_get(ev, "ts"), *dur = json_object_get(ev, "dur"), *tid = json_object_get(ev, "tid");
    if (!json_is_number(ts) || !json_is_number(dur))
        return diag_error(d, DIAG_FORMAT, "%s: traceEvents[%zu] (\"%.64s\"): an X event needs numeric ts and dur",
                          path, i, name);
    e->ts = json_number_value(ts);
    e->dur = json_number_value(dur);
    if (e->dur < 0)
        return diag_error(d, DIAG_FORMAT, "%s: traceEvents[%zu] (\"%.64s\"): negative dur %g", path, i, name, e->dur);
    if (e->dur > TRACE_MAX_US || e->ts > TRACE_MAX_US || e->ts < -TRACE_MAX_US)
        return diag_error(d, DIAG_FORMAT, "%s: traceEvents[%zu] (\"%.64s\"): ts or dur beyond %g microseconds", path,
                          i, name, TRACE_MAX_US);
    if (!json_is_integer(tid))
        return diag_error(d, DIAG_FORMAT, "%s: traceEvents[%zu] (\"%.64s\"): tid (the rank) is not an integer", path,
                          i, name);
    e->rank = json_integer_value(tid);
    e->index = i;
    e->name = name;
    e->kind = kind_of(json_string_value(json_object_get(ev, "cat")));
    json_t *step = json_object_get(json_object_get(ev, "args"), "step");
    e->step = json_is_integer(step) ? json_integer_value(step) : -1;
    return true;
}

/* Reads and checks every X event of events into t->ev. */
static bool read_events(Trace *t, json_t *events, Diag *d) {
    size_t total = json_array_size(events);
    if (total > INT_MAX) return diag_error(d, DIAG_LIMIT, "%s: more than %d events", t->path, INT_MAX);
    t->ev = calloc(total ? total : 1, sizeof *t->ev);
    if (!t->ev) return diag_error(d, DIAG_NOMEM, "%s: out of memory for %zu events", t->path, total);
    int numbered = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (!json_is_object(e)) return diag_error(d, DIAG_FORMAT, "%s: traceEvents[%zu] is not an object", t->path, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (!ph || strcmp(ph, "X") != 0) continue; /* metadata, instants, ... */
        TraceEvent *x = &t->ev[t->n];
        if (!read_event(t->path, i, e, x, d)) return false;
        t->n++;
        if (x->kind == TRACE_STEP) {
            t->n_steps++;
            numbered += x->step >= 0;
        }
    }
    t->numbered = numbered == t->n_steps;
    return true;
}

bool trace_read(const char *path, Trace *t, Diag *d) {
    memset(t, 0, sizeof *t);
    t->path = path;
    if (!(t->root = cli_read_json(path, d))) return false;
    json_t *events = json_object_get(t->root, "traceEvents");
    bool ok = json_is_array(events) || diag_error(d, DIAG_FORMAT, "%s: no traceEvents array", path);
    t->other = json_object_get(t->root, "otherData");
    ok = ok && read_events(t, events, d);
    if (ok && t->n_steps == 0)
        ok = diag_error(d, DIAG_FORMAT, "%s: no step events (was it written by a program run with --trace?)", path);
    if (!ok) {
        trace_free(t);
        return false;
    }
    qsort(t->ev, (size_t)t->n, sizeof *t->ev, event_cmp);
    return true;
}

void trace_free(Trace *t) {
    free(t->ev);
    json_decref(t->root);
    memset(t, 0, sizeof *t);
}

int trace_rank_end(const Trace *t, int lo) {
    int hi = lo;
    while (hi < t->n && t->ev[hi].rank == t->ev[lo].rank) hi++;
    return hi;
}

/* The index of the step of steps[0..n) (sorted by ts) holding e, or -1. */
static int step_holding(const TraceStep *steps, int n, const TraceEvent *e) {
    double mid = e->ts + e->dur / 2;
    int lo = 0, hi = n; /* first step starting after mid */
    while (lo < hi) {
        int m = lo + (hi - lo) / 2;
        if (steps[m].ts <= mid) lo = m + 1;
        else hi = m;
    }
    if (lo == 0 || mid > steps[lo - 1].ts + steps[lo - 1].dur) return -1;
    return lo - 1;
}

int trace_rank_steps(const TraceEvent *ev, int n, bool numbered, TraceStep *steps, int *owner) {
    int n_steps = 0;
    for (int i = 0; i < n; i++) {
        if (ev[i].kind != TRACE_STEP) continue;
        steps[n_steps] = (TraceStep){.key = numbered ? ev[i].step : n_steps, .ts = ev[i].ts, .dur = ev[i].dur};
        n_steps++;
    }
    for (int i = 0; i < n; i++) owner[i] = ev[i].kind == TRACE_STEP ? -1 : step_holding(steps, n_steps, &ev[i]);
    return n_steps;
}
