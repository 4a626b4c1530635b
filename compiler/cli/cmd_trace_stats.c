/* cmd_trace_stats.c - `cleave trace-stats`: where a training program's step
 * time went, read from the Chrome trace its runtime writes with --trace.
 * The number it exists for is the bubble: the share of each rank's step
 * time not spent computing, which is what a pipeline schedule tries to cut. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace_file.h"

static const char trace_stats_help[] =
    "usage: cleave trace-stats FILE [--skip N] [--format text|json]\n"
    "\n"
    "Reads the trace a training program writes when run with --trace FILE and\n"
    "prints, for each rank (the trace's tid), how its step time divides:\n"
    "\n"
    "  steps      number of \"step\" events used (after --skip)\n"
    "  wall       sum of their durations\n"
    "  busy       sum of the forward, backward, update and compute events\n"
    "  idle       wall - busy: waiting, allreduce, and anything untraced\n"
    "  wait       sum of the \"wait\" events (blocked in recv or send)\n"
    "  allreduce  sum of the \"allreduce\" events\n"
    "  bubble     idle / wall\n"
    "\n"
    "Overall, bubble is the sum of idle over the sum of wall of all ranks, and\n"
    "the mean step is the mean over steps of the slowest rank's duration of\n"
    "that step (steps matched by args.step, or by order when a step event\n"
    "lacks it).  Events of other categories count as idle; events outside\n"
    "every step of their rank are ignored.\n"
    "\n"
    "  --skip N     ignore each rank's first N steps as warm-up, on ranks that\n"
    "               have more than N (default 1)\n"
    "  --format F   text (default) or json\n";

typedef struct Step {
    long long key; /* what matches this step across ranks */
    double dur, busy, wait, allreduce;
} Step;

typedef struct RankStats {
    long long rank;
    int steps, skipped;
    double wall, busy, wait, allreduce; /* microseconds */
} RankStats;

typedef struct Stats {
    const char *path;
    const json_t *other; /* otherData, borrowed; may be NULL */
    int n_ranks, steps_used;
    RankStats *ranks;
    double wall, busy, mean_step; /* microseconds */
} Stats;

static int step_key_cmp(const void *a, const void *b) {
    const Step *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Events ev[0..n) are one rank's, sorted by ts; its steps go to steps[],
 * the used ones (after skip) first.  spans and owner are scratch space
 * for trace_rank_steps.  Returns the number used. */
static int rank_stats(const TraceEvent *ev, int n, long long skip, bool numbered, TraceStep *spans, int *owner,
                      Step *steps, RankStats *r) {
    int n_steps = trace_rank_steps(ev, n, numbered, spans, owner);
    for (int k = 0; k < n_steps; k++) steps[k] = (Step){.key = spans[k].key, .dur = spans[k].dur};
    for (int i = 0; i < n; i++) {
        if (owner[i] < 0 || ev[i].kind == TRACE_OTHER) continue; /* other categories count as idle */
        Step *s = &steps[owner[i]];
        if (ev[i].kind == TRACE_BUSY) s->busy += ev[i].dur;
        else if (ev[i].kind == TRACE_WAIT) s->wait += ev[i].dur;
        else s->allreduce += ev[i].dur;
    }
    *r = (RankStats){.rank = ev[0].rank, .skipped = n_steps > skip ? (int)skip : 0};
    r->steps = n_steps - r->skipped;
    memmove(steps, steps + r->skipped, (size_t)r->steps * sizeof *steps);
    for (int i = 0; i < r->steps; i++) {
        r->wall += steps[i].dur;
        r->busy += steps[i].busy;
        r->wait += steps[i].wait;
        r->allreduce += steps[i].allreduce;
    }
    return r->steps;
}

/* Mean over the used steps (grouped by key) of the slowest rank's time. */
static double mean_step(Step *used, int n, int *n_groups) {
    qsort(used, (size_t)n, sizeof *used, step_key_cmp);
    double sum = 0;
    int groups = 0;
    for (int i = 0; i < n;) {
        double slowest = 0;
        int j = i;
        for (; j < n && used[j].key == used[i].key; j++)
            if (used[j].dur > slowest) slowest = used[j].dur;
        sum += slowest;
        groups++;
        i = j;
    }
    *n_groups = groups;
    return groups ? sum / groups : 0;
}

static bool gather_stats(const Trace *t, long long skip, Stats *s, Diag *d) {
    s->other = t->other;
    Step *steps = calloc((size_t)t->n_steps, sizeof *steps);
    TraceStep *spans = calloc((size_t)t->n_steps, sizeof *spans);
    int *owner = calloc((size_t)t->n, sizeof *owner);
    s->ranks = calloc((size_t)t->n_steps, sizeof *s->ranks); /* a rank has at least one step */
    bool ok = steps && spans && owner && s->ranks;
    if (!ok) diag_error(d, DIAG_NOMEM, "%s: out of memory", t->path);
    int used = 0;
    for (int lo = 0, hi; ok && lo < t->n; lo = hi) {
        hi = trace_rank_end(t, lo);
        bool has_step = false;
        for (int i = lo; i < hi; i++) has_step |= t->ev[i].kind == TRACE_STEP;
        if (!has_step) continue; /* a rank that traced no step has nothing to measure against */
        RankStats *r = &s->ranks[s->n_ranks++];
        used += rank_stats(t->ev + lo, hi - lo, skip, t->numbered, spans, owner, steps + used, r);
        s->wall += r->wall;
        s->busy += r->busy;
    }
    if (ok) s->mean_step = mean_step(steps, used, &s->steps_used);
    free(owner);
    free(spans);
    free(steps);
    return ok;
}

/* idle / wall, or 0 for steps of no duration (JSON has no NaN). */
static double bubble(double wall, double busy) { return wall > 0 ? (wall - busy) / wall : 0; }

static int print_json(const Stats *s) {
    json_t *ranks = json_array();
    for (int i = 0; i < s->n_ranks; i++) {
        const RankStats *r = &s->ranks[i];
        json_array_append_new(
            ranks, json_pack("{s:I, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "rank", (json_int_t)r->rank, "steps",
                             r->steps, "skipped", r->skipped, "wall_s", r->wall / 1e6, "busy_s", r->busy / 1e6,
                             "idle_s", (r->wall - r->busy) / 1e6, "wait_s", r->wait / 1e6, "allreduce_s",
                             r->allreduce / 1e6, "bubble", bubble(r->wall, r->busy)));
    }
    json_t *root = json_pack("{s:s, s:o, s:f, s:f, s:i}", "file", s->path, "ranks", ranks, "bubble",
                             bubble(s->wall, s->busy), "mean_step_s", s->mean_step / 1e6, "steps_used", s->steps_used);
    /* What the program said about itself, where it said it. */
    static const char *const keys[] = {"stages", "microbatches", "schedule", "truncated"};
    for (size_t k = 0; root && k < sizeof keys / sizeof *keys; k++) {
        json_t *v = json_object_get(s->other, keys[k]);
        if (json_is_integer(v) || json_is_string(v) || json_is_boolean(v)) json_object_set(root, keys[k], v);
    }
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12)) : NULL;
    if (text) puts(text);
    free(text);
    json_decref(root);
    return text ? 0 : 1;
}

static void print_text(const Stats *s, long long skip) {
    const json_t *o = s->other;
    json_t *ranks = json_object_get(o, "ranks"), *stages = json_object_get(o, "stages");
    json_t *mb = json_object_get(o, "microbatches"), *schedule = json_object_get(o, "schedule");
    /* "3 of 4 ranks" when a rank traced no step or the trace is partial */
    bool partial = json_is_integer(ranks) && json_integer_value(ranks) != s->n_ranks;
    printf("trace %s: %d", s->path, s->n_ranks);
    if (partial) printf(" of %lld", (long long)json_integer_value(ranks));
    printf(" rank%s", s->n_ranks == 1 && !partial ? "" : "s");
    if (json_is_integer(stages))
        printf(", %lld stage%s", (long long)json_integer_value(stages), json_integer_value(stages) == 1 ? "" : "s");
    if (json_is_integer(mb))
        printf(", %lld microbatch%s", (long long)json_integer_value(mb), json_integer_value(mb) == 1 ? "" : "es");
    if (json_is_string(schedule)) printf(", schedule %s", json_string_value(schedule));
    printf("\n\n%6s %6s %11s %11s %11s %11s %12s %7s\n", "rank", "steps", "wall ms", "busy ms", "idle ms", "wait ms",
           "allreduce ms", "bubble");
    int skipped = 0; /* ranks that had enough steps to skip */
    for (int i = 0; i < s->n_ranks; i++) {
        const RankStats *r = &s->ranks[i];
        skipped += r->skipped > 0;
        printf("%6lld %6d %11.3f %11.3f %11.3f %11.3f %12.3f %6.1f%%\n", r->rank, r->steps, r->wall / 1e3,
               r->busy / 1e3, (r->wall - r->busy) / 1e3, r->wait / 1e3, r->allreduce / 1e3,
               100 * bubble(r->wall, r->busy));
    }
    printf("\nsteps used: %d", s->steps_used);
    if (skip == 0) printf(" (--skip 0: none skipped)\n");
    else if (skipped == s->n_ranks) printf(" (the first %lld of each rank skipped as warm-up)\n", skip);
    else if (skipped == 0) printf(" (none skipped: --skip %lld needs at least %lld steps per rank)\n", skip, skip + 1);
    else printf(" (the first %lld skipped on the %d ranks that have more)\n", skip, skipped);
    printf("bubble %.1f%% (idle / wall over all ranks), mean step %.3f ms\n", 100 * bubble(s->wall, s->busy),
           s->mean_step / 1e3);
    /* The runtime drops events once its buffer is full: later steps are
     * missing, and so a long run's figures cover its beginning only. */
    if (json_is_true(json_object_get(o, "truncated")))
        printf("note: the trace is truncated (otherData.truncated); only the steps it holds are counted\n");
}

int cmd_trace_stats(int argc, char **argv) {
    const char *path = NULL, *format = "text";
    int64_t skip = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(trace_stats_help, stdout);
            return 0;
        } else if (strcmp(a, "--skip") == 0) {
            if (i + 1 >= argc || !cli_parse_i64(argv[++i], 0, 1 << 30, &skip))
                return cli_usage("trace-stats", "--skip needs a non-negative integer");
        } else if (strcmp(a, "--format") == 0) {
            if (i + 1 >= argc) return cli_usage("trace-stats", "--format needs text or json");
            format = argv[++i];
            if (strcmp(format, "text") && strcmp(format, "json"))
                return cli_usage("trace-stats", "unknown format '%s' (text or json)", format);
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("trace-stats", "unknown flag '%s'", a);
        } else if (path) {
            return cli_usage("trace-stats", "one trace at a time ('%s' and '%s')", path, a);
        } else {
            path = a;
        }
    }
    if (!path) return cli_usage("trace-stats", "no trace file given");
    Diag d = {0};
    Trace t;
    if (!trace_read(path, &t, &d)) return cli_fail(&d);
    Stats s = {.path = path};
    int status = 0;
    if (!gather_stats(&t, (long long)skip, &s, &d)) status = cli_fail(&d);
    else if (strcmp(format, "json") == 0) status = print_json(&s);
    else print_text(&s, (long long)skip);
    free(s.ranks);
    trace_free(&t);
    return status;
}
