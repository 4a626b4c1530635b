/* stages.c - splitting a training graph's forward nodes into pipeline
 * stages, and finding the stage of every other node.
 *
 * The split is over one order of the forward nodes (the model file's when
 * it is topological), so any cut gives stages whose forward edges only go
 * from a stage to itself or a later one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "../cost/node_cost.h"
#include "../ops/ops.h"

/* ---- the forward order ---- */

/* Min-heap of node ids: Kahn's algorithm taking the ready node that comes
 * first in the file gives the file's order whenever that order is
 * topological. */
typedef struct Heap {
    int *a, n;
} Heap;

static void heap_push(Heap *h, int x) {
    int i = h->n++;
    h->a[i] = x;
    while (i > 0 && h->a[(i - 1) / 2] > h->a[i]) {
        int p = (i - 1) / 2, t = h->a[p];
        h->a[p] = h->a[i];
        h->a[i] = t;
        i = p;
    }
}

static int heap_pop(Heap *h) {
    int top = h->a[0];
    h->a[0] = h->a[--h->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->a[l] < h->a[m]) m = l;
        if (r < h->n && h->a[r] < h->a[m]) m = r;
        if (m == i) break;
        int t = h->a[m];
        h->a[m] = h->a[i];
        h->a[i] = t;
        i = m;
    }
    return top;
}

static bool is_forward(const Node *n) { return n && !n->dead && n->phase == PHASE_FORWARD; }

static const Node *live_producer(const Value *v) {
    return v && v->producer && !v->producer->dead ? v->producer : NULL;
}

Node **stages_forward_order(Graph *g, int *count, Diag *d) {
    int nn = g->n_nodes, nv = g->n_values;
    Node **order = ARENA_ARRAY(&g->arena, Node *, nn ? nn : 1);
    int *pending = calloc((size_t)nn + 1, sizeof *pending);
    int *first = calloc((size_t)nv + 2, sizeof *first), *fill = calloc((size_t)nv + 1, sizeof *fill);
    int n_edges = 0;
    GRAPH_FOR_NODES(g, n) {
        if (is_forward(n)) n_edges += n->n_in;
    }
    int *users = malloc(sizeof *users * (size_t)(n_edges + 1));
    Heap h = {malloc(sizeof(int) * (size_t)(nn + 1)), 0};
    bool ok = order && pending && first && fill && users && h.a;
    if (!ok) diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    int n_fwd = 0, tail = 0;
    if (ok) {
        GRAPH_FOR_NODES(g, n) {
            if (!is_forward(n)) continue;
            n_fwd++;
            for (int i = 0; i < n->n_in; i++)
                if (n->in[i]) first[n->in[i]->id + 1]++;
        }
        for (int v = 0; v < nv; v++) first[v + 1] += first[v];
        GRAPH_FOR_NODES(g, n) {
            if (!is_forward(n)) continue;
            for (int i = 0; i < n->n_in; i++) {
                const Value *v = n->in[i];
                if (!v) continue;
                users[first[v->id] + fill[v->id]++] = n->id;
                if (is_forward(live_producer(v))) pending[n->id]++;
            }
            if (pending[n->id] == 0) heap_push(&h, n->id);
        }
        while (h.n > 0) {
            Node *n = g->nodes[heap_pop(&h)];
            order[tail++] = n;
            for (int k = 0; k < n->n_out; k++) {
                const Value *v = n->out[k];
                if (!v) continue;
                for (int u = first[v->id]; u < first[v->id] + fill[v->id]; u++)
                    if (--pending[users[u]] == 0) heap_push(&h, users[u]);
            }
        }
        if (tail != n_fwd) {
            const Node *stuck = NULL;
            GRAPH_FOR_NODES(g, n) {
                if (!stuck && is_forward(n) && pending[n->id] > 0) stuck = n;
            }
            ok = diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s) is part of a cycle", g->path,
                            stuck ? stuck->name : "?", stuck ? stuck->op_type : "?");
        }
    }
    free(pending);
    free(first);
    free(fill);
    free(users);
    free(h.a);
    if (!ok) return NULL;
    *count = tail;
    return order;
}

/* ---- the stage of any node ---- */

static const Node *first_forward_reader(const Graph *g, const Value *v) {
    GRAPH_FOR_NODES(g, n) {
        if (!is_forward(n)) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == v) return n;
    }
    return NULL;
}

/* The forward node a node goes with, or NULL for the last stage (loss
 * nodes and what serves them). */
static const Node *home_node(const Graph *g, const Node *n) {
    for (int depth = 0; n && depth <= g->n_nodes; depth++) {
        if (n->phase == PHASE_FORWARD) return n;
        if (n->phase == PHASE_LOSS) return NULL;
        if (n->origin) {
            n = n->origin;
            continue;
        }
        /* Nodes the training graph adds without an origin (copies of
         * gradients, updates of their parameters) go with what they read. */
        const Node *next = NULL;
        for (int k = 0; k < n->n_in && !next; k++) next = live_producer(n->in[k]);
        if (next) {
            n = next;
            continue;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < n->n_in; k++) {
                const Value *v = n->in[k];
                if (!v || (pass == 0 && v->kind != VAL_INITIALIZER)) continue;
                const Node *r = first_forward_reader(g, v);
                if (r) return r;
            }
        return NULL;
    }
    return NULL;
}

static int last_stage(const Graph *g, const int *stage_of_node) {
    int last = 0;
    GRAPH_FOR_NODES(g, n) {
        if (is_forward(n) && stage_of_node[n->id] > last) last = stage_of_node[n->id];
    }
    return last;
}

int stage_of(const Graph *g, const int *stage_of_node, const Node *n) {
    const Node *h = home_node(g, n);
    return h ? stage_of_node[h->id] : last_stage(g, stage_of_node);
}

/* ---- balancing ---- */

static double node_flops(const Node *n) {
    double f = 0;
    if (n->def && n->def->flops) f = cost_node_flops(n);
    else if (n->n_out > 0 && n->out[0] && value_numel(n->out[0]) > 0) f = (double)value_numel(n->out[0]);
    else if (n->n_in > 0 && n->in[0] && value_numel(n->in[0]) > 0) f = 4.0 * (double)value_numel(n->in[0]);
    return f > 0 && isfinite(f) ? f : 0;
}

/* Equal within rounding, so that sums in different orders compare. */
static bool within(double x, double bound) { return x <= bound * (1 + 1e-12) + 1e-9; }

bool stages_balance(const double *w, int n, int k, int *begin) {
    if (k < 1 || k > n) return false;
    double *S = malloc(sizeof *S * (size_t)(n + 1));
    double *prev = malloc(sizeof *prev * (size_t)(n + 1)), *cur = malloc(sizeof *cur * (size_t)(n + 1));
    bool quadratic = (double)k * n * n <= 5e7;
    double *q = quadratic ? malloc(sizeof *q * (size_t)(n + 1) * (size_t)(k + 1)) : NULL;
    int *from = quadratic ? malloc(sizeof *from * (size_t)(n + 1) * (size_t)(k + 1)) : NULL;
    bool ok = S && prev && cur && (!quadratic || (q && from));
    if (ok) {
        S[0] = 0;
        for (int i = 0; i < n; i++) S[i + 1] = S[i] + (w[i] > 0 ? w[i] : 0);
        /* Pass 1: the least possible bottleneck.  best(j, i) = smallest
         * largest part over splits of the first i weights into j parts; it
         * grows with i, while the last part S[i] - S[x] shrinks with x, so
         * the best x is where the two cross (binary search). */
        for (int i = 0; i <= n; i++) prev[i] = S[i];
        for (int j = 2; j <= k; j++) {
            for (int i = 0; i <= n; i++) cur[i] = INFINITY;
            for (int i = j; i <= n; i++) {
                int lo = j - 1, hi = i - 1; /* x: the previous parts hold the first x weights */
                while (lo < hi) {
                    int mid = (lo + hi) / 2;
                    if (prev[mid] >= S[i] - S[mid]) hi = mid;
                    else lo = mid + 1;
                }
                for (int x = lo - 1; x <= lo; x++) {
                    if (x < j - 1 || x > i - 1) continue;
                    double c = fmax(prev[x], S[i] - S[x]);
                    if (c < cur[i]) cur[i] = c;
                }
            }
            double *t = prev;
            prev = cur;
            cur = t;
        }
        double bottleneck = prev[n];
        /* Pass 2: among splits within that bottleneck, the least sum of
         * squared parts (the most even), first cut as early as possible on
         * ties.  Quadratic per stage; very large graphs keep pass 1's
         * bound with the greedy split below instead. */
        if (quadratic) {
            for (int j = 0; j <= k; j++)
                for (int i = 0; i <= n; i++) q[j * (n + 1) + i] = INFINITY;
            q[0] = 0;
            for (int j = 1; j <= k; j++)
                for (int i = j; i <= n - (k - j); i++)
                    for (int x = j - 1; x < i; x++) {
                        double part = S[i] - S[x], base = q[(j - 1) * (n + 1) + x];
                        if (!isfinite(base) || !within(part, bottleneck)) continue;
                        double c = base + part * part;
                        if (c < q[j * (n + 1) + i] * (1 - 1e-12) - 1e-300 || !isfinite(q[j * (n + 1) + i])) {
                            q[j * (n + 1) + i] = c;
                            from[j * (n + 1) + i] = x;
                        }
                    }
            ok = isfinite(q[k * (n + 1) + n]);
            if (ok) {
                begin[k] = n;
                for (int j = k; j >= 1; j--) begin[j - 1] = from[j * (n + 1) + begin[j]];
            }
        } else {
            /* Greedy within the bottleneck, keeping a node for each later part. */
            begin[0] = 0;
            int i = 0;
            for (int j = 1; j < k; j++) {
                int end = i + 1;
                while (end < n - (k - j) && within(S[end + 1] - S[i], bottleneck)) end++;
                begin[j] = i = end;
            }
            begin[k] = n;
        }
    }
    free(S);
    free(prev);
    free(cur);
    free(q);
    free(from);
    return ok;
}

/* ---- user cut points ---- */

static const char *phase_word(NodePhase p) {
    return p == PHASE_LOSS ? "loss" : p == PHASE_BACKWARD ? "backward" : p == PHASE_OPTIMIZER ? "optimizer" : "forward";
}

static bool user_cuts(Graph *g, Node **order, int n_fwd, int n_stages, const char *const *cuts, int n_cuts,
                      int *begin, Diag *d) {
    if (n_cuts != n_stages - 1)
        return diag_error(d, DIAG_USAGE, "%s: --stages names %d cut point%s for %d stages; give %d (stage k + 1 begins at the k-th name)",
                          g->path, n_cuts, n_cuts == 1 ? "" : "s", n_stages, n_stages - 1);
    int *pos = malloc(sizeof *pos * (size_t)(g->n_nodes + 1));
    if (!pos) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (int i = 0; i < g->n_nodes; i++) pos[i] = -1;
    for (int i = 0; i < n_fwd; i++) pos[order[i]->id] = i;
    begin[0] = 0;
    begin[n_stages] = n_fwd;
    bool ok = true;
    for (int k = 0; k < n_cuts && ok; k++) {
        const char *name = cuts[k] ? cuts[k] : "";
        const Node *found = NULL, *other = NULL;
        int same = 0;
        GRAPH_FOR_NODES(g, n) {
            if (strcmp(n->name, name) != 0) continue;
            if (is_forward(n)) {
                same++;
                found = n;
            } else if (!other) {
                other = n;
            }
        }
        if (!found && other)
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: '%s' is a %s node of the training graph; cut points name forward nodes of the model",
                            g->path, name, phase_word(other->phase));
        else if (!found)
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: the model has no node named '%s'", g->path, name);
        else if (same > 1)
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: %d nodes are named '%s'; the cut point is ambiguous", g->path,
                            same, name);
        if (!ok) break;
        int at = pos[found->id];
        if (at == 0) {
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: cutting at '%s' leaves stage 0 empty: it is the first node of the model",
                            g->path, name);
        } else if (k > 0 && at == begin[k]) {
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: '%s' is named twice, which leaves stage %d empty", g->path, name,
                            k);
        } else if (k > 0 && at < begin[k]) {
            ok = diag_error(d, DIAG_USAGE, "%s: --stages: cut points out of order: '%s' (node %d of %d in order) comes before '%s' (node %d)",
                            g->path, name, at + 1, n_fwd, cuts[k - 1] ? cuts[k - 1] : "", begin[k] + 1);
        }
        begin[k + 1] = at;
    }
    free(pos);
    return ok;
}

/* ---- the split ---- */

bool stages_split(Graph *g, int n_stages, const char *const *cuts, int n_cuts, StageSplit *s, Diag *d) {
    return stages_split_weighted(g, n_stages, cuts, n_cuts, NULL, s, d);
}

/* The costs stages_balance_costs weighs, position by position: what
 * crosses each boundary, the parameters each position brings (with the
 * first forward node reading them) and the activations it produces. */
static int balance_with_costs(Graph *g, Node **order, int n_fwd, const int *pos, const double *w, int n_stages,
                              const StageWeight *wt, int *begin) {
    size_t n1 = (size_t)n_fwd + 1, k1 = (size_t)n_stages;
    double *buf = calloc(4 * n1 + 2 * k1, sizeof *buf);
    int *reach = malloc(sizeof *reach * ((size_t)g->n_values + 1)); /* furthest reader of each value; -1 unread */
    int status = -1;
    if (!buf || !reach) goto done;
    double *cut_bytes = buf, *cut_values = buf + n1, *params = buf + 2 * n1, *acts = buf + 3 * n1,
           *lat = buf + 4 * n1, *spb = lat + k1;
    for (int i = 0; i < g->n_values; i++) reach[i] = -1;
    GRAPH_FOR_NODES(g, n) {
        const Node *h = home_node(g, n);
        int at = h && pos[h->id] >= 0 ? pos[h->id] : n_fwd - 1;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] && reach[n->in[k]->id] < at) reach[n->in[k]->id] = at;
    }
    /* A value made at p and read up to q crosses boundaries p + 1 .. q:
     * differences here, summed below. */
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        const Node *pr = live_producer(v);
        if (!is_forward(pr) || pos[pr->id] < 0 || reach[v->id] <= pos[pr->id]) continue;
        int p = pos[pr->id], q = reach[v->id];
        double bytes = (double)plan_value_bytes(v);
        cut_bytes[p + 1] += bytes;
        cut_bytes[q + 1] -= bytes;
        cut_values[p + 1] += 1;
        cut_values[q + 1] -= 1;
    }
    for (size_t x = 1; x < n1; x++) {
        cut_bytes[x] += cut_bytes[x - 1];
        cut_values[x] += cut_values[x - 1];
    }
    /* reach[] is reused as "already counted" for the parameters, which go
     * with the first position reading them. */
    for (int i = 0; i < g->n_values; i++) reach[i] = 0;
    for (int i = 0; i < n_fwd; i++) {
        const Node *n = order[i];
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && plan_value_bytes(n->out[k]) > 0) acts[i] += (double)plan_value_bytes(n->out[k]);
        for (int k = 0; k < n->n_in; k++) {
            const Value *v = n->in[k];
            if (!v || v->kind != VAL_INITIALIZER || reach[v->id]) continue;
            reach[v->id] = 1;
            params[i] += (double)plan_value_bytes(v);
        }
    }
    for (int j = 0; j + 1 < n_stages; j++) wt->boundary_link(j, &lat[j], &spb[j], wt->ctx);
    StageCosts c = {n_fwd, w, cut_bytes, cut_values, lat, spb, params, acts, wt->memory_limit, wt->param_copies,
                    wt->act_copies};
    status = stages_balance_costs(&c, n_stages, begin);
done:
    free(buf);
    free(reach);
    return status;
}

bool stages_split_weighted(Graph *g, int n_stages, const char *const *cuts, int n_cuts, const StageWeight *wt,
                           StageSplit *s, Diag *d) {
    memset(s, 0, sizeof *s);
    if (n_stages < 1)
        return diag_error(d, DIAG_USAGE, "%s: the number of pipeline stages must be at least 1, not %d", g->path,
                          n_stages);
    int n_fwd;
    Node **order = stages_forward_order(g, &n_fwd, d);
    if (!order) return false;
    if (n_fwd == 0 && n_stages == 1 && n_cuts <= 0) {
        /* Nothing left to run forward (folded away, or outputs that are
         * inputs): one empty stage, which any other node joins. */
        int *begin = ARENA_ARRAY(&g->arena, int, 2);
        double *flops = ARENA_ARRAY(&g->arena, double, 1);
        if (!begin || !flops) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        begin[0] = begin[1] = 0;
        flops[0] = 0;
        GRAPH_FOR_NODES(g, n) { flops[0] += node_flops(n); }
        *s = (StageSplit){1, 0, order, begin, flops};
        return true;
    }
    if (n_fwd == 0) return diag_error(d, DIAG_GRAPH, "%s: the model has no forward nodes to split into stages", g->path);
    if (n_stages > n_fwd)
        return diag_error(d, DIAG_USAGE, "%s: cannot split %d forward node%s into %d stages: every stage needs a node (use at most %d)",
                          g->path, n_fwd, n_fwd == 1 ? "" : "s", n_stages, n_fwd);
    int *begin = ARENA_ARRAY(&g->arena, int, n_stages + 1);
    double *flops = ARENA_ARRAY(&g->arena, double, n_stages);
    double *w = calloc((size_t)n_fwd, sizeof *w), *fl = calloc((size_t)n_fwd, sizeof *fl);
    int *pos = malloc(sizeof *pos * (size_t)(g->n_nodes + 1));
    if (!begin || !flops || !w || !fl || !pos) {
        free(w);
        free(fl);
        free(pos);
        return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    }
    /* Each forward node weighs its own FLOPs (or predicted time) and those
     * of every node that goes with it; what goes with the loss weighs on
     * the last node. */
    for (int i = 0; i < g->n_nodes; i++) pos[i] = -1;
    for (int i = 0; i < n_fwd; i++) pos[order[i]->id] = i;
    GRAPH_FOR_NODES(g, n) {
        const Node *h = home_node(g, n);
        int at = h && pos[h->id] >= 0 ? pos[h->id] : n_fwd - 1;
        double f = node_flops(n), x = wt && wt->node_seconds ? wt->node_seconds(n, wt->ctx) : f;
        w[at] += x > 0 && isfinite(x) ? x : 0;
        fl[at] += f;
    }
    CLEAVE_CHECK(n_cuts <= 0 || cuts, "%d stage cuts without their names", n_cuts);
    /* With the cost model's links, stages also pay for what crosses their
     * boundaries and must fit memory; graphs too large for that search
     * are balanced on compute alone. */
    bool costed = n_cuts <= 0 && wt && wt->boundary_link &&
                  balance_with_costs(g, order, n_fwd, pos, w, n_stages, wt, begin) >= 0;
    bool ok = n_cuts > 0 ? user_cuts(g, order, n_fwd, n_stages, cuts, n_cuts, begin, d)
              : costed   ? true
                         : (stages_balance(w, n_fwd, n_stages, begin) ||
                            diag_error(d, DIAG_NOMEM, "%s: out of memory balancing %d stages", g->path, n_stages));
    if (ok)
        for (int k = 0; k < n_stages; k++) {
            flops[k] = 0;
            for (int i = begin[k]; i < begin[k + 1]; i++) flops[k] += fl[i];
        }
    free(w);
    free(fl);
    free(pos);
    if (!ok) return false;
    *s = (StageSplit){n_stages, n_fwd, order, begin, flops};
    return true;
}

bool stages_assign(Graph *g, int n_stages, const char *const *cuts, int n_cuts, int *stage_of_node, Diag *d) {
    StageSplit s;
    if (!stages_split(g, n_stages, cuts, n_cuts, &s, d)) return false;
    for (int i = 0; i < g->n_nodes; i++) stage_of_node[i] = -1;
    for (int k = 0; k < n_stages; k++)
        for (int i = s.begin[k]; i < s.begin[k + 1]; i++) stage_of_node[s.order[i]->id] = k;
    return true;
}
