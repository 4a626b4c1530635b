/* test_pipeline_plan.c - pipeline stages, schedules, per-rank plans and
 * the static communication check.
 *
 * Graphs are small chains and branches of MatMul / Relu / Add built with
 * the training-graph builders, trained with the MSE loss (so the last stage
 * holds loss nodes), plus the sample models. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "autodiff/grad.h"
#include "autodiff/train.h"
#include "ops/ops.h"
#include "plan/pipeline.h"
#include "plan/walk.h"

/* ---- building graphs ---- */

typedef struct TG {
    Graph *g;
    GradCtx gc;
    Diag d;
    TrainGraph t;
    uint64_t rng;
} TG;

static void tg_init(TG *k, const char *name) {
    memset(k, 0, sizeof *k);
    k->g = graph_new(name);
    k->g->opsets = ARENA_NEW(&k->g->arena, Opset);
    k->g->opsets[0] = (Opset){"", 17};
    k->g->n_opsets = 1;
    k->g->inputs = ARENA_ARRAY(&k->g->arena, Value *, 8);
    k->g->outputs = ARENA_ARRAY(&k->g->arena, Value *, 2);
    k->gc = (GradCtx){k->g, &k->d, PHASE_FORWARD};
    k->rng = 99;
}

static Value *tensor(TG *k, const char *name, ValueKind kind, int64_t r, int64_t c) {
    Value *v = graph_add_value(k->g, name);
    v->kind = kind;
    v->dtype = v->file_dtype = DT_FLOAT;
    v->rank = 2;
    v->dims[0] = dim_const(r);
    v->dims[1] = dim_const(c);
    if (kind == VAL_INPUT) {
        k->g->inputs[k->g->n_inputs++] = v;
        return v;
    }
    v->konst = const_new(k->g, DT_FLOAT, r * c);
    for (int64_t i = 0; i < r * c; i++) {
        k->rng = k->rng * 6364136223846793005ull + 1442695040888963407ull;
        const_set_f(v->konst, i, (float)((k->rng >> 40) / (double)(1ull << 24)) - 0.5f);
    }
    return v;
}

/* A forward node with a name of our choosing. */
static Value *fwd(TG *k, const char *node, const char *op, Value *a, Value *b) {
    Value *in[2] = {a, b};
    Node *n = gb_start(&k->gc, "", op, b ? 2 : 1, in, 1);
    ck_assert_msg(n != NULL, "building %s: %s", node, k->d.msg);
    n->name = arena_strdup(&k->g->arena, node);
    Value *y = gb_finish(&k->gc, n);
    ck_assert_msg(y != NULL, "building %s: %s", node, k->d.msg);
    return y;
}

static void train(TG *k, Value *y, OptKind opt) {
    y->is_output = true;
    k->g->outputs[k->g->n_outputs++] = y;
    TrainOptions o = {.loss = LOSS_MSE, .optimizer = opt, .lr = 0.1f, .momentum = 0.9f, .beta1 = 0.9f,
                      .beta2 = 0.999f, .eps = 1e-8f};
    Diag d = {0};
    ck_assert_msg(train_build(k->g, &o, &k->t, &d) && ir_verify(k->g, &d), "training graph: %s", d.msg);
}

/* x[B, w0] -> (MatMul W_i -> Relu) x layers: nodes mm<i> and relu<i>. */
static void chain(TG *k, int layers, const int64_t *widths, int64_t batch) {
    tg_init(k, "chain");
    Value *h = tensor(k, "x", VAL_INPUT, batch, widths[0]);
    for (int i = 0; i < layers; i++) {
        char wn[32], mn[32], rn[32];
        snprintf(wn, sizeof wn, "W%d", i);
        snprintf(mn, sizeof mn, "mm%d", i);
        snprintf(rn, sizeof rn, "relu%d", i);
        h = fwd(k, mn, "MatMul", h, tensor(k, wn, VAL_INITIALIZER, widths[i], widths[i + 1]));
        h = fwd(k, rn, "Relu", h, NULL);
    }
    train(k, h, OPT_SGD);
}

static void uniform_chain(TG *k, int layers, int64_t width, int64_t batch) {
    int64_t w[65];
    for (int i = 0; i <= layers; i++) w[i] = width;
    chain(k, layers, w, batch);
}

/* ---- looking at plans ---- */

static Node *node_named(Graph *g, const char *name) {
    GRAPH_FOR_NODES(g, n) {
        if (strcmp(n->name, name) == 0) return n;
    }
    ck_abort_msg("no node %s", name);
    return NULL;
}

/* Train steps of a kind; v NULL, peer < 0 and micro < -1 match any. */
static int count_steps(const RankPlan *rp, StepKind kind, const Value *v, int peer, int micro) {
    int c = 0;
    for (int i = 0; i < rp->n_train; i++) {
        const PlanStep *s = &rp->train[i];
        if (s->kind == kind && (!v || s->value == v) && (peer < 0 || s->peer == peer) && (micro < -1 || s->micro == micro))
            c++;
    }
    return c;
}

static bool rank_mentions(const RankPlan *rp, const Value *v) {
    for (int i = 0; i < rp->n_train; i++) {
        const PlanStep *s = &rp->train[i];
        if (s->value == v) return true;
        if (s->kind == STEP_COMPUTE)
            for (int k = 0; k < s->node->n_in; k++)
                if (s->node->in[k] == v) return true;
    }
    return false;
}

static void plan_ok(TG *k, int P, int M, const char *sched, const char *const *cuts, int n_cuts, Plan *p) {
    Diag d = {0};
    int64_t micro = k->g->inputs[0]->dims[0].k;
    ck_assert_msg(plan_pipeline(k->g, &k->t, micro * M, P, M, sched, cuts, n_cuts, p, &d), "plan (P=%d M=%d %s): %s",
                  P, M, sched, d.msg);
}

static void expect_error(bool ok, const Diag *d, const char *needle) {
    ck_assert_msg(!ok, "expected an error containing '%s'", needle);
    ck_assert_msg(strstr(d->msg, needle) != NULL, "error '%s' does not mention '%s'", d->msg, needle);
}

/* ---- stage balancing ---- */

/* Least bottleneck and least sum of squares by trying every split. */
static void brute(const double *w, int n, int k, double *best_max, double *best_sq) {
    *best_max = INFINITY;
    *best_sq = INFINITY;
    int cut[8];
    for (int i = 0; i < k - 1; i++) cut[i] = i + 1; /* cut[i]: start of part i + 1 */
    for (;;) {
        double mx = 0, sq = 0;
        for (int part = 0; part < k; part++) {
            int b = part ? cut[part - 1] : 0, e = part < k - 1 ? cut[part] : n;
            double s = 0;
            for (int i = b; i < e; i++) s += w[i];
            mx = fmax(mx, s);
            sq += s * s;
        }
        if (mx < *best_max - 1e-9 || (fabs(mx - *best_max) <= 1e-9 && sq < *best_sq)) {
            *best_max = mx;
            *best_sq = sq;
        }
        int i = k - 2;
        while (i >= 0 && cut[i] == n - (k - 1 - i)) i--;
        if (i < 0) break;
        cut[i]++;
        for (int j = i + 1; j < k - 1; j++) cut[j] = cut[j - 1] + 1;
    }
}

static void check_split(const double *w, int n, int k, const int *begin, double *mx, double *sq) {
    ck_assert_int_eq(begin[0], 0);
    ck_assert_int_eq(begin[k], n);
    *mx = 0;
    *sq = 0;
    for (int part = 0; part < k; part++) {
        ck_assert_msg(begin[part + 1] > begin[part], "part %d of %d is empty", part, k);
        double s = 0;
        for (int i = begin[part]; i < begin[part + 1]; i++) s += w[i];
        *mx = fmax(*mx, s);
        *sq += s * s;
    }
}

START_TEST(balance_weights) {
    int begin[9];
    double even[12];
    for (int i = 0; i < 12; i++) even[i] = 5;
    ck_assert(stages_balance(even, 12, 4, begin));
    for (int s = 0; s <= 4; s++) ck_assert_int_eq(begin[s], 3 * s);
    double zeros[5] = {0};
    double mx, sq;
    ck_assert(stages_balance(zeros, 5, 5, begin));
    check_split(zeros, 5, 5, begin, &mx, &sq);
    ck_assert(stages_balance(zeros, 5, 3, begin));
    check_split(zeros, 5, 3, begin, &mx, &sq);
    ck_assert(!stages_balance(zeros, 5, 6, begin));
    ck_assert(!stages_balance(zeros, 5, 0, begin));
    /* every small case against exhaustive search */
    uint64_t rng = 7;
    for (int trial = 0; trial < 400; trial++) {
        double w[10];
        int n = 1 + trial % 10, k = 1 + (trial / 10) % 5;
        if (k > n) continue;
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (double)((rng >> 33) % 100);
            if (trial % 3 == 0 && i % 2) w[i] = 0; /* free nodes, as Reshape is */
        }
        ck_assert(stages_balance(w, n, k, begin));
        check_split(w, n, k, begin, &mx, &sq);
        double bm, bs;
        brute(w, n, k, &bm, &bs);
        ck_assert_msg(fabs(mx - bm) < 1e-6, "trial %d: bottleneck %g, best %g", trial, mx, bm);
        ck_assert_msg(fabs(sq - bs) < 1e-6, "trial %d: squares %g, best %g", trial, sq, bs);
    }
}
END_TEST

/* ---- stages balanced on compute, communication and memory ---- */

/* Cost of stage j over [x, i) as stages_dp.c defines it, written out
 * independently: compute, plus both directions of every crossing value at
 * each of its boundaries. */
static double costed_part(const StageCosts *c, int k, int j, int x, int i) {
    double t = 0;
    for (int p = x; p < i; p++) t += c->seconds[p];
    if (j > 0) t += 2 * (c->cut_values[x] * c->latency[j - 1] + c->cut_bytes[x] * c->sec_per_byte[j - 1]);
    if (j < k - 1) t += 2 * (c->cut_values[i] * c->latency[j] + c->cut_bytes[i] * c->sec_per_byte[j]);
    return t;
}

static bool costed_fits(const StageCosts *c, int j, int x, int i) {
    double b = 0;
    for (int p = x; p < i; p++) b += c->param_copies * c->param_bytes[p] + c->act_copies[j] * c->act_bytes[p];
    return !(c->memory_limit > 0) || b <= c->memory_limit;
}

/* Every split of n positions into k non-empty parts: the least bottleneck
 * and, within it, the least sum of squares, over splits that fit memory. */
static void costed_brute(const StageCosts *c, int k, int j, int x, double mx, double sq, double *bm, double *bs) {
    int n = c->n;
    if (j == k) {
        if (x != n) return;
        if (mx < *bm - 1e-12 || (fabs(mx - *bm) <= 1e-12 && sq < *bs)) {
            *bm = mx;
            *bs = sq;
        }
        return;
    }
    for (int i = x + 1; i <= n - (k - j - 1); i++) {
        if (!costed_fits(c, j, x, i)) continue;
        double part = costed_part(c, k, j, x, i);
        costed_brute(c, k, j + 1, i, fmax(mx, part), sq + part * part, bm, bs);
    }
}

START_TEST(balance_with_communication_and_memory) {
    uint64_t rng = 11;
    int checked = 0, over = 0;
    for (int trial = 0; trial < 600; trial++) {
        int n = 2 + trial % 9, k = 1 + (trial / 9) % 4;
        if (k > n) continue;
        double sec[12], cb[13], cv[13], lat[4], spb[4], par[12], act[12], actc[4];
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            sec[i] = (double)((rng >> 33) % 100);
            par[i] = (double)((rng >> 20) % 50);
            act[i] = (double)((rng >> 40) % 30);
        }
        for (int x = 0; x <= n; x++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            cb[x] = x == 0 || x == n ? 0 : (double)((rng >> 33) % 1000);
            cv[x] = x == 0 || x == n ? 0 : (double)(1 + (rng >> 50) % 3);
        }
        for (int j = 0; j < 4; j++) {
            lat[j] = 1 + j;
            spb[j] = trial % 2 ? 0.05 : 0.001 * (j + 1);
            actc[j] = 4 - j;
        }
        StageCosts c = {n, sec, cb, cv, lat, spb, par, act, trial % 3 == 0 ? 0 : 150 + trial % 200, 3, actc};
        int begin[6];
        int status = stages_balance_costs(&c, k, begin);
        double bm = INFINITY, bs = INFINITY;
        costed_brute(&c, k, 0, 0, 0, 0, &bm, &bs);
        if (!isfinite(bm)) {
            /* nothing fits: the split that would be best without the limit */
            ck_assert_int_eq(status, 0);
            c.memory_limit = 0;
            costed_brute(&c, k, 0, 0, 0, 0, &bm, &bs);
            over++;
        } else {
            ck_assert_int_eq(status, 1);
        }
        ck_assert_int_eq(begin[0], 0);
        ck_assert_int_eq(begin[k], n);
        double mx = 0, sq = 0;
        for (int j = 0; j < k; j++) {
            ck_assert_int_lt(begin[j], begin[j + 1]); /* never an empty stage */
            if (status == 1) ck_assert(costed_fits(&c, j, begin[j], begin[j + 1]));
            double part = costed_part(&c, k, j, begin[j], begin[j + 1]);
            mx = fmax(mx, part);
            sq += part * part;
        }
        ck_assert_msg(fabs(mx - bm) < 1e-9 * fmax(1, bm), "trial %d: bottleneck %g, best %g", trial, mx, bm);
        ck_assert_msg(fabs(sq - bs) < 1e-9 * fmax(1, bs), "trial %d: squares %g, best %g", trial, sq, bs);
        checked++;
    }
    ck_assert_int_gt(checked, 400);
    ck_assert_int_gt(over, 5); /* the limits above do leave some cases with no fitting split */

    /* Equal compute, an expensive boundary in the middle: the cut moves
     * off it even though the stages become uneven. */
    double sec[6] = {10, 10, 10, 10, 10, 10}, cb[7] = {0, 0, 0, 1e6, 0, 0, 0}, cv[7] = {0, 1, 1, 1, 1, 1, 0};
    double lat[1] = {0}, spb[1] = {1e-5}, actc[2] = {1, 1};
    StageCosts c = {6, sec, cb, cv, lat, spb, NULL, NULL, 0, 0, actc};
    int begin[3];
    ck_assert_int_eq(stages_balance_costs(&c, 2, begin), 1);
    ck_assert_int_ne(begin[1], 3);
    /* and with free links, the even split */
    spb[0] = 0;
    ck_assert_int_eq(stages_balance_costs(&c, 2, begin), 1);
    ck_assert_int_eq(begin[1], 3);
    /* too many stages, or none */
    ck_assert_int_eq(stages_balance_costs(&c, 7, begin), -1);
    ck_assert_int_eq(stages_balance_costs(&c, 0, begin), -1);
}
END_TEST

/* Graphs too large for the quadratic pass: still the least bottleneck,
 * found here by bisection over integer weights. */
START_TEST(balance_large) {
    enum { N = 4000 };
    static double w[N];
    static int begin[17];
    uint64_t rng = 3;
    double total = 0, maxw = 0;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (double)((rng >> 33) % 1000);
        total += w[i];
        maxw = fmax(maxw, w[i]);
    }
    int ks[] = {8, 16};
    for (int t = 0; t < 2; t++) {
        int k = ks[t];
        ck_assert(stages_balance(w, N, k, begin));
        double mx, sq;
        check_split(w, N, k, begin, &mx, &sq);
        double lo = maxw, hi = total;
        while (lo < hi) {
            double mid = floor((lo + hi) / 2), run = 0;
            int parts = 1;
            for (int i = 0; i < N; i++) {
                if (run + w[i] > mid) {
                    parts++;
                    run = 0;
                }
                run += w[i];
            }
            if (parts <= k) hi = mid;
            else lo = mid + 1;
        }
        ck_assert_msg(mx == lo, "k=%d: bottleneck %g, best %g", k, mx, lo);
    }
}
END_TEST

/* Per-node weights: the split with one stage per forward node. */
static int node_weights(Graph *g, double *w) {
    Diag d = {0};
    int n;
    ck_assert(stages_forward_order(g, &n, &d) != NULL);
    StageSplit s;
    ck_assert_msg(stages_split(g, n, NULL, 0, &s, &d), "%s", d.msg);
    for (int i = 0; i < n; i++) w[i] = s.flops[i];
    return n;
}

static void check_balanced(Graph *g, int P, const double *w, int n) {
    Diag d = {0};
    StageSplit s;
    ck_assert_msg(stages_split(g, P, NULL, 0, &s, &d), "P=%d: %s", P, d.msg);
    double total = 0, maxw = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        total += w[i];
        maxw = fmax(maxw, w[i]);
    }
    for (int k = 0; k < P; k++) {
        ck_assert_msg(s.begin[k + 1] > s.begin[k], "P=%d: stage %d is empty", P, k);
        mx = fmax(mx, s.flops[k]);
    }
    /* an optimal contiguous split is never worse than average + heaviest node */
    ck_assert_msg(mx <= total / P + maxw + 1e-6 * total, "P=%d: heaviest stage %g, average %g, heaviest node %g", P, mx,
                  total / P, maxw);
    if (n <= 12 && P <= 6) {
        double bm, bs;
        brute(w, n, P, &bm, &bs);
        ck_assert_msg(fabs(mx - bm) <= 1e-9 * total, "P=%d: bottleneck %g, best %g", P, mx, bm);
    }
    /* stage_of agrees with the split for every node, and backward and
     * optimizer nodes sit with the forward node they serve */
    int *st = malloc(sizeof *st * (size_t)g->n_nodes);
    ck_assert(stages_assign(g, P, NULL, 0, st, &d));
    GRAPH_FOR_NODES(g, nd) {
        int sn = stage_of(g, st, nd);
        ck_assert(sn >= 0 && sn < P);
        if (nd->phase == PHASE_LOSS) ck_assert_int_eq(sn, P - 1);
        if (nd->origin && nd->origin->phase == PHASE_FORWARD) ck_assert_int_eq(sn, st[nd->origin->id]);
    }
    free(st);
}

START_TEST(balance_mlp) {
    Graph *g = test_load(test_src_path("samples/mlp.onnx"), 8);
    TrainOptions o = {.loss = LOSS_CE, .optimizer = OPT_SGD, .lr = 0.1f};
    TrainGraph t;
    Diag d = {0};
    ck_assert_msg(train_build(g, &o, &t, &d), "%s", d.msg);
    double w[64];
    int n = node_weights(g, w);
    ck_assert_int_eq(n, 6); /* Flatten, Gemm, Relu, Gemm, Relu, Gemm */
    for (int P = 1; P <= n; P++) check_balanced(g, P, w, n);
    StageSplit s;
    expect_error(stages_split(g, n + 1, NULL, 0, &s, &d), &d, "cannot split 6 forward nodes into 7 stages");
    graph_free(g);
}
END_TEST

START_TEST(balance_deep_chain) {
    TG k;
    int64_t widths[33];
    for (int i = 0; i <= 32; i++) widths[i] = 16 + 16 * ((i * 7) % 5); /* 16 .. 80, uneven */
    chain(&k, 32, widths, 4);
    double w[128];
    int n = node_weights(k.g, w);
    ck_assert_int_eq(n, 64);
    int Ps[] = {2, 3, 4, 8, 16, 64};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++) check_balanced(k.g, Ps[i], w, n);
    graph_free(k.g);
}
END_TEST

/* ---- user cut points ---- */

START_TEST(user_cuts) {
    TG k;
    uniform_chain(&k, 3, 8, 4); /* mm0 relu0 mm1 relu1 mm2 relu2 */
    Diag d = {0};
    int *st = malloc(sizeof *st * (size_t)k.g->n_nodes);
    const char *cuts[] = {"mm1", "mm2"};
    ck_assert_msg(stages_assign(k.g, 3, cuts, 2, st, &d), "%s", d.msg);
    const char *names[] = {"mm0", "relu0", "mm1", "relu1", "mm2", "relu2"};
    for (int i = 0; i < 6; i++) ck_assert_int_eq(st[node_named(k.g, names[i])->id], i / 2);
    GRAPH_FOR_NODES(k.g, n) {
        if (n->phase != PHASE_FORWARD) ck_assert_int_eq(st[n->id], -1);
    }

    const char *unknown[] = {"nope"};
    d = (Diag){0};
    expect_error(stages_assign(k.g, 2, unknown, 1, st, &d), &d, "no node named 'nope'");
    const char *backwards[] = {"mm2", "mm1"};
    d = (Diag){0};
    expect_error(stages_assign(k.g, 3, backwards, 2, st, &d), &d, "out of order: 'mm1'");
    const char *twice[] = {"mm1", "mm1"};
    d = (Diag){0};
    expect_error(stages_assign(k.g, 3, twice, 2, st, &d), &d, "'mm1' is named twice, which leaves stage 1 empty");
    const char *first[] = {"mm0"};
    d = (Diag){0};
    expect_error(stages_assign(k.g, 2, first, 1, st, &d), &d, "leaves stage 0 empty");
    d = (Diag){0};
    expect_error(stages_assign(k.g, 3, first, 1, st, &d), &d, "names 1 cut point for 3 stages; give 2");
    d = (Diag){0};
    expect_error(stages_assign(k.g, 7, NULL, 0, st, &d), &d, "cannot split 6 forward nodes into 7 stages");
    /* names of nodes the training graph added */
    const char *loss_name = NULL, *grad_name = NULL;
    GRAPH_FOR_NODES(k.g, n) {
        if (n->phase == PHASE_LOSS && !loss_name) loss_name = n->name;
        if (n->phase == PHASE_BACKWARD && !grad_name) grad_name = n->name;
    }
    const char *bad_loss[] = {loss_name}, *bad_grad[] = {grad_name};
    d = (Diag){0};
    expect_error(stages_assign(k.g, 2, bad_loss, 1, st, &d), &d, "is a loss node");
    d = (Diag){0};
    expect_error(stages_assign(k.g, 2, bad_grad, 1, st, &d), &d, "is a backward node");
    free(st);
    graph_free(k.g);
}
END_TEST

/* ---- cross-stage values ---- */

/* Stage 0: a = mm0(x), h0 = relu0(a).  Stage 1: h1 = relu1(mm1(h0)), or
 * mm1(a) when the middle stage also reads a.  Stage 2: e = add(mm2(h1), a),
 * y = mm3(e). */
static void skip_graph(TG *k, bool middle_reads_a) {
    tg_init(k, "skip");
    Value *x = tensor(k, "x", VAL_INPUT, 4, 8);
    Value *a = fwd(k, "mm0", "MatMul", x, tensor(k, "W0", VAL_INITIALIZER, 8, 8));
    Value *h0 = fwd(k, "relu0", "Relu", a, NULL);
    Value *m1 = fwd(k, "mm1", "MatMul", middle_reads_a ? a : h0, tensor(k, "W1", VAL_INITIALIZER, 8, 8));
    Value *h1 = fwd(k, "relu1", "Relu", m1, NULL);
    if (middle_reads_a) h1 = fwd(k, "mix1", "Add", h1, h0);
    Value *m2 = fwd(k, "mm2", "MatMul", h1, tensor(k, "W2", VAL_INITIALIZER, 8, 8));
    Value *e = fwd(k, "add2", "Add", m2, a);
    train(k, fwd(k, "mm3", "MatMul", e, tensor(k, "W3", VAL_INITIALIZER, 8, 4)), OPT_SGD);
}

START_TEST(skip_connection_not_relayed) {
    TG k;
    skip_graph(&k, false);
    const Value *a = node_named(k.g, "mm0")->out[0];
    const char *cuts[] = {"mm1", "mm2"};
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int si = 0; si < 2; si++) {
        Plan p;
        plan_ok(&k, 3, 2, scheds[si], cuts, 2, &p);
        for (int m = 0; m < 2; m++) {
            ck_assert_int_eq(count_steps(&p.ranks[0], STEP_SEND, a, 2, m), 1);
            ck_assert_int_eq(count_steps(&p.ranks[0], STEP_SEND, a, 1, m), 0);
            ck_assert_int_eq(count_steps(&p.ranks[2], STEP_RECV, a, 0, m), 1);
        }
        ck_assert_msg(!rank_mentions(&p.ranks[1], a), "stage 1 relays the skip connection");
        /* its gradient goes straight back from stage 2 to stage 0 */
        bool direct = false;
        for (int x = 0; x < p.n_xfers; x++) {
            const PlanXfer *t = &p.xfers[x];
            ck_assert_msg(!(t->src_stage == 1 && t->dst_stage == 2 && t->value == a), "relayed");
            if (t->dir == XFER_GRADIENT && t->src_stage == 2 && t->dst_stage == 0) direct = true;
            if (t->dir == XFER_ACTIVATION) ck_assert_int_gt(t->dst_stage, t->src_stage);
            if (t->dir == XFER_GRADIENT) ck_assert_int_lt(t->dst_stage, t->src_stage);
        }
        ck_assert_msg(direct, "no gradient sent from stage 2 to stage 0");
        for (int m = 0; m < 2; m++) ck_assert_int_ge(count_steps(&p.ranks[0], STEP_RECV, NULL, 2, m), 1);
    }
    graph_free(k.g);
}
END_TEST

START_TEST(value_read_by_two_later_stages) {
    TG k;
    skip_graph(&k, true);
    const Value *a = node_named(k.g, "mm0")->out[0];
    const char *cuts[] = {"mm1", "mm2"};
    Plan p;
    plan_ok(&k, 3, 4, "1f1b", cuts, 2, &p);
    for (int m = 0; m < 4; m++) {
        ck_assert_int_eq(count_steps(&p.ranks[0], STEP_SEND, a, 1, m), 1);
        ck_assert_int_eq(count_steps(&p.ranks[0], STEP_SEND, a, 2, m), 1);
        ck_assert_int_eq(count_steps(&p.ranks[1], STEP_RECV, a, 0, m), 1);
        ck_assert_int_eq(count_steps(&p.ranks[2], STEP_RECV, a, 0, m), 1);
        ck_assert_int_eq(count_steps(&p.ranks[1], STEP_SEND, a, -1, m), 0);
    }
    /* one tag per (micro-batch, tensor, direction): both sends share it */
    int tag[2] = {-1, -1};
    for (int i = 0; i < p.ranks[0].n_train; i++) {
        const PlanStep *s = &p.ranks[0].train[i];
        if (s->kind == STEP_SEND && s->value == a && s->micro == 3) tag[s->peer - 1] = s->tag;
    }
    ck_assert_int_ge(tag[0], 0);
    ck_assert_int_eq(tag[0], tag[1]);
    ck_assert_int_lt(tag[0], p.tag_bound);
    /* gradient contributions of a come back from both stages */
    int from1 = 0, from2 = 0;
    for (int x = 0; x < p.n_xfers; x++) {
        from1 += p.xfers[x].dir == XFER_GRADIENT && p.xfers[x].src_stage == 1 && p.xfers[x].dst_stage == 0;
        from2 += p.xfers[x].dir == XFER_GRADIENT && p.xfers[x].src_stage == 2 && p.xfers[x].dst_stage == 0;
    }
    ck_assert_int_ge(from1, 1);
    ck_assert_int_ge(from2, 1);
    graph_free(k.g);
}
END_TEST

/* ---- tied weights ---- */

START_TEST(tied_weight_gradient_exchange) {
    int Ms[] = {1, 4};
    OptKind opts[] = {OPT_SGD, OPT_MOMENTUM, OPT_ADAM};
    for (int mi = 0; mi < 2; mi++)
        for (int oi = 0; oi < 3; oi++) {
            TG k;
            tg_init(&k, "tied");
            Value *x = tensor(&k, "x", VAL_INPUT, 4, 8);
            Value *w = tensor(&k, "W", VAL_INITIALIZER, 8, 8);
            Value *h = fwd(&k, "relu0", "Relu", fwd(&k, "mm0", "MatMul", x, w), NULL);
            Value *h2 = fwd(&k, "relu1", "Relu", fwd(&k, "mm1", "MatMul", h, tensor(&k, "V", VAL_INITIALIZER, 8, 8)), NULL);
            train(&k, fwd(&k, "mm2", "MatMul", h2, w), opts[oi]); /* W again, on stage 1 */
            const char *cuts[] = {"mm1"};
            Plan p;
            int M = Ms[mi];
            plan_ok(&k, 2, M, "1f1b", cuts, 1, &p);
            Value *gw = NULL;
            for (int i = 0; i < k.t.n_params; i++)
                if (k.t.params[i] == w) gw = k.t.grads[i];
            ck_assert_ptr_nonnull(gw);
            int sends = 0, recvs = 0;
            for (int r = 0; r < 2; r++) {
                const RankPlan *rp = &p.ranks[r];
                int update = -1, exchange = -1, last_acc = -1;
                for (int i = 0; i < rp->n_train; i++) {
                    const PlanStep *s = &rp->train[i];
                    if (s->kind == STEP_COMPUTE && s->node->phase == PHASE_OPTIMIZER && s->node->in[0] == w) {
                        ck_assert_int_eq(s->micro, -1);
                        update = i;
                    }
                    if ((s->kind == STEP_SEND || s->kind == STEP_RECV) && s->value == gw) {
                        ck_assert_int_eq(p.xfers[s->xfer].dir, XFER_GRAD_SUM);
                        ck_assert_int_eq(s->micro, -1);
                        ck_assert_int_eq(s->peer, 1 - r);
                        exchange = i;
                        sends += s->kind == STEP_SEND;
                        recvs += s->kind == STEP_RECV;
                    }
                    if (s->kind == STEP_ACCUMULATE && s->value == gw) last_acc = i;
                }
                ck_assert_msg(update >= 0, "rank %d does not update the shared weight", r);
                ck_assert_msg(exchange >= 0, "rank %d does not exchange the shared weight's gradient", r);
                if (M > 1 && last_acc >= 0) ck_assert_int_lt(last_acc, exchange);
                ck_assert_int_lt(exchange, update);
                ck_assert(rp->holds[w->id] & HOLD_PERSISTENT);
                /* optimizer state of the shared weight lives on both */
                for (int j = 0; j < k.g->n_values; j++) {
                    const Value *v = k.g->values[j];
                    if (v->kind == VAL_STATE && strncmp(v->name, "W.", 2) == 0) ck_assert(rp->holds[v->id] & HOLD_PERSISTENT);
                }
            }
            ck_assert_int_eq(sends, 1);
            ck_assert_int_eq(recvs, 1);
            /* stage 1's contribution to W's gradient travels once per step,
             * not per micro-batch; per micro-batch only the activation's
             * gradient goes back */
            int partial = 0;
            for (int xi = 0; xi < p.n_xfers; xi++) {
                const PlanXfer *t = &p.xfers[xi];
                if (t->dir == XFER_GRADIENT) {
                    ck_assert_int_eq(t->src_stage, 1);
                    ck_assert_int_eq(plan_value_bytes(t->value), 4 * 8 * 4);
                }
                if (t->dir == XFER_GRAD_SUM && t->value != gw) {
                    ck_assert_int_eq(t->src_stage, 1);
                    ck_assert_int_eq(t->dst_stage, 0);
                    ck_assert_int_eq(plan_value_bytes(t->value), 8 * 8 * 4);
                    ck_assert_int_eq(count_steps(&p.ranks[1], STEP_SEND, t->value, 0, -2), 1);
                    ck_assert_int_eq(count_steps(&p.ranks[1], STEP_ACCUMULATE, t->value, -1, -2), M > 1 ? M : 0);
                    partial++;
                }
            }
            ck_assert_int_eq(partial, 1);
            graph_free(k.g);
        }
}
END_TEST

/* ---- schedules ---- */

START_TEST(schedule_orders) {
    SchedUnit u[64];
    Diag d = {0};
    int Ps[] = {2, 4}, Ms[] = {1, 4, 8};
    SchedKind ks[] = {SCHED_GPIPE, SCHED_1F1B};
    for (int pi = 0; pi < 2; pi++)
        for (int mi = 0; mi < 3; mi++)
            for (int ki = 0; ki < 2; ki++)
                for (int s = 0; s < Ps[pi]; s++) {
                    int P = Ps[pi], M = Ms[mi], most;
                    int n = schedule_units(ks[ki], P, s, M, u);
                    ck_assert_int_eq(n, 2 * M);
                    ck_assert_msg(schedule_check(ks[ki], P, s, M, u, n, &most, &d), "%s", d.msg);
                    for (int m = 0; m < M; m++) {
                        int f = -1, b = -1;
                        for (int i = 0; i < n; i++) {
                            if (u[i].micro != m) continue;
                            if (u[i].backward) b = i;
                            else f = i;
                        }
                        ck_assert(f >= 0 && b > f);
                    }
                    int want = ks[ki] == SCHED_GPIPE ? M : (M < P - s ? M : P - s);
                    ck_assert_msg(most == want, "%s P=%d s=%d M=%d: %d in flight, want %d",
                                  schedule_name(ks[ki]), P, s, M, most, want);
                }
    /* 1F1B on four stages, eight micro-batches */
    int n = schedule_units(SCHED_1F1B, 4, 0, 8, u);
    const char *want0 = "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 ";
    char got[256] = "";
    for (int i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%c%d ", u[i].backward ? 'B' : 'F', u[i].micro);
    ck_assert_str_eq(got, want0);
    n = schedule_units(SCHED_1F1B, 4, 3, 8, u);
    got[0] = '\0';
    for (int i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%c%d ", u[i].backward ? 'B' : 'F', u[i].micro);
    ck_assert_str_eq(got, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ");
    /* broken orders */
    SchedUnit bad[4] = {{true, 0}, {false, 0}, {false, 1}, {true, 1}};
    expect_error(schedule_check(SCHED_GPIPE, 2, 0, 2, bad, 4, NULL, &d), &d, "backward 0 before its forward");
    d = (Diag){0};
    n = schedule_units(SCHED_GPIPE, 4, 2, 8, u);
    expect_error(schedule_check(SCHED_1F1B, 4, 2, 8, u, n, NULL, &d), &d, "at most 2 allowed");
    d = (Diag){0};
    SchedKind k;
    expect_error(schedule_parse("zigzag", &k, &d), &d, "'zigzag' is not a pipeline schedule");
}
END_TEST

/* Per rank: every forward and backward node once per micro-batch, each
 * micro-batch's forward before its backward, updates once after all, and
 * the micro-batches in flight (from the first forward node of one to the
 * last backward node) within the schedule's bound. */
static void check_rank_order(const RankPlan *rp, int P, int M, bool one_f_one_b) {
    int fcount[64] = {0}, bcount[64] = {0}, first_f[64], last_f[64], first_b[64], last_b[64];
    for (int m = 0; m < M; m++) first_f[m] = last_f[m] = first_b[m] = last_b[m] = -1;
    int updates = 0, accs = 0, last_unit = -1;
    for (int i = 0; i < rp->n_train; i++) {
        const PlanStep *s = &rp->train[i];
        if (s->kind == STEP_ACCUMULATE) accs++;
        if (s->kind != STEP_COMPUTE) continue;
        NodePhase ph = s->node->phase;
        if (ph == PHASE_OPTIMIZER) {
            ck_assert_int_eq(s->micro, -1);
            ck_assert_int_gt(i, last_unit);
            updates++;
            continue;
        }
        int m = s->micro;
        ck_assert(m >= 0 && m < M);
        last_unit = i;
        if (ph == PHASE_BACKWARD) {
            if (first_b[m] < 0) first_b[m] = i;
            last_b[m] = i;
            bcount[m]++;
        } else {
            if (first_f[m] < 0) first_f[m] = i;
            last_f[m] = i;
            fcount[m]++;
        }
    }
    for (int m = 0; m < M; m++) {
        ck_assert_int_gt(fcount[m], 0);
        ck_assert_int_eq(fcount[m], fcount[0]);
        ck_assert_int_eq(bcount[m], bcount[0]);
        if (bcount[m]) ck_assert_msg(first_b[m] > last_f[m], "rank %d: backward of micro-batch %d before its forward ends",
                                     rp->rank, m);
    }
    ck_assert_int_eq(accs, M > 1 ? M * updates : 0); /* one gradient per update, no shared weights */
    if (!bcount[0]) return;
    int most = 0;
    for (int m = 0; m < M; m++) {
        int live = 0;
        for (int q = 0; q < M; q++) live += first_f[q] <= first_f[m] && last_b[q] > first_f[m];
        if (live > most) most = live;
    }
    ck_assert_int_eq(most, rp->max_inflight);
    if (one_f_one_b) ck_assert_int_le(most, P - rp->stage);
    else ck_assert_int_eq(most, M);
}

START_TEST(pipeline_plans_on_a_chain) {
    TG k;
    uniform_chain(&k, 8, 16, 2);
    int Ps[] = {2, 4}, Ms[] = {1, 4, 8};
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int pi = 0; pi < 2; pi++)
        for (int mi = 0; mi < 3; mi++)
            for (int si = 0; si < 2; si++) {
                Plan p;
                int P = Ps[pi], M = Ms[mi];
                plan_ok(&k, P, M, scheds[si], NULL, 0, &p);
                ck_assert_str_eq(strategy_name(p.strategy), "pipeline");
                ck_assert_int_eq(p.n_ranks, P);
                ck_assert_int_eq(p.microbatches, M);
                for (int r = 0; r < P; r++) {
                    ck_assert_int_eq(p.ranks[r].stage, r);
                    ck_assert_ptr_nonnull(p.ranks[r].offset);
                    ck_assert_ptr_nonnull(p.ranks[r].inst);
                    check_rank_order(&p.ranks[r], P, M, si == 1);
                    /* graph input on the first stage, labels and loss on the last */
                    ck_assert_int_eq(p.ranks[r].holds[k.g->inputs[0]->id] != 0, r == 0);
                    ck_assert_int_eq(p.ranks[r].holds[k.t.labels->id] != 0, r == P - 1);
                    ck_assert_int_eq(p.ranks[r].holds[k.t.loss->id] != 0, r == P - 1);
                }
            }
    Plan p;
    plan_ok(&k, 4, 1, "layer", NULL, 0, &p);
    ck_assert_str_eq(strategy_name(p.strategy), "layer");
    Diag d = {0};
    expect_error(plan_pipeline(k.g, &k.t, 8, 4, 4, "layer", NULL, 0, &p, &d), &d, "schedule layer planned with 4 micro-batches");
    ck_assert_int_eq(d.code, DIAG_INTERNAL); /* the flags are checked before (compile_options.c) */
    d = (Diag){0};
    expect_error(plan_pipeline(k.g, &k.t, 6, 2, 4, "gpipe", NULL, 0, &p, &d), &d, "--batch 6 does not divide");
    d = (Diag){0};
    expect_error(plan_pipeline(k.g, &k.t, 8, 2, 4, "zigzag", NULL, 0, &p, &d), &d, "not a pipeline schedule");
    graph_free(k.g);
}
END_TEST

START_TEST(hybrid_plan) {
    TG k;
    uniform_chain(&k, 4, 16, 2);
    Plan p;
    Diag d = {0};
    ck_assert_msg(plan_hybrid(k.g, &k.t, 8, 2, 2, 2, "1f1b", NULL, 0, 25, &p, &d), "%s", d.msg);
    ck_assert_str_eq(strategy_name(p.strategy), "hybrid");
    ck_assert_int_eq(p.n_ranks, 4);
    ck_assert_int_eq(p.local_batch, 4);
    ck_assert_int_eq(p.micro_batch, 2);
    ck_assert_int_eq(p.n_groups, 2);
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(p.groups[s].n, 2);
        ck_assert_int_eq(p.groups[s].ranks[0], s);
        ck_assert_int_eq(p.groups[s].ranks[1], 2 + s);
    }
    for (int r = 0; r < 4; r++) {
        const RankPlan *rp = &p.ranks[r];
        ck_assert_int_eq(rp->stage, r % 2);
        ck_assert_int_eq(rp->replica, r / 2);
        /* Each gradient is in one bucket, summed over the stage's replicas:
         * started after its last micro-batch's accumulation, awaited before
         * any update. */
        int members = 0, updates = 0, started = 0, waited = 0;
        for (int b = 0; b < rp->n_buckets; b++) {
            members += rp->buckets[b].n;
            ck_assert_int_gt(rp->buckets[b].bytes, 0);
        }
        for (int i = 0; i < rp->n_train; i++) {
            const PlanStep *s = &rp->train[i];
            if (s->kind == STEP_ALLREDUCE_START) {
                ck_assert_int_eq(s->group, rp->stage);
                const Bucket *bk = &rp->buckets[s->bucket];
                for (int j = 0; j < bk->n; j++) {
                    int last_acc = -1;
                    for (int t = 0; t < rp->n_train; t++)
                        if (rp->train[t].kind == STEP_ACCUMULATE && rp->train[t].value == bk->grads[j]) last_acc = t;
                    ck_assert_int_ge(last_acc, 0);
                    ck_assert_int_lt(last_acc, i);
                    ck_assert_int_eq(rp->train[last_acc].micro, 1);
                }
                started++;
            }
            if (s->kind == STEP_ALLREDUCE_WAIT) {
                ck_assert_int_eq(updates, 0);
                waited++;
            }
            ck_assert(s->kind != STEP_ALLREDUCE); /* no tied weights: nothing summed once per step */
            if (s->kind == STEP_COMPUTE && s->node->phase == PHASE_OPTIMIZER) updates++;
            if (s->kind == STEP_SEND || s->kind == STEP_RECV) ck_assert_int_eq(s->peer / 2, rp->replica);
        }
        ck_assert_int_gt(updates, 0);
        ck_assert_int_eq(members, updates);
        ck_assert_int_eq(started, rp->n_buckets);
        ck_assert_int_eq(waited, rp->n_buckets);
    }
    graph_free(k.g);
}
END_TEST

START_TEST(out_of_memory_at_every_allocation) {
    int failures = 0;
    bool planned = false;
    for (long nth = 1; nth < 4000 && !planned; nth++) {
        TG k;
        skip_graph(&k, true);
        Plan p;
        Diag d = {0};
        arena_fail_after(nth);
        bool ok = plan_hybrid(k.g, &k.t, 16, 2, 3, 2, "1f1b", NULL, 0, 25, &p, &d);
        arena_fail_after(0);
        graph_free(k.g);
        planned = ok; /* nth is past the last allocation */
        if (ok) break;
        ck_assert_msg(d.code == DIAG_NOMEM, "allocation %ld: expected out of memory, got: %s", nth, d.msg);
        failures++;
    }
    ck_assert(planned);
    ck_assert_int_gt(failures, 10);
}
END_TEST

/* ---- memory plans ---- */

/* The instance slot (micro + 1) a step of micro-batch `micro` uses for v,
 * by the rule plan.h states; -1 when there is none. */
static int slot_of(const Plan *p, const RankPlan *rp, const Value *v, int micro) {
    int S = p->microbatches + 1;
    const int64_t *row = &rp->inst[(size_t)v->id * (size_t)S];
    if (row[micro + 1] >= 0) return micro + 1;
    if (micro >= 0) return row[0] >= 0 ? 0 : -1;
    return row[1] >= 0 ? 1 : -1;
}

typedef struct Life {
    int first, last;
    bool written_first;
} Life;

/* One buffer access of step t; checks that it has a buffer and that
 * pipeline_buffer agrees. */
static void access(const Plan *p, const RankPlan *rp, Life *life, const char *which, int t, const Value *v, int micro,
                   bool write) {
    int S = p->microbatches + 1;
    int slot = write ? micro + 1 : slot_of(p, rp, v, micro);
    ck_assert_msg(slot >= 0, "rank %d %s step %d: '%s' (micro-batch %d) has no buffer", rp->rank, which, t, v->name,
                  micro);
    size_t k = (size_t)v->id * (size_t)S + (size_t)slot;
    ck_assert_msg(rp->inst[k] >= 0, "rank %d %s step %d: '%s' (micro-batch %d) has no buffer", rp->rank, which, t,
                  v->name, micro);
    if (!write) ck_assert_int_eq(pipeline_buffer(p, rp, v, micro), rp->inst[k]);
    Life *l = &life[k];
    if (l->first < 0) {
        l->first = t;
        l->written_first = write;
    }
    if (t > l->last) l->last = t;
}

static bool ranges_overlap(int64_t a, int64_t an, int64_t b, int64_t bn) {
    return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

/* Brute force over a step sequence: every instance a step names has a
 * buffer; each transient instance is first written (computed or received),
 * lives to its last access, to the end when it is sent or is the loss or
 * an output; at no step do two live instances share a byte, except an
 * in-place op's input dying into its output. */
static void check_memory_seq(const Plan *p, const RankPlan *rp, const PlanStep *seq, int n, const char *which) {
    const Graph *g = p->g;
    int S = p->microbatches + 1;
    size_t cells = (size_t)g->n_values * (size_t)S;
    Life *life = malloc(sizeof *life * cells);
    for (size_t k = 0; k < cells; k++) life[k] = (Life){-1, -1, false};
    /* a sent instance is pinned until the wait completing its last send */
    int *pin_end = malloc(sizeof *pin_end * cells), *open_sends = calloc(cells, sizeof *open_sends);
    for (size_t k = 0; k < cells; k++) pin_end[k] = -1;
    for (int t = 0; t < n; t++) {
        const PlanStep *s = &seq[t];
        switch (s->kind) {
        case STEP_COMPUTE:
            for (int k = 0; k < s->node->n_in; k++)
                if (s->node->in[k]) access(p, rp, life, which, t, s->node->in[k], s->micro, false);
            for (int k = 0; k < s->node->n_out; k++)
                if (s->node->out[k]) access(p, rp, life, which, t, s->node->out[k], s->micro, true);
            break;
        case STEP_SEND: {
            access(p, rp, life, which, t, s->value, s->micro, false);
            size_t k = (size_t)s->value->id * (size_t)S + (size_t)slot_of(p, rp, s->value, s->micro);
            open_sends[k]++;
            pin_end[k] = n;
            break;
        }
        case STEP_SEND_WAIT: {
            size_t k = (size_t)s->value->id * (size_t)S + (size_t)slot_of(p, rp, s->value, s->micro);
            int sends = 0, waits = 0; /* this very send came before, once */
            for (int u = 0; u < t; u++) {
                sends += seq[u].kind == STEP_SEND && seq[u].peer == s->peer && seq[u].tag == s->tag;
                waits += seq[u].kind == STEP_SEND_WAIT && seq[u].peer == s->peer && seq[u].tag == s->tag;
            }
            ck_assert_msg(sends == 1 && waits == 0, "rank %d %s step %d waits for a send made %d times, waited %d times",
                          rp->rank, which, t, sends, waits);
            if (--open_sends[k] == 0) pin_end[k] = t;
            break;
        }
        case STEP_RECV:
            access(p, rp, life, which, t, s->value, s->micro, true);
            break;
        case STEP_ACCUMULATE: {
            ck_assert_int_ge(s->micro, 0);
            ck_assert_int_eq(slot_of(p, rp, s->value, s->micro), s->micro + 1);
            access(p, rp, life, which, t, s->value, s->micro, false);
            int64_t acc = rp->inst[(size_t)s->value->id * (size_t)S];
            ck_assert_msg(acc >= 0 && acc < rp->init_bytes, "rank %d: accumulator of '%s' not persistent", rp->rank,
                          s->value->name);
            break;
        }
        case STEP_ALLREDUCE:
            access(p, rp, life, which, t, s->value, -1, false);
            break;
        default:
            break;
        }
    }
    /* instances: region bounds, persistent ones disjoint */
    int *idx = malloc(sizeof *idx * (cells + 1));
    int n_idx = 0;
    for (size_t k = 0; k < cells; k++) {
        int64_t off = rp->inst[k];
        if (off < 0) continue;
        const Value *v = g->values[k / (size_t)S];
        int64_t b = plan_value_bytes(v);
        ck_assert(off + b <= rp->arena_bytes);
        if (off < rp->init_bytes) {
            ck_assert(off + b <= rp->init_bytes);
            for (int j = 0; j < n_idx; j++) {
                int64_t o2 = rp->inst[idx[j]];
                if (o2 < rp->init_bytes)
                    ck_assert_msg(!ranges_overlap(off, b, o2, plan_value_bytes(g->values[idx[j] / S])),
                                  "rank %d: persistent '%s' and '%s' overlap", rp->rank, v->name,
                                  g->values[idx[j] / S]->name);
            }
        } else {
            ck_assert_int_eq(off % PLAN_ALIGN, 0);
            Life *l = &life[k];
            if (l->first >= 0) {
                ck_assert_msg(l->written_first, "rank %d %s: '%s' (micro-batch %d) is read at step %d before it is written",
                              rp->rank, which, v->name, (int)(k % (size_t)S) - 1, l->first);
                bool keep = v == p->t->loss || v == p->t->output || v->is_output;
                if (pin_end[k] > l->last) l->last = pin_end[k];
                if (keep) l->last = n;
            }
        }
        idx[n_idx++] = (int)k;
    }
    /* transient instances live at each step */
    int *live = malloc(sizeof *live * (cells + 1));
    for (int t = 0; t <= n; t++) {
        int n_live = 0;
        for (int j = 0; j < n_idx; j++) {
            int k = idx[j];
            if (rp->inst[k] >= rp->init_bytes && life[k].first >= 0 && life[k].first <= t && t <= life[k].last)
                live[n_live++] = k;
        }
        const PlanStep *s = t < n ? &seq[t] : NULL;
        for (int a = 0; a < n_live; a++)
            for (int b = a + 1; b < n_live; b++) {
                int ka = live[a], kb = live[b];
                const Value *va = g->values[ka / S], *vb = g->values[kb / S];
                if (!ranges_overlap(rp->inst[ka], plan_value_bytes(va), rp->inst[kb], plan_value_bytes(vb))) continue;
                /* in place: input 0 dies at this step into output 0 */
                bool in_place = false;
                if (s && s->kind == STEP_COMPUTE && s->node->def && s->node->def->inplace && s->node->n_in > 0 &&
                    s->node->n_out > 0 && s->node->in[0] && s->node->out[0] && rp->inst[ka] == rp->inst[kb]) {
                    int kin = s->node->in[0]->id * S + slot_of(p, rp, s->node->in[0], s->micro);
                    int kout = s->node->out[0]->id * S + s->micro + 1;
                    in_place = ((ka == kin && kb == kout) || (kb == kin && ka == kout)) && life[kin].last == t &&
                               life[kout].first == t;
                }
                ck_assert_msg(in_place, "rank %d %s step %d: '%s' (micro-batch %d, [%lld, +%lld)) and '%s' (micro-batch %d, [%lld, +%lld)) are both live and overlap",
                              rp->rank, which, t, va->name, ka % S - 1, (long long)rp->inst[ka],
                              (long long)plan_value_bytes(va), vb->name, kb % S - 1, (long long)rp->inst[kb],
                              (long long)plan_value_bytes(vb));
            }
    }
    free(live);
    free(idx);
    free(pin_end);
    free(open_sends);
    free(life);
}

/* Both sequences of every rank, and the inputs' instances back to back. */
static void check_memory(const Plan *p) {
    int S = p->microbatches + 1;
    for (int r = 0; r < p->n_ranks; r++) {
        const RankPlan *rp = &p->ranks[r];
        ck_assert_ptr_nonnull(rp->inst);
        ck_assert_int_le(rp->init_bytes, rp->arena_bytes);
        ck_assert_int_le(rp->arena_bytes - rp->init_bytes, rp->transient_naive);
        check_memory_seq(p, rp, rp->train, rp->n_train, "train");
        check_memory_seq(p, rp, rp->eval, rp->n_eval, "eval");
        /* inputs, and the loss and output where computed: M instances
         * back to back in the persistent region */
        const Value *fed[16];
        int n_fed = 0;
        for (int i = 0; i < p->g->n_inputs && n_fed < 14; i++) fed[n_fed++] = p->g->inputs[i];
        if (rp->holds[p->t->loss->id] & HOLD_COMPUTED) fed[n_fed++] = p->t->loss;
        if (rp->holds[p->t->output->id] & HOLD_COMPUTED) fed[n_fed++] = p->t->output;
        for (int i = 0; i < n_fed; i++) {
            const Value *x = fed[i];
            const int64_t *row = &rp->inst[(size_t)x->id * (size_t)S];
            ck_assert_int_eq(row[0], -1);
            ck_assert_int_eq(row[1] >= 0, rp->holds[x->id] != 0);
            if (row[1] >= 0) ck_assert_int_le(row[1] + p->microbatches * plan_value_bytes(x), rp->init_bytes);
            for (int m = 1; m < p->microbatches && row[1] >= 0; m++)
                ck_assert_int_eq(row[m + 1], row[1] + m * plan_value_bytes(x));
        }
    }
}

START_TEST(memory_plans_never_overlap) {
    TG k;
    uniform_chain(&k, 8, 16, 2);
    int Ps[] = {2, 4}, Ms[] = {1, 4, 8};
    const char *scheds[] = {"gpipe", "1f1b"};
    for (int pi = 0; pi < 2; pi++)
        for (int mi = 0; mi < 3; mi++)
            for (int si = 0; si < 2; si++) {
                Plan p;
                plan_ok(&k, Ps[pi], Ms[mi], scheds[si], NULL, 0, &p);
                check_memory(&p);
            }
    Plan p;
    plan_ok(&k, 4, 1, "layer", NULL, 0, &p);
    check_memory(&p);
    /* the first stage's activations sent to the second are held until
     * their sends complete, before the backward of their micro-batch: under
     * 1F1B at most max_inflight (P) of the eight share the stage's memory at
     * once, so their buffers are reused; GPipe keeps all eight apart.  The
     * allocator places every value of the stage lowest-offset first, so a
     * freed slot may go to another value of the same size and the eight
     * need not fit in exactly P slots: the test asks for reuse, and for a
     * smaller arena than GPipe's. */
    int64_t arena[2] = {0, 0};
    for (int g = 0; g < 2; g++) {
        plan_ok(&k, 4, 8, g ? "gpipe" : "1f1b", NULL, 0, &p);
        const RankPlan *r0 = &p.ranks[0];
        const Value *sent = NULL;
        for (int i = 0; i < r0->n_train && !sent; i++)
            if (r0->train[i].kind == STEP_SEND) sent = r0->train[i].value;
        ck_assert_ptr_nonnull(sent);
        int distinct = 0;
        for (int a = 0; a < 8; a++) {
            bool seen = false;
            for (int b = 0; b < a; b++) seen |= pipeline_buffer(&p, r0, sent, a) == pipeline_buffer(&p, r0, sent, b);
            distinct += !seen;
        }
        if (g) ck_assert_int_eq(distinct, 8);
        else ck_assert_int_lt(distinct, 8);
        arena[g] = r0->arena_bytes;
        int waits = 0;
        for (int i = 0; i < r0->n_train; i++) waits += r0->train[i].kind == STEP_SEND_WAIT;
        ck_assert_int_eq(waits, 8); /* one per activation sent; the rest complete at the end of the step */
    }
    ck_assert_int_lt(arena[0], arena[1]);
    graph_free(k.g);

    /* skip connections, a value read by two later stages */
    for (int mid = 0; mid < 2; mid++) {
        skip_graph(&k, mid);
        const char *cuts[] = {"mm1", "mm2"};
        plan_ok(&k, 3, 4, "1f1b", cuts, 2, &p);
        check_memory(&p);
        plan_ok(&k, 3, 2, "gpipe", cuts, 2, &p);
        check_memory(&p);
        graph_free(k.g);
    }
    /* tied weights: accumulated partial sums, gradient sums received at
     * micro -1, updates on two stages */
    int Mt[] = {1, 4};
    for (int mi = 0; mi < 2; mi++) {
        tg_init(&k, "tied");
        Value *x = tensor(&k, "x", VAL_INPUT, 4, 8);
        Value *w = tensor(&k, "W", VAL_INITIALIZER, 8, 8);
        Value *h = fwd(&k, "relu0", "Relu", fwd(&k, "mm0", "MatMul", x, w), NULL);
        Value *h2 = fwd(&k, "relu1", "Relu", fwd(&k, "mm1", "MatMul", h, tensor(&k, "V", VAL_INITIALIZER, 8, 8)), NULL);
        train(&k, fwd(&k, "mm2", "MatMul", h2, w), OPT_ADAM);
        const char *cuts[] = {"mm1"};
        plan_ok(&k, 2, Mt[mi], "1f1b", cuts, 1, &p);
        check_memory(&p);
        /* the shared weight's optimizer state is held on both stages */
        for (int r = 0; r < 2; r++) ck_assert_int_lt(p.ranks[r].offset[w->id], p.ranks[r].init_bytes);
        graph_free(k.g);
    }
}
END_TEST

/* Stage 0 of four: 1F1B keeps at most four micro-batches' activations
 * whatever M is, GPipe keeps all M. */
START_TEST(peak_activation_memory) {
    TG k;
    uniform_chain(&k, 8, 32, 4);
    enum { P = 4 };
    int64_t one[P], f1b[3][P], gp[3][P], f1b_arena[3][P], f1b_sent[3][P];
    int Ms[] = {4, 8, 16};
    Plan p;
    plan_ok(&k, P, 1, "gpipe", NULL, 0, &p);
    for (int s = 0; s < P; s++) {
        one[s] = p.ranks[s].peak_act_bytes;
        ck_assert_int_gt(one[s], 0);
    }
    for (int mi = 0; mi < 3; mi++) {
        plan_ok(&k, P, Ms[mi], "1f1b", NULL, 0, &p);
        for (int s = 0; s < P; s++) {
            f1b[mi][s] = p.ranks[s].peak_act_bytes;
            f1b_arena[mi][s] = p.ranks[s].arena_bytes;
            f1b_sent[mi][s] = p.ranks[s].send_pinned_bytes;
            ck_assert_int_lt(p.ranks[s].peak_act_step, p.ranks[s].n_train);
        }
        plan_ok(&k, P, Ms[mi], "gpipe", NULL, 0, &p);
        for (int s = 0; s < P; s++) gp[mi][s] = p.ranks[s].peak_act_bytes;
        if (getenv("SHOW_MEMORY"))
            for (int s = 0; s < P; s++)
                fprintf(stderr, "M=%d stage %d: activation peak 1f1b %lld, gpipe %lld; arena 1f1b %lld (sends %lld), gpipe %lld (sends %lld)\n",
                        Ms[mi], s, (long long)f1b[mi][s], (long long)gp[mi][s], (long long)f1b_arena[mi][s],
                        (long long)f1b_sent[mi][s], (long long)p.ranks[s].arena_bytes,
                        (long long)p.ranks[s].send_pinned_bytes);
    }
    for (int s = 0; s < P; s++) {
        for (int mi = 0; mi < 3; mi++) {
            int inflight = Ms[mi] < P - s ? Ms[mi] : P - s;
            ck_assert_msg(f1b[mi][s] <= inflight * one[s], "1f1b M=%d stage %d: peak %lld > %d x %lld", Ms[mi], s,
                          (long long)f1b[mi][s], inflight, (long long)one[s]);
            ck_assert_int_le(f1b[mi][s], gp[mi][s]);
        }
        /* flat for 1F1B */
        ck_assert_int_eq(f1b[0][s], f1b[1][s]);
        ck_assert_int_eq(f1b[1][s], f1b[2][s]);
        /* about linear for GPipe: doubling M nearly doubles the peak */
        for (int mi = 0; mi < 2; mi++) {
            ck_assert_msg(gp[mi + 1][s] * 10 >= gp[mi][s] * 17 && gp[mi + 1][s] <= gp[mi][s] * 2,
                          "gpipe stage %d: peak %lld at M=%d, %lld at M=%d", s, (long long)gp[mi][s], Ms[mi],
                          (long long)gp[mi + 1][s], Ms[mi + 1]);
            ck_assert_int_ge(gp[mi][s], Ms[mi] * one[s] / 2);
        }
    }
    ck_assert_int_lt(f1b[2][0] * 3, gp[2][0]);
    graph_free(k.g);
}
END_TEST

/* The layer strategy splits the single-rank plan's work over the ranks:
 * no rank needs more than the single-rank arena, and all together need no
 * more than it plus a copy of each value crossing stages per rank that
 * holds one. */
START_TEST(layer_memory_against_single_rank) {
    int layers[] = {4, 8};
    for (int li = 0; li < 2; li++) {
        TG k;
        uniform_chain(&k, layers[li], 32, 8);
        Plan single, layer;
        Diag d = {0};
        ck_assert_msg(plan_single(k.g, &k.t, 8, &single, &d), "%s", d.msg);
        plan_ok(&k, 4, 1, "layer", NULL, 0, &layer);
        check_memory(&layer);
        int64_t sum = 0, crossing = 0;
        for (int x = 0; x < layer.n_xfers; x++) crossing += 2 * ((plan_value_bytes(layer.xfers[x].value) + 63) / 64 * 64);
        for (int r = 0; r < 4; r++) {
            const RankPlan *rp = &layer.ranks[r];
            ck_assert_msg(rp->arena_bytes <= single.ranks[0].arena_bytes, "rank %d: %lld bytes, single rank %lld", r,
                          (long long)rp->arena_bytes, (long long)single.ranks[0].arena_bytes);
            ck_assert_int_le(rp->init_bytes, single.ranks[0].init_bytes);
            sum += rp->arena_bytes;
        }
        if (getenv("SHOW_MEMORY"))
            fprintf(stderr, "%d layers: single %lld (persistent %lld), layer ranks sum %lld, crossing %lld\n",
                    layers[li], (long long)single.ranks[0].arena_bytes, (long long)single.ranks[0].init_bytes,
                    (long long)sum, (long long)crossing);
        ck_assert_int_le(sum, single.ranks[0].arena_bytes + crossing);
        graph_free(k.g);
    }
}
END_TEST

/* Replicas of a stage run one program: the same layout.  The planner
 * plans replica 0's memory and shares it; planning each replica's own
 * steps from scratch must give the same. */
START_TEST(hybrid_replicas_share_a_layout) {
    TG k;
    skip_graph(&k, true);
    Plan p;
    Diag d = {0};
    ck_assert_msg(plan_hybrid(k.g, &k.t, 16, 2, 3, 2, "1f1b", NULL, 0, 25, &p, &d), "%s", d.msg);
    check_memory(&p);
    size_t cells = (size_t)k.g->n_values * 3;
    for (int s = 0; s < 3; s++) {
        const RankPlan *a = &p.ranks[s];
        RankPlan own = p.ranks[3 + s], *b = &own;
        ck_assert_ptr_eq(own.inst, a->inst); /* shared */
        own.inst = NULL;
        own.offset = NULL;
        ck_assert_msg(pipeline_memplan(&p, b, &d), "%s", d.msg);
        ck_assert_ptr_ne(own.inst, a->inst);
        ck_assert(memcmp(a->offset, b->offset, sizeof *a->offset * (size_t)k.g->n_values) == 0);
        ck_assert_int_eq(a->send_pinned_bytes, b->send_pinned_bytes);
        ck_assert_int_eq(a->transient_naive, b->transient_naive);
        ck_assert_int_eq(a->arena_bytes, b->arena_bytes);
        ck_assert_int_eq(a->init_bytes, b->init_bytes);
        ck_assert_int_eq(a->peak_act_bytes, b->peak_act_bytes);
        ck_assert(memcmp(a->inst, b->inst, sizeof *a->inst * cells) == 0);
    }
    graph_free(k.g);
}
END_TEST

/* ---- the communication checker ---- */

#define SEND(p, t, b) ((PlanStep){.kind = STEP_SEND, .peer = (p), .tag = (t), .bytes = (b)})
#define RECV(p, t, b) ((PlanStep){.kind = STEP_RECV, .peer = (p), .tag = (t), .bytes = (b)})
#define AR(g, b) ((PlanStep){.kind = STEP_ALLREDUCE, .group = (g), .bytes = (b)})
#define WORK ((PlanStep){.kind = STEP_COMPUTE})

static bool run(int n, const PlanStep *r0, int n0, const PlanStep *r1, int n1, const PlanStep *r2, int n2,
                const PlanGroup *groups, int n_groups, Diag *d) {
    const PlanStep *seq[3] = {r0, r1, r2};
    int len[3] = {n0, n1, n2};
    *d = (Diag){0};
    return comm_check(n, seq, len, groups, n_groups, "test", d);
}

START_TEST(comm_check_sequences) {
    Diag d;
    /* ping-pong with local work in between */
    PlanStep a0[] = {WORK, SEND(1, 1, 100), WORK, RECV(1, 2, 50)}, a1[] = {RECV(0, 1, 100), WORK, SEND(0, 2, 50)};
    ck_assert_msg(run(2, a0, 4, a1, 3, NULL, 0, NULL, 0, &d), "%s", d.msg);
    /* with tags, receives may come in another order than the sends */
    PlanStep b0[] = {SEND(1, 1, 8), SEND(1, 2, 8)}, b1[] = {RECV(0, 2, 8), RECV(0, 1, 8)};
    ck_assert_msg(run(2, b0, 2, b1, 2, NULL, 0, NULL, 0, &d), "%s", d.msg);
    /* mismatched size */
    PlanStep c1[] = {RECV(0, 1, 200), WORK, SEND(0, 2, 50)};
    ck_assert(!run(2, a0, 4, c1, 3, NULL, 0, NULL, 0, &d));
    ck_assert_str_eq(d.msg, "test: size mismatch: rank 1 step 0 receives 200 bytes from rank 0 (tag 1) but rank 0 step 1 sends 100 bytes");
    /* wrong peer */
    PlanStep w0[] = {SEND(2, 1, 100)}, w1[] = {RECV(0, 1, 100)}, w2[] = {WORK};
    ck_assert(!run(3, w0, 1, w1, 1, w2, 1, NULL, 0, &d));
    ck_assert_str_eq(d.msg, "test: rank 1 step 0 (recv from rank 0 (tag 1, 100 bytes)) never completes: rank 0 step 0 sent tag 1 to rank 2 instead");
    /* swapped order: each waits for the other */
    PlanStep s0[] = {WORK, RECV(1, 2, 50), SEND(1, 1, 100)}, s1[] = {RECV(0, 1, 100), SEND(0, 2, 50)};
    ck_assert(!run(2, s0, 3, s1, 2, NULL, 0, NULL, 0, &d));
    ck_assert_str_eq(d.msg, "test: deadlock: rank 0 step 1 (recv from rank 1 (tag 2, 50 bytes)) waits for rank 1 step 0 (recv from rank 0 (tag 1, 100 bytes)) waits for rank 0");
    /* missing receive */
    PlanStep m1[] = {WORK};
    ck_assert(!run(2, a0, 2, m1, 1, NULL, 0, NULL, 0, &d));
    ck_assert_str_eq(d.msg, "test: rank 0 step 1 sends (tag 1, 100 bytes) to rank 1, which never receives it");
    /* missing send */
    ck_assert(!run(2, m1, 1, a1, 1, NULL, 0, NULL, 0, &d));
    ck_assert_msg(strstr(d.msg, "rank 1 step 0 (recv from rank 0 (tag 1, 100 bytes)) never completes: rank 0 finished without sending it") != NULL, "%s", d.msg);
    /* a tag reused while in flight */
    PlanStep t0[] = {SEND(1, 3, 8), SEND(1, 3, 8)}, t1[] = {RECV(0, 3, 8), RECV(0, 3, 8)};
    ck_assert(!run(2, t0, 2, t1, 2, NULL, 0, NULL, 0, &d));
    ck_assert_msg(strstr(d.msg, "rank 0 step 1 sends tag 3 to rank 1 while its message with that tag from step 0 is still unreceived") != NULL, "%s", d.msg);
    /* no such rank, or itself */
    PlanStep x0[] = {SEND(5, 1, 8)}, y0[] = {RECV(0, 1, 8)};
    ck_assert(!run(2, x0, 1, m1, 1, NULL, 0, NULL, 0, &d));
    ck_assert_msg(strstr(d.msg, "rank 0 step 0: send to rank 5 (tag 1, 8 bytes): no such rank") != NULL, "%s", d.msg);
    ck_assert(!run(2, y0, 1, m1, 1, NULL, 0, NULL, 0, &d));
    ck_assert_msg(strstr(d.msg, "cannot receive from itself") != NULL, "%s", d.msg);

    /* collectives */
    int g01[] = {0, 1}, g2[] = {2}, g02[] = {0, 2};
    PlanGroup groups[] = {{2, g01}, {1, g2}, {2, g02}};
    PlanStep c0[] = {AR(0, 64), SEND(2, 1, 8)}, cc1[] = {WORK, AR(0, 64)}, cc2[] = {AR(1, 16), RECV(0, 1, 8)};
    ck_assert_msg(run(3, c0, 2, cc1, 2, cc2, 2, groups, 3, &d), "%s", d.msg);
    PlanStep bad1[] = {AR(0, 32)};
    ck_assert(!run(3, c0, 2, bad1, 1, cc2, 2, groups, 3, &d));
    ck_assert_str_eq(d.msg, "test: collective mismatch: rank 0 step 0 does allreduce over group 0 (64 bytes) but rank 1 step 0 does allreduce over group 0 (32 bytes)");
    PlanStep notmember[] = {AR(1, 16)};
    ck_assert(!run(3, c0, 2, notmember, 1, cc2, 2, groups, 3, &d));
    ck_assert_msg(strstr(d.msg, "rank 1 step 0 allreduces over group 1, which it is not a member of") != NULL, "%s", d.msg);
    /* collective against a receive: rank 0 waits in the allreduce for rank
     * 1, which waits for a message rank 0 sends only after it */
    PlanStep o0[] = {AR(0, 8), SEND(1, 4, 8)}, o1[] = {RECV(0, 4, 8), AR(0, 8)};
    ck_assert(!run(2, o0, 2, o1, 2, NULL, 0, groups, 1, &d));
    ck_assert_str_eq(d.msg, "test: deadlock: rank 0 step 0 (allreduce over group 0 (8 bytes)) waits for rank 1 step 0 (recv from rank 0 (tag 4, 8 bytes)) waits for rank 0");
    /* a member that never joins */
    PlanStep lone[] = {AR(2, 8)}, none[] = {WORK};
    ck_assert(!run(3, lone, 1, m1, 1, none, 1, groups, 3, &d));
    /* a blocking allreduce and a bucket's start over the same group do not
     * meet, however the buckets and sizes compare */
    PlanStep k0[] = {AR(0, 0)}, k1[] = {{.kind = STEP_ALLREDUCE_START, .group = 0, .bucket = 0}};
    ck_assert(!run(2, k0, 1, k1, 1, NULL, 0, groups, 1, &d));
    ck_assert_str_eq(d.msg, "test: collective mismatch: rank 1 step 0 does allreduce of bucket 0 over group 0 but rank 0 step 0 does allreduce over group 0 (0 bytes)");
}
END_TEST

/* ---- the walker under both checks ---- */

/* What a walk's hooks heard, as text: "r:kind" per step ("s" send, "r"
 * receive, "w" send-wait, "c" compute), "A[m m]" per collective with its
 * members; after a receive or send-wait, '+' when the message was there. */
typedef struct Heard {
    char text[512];
    int stop_after; /* the hook that returns false (0: none) */
    int calls;
} Heard;

static bool heard(Heard *h, const char *what) {
    size_t n = strlen(h->text);
    snprintf(h->text + n, sizeof h->text - n, "%s%s", n ? " " : "", what);
    return ++h->calls != h->stop_after;
}

static bool heard_step(void *ctx, int r, const PlanStep *s, WalkMsg *m) {
    char b[32];
    const char *k = s->kind == STEP_SEND ? "s" : s->kind == STEP_RECV ? "r" : s->kind == STEP_SEND_WAIT ? "w" : "c";
    snprintf(b, sizeof b, "%d:%s%s", r, k, m && s->kind != STEP_SEND && m->received ? "+" : "");
    if (s->kind == STEP_SEND) m->user[0] = 10 * r + s->tag; /* read back by the receive */
    if (s->kind == STEP_RECV) ck_assert(m->user[0] == 10 * s->peer + s->tag);
    return heard(ctx, b);
}

static bool heard_collective(void *ctx, const PlanStep *s, const int *members, int n) {
    char b[64] = "A[";
    for (int i = 0; i < n; i++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%d", i ? " " : "", members[i]);
    ck_assert(s->kind == STEP_ALLREDUCE || s->kind == STEP_ALLREDUCE_START);
    return heard(ctx, strcat(b, "]"));
}

START_TEST(walk_events_and_deadlock) {
    static const WalkHooks hooks = {heard_step, heard_collective};
    int g01[] = {0, 1};
    PlanGroup groups[] = {{2, g01}};
    /* Rank 0 computes, sends, allreduces and waits for its send; rank 1
     * receives it, computes, and joins the allreduce, which completes when
     * rank 1 arrives.  The ranks take turns in rank order, each running
     * until it blocks. */
    PlanStep a0[] = {WORK, SEND(1, 1, 8), AR(0, 4), {.kind = STEP_SEND_WAIT, .peer = 1, .tag = 1}};
    PlanStep a1[] = {RECV(0, 1, 8), WORK, AR(0, 4)};
    const PlanStep *seq[] = {a0, a1};
    int len[] = {4, 3};
    Walk w;
    ck_assert(walk_init(&w, 2, seq, len, groups, 1));
    Heard h = {0};
    WalkFault f;
    ck_assert(walk_run(&w, &hooks, &h, &f));
    ck_assert_int_eq(f.kind, WALK_OK);
    ck_assert_str_eq(h.text, "0:c 0:s 1:r+ 1:c A[0 1] 0:w+");
    ck_assert_ptr_null(walk_at(&w, 0));
    ck_assert_int_eq(walk_waits_for(&w, 1), -1);
    /* walks again from the start, the same */
    h = (Heard){0};
    ck_assert(walk_run(&w, &hooks, &h, &f));
    ck_assert_str_eq(h.text, "0:c 0:s 1:r+ 1:c A[0 1] 0:w+");
    /* a hook that returns false stops the walk there */
    h = (Heard){.stop_after = 3};
    ck_assert(!walk_run(&w, &hooks, &h, &f));
    ck_assert_int_eq(f.kind, WALK_ABORTED);
    ck_assert_int_eq(f.rank, 1);
    ck_assert_int_eq(f.step, 0);
    ck_assert_str_eq(h.text, "0:c 0:s 1:r+");
    walk_free(&w);

    /* Both receive before they send: neither moves, and each waits for the
     * other. */
    PlanStep d0[] = {WORK, RECV(1, 2, 8), SEND(1, 1, 8)}, d1[] = {RECV(0, 1, 8), SEND(0, 2, 8)};
    seq[0] = d0, seq[1] = d1, len[0] = 3, len[1] = 2;
    ck_assert(walk_init(&w, 2, seq, len, groups, 1));
    h = (Heard){0};
    ck_assert(!walk_run(&w, &hooks, &h, &f));
    ck_assert_int_eq(f.kind, WALK_STUCK);
    ck_assert_int_eq(f.rank, 0);
    ck_assert_int_eq(f.step, 1);
    ck_assert_str_eq(h.text, "0:c");
    ck_assert_int_eq(walk_waits_for(&w, 0), 1);
    ck_assert_int_eq(walk_waits_for(&w, 1), 0);
    walk_free(&w);

    /* A send-wait blocks until the peer receives: rank 1 computes first. */
    PlanStep e0[] = {SEND(1, 1, 8), {.kind = STEP_SEND_WAIT, .peer = 1, .tag = 1}, WORK}, e1[] = {WORK, RECV(0, 1, 8)};
    seq[0] = e0, seq[1] = e1, len[0] = 3, len[1] = 2;
    ck_assert(walk_init(&w, 2, seq, len, groups, 1));
    h = (Heard){0};
    ck_assert(walk_run(&w, &hooks, &h, &f));
    ck_assert_str_eq(h.text, "0:s 1:c 1:r+ 0:w+ 0:c");
    walk_free(&w);

    /* Groups: rank 2 joins an allreduce over {0, 1}, which it is not in;
     * a group that names rank 7 of 3 is refused when a rank uses it. */
    int g12[] = {1, 2}, g07[] = {0, 7};
    PlanGroup three[] = {{2, g01}, {2, g12}, {2, g07}};
    PlanStep m0[] = {AR(0, 4)}, m1[] = {AR(0, 4), AR(1, 4)}, m2[] = {AR(1, 4), AR(0, 4)};
    const PlanStep *seq3[] = {m0, m1, m2};
    int len3[] = {1, 2, 2};
    ck_assert(walk_init(&w, 3, seq3, len3, three, 3));
    h = (Heard){0};
    ck_assert(!walk_run(&w, &hooks, &h, &f));
    ck_assert_int_eq(f.kind, WALK_NOT_MEMBER);
    ck_assert_int_eq(f.rank, 2);
    ck_assert_int_eq(f.step, 1);
    ck_assert_str_eq(h.text, "A[0 1] A[1 2]");
    walk_free(&w);
    PlanStep b0[] = {AR(2, 4)};
    seq3[0] = b0, len3[0] = 1, len3[1] = 0, len3[2] = 0;
    ck_assert(walk_init(&w, 3, seq3, len3, three, 3));
    ck_assert(!walk_run(&w, &hooks, &h, &f));
    ck_assert_int_eq(f.kind, WALK_BAD_MEMBER);
    ck_assert_int_eq(f.other, 7);
    walk_free(&w);
}
END_TEST

/* Copies of a plan's train sequences that a test may break. */
typedef struct Broken {
    int n;
    PlanStep *seq[8];
    int len[8];
} Broken;

static void broken_init(Broken *b, const Plan *p) {
    b->n = p->n_ranks;
    for (int r = 0; r < b->n; r++) {
        b->len[r] = p->ranks[r].n_train;
        b->seq[r] = malloc(sizeof(PlanStep) * (size_t)(b->len[r] + 1));
        memcpy(b->seq[r], p->ranks[r].train, sizeof(PlanStep) * (size_t)b->len[r]);
    }
}

static bool broken_check(Broken *b, Diag *d) {
    *d = (Diag){0};
    return comm_check(b->n, (const PlanStep *const *)b->seq, b->len, NULL, 0, "broken", d);
}

static void broken_free(Broken *b) {
    for (int r = 0; r < b->n; r++) free(b->seq[r]);
}

static int find_step(const Broken *b, int r, StepKind kind, int peer, int nth) {
    for (int i = 0; i < b->len[r]; i++)
        if (b->seq[r][i].kind == kind && b->seq[r][i].peer == peer && nth-- == 0) return i;
    ck_abort_msg("rank %d has no such step", r);
    return -1;
}

START_TEST(comm_check_broken_plans) {
    TG k;
    uniform_chain(&k, 6, 16, 2);
    Plan p;
    plan_ok(&k, 3, 4, "1f1b", NULL, 0, &p);
    Diag d = {0};
    ck_assert_msg(comm_check_plan(&p, &d), "%s", d.msg);
    char want[512];

    Broken b;
    broken_init(&b, &p);
    ck_assert_msg(broken_check(&b, &d), "%s", d.msg);
    int i = find_step(&b, 1, STEP_RECV, 0, 0);
    b.seq[1][i].bytes /= 2; /* mismatched size */
    ck_assert(!broken_check(&b, &d));
    snprintf(want, sizeof want, "broken: size mismatch: rank 1 step %d receives %lld bytes from rank 0", i,
             (long long)b.seq[1][i].bytes);
    ck_assert_msg(strncmp(d.msg, want, strlen(want)) == 0, "%s", d.msg);
    broken_free(&b);

    broken_init(&b, &p);
    i = find_step(&b, 0, STEP_SEND, 1, 0);
    b.seq[0][i].peer = 2; /* wrong peer */
    ck_assert(!broken_check(&b, &d));
    snprintf(want, sizeof want, "never completes: rank 0 step %d sent tag %d to rank 2 instead", i, b.seq[0][i].tag);
    ck_assert_msg(strncmp(d.msg, "broken: rank 1 step ", 20) == 0 && strstr(d.msg, want), "%s", d.msg);
    broken_free(&b);

    broken_init(&b, &p);
    /* swapped order: rank 1 sends its first activation only after waiting
     * for the gradient that depends on it */
    int s = find_step(&b, 1, STEP_SEND, 2, 0), r = find_step(&b, 1, STEP_RECV, 2, 0);
    ck_assert_int_lt(s, r);
    PlanStep moved = b.seq[1][s];
    memmove(&b.seq[1][s], &b.seq[1][s + 1], sizeof(PlanStep) * (size_t)(r - s));
    b.seq[1][r] = moved;
    ck_assert(!broken_check(&b, &d));
    ck_assert_msg(strstr(d.msg, "broken: deadlock: rank 1 step") || strstr(d.msg, "broken: deadlock: rank 2 step"), "%s",
                  d.msg);
    broken_free(&b);

    broken_init(&b, &p);
    i = find_step(&b, 2, STEP_RECV, 1, 3); /* missing recv */
    memmove(&b.seq[2][i], &b.seq[2][i + 1], sizeof(PlanStep) * (size_t)(b.len[2] - i - 1));
    b.len[2]--;
    ck_assert(!broken_check(&b, &d));
    ck_assert_msg(strstr(d.msg, "to rank 2, which never receives it") != NULL ||
                      strstr(d.msg, "rank 2 finished without receiving its message") != NULL,
                  "%s", d.msg);
    broken_free(&b);

    /* the plan-level checker sees the same breakage in a plan */
    PlanStep *orig = p.ranks[2].train;
    broken_init(&b, &p);
    b.seq[2][find_step(&b, 2, STEP_RECV, 1, 0)].tag += 1000;
    p.ranks[2].train = b.seq[2];
    d = (Diag){0};
    ck_assert(!comm_check_plan(&p, &d));
    ck_assert_msg(strstr(d.msg, "pipeline plan (pipeline), train step: ") == d.msg, "%s", d.msg);
    if (getenv("SHOW_MESSAGES")) fprintf(stderr, "%s\n", d.msg);
    p.ranks[2].train = orig;
    broken_free(&b);
    graph_free(k.g);
}
END_TEST

/* ---- sample models, data parallel plans, JSON ---- */

static void sample_plans(const char *model, LossKind loss, int P, int M, const char *sched) {
    Graph *g = test_load(test_src_path(model), 2);
    TrainOptions o = {.loss = loss, .optimizer = OPT_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                      .replicas = M};
    TrainGraph t;
    Diag d = {0};
    ck_assert_msg(train_build(g, &o, &t, &d) && ir_verify(g, &d), "%s", d.msg);
    Plan p;
    ck_assert_msg(plan_pipeline(g, &t, 2 * M, P, M, sched, NULL, 0, &p, &d), "%s P=%d M=%d %s: %s", model, P, M, sched,
                  d.msg);
    for (int r = 0; r < P; r++) {
        ck_assert_int_gt(p.ranks[r].n_train, 0);
        ck_assert_int_gt(p.ranks[r].n_eval, 0);
    }
    ck_assert(p.ranks[P - 1].holds[t.loss->id] & HOLD_COMPUTED);
    check_memory(&p);
    char *text = plan_to_json(&p, NULL);
    ck_assert_ptr_nonnull(text);
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    ck_assert_msg(root != NULL, "JSON: %s", err.text);
    ck_assert_int_eq(json_integer_value(json_object_get(root, "stages")), P);
    json_t *ranks = json_object_get(root, "rank_plans");
    ck_assert_int_eq((int)json_array_size(ranks), P);
    int sends = 0, recvs = 0;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
        json_t *rj = json_array_get(ranks, r);
        ck_assert_int_eq(json_integer_value(json_object_get(rj, "arena_bytes")), p.ranks[r].arena_bytes);
        ck_assert_int_eq(json_integer_value(json_object_get(rj, "peak_activation_bytes")), p.ranks[r].peak_act_bytes);
        size_t n_inst = 0;
        for (size_t c = 0; c < (size_t)g->n_values * (size_t)(M + 1); c++) n_inst += p.ranks[r].inst[c] >= 0;
        ck_assert_int_eq(json_array_size(json_object_get(rj, "buffers")), n_inst);
        json_t *steps = json_object_get(rj, "steps");
        for (size_t i = 0; i < json_array_size(steps); i++) {
            const char *kind = json_string_value(json_object_get(json_array_get(steps, i), "kind"));
            sends += strcmp(kind, "send") == 0;
            recvs += strcmp(kind, "recv") == 0;
        }
    }
    ck_assert_int_gt(sends, 0);
    ck_assert_int_eq(sends, recvs);
    ck_assert_int_eq((int)json_array_size(json_object_get(root, "stage_table")), P);
    json_decref(root);
    free(text);
    graph_free(g);
}

START_TEST(sample_models) {
    sample_plans("samples/mlp.onnx", LOSS_CE, 3, 4, "1f1b");
    sample_plans("samples/mlp.onnx", LOSS_CE, 2, 1, "layer");
    sample_plans("samples/cnn.onnx", LOSS_CE, 2, 2, "gpipe");
    sample_plans("samples/cnn.onnx", LOSS_CE, 4, 8, "1f1b");
    sample_plans("samples/transformer.onnx", LOSS_MSE, 4, 4, "1f1b");
    sample_plans("samples/transformer.onnx", LOSS_MSE, 8, 2, "gpipe");
}
END_TEST

/* A dp plan is the one shape at 2 replicas x 1 stage x 1 micro-batch:
 * both ranks run stage 0 with the same steps and memory, each bucket's
 * gradients lie back to back inside it, and the bucket's sum starts right
 * after its last gradient is computed and is awaited before the first
 * update reading it. */
START_TEST(dp_plan_is_the_one_shape) {
    Graph *g = test_load(test_src_path("samples/mlp.onnx"), 4);
    TrainOptions o = {.loss = LOSS_CE, .optimizer = OPT_SGD, .lr = 0.1f, .replicas = 2};
    TrainGraph t;
    Diag d = {0};
    ck_assert_msg(train_build(g, &o, &t, &d), "%s", d.msg);
    Plan p;
    ck_assert_msg(plan_dp(g, &t, 8, 2, 0.25, &p, &d), "%s", d.msg);
    ck_assert_msg(comm_check_plan(&p, &d), "%s", d.msg);
    ck_assert_int_eq(p.n_stages, 1);
    ck_assert_int_eq(p.microbatches, 1);
    ck_assert_int_eq(p.replicas, 2);
    ck_assert_int_eq(p.n_groups, 1);
    ck_assert_int_eq(p.groups[0].n, 2);
    const RankPlan *r0 = &p.ranks[0];
    ck_assert_int_gt(r0->n_buckets, 1); /* 0.25 MiB splits the MLP's gradients */
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(p.ranks[r].stage, 0);
        ck_assert_int_eq(p.ranks[r].replica, r);
        ck_assert_int_eq(p.ranks[r].n_train, r0->n_train);
        ck_assert_ptr_nonnull(p.ranks[r].inst);
    }
    int64_t n_grads = 0;
    for (int b = 0; b < r0->n_buckets; b++) {
        const Bucket *bk = &r0->buckets[b];
        int64_t at = bk->offset;
        for (int k = 0; k < bk->n; k++) {
            ck_assert_int_eq(pipeline_buffer(&p, r0, bk->grads[k], 0), at);
            ck_assert_int_eq(pipeline_buffer(&p, r0, bk->grads[k], -1), at);
            at += plan_value_bytes(bk->grads[k]);
        }
        ck_assert_int_eq(at, bk->offset + bk->bytes);
        ck_assert_int_le(at, r0->init_bytes);
        n_grads += bk->n;
        int start = -1, wait = -1, last_grad = -1, first_read = -1;
        for (int s = 0; s < r0->n_train; s++) {
            const PlanStep *st = &r0->train[s];
            ck_assert(st->kind != STEP_ACCUMULATE); /* one micro-batch: nothing to accumulate */
            if (st->kind == STEP_ALLREDUCE_START && st->bucket == b) start = s;
            if (st->kind == STEP_ALLREDUCE_WAIT && st->bucket == b) wait = s;
            if (st->kind != STEP_COMPUTE) continue;
            for (int k = 0; k < bk->n; k++) {
                for (int j = 0; j < st->node->n_out; j++)
                    if (st->node->out[j] == bk->grads[k]) last_grad = s;
                for (int j = 0; j < st->node->n_in; j++)
                    if (st->node->in[j] == bk->grads[k] && first_read < 0 && st->node->phase == PHASE_OPTIMIZER)
                        first_read = s;
            }
        }
        ck_assert_int_eq(start, last_grad + 1);
        ck_assert_int_eq(wait, first_read - 1);
    }
    int trainable = 0;
    for (int i = 0; i < t.n_params; i++) trainable += t.grads[i] != NULL;
    ck_assert_int_eq(n_grads, trainable);
    char *text = plan_to_json(&p, NULL);
    ck_assert_ptr_nonnull(text);
    ck_assert(strstr(text, "allreduce_start") != NULL);
    ck_assert(strstr(text, "\"stages\": 1") != NULL);
    free(text);
    graph_free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pipeline_plan");
    TCase *tc = tcase_create("pipeline_plan");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, balance_weights);
    tcase_add_test(tc, balance_large);
    tcase_add_test(tc, balance_with_communication_and_memory);
    tcase_add_test(tc, balance_mlp);
    tcase_add_test(tc, balance_deep_chain);
    tcase_add_test(tc, user_cuts);
    tcase_add_test(tc, skip_connection_not_relayed);
    tcase_add_test(tc, value_read_by_two_later_stages);
    tcase_add_test(tc, tied_weight_gradient_exchange);
    tcase_add_test(tc, schedule_orders);
    tcase_add_test(tc, pipeline_plans_on_a_chain);
    tcase_add_test(tc, hybrid_plan);
    tcase_add_test(tc, out_of_memory_at_every_allocation);
    tcase_add_test(tc, memory_plans_never_overlap);
    tcase_add_test(tc, peak_activation_memory);
    tcase_add_test(tc, layer_memory_against_single_rank);
    tcase_add_test(tc, hybrid_replicas_share_a_layout);
    tcase_add_test(tc, comm_check_sequences);
    tcase_add_test(tc, walk_events_and_deadlock);
    tcase_add_test(tc, comm_check_broken_plans);
    tcase_add_test(tc, sample_models);
    tcase_add_test(tc, dp_plan_is_the_one_shape);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
