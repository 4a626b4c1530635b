/* pipeline.c - the planner: every plan, D data-parallel replicas x P
 * stages x M micro-batches (single is 1 x 1 x 1, dp D x 1 x 1, layer
 * 1 x P x 1), as each rank's steps with the point-to-point transfers
 * between stages and the collectives over replicas, checked by comm_check
 * before they are returned.  See pipeline.h for what the steps mean. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "../ops/ops.h"

/* A growing step sequence (malloc'd until copied into the arena). */
typedef struct Seq {
    PlanStep *s;
    int n, cap;
    bool failed;
} Seq;

static void emit(Seq *q, PlanStep st) {
    if (q->failed) return;
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        PlanStep *s = realloc(q->s, sizeof *s * (size_t)cap);
        if (!s) {
            q->failed = true;
            return;
        }
        q->s = s;
        q->cap = cap;
    }
    q->s[q->n++] = st;
}

typedef struct NodeList {
    Node **a;
    int n;
} NodeList;

typedef struct Ctx {
    Graph *g;
    const TrainGraph *t;
    Plan *p;
    Diag *d;
    int P, M, D;
    SchedKind sched;
    int *stage;            /* by node id */
    NodeList *fwd, *bwd, *sum, *opt; /* per stage, in topological order */
    /* Once-per-step nodes adding into a sum over the stages (OpDef.stage_sums),
     * per stage; the sums themselves; and by node id, the once-per-step
     * nodes that read a sum and so run on every stage. */
    NodeList *norm;
    Value **summed;
    int n_summed;
    unsigned char *everywhere;
    unsigned char *reads;    /* [value id * P + stage]: a non-optimizer node of the stage reads it */
    unsigned char *grad;     /* by value id: computed, and read by an optimizer update */
    unsigned char *acc;      /* by value id: accumulated over micro-batches */
    unsigned char *deferred; /* by node id: a cross-stage gradient sum run once per step */
    int *xfer_head, *xfer_next;
    PlanXfer *xf;
    int n_xf, cap_xf, n_channels;
    /* hybrid: gradient buckets of the rank being built */
    int64_t bucket_bytes;
    int *bucket_of;   /* by value id, -1: none */
    int *bucket_left; /* members not yet final, per bucket */
} Ctx;

static bool nomem(Ctx *c) { return diag_error(c->d, DIAG_NOMEM, "%s: out of memory planning the pipeline", c->g->path); }

static const Node *live_producer(const Value *v) {
    return v && v->producer && !v->producer->dead ? v->producer : NULL;
}

static XferDir dir_of(const Node *producer) {
    return producer->phase <= PHASE_LOSS ? XFER_ACTIVATION : XFER_GRADIENT;
}

static int find_xfer(const Ctx *c, const Value *v, XferDir dir, int dst) {
    for (int x = c->xfer_head[v->id]; x >= 0; x = c->xfer_next[x])
        if (c->xf[x].dir == dir && c->xf[x].dst_stage == dst) return x;
    return -1;
}

static bool add_xfer(Ctx *c, Value *v, XferDir dir, int src, int dst, bool eval) {
    int x = find_xfer(c, v, dir, dst);
    if (x >= 0) {
        c->xf[x].eval |= eval;
        return true;
    }
    if (plan_value_bytes(v) < 0)
        return diag_error(c->d, DIAG_SHAPE, "%s: value '%s' goes from stage %d to stage %d but has no static shape; bind --batch",
                          c->g->path, v->name, src, dst);
    if (c->n_xf == c->cap_xf) {
        int cap = c->cap_xf ? 2 * c->cap_xf : 64;
        PlanXfer *a = realloc(c->xf, sizeof *a * (size_t)cap);
        int *nx = realloc(c->xfer_next, sizeof *nx * (size_t)cap);
        if (a) c->xf = a;
        if (nx) c->xfer_next = nx;
        if (!a || !nx) return nomem(c);
        c->cap_xf = cap;
    }
    int channel = -1;
    for (int y = c->xfer_head[v->id]; y >= 0 && channel < 0; y = c->xfer_next[y])
        if (c->xf[y].dir == dir) channel = c->xf[y].channel;
    if (channel < 0) channel = c->n_channels++;
    x = c->n_xf++;
    c->xf[x] = (PlanXfer){v, dir, src, dst, channel, eval};
    c->xfer_next[x] = c->xfer_head[v->id];
    c->xfer_head[v->id] = x;
    return true;
}

static bool list_add(NodeList *l, Node *n, int cap) {
    if (!l->a && !(l->a = malloc(sizeof *l->a * (size_t)(cap ? cap : 1)))) return false;
    l->a[l->n++] = n;
    return true;
}

static bool adds_stage_sum(const Node *n) { return n->def && n->def->stage_sums; }

/* The values some node sums over the stages (OpDef.stage_sums), and the
 * once-per-step nodes reading one: they run on every stage, each on the
 * total its stage received, so what they compute is there for every
 * update without a transfer. */
static bool find_stage_sums(Ctx *c) {
    Graph *g = c->g;
    c->summed = malloc(sizeof *c->summed * (size_t)(g->n_values + 1));
    if (!c->summed) return nomem(c);
    GRAPH_FOR_NODES(g, n) {
        for (int k = 0; k < n->n_in && adds_stage_sum(n); k++) {
            Value *v = n->in[k];
            if (!v || !((n->def->stage_sums >> k) & 1)) continue;
            bool known = false;
            for (int i = 0; i < c->n_summed && !known; i++) known = c->summed[i] == v;
            if (!known) c->summed[c->n_summed++] = v;
        }
    }
    GRAPH_FOR_NODES(g, n) {
        if (n->phase != PHASE_OPTIMIZER || adds_stage_sum(n)) continue;
        for (int k = 0; k < n->n_in; k++)
            for (int i = 0; i < c->n_summed; i++)
                if (n->in[k] == c->summed[i]) c->everywhere[n->id] = 1;
    }
    return true;
}

/* Add of two same-shaped values, or Identity, in the backward pass: what
 * sums a value's gradient contributions. */
static bool is_sum_node(const Node *n) {
    if (n->phase != PHASE_BACKWARD || n->n_out != 1 || !n->out[0] || n->domain[0]) return false;
    bool add = strcmp(n->op_type, "Add") == 0 && n->n_in == 2, copy = strcmp(n->op_type, "Identity") == 0 && n->n_in == 1;
    if (!add && !copy) return false;
    int64_t e = value_numel(n->out[0]);
    for (int k = 0; k < n->n_in; k++)
        if (!n->in[k] || n->in[k]->rank != n->out[0]->rank || value_numel(n->in[k]) != e) return false;
    return e > 0;
}

/* A gradient summed from contributions computed on several stages (a
 * weight read on several stages) is summed once per step instead of once
 * per micro-batch, which is the same by linearity: each stage accumulates
 * its contributions over the micro-batches, sends the partial sum to the
 * stage computing the total once, and that stage runs the Add tree then. */
static bool defer_sums(Ctx *c) {
    Graph *g = c->g;
    int nn = g->n_nodes, nv = g->n_values;
    int *readers = calloc((size_t)nv + 1, sizeof *readers), *opt_readers = calloc((size_t)nv + 1, sizeof *opt_readers);
    Node **stack = malloc(sizeof *stack * (size_t)(nn + 1)), **tree = malloc(sizeof *tree * (size_t)(nn + 1));
    Value **leaves = malloc(sizeof *leaves * (size_t)(2 * nn + 2));
    bool ok = readers && opt_readers && stack && tree && leaves;
    if (ok) {
        GRAPH_FOR_NODES(g, n) {
            for (int k = 0; k < n->n_in; k++) {
                Value *v = n->in[k];
                if (!v) continue;
                readers[v->id]++;
                if (n->phase != PHASE_OPTIMIZER) continue;
                opt_readers[v->id]++;
                /* a gradient; the updates of running statistics read forward values */
                const Node *pr = live_producer(v);
                if (pr && pr->phase == PHASE_BACKWARD) c->grad[v->id] = 1;
            }
        }
        for (int v = 0; v < nv; v++) {
            Node *root = g->values[v]->producer;
            if (!c->grad[v] || !root || root->dead || !is_sum_node(root) || c->deferred[root->id] ||
                readers[v] != opt_readers[v])
                continue;
            int owner = c->stage[root->id], n_stack = 0, n_tree = 0, n_leaves = 0;
            bool valid = true, spans = false;
            stack[n_stack++] = root;
            while (n_stack > 0) {
                Node *r = stack[--n_stack];
                tree[n_tree++] = r;
                spans |= c->stage[r->id] != owner;
                for (int k = 0; k < r->n_in; k++) {
                    Value *u = r->in[k];
                    const Node *pr = live_producer(u);
                    if (pr && is_sum_node(pr) && readers[u->id] == 1 && !c->deferred[pr->id]) {
                        stack[n_stack++] = (Node *)pr;
                    } else if (!pr) {
                        valid = false; /* a constant would be summed M times */
                    } else {
                        leaves[n_leaves++] = u;
                        spans |= c->stage[pr->id] != owner;
                    }
                }
            }
            if (!valid || !spans) continue;
            for (int i = 0; i < n_tree; i++) {
                c->deferred[tree[i]->id] = 1;
                c->stage[tree[i]->id] = owner;
            }
            for (int i = 0; i < n_leaves; i++) c->acc[leaves[i]->id] = 1;
        }
        for (int v = 0; v < nv; v++) {
            const Node *pr = live_producer(g->values[v]);
            if (c->grad[v] && pr && !c->deferred[pr->id]) c->acc[v] = 1;
            /* a forward value the updates read (batch statistics): summed
             * over the micro-batches like a gradient, not over replicas */
            if (!c->grad[v] && pr && pr->phase < PHASE_BACKWARD && opt_readers[v]) c->acc[v] = 1;
        }
    }
    free(readers);
    free(opt_readers);
    free(stack);
    free(tree);
    free(leaves);
    return ok || nomem(c);
}

/* Stages, node lists per stage and the transfers between stages. */
static bool analyse(Ctx *c, const StageSplit *sp) {
    Graph *g = c->g;
    int P = c->P, nn = g->n_nodes;
    for (int i = 0; i < nn; i++) c->stage[i] = -1;
    for (int k = 0; k < P; k++)
        for (int i = sp->begin[k]; i < sp->begin[k + 1]; i++) c->stage[sp->order[i]->id] = k;
    int *fwd_stage = malloc(sizeof *fwd_stage * (size_t)(nn + 1));
    if (!fwd_stage) return nomem(c);
    memcpy(fwd_stage, c->stage, sizeof *fwd_stage * (size_t)nn);
    GRAPH_FOR_NODES(g, n) {
        if (n->phase != PHASE_FORWARD) c->stage[n->id] = stage_of(g, fwd_stage, n);
    }
    free(fwd_stage);
    GRAPH_FOR_NODES(g, n) {
        if (c->stage[n->id] < 0 || c->stage[n->id] >= P)
            return diag_error(c->d, DIAG_INTERNAL, "%s: node '%s' (%s) has no pipeline stage", g->path, n->name,
                              n->op_type);
    }
    if (!defer_sums(c) || !find_stage_sums(c)) return false;
    int count;
    Node **topo = ir_topo_order(g, &count, c->d);
    if (!topo) return false;
    for (int i = 0; i < count; i++) {
        const Node *n = topo[i];
        if (n->phase == PHASE_OPTIMIZER) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]) c->reads[(size_t)n->in[k]->id * P + c->stage[n->id]] = 1;
    }
    unsigned char *targets = malloc((size_t)P);
    if (!targets) return nomem(c);
    bool ok = true;
    for (int i = 0; i < count && ok; i++) {
        Node *n = topo[i];
        int s = c->stage[n->id];
        if (n->phase != PHASE_OPTIMIZER) {
            bool once = c->deferred[n->id];
            NodeList *l = once ? &c->sum[s] : n->phase == PHASE_BACKWARD ? &c->bwd[s] : &c->fwd[s];
            ok = list_add(l, n, count) || nomem(c);
            for (int k = 0; k < n->n_in && ok; k++) {
                Value *v = n->in[k];
                const Node *pr = live_producer(v);
                if (pr && c->stage[pr->id] != s)
                    ok = add_xfer(c, v, once ? XFER_GRAD_SUM : dir_of(pr), c->stage[pr->id], s,
                                  n->phase <= PHASE_LOSS);
            }
            continue;
        }
        /* An update runs on its own stage and on every stage that reads
         * its parameter, so that the copies stay identical; the gradient
         * it reads comes summed from the stage computing it.  A node
         * adding into a sum over the stages runs on its own stage only,
         * so that each gradient counts once; one reading such a sum, on
         * every stage. */
        memset(targets, 0, (size_t)P);
        targets[s] = 1;
        for (int k = 0; k < n->n_in && !adds_stage_sum(n); k++)
            if (n->in[k] && n->in[k]->kind == VAL_INITIALIZER)
                for (int q = 0; q < P; q++) targets[q] |= c->reads[(size_t)n->in[k]->id * P + q];
        if (c->everywhere[n->id]) memset(targets, 1, (size_t)P);
        for (int q = 0; q < P && ok; q++) {
            if (!targets[q]) continue;
            ok = list_add(adds_stage_sum(n) ? &c->norm[q] : &c->opt[q], n, count) || nomem(c);
            for (int k = 0; k < n->n_in && ok; k++) {
                Value *v = n->in[k];
                const Node *pr = live_producer(v);
                if (pr && !c->everywhere[pr->id] && c->stage[pr->id] != q)
                    ok = add_xfer(c, v, XFER_GRAD_SUM, c->stage[pr->id], q, false);
            }
        }
    }
    free(targets);
    return ok;
}

static int rank_of(const Ctx *c, int replica, int stage) { return plan_rank_of(c->p, replica, stage); }

int plan_rank_of(const Plan *p, int replica, int stage) {
    return p->placement == PLACE_BY_STAGE ? stage * p->replicas + replica : replica * p->n_stages + stage;
}

const RankPlan *plan_stage_rank(const Plan *p, int s) { return &p->ranks[plan_rank_of(p, 0, s)]; }

const char *plan_placement_name(Placement pl) { return pl == PLACE_BY_STAGE ? "by_stage" : "by_replica"; }

static int tag_of(const Ctx *c, int x, int micro) { return c->xf[x].channel * (c->M + 1) + micro + 1; }

static PlanStep xfer_step(const Ctx *c, StepKind kind, int x, int peer, int micro) {
    Value *v = c->xf[x].value;
    return (PlanStep){.kind = kind, .micro = micro, .peer = peer, .tag = tag_of(c, x, micro), .group = -1, .xfer = x,
                      .value = v, .bytes = plan_value_bytes(v)};
}

/* Sums over the stage's replicas of the outputs node n computed for this
 * replica's rows (OpDef.replica_sums: batch statistics), right after it,
 * in the train step; the eval step normalises with running statistics. */
static void emit_replica_sums(Ctx *c, Seq *q, const Node *n, int s, int m) {
    if (!n->def->replica_sums || node_attr_i(n, "replicas", 1) <= 1) return;
    CLEAVE_CHECK(node_attr_i(n, "replicas", 1) == c->D, "node '%s' sums its statistics over %lld replicas in a plan of %d",
                 n->name, (long long)node_attr_i(n, "replicas", 1), c->D);
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] && (n->def->replica_sums >> k) & 1)
            emit(q, (PlanStep){.kind = STEP_ALLREDUCE, .micro = m, .peer = -1, .group = s, .xfer = -1,
                               .value = n->out[k], .bytes = plan_value_bytes(n->out[k])});
}

/* One unit of micro-batch m: each node with the receives it needs first
 * and the sends of what it computes after (for the eval step, only the
 * transfers forward and loss nodes read). */
static void emit_nodes(Ctx *c, Seq *q, const NodeList *l, int replica, int s, int m, bool train,
                       unsigned char *got) {
    for (int i = 0; i < l->n; i++) {
        Node *n = l->a[i];
        for (int k = 0; k < n->n_in; k++) {
            Value *v = n->in[k];
            const Node *pr = live_producer(v);
            if (!pr || c->stage[pr->id] == s) continue;
            int x = find_xfer(c, v, dir_of(pr), s);
            if (x < 0 || got[(size_t)v->id * c->M + m]) continue;
            got[(size_t)v->id * c->M + m] = 1;
            emit(q, xfer_step(c, STEP_RECV, x, rank_of(c, replica, c->xf[x].src_stage), m));
        }
        emit(q, (PlanStep){.kind = STEP_COMPUTE, .node = n, .micro = m, .peer = -1, .group = -1, .xfer = -1});
        if (train) emit_replica_sums(c, q, n, s, m);
        for (int k = 0; k < n->n_out; k++) {
            Value *v = n->out[k];
            if (!v) continue;
            for (int dst = 0; dst < c->P; dst++) {
                if (dst == s) continue;
                int x = find_xfer(c, v, dir_of(n), dst);
                if (x < 0 || (!train && !c->xf[x].eval)) continue;
                emit(q, xfer_step(c, STEP_SEND, x, rank_of(c, replica, dst), m));
            }
            if (!train || !c->acc[v->id]) continue;
            /* With one micro-batch the gradient is final as computed, and
             * its bucket holds that instance itself (memplan.c). */
            if (c->M > 1)
                emit(q, (PlanStep){.kind = STEP_ACCUMULATE, .micro = m, .peer = -1, .group = -1, .xfer = -1,
                                   .value = v});
            /* The last micro-batch's contribution makes the gradient
             * final: its bucket's sum over the replicas can start. */
            int b = c->D > 1 ? c->bucket_of[v->id] : -1;
            if (m == c->M - 1 && b >= 0 && --c->bucket_left[b] == 0)
                emit(q, (PlanStep){.kind = STEP_ALLREDUCE_START, .bucket = b, .micro = m, .peer = -1, .group = s,
                                   .xfer = -1});
        }
    }
}

static void emit_grad_sums(Ctx *c, Seq *q, int replica, int s, StepKind kind, bool totals) {
    for (int x = 0; x < c->n_xf; x++) {
        const PlanXfer *t = &c->xf[x];
        if (t->dir != XFER_GRAD_SUM || (bool)c->grad[t->value->id] != totals) continue;
        if (kind == STEP_SEND && t->src_stage == s)
            emit(q, xfer_step(c, STEP_SEND, x, rank_of(c, replica, t->dst_stage), -1));
        if (kind == STEP_RECV && t->dst_stage == s)
            emit(q, xfer_step(c, STEP_RECV, x, rank_of(c, replica, t->src_stage), -1));
    }
}

static void emit_allreduce(Ctx *c, Seq *q, const NodeList *l, int s) {
    for (int i = 0; i < l->n; i++) {
        const Node *n = l->a[i];
        for (int k = 0; k < n->n_out; k++) {
            Value *v = n->out[k];
            if (v && c->grad[v->id])
                emit(q, (PlanStep){.kind = STEP_ALLREDUCE, .micro = -1, .peer = -1, .group = s, .xfer = -1, .value = v,
                                   .bytes = plan_value_bytes(v)});
        }
    }
}

/* The buckets a once-per-step step reads a gradient of (hybrid and dp),
 * waited for right before it unless waited already: updates of the
 * gradients summed first overlap the sums still in flight. */
static void wait_buckets(Ctx *c, Seq *q, const PlanStep *st, unsigned char *waited, int s) {
    int n = st->kind == STEP_COMPUTE ? st->node->n_in : 1;
    for (int k = 0; k < n; k++) {
        const Value *v = st->kind == STEP_COMPUTE ? st->node->in[k] : st->value;
        int b = v && c->D > 1 ? c->bucket_of[v->id] : -1;
        if (b < 0 || waited[b]) continue;
        waited[b] = 1;
        emit(q, (PlanStep){.kind = STEP_ALLREDUCE_WAIT, .bucket = b, .micro = -1, .peer = -1, .group = s, .xfer = -1});
    }
}

/* Once per global batch: partial sums of shared weights' gradients to
 * the stage that totals them, the totals, their sum over replicas, the
 * totals to the other stages holding the weight, the nodes adding into
 * sums over the stages (gradient clipping's sum of squares: it needs every
 * gradient of the stage final) and those sums over the stages of the
 * replica, then the updates.  Every rank sends before it waits at each
 * turn, and every stage joins each sum over the stages, so no turn can
 * deadlock.  The waits for bucketed sums go before the first step reading
 * them. */
static void emit_flush(Ctx *c, Seq *q, const RankPlan *rp, int replica, int s, unsigned char *waited) {
    Seq f = {0};
    emit_grad_sums(c, &f, replica, s, STEP_SEND, false);
    emit_grad_sums(c, &f, replica, s, STEP_RECV, false);
    for (int i = 0; i < c->sum[s].n; i++)
        emit(&f, (PlanStep){.kind = STEP_COMPUTE, .node = c->sum[s].a[i], .micro = -1, .peer = -1, .group = -1,
                            .xfer = -1});
    if (c->D > 1) emit_allreduce(c, &f, &c->sum[s], s); /* the bucketed ones are summed already */
    emit_grad_sums(c, &f, replica, s, STEP_SEND, true);
    emit_grad_sums(c, &f, replica, s, STEP_RECV, true);
    for (int i = 0; i < c->norm[s].n; i++)
        emit(&f, (PlanStep){.kind = STEP_COMPUTE, .node = c->norm[s].a[i], .micro = -1, .peer = -1, .group = -1,
                            .xfer = -1});
    for (int i = 0; c->P > 1 && i < c->n_summed; i++)
        emit(&f, (PlanStep){.kind = STEP_ALLREDUCE, .micro = -1, .peer = -1, .group = c->P + replica, .xfer = -1,
                            .value = c->summed[i], .bytes = plan_value_bytes(c->summed[i])});
    for (int i = 0; i < c->opt[s].n; i++)
        emit(&f, (PlanStep){.kind = STEP_COMPUTE, .node = c->opt[s].a[i], .micro = -1, .peer = -1, .group = -1,
                            .xfer = -1});
    q->failed |= f.failed;
    memset(waited, 0, (size_t)rp->n_buckets + 1);
    for (int i = 0; i < f.n; i++) {
        if (f.s[i].kind != STEP_RECV) wait_buckets(c, q, &f.s[i], waited, s);
        emit(q, f.s[i]);
    }
    for (int b = 0; b < rp->n_buckets; b++) /* buckets no step reads (none today) */
        if (!waited[b])
            emit(q, (PlanStep){.kind = STEP_ALLREDUCE_WAIT, .bucket = b, .micro = -1, .peer = -1, .group = s,
                               .xfer = -1});
    free(f.s);
}

/* Every value a step reads must be on the rank for that micro-batch
 * (computed or received), and for once-per-step steps summed over the
 * micro-batches; records what the rank holds. */
static bool check_dataflow(Ctx *c, const RankPlan *rp, const PlanStep *seq, int n, unsigned char *holds,
                           unsigned char *avail, const char *which) {
    int M = c->M, slots = M + 1;
    memset(avail, 0, (size_t)c->g->n_values * (size_t)slots);
#define AVAIL(v, m) avail[(size_t)(v)->id * (size_t)slots + (size_t)((m) + 1)]
    for (int i = 0; i < n; i++) {
        const PlanStep *s = &seq[i];
        bool per_micro = s->micro >= 0;
        int n_read = s->kind == STEP_COMPUTE ? s->node->n_in
                     : s->kind == STEP_SEND || s->kind == STEP_ACCUMULATE || s->kind == STEP_ALLREDUCE ? 1
                                                                                                     : 0;
        for (int k = 0; k < n_read; k++) {
            const Value *v = s->kind == STEP_COMPUTE ? s->node->in[k] : s->value;
            if (!v) continue;
            if (v->kind != VAL_INTERMEDIATE) {
                holds[v->id] |= HOLD_PERSISTENT;
                continue;
            }
            bool ok = per_micro ? AVAIL(v, s->micro) : AVAIL(v, -1) || (M == 1 && AVAIL(v, 0));
            if (!ok)
                return diag_error(c->d, DIAG_INTERNAL, "%s: pipeline plan, %s step: rank %d step %d (%s '%s', micro-batch %d) reads '%s' before it is computed or received",
                                  c->g->path, which, rp->rank, i, s->kind == STEP_COMPUTE ? "node" : "value",
                                  s->kind == STEP_COMPUTE ? s->node->name : s->value->name, s->micro, v->name);
        }
        if (s->kind == STEP_COMPUTE) {
            for (int k = 0; k < s->node->n_out; k++)
                if (s->node->out[k]) {
                    AVAIL(s->node->out[k], s->micro) = 1;
                    holds[s->node->out[k]->id] |= HOLD_COMPUTED;
                }
        } else if (s->kind == STEP_RECV) {
            AVAIL(s->value, s->micro) = 1;
            holds[s->value->id] |= HOLD_RECEIVED;
        } else if (s->kind == STEP_ACCUMULATE) {
            AVAIL(s->value, -1) = 1;
            holds[s->value->id] |= HOLD_ACCUM;
        }
    }
#undef AVAIL
    return true;
}

PlanUnit plan_step_unit(const Plan *p, const PlanStep *st) {
    if (st->micro < 0) return UNIT_UPDATE;
    switch (st->kind) {
    case STEP_COMPUTE: return st->node->phase >= PHASE_BACKWARD ? UNIT_BACKWARD : UNIT_FORWARD;
    case STEP_SEND:
    case STEP_RECV: return p->xfers[st->xfer].dir == XFER_ACTIVATION ? UNIT_FORWARD : UNIT_BACKWARD;
    /* batch statistics accumulate, and are allreduced, in the forward pass */
    case STEP_ACCUMULATE:
    case STEP_ALLREDUCE: {
        const Node *pr = st->value->producer;
        return pr && pr->phase < PHASE_BACKWARD ? UNIT_FORWARD : UNIT_BACKWARD;
    }
    default: return UNIT_BACKWARD;
    }
}

/* Where the send at q->s[i] completes: before the first step of the
 * sender's backward unit of its micro-batch (an activation) or of the
 * next micro-batch (a gradient) in the train step, before the first step
 * of the next micro-batch's forward unit in the eval step; q->n: at the
 * end of the step. */
static int send_done_at(const Ctx *c, const Seq *q, int i, bool train) {
    const PlanStep *st = &q->s[i];
    if (st->micro < 0) return q->n;
    int want = st->micro + (!train || plan_step_unit(c->p, st) == UNIT_BACKWARD);
    PlanUnit want_unit = train ? UNIT_BACKWARD : UNIT_FORWARD;
    for (int j = i + 1; j < q->n; j++) {
        const PlanStep *o = &q->s[j];
        if (o->micro == want && plan_step_unit(c->p, o) == want_unit) return j;
    }
    return q->n;
}

/* Inserts the STEP_SEND_WAIT of every send (send_done_at), in send order
 * where several fall at the same place. */
static bool insert_send_waits(Ctx *c, Seq *q, bool train) {
    /* Sends bucketed by the step their wait precedes (a counting sort,
     * stable, so waits at one place keep the sends' order). */
    size_t n1 = (size_t)q->n + 1;
    int *at = malloc(sizeof *at * n1), *first = calloc(n1 + 1, sizeof *first), *order = malloc(sizeof *order * n1);
    if (!at || !first || !order) {
        free(at);
        free(first);
        free(order);
        return nomem(c);
    }
    for (int i = 0; i < q->n; i++) {
        at[i] = q->s[i].kind == STEP_SEND ? send_done_at(c, q, i, train) : -1;
        if (at[i] >= 0 && at[i] < q->n) first[at[i] + 1]++;
    }
    for (int j = 0; j < q->n; j++) first[j + 1] += first[j];
    int *fill = calloc(n1, sizeof *fill);
    if (!fill) {
        free(at);
        free(first);
        free(order);
        return nomem(c);
    }
    for (int i = 0; i < q->n; i++)
        if (at[i] >= 0 && at[i] < q->n) order[first[at[i]] + fill[at[i]]++] = i;
    Seq out = {0};
    for (int j = 0; j < q->n; j++) {
        for (int k = first[j]; k < first[j + 1]; k++) {
            PlanStep w = q->s[order[k]];
            w.kind = STEP_SEND_WAIT;
            emit(&out, w);
        }
        emit(&out, q->s[j]);
    }
    free(at);
    free(first);
    free(order);
    free(fill);
    free(q->s);
    *q = out;
    return !out.failed || nomem(c);
}

/* dp and hybrid: the gradients stage s finalises in its own nodes (not
 * the cross-stage sums run once per step) are summed over the replicas in
 * buckets, in the order the stage produces them: a bucket closes once it
 * holds bucket_bytes, so the first (the last layers') can start while the
 * backward pass goes on, as PyTorch DDP's do.  Memory planning lays each
 * bucket's gradients (or their accumulators) out back to back. */
static bool make_buckets(Ctx *c, RankPlan *rp, int s) {
    Graph *g = c->g;
    int nv = g->n_values, nb = 0, used = 0;
    Bucket *bk = ARENA_ARRAY(&g->arena, Bucket, nv ? nv : 1);
    Value **members = ARENA_ARRAY(&g->arena, Value *, nv ? nv : 1);
    if (!bk || !members) return nomem(c);
    for (int v = 0; v < nv; v++) c->bucket_of[v] = -1;
    int64_t size = 0, cap = c->bucket_bytes > 0 ? c->bucket_bytes : 1;
    const NodeList *lists[2] = {&c->fwd[s], &c->bwd[s]};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++) {
            const Node *n = lists[l]->a[i];
            for (int k = 0; k < n->n_out; k++) {
                Value *v = n->out[k];
                if (!v || !c->acc[v->id] || !c->grad[v->id] || c->bucket_of[v->id] >= 0) continue;
                if (!nb || size >= cap) {
                    bk[nb] = (Bucket){.n = 0, .grads = &members[used]};
                    c->bucket_left[nb++] = 0;
                    size = 0;
                }
                members[used++] = v;
                bk[nb - 1].n++;
                c->bucket_left[nb - 1]++;
                c->bucket_of[v->id] = nb - 1;
                size += plan_value_bytes(v);
            }
        }
    rp->buckets = bk;
    rp->n_buckets = nb;
    return true;
}

/* Replicas of a stage run the same steps on the same values, only with
 * other peers, so their memory plans are the same: planned once for
 * replica 0 and shared (thousands of replicas in `cleave plan` on a large
 * cluster).  test_pipeline_plan checks that planning each gives the same. */
static void share_memplan(const RankPlan *first, RankPlan *rp) {
    rp->inst = first->inst;
    rp->offset = first->offset;
    rp->init_bytes = first->init_bytes;
    rp->arena_bytes = first->arena_bytes;
    rp->transient_naive = first->transient_naive;
    rp->inplace = first->inplace;
    rp->peak_act_bytes = first->peak_act_bytes;
    rp->peak_act_step = first->peak_act_step;
    rp->send_pinned_bytes = first->send_pinned_bytes;
    for (int b = 0; b < rp->n_buckets && b < first->n_buckets; b++) {
        rp->buckets[b].offset = first->buckets[b].offset;
        rp->buckets[b].bytes = first->buckets[b].bytes;
    }
}

static PlanStep *to_arena(Ctx *c, Seq *q) {
    PlanStep *a = ARENA_ARRAY(&c->g->arena, PlanStep, q->n ? q->n : 1);
    if (a && q->n) memcpy(a, q->s, sizeof *a * (size_t)q->n);
    return a;
}

static bool build_ranks(Ctx *c) {
    Graph *g = c->g;
    Plan *p = c->p;
    int P = c->P, M = c->M, nv = g->n_values;
    SchedUnit *units = malloc(sizeof *units * (size_t)(2 * M));
    c->bucket_of = malloc(sizeof *c->bucket_of * (size_t)(nv + 1));
    c->bucket_left = malloc(sizeof *c->bucket_left * (size_t)(nv + 1));
    unsigned char *got = malloc((size_t)nv * (size_t)M + 1);
    unsigned char *avail = malloc((size_t)nv * (size_t)(M + 1) + 1), *waited = malloc((size_t)nv + 1);
    Seq train = {0}, eval = {0};
    bool ok = units && got && avail && waited && c->bucket_of && c->bucket_left;
    if (!ok) nomem(c);
    for (int r = 0; r < c->D && ok; r++)
        for (int s = 0; s < P && ok; s++) {
            RankPlan *rp = &p->ranks[rank_of(c, r, s)];
            if (P == 1 && r > 0) {
                /* Without stages, replicas have no peers but their group:
                 * the same steps and memory (thousands of dp ranks) */
                *rp = p->ranks[0];
                rp->rank = rank_of(c, r, s);
                rp->replica = r;
                continue;
            }
            rp->rank = rank_of(c, r, s);
            rp->stage = s;
            rp->replica = r;
            int n_units = schedule_units(c->sched, P, s, M, units);
            if (!schedule_check(c->sched, P, s, M, units, n_units, &rp->max_inflight, c->d)) {
                ok = false;
                break;
            }
            train.n = eval.n = 0;
            if (c->D > 1 && !make_buckets(c, rp, s)) {
                ok = false;
                break;
            }
            memset(got, 0, (size_t)nv * (size_t)M);
            for (int u = 0; u < n_units; u++)
                emit_nodes(c, &train, units[u].backward ? &c->bwd[s] : &c->fwd[s], r, s, units[u].micro, true, got);
            emit_flush(c, &train, rp, r, s, waited);
            memset(got, 0, (size_t)nv * (size_t)M);
            for (int m = 0; m < M; m++) emit_nodes(c, &eval, &c->fwd[s], r, s, m, false, got);
            if (!insert_send_waits(c, &train, true) || !insert_send_waits(c, &eval, false)) {
                ok = false;
                break;
            }
            if (train.failed || eval.failed) {
                ok = nomem(c);
                break;
            }
            rp->train = to_arena(c, &train);
            rp->eval = to_arena(c, &eval);
            rp->n_train = train.n;
            rp->n_eval = eval.n;
            rp->holds = ARENA_ARRAY(&g->arena, unsigned char, nv ? nv : 1);
            if (!rp->train || !rp->eval || !rp->holds) {
                ok = nomem(c);
                break;
            }
            memset(rp->holds, 0, (size_t)nv);
            ok = check_dataflow(c, rp, rp->train, rp->n_train, rp->holds, avail, "train") &&
                 check_dataflow(c, rp, rp->eval, rp->n_eval, rp->holds, avail, "eval");
            /* A lone stage holds the whole model, read or not: --save
             * writes every initializer back from its buffer. */
            for (int v = 0; P == 1 && v < nv; v++)
                if (g->values[v]->kind == VAL_INPUT || g->values[v]->kind == VAL_INITIALIZER ||
                    g->values[v]->kind == VAL_STATE)
                    rp->holds[v] |= HOLD_PERSISTENT;
            rp->n_held = 0;
            for (int v = 0; v < nv; v++) rp->n_held += rp->holds[v] != 0;
            if (ok && r > 0) share_memplan(&p->ranks[rank_of(c, 0, s)], rp);
            else ok = ok && pipeline_memplan(p, rp, c->d);
        }
    free(units);
    free(got);
    free(avail);
    free(waited);
    free(c->bucket_of);
    free(c->bucket_left);
    c->bucket_of = c->bucket_left = NULL;
    free(train.s);
    free(eval.s);
    return ok;
}

static bool fill_plan(Ctx *c, const StageSplit *sp, int64_t batch) {
    Graph *g = c->g;
    Plan *p = c->p;
    int P = c->P, n_ranks = c->D * P;
    p->g = g;
    p->t = c->t;
    p->strategy = c->D > 1 ? STRATEGY_HYBRID : c->sched == SCHED_LAYER ? STRATEGY_LAYER : STRATEGY_PIPELINE;
    p->batch = batch;
    p->local_batch = batch / c->D;
    p->micro_batch = batch / ((int64_t)c->D * c->M);
    p->n_ranks = n_ranks;
    p->replicas = c->D;
    p->n_stages = P;
    p->microbatches = c->M;
    p->schedule = schedule_name(c->sched);
    p->n_fwd = sp->n_fwd;
    p->fwd_order = sp->order;
    p->stage_begin = sp->begin;
    p->stage_flops = sp->flops;
    p->node_stage = c->stage;
    p->n_xfers = c->n_xf;
    p->xfers = ARENA_ARRAY(&g->arena, PlanXfer, c->n_xf ? c->n_xf : 1);
    /* the replicas of each stage; then, for sums over the stages, the
     * stages of each replica */
    p->n_groups = P + (P > 1 && c->n_summed ? c->D : 0);
    p->groups = ARENA_ARRAY(&g->arena, PlanGroup, p->n_groups);
    p->ranks = ARENA_ARRAY(&g->arena, RankPlan, n_ranks);
    p->tag_bound = c->n_channels * (c->M + 1);
    if (!p->xfers || !p->groups || !p->ranks) return nomem(c);
    if (c->n_xf) memcpy(p->xfers, c->xf, sizeof *p->xfers * (size_t)c->n_xf);
    for (int s = 0; s < P; s++) {
        p->groups[s].n = c->D;
        p->groups[s].ranks = ARENA_ARRAY(&g->arena, int, c->D);
        if (!p->groups[s].ranks) return nomem(c);
        for (int r = 0; r < c->D; r++) p->groups[s].ranks[r] = rank_of(c, r, s);
    }
    for (int k = P; k < p->n_groups; k++) {
        p->groups[k].n = P;
        p->groups[k].ranks = ARENA_ARRAY(&g->arena, int, P);
        if (!p->groups[k].ranks) return nomem(c);
        for (int s = 0; s < P; s++) p->groups[k].ranks[s] = rank_of(c, k - P, s);
    }
    return true;
}

bool plan_hybrid(Graph *g, const TrainGraph *t, int64_t batch, int dp, int n_stages, int microbatches,
                 const char *schedule, const char *const *cuts, int n_cuts, double bucket_mb, Plan *p, Diag *d) {
    return plan_hybrid_weighted(g, t, batch, dp, n_stages, microbatches, schedule, cuts, n_cuts, bucket_mb, NULL,
                                PLACE_BY_REPLICA, p, d);
}

bool plan_hybrid_weighted(Graph *g, const TrainGraph *t, int64_t batch, int dp, int n_stages, int microbatches,
                          const char *schedule, const char *const *cuts, int n_cuts, double bucket_mb,
                          const StageWeight *weight, Placement placement, Plan *p, Diag *d) {
    memset(p, 0, sizeof *p);
    p->placement = placement;
    SchedKind sched;
    if (!schedule_parse(schedule, &sched, d)) return false;
    if (n_stages < 1) return diag_error(d, DIAG_USAGE, "a pipeline needs at least one stage, not %d", n_stages);
    if (microbatches < 1) return diag_error(d, DIAG_USAGE, "--microbatches must be at least 1, not %d", microbatches);
    if (dp < 1) return diag_error(d, DIAG_USAGE, "--dp must be at least 1, not %d", dp);
    if (sched == SCHED_LAYER && microbatches != 1) /* the flags' checks (compile_options.c) rule it out */
        return diag_error(d, DIAG_INTERNAL, "schedule layer planned with %d micro-batches", microbatches);
    if ((int64_t)dp * n_stages > (1 << 20))
        return diag_error(d, DIAG_LIMIT, "%d x %d ranks is too many", dp, n_stages);
    if (batch < 0 || (batch > 0 && batch % ((int64_t)dp * microbatches)))
        return diag_error(d, DIAG_USAGE, "--batch %lld does not divide into %d replica%s x %d micro-batch%s",
                          (long long)batch, dp, dp == 1 ? "" : "s", microbatches, microbatches == 1 ? "" : "es");
    StageSplit sp;
    if (!stages_split_weighted(g, n_stages, cuts, n_cuts, weight, &sp, d)) return false;
    Ctx c = {g, t, p, d, n_stages, microbatches, dp, sched};
    c.bucket_bytes = (int64_t)(bucket_mb * 1048576.0);
    p->bucket_mb = bucket_mb;
    int nn = g->n_nodes, nv = g->n_values;
    c.stage = ARENA_ARRAY(&g->arena, int, nn ? nn : 1);
    c.fwd = calloc((size_t)n_stages, sizeof *c.fwd);
    c.bwd = calloc((size_t)n_stages, sizeof *c.bwd);
    c.sum = calloc((size_t)n_stages, sizeof *c.sum);
    c.opt = calloc((size_t)n_stages, sizeof *c.opt);
    c.norm = calloc((size_t)n_stages, sizeof *c.norm);
    c.everywhere = calloc((size_t)nn + 1, 1);
    c.reads = calloc((size_t)nv * (size_t)n_stages + 1, 1);
    c.grad = calloc((size_t)nv + 1, 1);
    c.acc = calloc((size_t)nv + 1, 1);
    c.deferred = calloc((size_t)nn + 1, 1);
    c.xfer_head = malloc(sizeof *c.xfer_head * (size_t)(nv + 1));
    bool ok = c.stage && c.fwd && c.bwd && c.sum && c.opt && c.norm && c.everywhere && c.reads && c.grad && c.acc &&
              c.deferred && c.xfer_head;
    if (!ok) nomem(&c);
    if (ok) {
        for (int v = 0; v < nv; v++) c.xfer_head[v] = -1;
        ok = analyse(&c, &sp) && fill_plan(&c, &sp, batch) && build_ranks(&c);
    }
    if (ok && g->arena.failed) ok = nomem(&c);
    for (int s = 0; s < n_stages && c.fwd && c.bwd && c.sum && c.opt && c.norm; s++) {
        free(c.fwd[s].a);
        free(c.bwd[s].a);
        free(c.sum[s].a);
        free(c.opt[s].a);
        free(c.norm[s].a);
    }
    free(c.fwd);
    free(c.bwd);
    free(c.sum);
    free(c.opt);
    free(c.norm);
    free(c.everywhere);
    free(c.summed);
    free(c.reads);
    free(c.grad);
    free(c.acc);
    free(c.deferred);
    free(c.xfer_head);
    free(c.xfer_next);
    free(c.xf);
    return ok && comm_check_plan(p, d);
}

bool plan_pipeline(Graph *g, const TrainGraph *t, int64_t batch, int n_stages, int microbatches,
                   const char *schedule, const char *const *cuts, int n_cuts, Plan *p, Diag *d) {
    return plan_hybrid(g, t, batch, 1, n_stages, microbatches, schedule, cuts, n_cuts, 25, p, d);
}

int64_t plan_init_offset(const Plan *p, int program) {
    int64_t off = 0;
    for (int s = 0; s < program; s++) off += (plan_stage_rank(p, s)->init_bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    return off;
}
