/* plan_report.c - `cleave plan`: the search's candidates (search.c) for
 * people (text) or tools (json: the chosen plan in the plan format of
 * docs/plan.md, with "prediction" and "alternatives" added). */
#include "plan_report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../cost/simulate.h"
#include "../plan/plan.h"

static void layout_text(const Candidate *c, char *buf, size_t len) {
    if (strcmp(c->strategy, "single") == 0 || strcmp(c->strategy, "dp") == 0)
        snprintf(buf, len, "%s%s", c->strategy, strcmp(c->strategy, "dp") == 0 ? " over every rank" : "");
    else if (strcmp(c->strategy, "layer") == 0)
        snprintf(buf, len, "layer, %d stages", c->stages);
    else
        snprintf(buf, len, "%s, %d replica%s x %d stages, %d micro-batch%s, %s", c->strategy, c->dp,
                 c->dp > 1 ? "s" : "", c->stages, c->microbatches, c->microbatches > 1 ? "es" : "", c->schedule);
}

/* Why c lost to best, in a few words. */
static void why_lost(const Candidate *c, const Candidate *best, char *buf, size_t len) {
    if (!c->feasible) {
        snprintf(buf, len, "%s", c->why);
        return;
    }
    if (c == best) {
        snprintf(buf, len, "fastest");
        return;
    }
    double slower = best->step_s > 0 ? (c->step_s / best->step_s - 1) * 100 : 0;
    if (c->bubble > 0.2)
        snprintf(buf, len, "%.0f%% slower: bubble %.0f%%", slower, c->bubble * 100);
    else if (c->comm_bytes > 2 * best->comm_bytes && c->comm_bytes > 1000000)
        snprintf(buf, len, "%.0f%% slower: %.1f MB of communication per step", slower, (double)c->comm_bytes / 1e6);
    else
        snprintf(buf, len, "%.0f%% slower", slower);
}

static void print_text(const CompileOptions *o, const Search *s) {
    bool chose = strcmp(o->strategy, "auto") == 0;
    const Candidate *best = s->best >= 0 ? &s->c[s->best] : NULL;
    printf("%s: batch %lld on %lld rank%s; cluster: %s (%.2f GB per rank)\n", o->model, (long long)o->batch,
           (long long)o->ranks, o->ranks > 1 ? "s" : "", s->cluster, (double)s->memory_per_rank / 1e9);
    char lay[160], why[300];
    if (best) {
        layout_text(best, lay, sizeof lay);
        printf("\n%s: %s\n", chose ? "chosen" : "plan", lay);
        printf("  predicted step %.3f ms (%.0f samples/s), bubble %.1f%%, communication %.2f MB per step, "
               "largest arena %.1f MB\n",
               best->step_s * 1e3, best->step_s > 0 ? (double)o->batch / best->step_s : 0, best->bubble * 100,
               (double)best->comm_bytes / 1e6, (double)best->peak_bytes / 1e6);
        printf("  %-6s %12s %12s\n", "rank", "memory MB", "compute ms");
        for (int r = 0; r < best->n_ranks; r++)
            printf("  %-6d %12.2f %12.3f\n", r, (double)best->rank_bytes[r] / 1e6, best->rank_busy_s[r] * 1e3);
    } else {
        printf("\nno plan fits every rank's memory\n");
    }
    if (s->n < 2 && best) return;
    printf("\n%s (fastest first):\n", best ? "all plans" : "plans");
    printf("  %-9s %3s %3s %3s %-8s %10s %8s %9s %9s  %s\n", "strategy", "D", "P", "M", "schedule", "step ms", "bubble",
           "comm MB", "peak MB", "");
    for (int i = 0; i < s->n; i++) {
        const Candidate *c = &s->c[i];
        why_lost(c, best ? best : c, why, sizeof why);
        printf("  %-9s %3d %3d %3d %-8s %10.3f %7.1f%% %9.2f %9.1f  %s\n", c->strategy, c->dp, c->stages,
               c->microbatches, c->schedule[0] ? c->schedule : "-", c->step_s * 1e3, c->bubble * 100,
               (double)c->comm_bytes / 1e6, (double)c->peak_bytes / 1e6, why);
    }
}

static json_t *candidate_json(const Candidate *c, const Candidate *best) {
    char why[300];
    why_lost(c, best ? best : c, why, sizeof why);
    json_t *ranks = json_array();
    for (int r = 0; r < c->n_ranks; r++)
        json_array_append_new(ranks, json_pack("{s:i, s:I, s:f}", "rank", r, "arena_bytes",
                                               (json_int_t)c->rank_bytes[r], "busy_s", c->rank_busy_s[r]));
    return json_pack("{s:s, s:i, s:i, s:i, s:s, s:b, s:s, s:f, s:f, s:I, s:I, s:o}", "strategy", c->strategy, "dp",
                     c->dp, "stages", c->stages, "microbatches", c->microbatches, "schedule", c->schedule, "feasible",
                     c->feasible, "why", why, "step_s", c->step_s, "bubble", c->bubble, "comm_bytes",
                     (json_int_t)c->comm_bytes, "peak_bytes", (json_int_t)c->peak_bytes, "ranks", ranks);
}

/* The plan of the search's best candidate (auto), or the one o names. */
static bool chosen_plan(const CompileOptions *o, const Search *s, Graph **g, TrainGraph *t, Plan *p, Diag *d) {
    CompileOptions x = *o;
    if (strcmp(o->strategy, "auto") == 0) search_options(o, &s->c[s->best], &x);
    return driver_build_plan(&x, g, t, p, d);
}

/* The chosen plan in the plan format, with the predictions added. */
static int print_json(const CompileOptions *o, const Search *s) {
    const Candidate *best = s->best >= 0 ? &s->c[s->best] : NULL;
    Diag d = {0};
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!chosen_plan(o, s, &g, &t, &p, &d)) return cli_fail(&d);
    char *text = plan_to_json(&p, &o->train);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    graph_free(g);
    if (!root) {
        diag_error(&d, DIAG_NOMEM, "out of memory");
        return cli_fail(&d);
    }
    json_t *alts = json_array();
    for (int i = 0; i < s->n; i++) json_array_append_new(alts, candidate_json(&s->c[i], best));
    json_object_set_new(root, "prediction",
                        json_pack("{s:s, s:I, s:o}", "cluster", s->cluster, "memory_per_rank_bytes",
                                  (json_int_t)s->memory_per_rank, "chosen",
                                  best ? candidate_json(best, best) : json_null()));
    json_object_set_new(root, "alternatives", alts);
    char *out = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!out) {
        diag_error(&d, DIAG_NOMEM, "out of memory");
        return cli_fail(&d);
    }
    puts(out);
    free(out);
    return 0;
}

/* s with the characters that end a quoted DOT string or XML text escaped. */
static void put_escaped(const char *s, bool xml) {
    for (; *s; s++) {
        if (xml && *s == '<') fputs("&lt;", stdout);
        else if (xml && *s == '>') fputs("&gt;", stdout);
        else if (xml && *s == '&') fputs("&amp;", stdout);
        else if (!xml && (*s == '"' || *s == '\\')) printf("\\%c", *s);
        else putchar(*s);
    }
}

/* The partitioned forward graph: one box per stage (or one for every
 * rank's replica), edges labelled with the bytes that cross stages. */
static void print_dot(const Plan *p) {
    const Graph *g = p->g;
    printf("digraph plan {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n");
    int stages = p->n_stages ? p->n_stages : 1;
    for (int st = 0; st < stages; st++) {
        printf("  subgraph cluster_%d {\n    label=\"stage %d", st, st);
        if (p->n_stages) printf(" (%.3g GFLOP)", p->stage_flops[st] / 1e9);
        printf("\";\n");
        GRAPH_FOR_NODES(g, n) {
            if (n->phase != PHASE_FORWARD) continue;
            int ns = p->n_stages ? p->node_stage[n->id] : 0;
            if (ns != st) continue;
            printf("    n%d [label=\"", n->id);
            put_escaped(n->name, false);
            printf("\\n%s\"];\n", n->op_type);
        }
        printf("  }\n");
    }
    GRAPH_FOR_NODES(g, n) {
        if (n->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < n->n_in; k++) {
            const Value *v = n->in[k];
            const Node *pr = v ? v->producer : NULL;
            if (!pr || pr->dead || pr->phase != PHASE_FORWARD) continue;
            bool cross = p->n_stages && p->node_stage[pr->id] != p->node_stage[n->id];
            if (cross)
                printf("  n%d -> n%d [color=red, label=\"%.3g MB\"];\n", pr->id, n->id,
                       (double)plan_value_bytes(v) / 1e6);
            else
                printf("  n%d -> n%d;\n", pr->id, n->id);
        }
    }
    printf("}\n");
}

/* The simulated timeline of every rank as a Gantt chart. */
static void print_svg(const Plan *p, const SimResult *r, const char *title) {
    enum { MAX_ROWS = 64, ROW = 18, LEFT = 90, WIDTH = 1000, TOP = 40 };
    int rows = r->n_ranks < MAX_ROWS ? r->n_ranks : MAX_ROWS;
    double scale = r->step_s > 0 ? (WIDTH - LEFT - 20) / r->step_s : 0;
    int height = TOP + rows * ROW + 40;
    printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
           "font-size=\"11\">\n", WIDTH, height);
    printf("<text x=\"10\" y=\"16\" font-size=\"13\">");
    put_escaped(title, true);
    printf("</text>\n");
    printf("<text x=\"10\" y=\"32\">predicted step %.3f ms, bubble %.1f%%%s; forward <tspan fill=\"#4e79a7\">"
           "&#9632;</tspan> backward <tspan fill=\"#f28e2b\">&#9632;</tspan> update <tspan fill=\"#59a14f\">"
           "&#9632;</tspan> waiting <tspan fill=\"#e15759\">&#9632;</tspan></text>\n",
           r->step_s * 1e3, r->bubble * 100, rows < r->n_ranks ? " (first 64 ranks)" : "");
    for (int k = 0; k < rows; k++) {
        int y = TOP + k * ROW;
        const RankPlan *rp = &p->ranks[k];
        if (p->n_stages)
            printf("<text x=\"4\" y=\"%d\">rank %d s%d r%d</text>\n", y + 12, k, rp->stage, rp->replica);
        else
            printf("<text x=\"4\" y=\"%d\">rank %d</text>\n", y + 12, k);
    }
    for (int i = 0; i < r->n_events; i++) {
        const SimEvent *e = &r->events[i];
        if (e->rank >= rows) continue;
        const char *color = e->kind == 'F' ? "#4e79a7" : e->kind == 'B' ? "#f28e2b" : e->kind == 'U' ? "#59a14f"
                                                                                                      : "#e15759";
        printf("<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>\n", LEFT + e->t0 * scale,
               TOP + e->rank * ROW + 2, (e->t1 - e->t0) * scale, ROW - 4, color);
    }
    int axis = TOP + rows * ROW + 14;
    for (int t = 0; t <= 4; t++)
        printf("<text x=\"%.1f\" y=\"%d\">%.3g ms</text>\n", LEFT + t * (WIDTH - LEFT - 20) / 4.0, axis,
               r->step_s * 1e3 * t / 4);
    printf("</svg>\n");
}

/* dot or svg of the chosen plan (or the one o names). */
static int print_drawing(const CompileOptions *o, const Search *s, bool svg) {
    const Candidate *best = &s->c[s->best];
    Diag d = {0};
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!chosen_plan(o, s, &g, &t, &p, &d)) return cli_fail(&d);
    bool ok = true;
    if (!svg) {
        print_dot(&p);
    } else {
        Cluster cl;
        char which[1100];
        ok = o->cluster ? cluster_load(o->cluster, &cl, &d) : cluster_machine(&cl, p.n_ranks, which, sizeof which, &d);
        SimResult r;
        if (ok && (ok = simulate_plan(&p, &cl, &r, &d))) {
            char title[400];
            char lay[160];
            layout_text(best, lay, sizeof lay);
            snprintf(title, sizeof title, "%s: %s on %d ranks", o->model, lay, p.n_ranks);
            print_svg(&p, &r, title);
            sim_result_free(&r);
        }
        if (ok) cluster_free(&cl);
    }
    graph_free(g);
    return ok ? 0 : cli_fail(&d);
}

int plan_report(const CompileOptions *o, const char *format) {
    Diag d = {0};
    Search s;
    bool ok = strcmp(o->strategy, "auto") == 0 ? driver_search(o, &s, &d) : driver_predict(o, &s, &d);
    if (!ok) return cli_fail(&d);
    int status = 0;
    bool drawing = strcmp(format, "dot") == 0 || strcmp(format, "svg") == 0;
    if (strcmp(format, "json") == 0 || drawing) {
        if (s.best < 0) {
            diag_error(&d, DIAG_USAGE, "%s: no plan fits the memory of the ranks (%s)", o->model, s.cluster);
            status = cli_fail(&d);
        } else {
            status = drawing ? print_drawing(o, &s, strcmp(format, "svg") == 0) : print_json(o, &s);
        }
    } else {
        print_text(o, &s);
    }
    search_free(&s);
    return status;
}
