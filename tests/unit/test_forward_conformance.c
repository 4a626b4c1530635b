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
 * exactly; float16 and bfloat16 outputs also within one unit in their last
 * place).  Outputs folded to constants are compared from their contents.
 *
 * Folding computes most integer models at compile time, so a model with
 * integer inputs runs a second time with them as run-time inputs; when its
 * shapes still resolve, that run reaches the integer paths of the kernels.
 * A model fails when either run computes a wrong result.
 *
 * A model counts as unsupported when cleave refuses it (DIAG_UNSUPPORTED
 * from the loader, a shape rule or a kernel), when it holds an op cleave
 * does not know or one left without a code generation rule, when a shape
 * stays symbolic or unknown, or when an input or output has a type the
 * arena cannot hold.  Every mismatch among the rest fails the test.
 *
 * Results are grouped by op as in test_conformance.c: a single-op model
 * under its op, a multi-node model under "<Op>_expanded" when its value
 * names say which function was expanded, else under the folder name.
 *
 * CLEAVE_FORWARD_VERBOSE=1 also lists why each unsupported model is
 * unsupported; CLEAVE_FORWARD_ONLY=<substring> runs the matching folders
 * only (for debugging one op).  The "kernels" cases at the end cover what
 * the ONNX data does not: large and narrow integers, casts, NaN, float16. */
#include <errno.h> /* program_invocation_short_name (_GNU_SOURCE, set by the build) */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"
#include "ir/shapes.h"
#include "ops/ops.h"

#define RTOL 1e-4
#define ATOL 1e-5
#define MAX_IO 64

typedef enum { FW_PASS, FW_FAIL, FW_UNSUPPORTED, FW_PENDING_NN, FW_NN_FAIL } FwResult;

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* CLEAVE_FORWARD_ONLY=<substring>: the matching folders only. */
static bool selected(const char *folder) {
    const char *only = getenv("CLEAVE_FORWARD_ONLY");
    return !only || !*only || strstr(folder, only) != NULL;
}

/* Ops whose kernels belong to ops_nn.c, which is being written separately. */
static bool is_nn_op(const Node *n) {
    static const char *nn[] = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                               "BatchNormalization", "LayerNormalization"};
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
        if ((v->is_output || v->kind == VAL_INPUT) && !value_ok(g, v, why, len)) return why;
    }
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && !value_ok(g, n->in[i], why, len)) return why;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && !value_ok(g, n->out[k], why, len)) return why;
    }
    return NULL;
}

/* Spacing of the type's values around w (float16 and bfloat16: 10 and 7
 * fraction bits, with their smallest subnormal below); 0 for other types. */
static double type_ulp(DType t, double w) {
    if (t != DT_FLOAT16 && t != DT_BFLOAT16) return 0;
    int bits = t == DT_FLOAT16 ? 10 : 7, min_exp = t == DT_FLOAT16 ? -24 : -133, e;
    frexp(w, &e);
    int q = e - 1 - bits;
    return ldexp(1.0, q < min_exp ? min_exp : q);
}

/* One element of a float expectation against what was computed.  Outputs
 * of 16-bit float types may also differ by one unit of their last place:
 * rtol 1e-4 is finer than their precision, so an intermediate result
 * computed in another order may round to the neighbouring value. */
static bool close_enough(DType t, double want, double got, double atol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    double err = fabs(got - want);
    return err <= atol + RTOL * fabs(want) || err <= type_ulp(t, want);
}

/* Node tests whose expected outputs are stored rounded to four decimals:
 * 1.3595/9 = 0.151056 is stored as 0.1511.  They are compared with the
 * rounding's own bound instead of ATOL. */
static double folder_atol(const char *folder) {
    static const char *rounded[] = {"test_averagepool_2d_ceil_last_window_starts_on_pad"};
    for (size_t i = 0; i < sizeof rounded / sizeof *rounded; i++)
        if (strstr(folder, rounded[i])) return 5e-5;
    return ATOL;
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
            ok = close_enough(want->dtype, w, got, folder_atol(folder));
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
    char why[512], label[2300];
    snprintf(label, sizeof label, "%s%s", folder, runtime_ints ? " [integer inputs at run time]" : "");
    snprintf(info->group, sizeof info->group, "%s", folder);
    info->compiled = info->has_int = false;
    bool verbose = env_flag("CLEAVE_FORWARD_VERBOSE");
    Diag d = {0};
    NodeTest nt;
    if (!node_test_load(&nt, folder, &d)) {
        node_test_free(&nt);
        if (d.code == DIAG_UNSUPPORTED) {
            if (verbose) printf("unsupported %s: %s\n", label, d.msg);
            return FW_UNSUPPORTED;
        }
        printf("FAIL %s: loading: %s\n", label, d.msg);
        return FW_FAIL;
    }
    Graph *g = nt.g;
    node_test_group(g, folder, info->group, sizeof info->group);
    GRAPH_FOR_NODES(g, n) {
        if (n->def) continue;
        if (verbose) printf("unsupported %s: unknown op %s\n", label, n->op_type);
        node_test_free(&nt);
        return FW_UNSUPPORTED;
    }
    FwResult res = FW_PASS;
    ShapeOptions so = {.batch = 0, .fold = true};
    /* a model with more than MAX_IO inputs (or outputs) counts as unsupported */
    bool ok = g->n_inputs > MAX_IO
                  ? diag_error(&d, DIAG_UNSUPPORTED, "%d graph inputs", g->n_inputs)
                  : node_test_read_inputs(&nt, runtime_ints ? 0 : NODE_INPUTS_CONSTIFY, &d);
    info->has_int = nt.has_int;
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
        /* want[k] stays NULL for an omitted optional output */
        if (!node_test_expected(&nt, k, &want[k], &d)) {
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
    for (int i = 0; i < nt.n_in; i++) {
        const Value *v = nt.in_val[i], *t = nt.in_data[i];
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
    for (int i = 0; i < nt.n_in; i++)
        if (nt.in_val[i]->kind == VAL_INPUT && nt.in_data[i]) write_input(&tp, nt.in_val[i], nt.in_data[i]);
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
    node_test_free(&nt);
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
    char **names = node_test_names(selected, &count);
    if (!names) {
        test_skip("../shared/onnx-node-tests not found (forward conformance not run)");
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    OpGroups groups = {0};
    int passed = 0, failed = 0, unsupported = 0, pending_nn = 0, nn_failed = 0, models = 0;
    int compiled = 0, folded = 0, v_ran = 0, v_passed = 0, v_failed = 0;
    /* Under the sanitizers every LLVM allocation goes through ASan's
     * allocator and compiling ~650 models takes too long; the sanitizer run
     * sets CLEAVE_TEST_STRIDE=k to compile every k-th folder (the plain
     * build runs them all). */
    int stride = getenv("CLEAVE_TEST_STRIDE") ? atoi(getenv("CLEAVE_TEST_STRIDE")) : 1;
    if (stride < 1) stride = 1;
    if (stride > 1) printf("forward: CLEAVE_TEST_STRIDE=%d: every %d-th folder only\n", stride, stride);
    for (int i = 0; i < count; i++) {
        if (i % stride) continue;
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
        models++;
        if (r == FW_UNSUPPORTED) {
            unsupported++;
            continue;
        }
        if (r == FW_PENDING_NN) {
            pending_nn++;
            continue;
        }
        op_groups_count(&groups, info.group, r == FW_PASS);
        if (r == FW_PASS) passed++;
        else if (r == FW_NN_FAIL) nn_failed++;
        else failed++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    op_groups_print(&groups, "forward");
    printf("forward: %d passed, %d failed, %d unsupported (of %d models)\n", passed, failed + nn_failed, unsupported,
           models);
    printf("forward: with integer inputs as constants %d models ran compiled code and %d folded completely; with "
           "integer inputs at run time %d more runs compiled: %d passed, %d failed\n",
           compiled, folded, v_ran, v_passed, v_failed);
    printf("forward: %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    fflush(stdout);
    node_test_names_free(names, count);
    op_groups_free(&groups);
    ck_assert_msg(failed + nn_failed == 0, "%d supported ONNX node tests compute wrong forward results",
                  failed + nn_failed);
}
END_TEST

/* ---- kernel cases the ONNX data does not reach ----
 *
 * The node tests keep integers small and feed integer operands as
 * constants, so these hand-built graphs run the integer, bool, 16-bit float
 * and NaN paths of the kernels with run-time inputs. */

static Graph *kg_new(int64_t opset) { return test_graph_new("kernels.onnx", opset, 16, 16); }


static void kg_attr_axis1(Node *n) {
    static int64_t one[] = {1};
    n->attrs[n->n_attr++] = (Attr){.name = "axes", .kind = ATTR_INTS, .n = 1, .ints = one};
}

/* Front end and compilation; false with the message in msg when the
 * compiler refuses. */
static bool kg_compile(TestProg *tp, Graph *g, char *msg, size_t len) {
    Diag d = {0};
    ShapeOptions so = {.batch = 0, .fold = true};
    bool ok = ir_verify(g, &d) && ir_infer_shapes(g, &so, &d);
    ck_assert_msg(ok, "front end: %s", d.msg);
    ir_prune(g);
    return test_prog_forward(tp, g, msg, len);
}

static void kg_build(TestProg *tp, Graph *g) {
    char msg[1024];
    ck_assert_msg(kg_compile(tp, g, msg, sizeof msg), "compiling: %s", msg);
}

/* Input contents: floats from f, integers from i. */
static void kg_put(TestProg *tp, const Value *v, const double *f, const int64_t *i) {
    char *buf = test_buf(tp, v);
    ck_assert_ptr_nonnull(buf);
    int eb = elem_bytes(v);
    for (int64_t e = 0; e < value_numel(v); e++) {
        if (eb == 4) {
            float x = (float)f[e];
            memcpy(buf + e * 4, &x, 4);
        } else if (eb == 8) {
            memcpy(buf + e * 8, &i[e], 8);
        } else {
            buf[e] = (char)(uint8_t)i[e];
        }
    }
}

static int64_t kg_int(TestProg *tp, const Node *n, int64_t e) {
    const Value *y = n->out[0];
    const void *buf = test_buf(tp, y);
    ck_assert_ptr_nonnull(buf);
    return read_int_elem(y, buf, e);
}

static double kg_float(TestProg *tp, const Node *n, int64_t e) {
    const float *buf = test_buf(tp, n->out[0]);
    ck_assert_ptr_nonnull(buf);
    return buf[e];
}

static void kg_expect_ints(TestProg *tp, const Node *n, int count, const int64_t *want) {
    ck_assert_int_eq(value_numel(n->out[0]), count);
    for (int e = 0; e < count; e++) {
        int64_t got = kg_int(tp, n, e);
        ck_assert_msg(got == want[e], "%s element %d: expected %lld, got %lld", n->op_type, e, (long long)want[e],
                      (long long)got);
    }
}

static void kg_expect_floats(TestProg *tp, const Node *n, int count, const double *want) {
    ck_assert_int_eq(value_numel(n->out[0]), count);
    for (int e = 0; e < count; e++) {
        double got = kg_float(tp, n, e);
        ck_assert_msg(close_enough(DT_FLOAT, want[e], got, ATOL), "%s element %d: expected %.9g, got %.9g", n->op_type, e,
                      want[e], got);
    }
}

#define P40 ((int64_t)1 << 40)

/* a*b wrapped to 64 bits, as the kernels compute it */
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

START_TEST(int64_arithmetic_is_exact) {
    Graph *g = kg_new(17);
    const int64_t d4[] = {4};
    Value *a = test_graph_input(g, "a", DT_INT64, 1, d4), *b = test_graph_input(g, "b", DT_INT64, 1, d4);
    Node *add = test_graph_op(g, "Add", 2, (Value *[]){a, b});
    Node *sub = test_graph_op(g, "Sub", 2, (Value *[]){a, b});
    Node *mul = test_graph_op(g, "Mul", 2, (Value *[]){a, b});
    Node *div = test_graph_op(g, "Div", 2, (Value *[]){a, b});
    Node *neg = test_graph_op(g, "Neg", 1, (Value *[]){a});
    Node *abs = test_graph_op(g, "Abs", 1, (Value *[]){a});
    Node *mx = test_graph_op(g, "Max", 2, (Value *[]){a, b});
    Node *lt = test_graph_op(g, "Less", 2, (Value *[]){a, b});
    Node *eq = test_graph_op(g, "Equal", 2, (Value *[]){a, b});
    TestProg tp;
    kg_build(&tp, g);
    const int64_t av[] = {P40 + 1, -7, 5, INT64_MIN}, bv[] = {P40, 2, 0, -1};
    kg_put(&tp, a, NULL, av);
    kg_put(&tp, b, NULL, bv);
    tp.eval(tp.arena);
    kg_expect_ints(&tp, add, 4, (int64_t[]){2 * P40 + 1, -5, 5, INT64_MAX});
    kg_expect_ints(&tp, sub, 4, (int64_t[]){1, -9, 5, INT64_MIN + 1});
    kg_expect_ints(&tp, mul, 4, (int64_t[]){wrap_mul(P40 + 1, P40), -14, 0, INT64_MIN});
    /* truncation toward zero; a zero divisor gives 0 instead of trapping */
    kg_expect_ints(&tp, div, 4, (int64_t[]){1, -3, 0, INT64_MIN});
    kg_expect_ints(&tp, neg, 4, (int64_t[]){-P40 - 1, 7, -5, INT64_MIN});
    kg_expect_ints(&tp, abs, 4, (int64_t[]){P40 + 1, 7, 5, INT64_MIN});
    kg_expect_ints(&tp, mx, 4, (int64_t[]){P40 + 1, 2, 5, -1});
    kg_expect_ints(&tp, lt, 4, (int64_t[]){0, 1, 0, 1});
    kg_expect_ints(&tp, eq, 4, (int64_t[]){0, 0, 0, 0});
    test_prog_free(&tp);
}
END_TEST

START_TEST(narrow_integers_wrap_and_read_unsigned) {
    Graph *g = kg_new(17);
    const int64_t d3[] = {3};
    Value *a = test_graph_input(g, "a", DT_UINT8, 1, d3), *b = test_graph_input(g, "b", DT_UINT8, 1, d3);
    Value *c = test_graph_input(g, "c", DT_INT32, 1, d3), *e = test_graph_input(g, "e", DT_INT32, 1, d3);
    Node *add = test_graph_op(g, "Add", 2, (Value *[]){a, b});
    Node *gt = test_graph_op(g, "Greater", 2, (Value *[]){a, b});
    Node *toi64 = test_graph_op(g, "Cast", 1, (Value *[]){a});
    test_attr_i(toi64, "to", DT_INT64);
    Node *add32 = test_graph_op(g, "Add", 2, (Value *[]){c, e});
    Node *mul32 = test_graph_op(g, "Mul", 2, (Value *[]){c, e});
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, a, NULL, (int64_t[]){200, 3, 255});
    kg_put(&tp, b, NULL, (int64_t[]){100, 4, 1});
    kg_put(&tp, c, NULL, (int64_t[]){INT32_MAX, -5, 65536});
    kg_put(&tp, e, NULL, (int64_t[]){1, 2, 65536});
    tp.eval(tp.arena);
    kg_expect_ints(&tp, add, 3, (int64_t[]){44, 7, 0});
    kg_expect_ints(&tp, gt, 3, (int64_t[]){1, 0, 1});
    kg_expect_ints(&tp, toi64, 3, (int64_t[]){200, 3, 255});
    kg_expect_ints(&tp, add32, 3, (int64_t[]){INT32_MIN, -3, 131072});
    kg_expect_ints(&tp, mul32, 3, (int64_t[]){INT32_MAX, -10, 0});
    test_prog_free(&tp);
}
END_TEST

START_TEST(casts_follow_onnx) {
    Graph *g = kg_new(19);
    const int64_t d4[] = {4};
    Value *x = test_graph_input(g, "x", DT_FLOAT, 1, d4), *k = test_graph_input(g, "k", DT_INT64, 1, d4);
    static const struct { int from_int; DType to; } casts[] = {
        {0, DT_BOOL}, {0, DT_UINT8}, {0, DT_INT32}, {0, DT_FLOAT16}, {0, DT_BFLOAT16},
        {1, DT_BOOL}, {1, DT_INT32}, {1, DT_UINT8}, {1, DT_FLOAT},
    };
    enum { NC = sizeof casts / sizeof *casts };
    Node *n[NC];
    for (int i = 0; i < NC; i++) {
        n[i] = test_graph_op(g, "Cast", 1, (Value *[]){casts[i].from_int ? k : x});
        test_attr_i(n[i], "to", casts[i].to);
    }
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, x, (double[]){0.5, 0, -2.75, 200.9}, NULL);
    kg_put(&tp, k, NULL, (int64_t[]){256, 0, ((int64_t)1 << 31) + 5, -1});
    tp.eval(tp.arena);
    kg_expect_ints(&tp, n[0], 4, (int64_t[]){1, 0, 1, 1});    /* nonzero, not truncation */
    kg_expect_ints(&tp, n[1], 4, (int64_t[]){0, 0, 254, 200}); /* toward zero, then wrapped */
    kg_expect_ints(&tp, n[2], 4, (int64_t[]){0, 0, -2, 200});
    kg_expect_floats(&tp, n[3], 4, (double[]){0.5, 0, -2.75, 200.875});
    kg_expect_floats(&tp, n[4], 4, (double[]){0.5, 0, -2.75, 201});
    kg_expect_ints(&tp, n[5], 4, (int64_t[]){1, 0, 1, 1});
    kg_expect_ints(&tp, n[6], 4, (int64_t[]){256, 0, INT32_MIN + 5, -1});
    kg_expect_ints(&tp, n[7], 4, (int64_t[]){0, 0, 5, 255});
    kg_expect_floats(&tp, n[8], 4, (double[]){256, 0, 2147483653.0, -1});
    test_prog_free(&tp);
}
END_TEST

START_TEST(float16_rounding) {
    Graph *g = kg_new(19);
    const int64_t d6[] = {6};
    Value *x = test_graph_input(g, "x", DT_FLOAT, 1, d6);
    Node *h = test_graph_op(g, "Cast", 1, (Value *[]){x});
    test_attr_i(h, "to", DT_FLOAT16);
    TestProg tp;
    kg_build(&tp, g);
    /* ties to even, subnormals, overflow to infinity, NaN */
    kg_put(&tp, x, (double[]){1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 3e-7, 65519, 65520, NAN}, NULL);
    tp.eval(tp.arena);
    double want[] = {1.0, 1.0 + 4.0 / 2048, 5.0 * ldexp(1, -24), 65504, INFINITY, NAN};
    for (int e = 0; e < 6; e++) {
        double got = kg_float(&tp, h, e);
        ck_assert_msg(isnan(want[e]) ? isnan(got) : got == want[e], "element %d: expected %.9g, got %.9g", e,
                      want[e], got);
    }
    test_prog_free(&tp);
}
END_TEST

START_TEST(nan_propagates_through_max_and_min) {
    Graph *g = kg_new(13);
    const int64_t d3[] = {3}, d23[] = {2, 3};
    Value *a = test_graph_input(g, "a", DT_FLOAT, 1, d3), *b = test_graph_input(g, "b", DT_FLOAT, 1, d3);
    Value *m = test_graph_input(g, "m", DT_FLOAT, 2, d23);
    Node *mx = test_graph_op(g, "Max", 2, (Value *[]){a, b});
    Node *mn = test_graph_op(g, "Min", 2, (Value *[]){a, b});
    Node *rmax = test_graph_op(g, "ReduceMax", 1, (Value *[]){m});
    test_attr_i(rmax, "keepdims", 0);
    Node *rmin = test_graph_op(g, "ReduceMin", 1, (Value *[]){m});
    test_attr_i(rmin, "keepdims", 0);
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, a, (double[]){1, NAN, 2}, NULL);
    kg_put(&tp, b, (double[]){NAN, 1, 3}, NULL);
    kg_put(&tp, m, (double[]){1, NAN, 2, 4, 5, 6}, NULL);
    tp.eval(tp.arena);
    kg_expect_floats(&tp, mx, 3, (double[]){NAN, NAN, 3});
    kg_expect_floats(&tp, mn, 3, (double[]){NAN, NAN, 2});
    kg_expect_floats(&tp, rmax, 1, (double[]){NAN});
    kg_expect_floats(&tp, rmin, 1, (double[]){NAN});
    test_prog_free(&tp);
}
END_TEST

START_TEST(integer_and_bool_reductions) {
    Graph *g = kg_new(13);
    const int64_t d23[] = {2, 3};
    Value *x = test_graph_input(g, "x", DT_INT64, 2, d23), *bl = test_graph_input(g, "bl", DT_BOOL, 2, d23);
    Value *u = test_graph_input(g, "u", DT_UINT8, 2, d23);
    Node *sum = test_graph_op(g, "ReduceSum", 1, (Value *[]){x});
    test_attr_i(sum, "keepdims", 0);
    /* opset 13: axes by attribute except for ReduceSum */
    Node *mean = test_graph_op(g, "ReduceMean", 1, (Value *[]){x});
    kg_attr_axis1(mean);
    Node *prod = test_graph_op(g, "ReduceProd", 1, (Value *[]){x});
    kg_attr_axis1(prod);
    Node *bmin = test_graph_op(g, "ReduceMin", 1, (Value *[]){bl});
    kg_attr_axis1(bmin);
    Node *bmax = test_graph_op(g, "ReduceMax", 1, (Value *[]){bl});
    kg_attr_axis1(bmax);
    Node *umin = test_graph_op(g, "ReduceMin", 1, (Value *[]){u});
    kg_attr_axis1(umin);
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, x, NULL, (int64_t[]){P40, P40 + 1, 3, -7, 0, 0});
    kg_put(&tp, bl, NULL, (int64_t[]){1, 1, 1, 0, 1, 0});
    kg_put(&tp, u, NULL, (int64_t[]){200, 255, 130, 7, 255, 9});
    tp.eval(tp.arena);
    kg_expect_ints(&tp, sum, 1, (int64_t[]){2 * P40 + 1 + 3 - 7});
    kg_expect_ints(&tp, mean, 2, (int64_t[]){(2 * P40 + 4) / 3, -2}); /* toward zero */
    kg_expect_ints(&tp, prod, 2, (int64_t[]){wrap_mul(wrap_mul(P40, P40 + 1), 3), 0});
    kg_expect_ints(&tp, bmin, 2, (int64_t[]){1, 0});
    kg_expect_ints(&tp, bmax, 2, (int64_t[]){1, 1});
    kg_expect_ints(&tp, umin, 2, (int64_t[]){130, 7});
    test_prog_free(&tp);
}
END_TEST

START_TEST(reductions_noop_and_half_precision) {
    Graph *g = kg_new(18);
    const int64_t d23[] = {2, 3}, d2048[] = {2048};
    Value *x = test_graph_input(g, "x", DT_FLOAT, 2, d23), *h = test_graph_input(g, "h", DT_FLOAT16, 1, d2048);
    /* opset 18: no axes input and noop_with_empty_axes=1 leave x as it is */
    Node *l2 = test_graph_op(g, "ReduceL2", 1, (Value *[]){x});
    test_attr_i(l2, "noop_with_empty_axes", 1);
    Node *ss = test_graph_op(g, "ReduceSumSquare", 1, (Value *[]){x});
    test_attr_i(ss, "noop_with_empty_axes", 1);
    Node *all = test_graph_op(g, "ReduceL2", 1, (Value *[]){x});
    test_attr_i(all, "keepdims", 0);
    /* 2048 halves of 1 + 2^-10: a float16 running sum would stall at 2048 */
    Node *hs = test_graph_op(g, "ReduceSum", 1, (Value *[]){h});
    test_attr_i(hs, "keepdims", 0);
    TestProg tp;
    kg_build(&tp, g);
    const double xv[] = {3, -4, 0, 1, -2, 2};
    kg_put(&tp, x, xv, NULL);
    double hv[2048];
    for (int i = 0; i < 2048; i++) hv[i] = 1 + 1.0 / 1024;
    kg_put(&tp, h, hv, NULL);
    tp.eval(tp.arena);
    kg_expect_floats(&tp, l2, 6, xv);
    kg_expect_floats(&tp, ss, 6, xv);
    kg_expect_floats(&tp, all, 1, (double[]){sqrt(34)});
    kg_expect_floats(&tp, hs, 1, (double[]){2050}); /* 2050 rounded to float16 */
    test_prog_free(&tp);
}
END_TEST

START_TEST(matmul_promotes_1d_operands) {
    Graph *g = kg_new(13);
    const int64_t d3[] = {3}, d32[] = {3, 2}, d23[] = {2, 3};
    Value *v = test_graph_input(g, "v", DT_FLOAT, 1, d3), *w = test_graph_input(g, "w", DT_FLOAT, 1, d3);
    Value *b = test_graph_input(g, "b", DT_FLOAT, 2, d32), *a = test_graph_input(g, "a", DT_FLOAT, 2, d23);
    Value *ia = test_graph_input(g, "ia", DT_INT64, 2, d23), *ib = test_graph_input(g, "ib", DT_INT64, 2, d32);
    Node *vb = test_graph_op(g, "MatMul", 2, (Value *[]){v, b});
    Node *av = test_graph_op(g, "MatMul", 2, (Value *[]){a, v});
    Node *vw = test_graph_op(g, "MatMul", 2, (Value *[]){v, w});
    Node *ii = test_graph_op(g, "MatMul", 2, (Value *[]){ia, ib});
    Node *gi = test_graph_op(g, "Gemm", 2, (Value *[]){ia, ib});
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, v, (double[]){1, 2, 3}, NULL);
    kg_put(&tp, w, (double[]){4, 5, 6}, NULL);
    kg_put(&tp, b, (double[]){1, 2, 3, 4, 5, 6}, NULL);
    kg_put(&tp, a, (double[]){1, 0, -1, 2, 2, 2}, NULL);
    kg_put(&tp, ia, NULL, (int64_t[]){P40, 1, 0, 0, 0, 1});
    kg_put(&tp, ib, NULL, (int64_t[]){1, 2, 3, 4, P40, P40 + 1});
    tp.eval(tp.arena);
    kg_expect_floats(&tp, vb, 2, (double[]){22, 28});
    kg_expect_floats(&tp, av, 2, (double[]){-2, 12});
    ck_assert_int_eq(vw->out[0]->rank, 0);
    kg_expect_floats(&tp, vw, 1, (double[]){32});
    kg_expect_ints(&tp, ii, 4, (int64_t[]){P40 + 3, 2 * P40 + 4, P40, P40 + 1});
    kg_expect_ints(&tp, gi, 4, (int64_t[]){P40 + 3, 2 * P40 + 4, P40, P40 + 1});
    test_prog_free(&tp);
}
END_TEST

START_TEST(pow_where_gather_with_integers) {
    Graph *g = kg_new(13);
    const int64_t d3[] = {3}, d32[] = {3, 2}, d2[] = {2};
    Value *base = test_graph_input(g, "base", DT_INT64, 1, d3), *ex = test_graph_input(g, "ex", DT_INT64, 1, d3);
    Value *fx = test_graph_input(g, "fx", DT_FLOAT, 1, d3), *iexp = test_graph_input(g, "iexp", DT_INT32, 1, d3);
    Value *cond = test_graph_input(g, "cond", DT_BOOL, 1, d3);
    Value *tab = test_graph_input(g, "tab", DT_INT64, 2, d32), *idx = test_graph_input(g, "idx", DT_INT64, 1, d2);
    Node *pw = test_graph_op(g, "Pow", 2, (Value *[]){base, ex});
    Node *pf = test_graph_op(g, "Pow", 2, (Value *[]){fx, iexp});
    Node *wh = test_graph_op(g, "Where", 3, (Value *[]){cond, base, ex});
    Node *ga = test_graph_op(g, "Gather", 2, (Value *[]){tab, idx});
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, base, NULL, (int64_t[]){3, (int64_t)1 << 20, -2});
    kg_put(&tp, ex, NULL, (int64_t[]){4, 2, 3});
    kg_put(&tp, fx, (double[]){2, 0.5, -3}, NULL);
    kg_put(&tp, iexp, NULL, (int64_t[]){10, 2, 3});
    kg_put(&tp, cond, NULL, (int64_t[]){1, 0, 1});
    kg_put(&tp, tab, NULL, (int64_t[]){P40, 1, 2, 3, 4, P40 + 5});
    kg_put(&tp, idx, NULL, (int64_t[]){-1, 0});
    tp.eval(tp.arena);
    kg_expect_ints(&tp, pw, 3, (int64_t[]){81, P40, -8});
    kg_expect_floats(&tp, pf, 3, (double[]){1024, 0.25, -27});
    kg_expect_ints(&tp, wh, 3, (int64_t[]){3, 2, -2});
    kg_expect_ints(&tp, ga, 4, (int64_t[]){4, P40 + 5, P40, 1});
    test_prog_free(&tp);
}
END_TEST

START_TEST(softmax_before_opset_13_coerces_to_2d) {
    const int64_t d[] = {2, 3, 2};
    double x[12];
    for (int i = 0; i < 12; i++) x[i] = 0.25 * i - (i % 5);
    for (int opset = 11; opset <= 13; opset += 2) {
        Graph *g = kg_new(opset);
        Value *in = test_graph_input(g, "x", DT_FLOAT, 3, d);
        Node *sm = test_graph_op(g, "Softmax", 1, (Value *[]){in});
        test_attr_i(sm, "axis", 1);
        TestProg tp;
        kg_build(&tp, g);
        kg_put(&tp, in, x, NULL);
        tp.eval(tp.arena);
        /* opset 11: over the 6 elements after axis 1 per batch row; 13:
         * over axis 1 alone (3 elements, stride 2) */
        double want[12];
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < (opset < 13 ? 1 : 2); j++) {
                int len = opset < 13 ? 6 : 3, step = opset < 13 ? 1 : 2;
                double m = -INFINITY, s = 0;
                for (int k = 0; k < len; k++) m = fmax(m, x[b * 6 + j + k * step]);
                for (int k = 0; k < len; k++) s += exp(x[b * 6 + j + k * step] - m);
                for (int k = 0; k < len; k++) want[b * 6 + j + k * step] = exp(x[b * 6 + j + k * step] - m) / s;
            }
        kg_expect_floats(&tp, sm, 12, want);
        test_prog_free(&tp);
    }
}
END_TEST

/* Distance of got from the float32 nearest to want, in units in the last
 * place of that float (at least the smallest subnormal). */
static double ulps(double want, float got) {
    float w = (float)want;
    if (isinf(w) || isinf(got)) return w == got ? 0 : INFINITY;
    double spacing = fabs((double)nextafterf(fabsf(w), INFINITY) - fabsf(w));
    return fabs((double)got - want) / fmax(spacing, 0x1p-149);
}

/* Exp, Erf and Tanh are inline polynomials (codegen/cg_math.c), not
 * libm's: within 2 ulp of the correctly rounded result over their whole
 * range (exp from the underflow through subnormal results to the
 * overflow, erf and tanh through their saturation), with infinities,
 * signed zeros and NaN as libm gives them. */
START_TEST(exp_erf_tanh_within_two_ulp) {
    enum { N = 1 << 16 };
    static double x[N];
    static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-30, -1e-30, 1e-45, 88.72, 88.73,
                                     -87.33, -103.2, -103.98, -104.5, 3.99, 4.01, 0.8999, 0.9001, 9.1, -9.1};
    int ns = (int)(sizeof special / sizeof *special);
    for (int i = 0; i < N; i++) {
        if (i < ns) x[i] = special[i];
        else if (i % 2) x[i] = -110.0 + 205.0 * i / N;      /* exp's whole range */
        else x[i] = -6.0 + 12.0 * i / N;                    /* where erf and tanh curve */
    }
    const int64_t d[] = {N};
    Graph *g = kg_new(13);
    Value *in = test_graph_input(g, "x", DT_FLOAT, 1, d);
    Node *ops[3] = {test_graph_op(g, "Exp", 1, (Value *[]){in}), test_graph_op(g, "Erf", 1, (Value *[]){in}),
                    test_graph_op(g, "Tanh", 1, (Value *[]){in})};
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, in, x, NULL);
    tp.eval(tp.arena);
    for (int k = 0; k < 3; k++) {
        const float *y = test_buf(&tp, ops[k]->out[0]);
        for (int i = 0; i < N; i++) {
            double xi = (double)(float)x[i], want = k == 0 ? exp(xi) : k == 1 ? erf(xi) : tanh(xi);
            if (isnan(want)) {
                ck_assert_msg(isnan(y[i]), "%s(NaN) gave %g", ops[k]->op_type, y[i]);
                continue;
            }
            if (want == 0) ck_assert_msg(y[i] == 0 && !signbit(y[i]) == !signbit(want), "%s(%g) gave %g, want %g",
                                         ops[k]->op_type, xi, y[i], want);
            double u = ulps(want, y[i]);
            ck_assert_msg(u <= 2.0, "%s(%.9g) = %.9g, want %.9g (%.2f ulp)", ops[k]->op_type, xi, y[i], want, u);
        }
    }
    test_prog_free(&tp);
}
END_TEST

/* A 1-D int64 constant of g (an operand such as Pad's pads). */
static Value *kg_const_ints(Graph *g, const char *name, int n, const int64_t *x) {
    Value *v = graph_add_value(g, name);
    ck_assert_ptr_nonnull(v);
    v->kind = VAL_CONSTANT;
    v->dtype = DT_INT64;
    v->rank = 1;
    v->dims[0] = dim_const(n);
    v->konst = const_new(g, DT_INT64, n);
    ck_assert_ptr_nonnull(v->konst);
    for (int i = 0; i < n; i++) const_set_i(v->konst, i, x[i]);
    return v;
}

/* Opset 10's attribute forms of Clip (absent bounds are -+FLT_MAX there)
 * and Pad, which the node tests (all opset 11 and later) never reach. */
START_TEST(clip_and_pad_attribute_forms) {
    Graph *g = kg_new(10);
    const int64_t d6[] = {6}, d14[] = {1, 4};
    Value *x = test_graph_input(g, "x", DT_FLOAT, 1, d6), *r = test_graph_input(g, "r", DT_FLOAT, 2, d14);
    Node *clip = test_graph_op(g, "Clip", 1, (Value *[]){x});
    test_attr_f(clip, "min", -1);
    test_attr_f(clip, "max", 2);
    Node *open = test_graph_op(g, "Clip", 1, (Value *[]){x});
    Node *pad = test_graph_op(g, "Pad", 1, (Value *[]){r});
    static int64_t pads[] = {0, 2, 0, 1};
    pad->attrs[pad->n_attr++] = (Attr){.name = "pads", .kind = ATTR_INTS, .n = 4, .ints = pads};
    pad->attrs[pad->n_attr++] = (Attr){.name = "mode", .kind = ATTR_STRING, .s = "reflect"};
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, x, (double[]){-3, -1, 0.5, 5, NAN, -INFINITY}, NULL);
    kg_put(&tp, r, (double[]){1, 2, 3, 4}, NULL);
    tp.eval(tp.arena);
    kg_expect_floats(&tp, clip, 6, (double[]){-1, -1, 0.5, 2, NAN, -1});
    kg_expect_floats(&tp, open, 6, (double[]){-3, -1, 0.5, 5, NAN, -FLT_MAX});
    kg_expect_floats(&tp, pad, 7, (double[]){3, 2, 1, 2, 3, 4, 3});
    test_prog_free(&tp);
}
END_TEST

/* Clip with run-time bounds: int64 beyond float precision with one bound,
 * and min > max (every element max, as ONNX's min(max(x, lo), hi));
 * integer Pad with a run-time constant_value and a crop. */
START_TEST(clip_and_pad_with_run_time_operands) {
    Graph *g = kg_new(13);
    const int64_t d3[] = {3};
    Value *k = test_graph_input(g, "k", DT_INT64, 1, d3), *lo = test_graph_input(g, "lo", DT_INT64, 0, NULL);
    Value *x = test_graph_input(g, "x", DT_FLOAT, 1, d3);
    Value *a = test_graph_input(g, "a", DT_FLOAT, 0, NULL), *b = test_graph_input(g, "b", DT_FLOAT, 0, NULL);
    Value *v = test_graph_input(g, "v", DT_INT64, 0, NULL);
    Node *ci = test_graph_op(g, "Clip", 2, (Value *[]){k, lo});
    Node *cf = test_graph_op(g, "Clip", 3, (Value *[]){x, a, b});
    Node *pi = test_graph_op(g, "Pad", 3, (Value *[]){k, kg_const_ints(g, "pads", 2, (int64_t[]){2, -1}), v});
    TestProg tp;
    kg_build(&tp, g);
    kg_put(&tp, k, NULL, (int64_t[]){P40 + 1, -5, 3});
    kg_put(&tp, lo, NULL, (int64_t[]){P40});
    kg_put(&tp, x, (double[]){-4, NAN, 9}, NULL);
    kg_put(&tp, a, (double[]){2}, NULL);
    kg_put(&tp, b, (double[]){1}, NULL);
    kg_put(&tp, v, NULL, (int64_t[]){-P40});
    tp.eval(tp.arena);
    kg_expect_ints(&tp, ci, 3, (int64_t[]){P40 + 1, P40, P40});
    kg_expect_floats(&tp, cf, 3, (double[]){1, NAN, 1});
    kg_expect_ints(&tp, pi, 4, (int64_t[]){-P40, -P40, P40 + 1, -5});
    test_prog_free(&tp);
}
END_TEST

START_TEST(unsupported_forms_are_refused) {
    /* integer Gemm with a scaling alpha is refused rather than rounded */
    Graph *g = kg_new(13);
    const int64_t d22[] = {2, 2};
    Value *a = test_graph_input(g, "a", DT_INT64, 2, d22), *b = test_graph_input(g, "b", DT_INT64, 2, d22);
    Node *gm = test_graph_op(g, "Gemm", 2, (Value *[]){a, b});
    test_attr_f(gm, "alpha", 2.0f);
    TestProg tp;
    char msg[1024];
    ck_assert(!kg_compile(&tp, g, msg, sizeof msg));
    ck_assert_msg(strstr(msg, "integer Gemm") != NULL, "%s", msg);
    ck_assert_int_eq(compile_error_code(g), DIAG_UNSUPPORTED);
    cg_jit_free(tp.jit);
    free(tp.arena);
    graph_free(g);

    /* more inputs than a kernel takes buffers: refused, not truncated */
    g = test_graph_new("kernels.onnx", 13, 128, 128);
    const int64_t d1[] = {1};
    Value *in[70];
    for (int i = 0; i < 70; i++) in[i] = test_graph_input(g, arena_printf(&g->arena, "x%d", i), DT_FLOAT, 1, d1);
    test_graph_op(g, "Max", 70, in);
    ck_assert(!kg_compile(&tp, g, msg, sizeof msg));
    ck_assert_int_eq(compile_error_code(g), DIAG_UNSUPPORTED);
    cg_jit_free(tp.jit);
    free(tp.arena);
    graph_free(g);
}
END_TEST

/* ---- Gather and GatherGrad with run-time indices ----
 *
 * Embeddings and picks read token ids fed at run time, which the node
 * tests (constant indices, folded) never do.  Results are checked against
 * plain loops over the same data. */

/* y[o, i, k] = x[o, idx[i] (from the end if negative), k] over int64
 * elements, as a reference for any element type. */
static void gather_reference(const int64_t *x, const int64_t *idx, int64_t outer, int64_t len, int64_t inner,
                             int64_t ni, int64_t *y) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < ni; i++)
            for (int64_t k = 0; k < inner; k++)
                y[(o * ni + i) * inner + k] = x[(o * len + idx[i] + (idx[i] < 0 ? len : 0)) * inner + k];
}

/* Data of float32 (rows of 37 floats: whole vectors and a tail for the
 * row copies), int64 and bool, indices of int64 and int32 with negatives
 * and repeats, on the first axis (embedding), the middle one (a scalar
 * pick) and the last. */
START_TEST(gather_run_time_indices_match_a_reference) {
    static const struct {
        DType data, index;
        int rank, idx_rank;
        int64_t dims[3], idx_dims[2], axis;
    } cases[] = {
        {DT_FLOAT, DT_INT64, 2, 2, {9, 37}, {2, 3}, 0},
        {DT_FLOAT, DT_INT32, 3, 0, {3, 4, 10}, {1}, 1},
        {DT_INT64, DT_INT64, 3, 1, {2, 3, 5}, {4}, -1},
        {DT_BOOL, DT_INT64, 2, 1, {6, 3}, {5}, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        Graph *g = kg_new(13);
        Value *x = test_graph_input(g, "x", cases[c].data, cases[c].rank, cases[c].dims);
        Value *idx = test_graph_input(g, "idx", cases[c].index, cases[c].idx_rank, cases[c].idx_dims);
        Node *n = test_graph_op(g, "Gather", 2, (Value *[]){x, idx});
        test_attr_i(n, "axis", cases[c].axis);
        TestProg tp;
        kg_build(&tp, g);
        int64_t axis = cases[c].axis < 0 ? cases[c].axis + cases[c].rank : cases[c].axis, outer, len, inner;
        cg_axis_split(x, (int)axis, &outer, &len, &inner);
        int64_t nx = value_numel(x), ni = value_numel(idx), ny = value_numel(n->out[0]);
        int64_t *xi = malloc(sizeof *xi * (size_t)nx), *ii = malloc(sizeof *ii * (size_t)ni);
        int64_t *want = malloc(sizeof *want * (size_t)ny);
        double *xf = malloc(sizeof *xf * (size_t)nx);
        ck_assert(xi && ii && want && xf);
        for (int64_t e = 0; e < nx; e++) {
            /* exact in each type: small for float32, past 2^40 for int64 */
            xi[e] = cases[c].data == DT_BOOL    ? (e * 7) % 3 == 0
                    : cases[c].data == DT_INT64 ? e * P40 - 5
                                                : e * 101 - 7;
            xf[e] = (double)xi[e];
        }
        /* every index from -len to len - 1 in turn, wrapping around */
        for (int64_t i = 0; i < ni; i++) ii[i] = (i * 5 + 3) % (2 * len) - len;
        gather_reference(xi, ii, outer, len, inner, ni, want);
        kg_put(&tp, x, xf, xi);
        kg_put(&tp, idx, NULL, ii);
        tp.eval(tp.arena);
        for (int64_t e = 0; e < ny; e++) {
            int64_t got = dtype_is_float(cases[c].data) ? (int64_t)kg_float(&tp, n, e) : kg_int(&tp, n, e);
            ck_assert_msg(got == want[e], "case %zu element %lld: %lld, reference %lld", c, (long long)e,
                          (long long)got, (long long)want[e]);
        }
        free(xi);
        free(ii);
        free(want);
        free(xf);
        test_prog_free(&tp);
    }
}
END_TEST

/* A cleave.GatherGrad node of g over run-time dY and indices, dX of `shape`
 * (a graph output). */
static Node *kg_gather_grad(Graph *g, Value *dy, Value *idx, int rank, const int64_t *shape, int64_t axis) {
    Node *n = graph_add_node(g, "gather_grad", "GatherGrad", "cleave", 2, 1);
    ck_assert_ptr_nonnull(n);
    n->def = op_lookup("cleave", "GatherGrad");
    n->in[0] = dy;
    n->in[1] = idx;
    n->attrs = ARENA_ARRAY(&g->arena, Attr, 2);
    int64_t *s = ARENA_ARRAY(&g->arena, int64_t, rank);
    ck_assert(n->attrs && s);
    memcpy(s, shape, sizeof *s * (size_t)rank);
    n->attrs[n->n_attr++] = (Attr){.name = "axis", .kind = ATTR_INT, .i = axis};
    n->attrs[n->n_attr++] = (Attr){.name = "shape", .kind = ATTR_INTS, .n = rank, .ints = s};
    Value *y = graph_add_value(g, "dx");
    y->producer = n;
    y->is_output = true;
    n->out[0] = y;
    g->outputs[g->n_outputs++] = y;
    return n;
}

/* The gradient's sums where indices repeat, bit for bit against float32
 * additions in the documented order (zero, then each index in turn), with
 * dY spread over twelve orders of magnitude so that another order would
 * round differently: an embedding [5, 19] read by 12 ids, and a pick of
 * three of four positions on axis 1. */
START_TEST(gather_grad_sums_in_a_fixed_order) {
    static const struct {
        int rank;
        int64_t shape[3], axis, ni;
    } cases[] = {{2, {5, 19}, 0, 12}, {3, {3, 4, 10}, 1, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t outer, len, inner, ni = cases[c].ni, dyd[3];
        Graph *g = kg_new(17);
        Value probe = {.rank = cases[c].rank};
        for (int j = 0; j < cases[c].rank; j++) probe.dims[j] = dim_const(cases[c].shape[j]);
        cg_axis_split(&probe, (int)cases[c].axis, &outer, &len, &inner);
        int r = 0;
        for (int j = 0; j < cases[c].rank; j++) dyd[r++] = j == cases[c].axis ? ni : cases[c].shape[j];
        Value *dy = test_graph_input(g, "dy", DT_FLOAT, cases[c].rank, dyd);
        Value *idx = test_graph_input(g, "idx", DT_INT64, 1, &ni);
        Node *n = kg_gather_grad(g, dy, idx, cases[c].rank, cases[c].shape, cases[c].axis);
        TestProg tp;
        kg_build(&tp, g);
        int64_t ndy = value_numel(dy), nx = value_numel(n->out[0]);
        double *dyv = malloc(sizeof *dyv * (size_t)ndy);
        int64_t ii[12];
        float *want = calloc((size_t)nx, sizeof *want);
        ck_assert(dyv && want);
        uint64_t rng = 99;
        for (int64_t e = 0; e < ndy; e++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            dyv[e] = ldexp((double)(rng >> 40) / (1 << 24) - 0.5, (int)((rng >> 20) % 40) - 20);
        }
        for (int64_t i = 0; i < ni; i++) ii[i] = (i * 3) % len - (i % 2 ? len : 0); /* repeats, negatives */
        for (int64_t i = 0; i < ni; i++)
            for (int64_t o = 0; o < outer; o++)
                for (int64_t k = 0; k < inner; k++) {
                    float *w = &want[(o * len + ii[i] + (ii[i] < 0 ? len : 0)) * inner + k];
                    *w = *w + (float)dyv[(o * ni + i) * inner + k];
                }
        kg_put(&tp, dy, dyv, NULL);
        kg_put(&tp, idx, NULL, ii);
        /* the kernel zeroes dX itself: garbage there first */
        memset(test_buf(&tp, n->out[0]), 0x7f, sizeof(float) * (size_t)nx);
        tp.eval(tp.arena);
        const float *got = test_buf(&tp, n->out[0]);
        for (int64_t e = 0; e < nx; e++)
            ck_assert_msg(memcmp(&got[e], &want[e], sizeof *got) == 0, "case %zu dX[%lld]: %.9g, in order %.9g", c,
                          (long long)e, (double)got[e], (double)want[e]);
        free(dyv);
        free(want);
        test_prog_free(&tp);
    }
}
END_TEST

/* Runs the program's eval step in a child process with stderr captured:
 * the exit status (-1 for a signal) and the text, in msg. */
static int eval_in_child(TestProg *tp, char *msg, size_t len) {
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        tp->eval(tp->arena);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < len && (got = read(fd[0], msg + n, len - 1 - n)) > 0) n += (size_t)got;
    msg[n] = 0;
    close(fd[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* An index outside [-len, len) fed at run time stops the program before
 * any memory is read or written: status 1 and one line naming the program,
 * the model, the node, the index and the axis, in the forward kernel, in
 * a twin Gather of the same shapes (which must not run the first one's
 * kernel and name it) and in the gradient's kernel (which names the
 * forward Gather it serves).  The values at both ends and the extremes of
 * int64 (which must not wrap into range). */
START_TEST(gather_index_out_of_range_stops_the_program) {
    static const int64_t bad[] = {5, -6, INT64_MAX, INT64_MIN, 1000};
    Graph *g = kg_new(13);
    const int64_t dt[] = {5, 3}, di[] = {2}, dd[] = {2, 3};
    Value *table = test_graph_input(g, "table", DT_FLOAT, 2, dt), *dy = test_graph_input(g, "dy", DT_FLOAT, 2, dd);
    Value *ids[3];
    for (int s = 0; s < 3; s++) ids[s] = test_graph_input(g, arena_printf(&g->arena, "ids%d", s), DT_INT64, 1, di);
    Node *fwd = test_graph_op(g, "Gather", 2, (Value *[]){table, ids[0]});
    Node *twin = test_graph_op(g, "Gather", 2, (Value *[]){table, ids[1]});
    Node *grad = kg_gather_grad(g, dy, ids[2], 2, dt, 0);
    grad->origin = fwd;
    static const char *const site[] = {"the forward kernel", "its twin", "the gradient"};
    const Node *named[] = {fwd, twin, fwd};
    TestProg tp;
    kg_build(&tp, g);
    for (size_t c = 0; c < 3 * sizeof bad / sizeof *bad; c++) {
        int at = (int)(c % 3);
        int64_t v = bad[c / 3];
        /* the other kernels' indices stay in range */
        for (int s = 0; s < 3; s++) kg_put(&tp, ids[s], NULL, (int64_t[]){s == at ? v : 4, -5});
        char msg[1024], want[512];
        int status = eval_in_child(&tp, msg, sizeof msg);
        snprintf(want, sizeof want, "%s: error: kernels.onnx: node '%s' (Gather): index %lld is out of range for axis 0 "
                 "of size 5\n", program_invocation_short_name, named[at]->name, (long long)v);
        ck_assert_msg(status == 1 && strcmp(msg, want) == 0, "index %lld in %s: status %d, stderr '%s'", (long long)v,
                      site[at], status, msg);
    }
    /* and in range, all run through */
    for (int s = 0; s < 3; s++) kg_put(&tp, ids[s], NULL, (int64_t[]){-5, 4});
    char msg[256];
    ck_assert_int_eq(eval_in_child(&tp, msg, sizeof msg), 0);
    ck_assert_str_eq(msg, "");
    test_prog_free(&tp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("forward_conformance");
    TCase *tc = tcase_create("onnx_node_tests");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, forward_outputs_match_onnx_node_tests);
    suite_add_tcase(s, tc);
    TCase *k = tcase_create("kernels");
    tcase_set_timeout(k, 120);
    tcase_add_test(k, int64_arithmetic_is_exact);
    tcase_add_test(k, narrow_integers_wrap_and_read_unsigned);
    tcase_add_test(k, casts_follow_onnx);
    tcase_add_test(k, float16_rounding);
    tcase_add_test(k, nan_propagates_through_max_and_min);
    tcase_add_test(k, integer_and_bool_reductions);
    tcase_add_test(k, reductions_noop_and_half_precision);
    tcase_add_test(k, matmul_promotes_1d_operands);
    tcase_add_test(k, pow_where_gather_with_integers);
    tcase_add_test(k, softmax_before_opset_13_coerces_to_2d);
    tcase_add_test(k, exp_erf_tanh_within_two_ulp);
    tcase_add_test(k, clip_and_pad_attribute_forms);
    tcase_add_test(k, clip_and_pad_with_run_time_operands);
    tcase_add_test(k, unsupported_forms_are_refused);
    tcase_add_test(k, gather_run_time_indices_match_a_reference);
    tcase_add_test(k, gather_grad_sums_in_a_fixed_order);
    tcase_add_test(k, gather_index_out_of_range_stops_the_program);
    suite_add_tcase(s, k);
    return test_run_suite(s);
}
