/* search.c - choosing how to split the work: every strategy that applies
 * to the model, batch and rank count, planned for real (the same plans
 * `cleave compile` would generate code for) and simulated on the cluster
 * (cost/simulate.h); the fastest that fits every rank's memory wins.
 *
 * Candidates for N ranks: one process (N = 1); data parallelism; layer
 * parallelism over N stages; pipelines of N stages with 2, 4, 8, 16 and 32
 * micro-batches under GPipe and 1F1B; and hybrids D x P = N for every
 * factorisation with D, P > 1, with 1, 2, 4 and 8 micro-batches.  A
 * candidate the batch does not divide into, or whose planning fails (more
 * stages than layers), is left out; one over a rank's memory is kept and
 * marked infeasible, so users see why it lost.
 *
 * A candidate is a Layout value (driver.h) planned by driver_build_plan;
 * nothing is turned back into command line options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/cluster.h"
#include "cost/profile.h"
#include "cost/simulate.h"
#include "plan/plan.h"
#include "search.h"
#include "util/text.h"

/* A layout of the search: its stages, if any, balanced on the model's own
 * prediction (cost/cluster_stages.h). */
static void set_candidate(Candidate *c, Strategy strategy, int dp, int stages, int micro, SchedKind schedule,
                          bool by_stage, int allreduce_node) {
    memset(c, 0, sizeof *c);
    c->layout = (Layout){.strategy = strategy, .replicas = dp, .stages = stages, .microbatches = micro,
                         .schedule = schedule, .placement = by_stage ? PLACE_BY_STAGE : PLACE_BY_REPLICA,
                         .allreduce_node = allreduce_node, .balance_time = true};
}

const char *candidate_schedule(const Candidate *c) {
    return strategy_staged(c->layout.strategy) ? schedule_name(c->layout.schedule) : "";
}

/* The candidates for o on cluster c: where a hybrid's replicas and stages
 * cannot all share one node, both placements, which put different
 * traffic on the slow links; likewise where ranks outnumber a node's
 * cores, since the placement decides which ranks share a core.  Where the
 * ranks span nodes of more than one rank, every plan with replicas is
 * tried with the flat and the hierarchical gradient allreduce (over the
 * cluster's nodes). */
static int enumerate(const CompileOptions *o, const Cluster *c, Candidate *out, int cap) {
    int n = 0, N = (int)(o->ranks > 0 ? o->ranks : 1);
    int64_t B = o->batch;
    static const SchedKind scheds[] = {SCHED_GPIPE, SCHED_1F1B};
    int hier = N > c->ranks_per_node && c->ranks_per_node > 1 ? c->ranks_per_node : 0;
#define ADD(...)                                          \
    do {                                                  \
        if (n < cap) set_candidate(&out[n++], __VA_ARGS__, 0); \
    } while (0)
#define ADD_DP(...)                                                    \
    do {                                                               \
        ADD(__VA_ARGS__);                                              \
        if (hier && n < cap) set_candidate(&out[n++], __VA_ARGS__, hier); \
    } while (0)
    if (N == 1) {
        ADD(STRATEGY_SINGLE, 1, 1, 1, SCHED_LAYER, false);
        return n;
    }
    if (B % N == 0) ADD_DP(STRATEGY_DP, N, 1, 1, SCHED_LAYER, false);
    ADD(STRATEGY_LAYER, 1, N, 1, SCHED_LAYER, false);
    for (int m = 2; m <= 32; m *= 2)
        for (int k = 0; k < 2; k++)
            if (m <= B && B % m == 0) ADD(STRATEGY_PIPELINE, 1, N, m, scheds[k], false);
    bool both = N > c->ranks_per_node || cluster_core_share(c, 0, N) < 1;
    for (int D = 2; D < N; D++) {
        if (N % D) continue;
        for (int place = 0; place < (both ? 2 : 1); place++)
            for (int m = 1; m <= 8; m *= 2)
                for (int k = 0; k < (m > 1 ? 2 : 1); k++)
                    if (B % ((int64_t)D * m) == 0) ADD_DP(STRATEGY_HYBRID, D, N / D, m, scheds[k], place == 1);
    }
#undef ADD
#undef ADD_DP
    return n;
}

/* c's predictions from a simulation, and whether every rank fits. */
static bool fill(Candidate *c, const SimResult *r, const Cluster *cl) {
    c->step_s = r->step_s;
    c->bubble = r->bubble;
    c->comm_bytes = r->comm_bytes;
    c->peak_bytes = r->peak_bytes;
    c->n_ranks = r->n_ranks;
    c->rank_bytes = malloc(sizeof *c->rank_bytes * (size_t)r->n_ranks);
    c->rank_busy_s = malloc(sizeof *c->rank_busy_s * (size_t)r->n_ranks);
    if (!c->rank_bytes || !c->rank_busy_s) return false;
    c->feasible = true;
    for (int k = 0; k < r->n_ranks; k++) {
        c->rank_bytes[k] = r->ranks[k].arena_bytes;
        c->rank_busy_s[k] = r->ranks[k].busy_s;
        int64_t over = r->ranks[k].arena_bytes - cl->memory_per_rank_bytes;
        if (over > 0 && c->feasible) {
            c->feasible = false;
            snprintf(c->why, sizeof c->why, "rank %d over its memory by %.1f MB", k, (double)over / 1e6);
        }
    }
    return true;
}

/* Timings of every kernel --profile measures, the first included: the
 * median of three. */
#define PROFILE_PASSES 2

/* Frees what pricing c allocated. */
static void candidate_release(Candidate *c) {
    free(c->rank_bytes);
    free(c->rank_busy_s);
    free(c->cuts);
    c->rank_bytes = NULL;
    c->rank_busy_s = NULL;
    c->cuts = NULL;
}

/* c->cuts from a staged plan p; false when out of memory. */
static bool stage_cuts(Candidate *c, const Plan *p) {
    if (p->n_stages < 2) return true;
    Text t = {0};
    for (int s = 1; s < p->n_stages; s++) text_put(&t, "%s%s", s > 1 ? "," : "", p->fwd_order[p->stage_begin[s]]->name);
    if (t.failed) {
        free(t.s);
        return false;
    }
    c->cuts = t.s;
    return true;
}

/* Plans and simulates o in candidate c's layout. */
static bool plan_and_simulate(const CompileOptions *o, const Cluster *cl, KernelProfile *profile, Candidate *c,
                              Diag *d) {
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!driver_build_plan(o, &c->layout, profile, &g, &t, &p, d)) return false;
    c->batch_stats = t.n_batch_stats;
    SimResult r;
    bool ok = simulate_plan(&p, cl, &r, d);
    if (ok) {
        ok = (fill(c, &r, cl) && stage_cuts(c, &p)) || diag_error(d, DIAG_NOMEM, "out of memory");
        sim_result_free(&r);
    }
    graph_free(g);
    return ok;
}

/* Plans and simulates one candidate; false when it does not apply, with
 * the reason in *why unless it already holds one. */
static bool evaluate(const CompileOptions *o, const Cluster *cl, KernelProfile *profile, Candidate *c, Diag *why) {
    Diag d = {0};
    if (plan_and_simulate(o, cl, profile, c, &d)) return true;
    candidate_release(c);
    if (!diag_failed(why)) *why = d;
    return false;
}

/* The cluster o plans on, in *cl, and s->profile made when --profile asks
 * for one. */
static bool open_cluster(const CompileOptions *o, Cluster *cl, Search *s, Diag *d) {
    memset(s, 0, sizeof *s);
    s->best = -1;
    if (o->profile && !(s->profile = profile_new())) return diag_error(d, DIAG_NOMEM, "out of memory");
    if (!cluster_open(o->cluster, (int)(o->ranks > 0 ? o->ranks : 1), cl, s->cluster, sizeof s->cluster, d)) {
        search_free(s);
        return false;
    }
    s->memory_per_rank = cl->memory_per_rank_bytes;
    cl->profile = s->profile;
    if (cl->profile) {
        size_t used = strlen(s->cluster);
        snprintf(s->cluster + used, sizeof s->cluster - used, ", with this machine's times of the model's kernels "
                 "(--profile; %zu MiB of last-level cache keep a process's data)", profile_llc_bytes() >> 20);
    }
    return true;
}

bool search_one(const CompileOptions *o, const Layout *l, Search *s, Diag *d) {
    Cluster cl;
    if (!open_cluster(o, &cl, s, d)) return false;
    s->c = calloc(1, sizeof *s->c);
    bool ok = s->c != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
    if (ok) {
        s->c->layout = *l;
        /* as in search_all: with --profile, again on refined timings */
        for (int round = 0; ok && round < (s->profile ? 2 : 1); round++) {
            if (round > 0) {
                candidate_release(s->c);
                profile_refine(s->profile, PROFILE_PASSES);
            }
            ok = plan_and_simulate(o, &cl, s->profile, s->c, d);
        }
    }
    if (ok) {
        s->n = 1;
        s->best = s->c->feasible ? 0 : -1;
    } else {
        search_free(s);
    }
    cluster_free(&cl);
    return ok;
}

static int by_prediction(const void *a, const void *b) {
    const Candidate *x = a, *y = b;
    if (x->feasible != y->feasible) return x->feasible ? -1 : 1;
    return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

bool search_all(const CompileOptions *o, Search *s, Diag *d) {
    Cluster cl;
    if (!open_cluster(o, &cl, s, d)) return false;
    int N = (int)(o->ranks > 0 ? o->ranks : 1);
    bool ok = true;
    if (N > cluster_ranks(&cl))
        ok = diag_error(d, DIAG_USAGE, "--ranks %d: the cluster (%s) has %d ranks", N, cl.origin, cluster_ranks(&cl));
    enum { CAP = 512 };
    Candidate *all = ok ? calloc(CAP, sizeof *all) : NULL;
    if (ok && !all) ok = diag_error(d, DIAG_NOMEM, "out of memory");
    int kept = 0;
    Diag first = {0}; /* why the first candidate could not be planned */
    /* With --profile the first round times every kernel the candidates use
     * once; the second times them all again (profile_refine) and prices
     * the candidates, and cuts their stages, on the refined times. */
    for (int round = 0; ok && round < (s->profile ? 2 : 1) && (round == 0 || kept > 0); round++) {
        if (round > 0) {
            for (int i = 0; i < kept; i++) candidate_release(&all[i]);
            memset(all, 0, sizeof *all * CAP);
            profile_refine(s->profile, PROFILE_PASSES);
        }
        int n = enumerate(o, &cl, all, CAP);
        kept = 0;
        for (int i = 0; i < n; i++)
            if (evaluate(o, &cl, s->profile, &all[i], &first)) all[kept++] = all[i];
    }
    /* When nothing plans, the cause is usually the model or the training
     * options, not the split: say it as the first candidate met it. */
    if (ok && kept == 0 && diag_failed(&first)) {
        *d = first;
        ok = false;
    } else if (ok && kept == 0) {
        ok = diag_error(d, DIAG_USAGE, "%s: no way to split batch %lld over %d ranks could be planned", o->model,
                        (long long)o->batch, N);
    }
    if (ok) {
        qsort(all, (size_t)kept, sizeof *all, by_prediction);
        s->c = all;
        s->n = kept;
        s->best = all[0].feasible ? 0 : -1;
    } else {
        free(all);
        search_free(s);
    }
    cluster_free(&cl);
    return ok;
}

void search_free(Search *s) {
    for (int i = 0; i < s->n; i++) candidate_release(&s->c[i]);
    free(s->c);
    profile_free(s->profile);
    memset(s, 0, sizeof *s);
    s->best = -1;
}

bool search_choose(const CompileOptions *o, Search *s, Layout *chosen, Diag *d) {
    if (!search_all(o, s, d)) return false;
    if (s->best < 0) {
        diag_error(d, DIAG_USAGE, "%s: no plan fits the memory of the ranks (%s): the closest, %s, has %s", o->model,
                   s->cluster, strategy_name(s->c[0].layout.strategy), s->c[0].why);
        search_free(s);
        return false;
    }
    const Candidate *c = &s->c[s->best];
    const Layout *l = &c->layout;
    *chosen = *l;
    fprintf(stderr, "cleave: --strategy auto: %s", strategy_name(l->strategy));
    if (candidate_schedule(c)[0])
        fprintf(stderr, " (%d replica%s x %d stage%s, %d micro-batch%s, %s%s)", l->replicas, l->replicas > 1 ? "s" : "",
                l->stages, l->stages > 1 ? "s" : "", l->microbatches, l->microbatches > 1 ? "es" : "",
                candidate_schedule(c), l->placement == PLACE_BY_STAGE ? ", placed by stage" : "");
    if (l->allreduce_node > 0) fprintf(stderr, ", gradients summed hierarchically over nodes of %d", l->allreduce_node);
    fprintf(stderr, ": predicted %.3f ms per step, the fastest of %d plans on %s\n", c->step_s * 1e3, s->n,
            s->cluster);
    return true;
}
