/* driver.c - the pipeline (driver.h): front end, training graph, plan in
 * a layout decided before (cli/compile_options.c, search.c), codegen and
 * link, one after another.  Nothing here chooses or checks a layout. */
#include "driver.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "codegen/cg.h"
#include "ops/ops.h"
#include "cost/cluster_stages.h"
#include "plan/pipeline.h"
#include "out_file.h"
#include "plan_file.h"

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

static bool write_text(const char *flag, const char *path, const char *text, Diag *d) {
    OutFile out;
    int err = out_file_open(&out, path);
    if (err) return diag_error(d, DIAG_IO, "%s %s: cannot write: %s", flag, path, out_file_why(err));
    out_file_write(&out, text, strlen(text));
    err = out_file_finish(&out);
    return !err || diag_error(d, DIAG_IO, "%s %s: write failed: %s", flag, path, out_file_why(err));
}

static void report_plan(const Plan *p, const CompileOptions *o) {
    int64_t arena = 0;
    for (int r = 0; r < p->n_ranks; r++)
        if (p->ranks[r].arena_bytes > arena) arena = p->ranks[r].arena_bytes;
    if (o->verbose)
        for (int r = 0; r < p->n_stages; r++) {
            const RankPlan *rp = plan_stage_rank(p, r);
            fprintf(stderr,
                    "cleave: %s: program %d: %d train steps, %d eval steps; arena %lld bytes: %lld persistent, "
                    "%lld transient (%lld without reuse; %d outputs computed in place)\n",
                    o->model, r, rp->n_train, rp->n_eval, (long long)rp->arena_bytes, (long long)rp->init_bytes,
                    (long long)(rp->arena_bytes - rp->init_bytes), (long long)rp->transient_naive, rp->inplace);
        }
    char detail[128] = "";
    if (p->n_stages)
        snprintf(detail, sizeof detail, " (%d stage%s x %d replica%s, %d micro-batch%s, %s)", p->n_stages,
                 p->n_stages > 1 ? "s" : "", p->replicas, p->replicas > 1 ? "s" : "", p->microbatches,
                 p->microbatches > 1 ? "es" : "", p->schedule);
    char acc[64] = "";
    if (o->train.accumulate > 1)
        snprintf(acc, sizeof acc, " (%lld accumulated batches of %lld)", (long long)o->train.accumulate,
                 (long long)o->batch);
    char threads[48] = "";
    if (p->threads > 1) snprintf(threads, sizeof threads, " x %d threads", p->threads);
    fprintf(stderr, "cleave: %s -> %s: %s%s on %d rank%s%s, batch %lld%s; arena %.1f MiB per rank (largest)\n", o->model,
            o->output, strategy_name(p->strategy), detail, p->n_ranks, p->n_ranks > 1 ? "s" : "", threads,
            (long long)compile_step_batch(o), acc, (double)arena / (1 << 20));
}

int64_t compile_step_batch(const CompileOptions *o) { return o->batch * (o->train.accumulate > 1 ? o->train.accumulate : 1); }

/* The plan of layout l: stages cut where l says, or balanced by FLOPs or
 * (balance_time) by the predicted time of their nodes on the cluster. */
static bool plan_layout(const CompileOptions *o, const Layout *l, KernelProfile *profile, Graph *g, TrainGraph *t,
                        Plan *p, Diag *d) {
    int64_t batch = compile_step_batch(o);
    if (!strategy_staged(l->strategy) && l->microbatches > 1) {
        /* --accumulate: single and dp, one stage through its micro-batches */
        if (!plan_hybrid_weighted(g, t, batch, l->replicas, 1, l->microbatches, schedule_name(l->schedule), NULL, 0,
                                  o->bucket_mb, NULL, PLACE_BY_REPLICA, p, d))
            return false;
        p->strategy = l->strategy;
        return true;
    }
    if (l->strategy == STRATEGY_SINGLE) return plan_single(g, t, batch, p, d);
    if (l->strategy == STRATEGY_DP) return plan_dp(g, t, batch, l->replicas, o->bucket_mb, p, d);
    ClusterStages cs;
    bool timed = l->balance_time && l->n_cuts == 0;
    if (timed && !cluster_stages_open(&cs, o->cluster, profile, g, l->replicas, l->stages, l->microbatches,
                                      l->schedule, l->placement, &o->train, d))
        return false;
    bool ok = plan_hybrid_weighted(g, t, batch, l->replicas, l->stages, l->microbatches,
                                   schedule_name(l->schedule), l->cuts, l->n_cuts, o->bucket_mb,
                                   timed ? &cs.weight : NULL, l->placement, p, d);
    if (timed) cluster_stages_close(&cs);
    return ok;
}

bool driver_build_plan(const CompileOptions *o, const Layout *l, KernelProfile *profile, Graph **gp, TrainGraph *t,
                       Plan *p, Diag *d) {
    *gp = NULL;
    /* The graph is built for the rows one step of one rank computes at
     * once: a replica's share, or its share of one micro-batch; summing the
     * gradients over replicas and micro-batches, each seeded with
     * 1 / (replicas x micro-batches), gives the global batch's. */
    int64_t rows = compile_step_batch(o) / l->replicas / l->microbatches;
    DriverOptions fo = {.model = o->model, .batch = rows, .require_supported = true};
    Graph *g = driver_front_end(&fo, d);
    if (!g) return false;
    TrainOptions to = o->train;
    to.replicas = l->replicas * l->microbatches;
    to.stat_replicas = o->train.bn_local ? 1 : l->replicas;
    to.microbatches = l->microbatches;
    bool built = train_build(g, &to, t, d);
    if (built && matmul_fold_transposes(g) < 0) built = diag_error(d, DIAG_NOMEM, "out of memory");
    if (!built || !ir_verify(g, d) || !plan_layout(o, l, profile, g, t, p, d)) {
        graph_free(g);
        return false;
    }
    p->threads = o->threads > 1 ? (int)o->threads : 1;
    p->allreduce_node = p->replicas > 1 ? l->allreduce_node : 0;
    *gp = g;
    return true;
}

/* A plan file's derived fields that its decisions do not give are
 * recomputed, and the user is told which, so an edit there is not lost
 * without a word (docs/plan.md, "Editing a plan"). */
static void check_plan_file(const PlanFile *f, const json_t *derived) {
    char where[512];
    if (plan_file_compare(f, derived, where, sizeof where))
        fprintf(stderr, "cleave: note: %s: %s is not what the plan's decisions (strategy, replicas, stages, "
                "stage_table first_node, microbatches, schedule, placement, bucket_mb, batch, loss, optimizer) give; the "
                "fields derived from them are recomputed\n", f->path, where);
}

/* The plan's JSON: written to --emit-plan, and checked against --plan's file. */
static bool emit_plan(const CompileOptions *o, const Plan *p, Diag *d) {
    if (!o->plan_out && !o->plan_file) return true;
    json_t *root = plan_json(p, &o->train);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    bool ok = text != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
    if (ok && o->plan_out) ok = write_text("--emit-plan", o->plan_out, text, d);
    if (ok && o->plan_file) check_plan_file(o->plan_file, root);
    free(text);
    json_decref(root);
    return ok;
}

/* Code generation and linking, with the program description embedded. */
static bool generate(const CompileOptions *o, const Plan *p, Diag *d) {
    char *meta = program_meta(p, o);
    if (!meta) return diag_error(d, DIAG_NOMEM, "out of memory");
    CgOptions co = {.target_cpu = o->target_cpu, .emit = o->emit, .output = o->output, .model_path = o->model,
                    .meta_json = meta, .verbose = o->verbose, .no_fuse = o->no_fuse};
    bool ok = cg_compile_plan(p, &co, d);
    free(meta);
    return ok;
}

bool driver_compile(const CompileOptions *o, const Layout *l, KernelProfile *profile, Diag *d) {
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!driver_build_plan(o, l, profile, &g, &t, &p, d)) {
        if (o->plan_file) plan_file_reword(o->plan_file, d);
        return false;
    }
    bool ok = emit_plan(o, &p, d) && generate(o, &p, d);
    if (ok) report_plan(&p, o);
    graph_free(g);
    return ok;
}
