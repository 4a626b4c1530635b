#include "driver.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "codegen/cg.h"
#include "ops/ops.h"
#include "plan/plan.h"

bool driver_check_supported(Graph *g, Diag *d) {
    GRAPH_FOR_NODES(g, n) {
        if (n->def) continue;
        char list[2048];
        return diag_error(d, DIAG_UNSUPPORTED, "%s: node '%s': op '%s%s%s' is not supported (supported: %s)", g->path,
                          n->name, n->domain, n->domain[0] ? "." : "", n->op_type,
                          op_supported_list(list, sizeof list));
    }
    return true;
}

Graph *driver_front_end(const DriverOptions *opt, Diag *d) {
    Graph *g = onnx_load(opt->model, d);
    if (!g) return NULL;
    ShapeOptions so = {.batch = opt->batch, .fold = true};
    bool ok = ir_verify(g, d) && (!opt->require_supported || driver_check_supported(g, d)) &&
              ir_infer_shapes(g, &so, d);
    if (ok) {
        ir_prune(g);
        ok = ir_verify(g, d);
    }
    if (ok && g->arena.failed) ok = diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
    if (!ok) {
        graph_free(g);
        return NULL;
    }
    return g;
}

/* Program description embedded for the runtime (runtime/rt_abi.h). */
static char *program_meta(const Plan *p, const CompileOptions *o) {
    const Graph *g = p->g;
    const TrainGraph *t = p->t;
    const RankPlan *rp = &p->ranks[0];
    json_t *inputs = json_array(), *params = json_array();
    for (int i = 0; i < g->n_inputs; i++) {
        const Value *v = g->inputs[i];
        json_t *shape = json_array();
        for (int j = 0; j < v->rank; j++) json_array_append_new(shape, json_integer(v->dims[j].k));
        json_array_append_new(inputs, json_pack("{s:s, s:s, s:o, s:I}", "name", v->name, "dtype",
                                                dtype_is_float(v->dtype) ? "float32" : "int64", "shape", shape,
                                                "offset", (json_int_t)rp->offset[v->id]));
    }
    for (int i = 0; i < t->n_params; i++) {
        const Value *v = t->params[i];
        json_t *shape = json_array();
        for (int j = 0; j < v->rank; j++) json_array_append_new(shape, json_integer(v->dims[j].k));
        json_array_append_new(params, json_pack("{s:s, s:s, s:o, s:I, s:b}", "name", v->name, "dtype", "float32",
                                                "shape", shape, "offset", (json_int_t)rp->offset[v->id], "trainable",
                                                t->grads[i] != NULL));
    }
    json_t *oshape = json_array();
    for (int j = 0; j < t->output->rank; j++) json_array_append_new(oshape, json_integer(t->output->dims[j].k));
    static const char *opt_names[] = {"sgd", "momentum", "adam"};
    char *plan_text = plan_to_json(p, &o->train);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the plan */
    for (const char *c = plan_text; c && *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    free(plan_text);
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)h);
    json_t *buckets = json_array();
    for (int b = 0; b < rp->n_buckets; b++)
        json_array_append_new(buckets, json_pack("{s:I, s:I}", "offset", (json_int_t)rp->buckets[b].offset, "count",
                                                 (json_int_t)(rp->buckets[b].bytes / 4)));
    json_t *root = json_pack(
        "{s:i, s:s, s:i, s:i, s:I, s:I, s:I, s:{s:I}, s:{s:I, s:f}, s:{s:I}, s:o, s:{s:s, s:I, s:o}, s:o, s:s, "
        "s:{s:s}}",
        "abi", 1, "plan_hash", hash, "ranks", p->n_ranks, "rank_programs", 1, "batch", (json_int_t)o->batch, "arena_bytes",
        (json_int_t)rp->arena_bytes, "init_bytes", (json_int_t)rp->init_bytes, "loss", "offset",
        (json_int_t)rp->offset[t->loss->id], "lr", "offset", (json_int_t)rp->offset[t->lr->id], "value",
        (double)o->train.lr, "step", "offset", (json_int_t)rp->offset[t->step->id], "inputs", inputs, "output",
        "name", t->output->name, "offset", (json_int_t)rp->offset[t->output->id], "shape", oshape, "params", params,
        "loss_kind", loss_kind_name(o->train.loss), "optimizer", "name", opt_names[o->train.optimizer]);
    json_object_set_new(root, "strategy", json_string(p->strategy));
    json_object_set_new(root, "local_batch", json_integer(p->local_batch));
    json_object_set_new(root, "buckets", buckets);
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}

static bool write_text(const char *path, const char *text, Diag *d) {
    FILE *f = fopen(path, "w");
    if (!f) return diag_error(d, DIAG_IO, "%s: cannot write", path);
    bool ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? true : diag_error(d, DIAG_IO, "%s: write failed", path);
}

bool driver_compile(const CompileOptions *o, Diag *d) {
    int64_t ranks = o->ranks > 0 ? o->ranks : 1;
    bool dp = o->strategy && strcmp(o->strategy, "dp") == 0;
    if (ranks > 1 && !dp)
        return diag_error(d, DIAG_USAGE, "--ranks %lld needs --strategy dp (the other strategies are not built yet)",
                          (long long)ranks);
    if (dp && o->batch % ranks)
        return diag_error(d, DIAG_USAGE, "--batch %lld does not divide among --ranks %lld", (long long)o->batch,
                          (long long)ranks);
    /* Each data-parallel rank computes batch/ranks rows. */
    DriverOptions fo = {.model = o->model, .batch = dp ? o->batch / ranks : o->batch, .require_supported = true};
    Graph *g = driver_front_end(&fo, d);
    if (!g) return false;
    TrainGraph t;
    Plan p;
    TrainOptions to = o->train;
    to.replicas = dp ? (int)ranks : 1;
    bool ok = train_build(g, &to, &t, d) && ir_verify(g, d) &&
              (dp ? plan_dp(g, &t, o->batch, (int)ranks, o->bucket_mb, &p, d) : plan_single(g, &t, o->batch, &p, d));
    char *meta = NULL;
    if (ok && o->plan_out) {
        char *text = plan_to_json(&p, &o->train);
        ok = text ? write_text(o->plan_out, text, d) : diag_error(d, DIAG_NOMEM, "out of memory");
        free(text);
    }
    if (ok) {
        meta = program_meta(&p, o);
        ok = meta != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
    }
    if (ok && o->verbose)
        fprintf(stderr,
                "cleave: %s: %d train steps, %d eval steps; arena %lld bytes: %lld persistent, %lld transient "
                "(%lld without reuse; %d outputs computed in place)\n",
                o->model, p.ranks[0].n_train, p.ranks[0].n_eval, (long long)p.ranks[0].arena_bytes,
                (long long)p.ranks[0].init_bytes, (long long)(p.ranks[0].arena_bytes - p.ranks[0].init_bytes),
                (long long)p.ranks[0].transient_naive, p.ranks[0].inplace);
    if (ok) {
        CgOptions co = {.target_cpu = o->target_cpu, .emit = o->emit, .output = o->output, .model_path = o->model,
                        .meta_json = meta, .verbose = o->verbose};
        ok = cg_compile_plan(&p, &co, d);
    }
    if (ok)
        fprintf(stderr, "cleave: %s -> %s: %s on %d rank%s, batch %lld; arena %.1f MiB per rank\n", o->model, o->output,
                p.strategy, p.n_ranks, p.n_ranks > 1 ? "s" : "", (long long)o->batch,
                (double)p.ranks[0].arena_bytes / (1 << 20));
    free(meta);
    graph_free(g);
    return ok;
}
