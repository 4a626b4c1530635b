/* test_profile.c - --profile: every kernel of the sample models' training
 * steps can be built and timed alone, a kernel is timed once and then
 * remembered, and the simulator charges exactly the timed seconds.
 * (Whether the times predict a step well is the cost-model benchmark's
 * question, bench/bench_costmodel.py, not a test's.) */
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "cli/compile_options.h"
#include "cost/profile.h"
#include "cost/simulate.h"
#include "ops/ops.h"

/* The plan `cleave compile` would build for the model, on `ranks` ranks. */
static void build(const char *model, const char *strategy, int ranks, int micro, LossKind loss, Graph **g,
                  TrainGraph *t, Plan *p) {
    CompileOptions o = {.model = test_src_path(model), .batch = 16, .ranks = ranks,
                        .microbatches = micro, .bucket_mb = 25,
                        .train = {.loss = loss, .optimizer = OPT_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                                  .eps = 1e-8f}};
    Diag d = {0};
    Layout l;
    ck_assert(strategy_parse(strategy, &o.strategy));
    ck_assert_msg(compile_options_layout(&o, &l, &d) && driver_build_plan(&o, &l, NULL, g, t, p, &d), "%s", d.msg);
}

/* Every compute step of every rank gets a positive time, none fails. */
static void profile_all(const char *model, const char *strategy, int ranks, int micro, LossKind loss) {
    Graph *g;
    TrainGraph t;
    Plan p;
    build(model, strategy, ranks, micro, loss, &g, &t, &p);
    KernelProfile *kp = profile_new();
    ck_assert_ptr_nonnull(kp);
    profile_bind(kp, g);
    int asked = 0;
    for (int r = 0; r < p.n_ranks; r++)
        for (int i = 0; i < p.ranks[r].n_train; i++) {
            const PlanStep *s = &p.ranks[r].train[i];
            if (s->kind != STEP_COMPUTE || !s->node->def->cg) continue;
            double sec = profile_node_seconds(kp, s->node, PROFILE_COLD);
            ck_assert_msg(sec > 0 && sec < 1, "%s: node '%s' (%s): %g s", model, s->node->name, s->node->op_type, sec);
            asked++;
        }
    int measured, failed;
    profile_counts(kp, &measured, &failed);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_gt(measured, 0);
    /* kernels repeat (micro-batches, replicas, the same layer shapes), and
     * each distinct one is timed once */
    ck_assert_int_le(measured, asked);
    profile_free(kp);
    graph_free(g);
}

START_TEST(every_kernel_of_the_samples) {
    profile_all("samples/mlp.onnx", "single", 1, 0, LOSS_CE);
    profile_all("samples/cnn.onnx", "single", 1, 0, LOSS_CE);
    profile_all("samples/transformer.onnx", "single", 1, 0, LOSS_MSE);
    profile_all("samples/mlp.onnx", "pipeline", 2, 4, LOSS_CE);
    /* batch statistics summed over 2 replicas, each kernel timed alone as
     * one replica's (cleave plan --profile of a batch-norm model on 2
     * ranks once stopped here on an internal check) */
    profile_all("samples/resnet.onnx", "dp", 2, 0, LOSS_CE);
}
END_TEST

START_TEST(timed_once_and_charged_as_timed) {
    Graph *g;
    TrainGraph t;
    Plan p;
    build("samples/mlp.onnx", "single", 1, 0, LOSS_CE, &g, &t, &p);
    KernelProfile *kp = profile_new();
    profile_bind(kp, g);
    const Node *gemm = NULL;
    for (int i = 0; i < p.ranks[0].n_train && !gemm; i++)
        if (p.ranks[0].train[i].kind == STEP_COMPUTE && strcmp(p.ranks[0].train[i].node->op_type, "Gemm") == 0)
            gemm = p.ranks[0].train[i].node;
    ck_assert_ptr_nonnull(gemm);
    double a = profile_node_seconds(kp, gemm, PROFILE_COLD), b = profile_node_seconds(kp, gemm, PROFILE_COLD);
    int measured, failed;
    profile_counts(kp, &measured, &failed);
    ck_assert(a > 0 && a == b);
    ck_assert_int_eq(measured, 1);
    /* warm: timed with it, not built again; on data a call leaves in cache */
    double w = profile_node_seconds(kp, gemm, PROFILE_WARM);
    profile_counts(kp, &measured, &failed);
    ck_assert_int_eq(measured, 1);
    ck_assert_msg(w > 0 && w == profile_node_seconds(kp, gemm, PROFILE_WARM), "warm %g s", w);
    /* from memory: timed with it too, on an arena flushed from the caches */
    double m = profile_node_seconds(kp, gemm, PROFILE_MEMORY);
    profile_counts(kp, &measured, &failed);
    ck_assert_int_eq(measured, 1);
    ck_assert_msg(m > 0 && m == profile_node_seconds(kp, gemm, PROFILE_MEMORY), "memory %g s", m);
    /* accumulating a gradient shaped like the Gemm's weight: timed once too */
    double acc = profile_accumulate_seconds(kp, gemm->in[1], PROFILE_COLD);
    ck_assert(acc > 0 && acc == profile_accumulate_seconds(kp, gemm->in[1], PROFILE_COLD));
    profile_counts(kp, &measured, &failed);
    ck_assert_int_eq(measured, 2);
    ck_assert_int_eq(failed, 0);
    /* the simulator charges the timed seconds, over the rank's speed */
    Cluster c;
    cluster_defaults(&c, 2);
    c.profile = kp;
    double speed[2] = {1.0, 0.5};
    c.rank_speed = speed;
    ck_assert(sim_node_seconds(&c, 0, gemm, PROFILE_COLD) == a);
    ck_assert(sim_node_seconds(&c, 0, gemm, PROFILE_WARM) == w);
    ck_assert(sim_node_seconds(&c, 0, gemm, PROFILE_MEMORY) == m);
    ck_assert(sim_node_seconds(&c, 1, gemm, PROFILE_COLD) == a / 0.5);
    c.profile = NULL;
    ck_assert(sim_node_seconds(&c, 0, gemm, PROFILE_COLD) != a); /* priced by the rates again */
    c.rank_speed = NULL;
    /* refined: timed twice more, nothing built again; the kernel keeps one
     * of its three timings (the median), the same one from then on */
    profile_refine(kp, 2);
    double r = profile_node_seconds(kp, gemm, PROFILE_COLD);
    profile_counts(kp, &measured, &failed);
    ck_assert_int_eq(measured, 2);
    ck_assert(r > 0 && r == profile_node_seconds(kp, gemm, PROFILE_COLD));
    ck_assert_msg(r > a / 20 && r < a * 20, "refined %g s against a first timing of %g s", r, a);
    profile_refine(kp, 2); /* nothing kept built: nothing changes */
    ck_assert(profile_node_seconds(kp, gemm, PROFILE_COLD) == r);
    profile_free(kp);
    /* no profile bound, or none at all: nothing measured */
    ck_assert(profile_node_seconds(NULL, gemm, PROFILE_COLD) < 0);
    KernelProfile *unbound = profile_new();
    ck_assert(profile_node_seconds(unbound, gemm, PROFILE_COLD) < 0);
    profile_free(unbound);
    graph_free(g);
}
END_TEST

/* The last-level cache's useful size is measured once: at least twice
 * the L2 (where the probe starts) and at most twice the 64 MiB the probe
 * stops at, and the same when asked again. */
START_TEST(last_level_cache_measured) {
    size_t l2 = profile_cache_bytes(), llc = profile_llc_bytes();
    ck_assert_msg(llc >= 2 * l2 && llc <= ((size_t)128 << 20), "L2 %zu, last level %zu", l2, llc);
    ck_assert(profile_llc_bytes() == llc);
}
END_TEST

int main(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_kernel_of_the_samples);
    tcase_add_test(tc, timed_once_and_charged_as_timed);
    tcase_add_test(tc, last_level_cache_measured);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
