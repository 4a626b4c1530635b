/* test_conformance.c - shape conformance over ONNX's operator tests.
 *
 * Every folder test_* of ../shared/onnx-node-tests holds model.onnx and
 * test_data_set_0/{input,output}_K.pb.  For each model whose nodes all
 * resolve in the op table, shape inference must give every graph output the
 * dtype and concrete shape of the expected output tensor.  Models that
 * cleave refuses with DIAG_UNSUPPORTED (at load or from an op's rule) count
 * as unsupported, not as failures.
 *
 * Results are grouped by op: a model whose nodes all have one op_type counts
 * under that op; a multi-node ("expanded") model counts under
 * "<Op>_expanded", Op being the function the ONNX generator expanded (its
 * value names read "<Op>_test_..._function_..."), or under the folder name
 * when the model does not say.  Models whose ops all resolve but that an
 * op's rule refuses are listed with the reason, as they mark the edge of
 * what cleave supports. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "ops/ops.h"

#define TESTS_DIR CLEAVE_SHARED_DIR "/onnx-node-tests"

typedef enum { R_PASS, R_FAIL, R_UNSUPPORTED } Result;

typedef struct Group {
    char name[128];
    int passed, total;
} Group;

typedef struct Tally {
    Group *groups;
    int n_groups, cap_groups;
    int passed, failed, unsupported, models;
} Tally;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_group(const void *a, const void *b) {
    return strcmp(((const Group *)a)->name, ((const Group *)b)->name);
}

/* Sorted names of the test_* folders; NULL when the folder is absent. */
static char **list_tests(const char *dir, int *count) {
    DIR *dp = opendir(dir);
    if (!dp) return NULL;
    int n = 0, cap = 256;
    char **names = malloc(sizeof *names * (size_t)cap);
    ck_assert_ptr_nonnull(names);
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (strncmp(e->d_name, "test_", 5) != 0) continue;
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
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    *count = n;
    return names;
}

/* The op a model counts under (see the header comment). */
static void group_name(const Graph *g, const char *folder, char *out, size_t len) {
    const char *op = NULL;
    bool single = true;
    GRAPH_FOR_NODES(g, n) {
        if (!op) op = n->op_type;
        else if (strcmp(op, n->op_type) != 0) single = false;
    }
    if (op && single) {
        snprintf(out, len, "%s", op);
        return;
    }
    for (int i = 0; i < g->n_values; i++) {
        const char *name = g->values[i]->name, *fn = strstr(name, "_function_"), *at = strstr(name, "_test_");
        if (fn && at && at > name && at < fn) {
            snprintf(out, len, "%.*s_expanded", (int)(at - name), name);
            return;
        }
    }
    snprintf(out, len, "%s", folder);
}

static Group *find_group(Tally *t, const char *name) {
    for (int i = 0; i < t->n_groups; i++)
        if (strcmp(t->groups[i].name, name) == 0) return &t->groups[i];
    if (t->n_groups == t->cap_groups) {
        t->cap_groups = t->cap_groups ? t->cap_groups * 2 : 64;
        t->groups = realloc(t->groups, sizeof *t->groups * (size_t)t->cap_groups);
        ck_assert_ptr_nonnull(t->groups);
    }
    Group *gr = &t->groups[t->n_groups++];
    memset(gr, 0, sizeof *gr);
    snprintf(gr->name, sizeof gr->name, "%s", name);
    return gr;
}

static bool file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* Copies a constant loaded into `from` into g's arena. */
static Const *copy_const(Graph *g, const Const *c) {
    Const *r = const_new(g, c->store, c->n);
    if (!r) return NULL;
    memcpy(r->data, c->data, (size_t)c->n * (c->store == DT_FLOAT ? 4 : 8));
    return r;
}

/* Integer graph inputs of these tests are shape-like operands (Reshape's
 * shape, Slice's starts/ends/axes/steps, TopK's k, ...).  Real models carry
 * them as initializers or Constant nodes, so they are turned into constants
 * holding the test data before inference; float (and bool) inputs stay
 * dynamic.  The tensors are read into `aux` (a .pb names its tensor like the
 * input, and value names in g must stay unique) and copied into g. */
static bool constify_int_inputs(Graph *g, Graph *aux, const char *dir, Diag *d) {
    int kept = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        Value *v = g->inputs[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, i);
        if (!dtype_is_int(v->dtype) || v->dtype == DT_BOOL || !file_exists(path)) {
            g->inputs[kept++] = v;
            continue;
        }
        Value *t = onnx_load_tensor_file(aux, path, d);
        if (!t) return false;
        v->konst = copy_const(g, t->konst);
        if (!v->konst) return diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
        v->kind = VAL_CONSTANT;
        v->dtype = t->dtype;
        v->file_dtype = t->dtype;
        value_set_shape(v, t->rank, t->dims);
    }
    g->n_inputs = kept;
    return true;
}

static Result check_model(const char *folder, char *group, size_t group_len) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/%s", TESTS_DIR, folder);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    snprintf(group, group_len, "%s", folder);
    Diag d = {0};
    Graph *g = onnx_load(path, &d);
    if (!g) {
        if (d.code == DIAG_UNSUPPORTED) { if (getenv("CONF_DEBUG")) printf("LOADFAIL %s: %s\n", folder, d.msg); return R_UNSUPPORTED; }
        printf("FAIL %s: loading: %s\n", folder, d.msg);
        return R_FAIL;
    }
    group_name(g, folder, group, group_len);
    bool supported = true;
    GRAPH_FOR_NODES(g, n) {
        if (!n->def) supported = false;
    }
    if (!supported) { if (getenv("CONF_DEBUG")) { GRAPH_FOR_NODES(g, n) if (!n->def) { printf("NOOP %s: %s\n", folder, n->op_type); break; } }
        graph_free(g);
        return R_UNSUPPORTED;
    }
    Graph *aux = graph_new(path);
    ck_assert_ptr_nonnull(aux);
    ShapeOptions so = {.batch = 0, .fold = true};
    Result res = R_PASS;
    if (!constify_int_inputs(g, aux, dir, &d) || !ir_verify(g, &d) || !ir_infer_shapes(g, &so, &d)) {
        if (d.code == DIAG_UNSUPPORTED) {
            printf("unsupported %s: %s\n", folder, d.msg);
            res = R_UNSUPPORTED;
        } else {
            printf("FAIL %s: %s\n", folder, d.msg);
            res = R_FAIL;
        }
    }
    for (int k = 0; k < g->n_outputs && res == R_PASS; k++) {
        const Value *v = g->outputs[k];
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, k);
        if (!file_exists(path)) continue; /* omitted optional output */
        const Value *want = onnx_load_tensor_file(aux, path, &d);
        if (!want) {
            if (d.code == DIAG_UNSUPPORTED) {
                res = R_UNSUPPORTED;
                break;
            }
            printf("FAIL %s: expected output %d: %s\n", folder, k, d.msg);
            res = R_FAIL;
            break;
        }
        bool ok = v->dtype == want->dtype && v->rank == want->rank;
        for (int j = 0; ok && j < v->rank; j++)
            ok = dim_is_const(v->dims[j]) && v->dims[j].k == want->dims[j].k;
        if (!ok) {
            char ws[256], vs[256];
            printf("FAIL %s: output '%s': expected %s %s, inferred %s %s\n", folder, v->name,
                   dtype_name(want->dtype), shape_str(aux, want, ws, sizeof ws), dtype_name(v->dtype),
                   shape_str(g, v, vs, sizeof vs));
            res = R_FAIL;
        }
    }
    graph_free(aux);
    graph_free(g);
    return res;
}

START_TEST(inferred_shapes_match_onnx_node_tests) {
    int count = 0;
    char **names = list_tests(TESTS_DIR, &count);
    if (!names) {
        printf("SKIP: ../shared/onnx-node-tests not found\n");
        return;
    }
    Tally t = {0};
    for (int i = 0; i < count; i++) {
        char group[256];
        Result r = check_model(names[i], group, sizeof group);
        t.models++;
        if (r == R_UNSUPPORTED) {
            t.unsupported++;
            continue;
        }
        Group *gr = find_group(&t, group);
        gr->total++;
        if (r == R_PASS) {
            gr->passed++;
            t.passed++;
        } else {
            t.failed++;
        }
    }
    qsort(t.groups, (size_t)t.n_groups, sizeof *t.groups, cmp_group);
    for (int i = 0; i < t.n_groups; i++)
        printf("conformance %s: %d/%d passed\n", t.groups[i].name, t.groups[i].passed, t.groups[i].total);
    printf("conformance: %d passed, %d failed, %d unsupported (of %d models)\n", t.passed, t.failed,
           t.unsupported, t.models);
    fflush(stdout);
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    free(t.groups);
    ck_assert_msg(t.failed == 0, "%d supported ONNX node tests fail shape conformance", t.failed);
}
END_TEST

int main(void) {
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("onnx_node_tests");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, inferred_shapes_match_onnx_node_tests);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
