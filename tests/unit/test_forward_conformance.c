/* test_forward_conformance.c - forward numerics over ONNX's operator tests.
 *
 * Every folder test_* of ../shared/onnx-node-tests holds model.onnx and
 * test_data_set_0/{input,output}_K.pb.  Each model goes through the front
 * end as the driver runs it (verify, shape inference with folding, prune);
 * integer graph inputs become constants holding their test data first, as
 * in test_conformance.c, since real models carry such operands (shapes,
 * axes, indices) as initializers.  When every node left to run has a code
 * generation rule, the forward pass is compiled with LLVM and run in this
 * process: the float and bool inputs are written into the arena, the eval
 * step runs, and every graph output is compared with output_K.pb (floats
 * within rtol 1e-4 and atol 1e-5, NaN matching NaN; integers and bools
 * exactly).  Outputs folded to constants are compared from their contents.
 *
 * A model counts as unsupported when cleave refuses it (DIAG_UNSUPPORTED
 * from the loader, a shape rule or a kernel), when it holds an op cleave
 * does not know or one without a code generation rule, when a shape stays
 * symbolic or unknown, or when an input or output has a type the arena
 * cannot hold.  Models that need a Conv/Pool/Norm kernel (ops_nn.c) which
 * does not exist yet count as "pending nn"; once those kernels exist their
 * mismatches are listed but do not fail the test until that work lands.
 *
 * Results are grouped by op as in test_conformance.c: a single-op model
 * under its op, a multi-node model under "<Op>_expanded" when its value
 * names say which function was expanded, else under the folder name.
 *
 * CLEAVE_FORWARD_VERBOSE=1 also lists why each unsupported model is
 * unsupported; CLEAVE_FORWARD_ONLY=<substring> runs the matching folders
 * only (for debugging one op). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support.h"
#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "ops/ops.h"

#define TESTS_DIR CLEAVE_SHARED_DIR "/onnx-node-tests"
#define RTOL 1e-4
#define ATOL 1e-5
#define MAX_IO 64

typedef enum { FW_PASS, FW_FAIL, FW_UNSUPPORTED, FW_PENDING_NN, FW_NN_FAIL } FwResult;

typedef struct OpGroup {
    char name[256];
    int passed, total;
} OpGroup;

typedef struct FwTally {
    OpGroup *groups;
    int n_groups, cap;
    int passed, failed, unsupported, pending_nn, nn_failed, models;
} FwTally;

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int by_group(const void *a, const void *b) {
    return strcmp(((const OpGroup *)a)->name, ((const OpGroup *)b)->name);
}

/* Sorted test_* folder names; NULL when the folder does not exist. */
static char **test_folders(const char *dir, int *count) {
    DIR *dp = opendir(dir);
    if (!dp) return NULL;
    const char *only = getenv("CLEAVE_FORWARD_ONLY");
    int n = 0, cap = 512;
    char **names = malloc(sizeof *names * (size_t)cap);
    ck_assert_ptr_nonnull(names);
    for (struct dirent *e; (e = readdir(dp)) != NULL;) {
        if (strncmp(e->d_name, "test_", 5) != 0) continue;
        if (only && *only && !strstr(e->d_name, only)) continue;
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
    qsort(names, (size_t)n, sizeof *names, by_name);
    *count = n;
    return names;
}

/* The op a model is reported under (see the header comment). */
static void model_group(const Graph *g, const char *folder, char *out, size_t len) {
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

static OpGroup *group_for(FwTally *t, const char *name) {
    for (int i = 0; i < t->n_groups; i++)
        if (strcmp(t->groups[i].name, name) == 0) return &t->groups[i];
    if (t->n_groups == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->groups = realloc(t->groups, sizeof *t->groups * (size_t)t->cap);
        ck_assert_ptr_nonnull(t->groups);
    }
    OpGroup *gr = &t->groups[t->n_groups++];
    memset(gr, 0, sizeof *gr);
    snprintf(gr->name, sizeof gr->name, "%s", name);
    return gr;
}

static bool exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* Ops whose kernels belong to ops_nn.c, which is being written separately. */
static bool is_nn_op(const Node *n) {
    static const char *nn[] = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization",
                               "LayerNormalization"};
    if (n->domain && n->domain[0]) return false;
    for (size_t i = 0; i < sizeof nn / sizeof *nn; i++)
        if (strcmp(n->op_type, nn[i]) == 0) return true;
    return false;
}

/* Element types the arena holds: every float type as float32, bool and
 * 8-bit integers in one byte, other integers as int64. */
static bool arena_type(DType t) { return dtype_is_float(t) || dtype_is_int(t); }

/* Bytes per element of v's buffer. */
static int elem_bytes(const Value *v) {
    if (dtype_is_float(v->dtype)) return 4;
    return dtype_size(v->dtype) == 1 ? 1 : 8;
}

static int64_t read_int_elem(const Value *v, const void *buf, int64_t i) {
    if (elem_bytes(v) == 8) {
        int64_t x;
        memcpy(&x, (const char *)buf + i * 8, 8);
        return x;
    }
    uint8_t b = ((const uint8_t *)buf)[i];
    if (v->dtype == DT_INT8) return (int8_t)b;
    return b;
}

/* Test data of one model, read into `aux` (a .pb names its tensor like the
 * graph value, and names in the model's own graph must stay unique). */
typedef struct ModelData {
    Graph *aux;
    int n_in;
    Value *in_val[MAX_IO];  /* graph input the file belongs to */
    Value *in_data[MAX_IO]; /* its tensor (NULL: no file) */
    bool has_int;           /* an integer input has test data */
} ModelData;

/* Reads every input_K.pb and, when `constify`, makes integer (not bool)
 * inputs constants of g.  Returns false with d set on a reading error. */
static bool load_inputs(Graph *g, ModelData *md, const char *dir, bool constify, Diag *d) {
    if (g->n_inputs > MAX_IO) return diag_error(d, DIAG_UNSUPPORTED, "%d graph inputs", g->n_inputs);
    md->n_in = g->n_inputs;
    int kept = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        Value *v = g->inputs[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, i);
        md->in_val[i] = v;
        md->in_data[i] = NULL;
        if (exists(path)) {
            md->in_data[i] = onnx_load_tensor_file(md->aux, path, d);
            if (!md->in_data[i]) return false;
        }
        const Value *t = md->in_data[i];
        if (t && dtype_is_int(v->dtype) && v->dtype != DT_BOOL) md->has_int = true;
        if (!constify || !t || !dtype_is_int(v->dtype) || v->dtype == DT_BOOL) {
            g->inputs[kept++] = v;
            continue;
        }
        Const *k = const_new(g, t->konst->store, t->konst->n);
        if (!k) return diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
        memcpy(k->data, t->konst->data, (size_t)t->konst->n * (t->konst->store == DT_FLOAT ? 4 : 8));
        v->konst = k;
        v->kind = VAL_CONSTANT;
        v->dtype = t->dtype;
        v->file_dtype = t->dtype;
        value_set_shape(v, t->rank, t->dims);
    }
    g->n_inputs = kept;
    return true;
}

static bool value_ok(const Graph *g, const Value *v, char *why, size_t len) {
    if (!value_shape_known(v)) {
        char s[256];
        snprintf(why, len, "value '%s' has shape %s", v->name, shape_str(g, v, s, sizeof s));
        return false;
    }
    if (!arena_type(v->dtype)) {
        snprintf(why, len, "value '%s' has type %s", v->name, dtype_name(v->dtype));
        return false;
    }
    return true;
}

/* Why the pruned model cannot run here; NULL when it can.  Sets
 * *pending when the only obstacle is a missing ops_nn.c kernel. */
static const char *runnable(const Graph *g, bool *pending, char *why, size_t len) {
    *pending = false;
    const char *missing = NULL;
    bool only_nn = true;
    GRAPH_FOR_NODES(g, n) {
        if (n->def && n->def->cg) continue;
        if (!missing) missing = n->op_type;
        if (!is_nn_op(n)) {
            only_nn = false;
            missing = n->op_type;
        }
    }
    if (missing) {
        *pending = only_nn;
        snprintf(why, len, "op %s has no code generation rule", missing);
        return why;
    }
    /* every value the program touches: graph inputs and outputs, and the
     * operands of the nodes left to run */
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        bool used = v->is_output || v->kind == VAL_INPUT;
        for (int k = 0; k < g->n_outputs; k++) used = used || g->outputs[k] == v;
        if (!used) continue;
        if (!value_ok(g, v, why, len)) return why;
    }
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && !value_ok(g, n->in[i], why, len)) return why;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && !value_ok(g, n->out[k], why, len)) return why;
    }
    return NULL;
}

/* One element of a float expectation against what was computed. */
static bool close_enough(double want, double got) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= ATOL + RTOL * fabs(want);
}

/* Compares output v (buffer `buf`, or its constant contents when buf is
 * NULL) with the expected tensor. */
static bool compare_output(const char *folder, int k, const Value *v, const void *buf, const Value *want) {
    if (v->dtype != want->dtype && !(dtype_is_float(v->dtype) && dtype_is_float(want->dtype))) {
        printf("FAIL %s: output %d '%s': type %s, expected %s\n", folder, k, v->name, dtype_name(v->dtype),
               dtype_name(want->dtype));
        return false;
    }
    bool same_shape = v->rank == want->rank;
    for (int j = 0; same_shape && j < v->rank; j++) same_shape = v->dims[j].k == want->dims[j].k;
    if (!same_shape) {
        printf("FAIL %s: output %d '%s': shape differs from the expected tensor's\n", folder, k, v->name);
        return false;
    }
    int64_t n = want->konst->n, bad = 0, first = -1;
    double fw = 0, fg = 0;
    int64_t iw = 0, ig = 0;
    bool fl = dtype_is_float(want->dtype);
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        if (fl) {
            double w = const_get_f(want->konst, i);
            double got = buf ? ((const float *)buf)[i] : const_get_f(v->konst, i);
            ok = close_enough(w, got);
            if (!ok && first < 0) fw = w, fg = got;
        } else {
            int64_t w = const_get_i(want->konst, i);
            int64_t got = buf ? read_int_elem(v, buf, i) : const_get_i(v->konst, i);
            if (v->dtype == DT_BOOL) got = got != 0, w = w != 0;
            ok = w == got;
            if (!ok && first < 0) iw = w, ig = got;
        }
        if (!ok) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (!bad) return true;
    if (fl)
        printf("FAIL %s: output %d '%s'%s: %lld of %lld elements differ; first at index %lld: expected %.9g, got "
               "%.9g\n",
               folder, k, v->name, buf ? "" : " (folded)", (long long)bad, (long long)n, (long long)first, fw, fg);
    else
        printf("FAIL %s: output %d '%s'%s: %lld of %lld elements differ; first at index %lld: expected %lld, got "
               "%lld\n",
               folder, k, v->name, buf ? "" : " (folded)", (long long)bad, (long long)n, (long long)first,
               (long long)iw, (long long)ig);
    return false;
}

/* Writes an input tensor into its arena buffer. */
static void write_input(TestProg *tp, const Value *v, const Value *t) {
    char *buf = test_buf(tp, v);
    if (!buf) return;
    int eb = elem_bytes(v);
    for (int64_t i = 0; i < t->konst->n; i++) {
        if (eb == 4) {
            float f = (float)const_get_f(t->konst, i);
            memcpy(buf + i * 4, &f, 4);
        } else if (eb == 8) {
            int64_t x = const_get_i(t->konst, i);
            memcpy(buf + i * 8, &x, 8);
        } else {
            buf[i] = (char)(uint8_t)const_get_i(t->konst, i);
        }
    }
}

/* Classifies a failed compilation: test_prog_forward reports the message
 * only, so planning and module building run again for the Diag's code
 * (both are cheap next to optimisation, which is not reached). */
static DiagCode compile_error_code(Graph *g) {
    Diag d = {0};
    Plan p;
    memset(&p, 0, sizeof p);
    if (!plan_forward(g, &p, &d)) return d.code;
    CgOptions co = {.emit = "obj"};
    CgModule *m = cg_build(&p, &co, &d);
    cg_module_free(m);
    return d.code;
}

/* What one run of a model found besides its result. */
typedef struct RunInfo {
    char group[256];
    bool has_int;  /* the model has integer inputs with test data */
    bool compiled; /* nodes were left to run (not everything folded) */
} RunInfo;

/* Runs one model.  With runtime_ints its integer inputs stay run-time
 * inputs (the variant that reaches the integer paths of the kernels);
 * otherwise they become constants.  `label` names the run in messages. */
static FwResult run_model(const char *folder, bool runtime_ints, RunInfo *info) {
    char dir[2048], path[4096], why[512], label[2300];
    snprintf(dir, sizeof dir, "%s/%s", TESTS_DIR, folder);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    snprintf(label, sizeof label, "%s%s", folder, runtime_ints ? " [integer inputs at run time]" : "");
    snprintf(info->group, sizeof info->group, "%s", folder);
    info->compiled = info->has_int = false;
    bool verbose = env_flag("CLEAVE_FORWARD_VERBOSE");
    Diag d = {0};
    Graph *g = onnx_load(path, &d);
    if (!g) {
        if (d.code == DIAG_UNSUPPORTED) {
            if (verbose) printf("unsupported %s: %s\n", label, d.msg);
            return FW_UNSUPPORTED;
        }
        printf("FAIL %s: loading: %s\n", label, d.msg);
        return FW_FAIL;
    }
    model_group(g, folder, info->group, sizeof info->group);
    GRAPH_FOR_NODES(g, n) {
        if (n->def) continue;
        if (verbose) printf("unsupported %s: unknown op %s\n", label, n->op_type);
        graph_free(g);
        return FW_UNSUPPORTED;
    }
    ModelData md = {.aux = graph_new(path)};
    ck_assert_ptr_nonnull(md.aux);
    FwResult res = FW_PASS;
    ShapeOptions so = {.batch = 0, .fold = true};
    bool ok = load_inputs(g, &md, dir, !runtime_ints, &d);
    info->has_int = md.has_int;
    ok = ok && ir_verify(g, &d) && ir_infer_shapes(g, &so, &d);
    if (ok) {
        ir_prune(g);
        ok = ir_verify(g, &d);
    }
    if (!ok) {
        /* Shape rules may need constant operands; with run-time integers
         * that is a limit of the variant, not a wrong result. */
        if (d.code == DIAG_UNSUPPORTED || runtime_ints) {
            if (verbose) printf("unsupported %s: %s\n", label, d.msg);
            res = FW_UNSUPPORTED;
        } else {
            printf("FAIL %s: front end: %s\n", label, d.msg);
            res = FW_FAIL;
        }
        goto done;
    }
    bool pending;
    if (runnable(g, &pending, why, sizeof why)) {
        if (verbose) printf("%s %s: %s\n", pending ? "pending nn" : "unsupported", label, why);
        res = pending ? FW_PENDING_NN : FW_UNSUPPORTED;
        goto done;
    }
    bool nn = false;
    GRAPH_FOR_NODES(g, n) {
        info->compiled = true;
        if (is_nn_op(n)) nn = true;
    }
    /* expected outputs, before compiling (an unreadable type is refused) */
    if (g->n_outputs > MAX_IO) {
        res = FW_UNSUPPORTED;
        goto done;
    }
    const Value *want[MAX_IO] = {0};
    for (int k = 0; k < g->n_outputs; k++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, k);
        if (!exists(path)) continue; /* an omitted optional output */
        want[k] = onnx_load_tensor_file(md.aux, path, &d);
        if (!want[k]) {
            if (d.code == DIAG_UNSUPPORTED) {
                if (verbose) printf("unsupported %s: %s\n", label, d.msg);
                res = FW_UNSUPPORTED;
            } else {
                printf("FAIL %s: expected output %d: %s\n", label, k, d.msg);
                res = FW_FAIL;
            }
            goto done;
        }
    }
    for (int i = 0; i < md.n_in; i++) {
        const Value *v = md.in_val[i], *t = md.in_data[i];
        if (v->kind != VAL_INPUT || !t) continue;
        if (t->konst->n != value_numel(v)) {
            printf("FAIL %s: input '%s' holds %lld elements, the graph expects %lld\n", label, v->name,
                   (long long)t->konst->n, (long long)value_numel(v));
            res = FW_FAIL;
            goto done;
        }
    }
    if (!info->compiled && runtime_ints) {
        res = FW_UNSUPPORTED; /* folded all the same: nothing new to check */
        goto done;
    }
    TestProg tp;
    char msg[1024];
    if (!test_prog_forward(&tp, g, msg, sizeof msg)) {
        DiagCode code = compile_error_code(g);
        if (code == DIAG_UNSUPPORTED) {
            if (verbose) printf("unsupported %s: %s\n", label, msg);
            res = FW_UNSUPPORTED;
        } else {
            printf("FAIL %s: compiling: %s\n", label, msg);
            res = nn ? FW_NN_FAIL : FW_FAIL;
        }
        cg_jit_free(tp.jit);
        free(tp.arena);
        goto done;
    }
    for (int i = 0; i < md.n_in; i++)
        if (md.in_val[i]->kind == VAL_INPUT && md.in_data[i]) write_input(&tp, md.in_val[i], md.in_data[i]);
    tp.eval(tp.arena);
    for (int k = 0; k < g->n_outputs; k++) {
        if (!want[k]) continue;
        const Value *v = g->outputs[k];
        const void *buf = test_buf(&tp, v);
        bool folded = v->konst && v->kind == VAL_CONSTANT;
        if (!buf && !folded) {
            printf("FAIL %s: output %d '%s' has neither a buffer nor constant contents\n", label, k, v->name);
            res = nn ? FW_NN_FAIL : FW_FAIL;
            continue;
        }
        if (!compare_output(label, k, v, folded ? NULL : buf, want[k])) res = nn ? FW_NN_FAIL : FW_FAIL;
    }
    tp.g = NULL; /* freed below */
    test_prog_free(&tp);
done:
    graph_free(md.aux);
    graph_free(g);
    return res;
}

/* A model's result over its runs: any failure fails it, else any pass
 * passes it; otherwise the first run's verdict stands. */
static FwResult combine(FwResult first, FwResult second) {
    if (first == FW_FAIL || second == FW_FAIL) return FW_FAIL;
    if (first == FW_NN_FAIL || second == FW_NN_FAIL) return FW_NN_FAIL;
    if (first == FW_PASS || second == FW_PASS) return FW_PASS;
    return first;
}

START_TEST(forward_outputs_match_onnx_node_tests) {
    int count = 0;
    char **names = test_folders(TESTS_DIR, &count);
    if (!names) {
        printf("SKIP: ../shared/onnx-node-tests not found (forward conformance not run)\n");
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FwTally t = {0};
    int compiled = 0, folded = 0, v_ran = 0, v_passed = 0, v_failed = 0;
    for (int i = 0; i < count; i++) {
        RunInfo info;
        FwResult r = run_model(names[i], false, &info);
        if (r == FW_PASS || r == FW_FAIL || r == FW_NN_FAIL) {
            if (info.compiled) compiled++;
            else folded++;
        }
        if (info.has_int && r != FW_PENDING_NN) {
            RunInfo vi;
            FwResult rv = run_model(names[i], true, &vi);
            if (rv != FW_UNSUPPORTED && rv != FW_PENDING_NN) {
                v_ran++;
                v_passed += rv == FW_PASS;
                v_failed += rv == FW_FAIL || rv == FW_NN_FAIL;
            }
            r = combine(r, rv);
        }
        fflush(stdout);
        t.models++;
        if (r == FW_UNSUPPORTED) {
            t.unsupported++;
            continue;
        }
        if (r == FW_PENDING_NN) {
            t.pending_nn++;
            continue;
        }
        OpGroup *gr = group_for(&t, info.group);
        gr->total++;
        if (r == FW_PASS) {
            gr->passed++;
            t.passed++;
        } else if (r == FW_NN_FAIL) {
            t.nn_failed++;
        } else {
            t.failed++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qsort(t.groups, (size_t)t.n_groups, sizeof *t.groups, by_group);
    for (int i = 0; i < t.n_groups; i++)
        printf("forward %s: %d/%d passed\n", t.groups[i].name, t.groups[i].passed, t.groups[i].total);
    printf("forward: %d passed, %d failed, %d unsupported (of %d models)\n", t.passed, t.failed + t.nn_failed,
           t.unsupported, t.models);
    printf("forward: with integer inputs as constants %d models ran compiled code and %d folded completely; with "
           "integer inputs at run time %d more runs compiled: %d passed, %d failed\n",
           compiled, folded, v_ran, v_passed, v_failed);
    printf("forward pending nn: %d models wait for Conv/Pool/Norm kernels (not in the counts above); %d failures "
           "above use those kernels and do not fail the test yet\n",
           t.pending_nn, t.nn_failed);
    printf("forward: %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    fflush(stdout);
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    free(t.groups);
    ck_assert_msg(t.failed == 0, "%d supported ONNX node tests compute wrong forward results", t.failed);
}
END_TEST

int main(void) {
    Suite *s = suite_create("forward_conformance");
    TCase *tc = tcase_create("onnx_node_tests");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, forward_outputs_match_onnx_node_tests);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
