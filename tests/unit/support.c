#include "support.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/onnx.h"
#include "cost/node_cost.h"
#include "ops/ops.h"

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

/* One line per skipped test.  Opened before the runner forks, so the
 * children's lines land in the one file the parent counts afterwards. */
static FILE *test_skips;

void test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (test_skips) {
        fputs("skipped\n", test_skips);
        fflush(test_skips);
    }
}

int test_run_suite(Suite *s) {
    test_skips = tmpfile();
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr), run = srunner_ntests_run(sr), skipped = 0;
    srunner_free(sr);
    if (test_skips) {
        rewind(test_skips);
        for (int ch; (ch = fgetc(test_skips)) != EOF;) skipped += ch == '\n';
        fclose(test_skips);
        test_skips = NULL;
    }
    if (skipped) printf("%d of %d tests skipped (counted as passed above)\n", skipped, run);
    if (failed) return EXIT_FAILURE;
    return skipped && skipped >= run ? TEST_SKIP_STATUS : EXIT_SUCCESS;
}

bool test_file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

Graph *test_graph_new(const char *name, int64_t opset, int max_inputs, int max_outputs) {
    Graph *g = graph_new(name);
    ck_assert_ptr_nonnull(g);
    g->opsets = ARENA_NEW(&g->arena, Opset);
    ck_assert_ptr_nonnull(g->opsets);
    g->opsets[0] = (Opset){"", opset};
    g->n_opsets = 1;
    if (max_inputs) {
        g->inputs = ARENA_ARRAY(&g->arena, Value *, max_inputs);
        ck_assert_ptr_nonnull(g->inputs);
    }
    if (max_outputs) {
        g->outputs = ARENA_ARRAY(&g->arena, Value *, max_outputs);
        ck_assert_ptr_nonnull(g->outputs);
    }
    return g;
}

/* ---- programs compiled in-process ---- */

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
    return test_prog_forward_threads(tp, g, 1, msg, len);
}

bool test_prog_forward_threads(TestProg *tp, Graph *g, int threads, char *msg, size_t len) {
    memset(tp, 0, sizeof *tp);
    tp->g = g;
    Diag d = {0};
    bool ok = plan_forward(g, &tp->p, &d);
    tp->p.threads = threads;
    ok = ok && finish_prog(tp, &d);
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

/* ---- ONNX's operator tests ---- */

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char **node_test_names(bool (*keep)(const char *name), int *count) {
    DIR *dp = opendir(NODE_TESTS_DIR);
    if (!dp) return NULL;
    int n = 0, cap = 256;
    char **names = malloc(sizeof *names * (size_t)cap);
    ck_assert_ptr_nonnull(names);
    for (struct dirent *e; (e = readdir(dp)) != NULL;) {
        if (strncmp(e->d_name, "test_", 5) != 0 || (keep && !keep(e->d_name))) continue;
        if (n == cap) {
            cap *= 2;
            names = realloc(names, sizeof *names * (size_t)cap);
            ck_assert_ptr_nonnull(names);
        }
        names[n] = strdup(e->d_name);
        ck_assert_ptr_nonnull(names[n]);
        n++;
    }
    closedir(dp);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    *count = n;
    return names;
}

void node_test_names_free(char **names, int count) {
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
}

void node_test_group(const Graph *g, const char *folder, char *out, size_t len) {
    const char *op = NULL;
    bool one_op = true;
    GRAPH_FOR_NODES(g, n) {
        if (!op) op = n->op_type;
        else if (strcmp(op, n->op_type) != 0) one_op = false;
    }
    if (op && one_op) {
        snprintf(out, len, "%s", op);
        return;
    }
    for (int i = 0; i < g->n_values; i++) {
        const char *name = g->values[i]->name;
        const char *fn = strstr(name, "_function_"), *at = strstr(name, "_test_");
        if (fn && at && at > name && at < fn) {
            snprintf(out, len, "%.*s_expanded", (int)(at - name), name);
            return;
        }
    }
    snprintf(out, len, "%s", folder);
}

bool node_test_load(NodeTest *nt, const char *folder, Diag *d) {
    memset(nt, 0, sizeof *nt);
    snprintf(nt->dir, sizeof nt->dir, "%s/%s", NODE_TESTS_DIR, folder);
    snprintf(nt->model, sizeof nt->model, "%s/model.onnx", nt->dir);
    nt->g = onnx_load(nt->model, d);
    if (!nt->g) return false;
    nt->aux = graph_new(nt->model);
    ck_assert_ptr_nonnull(nt->aux);
    return true;
}

bool node_test_constify(Graph *g, Value *v, const Value *t, const char *path, Diag *d) {
    const Const *c = t->konst;
    Const *k = const_new(g, c->store, c->n);
    if (!k) return diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
    memcpy(k->data, c->data, (size_t)c->n * (c->store == DT_FLOAT ? 4 : 8));
    v->konst = k;
    v->kind = VAL_CONSTANT;
    v->dtype = t->dtype;
    v->file_dtype = t->dtype;
    value_set_shape(v, t->rank, t->dims);
    return true;
}

/* A float input that decides an output's shape: Resize's roi and scales,
 * Upsample's scales. */
static bool float_shape_operand(Graph *g, const Value *v) {
    if (!dtype_is_float(v->dtype)) return false;
    GRAPH_FOR_NODES(g, n) {
        if (strcmp(n->op_type, "Resize") && strcmp(n->op_type, "Upsample")) continue;
        for (int i = 1; i < n->n_in; i++)
            if (n->in[i] == v) return true;
    }
    return false;
}

bool node_test_read_inputs(NodeTest *nt, unsigned flags, Diag *d) {
    Graph *g = nt->g;
    nt->n_in = g->n_inputs;
    nt->in_val = calloc((size_t)g->n_inputs + 1, sizeof *nt->in_val);
    nt->in_data = calloc((size_t)g->n_inputs + 1, sizeof *nt->in_data);
    ck_assert(nt->in_val && nt->in_data);
    int kept = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        Value *v = g->inputs[i];
        bool is_int = dtype_is_int(v->dtype) && v->dtype != DT_BOOL;
        bool shape_like = is_int || float_shape_operand(g, v);
        char path[4096];
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", nt->dir, i);
        nt->in_val[i] = v;
        if ((shape_like || !(flags & NODE_INPUTS_INT_ONLY)) && test_file_exists(path)) {
            nt->in_data[i] = onnx_load_tensor_file(nt->aux, path, d);
            if (!nt->in_data[i]) return false;
        }
        const Value *t = nt->in_data[i];
        if (t && is_int) nt->has_int = true;
        if (!(flags & NODE_INPUTS_CONSTIFY) || !t || !shape_like) {
            g->inputs[kept++] = v;
            continue;
        }
        if (!node_test_constify(g, v, t, path, d)) return false;
    }
    g->n_inputs = kept;
    return true;
}

bool node_test_expected(NodeTest *nt, int k, const Value **want, Diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", nt->dir, k);
    *want = NULL;
    if (!test_file_exists(path)) return true;
    *want = onnx_load_tensor_file(nt->aux, path, d);
    return *want != NULL;
}

void node_test_free(NodeTest *nt) {
    free(nt->in_val);
    free(nt->in_data);
    graph_free(nt->aux);
    graph_free(nt->g);
    memset(nt, 0, sizeof *nt);
}

static OpGroup *op_group(OpGroups *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->v[i].name, name) == 0) return &t->v[i];
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->v = realloc(t->v, sizeof *t->v * (size_t)t->cap);
        ck_assert_ptr_nonnull(t->v);
    }
    OpGroup *gr = &t->v[t->n++];
    memset(gr, 0, sizeof *gr);
    snprintf(gr->name, sizeof gr->name, "%s", name);
    return gr;
}

void op_groups_count(OpGroups *t, const char *name, bool passed) {
    OpGroup *gr = op_group(t, name);
    gr->total++;
    if (passed) gr->passed++;
}

static int cmp_groups(const void *a, const void *b) {
    return strcmp(((const OpGroup *)a)->name, ((const OpGroup *)b)->name);
}

void op_groups_print(OpGroups *t, const char *prefix) {
    if (t->n) qsort(t->v, (size_t)t->n, sizeof *t->v, cmp_groups);
    for (int i = 0; i < t->n; i++) printf("%s %s: %d/%d passed\n", prefix, t->v[i].name, t->v[i].passed, t->v[i].total);
}

void op_groups_free(OpGroups *t) {
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* ---- gradients checked by finite differences ---- */

float grad_rand_lcg(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

float grad_rand_xorshift(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t r = *state * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 23)) - 1.0f;
}

void grad_case_init(GradCase *k, const GradRules *rules) {
    memset(k, 0, sizeof *k);
    k->rules = rules;
    k->rng = rules->seed;
    k->g = test_graph_new(rules->graph_name, 17, 4, 2);
    k->gc = (GradCtx){k->g, &k->d, PHASE_FORWARD};
}

/* A value of the case's graph with contents of dtype t and the given
 * shape, the contents allocated (as the loader stores them) and unset. */
static Value *case_value(GradCase *k, const char *name, ValueKind kind, DType t, int rank, const int64_t *dims) {
    Value *v = graph_add_value(k->g, name);
    ck_assert_ptr_nonnull(v);
    v->kind = kind;
    v->dtype = v->file_dtype = t;
    v->rank = rank;
    int64_t n = 1;
    for (int j = 0; j < rank; j++) {
        v->dims[j] = dim_const(dims[j]);
        n *= dims[j];
    }
    v->konst = const_new(k->g, dtype_store(t), n);
    ck_assert_ptr_nonnull(v->konst);
    return v;
}

Value *grad_int_const(GradCase *k, const char *name, DType t, int rank, const int64_t *dims, const int64_t *x) {
    Value *v = case_value(k, name, VAL_CONSTANT, t, rank, dims);
    for (int64_t i = 0; i < v->konst->n; i++) const_set_i(v->konst, i, x[i]);
    return v;
}

Value *grad_tensor(GradCase *k, const char *name, ValueKind kind, int rank, const int64_t *dims, Fill fill) {
    Value *v = case_value(k, name, kind, DT_FLOAT, rank, dims);
    int64_t n = v->konst->n;
    for (int64_t i = 0; i < n; i++) {
        float x = k->rules->rand(&k->rng);
        const_set_f(v->konst, i, fill == FILL_POSITIVE ? 0.5f + fabsf(x) : x);
    }
    if (fill == FILL_DISTINCT) {
        int64_t *perm = malloc(sizeof *perm * (size_t)n);
        ck_assert_ptr_nonnull(perm);
        for (int64_t i = 0; i < n; i++) perm[i] = i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)((k->rules->rand(&k->rng) + 1.0f) * 0.5f * (float)(i + 1));
            if (j > i) j = i;
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < n; i++) const_set_f(v->konst, i, 0.05 * (double)(perm[i] - n / 2));
        free(perm);
    }
    return v;
}

Value *grad_param(GradCase *k, const char *name, int rank, const int64_t *dims) {
    return grad_tensor(k, name, VAL_INITIALIZER, rank, dims, FILL_UNIFORM);
}

Node *grad_node(GradCase *k, const char *op, int n_in, Value **in) {
    Node *n = gb_start(&k->gc, "", op, n_in, in, 1);
    ck_assert_msg(n != NULL, "building %s: %s", op, k->d.msg);
    return n;
}

Value *grad_finish(GradCase *k, Node *n) {
    Value *y = gb_finish(&k->gc, n);
    ck_assert_msg(y != NULL, "shape rule of %s: %s", n->op_type, k->d.msg);
    return y;
}

void grad_check(GradCase *k, Value *y, double tol) {
    ck_assert_msg(y != NULL && value_shape_known(y), "case output: %s", k->d.msg);
    int64_t ydims[MAX_RANK];
    for (int j = 0; j < y->rank; j++) ydims[j] = y->dims[j].k;
    Value *r = grad_tensor(k, "R", VAL_CONSTANT, y->rank, ydims, FILL_UNIFORM);
    Value *in[1] = {gb_op2(&k->gc, "Mul", y, r)};
    Node *sum = grad_node(k, "ReduceSum", 1, in);
    gb_attr_i(&k->gc, sum, "keepdims", 0);
    Value *loss = grad_finish(k, sum);
    loss->is_output = true;
    k->g->outputs[k->g->n_outputs++] = loss;

    TrainOptions o = {.loss = LOSS_MODEL, .optimizer = OPT_SGD, .lr = 0};
    TestProg tp;
    char msg[1024];
    ck_assert_msg(test_prog_train(&tp, k->g, &o, msg, sizeof msg), "compile: %s", msg);
    const float *lossp = test_buf(&tp, tp.t.loss);
    tp.train(tp.arena); /* lr 0: computes gradients, changes nothing */
    /* The gradients are transient: take copies before any eval step
     * reuses their bytes. */
    int np = tp.t.n_params;
    float **grads = calloc((size_t)np + 1, sizeof *grads);
    ck_assert_ptr_nonnull(grads);
    for (int p = 0; p < np; p++) {
        if (!tp.t.grads[p] && !value_is_trainable(k->g, tp.t.params[p])) continue; /* state: running statistics */
        ck_assert_msg(tp.t.grads[p] != NULL, "no gradient for %s", tp.t.params[p]->name);
        size_t bytes = sizeof(float) * (size_t)value_numel(tp.t.params[p]);
        grads[p] = malloc(bytes);
        ck_assert_ptr_nonnull(grads[p]);
        memcpy(grads[p], test_buf(&tp, tp.t.grads[p]), bytes);
    }
    int checked = 0;
    for (int p = 0; p < np; p++) {
        const Value *w = tp.t.params[p];
        if (!grads[p]) continue;
        float *wb = test_buf(&tp, w);
        for (int64_t i = 0; i < value_numel(w); i++) {
            const float eps = 1e-2f;
            float saved = wb[i];
            /* The train step's loss (at lr 0 it changes no parameter): ops
             * that train differently from how they evaluate (batch
             * statistics) are differentiated as they train. */
            wb[i] = saved + eps;
            tp.train(tp.arena);
            double up = *lossp;
            wb[i] = saved - eps;
            tp.train(tp.arena);
            double down = *lossp;
            wb[i] = saved;
            double fd = (up - down) / (2.0 * (double)eps), an = grads[p][i];
            ck_assert_msg(k->rules->agree(fd, an, tol), "%s[%lld]: program %g, finite difference %g", w->name,
                          (long long)i, an, fd);
            checked++;
        }
    }
    ck_assert_int_gt(checked, 0);
    for (int p = 0; p < np; p++) free(grads[p]);
    free(grads);
    test_prog_free(&tp);
}

Value *test_graph_input(Graph *g, const char *name, DType t, int rank, const int64_t *dims) {
    Value *v = graph_add_value(g, name);
    ck_assert_ptr_nonnull(v);
    v->kind = VAL_INPUT;
    v->dtype = v->file_dtype = t;
    v->rank = rank;
    for (int j = 0; j < rank; j++) v->dims[j] = dim_const(dims[j]);
    g->inputs[g->n_inputs++] = v;
    return v;
}

Node *test_graph_op(Graph *g, const char *op, int n_in, Value *const *in) {
    Node *n = graph_add_node(g, NULL, op, "", n_in, 1);
    ck_assert_ptr_nonnull(n);
    n->def = op_lookup("", op);
    ck_assert_ptr_nonnull(n->def);
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    Value *y = graph_add_value(g, arena_printf(&g->arena, "%s_y%d", op, n->id));
    y->producer = n;
    y->is_output = true;
    n->out[0] = y;
    g->outputs[g->n_outputs++] = y;
    n->attrs = ARENA_ARRAY(&g->arena, Attr, 4);
    return n;
}

void test_attr_i(Node *n, const char *name, int64_t x) {
    n->attrs[n->n_attr++] = (Attr){.name = name, .kind = ATTR_INT, .i = x};
}

void test_attr_f(Node *n, const char *name, float x) {
    n->attrs[n->n_attr++] = (Attr){.name = name, .kind = ATTR_FLOAT, .f = x};
}
