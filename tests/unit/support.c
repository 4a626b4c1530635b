#include "support.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_src_path(const char *rel) {
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", CLEAVE_SOURCE_DIR, rel);
    return buf[k];
}

Graph *test_load(const char *path, int64_t batch) {
    Diag d = {0};
    DriverOptions opt = {.model = path, .batch = batch};
    Graph *g = driver_front_end(&opt, &d);
    ck_assert_msg(g != NULL, "loading %s failed: %s", path, d.msg);
    return g;
}

int test_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#include <string.h>

static bool finish_prog(TestProg *tp, Diag *d) {
    CgOptions co = {.emit = "obj", .passes = "default<O1>"};
    CgModule *m = cg_build(&tp->p, &co, d);
    if (!m) return false;
    tp->jit = cg_jit(m, d);
    cg_module_free(m);
    if (!tp->jit) return false;
    tp->train = (void (*)(char *))cg_jit_lookup(tp->jit, "cleave_train_step", d);
    tp->eval = (void (*)(char *))cg_jit_lookup(tp->jit, "cleave_eval_step", d);
    const unsigned char *init = cg_jit_lookup(tp->jit, "cleave_init", d);
    if (!tp->train || !tp->eval || !init) return false;
    const RankPlan *rp = &tp->p.ranks[0];
    size_t bytes = (size_t)((rp->arena_bytes + 63) / 64 * 64 + 64);
    tp->arena = aligned_alloc(64, bytes);
    if (!tp->arena) return diag_error(d, DIAG_NOMEM, "out of memory");
    memset(tp->arena, 0, bytes);
    memcpy(tp->arena, init, (size_t)rp->init_bytes);
    return true;
}

bool test_prog_train(TestProg *tp, Graph *g, const TrainOptions *o, char *msg, size_t len) {
    memset(tp, 0, sizeof *tp);
    tp->g = g;
    Diag d = {0};
    bool ok = train_build(g, o, &tp->t, &d) && ir_verify(g, &d) && plan_single(g, &tp->t, 0, &tp->p, &d) &&
              finish_prog(tp, &d);
    if (!ok) snprintf(msg, len, "%s", d.msg);
    return ok;
}

bool test_prog_forward(TestProg *tp, Graph *g, char *msg, size_t len) {
    memset(tp, 0, sizeof *tp);
    tp->g = g;
    Diag d = {0};
    bool ok = plan_forward(g, &tp->p, &d) && finish_prog(tp, &d);
    if (!ok) snprintf(msg, len, "%s", d.msg);
    return ok;
}

void *test_buf(TestProg *tp, const Value *v) {
    int64_t off = tp->p.ranks[0].offset[v->id];
    return off < 0 ? NULL : tp->arena + off;
}

void test_prog_free(TestProg *tp) {
    cg_jit_free(tp->jit);
    free(tp->arena);
    graph_free(tp->g);
    memset(tp, 0, sizeof *tp);
}
