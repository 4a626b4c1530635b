/* plan_report.c - `cleave plan`: the search's candidates (search.c) for
 * people (text) or tools (json: the chosen plan in the plan format of
 * docs/plan.md, with "prediction" and "alternatives" added). */
#include "plan_report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compile_options.h"
#include "../cost/simulate.h"
#include "../plan/plan.h"

static void layout_text(const Candidate *c, char *buf, size_t len) {
    const Layout *l = &c->layout;
    const char *name = strategy_name(l->strategy);
    size_t used;
    if (!strategy_staged(l->strategy))
        snprintf(buf, len, "%s%s", name, l->strategy == STRATEGY_DP ? " over every rank" : "");
    else if (l->strategy == STRATEGY_LAYER)
        snprintf(buf, len, "layer, %d stages", l->stages);
    else
        snprintf(buf, len, "%s, %d replica%s x %d stages, %d micro-batch%s, %s%s", name, l->replicas,
                 l->replicas > 1 ? "s" : "", l->stages, l->microbatches, l->microbatches > 1 ? "es" : "",
                 candidate_schedule(c),
                 l->placement == PLACE_BY_STAGE ? ", placed by stage (a stage's replicas on consecutive ranks)" : "");
    used = strlen(buf);
    if (l->allreduce_node > 0 && used < len)
        snprintf(buf + used, len - used, ", gradients summed within nodes of %d ranks first (hierarchical allreduce)",
                 l->allreduce_node);
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
    bool chose = o->strategy_auto;
    const Candidate *best = s->best >= 0 ? &s->c[s->best] : NULL;
    printf("%s: batch %lld on %lld rank%s; cluster: %s (%.2f GB per rank)\n", o->model, (long long)compile_step_batch(o),
           (long long)o->ranks, o->ranks > 1 ? "s" : "", s->cluster, (double)s->memory_per_rank / 1e9);
    char lay[160], why[300];
    if (best) {
        layout_text(best, lay, sizeof lay);
        printf("\n%s: %s\n", chose ? "chosen" : "plan", lay);
        printf("  predicted step %.3f ms (%.0f samples/s), bubble %.1f%%, communication %.2f MB per step, "
               "largest arena %.1f MB\n",
               best->step_s * 1e3, best->step_s > 0 ? (double)compile_step_batch(o) / best->step_s : 0, best->bubble * 100,
               (double)best->comm_bytes / 1e6, (double)best->peak_bytes / 1e6);
        if (best->batch_stats) {
            const Layout *l = &best->layout;
            bool global = l->replicas > 1 && !o->train.bn_local;
            printf("  batch norm: %d layer%s, statistics of each %s%s%s\n", best->batch_stats,
                   best->batch_stats > 1 ? "s" : "", l->microbatches > 1 ? "micro-batch" : "batch",
                   global ? " over every replica, allreduced in the forward and backward passes"
                          : l->replicas > 1 ? " on each replica alone (--bn-stats local)" : "",
                   l->microbatches > 1 ? "; running statistics from the whole batch" : "");
        }
        printf("  %-6s %12s %12s\n", "rank", "memory MB", "compute ms");
        for (int r = 0; r < best->n_ranks; r++)
            printf("  %-6d %12.2f %12.3f\n", r, (double)best->rank_bytes[r] / 1e6, best->rank_busy_s[r] * 1e3);
    } else {
        printf("\nno plan fits every rank's memory\n");
    }
    if (s->n < 2 && best) return;
    printf("\n%s (fastest first):\n", best ? "all plans" : "plans");
    printf("  %-9s %3s %3s %3s %-18s %10s %8s %9s %9s  %s\n", "strategy", "D", "P", "M", "schedule", "step ms", "bubble",
           "comm MB", "peak MB", "");
    for (int i = 0; i < s->n; i++) {
        const Candidate *c = &s->c[i];
        why_lost(c, best ? best : c, why, sizeof why);
        const Layout *l = &c->layout;
        char sched[24];
        bool by_stage = l->placement == PLACE_BY_STAGE;
        snprintf(sched, sizeof sched, "%s%s%s", candidate_schedule(c)[0] ? candidate_schedule(c) : "-",
                 by_stage ? " bystage" : "", l->allreduce_node > 0 ? " hier" : "");
        printf("  %-9s %3d %3d %3d %-18s %10.3f %7.1f%% %9.2f %9.1f  %s\n", strategy_name(l->strategy), l->replicas,
               l->stages, l->microbatches, sched, c->step_s * 1e3, c->bubble * 100, (double)c->comm_bytes / 1e6,
               (double)c->peak_bytes / 1e6, why);
    }
}

static json_t *candidate_json(const Candidate *c, const Candidate *best) {
    char why[300];
    why_lost(c, best ? best : c, why, sizeof why);
    json_t *ranks = json_array();
    for (int r = 0; r < c->n_ranks; r++)
        json_array_append_new(ranks, json_pack("{s:i, s:I, s:f}", "rank", r, "arena_bytes",
                                               (json_int_t)c->rank_bytes[r], "busy_s", c->rank_busy_s[r]));
    const Layout *l = &c->layout;
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:s, s:s, s:b, s:s, s:f, s:f, s:I, s:I, s:o}", "strategy",
                          strategy_name(l->strategy), "dp", l->replicas, "stages", l->stages, "microbatches",
                          l->microbatches, "schedule", candidate_schedule(c), "placement",
                          l->placement == PLACE_BY_STAGE ? "by_stage" : "by_replica", "feasible", c->feasible,
                          "why", why, "step_s", c->step_s, "bubble", c->bubble, "comm_bytes",
                          (json_int_t)c->comm_bytes, "peak_bytes", (json_int_t)c->peak_bytes, "ranks", ranks);
    if (o && c->cuts) json_object_set_new(o, "cuts", json_string(c->cuts));
    if (o) json_object_set_new(o, "allreduce", json_string(l->allreduce_node > 0 ? "hierarchical" : "flat"));
    return o;
}

/* The plan of the search's best candidate (auto), or of the one layout o
 * names, on the search's kernel profile. */
static bool chosen_plan(const CompileOptions *o, const Search *s, Graph **g, TrainGraph *t, Plan *p, Diag *d) {
    return driver_build_plan(o, &s->c[s->best].layout, s->profile, g, t, p, d);
}

/* The simulated step of plan p on the cluster the search used: o's
 * cluster file, or this machine's calibration or the stated defaults. */
static bool simulate_chosen(const CompileOptions *o, const Search *s, const Plan *p, Cluster *cl, SimResult *r,
                            Diag *d) {
    char which[1100];
    if (!cluster_open(o->cluster, p->n_ranks, cl, which, sizeof which, d)) return false;
    cl->profile = s->profile;
    if (simulate_plan(p, cl, r, d) && (r->events || diag_error(d, DIAG_NOMEM, "out of memory for the timeline")))
        return true;
    sim_result_free(r);
    cluster_free(cl);
    return false;
}

/* Each rank's share of the prediction: when its own work ends, its
 * compute, its blocked time (the step's final loss reduction excluded),
 * what it sends and sums, and its arena. */
static json_t *rank_predictions(const Plan *p, const SimResult *r) {
    json_t *a = json_array();
    for (int k = 0; k < r->n_ranks; k++) {
        const SimRank *x = &r->ranks[k];
        json_array_append_new(a, json_pack("{s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I}", "rank", k, "stage",
                                           p->ranks[k].stage, "end_s", x->end_s, "busy_s", x->busy_s,
                                           "wait_s", x->wait_s, "sent_bytes", (json_int_t)x->sent_bytes,
                                           "reduced_bytes", (json_int_t)x->reduced_bytes, "arena_bytes",
                                           (json_int_t)x->arena_bytes));
    }
    return a;
}

/* Seconds rank `rank` spends in simulated waits of kind w on `peer`. */
static double waited(const SimResult *r, int rank, SimWait w, int peer) {
    double sum = 0;
    for (int i = 0; i < r->n_events; i++) {
        const SimEvent *e = &r->events[i];
        if (e->rank == rank && e->kind == 'W' && e->wait == w && e->peer == peer) sum += e->t1 - e->t0;
    }
    return sum;
}

/* One link's messages of a step: what the plan sends from `from` to `to`,
 * each message's predicted time on the link (latency + bytes / bandwidth)
 * summed, and the simulated time the receiver waits in its receives from
 * the sender and the sender in completing its sends to the receiver. */
static json_t *link_prediction(const Plan *p, const Cluster *cl, const SimResult *r, int from, int to) {
    const RankPlan *rp = &p->ranks[from];
    int messages = 0;
    int64_t bytes = 0;
    double transfer = 0;
    for (int i = 0; i < rp->n_train; i++) {
        const PlanStep *st = &rp->train[i];
        if (st->kind != STEP_SEND || st->peer != to) continue;
        messages++;
        bytes += st->bytes;
        transfer += cluster_p2p_seconds(cl, from, to, (double)st->bytes);
    }
    if (!messages) return NULL;
    return json_pack("{s:i, s:i, s:i, s:I, s:f, s:f, s:f}", "from", from, "to", to, "messages", messages, "bytes",
                     (json_int_t)bytes, "transfer_s", transfer, "recv_wait_s", waited(r, to, SIM_WAIT_RECV, from),
                     "send_wait_s", waited(r, from, SIM_WAIT_SEND, to));
}

/* Every sender -> receiver pair the plan's send steps use. */
static json_t *link_predictions(const Plan *p, const Cluster *cl, const SimResult *r) {
    json_t *a = json_array();
    for (int from = 0; from < p->n_ranks; from++)
        for (int to = 0; to < p->n_ranks; to++) {
            json_t *l = from != to ? link_prediction(p, cl, r, from, to) : NULL;
            if (l) json_array_append_new(a, l);
        }
    return a;
}

static const char *wait_name(SimWait w) {
    return w == SIM_WAIT_RECV ? "recv" : w == SIM_WAIT_SEND ? "send" : w == SIM_WAIT_ALLREDUCE ? "allreduce" : NULL;
}

static json_t *event_json(int rank, double t0, double t1, char kind, int micro, const char *wait, int peer) {
    char k[2] = {kind, 0};
    json_t *e = json_pack("{s:i, s:f, s:f, s:s, s:i}", "rank", rank, "t0", t0, "t1", t1, "kind", k, "micro", micro);
    if (wait) json_object_set_new(e, "wait", json_string(wait));
    if (peer >= 0) json_object_set_new(e, "peer", json_integer(peer));
    return e;
}

static int by_rank_then_time(const void *a, const void *b) {
    const SimEvent *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

static bool same_unit(const SimEvent *a, const SimEvent *b) {
    return a->rank == b->rank && a->kind == b->kind && a->micro == b->micro && a->wait == b->wait &&
           a->peer == b->peer && a->t1 == b->t0;
}

/* Every rank's simulated step in time order, consecutive intervals of the
 * same unit (or the same wait) merged, so that the timeline has one entry
 * per unit rather than one per kernel; each rank ends with its wait for
 * the step's loss, as a traced step does.  micro is -1 outside staged
 * plans, whose steps are not split into micro-batches. */
static json_t *timeline_json(const Plan *p, const SimResult *r) {
    SimEvent *ev = malloc(sizeof *ev * (size_t)(r->n_events ? r->n_events : 1));
    if (!ev) return NULL;
    memcpy(ev, r->events, sizeof *ev * (size_t)r->n_events);
    qsort(ev, (size_t)r->n_events, sizeof *ev, by_rank_then_time); /* a rank's intervals never overlap */
    json_t *a = json_array();
    for (int i = 0, j; i < r->n_events; i = j) {
        SimEvent e = ev[i];
        for (j = i + 1; j < r->n_events && same_unit(&ev[j - 1], &ev[j]); j++) e.t1 = ev[j].t1;
        json_array_append_new(a, event_json(e.rank, e.t0, e.t1, e.kind, e.micro,
                                            wait_name(e.wait), e.peer));
        bool last = j == r->n_events || ev[j].rank != e.rank;
        if (last && r->step_s > r->ranks[e.rank].end_s)
            json_array_append_new(a, event_json(e.rank, r->ranks[e.rank].end_s, r->step_s, 'W', -1, "loss", -1));
    }
    free(ev);
    return a;
}

/* The prediction of the chosen plan: the search's summary of it, and its
 * simulated step in the detail a comparison with a trace needs
 * (`cleave report`). */
static json_t *prediction_json(const Search *s, const Candidate *best, const Plan *p, const Cluster *cl,
                               const SimResult *r) {
    json_t *timeline = timeline_json(p, r);
    if (!timeline) return NULL;
    return json_pack("{s:s, s:I, s:o, s:f, s:o, s:o, s:o}", "cluster", s->cluster, "memory_per_rank_bytes",
                     (json_int_t)s->memory_per_rank, "chosen", candidate_json(best, best), "step_s", r->step_s,
                     "ranks", rank_predictions(p, r), "links", link_predictions(p, cl, r), "timeline", timeline);
}

/* The chosen plan in the plan format, with the predictions added. */
static int print_json(const CompileOptions *o, const Search *s) {
    const Candidate *best = &s->c[s->best];
    Diag d = {0};
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!chosen_plan(o, s, &g, &t, &p, &d)) return cli_fail(&d);
    Cluster cl;
    SimResult r;
    if (!simulate_chosen(o, s, &p, &cl, &r, &d)) {
        graph_free(g);
        return cli_fail(&d);
    }
    json_t *root = plan_json(&p, &o->train);
    json_t *prediction = root ? prediction_json(s, best, &p, &cl, &r) : NULL;
    sim_result_free(&r);
    cluster_free(&cl);
    graph_free(g);
    if (!prediction) {
        json_decref(root);
        diag_error(&d, DIAG_NOMEM, "out of memory");
        return cli_fail(&d);
    }
    json_t *alts = json_array();
    for (int i = 0; i < s->n; i++) json_array_append_new(alts, candidate_json(&s->c[i], best));
    json_object_set_new(root, "prediction", prediction);
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
    for (int st = 0; st < p->n_stages; st++) {
        printf("  subgraph cluster_%d {\n    label=\"stage %d", st, st);
        printf(" (%.3g GFLOP)", p->stage_flops[st] / 1e9);
        printf("\";\n");
        GRAPH_FOR_NODES(g, n) {
            if (n->phase != PHASE_FORWARD) continue;
            if (p->node_stage[n->id] != st) continue;
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
            bool cross = p->node_stage[pr->id] != p->node_stage[n->id];
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
        printf("<text x=\"4\" y=\"%d\">rank %d s%d r%d</text>\n", y + 12, k, rp->stage, rp->replica);
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
        SimResult r;
        if ((ok = simulate_chosen(o, s, &p, &cl, &r, &d))) {
            char title[400];
            char lay[160];
            layout_text(best, lay, sizeof lay);
            snprintf(title, sizeof title, "%s: %s on %d ranks", o->model, lay, p.n_ranks);
            print_svg(&p, &r, title);
            sim_result_free(&r);
            cluster_free(&cl);
        }
    }
    graph_free(g);
    return ok ? 0 : cli_fail(&d);
}

int plan_report(const CompileOptions *o, const char *format) {
    Diag d = {0};
    Search s;
    Layout l;
    bool ok = o->strategy_auto ? search_all(o, &s, &d) : compile_options_layout(o, &l, &d) && search_one(o, &l, &s, &d);
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
