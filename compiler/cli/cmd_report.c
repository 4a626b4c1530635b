/* cmd_report.c - `cleave report --plan PLAN.json --trace TRACE.json`: the
 * cost model's prediction of a plan set against what the program compiled
 * from it measured, so that the model's errors can be seen where they
 * arise (which rank, which stage, which link, which micro-batch) rather
 * than only in the step time.
 *
 * The plan is `cleave plan ... --format json`, whose "prediction" holds
 * the simulated step of every rank (cost/simulate.h); the trace is what
 * the program writes with --trace (runtime/rt_trace.c), read by
 * trace_file.c as trace-stats reads it.  Measured figures are medians
 * over the steps used (after --skip), which a few slow steps on a shared
 * machine do not move. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "out_file.h"
#include "trace_file.h"
#include "../plan/strategy.h"
#include "../util/sort.h"

static const char report_help[] =
    "usage: cleave report --plan PLAN.json --trace TRACE.json [--skip N] [--format text|json|svg] [-o FILE]\n"
    "\n"
    "Sets the prediction of a plan (written by `cleave plan MODEL.onnx --format json`\n"
    "with the flags the program was compiled with) against the trace the program\n"
    "wrote with --trace, rank by rank:\n"
    "\n"
    "  step       predicted step time; measured: the median of the rank's steps\n"
    "  busy       compute (kernels, accumulations); measured: forward, backward,\n"
    "             update and compute events\n"
    "  wait       the rest of the step: receives, sends, allreduces and the wait\n"
    "             for the step's loss; measured: the wait and allreduce events\n"
    "  arena      the memory the plan gives the rank against what the program\n"
    "             allocated, and the process's peak RSS for context\n"
    "\n"
    "then per stage (compute), per link (sender -> receiver: the receiver's time\n"
    "blocked in its receives from the sender), and per micro-batch unit (F m,\n"
    "B m, update) of staged programs.  error = predicted / measured - 1.\n"
    "\n"
    "  --skip N     leave out each rank's first N steps (warm-up), on ranks that\n"
    "               have more than N (default 1)\n"
    "  --format F   text (default), json, or svg (both timelines of one step)\n"
    "  -o FILE      write there instead of stdout\n";

/* One interval of the predicted timeline. */
typedef struct PredEvent {
    int rank, micro, peer;
    double t0, t1;
    char kind;        /* F, B, U, W */
    const char *wait; /* W: recv, send, allreduce, loss (borrowed) */
} PredEvent;

typedef struct PredLink {
    int from, to, messages;
    long long bytes;
    double transfer, recv_wait; /* seconds per step */
} PredLink;

/* A rank: its prediction, the plan's receives, and what the trace shows. */
typedef struct Rank {
    int stage;
    double busy, wait;    /* predicted; wait = step - busy */
    long long arena;      /* predicted */
    int n_recv;
    int *recv_peer;       /* the sender of each of the plan's receives, in order */
    double *unit_pred;    /* n_units: F m at 2m, B m at 2m+1, update at 2M */
    /* measured */
    int lo, hi;           /* its events in Trace.ev */
    TraceStep *steps;     /* all its steps; the used ones from `skipped` on */
    int n_steps, skipped;
    double step, m_busy, m_wait; /* medians, seconds */
    double *unit_meas;
    bool has_memory;
    long long m_arena, rss;
} Rank;

typedef struct Report {
    const char *plan_path, *trace_path;
    json_t *plan;
    Strategy strategy;
    const char *schedule, *cluster;
    int n_ranks, stages, replicas, microbatches, n_units;
    double step;               /* predicted */
    Rank *r;
    PredLink *links;
    int n_links;
    double *link_meas;         /* per link: median recv wait over matched steps */
    int *link_steps;           /* per link: steps whose receives matched the plan's */
    PredEvent *ev;
    int n_ev;
    Trace t;
    int *owner;                /* per trace event: its step on its rank (trace_rank_steps) */
    double m_step;             /* median over steps of the slowest rank */
    long long shown_key;       /* the measured step the SVG draws */
    int steps_used;
} Report;

/* ---- reading the plan ---------------------------------------------------- */

static bool num_at(const Report *R, const json_t *o, const char *where, const char *key, double *v, Diag *d) {
    json_t *x = json_object_get(o, key);
    if (json_is_number(x) && json_number_value(x) >= 0) {
        *v = json_number_value(x);
        return true;
    }
    return diag_error(d, DIAG_FORMAT, "%s: %s.%s: expected a number >= 0", R->plan_path, where, key);
}

static bool int_at(const Report *R, const json_t *o, const char *where, const char *key, long long lo, long long hi,
                   long long *v, Diag *d) {
    json_t *x = json_object_get(o, key);
    if (json_is_integer(x) && json_integer_value(x) >= lo && json_integer_value(x) <= hi) {
        *v = json_integer_value(x);
        return true;
    }
    return diag_error(d, DIAG_FORMAT, "%s: %s.%s: expected an integer from %lld to %lld", R->plan_path, where, key, lo,
                      hi);
}

static bool array_at(const Report *R, const json_t *o, const char *where, const char *key, size_t n, json_t **a,
                     Diag *d) {
    *a = json_object_get(o, key);
    if (json_is_array(*a) && (n == 0 || json_array_size(*a) == n)) return true;
    if (n)
        return diag_error(d, DIAG_FORMAT, "%s: %s.%s: expected an array of %zu entries", R->plan_path, where, key, n);
    return diag_error(d, DIAG_FORMAT, "%s: %s.%s: expected an array", R->plan_path, where, key);
}

/* The layout the plan describes, which the trace's otherData must match,
 * named as the runtime names it: by its schedule when it has stages or
 * micro-batches (whose units the program traces), else "dp" or "single". */
static bool read_layout(Report *R, Diag *d) {
    long long n, st, m;
    if (!int_at(R, R->plan, "plan", "ranks", 1, 1 << 20, &n, d)) return false;
    R->n_ranks = (int)n;
    const char *strategy = json_string_value(json_object_get(R->plan, "strategy"));
    if (!strategy) return diag_error(d, DIAG_FORMAT, "%s: plan.strategy: expected a string", R->plan_path);
    if (!strategy_parse(strategy, &R->strategy))
        return diag_error(d, DIAG_FORMAT, "%s: plan.strategy: expected single, dp, layer, pipeline or hybrid, got '%s'",
                          R->plan_path, strategy);
    if (!int_at(R, R->plan, "plan", "stages", 1, n, &st, d) ||
        !int_at(R, R->plan, "plan", "microbatches", 1, 1 << 20, &m, d))
        return false;
    R->stages = (int)st;
    R->microbatches = (int)m;
    R->replicas = (int)(n / st);
    if (st == 1 && m == 1) {
        R->schedule = R->replicas > 1 ? "dp" : "single";
        return true;
    }
    R->schedule = json_string_value(json_object_get(R->plan, "schedule"));
    if (!R->schedule) return diag_error(d, DIAG_FORMAT, "%s: plan.schedule: expected a string", R->plan_path);
    R->n_units = 2 * R->microbatches + 1;
    return true;
}

/* Rank k's stage and the senders of its receives, from rank_plans[k]. */
static bool read_rank_plan(Report *R, int k, const json_t *rp, Diag *d) {
    char where[48];
    snprintf(where, sizeof where, "rank_plans[%d]", k);
    Rank *x = &R->r[k];
    long long v = 0;
    if (json_object_get(rp, "stage") && !int_at(R, rp, where, "stage", 0, R->stages - 1, &v, d)) return false;
    x->stage = (int)v;
    json_t *steps, *s;
    if (!array_at(R, rp, where, "steps", 0, &steps, d)) return false;
    x->recv_peer = calloc(json_array_size(steps) + 1, sizeof *x->recv_peer);
    if (!x->recv_peer) return diag_error(d, DIAG_NOMEM, "out of memory");
    size_t i;
    json_array_foreach(steps, i, s) {
        const char *kind = json_string_value(json_object_get(s, "kind"));
        if (!kind || strcmp(kind, "recv") != 0) continue;
        char at[80];
        snprintf(at, sizeof at, "%s.steps[%zu]", where, i);
        if (!int_at(R, s, at, "peer", 0, R->n_ranks - 1, &v, d)) return false;
        x->recv_peer[x->n_recv++] = (int)v;
    }
    return true;
}

static bool read_rank_prediction(Report *R, int k, const json_t *o, Diag *d) {
    char where[48];
    snprintf(where, sizeof where, "prediction.ranks[%d]", k);
    Rank *x = &R->r[k];
    double arena;
    if (!num_at(R, o, where, "busy_s", &x->busy, d) || !num_at(R, o, where, "arena_bytes", &arena, d)) return false;
    x->arena = (long long)arena;
    /* Everything but compute: blocked time and the final wait for the loss. */
    x->wait = R->step > x->busy ? R->step - x->busy : 0;
    return true;
}

static bool read_link(Report *R, int i, const json_t *o, Diag *d) {
    char where[48];
    snprintf(where, sizeof where, "prediction.links[%d]", i);
    PredLink *l = &R->links[i];
    long long from, to, msgs;
    double bytes;
    if (!int_at(R, o, where, "from", 0, R->n_ranks - 1, &from, d) ||
        !int_at(R, o, where, "to", 0, R->n_ranks - 1, &to, d) ||
        !int_at(R, o, where, "messages", 0, 1 << 30, &msgs, d) || !num_at(R, o, where, "bytes", &bytes, d) ||
        !num_at(R, o, where, "transfer_s", &l->transfer, d) || !num_at(R, o, where, "recv_wait_s", &l->recv_wait, d))
        return false;
    l->from = (int)from;
    l->to = (int)to;
    l->messages = (int)msgs;
    l->bytes = (long long)bytes;
    return true;
}

static bool read_event(Report *R, int i, const json_t *o, Diag *d) {
    char where[48];
    snprintf(where, sizeof where, "prediction.timeline[%d]", i);
    PredEvent *e = &R->ev[i];
    long long rank, micro, peer = -1;
    const char *kind = json_string_value(json_object_get(o, "kind"));
    if (!int_at(R, o, where, "rank", 0, R->n_ranks - 1, &rank, d) || !num_at(R, o, where, "t0", &e->t0, d) ||
        !num_at(R, o, where, "t1", &e->t1, d) || !int_at(R, o, where, "micro", -1, 1 << 20, &micro, d) ||
        (json_object_get(o, "peer") && !int_at(R, o, where, "peer", 0, R->n_ranks - 1, &peer, d)))
        return false;
    if (!kind || strlen(kind) != 1 || !strchr("FBUW", kind[0]))
        return diag_error(d, DIAG_FORMAT, "%s: %s.kind: expected F, B, U or W", R->plan_path, where);
    e->rank = (int)rank;
    e->micro = (int)micro;
    e->peer = (int)peer;
    e->kind = kind[0];
    e->wait = json_string_value(json_object_get(o, "wait"));
    return true;
}

/* The unit a predicted interval computes for (as unit_index), or -1. */
static int predicted_unit(const PredEvent *e, int microbatches) {
    if (e->kind == 'U') return 2 * microbatches;
    if ((e->kind != 'F' && e->kind != 'B') || e->micro < 0 || e->micro >= microbatches) return -1;
    return 2 * e->micro + (e->kind == 'B');
}

/* Each rank's predicted compute per unit (staged plans), from the timeline. */
static void predicted_units(Report *R) {
    for (int i = 0; i < R->n_ev && R->n_units; i++) {
        int u = predicted_unit(&R->ev[i], R->microbatches);
        if (u >= 0) R->r[R->ev[i].rank].unit_pred[u] += R->ev[i].t1 - R->ev[i].t0;
    }
}

static bool alloc_ranks(Report *R, Diag *d) {
    R->r = calloc((size_t)R->n_ranks, sizeof *R->r);
    bool ok = R->r != NULL;
    for (int k = 0; ok && k < R->n_ranks; k++) {
        R->r[k].unit_pred = calloc((size_t)R->n_units + 1, sizeof(double));
        R->r[k].unit_meas = calloc((size_t)R->n_units + 1, sizeof(double));
        ok = R->r[k].unit_pred && R->r[k].unit_meas;
    }
    return ok || diag_error(d, DIAG_NOMEM, "out of memory");
}

static bool read_prediction(Report *R, const json_t *pred, Diag *d) {
    json_t *ranks, *links, *timeline, *x;
    if (!num_at(R, pred, "prediction", "step_s", &R->step, d) ||
        !array_at(R, pred, "prediction", "ranks", (size_t)R->n_ranks, &ranks, d) ||
        !array_at(R, pred, "prediction", "links", 0, &links, d) ||
        !array_at(R, pred, "prediction", "timeline", 0, &timeline, d))
        return false;
    R->cluster = json_string_value(json_object_get(pred, "cluster"));
    R->n_links = (int)json_array_size(links);
    R->n_ev = (int)json_array_size(timeline);
    R->links = calloc((size_t)R->n_links + 1, sizeof *R->links);
    R->link_meas = calloc((size_t)R->n_links + 1, sizeof *R->link_meas);
    R->link_steps = calloc((size_t)R->n_links + 1, sizeof *R->link_steps);
    R->ev = calloc((size_t)R->n_ev + 1, sizeof *R->ev);
    if (!R->links || !R->link_meas || !R->link_steps || !R->ev) return diag_error(d, DIAG_NOMEM, "out of memory");
    size_t i;
    json_array_foreach(ranks, i, x) if (!read_rank_prediction(R, (int)i, x, d)) return false;
    json_array_foreach(links, i, x) if (!read_link(R, (int)i, x, d)) return false;
    json_array_foreach(timeline, i, x) if (!read_event(R, (int)i, x, d)) return false;
    predicted_units(R);
    return true;
}

static bool read_plan(Report *R, Diag *d) {
    if (!(R->plan = cli_read_json(R->plan_path, d))) return false;
    json_t *pred = json_object_get(R->plan, "prediction");
    if (!json_is_object(pred) || !json_object_get(pred, "timeline"))
        return diag_error(d, DIAG_FORMAT,
                          "%s: no \"prediction\" with a timeline: write the plan with `cleave plan MODEL.onnx "
                          "--format json` and the flags the program was compiled with",
                          R->plan_path);
    json_t *plans, *rp;
    if (!read_layout(R, d) || !alloc_ranks(R, d) ||
        !array_at(R, R->plan, "plan", "rank_plans", (size_t)R->n_ranks, &plans, d))
        return false;
    size_t k;
    json_array_foreach(plans, k, rp) if (!read_rank_plan(R, (int)k, rp, d)) return false;
    return read_prediction(R, pred, d);
}

/* ---- matching the trace to the plan ------------------------------------ */

/* The ranks that traced steps: they must be the plan's 0..n-1. */
static bool match_ranks(Report *R, Diag *d) {
    int traced = 0;
    bool in_range = true;
    for (int lo = 0, hi; lo < R->t.n; lo = hi) {
        hi = trace_rank_end(&R->t, lo);
        long long id = R->t.ev[lo].rank;
        bool has_step = false;
        for (int i = lo; i < hi; i++) has_step |= R->t.ev[i].kind == TRACE_STEP;
        if (!has_step) continue;
        traced++;
        if (id < 0 || id >= R->n_ranks) {
            in_range = false;
            continue;
        }
        R->r[id].lo = lo;
        R->r[id].hi = hi;
    }
    json_t *named = json_object_get(R->t.other, "ranks");
    int n = json_is_integer(named) ? (int)json_integer_value(named) : traced;
    if (n != R->n_ranks || traced != R->n_ranks || !in_range)
        return diag_error(d, DIAG_FORMAT,
                          "%s has %d ranks but the trace %s has %d%s: not the program the plan describes",
                          R->plan_path, R->n_ranks, R->trace_path, n == traced ? traced : n,
                          n == traced ? "" : " (not every rank traced its steps)");
    return true;
}

/* "dp", "single", or "2 stages, 4 micro-batches, gpipe". */
static void layout_text(char *buf, size_t len, long long stages, long long micro, const char *schedule) {
    if (strcmp(schedule, "dp") == 0 || strcmp(schedule, "single") == 0)
        snprintf(buf, len, "%s", schedule);
    else
        snprintf(buf, len, "%lld stage%s, %lld micro-batch%s, %s", stages, stages == 1 ? "" : "s", micro,
                 micro == 1 ? "" : "es", schedule);
}

/* The trace's otherData says how the program was split; it must be the
 * plan's split, or the comparison is between two different programs. */
static bool match_layout(const Report *R, Diag *d) {
    const json_t *o = R->t.other;
    json_t *st = json_object_get(o, "stages"), *mb = json_object_get(o, "microbatches");
    const char *sched = json_string_value(json_object_get(o, "schedule"));
    long long stages = json_is_integer(st) ? (long long)json_integer_value(st) : R->stages;
    long long micro = json_is_integer(mb) ? (long long)json_integer_value(mb) : R->microbatches;
    if (!sched) sched = R->schedule;
    if (stages == R->stages && micro == R->microbatches && strcmp(sched, R->schedule) == 0) return true;
    char planned[96], traced[96];
    layout_text(planned, sizeof planned, R->stages, R->microbatches, R->schedule);
    layout_text(traced, sizeof traced, stages, micro, sched);
    return diag_error(d, DIAG_FORMAT, "%s is a plan for %s but the trace %s is of %.96s: not the program the "
                      "plan describes", R->plan_path, planned, R->trace_path, traced);
}

/* ---- measuring ------------------------------------------------------------ */

/* The median of v[0..n) (sorted in place; the mean of the middle two when
 * n is even), 0 when n is 0. */
static double median(double *v, int n) {
    if (n == 0) return 0;
    sort_doubles(v, (size_t)n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Index of a unit event's name ("F m", "B m", "update") among n_units. */
static int unit_index(const char *name, int microbatches) {
    if (strcmp(name, "update") == 0) return 2 * microbatches;
    char c;
    int m, len = 0;
    if (sscanf(name, "%c %d%n", &c, &m, &len) != 2 || name[len] || (c != 'F' && c != 'B')) return -1;
    return m >= 0 && m < microbatches ? 2 * m + (c == 'B') : -1;
}

static int link_of(const Report *R, int from, int to) {
    for (int i = 0; i < R->n_links; i++)
        if (R->links[i].from == from && R->links[i].to == to) return i;
    return -1;
}

/* Per-step sums of one rank: wall, busy, wait, each unit, and the
 * receive waits per link; scratch arrays indexed [step]. */
typedef struct StepSums {
    double *wall, *busy, *wait, *units; /* units: [unit * steps + step] */
    double *link;                       /* [link * steps + step] */
} StepSums;

/* Adds event e (owned by used step k) into the sums.  recv_seen counts
 * the step's receives so far, which name their sender through the plan's
 * order of receives. */
static void add_event(const Report *R, const Rank *x, const TraceEvent *e, int k, int used, StepSums *S,
                      int *recv_seen) {
    double dur = e->dur / 1e6;
    if (e->kind == TRACE_BUSY) {
        S->busy[k] += dur;
        int u = R->n_units ? unit_index(e->name, R->microbatches) : -1;
        if (u >= 0) S->units[(size_t)u * used + k] += dur;
    } else if (e->kind == TRACE_WAIT || e->kind == TRACE_ALLREDUCE) {
        S->wait[k] += dur;
    }
    if (e->kind != TRACE_WAIT || strcmp(e->name, "recv") != 0) return;
    int j = recv_seen[k]++;
    int l = j < x->n_recv ? link_of(R, x->recv_peer[j], (int)(x - R->r)) : -1;
    if (l >= 0) S->link[(size_t)l * used + k] += dur;
}

/* Medians of rank x's used steps, and its steps' receive waits into each
 * link's samples (link_samples[l], link_n[l]). */
static void rank_medians(Report *R, Rank *x, int used, StepSums *S, const int *recv_seen, double **link_samples,
                         int *link_n) {
    /* each median sorts its own column in place */
    x->step = median(S->wall, used);
    x->m_busy = median(S->busy, used);
    x->m_wait = median(S->wait, used);
    for (int u = 0; u < R->n_units; u++) x->unit_meas[u] = median(S->units + (size_t)u * used, used);
    int me = (int)(x - R->r);
    for (int l = 0; l < R->n_links; l++) {
        if (R->links[l].to != me) continue;
        for (int k = 0; k < used; k++)
            if (recv_seen[k] == x->n_recv) link_samples[l][link_n[l]++] = S->link[(size_t)l * used + k];
    }
}

/* Measures rank x from its events: steps, and per used step the sums. */
static bool measure_rank(Report *R, Rank *x, long long skip, double **link_samples, int *link_n, Diag *d) {
    const TraceEvent *ev = R->t.ev + x->lo;
    int n = x->hi - x->lo, *owner = R->owner + x->lo;
    x->steps = calloc((size_t)n, sizeof *x->steps);
    if (!x->steps) return diag_error(d, DIAG_NOMEM, "out of memory");
    x->n_steps = trace_rank_steps(ev, n, R->t.numbered, x->steps, owner);
    x->skipped = x->n_steps > skip ? (int)skip : 0;
    int used = x->n_steps - x->skipped;
    size_t cells = (size_t)used * (size_t)(3 + R->n_units + R->n_links) + 1;
    double *all = calloc(cells, sizeof *all);
    int *recv_seen = calloc((size_t)used + 1, sizeof *recv_seen);
    if (!all || !recv_seen) {
        free(all);
        free(recv_seen);
        return diag_error(d, DIAG_NOMEM, "out of memory");
    }
    StepSums S = {all, all + used, all + 2 * used, all + 3 * used, all + (size_t)(3 + R->n_units) * used};
    for (int k = 0; k < used; k++) S.wall[k] = x->steps[x->skipped + k].dur / 1e6;
    for (int i = 0; i < n; i++)
        if (owner[i] >= x->skipped) add_event(R, x, &ev[i], owner[i] - x->skipped, used, &S, recv_seen);
    rank_medians(R, x, used, &S, recv_seen, link_samples, link_n);
    free(all);
    free(recv_seen);
    return true;
}

/* otherData.rank_memory[k]: the arena the rank allocated and its peak RSS
 * (absent in traces of programs built before the runtime recorded them). */
static void measured_memory(Report *R) {
    json_t *mem = json_object_get(R->t.other, "rank_memory"), *m;
    size_t i;
    json_array_foreach(mem, i, m) {
        json_t *rank = json_object_get(m, "rank"), *arena = json_object_get(m, "arena_bytes");
        json_t *rss = json_object_get(m, "peak_rss_bytes");
        if (!json_is_integer(rank) || !json_is_integer(arena) || !json_is_integer(rss)) continue;
        long long k = json_integer_value(rank);
        if (k < 0 || k >= R->n_ranks) continue;
        R->r[k].has_memory = true;
        R->r[k].m_arena = json_integer_value(arena);
        R->r[k].rss = json_integer_value(rss);
    }
}

typedef struct KeyDur {
    long long key;
    double dur;
} KeyDur;

static int key_cmp(const void *a, const void *b) {
    const KeyDur *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The used steps of every rank, grouped by key: each group's key and its
 * slowest rank's duration (seconds).  Returns the number of groups. */
static int slowest_per_step(const Report *R, KeyDur *kd, long long *keys, double *slowest) {
    int n = 0, groups = 0;
    for (int k = 0; k < R->n_ranks; k++)
        for (int s = R->r[k].skipped; s < R->r[k].n_steps; s++)
            kd[n++] = (KeyDur){R->r[k].steps[s].key, R->r[k].steps[s].dur / 1e6};
    qsort(kd, (size_t)n, sizeof *kd, key_cmp);
    for (int i = 0, j; i < n; i = j) {
        double worst = 0;
        for (j = i; j < n && kd[j].key == kd[i].key; j++) worst = kd[j].dur > worst ? kd[j].dur : worst;
        keys[groups] = kd[i].key;
        slowest[groups++] = worst;
    }
    return groups;
}

/* The program's step: the median over steps of the slowest rank's
 * duration; the SVG shows the step nearest that median. */
static bool measure_step(Report *R, Diag *d) {
    size_t total = 1;
    for (int k = 0; k < R->n_ranks; k++) total += (size_t)(R->r[k].n_steps - R->r[k].skipped);
    KeyDur *kd = calloc(total, sizeof *kd);
    double *slowest = calloc(total, sizeof *slowest), *sorted = calloc(total, sizeof *sorted);
    long long *keys = calloc(total, sizeof *keys);
    bool ok = kd && slowest && sorted && keys;
    int groups = ok ? slowest_per_step(R, kd, keys, slowest) : 0;
    if (ok) memcpy(sorted, slowest, sizeof *slowest * (size_t)groups);
    R->m_step = median(sorted, groups);
    R->steps_used = groups;
    int best = 0;
    for (int g = 1; g < groups; g++)
        if (fabs(slowest[g] - R->m_step) < fabs(slowest[best] - R->m_step)) best = g;
    R->shown_key = groups ? keys[best] : -1;
    free(kd);
    free(slowest);
    free(sorted);
    free(keys);
    return ok || diag_error(d, DIAG_NOMEM, "out of memory");
}

static bool measure(Report *R, long long skip, Diag *d) {
    R->owner = calloc((size_t)R->t.n + 1, sizeof *R->owner);
    double **samples = calloc((size_t)R->n_links + 1, sizeof *samples);
    int *n_samples = calloc((size_t)R->n_links + 1, sizeof *n_samples);
    bool ok = R->owner && samples && n_samples;
    for (int l = 0; ok && l < R->n_links; l++)
        ok = (samples[l] = calloc((size_t)R->t.n_steps + 1, sizeof **samples)) != NULL;
    if (!ok) diag_error(d, DIAG_NOMEM, "out of memory");
    for (int k = 0; ok && k < R->n_ranks; k++) ok = measure_rank(R, &R->r[k], skip, samples, n_samples, d);
    for (int l = 0; ok && l < R->n_links; l++) {
        R->link_steps[l] = n_samples[l];
        R->link_meas[l] = median(samples[l], n_samples[l]);
    }
    ok = ok && measure_step(R, d);
    measured_memory(R);
    for (int l = 0; samples && l < R->n_links; l++) free(samples[l]);
    free(samples);
    free(n_samples);
    return ok;
}

/* ---- output -------------------------------------------------------------- */

/* predicted / measured - 1; NAN when nothing was measured. */
static double rel_error(double pred, double meas) { return meas > 0 ? pred / meas - 1 : NAN; }

static void put_error(FILE *f, double pred, double meas) {
    double e = rel_error(pred, meas);
    if (isnan(e)) fprintf(f, " %8s", "-");
    else fprintf(f, " %+7.1f%%", 100 * e);
}

/* "pred meas error" in milliseconds. */
static void put_cmp(FILE *f, double pred, double meas) {
    fprintf(f, " %9.3f %9.3f", pred * 1e3, meas * 1e3);
    put_error(f, pred, meas);
}

static void text_header(const Report *R, FILE *f, long long skip) {
    fprintf(f, "report: plan %s (%s", R->plan_path, strategy_name(R->strategy));
    if (R->replicas > 1 && R->n_units) fprintf(f, ", %d replicas x", R->replicas);
    if (R->n_units)
        fprintf(f, "%s%d stage%s, %d micro-batch%s, %s", R->replicas > 1 ? " " : ", ", R->stages,
                R->stages > 1 ? "s" : "", R->microbatches, R->microbatches > 1 ? "es" : "", R->schedule);
    fprintf(f, ", %d rank%s) against trace %s\n", R->n_ranks, R->n_ranks > 1 ? "s" : "", R->trace_path);
    if (R->cluster) fprintf(f, "predicted on: %s\n", R->cluster);
    fprintf(f, "measured: medians over %d step%s", R->steps_used, R->steps_used == 1 ? "" : "s");
    if (skip) fprintf(f, " (each rank's first %lld left out where it has more)", skip);
    fprintf(f, "; error = predicted / measured - 1\n\n");
    fprintf(f, "step: predicted %.3f ms, measured %.3f ms (the slowest rank's), error ", R->step * 1e3,
            R->m_step * 1e3);
    double e = rel_error(R->step, R->m_step);
    if (isnan(e)) fprintf(f, "-\n");
    else fprintf(f, "%+.1f%%\n", 100 * e);
}

static void text_ranks(const Report *R, FILE *f) {
    fprintf(f, "\n%-22s", "per rank, ms");
    static const char *const groups[] = {"step", "busy (compute)", "wait (the rest)"};
    for (int c = 0; c < 3; c++) fprintf(f, "  %-27s", groups[c]);
    fprintf(f, "\n");
    fprintf(f, "  %4s %5s %6s   ", "rank", "stage", "steps");
    for (int c = 0; c < 3; c++) fprintf(f, " %9s %9s %8s", "pred", "meas", "error");
    fprintf(f, "\n");
    for (int k = 0; k < R->n_ranks; k++) {
        const Rank *x = &R->r[k];
        fprintf(f, "  %4d %5d %6d   ", k, x->stage, x->n_steps - x->skipped);
        put_cmp(f, R->step, x->step);
        put_cmp(f, x->busy, x->m_busy);
        put_cmp(f, x->wait, x->m_wait);
        fprintf(f, "\n");
    }
}

static void text_memory(const Report *R, FILE *f) {
    fprintf(f, "\nmemory per rank: the planned arena against the arena the program allocated\n");
    fprintf(f, "  %4s %14s %14s  %-28s %12s\n", "rank", "arena pred B", "arena meas B", "", "peak RSS MB");
    for (int k = 0; k < R->n_ranks; k++) {
        const Rank *x = &R->r[k];
        if (!x->has_memory) {
            fprintf(f, "  %4d %14lld %14s  %-28s %12s\n", k, x->arena, "-", "not in the trace", "-");
            continue;
        }
        char verdict[64];
        if (x->m_arena == x->arena) snprintf(verdict, sizeof verdict, "equal: within the prediction");
        else if (x->m_arena < x->arena) snprintf(verdict, sizeof verdict, "below: within the prediction");
        else snprintf(verdict, sizeof verdict, "OVER the prediction by %lld B", x->m_arena - x->arena);
        fprintf(f, "  %4d %14lld %14lld  %-28s %12.1f\n", k, x->arena, x->m_arena, verdict, (double)x->rss / 1e6);
    }
    fprintf(f, "  peak RSS is the whole process (code, MPI, libraries, the loaded data, the arena), for\n"
               "  context: the plan predicts the arena only\n");
}

/* Mean predicted and measured compute of stage s's ranks. */
static void stage_busy(const Report *R, int s, double *pred, double *meas, int *n) {
    *pred = *meas = 0;
    *n = 0;
    for (int k = 0; k < R->n_ranks; k++) {
        if (R->r[k].stage != s) continue;
        *pred += R->r[k].busy;
        *meas += R->r[k].m_busy;
        (*n)++;
    }
    if (*n) {
        *pred /= *n;
        *meas /= *n;
    }
}

static void text_stages(const Report *R, FILE *f) {
    fprintf(f, "\nper stage: compute per rank (mean over the stage's ranks), ms\n");
    fprintf(f, "  %5s %5s %9s %9s %8s\n", "stage", "ranks", "pred", "meas", "error");
    for (int s = 0; s < R->stages; s++) {
        double p, m;
        int n;
        stage_busy(R, s, &p, &m, &n);
        fprintf(f, "  %5d %5d", s, n);
        put_cmp(f, p, m);
        fprintf(f, "\n");
    }
}

static void text_links(const Report *R, FILE *f) {
    if (!R->n_links) return;
    fprintf(f, "\nper link (sender -> receiver), per step, ms\n");
    fprintf(f, "  %8s %5s %10s %9s %9s %9s %8s %6s\n", "link", "msgs", "bytes", "transfer", "wait pred", "wait meas",
            "error", "steps");
    for (int l = 0; l < R->n_links; l++) {
        const PredLink *x = &R->links[l];
        char name[32];
        snprintf(name, sizeof name, "%d -> %d", x->from, x->to);
        fprintf(f, "  %8s %5d %10lld %9.3f %9.3f", name, x->messages, x->bytes, x->transfer * 1e3, x->recv_wait * 1e3);
        if (R->link_steps[l]) {
            fprintf(f, " %9.3f", R->link_meas[l] * 1e3);
            put_error(f, x->recv_wait, R->link_meas[l]);
        } else {
            fprintf(f, " %9s %8s", "-", "-");
        }
        fprintf(f, " %6d\n", R->link_steps[l]);
    }
    fprintf(f, "  transfer: the predicted latency + bytes / bandwidth of the step's messages.  wait: the\n"
               "  receiver's time blocked in its receives from the sender, which also holds the time\n"
               "  it is ahead of the sender (in the prediction as in the trace); the trace cannot\n"
               "  separate the link's own time.  steps: those whose receives matched the plan's one\n"
               "  for one (a trace names no sender; receives are matched in the plan's order).\n");
}

/* The i-th unit in the order they are listed: every forward, every
 * backward, the update; returns its index (2m for F m, 2m+1 for B m). */
static int listed_unit(int i, int microbatches) {
    if (i < microbatches) return 2 * i;
    if (i < 2 * microbatches) return 2 * (i - microbatches) + 1;
    return 2 * microbatches;
}

static void unit_name(int u, int microbatches, char *buf, size_t len) {
    if (u == 2 * microbatches) snprintf(buf, len, "update");
    else snprintf(buf, len, "%c %d", u % 2 ? 'B' : 'F', u / 2);
}

static void text_units(const Report *R, FILE *f) {
    if (!R->n_units) return;
    fprintf(f, "\nper unit: compute of each micro-batch's forward (F m) and backward (B m), and the update, ms\n");
    fprintf(f, "  %4s %-7s %9s %9s %8s\n", "rank", "unit", "pred", "meas", "error");
    for (int k = 0; k < R->n_ranks; k++)
        for (int i = 0; i < R->n_units; i++) {
            const Rank *x = &R->r[k];
            int u = listed_unit(i, R->microbatches);
            if (x->unit_pred[u] == 0 && x->unit_meas[u] == 0) continue;
            char name[24];
            unit_name(u, R->microbatches, name, sizeof name);
            fprintf(f, "  %4d %-7s", k, name);
            put_cmp(f, x->unit_pred[u], x->unit_meas[u]);
            fprintf(f, "\n");
        }
}

static void print_text(const Report *R, FILE *f, long long skip) {
    text_header(R, f, skip);
    text_ranks(R, f);
    text_memory(R, f);
    text_stages(R, f);
    text_links(R, f);
    text_units(R, f);
    if (json_is_true(json_object_get(R->t.other, "truncated")))
        fprintf(f, "\nnote: the trace is truncated (otherData.truncated); only the steps it holds are counted\n");
}

/* {"predicted_s", "measured_s", "error"}; error null when nothing was measured. */
static json_t *cmp_json(double pred, double meas) {
    double e = rel_error(pred, meas);
    return json_pack("{s:f, s:f, s:o}", "predicted_s", pred, "measured_s", meas, "error",
                     isnan(e) ? json_null() : json_real(e));
}

static json_t *rank_json(const Report *R, int k) {
    const Rank *x = &R->r[k];
    json_t *units = json_array();
    for (int i = 0; i < R->n_units; i++) {
        int u = listed_unit(i, R->microbatches);
        char name[24];
        unit_name(u, R->microbatches, name, sizeof name);
        json_t *c = json_pack("{s:s}", "unit", name), *cmp = cmp_json(x->unit_pred[u], x->unit_meas[u]);
        json_object_update(c, cmp);
        json_decref(cmp);
        json_array_append_new(units, c);
    }
    json_t *arena = json_pack("{s:I, s:o, s:o}", "predicted_bytes", (json_int_t)x->arena, "measured_bytes",
                              x->has_memory ? json_integer(x->m_arena) : json_null(), "within_prediction",
                              x->has_memory ? json_boolean(x->m_arena <= x->arena) : json_null());
    return json_pack("{s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "rank", k, "stage", x->stage, "steps",
                     x->n_steps - x->skipped, "skipped", x->skipped, "step", cmp_json(R->step, x->step), "busy",
                     cmp_json(x->busy, x->m_busy), "wait", cmp_json(x->wait, x->m_wait), "arena", arena,
                     "peak_rss_bytes", x->has_memory ? json_integer(x->rss) : json_null(), "units", units);
}

static json_t *stages_json(const Report *R) {
    json_t *a = json_array();
    for (int s = 0; s < R->stages; s++) {
        json_t *ranks = json_array();
        for (int k = 0; k < R->n_ranks; k++)
            if (R->r[k].stage == s) json_array_append_new(ranks, json_integer(k));
        double p, m;
        int n;
        stage_busy(R, s, &p, &m, &n);
        json_array_append_new(a, json_pack("{s:i, s:o, s:o}", "stage", s, "ranks", ranks, "busy", cmp_json(p, m)));
    }
    return a;
}

static json_t *links_json(const Report *R) {
    json_t *a = json_array();
    for (int l = 0; l < R->n_links; l++) {
        const PredLink *x = &R->links[l];
        json_array_append_new(
            a, json_pack("{s:i, s:i, s:i, s:I, s:f, s:o, s:i}", "from", x->from, "to", x->to, "messages", x->messages,
                         "bytes", (json_int_t)x->bytes, "transfer_s", x->transfer, "recv_wait",
                         R->link_steps[l] ? cmp_json(x->recv_wait, R->link_meas[l])
                                          : json_pack("{s:f, s:n, s:n}", "predicted_s", x->recv_wait, "measured_s",
                                                      "error"),
                         "steps_matched", R->link_steps[l]));
    }
    return a;
}

static bool print_json(const Report *R, FILE *f, long long skip) {
    json_t *ranks = json_array();
    for (int k = 0; k < R->n_ranks; k++) json_array_append_new(ranks, rank_json(R, k));
    json_t *root = json_pack("{s:s, s:s, s:s, s:i, s:I, s:o, s:o, s:o, s:o}", "plan", R->plan_path, "trace",
                             R->trace_path, "strategy", strategy_name(R->strategy), "steps_used", R->steps_used, "skip",
                             (json_int_t)skip, "step", cmp_json(R->step, R->m_step), "ranks", ranks, "stages",
                             stages_json(R), "links", links_json(R));
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    if (text) fprintf(f, "%s\n", text);
    free(text);
    json_decref(root);
    return text != NULL;
}

/* ---- SVG: both timelines of one step ------------------------------------- */

enum { SVG_WIDTH = 1100, SVG_LEFT = 130, SVG_ROW = 16, SVG_GAP = 8, SVG_TOP = 56, SVG_MAX_RANKS = 64 };

static const char *color_of(char kind, const char *wait) {
    switch (kind) {
    case 'F': return "#4e79a7";
    case 'B': return "#f28e2b";
    case 'U': return "#59a14f";
    case 'C': return "#9c755f"; /* measured compute of programs without units */
    case 'A': return "#b07aa1"; /* allreduce */
    default: return wait && strcmp(wait, "allreduce") == 0 ? "#b07aa1" : "#e15759";
    }
}

static void svg_rect(FILE *f, double x0, double x1, int y, const char *color, const char *label) {
    fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>%s</title></rect>\n", x0, y,
            x1 - x0 > 0.2 ? x1 - x0 : 0.2, SVG_ROW - 2, color, label);
}

static void svg_predicted_row(const Report *R, FILE *f, int k, int y, double scale) {
    fprintf(f, "<g class=\"row\" data-rank=\"%d\" data-source=\"predicted\">\n<text x=\"4\" y=\"%d\">rank %d predicted"
               "</text>\n", k, y + 12, k);
    for (int i = 0; i < R->n_ev; i++) {
        const PredEvent *e = &R->ev[i];
        if (e->rank != k) continue;
        char label[96], what[32];
        if (e->kind == 'W') snprintf(what, sizeof what, "%s", e->wait ? e->wait : "wait");
        else if (e->kind == 'U') snprintf(what, sizeof what, "update");
        else if (e->micro >= 0) snprintf(what, sizeof what, "%c %d", e->kind, e->micro);
        else snprintf(what, sizeof what, "%s", e->kind == 'F' ? "forward" : "backward");
        snprintf(label, sizeof label, "%.32s %.3f ms", what, (e->t1 - e->t0) * 1e3);
        svg_rect(f, SVG_LEFT + e->t0 * scale, SVG_LEFT + e->t1 * scale, y + 1, color_of(e->kind, e->wait), label);
    }
    fprintf(f, "</g>\n");
}

/* The kind a measured event is drawn as, from its category and name. */
static char measured_kind(const TraceEvent *e) {
    if (e->kind == TRACE_ALLREDUCE) return 'A';
    if (e->kind == TRACE_WAIT) return 'W';
    if (strcmp(e->name, "update") == 0) return 'U';
    if (e->name[0] == 'F' || e->name[0] == 'B') return e->name[0];
    return 'C';
}

/* Rank k's events of the shown step, relative to `origin` (seconds). */
static void svg_measured_row(const Report *R, FILE *f, int k, int y, double scale, double origin) {
    const Rank *x = &R->r[k];
    fprintf(f, "<g class=\"row\" data-rank=\"%d\" data-source=\"measured\">\n<text x=\"4\" y=\"%d\">rank %d measured"
               "</text>\n", k, y + 12, k);
    int step = -1;
    for (int s = 0; s < x->n_steps; s++)
        if (x->steps[s].key == R->shown_key) step = s;
    for (int i = x->lo; i < x->hi && step >= 0; i++) {
        const TraceEvent *e = &R->t.ev[i];
        if (R->owner[i] != step || e->kind == TRACE_OTHER) continue;
        double t0 = e->ts / 1e6 - origin, t1 = t0 + e->dur / 1e6;
        char label[96];
        snprintf(label, sizeof label, "%.40s %.3f ms", e->name, e->dur / 1e3);
        char kind = measured_kind(e);
        svg_rect(f, SVG_LEFT + t0 * scale, SVG_LEFT + t1 * scale, y + 1, color_of(kind, NULL), label);
    }
    fprintf(f, "</g>\n");
}

/* When the shown step starts on its earliest rank, and how long it lasts
 * until its last rank ends (seconds). */
static void shown_step(const Report *R, double *origin, double *length) {
    double start = INFINITY, end = -INFINITY;
    for (int k = 0; k < R->n_ranks; k++)
        for (int s = 0; s < R->r[k].n_steps; s++) {
            const TraceStep *st = &R->r[k].steps[s];
            if (st->key != R->shown_key) continue;
            start = fmin(start, st->ts / 1e6);
            end = fmax(end, (st->ts + st->dur) / 1e6);
        }
    *origin = isfinite(start) ? start : 0;
    *length = isfinite(start) ? end - start : 0;
}

static void svg_legend(FILE *f) {
    static const struct {
        char kind;
        const char *wait, *what;
    } keys[] = {{'F', NULL, "forward"}, {'B', NULL, "backward"}, {'U', NULL, "update"},
                {'C', NULL, "compute (programs without micro-batch units)"}, {'W', NULL, "waiting (recv, send, loss)"},
                {'A', NULL, "allreduce"}};
    double x = 10;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        fprintf(f, "<rect x=\"%.0f\" y=\"34\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" y=\"43\">%s"
                   "</text>\n", x, color_of(keys[i].kind, keys[i].wait), x + 14, keys[i].what);
        x += 24 + 6.2 * (double)strlen(keys[i].what);
    }
}

static void put_xml(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

static void print_svg(const Report *R, FILE *f) {
    int rows = R->n_ranks < SVG_MAX_RANKS ? R->n_ranks : SVG_MAX_RANKS;
    double origin, length;
    shown_step(R, &origin, &length);
    double span = fmax(R->step, length), scale = span > 0 ? (SVG_WIDTH - SVG_LEFT - 20) / span : 0;
    int pair = 2 * SVG_ROW + SVG_GAP, height = SVG_TOP + rows * pair + 30;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<text x=\"10\" y=\"16\" font-size=\"13\">", SVG_WIDTH, height);
    put_xml(f, R->plan_path);
    fputs(" predicted against ", f);
    put_xml(f, R->trace_path);
    fprintf(f, " measured (step %lld)</text>\n<text x=\"10\" y=\"29\">predicted step %.3f ms, measured %.3f ms "
               "(median %.3f ms)%s</text>\n", R->shown_key, R->step * 1e3, length * 1e3, R->m_step * 1e3,
            rows < R->n_ranks ? "; the first 64 ranks" : "");
    svg_legend(f);
    for (int k = 0; k < rows; k++) {
        int y = SVG_TOP + k * pair;
        svg_predicted_row(R, f, k, y, scale);
        svg_measured_row(R, f, k, y + SVG_ROW, scale, origin);
    }
    int axis = SVG_TOP + rows * pair + 14;
    for (int t = 0; t <= 4; t++)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\">%.3g ms</text>\n", SVG_LEFT + t * (SVG_WIDTH - SVG_LEFT - 20) / 4.0,
                axis, span * 1e3 * t / 4);
    fprintf(f, "</svg>\n");
}

/* ---- command --------------------------------------------------------------- */

static void report_free(Report *R) {
    for (int k = 0; R->r && k < R->n_ranks; k++) {
        free(R->r[k].recv_peer);
        free(R->r[k].unit_pred);
        free(R->r[k].unit_meas);
        free(R->r[k].steps);
    }
    free(R->r);
    free(R->links);
    free(R->link_meas);
    free(R->link_steps);
    free(R->ev);
    free(R->owner);
    trace_free(&R->t);
    json_decref(R->plan);
}

typedef struct Flags {
    const char *plan, *trace, *format, *out;
    int64_t skip;
} Flags;

/* Parses argv into f; returns -1 to go on, else the exit status. */
static int parse_flags(int argc, char **argv, Flags *f) {
    *f = (Flags){.format = "text", .skip = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **val = strcmp(a, "--plan") == 0    ? &f->plan
                           : strcmp(a, "--trace") == 0  ? &f->trace
                           : strcmp(a, "--format") == 0 ? &f->format
                           : strcmp(a, "-o") == 0       ? &f->out
                                                        : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(report_help, stdout);
            return 0;
        } else if (strcmp(a, "--skip") == 0) {
            if (i + 1 >= argc || !cli_parse_i64(argv[++i], 0, 1 << 30, &f->skip))
                return cli_usage("report", "--skip needs a non-negative integer");
        } else if (val) {
            if (i + 1 >= argc) return cli_usage("report", "%s needs a value", a);
            *val = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("report", "unknown flag '%s'", a);
        } else {
            return cli_usage("report", "unexpected argument '%s' (the files go with --plan and --trace)", a);
        }
    }
    if (strcmp(f->format, "text") && strcmp(f->format, "json") && strcmp(f->format, "svg"))
        return cli_usage("report", "unknown format '%s' (text, json or svg)", f->format);
    if (!f->plan) return cli_usage("report", "no --plan given (write one with 'cleave plan MODEL.onnx --format json')");
    if (!f->trace) return cli_usage("report", "no --trace given (run the program with --trace FILE)");
    return -1;
}

static bool emit(const Report *R, const Flags *fl, Diag *d) {
    OutFile out = {0};
    int err = fl->out ? out_file_open(&out, fl->out) : 0;
    if (err) return diag_error(d, DIAG_IO, "-o %s: cannot write: %s", fl->out, out_file_why(err));
    FILE *f = fl->out ? out.f : stdout;
    bool ok = true;
    if (strcmp(fl->format, "json") == 0) ok = print_json(R, f, (long long)fl->skip);
    else if (strcmp(fl->format, "svg") == 0) print_svg(R, f);
    else print_text(R, f, (long long)fl->skip);
    if (!ok) diag_error(d, DIAG_NOMEM, "out of memory");
    if (!fl->out) return ok;
    if (!ok) {
        out_file_abort(&out);
        return false;
    }
    err = out_file_finish(&out);
    return !err || diag_error(d, DIAG_IO, "-o %s: write failed: %s", fl->out, out_file_why(err));
}

int cmd_report(int argc, char **argv) {
    Flags fl;
    int status = parse_flags(argc, argv, &fl);
    if (status >= 0) return status;
    Diag d = {0};
    Report R = {.plan_path = fl.plan, .trace_path = fl.trace};
    bool ok = read_plan(&R, &d) && trace_read(fl.trace, &R.t, &d) && match_ranks(&R, &d) && match_layout(&R, &d) &&
              measure(&R, (long long)fl.skip, &d) && emit(&R, &fl, &d);
    report_free(&R);
    return ok ? 0 : cli_fail(&d);
}
