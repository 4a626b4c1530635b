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
 * marked infeasible, so users see why it lost. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost/cluster.h"
#include "cost/profile.h"
#include "cost/simulate.h"
#include "driver.h"
#include "plan/plan.h"
#include "util/text.h"

static void set_candidate(Candidate *c, const char *strategy, int dp, int stages, int micro, const char *schedule,
                          bool by_stage) {
    memset(c, 0, sizeof *c);
    c->by_stage = by_stage;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy);
    snprintf(c->schedule, sizeof c->schedule, "%s", schedule ? schedule : "");
    c->dp = dp;
    c->stages = stages;
    c->microbatches = micro;
}

/* o set up to compile candidate c. */
static CompileOptions options_for(const CompileOptions *o, const Candidate *c) {
    CompileOptions x = *o;
    x.strategy = c->strategy;
    x.cuts = NULL;
    x.n_cuts = 0;
    x.plan_out = NULL;
    x.dp = x.pp = x.microbatches = 0;
    x.schedule = NULL;
    x.balance_time = true; /* the search's stages are balanced on the model's own prediction */
    x.placement = NULL;
    if (strcmp(c->strategy, "hybrid") == 0) {
        x.dp = c->dp;
        x.pp = c->stages;
        x.placement = c->by_stage ? "by_stage" : NULL;
    }
    if (strcmp(c->strategy, "pipeline") == 0 || strcmp(c->strategy, "hybrid") == 0) {
        x.microbatches = c->microbatches;
        x.schedule = c->schedule;
    }
    return x;
}

/* The candidates for o on cluster c: where a hybrid's replicas and stages
 * cannot all share one node, both placements, which put different
 * traffic on the slow links; likewise where ranks outnumber a node's
 * cores, since the placement decides which ranks share a core. */
static int enumerate(const CompileOptions *o, const Cluster *c, Candidate *out, int cap) {
    int n = 0, N = (int)(o->ranks > 0 ? o->ranks : 1);
    int64_t B = o->batch;
    static const char *scheds[] = {"gpipe", "1f1b"};
#define ADD(...)                                          \
    do {                                                  \
        if (n < cap) set_candidate(&out[n++], __VA_ARGS__); \
    } while (0)
    if (N == 1) {
        ADD("single", 1, 1, 1, NULL, false);
        return n;
    }
    if (B % N == 0) ADD("dp", N, 1, 1, NULL, false);
    ADD("layer", 1, N, 1, "layer", false);
    for (int m = 2; m <= 32; m *= 2)
        for (int k = 0; k < 2; k++)
            if (m <= B && B % m == 0) ADD("pipeline", 1, N, m, scheds[k], false);
    bool both = N > c->ranks_per_node || cluster_core_share(c, 0, N) < 1;
    for (int D = 2; D < N; D++) {
        if (N % D) continue;
        for (int place = 0; place < (both ? 2 : 1); place++)
            for (int m = 1; m <= 8; m *= 2)
                for (int k = 0; k < (m > 1 ? 2 : 1); k++)
                    if (B % ((int64_t)D * m) == 0) ADD("hybrid", D, N / D, m, scheds[k], place == 1);
    }
#undef ADD
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

/* Plans and simulates o as candidate c (its layout taken from the plan). */
static bool plan_and_simulate(const CompileOptions *o, const Cluster *cl, Candidate *c, Diag *d) {
    Graph *g;
    TrainGraph t;
    Plan p;
    if (!driver_build_plan(o, &g, &t, &p, d)) return false;
    SimResult r;
    bool ok = simulate_plan(&p, cl, &r, d);
    if (ok) {
        c->dp = p.replicas > 0 ? p.replicas : 1;
        c->stages = p.n_stages ? p.n_stages : 1;
        c->microbatches = p.microbatches ? p.microbatches : 1;
        ok = (fill(c, &r, cl) && stage_cuts(c, &p)) || diag_error(d, DIAG_NOMEM, "out of memory");
        sim_result_free(&r);
    }
    graph_free(g);
    return ok;
}

/* Plans and simulates one candidate; false when it does not apply, with
 * the reason in *why unless it already holds one. */
static bool evaluate(const CompileOptions *o, const Cluster *cl, Candidate *c, Diag *why) {
    CompileOptions x = options_for(o, c);
    Diag d = {0};
    if (plan_and_simulate(&x, cl, c, &d)) return true;
    candidate_release(c);
    if (!diag_failed(why)) *why = d;
    return false;
}

/* The cluster `given` plans on, in *cl, and in *o the options with their
 * kernel profile attached: made here (*made, for the caller to free)
 * when --profile asks for one and none is live yet. */
static bool open_cluster(const CompileOptions *given, CompileOptions *o, KernelProfile **made, Cluster *cl, Search *s,
                         Diag *d) {
    *o = *given;
    *made = NULL;
    if (o->profile && !o->kernel_profile && !(*made = o->kernel_profile = profile_new()))
        return diag_error(d, DIAG_NOMEM, "out of memory");
    if (!cluster_open(o->cluster, (int)(o->ranks > 0 ? o->ranks : 1), cl, s->cluster, sizeof s->cluster, d)) {
        profile_free(*made);
        *made = NULL;
        return false;
    }
    s->memory_per_rank = cl->memory_per_rank_bytes;
    cl->profile = o->kernel_profile;
    if (cl->profile) {
        size_t used = strlen(s->cluster);
        snprintf(s->cluster + used, sizeof s->cluster - used, ", with this machine's times of the model's kernels "
                 "(--profile)");
    }
    return true;
}

/* A candidate describing o's own strategy flags. */
static void candidate_of(const CompileOptions *o, Candidate *c) {
    const char *st = o->strategy ? o->strategy : "single";
    int N = (int)(o->ranks > 0 ? o->ranks : 1);
    bool staged = strcmp(st, "layer") == 0 || strcmp(st, "pipeline") == 0 || strcmp(st, "hybrid") == 0;
    int D = strcmp(st, "dp") == 0 ? N : strcmp(st, "hybrid") == 0 ? (int)o->dp : 1;
    int P = !staged ? 1 : strcmp(st, "hybrid") == 0 ? (int)o->pp : N;
    set_candidate(c, st, D, P, (int)(o->microbatches ? o->microbatches : 1),
                  staged ? (strcmp(st, "layer") == 0 ? "layer" : o->schedule ? o->schedule : "gpipe") : NULL,
                  o->placement && strcmp(o->placement, "by_stage") == 0);
}

bool driver_predict(const CompileOptions *given, Search *s, Diag *d) {
    memset(s, 0, sizeof *s);
    s->best = -1;
    Cluster cl;
    CompileOptions base, *o = &base;
    KernelProfile *made;
    if (!open_cluster(given, &base, &made, &cl, s, d)) return false;
    s->c = calloc(1, sizeof *s->c);
    bool ok = s->c != NULL || diag_error(d, DIAG_NOMEM, "out of memory");
    if (ok) {
        candidate_of(o, s->c);
        CompileOptions x = *o;
        x.plan_out = NULL;
        /* as in driver_search: with --profile, again on refined timings */
        for (int round = 0; ok && round < (cl.profile ? 2 : 1); round++) {
            if (round > 0) {
                candidate_release(s->c);
                profile_refine(cl.profile, PROFILE_PASSES);
            }
            ok = plan_and_simulate(&x, &cl, s->c, d);
        }
    }
    if (ok) {
        s->n = 1;
        s->best = s->c->feasible ? 0 : -1;
    } else {
        search_free(s);
    }
    cluster_free(&cl);
    profile_free(made);
    return ok;
}

static int by_prediction(const void *a, const void *b) {
    const Candidate *x = a, *y = b;
    if (x->feasible != y->feasible) return x->feasible ? -1 : 1;
    return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

bool driver_search(const CompileOptions *given, Search *s, Diag *d) {
    memset(s, 0, sizeof *s);
    s->best = -1;
    Cluster cl;
    CompileOptions base, *o = &base;
    KernelProfile *made;
    if (!open_cluster(given, &base, &made, &cl, s, d)) return false;
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
    for (int round = 0; ok && round < (cl.profile ? 2 : 1) && (round == 0 || kept > 0); round++) {
        if (round > 0) {
            for (int i = 0; i < kept; i++) candidate_release(&all[i]);
            memset(all, 0, sizeof *all * CAP);
            profile_refine(cl.profile, PROFILE_PASSES);
        }
        int n = enumerate(o, &cl, all, CAP);
        kept = 0;
        for (int i = 0; i < n; i++)
            if (evaluate(o, &cl, &all[i], &first)) all[kept++] = all[i];
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
    }
    cluster_free(&cl);
    profile_free(made);
    return ok;
}

void search_free(Search *s) {
    for (int i = 0; i < s->n; i++) candidate_release(&s->c[i]);
    free(s->c);
    memset(s, 0, sizeof *s);
}

void search_options(const CompileOptions *o, const Candidate *c, CompileOptions *x) {
    *x = options_for(o, c);
    x->plan_out = o->plan_out;
    /* Static strings, so that x outlives the search. */
    static const char *names[] = {"single", "dp", "layer", "pipeline", "hybrid"};
    static const char *sched_names[] = {"layer", "gpipe", "1f1b"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (strcmp(names[k], c->strategy) == 0) x->strategy = names[k];
    x->schedule = NULL;
    for (size_t k = 0; k < sizeof sched_names / sizeof *sched_names; k++)
        if (x->microbatches && strcmp(sched_names[k], c->schedule) == 0) x->schedule = sched_names[k];
    x->placement = c->by_stage ? "by_stage" : NULL;
}

bool driver_choose(const CompileOptions *o, CompileOptions *chosen, Diag *d) {
    if (o->n_cuts) return diag_error(d, DIAG_USAGE, "--stages chooses the stages by hand; it does not go with --strategy auto");
    Search s;
    if (!driver_search(o, &s, d)) return false;
    bool ok = s.best >= 0;
    if (!ok) {
        diag_error(d, DIAG_USAGE, "%s: no plan fits the memory of the ranks (%s): the closest, %s, has %s", o->model,
                   s.cluster, s.c[0].strategy, s.c[0].why);
    } else {
        const Candidate *c = &s.c[s.best];
        search_options(o, c, chosen);
        fprintf(stderr, "cleave: --strategy auto: %s", c->strategy);
        if (c->schedule[0])
            fprintf(stderr, " (%d replica%s x %d stage%s, %d micro-batch%s, %s%s)", c->dp, c->dp > 1 ? "s" : "",
                    c->stages, c->stages > 1 ? "s" : "", c->microbatches, c->microbatches > 1 ? "es" : "",
                    c->schedule, c->by_stage ? ", placed by stage" : "");
        fprintf(stderr, ": predicted %.3f ms per step, the fastest of %d plans on %s\n", c->step_s * 1e3, s.n,
                s.cluster);
    }
    search_free(&s);
    return ok;
}
