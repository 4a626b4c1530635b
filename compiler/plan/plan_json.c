/* plan_json.c - the JSON form of a plan (docs/plan.md,
 * schemas/plan.schema.json): the one writer for every plan.
 *
 * Every plan has the same shape, D replicas x P stages x M micro-batches,
 * so every plan is written with the same fields: a single-process plan
 * says 1 replica, 1 stage and 1 micro-batch. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "pipeline.h"

static const char *phase_name(NodePhase p) {
    static const char *names[] = {"forward", "loss", "backward", "optimizer"};
    return names[p];
}

static const char *dir_name(XferDir d) {
    return d == XFER_ACTIVATION ? "activation" : d == XFER_GRADIENT ? "gradient" : "gradient_sum";
}

static const char *value_name(const Value *v) { return v ? v->name : ""; }

static json_t *names_json(Value *const *vals, int n) {
    json_t *a = json_array();
    for (int k = 0; k < n; k++) json_array_append_new(a, vals[k] ? json_string(vals[k]->name) : json_null());
    return a;
}

static json_t *step_json(const Plan *p, const PlanStep *s) {
    switch (s->kind) {
    case STEP_COMPUTE: {
        const Node *n = s->node;
        return json_pack("{s:s, s:s, s:s, s:s, s:i, s:o, s:o}", "kind", "compute", "node", n->name, "op", n->op_type,
                         "phase", phase_name(n->phase), "micro", s->micro, "inputs", names_json(n->in, n->n_in),
                         "outputs", names_json(n->out, n->n_out));
    }
    case STEP_SEND:
    case STEP_RECV: {
        const char *dir = s->xfer >= 0 && s->xfer < p->n_xfers ? dir_name(p->xfers[s->xfer].dir) : "";
        return json_pack("{s:s, s:s, s:i, s:i, s:I, s:i, s:s}", "kind", s->kind == STEP_SEND ? "send" : "recv", "value",
                         value_name(s->value), "peer", s->peer, "tag", s->tag, "bytes", (json_int_t)s->bytes, "micro",
                         s->micro, "direction", dir);
    }
    case STEP_ACCUMULATE:
        return json_pack("{s:s, s:s, s:i}", "kind", "accumulate", "value", value_name(s->value), "micro", s->micro);
    case STEP_ALLREDUCE:
        return json_pack("{s:s, s:s, s:i, s:I}", "kind", "allreduce", "value", value_name(s->value), "group",
                         s->group, "bytes", (json_int_t)s->bytes);
    case STEP_SEND_WAIT:
        return json_pack("{s:s, s:s, s:i, s:i, s:i}", "kind", "send_wait", "value", value_name(s->value), "peer",
                         s->peer, "tag", s->tag, "micro", s->micro);
    case STEP_ALLREDUCE_START:
    case STEP_ALLREDUCE_WAIT:
        return json_pack("{s:s, s:i, s:i, s:i}", "kind",
                         s->kind == STEP_ALLREDUCE_START ? "allreduce_start" : "allreduce_wait", "bucket", s->bucket,
                         "group", s->group, "micro", s->micro);
    }
    return json_pack("{s:s}", "kind", "unknown");
}

static json_t *steps_json(const Plan *p, const PlanStep *seq, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, step_json(p, &seq[i]));
    return a;
}

static json_t *holds_json(const Graph *g, const RankPlan *rp) {
    json_t *held = json_array();
    static const struct {
        unsigned char flag;
        const char *name;
    } how_names[] = {{HOLD_PERSISTENT, "persistent"}, {HOLD_COMPUTED, "computed"}, {HOLD_RECEIVED, "received"},
                     {HOLD_ACCUM, "accumulated"}};
    for (int v = 0; rp->holds && v < g->n_values; v++) {
        if (!rp->holds[v]) continue;
        json_t *how = json_array();
        for (size_t k = 0; k < sizeof how_names / sizeof how_names[0]; k++)
            if (rp->holds[v] & how_names[k].flag) json_array_append_new(how, json_string(how_names[k].name));
        json_array_append_new(held, json_pack("{s:s, s:I, s:o}", "name", g->values[v]->name, "bytes",
                                              (json_int_t)plan_value_bytes(g->values[v]), "how", how));
    }
    return held;
}

static json_t *buckets_json(const RankPlan *rp) {
    json_t *buckets = json_array();
    for (int b = 0; b < rp->n_buckets; b++)
        json_array_append_new(buckets, json_pack("{s:I, s:I, s:o}", "offset", (json_int_t)rp->buckets[b].offset,
                                                 "bytes", (json_int_t)rp->buckets[b].bytes, "gradients",
                                                 names_json(rp->buckets[b].grads, rp->buckets[b].n)));
    return buckets;
}

static json_t *shape_json(const Value *v) {
    json_t *a = json_array();
    for (int j = 0; j < v->rank; j++) json_array_append_new(a, json_integer(v->dims[j].k));
    return a;
}

/* One buffer per instance: what the value is, its micro-batch (-1: once
 * per step) and where it lies. */
static json_t *buffers_json(const Plan *p, const RankPlan *rp) {
    static const char *kinds[] = {"intermediate", "input", "initializer", "constant", "state"};
    const Graph *g = p->g;
    int S = p->microbatches + 1;
    json_t *bufs = json_array();
    for (int v = 0; rp->inst && v < g->n_values; v++)
        for (int k = 0; k < S; k++) {
            int64_t off = rp->inst[(size_t)v * (size_t)S + (size_t)k];
            if (off < 0) continue;
            const Value *x = g->values[v];
            json_array_append_new(bufs, json_pack("{s:s, s:s, s:s, s:o, s:i, s:I, s:I}", "name", x->name, "kind",
                                                  kinds[x->kind], "dtype", dtype_name(x->dtype), "shape",
                                                  shape_json(x), "micro", k - 1, "offset", (json_int_t)off, "bytes",
                                                  (json_int_t)plan_value_bytes(x)));
        }
    return bufs;
}

static json_t *rank_json(const Plan *p, const RankPlan *rp) {
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:I, s:o, s:o}", "rank", rp->rank, "stage", rp->stage, "replica",
                          rp->replica, "max_inflight", rp->max_inflight, "eval_steps", (json_int_t)rp->n_eval, "steps",
                          steps_json(p, rp->train, rp->n_train), "eval", steps_json(p, rp->eval, rp->n_eval));
    json_object_set_new(o, "holds", holds_json(p->g, rp));
    json_object_set_new(o, "buckets", buckets_json(rp));
    json_object_set_new(o, "arena_bytes", json_integer(rp->arena_bytes));
    json_object_set_new(o, "persistent_bytes", json_integer(rp->init_bytes));
    json_object_set_new(o, "transient_bytes_without_reuse", json_integer(rp->transient_naive));
    json_object_set_new(o, "peak_activation_bytes", json_integer(rp->peak_act_bytes));
    json_object_set_new(o, "peak_activation_step", json_integer(rp->peak_act_step));
    json_object_set_new(o, "send_pinned_bytes", json_integer(rp->send_pinned_bytes));
    json_object_set_new(o, "buffers", buffers_json(p, rp));
    return o;
}

static json_t *stage_table_json(const Plan *p) {
    json_t *stages = json_array();
    for (int s = 0; s < p->n_stages; s++) {
        int b = p->stage_begin[s], e = p->stage_begin[s + 1];
        json_array_append_new(stages, json_pack("{s:i, s:s, s:s, s:i, s:f}", "stage", s, "first_node",
                                                e > b ? p->fwd_order[b]->name : "", "last_node",
                                                e > b ? p->fwd_order[e - 1]->name : "", "forward_nodes", e - b,
                                                "flops", p->stage_flops[s]));
    }
    return stages;
}

static json_t *transfers_json(const Plan *p) {
    json_t *xfers = json_array();
    for (int x = 0; x < p->n_xfers; x++) {
        const PlanXfer *t = &p->xfers[x];
        json_array_append_new(xfers, json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:b}", "value", t->value->name,
                                               "direction", dir_name(t->dir), "from_stage", t->src_stage, "to_stage",
                                               t->dst_stage, "channel", t->channel, "bytes",
                                               (json_int_t)plan_value_bytes(t->value), "eval", t->eval));
    }
    return xfers;
}

static json_t *groups_json(const Plan *p) {
    json_t *groups = json_array();
    for (int k = 0; k < p->n_groups; k++) {
        json_t *m = json_array();
        for (int i = 0; i < p->groups[k].n; i++) json_array_append_new(m, json_integer(p->groups[k].ranks[i]));
        json_array_append_new(groups, m);
    }
    return groups;
}

/* A float option as the decimal the user wrote (0.01, not 0.00999999977). */
static double f2d(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return strtod(b, NULL);
}

static json_t *options_json(const TrainOptions *o) {
    json_t *opt = json_pack("{s:s, s:f, s:f, s:f, s:b, s:f, s:f, s:f}", "name", optimizer_name(o->optimizer), "lr",
                            f2d(o->lr), "momentum", f2d(o->momentum), "weight_decay", f2d(o->weight_decay),
                            "nesterov", o->nesterov, "beta1", f2d(o->beta1), "beta2", f2d(o->beta2), "eps",
                            f2d(o->eps));
    if (!opt) return NULL;
    json_t *spared = json_array();
    for (int i = 0; i < o->n_no_decay; i++) json_array_append_new(spared, json_string(o->no_decay[i]));
    json_object_set_new(opt, "no_decay", spared);
    json_object_set_new(opt, "clip_grad_norm", json_real(f2d(o->clip_grad_norm)));
    json_object_set_new(opt, "lr_schedule", o->lr_schedule_set ? json_string(lr_schedule_name(o->lr_schedule))
                                                               : json_null());
    json_object_set_new(opt, "warmup_steps", json_integer(o->warmup_steps));
    return opt;
}

/* What the batch statistics of BatchNormalization's training form cover
 * under this plan (docs/pipeline.md, "Batch normalisation"); null
 * without such layers. */
static json_t *batch_norm_json(const Plan *p, bool bn_local) {
    int n = p->t ? p->t->n_batch_stats : 0;
    if (n == 0) return json_null();
    bool global = p->replicas > 1 && !bn_local;
    const char *over = global ? "global batch" : p->replicas > 1 ? "replica" : "batch";
    return json_pack("{s:i, s:s, s:b}", "layers", n, "statistics", over, "allreduced", global);
}

/* The plan's JSON without its rank_plans. */
static json_t *plan_head_json(const Plan *p, const TrainOptions *o) {
    const Graph *g = p->g;
    json_t *root = json_pack("{s:s, s:i, s:s, s:s, s:I, s:I, s:i, s:i}", "format", "cleave-plan", "version", 1, "model",
                             g->path ? g->path : "", "strategy", strategy_name(p->strategy), "batch",
                             (json_int_t)p->batch, "local_batch", (json_int_t)p->local_batch, "ranks", p->n_ranks,
                             "replicas", p->replicas);
    if (!root) return NULL;
    json_object_set_new(root, "bucket_mb", json_real(p->bucket_mb));
    json_object_set_new(root, "allreduce", json_string(p->allreduce_node > 0 ? "hierarchical" : "flat"));
    if (p->allreduce_node > 0) json_object_set_new(root, "allreduce_ranks_per_node", json_integer(p->allreduce_node));
    bool bn_local = o && o->bn_local;
    json_object_set_new(root, "bn_stats", json_string(bn_local ? "local" : "global"));
    json_object_set_new(root, "batch_norm", batch_norm_json(p, bn_local));
    json_object_set_new(root, "stages", json_integer(p->n_stages));
    json_object_set_new(root, "microbatches", json_integer(p->microbatches));
    json_object_set_new(root, "micro_batch", json_integer(p->micro_batch));
    json_object_set_new(root, "schedule", json_string(p->schedule ? p->schedule : ""));
    json_object_set_new(root, "placement", json_string(plan_placement_name(p->placement)));
    json_object_set_new(root, "tag_bound", json_integer(p->tag_bound));
    json_object_set_new(root, "stage_table", stage_table_json(p));
    json_object_set_new(root, "transfers", transfers_json(p));
    json_object_set_new(root, "groups", groups_json(p));
    if (o) {
        json_object_set_new(root, "optimizer", options_json(o));
        json_object_set_new(root, "loss", json_string(loss_kind_name(o->loss)));
        if (o->loss == LOSS_CE) json_object_set_new(root, "ignore_index", json_integer(o->ignore_index));
        json_object_set_new(root, "accumulate", json_integer(o->accumulate > 1 ? o->accumulate : 1));
    }
    json_object_set_new(root, "threads", json_integer(p->threads > 1 ? p->threads : 1));
    return root;
}

json_t *plan_json(const Plan *p, const TrainOptions *o) {
    json_t *root = plan_head_json(p, o);
    if (!root) return NULL;
    json_t *ranks = json_array();
    for (int r = 0; r < p->n_ranks; r++) json_array_append_new(ranks, rank_json(p, &p->ranks[r]));
    json_object_set_new(root, "rank_plans", ranks);
    return root;
}

char *plan_to_json(const Plan *p, const TrainOptions *o) {
    json_t *root = plan_json(p, o);
    char *s = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return s;
}

static int fnv_bytes(const char *buf, size_t len, void *data) {
    uint64_t *h = data;
    for (size_t i = 0; i < len; i++) *h = (*h ^ (unsigned char)buf[i]) * 1099511628211ull;
    return 0;
}

/* One rank's JSON at a time: a plan of a million data-parallel ranks
 * would need its whole text (160 KB a rank for a small MLP) at once. */
bool plan_hash(const Plan *p, const TrainOptions *o, uint64_t *hash) {
    uint64_t h = 1469598103934665603ull;
    json_t *head = plan_head_json(p, o);
    bool ok = head && json_dump_callback(head, fnv_bytes, &h, JSON_COMPACT | JSON_PRESERVE_ORDER) == 0;
    json_decref(head);
    for (int r = 0; ok && r < p->n_ranks; r++) {
        json_t *one = rank_json(p, &p->ranks[r]);
        ok = one && json_dump_callback(one, fnv_bytes, &h, JSON_COMPACT | JSON_PRESERVE_ORDER) == 0;
        json_decref(one);
    }
    *hash = h;
    return ok;
}
