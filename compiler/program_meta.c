/* program_meta.c - the program description embedded for the runtime
 * (runtime/rt_abi.h documents every field; edits go together).
 *
 * Every plan is D replicas x P stages x M micro-batches, with one program
 * per stage (the replicas of a stage run the same code at the same
 * offsets): a single program is 1 x 1 x 1, a data-parallel one D x 1 x 1.
 * The description holds what every rank shares at the top level and, in
 * "programs", what each stage's arena holds. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "plan/pipeline.h"

/* rt_abi.h's CLEAVE_ABI_VERSION: a runtime reads only its own version. */
enum { META_ABI = 2 };

static json_t *shape_json(const Value *v, int64_t rows) {
    json_t *shape = json_array();
    for (int j = 0; j < v->rank; j++)
        json_array_append_new(shape, json_integer(j == 0 && rows > 0 ? rows : v->dims[j].k));
    return shape;
}

static const char *dtype_json(const Value *v) { return dtype_is_float(v->dtype) ? "float32" : "int64"; }

static bool plan_hash_text(const Plan *p, const CompileOptions *o, char hash[32]) {
    uint64_t h;
    if (!plan_hash(p, &o->train, &h)) return false;
    snprintf(hash, 32, "%016llx", (unsigned long long)h);
    return true;
}

/* The optimizer and its hyper-parameters: a checkpoint records them, and
 * resuming under other ones is refused. */
static json_t *optimizer_json(const CompileOptions *o) {
    const TrainOptions *t = &o->train;
    json_t *opt = json_pack("{s:s, s:f, s:f}", "name", optimizer_name(t->optimizer), "weight_decay",
                            (double)t->weight_decay, "clip_grad_norm", (double)t->clip_grad_norm);
    if (!opt) return NULL;
    if (t->optimizer == OPT_MOMENTUM) {
        json_object_set_new(opt, "momentum", json_real(t->momentum));
        json_object_set_new(opt, "nesterov", json_boolean(t->nesterov));
    } else if (t->optimizer == OPT_ADAM || t->optimizer == OPT_ADAMW) {
        json_object_set_new(opt, "beta1", json_real(t->beta1));
        json_object_set_new(opt, "beta2", json_real(t->beta2));
        json_object_set_new(opt, "eps", json_real(t->eps));
    }
    return opt;
}

/* The learning rate compiled in, and the schedule when one was given. */
static json_t *lr_json(const TrainOptions *t) {
    json_t *lr = json_pack("{s:f}", "value", (double)t->lr);
    if (lr && t->lr_schedule_set) {
        json_object_set_new(lr, "schedule", json_string(lr_schedule_name(t->lr_schedule)));
        json_object_set_new(lr, "warmup_steps", json_integer(t->warmup_steps));
    }
    return lr;
}

/* {"offset": o} when rank rp holds v, else nothing added. */
static void set_slot(json_t *obj, const char *key, const Plan *p, const RankPlan *rp, const Value *v) {
    if (!v || !rp->holds[v->id]) return;
    json_object_set_new(obj, key, json_pack("{s:I}", "offset", (json_int_t)pipeline_buffer(p, rp, v, 0)));
}

/* What stage s's arena holds, from the plan of its replica-0 rank. */
static json_t *stage_program(const Plan *p, int s) {
    const Graph *g = p->g;
    const TrainGraph *t = p->t;
    const RankPlan *rp = plan_stage_rank(p, s);
    json_t *prog = json_pack("{s:i, s:I, s:I, s:I, s:I}", "stage", s, "arena_bytes", (json_int_t)rp->arena_bytes,
                             "init_bytes", (json_int_t)rp->init_bytes, "init_offset",
                             (json_int_t)plan_init_offset(p, s), "peak_activation_bytes",
                             (json_int_t)rp->peak_act_bytes);
    json_t *inputs = json_array(), *params = json_array();
    for (int i = 0; i < g->n_inputs; i++) {
        const Value *v = g->inputs[i];
        if (rp->holds[v->id])
            json_array_append_new(inputs, json_pack("{s:s, s:I}", "name", v->name, "offset",
                                                    (json_int_t)pipeline_buffer(p, rp, v, 0)));
    }
    for (int i = 0; i < t->n_params; i++) {
        const Value *v = t->params[i];
        if (rp->holds[v->id])
            json_array_append_new(params, json_pack("{s:s, s:I}", "name", v->name, "offset",
                                                    (json_int_t)pipeline_buffer(p, rp, v, -1)));
    }
    json_t *buckets = json_array();
    for (int b = 0; b < rp->n_buckets; b++)
        json_array_append_new(buckets, json_pack("{s:I, s:I}", "offset", (json_int_t)rp->buckets[b].offset, "count",
                                                 (json_int_t)(rp->buckets[b].bytes / 4)));
    json_t *state = json_array();
    for (int i = 0; i < t->n_state; i++) {
        const Value *v = t->state[i];
        if (rp->holds[v->id])
            json_array_append_new(state, json_pack("{s:s, s:I}", "name", v->name, "offset",
                                                   (json_int_t)pipeline_buffer(p, rp, v, -1)));
    }
    json_object_set_new(prog, "inputs", inputs);
    json_object_set_new(prog, "params", params);
    json_object_set_new(prog, "state", state);
    json_object_set_new(prog, "buckets", buckets);
    if (rp->holds[t->loss->id])
        json_object_set_new(prog, "loss", json_pack("{s:I, s:i}", "offset",
                                                    (json_int_t)pipeline_buffer(p, rp, t->loss, 0), "count",
                                                    p->microbatches));
    set_slot(prog, "output", p, rp, t->output);
    set_slot(prog, "lr", p, rp, t->lr);
    set_slot(prog, "step", p, rp, t->step);
    set_slot(prog, "seed", p, rp, t->seed);
    set_slot(prog, "label_count", p, rp, t->label_count);
    return prog;
}

/* The output has rows when its first dimension is the micro-batch: the
 * runtime then sees the M instances, back to back, as the rank's rows. */
static int64_t output_rows(const Plan *p, const Value *out) {
    return out->rank > 0 && out->dims[0].k == p->micro_batch ? p->local_batch : 0;
}

/* The first stage holding v: the one --save and checkpoints read it from. */
static int first_stage(const Plan *p, const Value *v) {
    for (int s = 0; s < p->n_stages; s++)
        if (plan_stage_rank(p, s)->holds[v->id]) return s;
    return -1;
}

char *program_meta(const Plan *p, const CompileOptions *o) {
    const Graph *g = p->g;
    const TrainGraph *t = p->t;
    json_t *inputs = json_array(), *params = json_array(), *programs = json_array();
    for (int i = 0; i < g->n_inputs; i++) {
        const Value *v = g->inputs[i];
        json_t *in = json_pack("{s:s, s:s, s:o}", "name", v->name, "dtype", dtype_json(v), "shape",
                               shape_json(v, p->local_batch));
        if (v == t->positions) json_object_set_new(in, "fill", json_string("positions"));
        json_array_append_new(inputs, in);
    }
    for (int i = 0; i < t->n_params; i++) {
        const Value *v = t->params[i];
        json_array_append_new(params, json_pack("{s:s, s:s, s:o, s:b, s:i}", "name", v->name, "dtype", "float32",
                                                "shape", shape_json(v, 0), "trainable", t->grads[i] != NULL,
                                                "stage", first_stage(p, v)));
    }
    json_t *state = json_array();
    for (int i = 0; i < t->n_state; i++) {
        const Value *v = t->state[i], *of = t->params[t->state_param[i]];
        json_array_append_new(state, json_pack("{s:s, s:s, s:s, s:s, s:o, s:i}", "name", v->name, "param", of->name,
                                               "slot", v->name + strlen(of->name) + 1, "dtype", "float32", "shape",
                                               shape_json(v, 0), "stage", first_stage(p, v)));
    }
    for (int s = 0; s < p->n_stages; s++) json_array_append_new(programs, stage_program(p, s));
    char hash[32] = "";
    bool hashed = plan_hash_text(p, o, hash);
    json_t *root = json_pack(
        "{s:i, s:s, s:i, s:i, s:s, s:I, s:I, s:i, s:i, s:i, s:I, s:s, s:i, s:o, s:o, s:{s:s, s:o}, s:o, s:s, "
        "s:o, s:o}",
        "abi", META_ABI, "plan_hash", hash, "ranks", p->n_ranks, "rank_programs", p->n_stages, "strategy",
        strategy_name(p->strategy),
        "batch", (json_int_t)p->batch, "local_batch", (json_int_t)p->local_batch, "stages", p->n_stages, "dp",
        p->replicas, "microbatches", p->microbatches, "micro_batch", (json_int_t)p->micro_batch, "schedule",
        p->schedule, "tag_bound", p->tag_bound, "lr", lr_json(&o->train), "inputs", inputs, "output",
        "name", t->output->name, "shape", shape_json(t->output, output_rows(p, t->output)), "params",
        params, "loss_kind", loss_kind_name(o->train.loss), "optimizer", optimizer_json(o), "programs", programs);
    if (root) json_object_set_new(root, "state", state);
    else json_decref(state);
    if (root) json_object_set_new(root, "placement", json_string(plan_placement_name(p->placement)));
    if (root) json_object_set_new(root, "threads", json_integer(p->threads > 1 ? p->threads : 1));
    /* the runtime sums buckets hierarchically over nodes of this many ranks */
    if (root && p->allreduce_node > 0)
        json_object_set_new(root, "allreduce_ranks_per_node", json_integer(p->allreduce_node));
    if (root && o->train.loss == LOSS_CE) json_object_set_new(root, "ignore_index", json_integer(o->train.ignore_index));
    /* replicas with batch statistics of their own keep replica 0's running
     * statistics, as DDP's broadcast_buffers does */
    if (root && p->replicas > 1 && o->train.bn_local && t->n_batch_stats > 0)
        json_object_set_new(root, "state_from_replica0", json_true());
    /* NULL, which the caller reports as out of memory, without a hash. */
    char *str = root && hashed ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return str;
}
