/* plan.c - the single-rank plan, and the plan's JSON form. */
#include "plan.h"
#include "pipeline.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool memplan_assign(Graph *g, RankPlan *r, Value *const *keep, int n_keep, Diag *d);

/* Phases are causal (forward, loss, backward, optimizer), so ordering by
 * phase and then topologically is a valid schedule; it also keeps every
 * optimizer update, which writes its parameter in place, after the last
 * reader of that parameter. */
static bool order_steps(Graph *g, RankPlan *r, Diag *d) {
    int count;
    Node **topo = ir_topo_order(g, &count, d);
    if (!topo) return false;
    r->train = ARENA_ARRAY(&g->arena, PlanStep, count ? count : 1);
    r->eval = ARENA_ARRAY(&g->arena, PlanStep, count ? count : 1);
    if (!r->train || !r->eval) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (int phase = PHASE_FORWARD; phase <= PHASE_OPTIMIZER; phase++)
        for (int i = 0; i < count; i++) {
            Node *n = topo[i];
            if ((int)n->phase != phase) continue;
            r->train[r->n_train++] = (PlanStep){STEP_COMPUTE, n};
            if (phase <= PHASE_LOSS) r->eval[r->n_eval++] = (PlanStep){STEP_COMPUTE, n};
        }
    return true;
}

bool plan_single(Graph *g, const TrainGraph *t, int64_t batch, Plan *p, Diag *d) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->t = t;
    p->strategy = "single";
    p->batch = p->local_batch = batch;
    p->n_ranks = p->replicas = 1;
    p->ranks = ARENA_ARRAY(&g->arena, RankPlan, 1);
    if (!p->ranks) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    Value *keep[2] = {t->loss, t->output};
    return order_steps(g, &p->ranks[0], d) && memplan_assign(g, &p->ranks[0], keep, 2, d);
}

bool plan_forward(Graph *g, Plan *p, Diag *d) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->strategy = "forward";
    p->n_ranks = p->replicas = 1;
    p->ranks = ARENA_ARRAY(&g->arena, RankPlan, 1);
    if (!p->ranks) return diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    return order_steps(g, &p->ranks[0], d) && memplan_assign(g, &p->ranks[0], NULL, 0, d);
}

static json_t *shape_of(const Value *v) {
    json_t *a = json_array();
    for (int j = 0; j < v->rank; j++) json_array_append_new(a, json_integer(v->dims[j].k));
    return a;
}

/* A float option as the decimal the user wrote (0.01, not 0.00999999977). */
static double f2d(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return strtod(b, NULL);
}

static const char *phase_name(NodePhase p) {
    static const char *names[] = {"forward", "loss", "backward", "optimizer"};
    return names[p];
}

json_t *plan_buckets_json(const RankPlan *rp) {
    json_t *buckets = json_array();
    for (int b = 0; b < rp->n_buckets; b++) {
        json_t *names = json_array();
        for (int k = 0; k < rp->buckets[b].n; k++)
            json_array_append_new(names, json_string(rp->buckets[b].grads[k]->name));
        json_array_append_new(buckets, json_pack("{s:I, s:I, s:o}", "offset", (json_int_t)rp->buckets[b].offset,
                                                 "bytes", (json_int_t)rp->buckets[b].bytes, "gradients", names));
    }
    return buckets;
}

static json_t *options_json(const TrainOptions *o) {
    static const char *opt_names[] = {"sgd", "momentum", "adam"};
    return json_pack("{s:s, s:f, s:f, s:f, s:b, s:f, s:f, s:f}", "name", opt_names[o->optimizer], "lr", f2d(o->lr),
                     "momentum", f2d(o->momentum), "weight_decay", f2d(o->weight_decay), "nesterov", o->nesterov,
                     "beta1", f2d(o->beta1), "beta2", f2d(o->beta2), "eps", f2d(o->eps));
}

/* Staged plans: pipeline_plan_to_json's text plus the training options. */
static char *staged_to_json(const Plan *p, const TrainOptions *o) {
    char *text = pipeline_plan_to_json(p);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!root) return NULL;
    json_object_set_new(root, "optimizer", options_json(o));
    json_object_set_new(root, "loss", json_string(loss_kind_name(o->loss)));
    json_object_set_new(root, "threads", json_integer(p->threads > 1 ? p->threads : 1));
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}

char *plan_to_json(const Plan *p, const TrainOptions *o) {
    if (p->n_stages) return staged_to_json(p, o);
    const Graph *g = p->g;
    json_t *ranks = json_array();
    for (int r = 0; r < p->n_ranks; r++) {
        const RankPlan *rp = &p->ranks[r];
        json_t *steps = json_array(), *buffers = json_array();
        for (int s = 0; s < rp->n_train; s++) {
            if (rp->train[s].kind != STEP_COMPUTE) {
                json_array_append_new(steps, json_pack("{s:s, s:i}", "kind",
                                                       rp->train[s].kind == STEP_ALLREDUCE_START ? "allreduce_start"
                                                                                                 : "allreduce_wait",
                                                       "bucket", rp->train[s].bucket));
                continue;
            }
            const Node *n = rp->train[s].node;
            json_t *ins = json_array(), *outs = json_array();
            for (int k = 0; k < n->n_in; k++) json_array_append_new(ins, n->in[k] ? json_string(n->in[k]->name) : json_null());
            for (int k = 0; k < n->n_out; k++) json_array_append_new(outs, n->out[k] ? json_string(n->out[k]->name) : json_null());
            json_array_append_new(steps, json_pack("{s:s, s:s, s:s, s:s, s:o, s:o}", "kind", "compute", "node", n->name,
                                                   "op", n->op_type, "phase", phase_name(n->phase), "inputs", ins,
                                                   "outputs", outs));
        }
        for (int i = 0; i < g->n_values; i++) {
            const Value *v = g->values[i];
            if (rp->offset[i] < 0) continue;
            static const char *kinds[] = {"intermediate", "input", "initializer", "constant", "state"};
            json_array_append_new(buffers, json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "name", v->name, "kind",
                                                     kinds[v->kind], "dtype", dtype_name(v->dtype), "shape",
                                                     shape_of(v), "offset", (json_int_t)rp->offset[i], "bytes",
                                                     (json_int_t)plan_value_bytes(v)));
        }
        json_t *buckets = plan_buckets_json(rp);
        json_array_append_new(ranks, json_pack("{s:i, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "rank", rp->rank, "eval_steps",
                                               (json_int_t)rp->n_eval, "arena_bytes", (json_int_t)rp->arena_bytes,
                                               "persistent_bytes", (json_int_t)rp->init_bytes,
                                               "transient_bytes_without_reuse", (json_int_t)rp->transient_naive,
                                               "steps", steps, "buffers", buffers, "buckets", buckets));
    }
    json_t *opt = options_json(o);
    json_t *root = json_pack("{s:s, s:i, s:s, s:I, s:I, s:i, s:i, s:s, s:f, s:o, s:o}", "format", "cleave-plan",
                             "version", 1, "model", g->path, "batch", (json_int_t)p->batch, "local_batch",
                             (json_int_t)p->local_batch, "ranks", p->n_ranks, "replicas", p->replicas, "strategy",
                             p->strategy, "bucket_mb", p->bucket_mb, "optimizer", opt, "rank_plans", ranks);
    json_object_set_new(root, "loss", json_string(loss_kind_name(o->loss)));
    json_object_set_new(root, "threads", json_integer(p->threads > 1 ? p->threads : 1));
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}
