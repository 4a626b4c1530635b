#include "driver.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "codegen/cg.h"
#include "ops/ops.h"
#include "cost/profile.h"
#include "cost/simulate.h"
#include "plan/pipeline.h"
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

static bool write_text(const char *path, const char *text, Diag *d) {
    FILE *f = fopen(path, "w");
    if (!f) return diag_error(d, DIAG_IO, "%s: cannot write", path);
    bool ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok ? true : diag_error(d, DIAG_IO, "%s: write failed", path);
}

/* How the ranks split the work, from the flags. */
typedef struct Layout {
    bool dp, staged;
    int ranks, replicas, stages, microbatches;
    const char *schedule;
} Layout;

static bool is_strategy(const CompileOptions *o, const char *name) {
    return o->strategy && strcmp(o->strategy, name) == 0;
}

/* Default micro-batches for --strategy pipeline: 4 per stage (enough to
 * bring GPipe's bubble (P-1)/(M+P-1) under 20%), or the most below that
 * which divide each replica's rows. */
static int default_microbatches(int64_t rows, int stages) {
    int m = 4 * stages;
    while (m > 1 && rows % m) m--;
    return m;
}

static bool layout(const CompileOptions *o, Layout *l, Diag *d) {
    int64_t ranks = o->ranks > 0 ? o->ranks : 1;
    *l = (Layout){.ranks = (int)ranks, .replicas = 1, .stages = 1, .microbatches = 1};
    bool layer = is_strategy(o, "layer"), pipe = is_strategy(o, "pipeline"), hybrid = is_strategy(o, "hybrid");
    l->dp = is_strategy(o, "dp");
    l->staged = layer || pipe || hybrid;
    if (o->placement && !hybrid && strcmp(o->placement, "by_replica"))
        return diag_error(d, DIAG_USAGE, "--placement %s needs --strategy hybrid (with one replica or one stage the "
                          "placements are the same)", o->placement);
    if (!l->staged) {
        if (o->microbatches || o->schedule || o->n_cuts || o->dp || o->pp)
            return diag_error(d, DIAG_USAGE, "--microbatches, --schedule, --stages, --dp and --pp need --strategy "
                              "layer, pipeline or hybrid");
        if (ranks > 1 && !l->dp)
            return diag_error(d, DIAG_USAGE, "--ranks %lld needs a --strategy (dp, layer, pipeline or hybrid)",
                              (long long)ranks);
        if (l->dp && o->batch % ranks)
            return diag_error(d, DIAG_USAGE, "--batch %lld does not divide among --ranks %lld", (long long)o->batch,
                              (long long)ranks);
        if (l->dp) l->replicas = (int)ranks;
        return true;
    }
    if (hybrid) {
        if (!o->dp && !o->pp)
            return diag_error(d, DIAG_USAGE, "--strategy hybrid needs --dp D and --pp P (ranks = D x P)");
        int64_t D = o->dp, P = o->pp;
        if (!D) D = ranks % P ? 0 : ranks / P;
        if (!P) P = ranks % D ? 0 : ranks / D;
        if (!D || !P || (o->ranks > 1 && D * P != o->ranks))
            return diag_error(d, DIAG_USAGE, "--dp %lld x --pp %lld does not make --ranks %lld", (long long)o->dp,
                              (long long)o->pp, (long long)ranks);
        l->replicas = (int)D;
        l->stages = (int)P;
        l->ranks = (int)(D * P);
    } else {
        if (o->dp && o->dp != 1)
            return diag_error(d, DIAG_USAGE, "--dp needs --strategy hybrid");
        if (o->pp && o->pp != ranks)
            return diag_error(d, DIAG_USAGE, "--pp %lld differs from --ranks %lld (use --strategy hybrid to combine "
                              "them with data parallelism)", (long long)o->pp, (long long)ranks);
        l->stages = (int)ranks;
    }
    if (layer && o->microbatches > 1)
        return diag_error(d, DIAG_USAGE, "--strategy layer runs the whole batch through the stages at once; use "
                          "--strategy pipeline for %lld micro-batches", (long long)o->microbatches);
    if (layer && o->schedule && strcmp(o->schedule, "layer"))
        return diag_error(d, DIAG_USAGE, "--schedule %s needs --strategy pipeline or hybrid", o->schedule);
    if (o->batch % l->replicas)
        return diag_error(d, DIAG_USAGE, "--batch %lld does not divide among %d replicas", (long long)o->batch,
                          l->replicas);
    l->microbatches = layer ? 1 : o->microbatches ? (int)o->microbatches
                                                  : default_microbatches(o->batch / l->replicas, l->stages);
    if ((o->batch / l->replicas) % l->microbatches)
        return diag_error(d, DIAG_USAGE, "--microbatches %d does not divide the %lld rows of %s", l->microbatches,
                          (long long)(o->batch / l->replicas), l->replicas > 1 ? "each replica's batch" : "--batch");
    l->schedule = layer ? "layer" : o->schedule ? o->schedule : "gpipe";
    if (o->n_cuts && o->n_cuts != l->stages - 1)
        return diag_error(d, DIAG_USAGE, "--stages names %d node%s; %d stages need %d (the first node of every "
                          "stage after the first)", o->n_cuts, o->n_cuts == 1 ? "" : "s", l->stages, l->stages - 1);
    return true;
}

static void report_plan(const Plan *p, const CompileOptions *o) {
    int64_t arena = 0;
    for (int r = 0; r < p->n_ranks; r++)
        if (p->ranks[r].arena_bytes > arena) arena = p->ranks[r].arena_bytes;
    if (o->verbose)
        for (int r = 0; r < (p->n_stages ? p->n_stages : 1); r++) {
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
    char threads[48] = "";
    if (p->threads > 1) snprintf(threads, sizeof threads, " x %d threads", p->threads);
    fprintf(stderr, "cleave: %s -> %s: %s%s on %d rank%s%s, batch %lld; arena %.1f MiB per rank (largest)\n", o->model,
            o->output, p->strategy, detail, p->n_ranks, p->n_ranks > 1 ? "s" : "", threads, (long long)o->batch,
            (double)arena / (1 << 20));
}

/* What stage balancing prices on: the cluster and where the stages sit. */
typedef struct Pricing {
    Cluster cl;
    int replicas, microbatches;
    bool by_stage;
} Pricing;

/* A node's time per micro-batch, as the simulator charges it over a step:
 * cold for the first micro-batch, warm for the others. */
static double node_seconds(const Node *n, void *ctx) {
    const Pricing *pr = ctx;
    double cold = sim_node_seconds(&pr->cl, 0, n, false);
    if (pr->microbatches <= 1) return cold;
    return (cold + (pr->microbatches - 1) * sim_node_seconds(&pr->cl, 0, n, true)) / pr->microbatches;
}

/* The link between stage j and j + 1 of replica 0 (plan_rank_of). */
static void boundary_link(int j, double *latency_s, double *sec_per_byte, void *ctx) {
    const Pricing *pr = ctx;
    const Cluster *c = &pr->cl;
    int a = pr->by_stage ? j * pr->replicas : j, b = pr->by_stage ? (j + 1) * pr->replicas : j + 1;
    const ClusterLink *link = b < cluster_ranks(c) ? cluster_link(c, a, b) : &c->intra_node;
    *latency_s = link->latency_s;
    *sec_per_byte = 1.0 / (link->bandwidth_gbps * 1e9);
}

/* Bytes a rank holds per byte of the parameters it updates: the weight,
 * its gradient, the accumulator of micro-batch gradients, and the
 * optimizer's state (a velocity; Adam's two moments). */
static double param_copies(const TrainOptions *t, int microbatches) {
    double state = t->optimizer == OPT_ADAM ? 2 : t->optimizer == OPT_MOMENTUM ? 1 : 0;
    return 2 + (microbatches > 1) + state;
}

/* The staged plan, its stages balanced by FLOPs or (--balance time) by the
 * predicted time of their nodes, the values crossing their boundaries and
 * their memory on the cluster. */
static bool staged_plan(const CompileOptions *o, const Layout *l, Graph *g, TrainGraph *t, Plan *p, Diag *d) {
    Placement place = o->placement && strcmp(o->placement, "by_stage") == 0 ? PLACE_BY_STAGE : PLACE_BY_REPLICA;
    Pricing pr = {.replicas = l->replicas, .microbatches = l->microbatches, .by_stage = place == PLACE_BY_STAGE};
    Cluster *cl = &pr.cl;
    double act[64];
    StageWeight w = {node_seconds, &pr};
    bool timed = o->balance_time && o->n_cuts == 0;
    if (timed) {
        char which[1100];
        if (!cluster_open(o->cluster, l->ranks, cl, which, sizeof which, d)) return false;
        cl->profile = o->kernel_profile;
        profile_bind(cl->profile, g);
        /* The activations stage s keeps: every micro-batch's under GPipe,
         * at most P - s under 1F1B.  Beyond 64 stages, compute alone. */
        if (l->stages <= 64) {
            for (int s = 0; s < l->stages; s++) {
                int keep = strcmp(l->schedule, "1f1b") == 0 ? l->stages - s : l->microbatches;
                act[s] = keep < l->microbatches ? keep : l->microbatches;
            }
            w.boundary_link = boundary_link;
            w.memory_limit = (double)cl->memory_per_rank_bytes;
            w.param_copies = param_copies(&o->train, l->microbatches);
            w.act_copies = act;
        }
    }
    bool ok = plan_hybrid_weighted(g, t, o->batch, l->replicas, l->stages, l->microbatches, l->schedule, o->cuts,
                                   o->n_cuts, o->bucket_mb, timed ? &w : NULL, place, p, d);
    if (timed) cluster_free(cl);
    return ok;
}

bool driver_build_plan(const CompileOptions *o, Graph **gp, TrainGraph *t, Plan *p, Diag *d) {
    *gp = NULL;
    Layout l;
    if (!layout(o, &l, d)) return false;
    /* The graph is built for the rows one step of one rank computes at
     * once: a replica's share, or its share of one micro-batch; summing the
     * gradients over replicas and micro-batches, each seeded with
     * 1 / (replicas x micro-batches), gives the global batch's. */
    int64_t rows = o->batch / l.replicas / l.microbatches;
    DriverOptions fo = {.model = o->model, .batch = rows, .require_supported = true};
    Graph *g = driver_front_end(&fo, d);
    if (!g) return false;
    TrainOptions to = o->train;
    to.replicas = l.replicas * l.microbatches;
    bool ok = train_build(g, &to, t, d) && ir_verify(g, d);
    if (ok) {
        if (l.staged)
            ok = staged_plan(o, &l, g, t, p, d);
        else if (l.dp)
            ok = plan_dp(g, t, o->batch, l.ranks, o->bucket_mb, p, d);
        else
            ok = plan_single(g, t, o->batch, p, d);
    }
    if (!ok) {
        graph_free(g);
        return false;
    }
    p->threads = o->threads > 1 ? (int)o->threads : 1;
    *gp = g;
    return true;
}

/* A plan file's derived fields that its decisions do not give are
 * recomputed, and the user is told which, so an edit there is not lost
 * without a word (docs/plan.md, "Editing a plan"). */
static void check_plan_file(const PlanFile *f, const char *derived) {
    char where[512];
    if (plan_file_compare(f, derived, where, sizeof where))
        fprintf(stderr, "cleave: note: %s: %s is not what the plan's decisions (strategy, replicas, stages, "
                "stage_table first_node, microbatches, schedule, placement, bucket_mb, batch, loss, optimizer) give; the "
                "fields derived from them are recomputed\n", f->path, where);
}

/* driver_compile, its kernel profile (if any) live throughout. */
static bool compile_profiled(const CompileOptions *o, Diag *d) {
    CompileOptions chosen;
    if (o->strategy && strcmp(o->strategy, "auto") == 0) {
        if (!driver_choose(o, &chosen, d)) return false;
        o = &chosen;
    } else if (o->kernel_profile && o->balance_time && o->n_cuts == 0) {
        /* Kernels timed and refined as `cleave plan` times them, so that
         * the stages are cut where it cuts them. */
        Search s;
        if (!driver_predict(o, &s, d)) return false;
        search_free(&s);
    }
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!driver_build_plan(o, &g, &t, &p, d)) {
        if (o->plan_file) plan_file_reword(o->plan_file, d);
        return false;
    }
    bool ok = true;
    char *meta = NULL;
    if (o->plan_out || o->plan_file) {
        char *text = plan_to_json(&p, &o->train);
        ok = text != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
        if (ok && o->plan_out) ok = write_text(o->plan_out, text, d);
        if (ok && o->plan_file) check_plan_file(o->plan_file, text);
        free(text);
    }
    if (ok) {
        meta = program_meta(&p, o);
        ok = meta != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
    }
    if (ok) {
        CgOptions co = {.target_cpu = o->target_cpu, .emit = o->emit, .output = o->output, .model_path = o->model,
                        .meta_json = meta, .verbose = o->verbose, .no_fuse = o->no_fuse};
        ok = cg_compile_plan(&p, &co, d);
    }
    if (ok) report_plan(&p, o);
    free(meta);
    graph_free(g);
    return ok;
}

bool driver_compile(const CompileOptions *given, Diag *d) {
    /* One kernel profile (--profile) for the search and for the plan it
     * chose, so that the stages are cut on the times the choice was made
     * on, and an explicit --balance time cuts them as auto would. */
    CompileOptions with = *given;
    KernelProfile *made = NULL;
    if (with.profile && !with.kernel_profile && !(made = with.kernel_profile = profile_new()))
        return diag_error(d, DIAG_NOMEM, "out of memory");
    bool ok = compile_profiled(&with, d);
    profile_free(made);
    return ok;
}
