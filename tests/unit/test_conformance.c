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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"
#include "ir/shapes.h"
#include "ops/ops.h"

typedef enum { R_PASS, R_FAIL, R_UNSUPPORTED } Result;

/* CLEAVE_CONFORMANCE_VERBOSE=1 also lists why every other unsupported
 * model is unsupported (its unknown ops, or the loader's message), to pick
 * the ops worth adding next. */
static bool verbose(void) {
    const char *v = getenv("CLEAVE_CONFORMANCE_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

static Result check_model(const char *folder, char *group, size_t group_len) {
    snprintf(group, group_len, "%s", folder);
    Diag d = {0};
    NodeTest nt;
    if (!node_test_load(&nt, folder, &d)) {
        node_test_free(&nt);
        if (d.code == DIAG_UNSUPPORTED) {
            if (verbose()) printf("unsupported %s: %s\n", folder, d.msg);
            return R_UNSUPPORTED;
        }
        printf("FAIL %s: loading: %s\n", folder, d.msg);
        return R_FAIL;
    }
    Graph *g = nt.g;
    node_test_group(g, folder, group, group_len);
    bool supported = true;
    GRAPH_FOR_NODES(g, n) {
        if (!n->def) supported = false;
    }
    if (!supported) {
        if (verbose()) {
            printf("unsupported %s: ops", folder);
            GRAPH_FOR_NODES(g, n) {
                if (!n->def) printf(" %s", n->op_type);
            }
            printf("\n");
        }
        node_test_free(&nt);
        return R_UNSUPPORTED;
    }
    ShapeOptions so = {.batch = 0, .fold = true};
    Result res = R_PASS;
    if (!node_test_read_inputs(&nt, NODE_INPUTS_INT_ONLY | NODE_INPUTS_CONSTIFY, &d) || !ir_verify(g, &d) ||
        !ir_infer_shapes(g, &so, &d)) {
        if (d.code == DIAG_UNSUPPORTED) {
            printf("unsupported %s: %s\n", folder, d.msg);
            res = R_UNSUPPORTED;
        } else {
            printf("FAIL %s: %s\n", folder, d.msg);
            res = R_FAIL;
        }
    }
    for (int k = 0; k < g->n_outputs && res == R_PASS; k++) {
        const Value *v = g->outputs[k], *want;
        if (!node_test_expected(&nt, k, &want, &d)) {
            if (d.code == DIAG_UNSUPPORTED) {
                res = R_UNSUPPORTED;
                break;
            }
            printf("FAIL %s: expected output %d: %s\n", folder, k, d.msg);
            res = R_FAIL;
            break;
        }
        if (!want) continue; /* omitted optional output */
        bool ok = v->dtype == want->dtype && v->rank == want->rank;
        for (int j = 0; ok && j < v->rank; j++)
            ok = dim_is_const(v->dims[j]) && v->dims[j].k == want->dims[j].k;
        if (!ok) {
            char ws[256], vs[256];
            printf("FAIL %s: output '%s': expected %s %s, inferred %s %s\n", folder, v->name,
                   dtype_name(want->dtype), shape_str(nt.aux, want, ws, sizeof ws), dtype_name(v->dtype),
                   shape_str(g, v, vs, sizeof vs));
            res = R_FAIL;
        }
    }
    node_test_free(&nt);
    return res;
}

START_TEST(inferred_shapes_match_onnx_node_tests) {
    int count = 0;
    char **names = node_test_names(NULL, &count);
    if (!names) {
        test_skip("../shared/onnx-node-tests not found");
        return;
    }
    OpGroups groups = {0};
    int passed = 0, failed = 0, unsupported = 0, models = 0;
    for (int i = 0; i < count; i++) {
        char group[256];
        Result r = check_model(names[i], group, sizeof group);
        models++;
        if (r == R_UNSUPPORTED) {
            unsupported++;
            continue;
        }
        op_groups_count(&groups, group, r == R_PASS);
        if (r == R_PASS) passed++;
        else failed++;
    }
    op_groups_print(&groups, "conformance");
    printf("conformance: %d passed, %d failed, %d unsupported (of %d models)\n", passed, failed, unsupported, models);
    fflush(stdout);
    node_test_names_free(names, count);
    op_groups_free(&groups);
    ck_assert_msg(failed == 0, "%d supported ONNX node tests fail shape conformance", failed);
}
END_TEST

/* ---- rules the node tests do not reach ----
 *
 * The ONNX data exercises each op at its newest opset with constant
 * shape operands.  These hand-built graphs cover older opsets, operands
 * known only at run time, and symbolic dims. */

static Graph *rule_graph(int64_t opset) { return test_graph_new("rules.onnx", opset, 8, 0); }

/* A run-time input; a negative dim stands for the symbol N. */
static Value *rule_input(Graph *g, const char *name, DType t, int rank, const int64_t *dims) {
    Value *v = graph_add_value(g, name);
    v->kind = VAL_INPUT;
    v->dtype = t;
    v->rank = rank;
    for (int i = 0; i < rank; i++) v->dims[i] = dims[i] < 0 ? (Dim){1, graph_symbol(g, "N")} : dim_const(dims[i]);
    g->inputs[g->n_inputs++] = v;
    return v;
}

/* A constant of n elements: a scalar when rank is 0, else 1-D. */
static Value *rule_const(Graph *g, const char *name, DType t, int rank, int n, const double *x) {
    Value *v = graph_add_value(g, name);
    v->kind = VAL_CONSTANT;
    v->dtype = t;
    v->rank = rank;
    if (rank == 1) v->dims[0] = dim_const(n);
    v->konst = const_new(g, dtype_store(t), n);
    for (int i = 0; i < n; i++) const_set_f(v->konst, i, x[i]);
    return v;
}

static Node *rule_node(Graph *g, const char *op, int n_in, Value *const *in, int n_out) {
    Node *n = graph_add_node(g, NULL, op, "", n_in, n_out);
    n->def = op_lookup("", op);
    ck_assert_ptr_nonnull(n->def);
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    for (int k = 0; k < n_out; k++) {
        Value *v = graph_add_value(g, arena_printf(&g->arena, "%s_out%d", n->name, k));
        v->producer = n;
        v->producer_slot = k;
        n->out[k] = v;
    }
    n->attrs = ARENA_ARRAY(&g->arena, Attr, 4);
    return n;
}

static void rule_attr_i(Node *n, const char *name, int64_t x) {
    n->attrs[n->n_attr++] = (Attr){.name = name, .kind = ATTR_INT, .i = x};
}

/* Verifies and infers; the Diag code (DIAG_OK on success). */
static DiagCode rule_infer(Graph *g, Diag *d) {
    ShapeOptions so = {.batch = 0, .fold = true};
    if (ir_verify(g, d)) ir_infer_shapes(g, &so, d);
    return d->code;
}

static const char *rule_shape(const Graph *g, const Value *v) {
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    return shape_str(g, v, buf[k], sizeof buf[k]);
}

START_TEST(runtime_shape_operands_give_unknown_dims) {
    Graph *g = rule_graph(13);
    const int64_t xd[] = {4, 5, 6}, one[] = {1};
    Value *x = rule_input(g, "x", DT_FLOAT, 3, xd);
    Value *starts = rule_input(g, "starts", DT_INT64, 1, one);
    Value *ends = rule_input(g, "ends", DT_INT64, 1, one);
    Value *axes = rule_input(g, "axes", DT_INT64, 1, one);
    Node *sl = rule_node(g, "Slice", 3, (Value *[]){x, starts, ends}, 1);
    Node *rs = rule_node(g, "ReduceSum", 2, (Value *[]){x, axes}, 1);
    Node *rs0 = rule_node(g, "ReduceSum", 2, (Value *[]){x, axes}, 1);
    rule_attr_i(rs0, "keepdims", 0);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, sl->out[0]), "[?,?,?]");
    ck_assert_str_eq(rule_shape(g, rs->out[0]), "[?,?,?]");
    ck_assert_int_eq(rs0->out[0]->rank, -1);
    graph_free(g);
}
END_TEST

START_TEST(opset_dependent_defaults) {
    /* Concat-1 defaults axis to 1; Dropout's mask is bool only since
     * opset 10; Shape-15's 'end' defaults to the rank. */
    Graph *g = rule_graph(3);
    const int64_t ad[] = {2, 3}, bd[] = {2, 4};
    Value *a = rule_input(g, "a", DT_FLOAT, 2, ad), *b = rule_input(g, "b", DT_FLOAT, 2, bd);
    Node *cat = rule_node(g, "Concat", 2, (Value *[]){a, b}, 1);
    Node *drop = rule_node(g, "Dropout", 1, (Value *[]){a}, 2);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, cat->out[0]), "[2,7]");
    ck_assert_int_eq(drop->out[1]->dtype, DT_FLOAT);
    graph_free(g);

    g = rule_graph(15);
    const int64_t xd[] = {2, 3, 4};
    Value *x = rule_input(g, "x", DT_FLOAT, 3, xd);
    Node *sh = rule_node(g, "Shape", 1, (Value *[]){x}, 1);
    rule_attr_i(sh, "start", 1);
    Node *drop12 = rule_node(g, "Dropout", 1, (Value *[]){x}, 2);
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, sh->out[0]), "[2]");
    ck_assert_ptr_nonnull(sh->out[0]->konst);
    ck_assert_int_eq(const_get_i(sh->out[0]->konst, 0), 3);
    ck_assert_int_eq(const_get_i(sh->out[0]->konst, 1), 4);
    ck_assert_int_eq(drop12->out[1]->dtype, DT_BOOL);
    graph_free(g);
}
END_TEST

START_TEST(legacy_broadcast_aligns_at_axis) {
    /* Before opset 7: B [3,4] aligned with A [2,3,4,5] at axis 1. */
    Graph *g = rule_graph(6);
    const int64_t ad[] = {2, 3, 4, 5}, bd[] = {3, 4};
    Value *a = rule_input(g, "a", DT_FLOAT, 4, ad), *b = rule_input(g, "b", DT_FLOAT, 2, bd);
    Node *add = rule_node(g, "Add", 2, (Value *[]){a, b}, 1);
    rule_attr_i(add, "broadcast", 1);
    rule_attr_i(add, "axis", 1);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, add->out[0]), "[2,3,4,5]");
    graph_free(g);

    /* without broadcast=1 the shapes must agree */
    g = rule_graph(6);
    a = rule_input(g, "a", DT_FLOAT, 4, ad);
    b = rule_input(g, "b", DT_FLOAT, 2, bd);
    rule_node(g, "Mul", 2, (Value *[]){a, b}, 1);
    d = (Diag){0};
    ck_assert_int_eq(rule_infer(g, &d), DIAG_SHAPE);
    graph_free(g);
}
END_TEST

START_TEST(range_lengths) {
    /* Range(0, Shape(x)[0], 1) on x [N,3] has length N. */
    Graph *g = rule_graph(13);
    const int64_t xd[] = {-1, 3};
    Value *x = rule_input(g, "x", DT_FLOAT, 2, xd);
    Node *sh = rule_node(g, "Shape", 1, (Value *[]){x}, 1);
    Value *zero = rule_const(g, "zero", DT_INT64, 0, 1, (double[]){0});
    Value *step = rule_const(g, "step", DT_INT64, 0, 1, (double[]){1});
    Node *ga = rule_node(g, "Gather", 2, (Value *[]){sh->out[0], zero}, 1);
    Node *rg = rule_node(g, "Range", 3, (Value *[]){zero, ga->out[0], step}, 1);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, rg->out[0]), "[N]");
    graph_free(g);

    /* run-time bounds make the length data-dependent: refused */
    g = rule_graph(13);
    Value *lim = rule_input(g, "limit", DT_FLOAT, 0, NULL);
    Value *s0 = rule_const(g, "s0", DT_FLOAT, 0, 1, (double[]){0});
    Value *s1 = rule_const(g, "s1", DT_FLOAT, 0, 1, (double[]){1});
    rule_node(g, "Range", 3, (Value *[]){s0, lim, s1}, 1);
    d = (Diag){0};
    ck_assert_int_eq(rule_infer(g, &d), DIAG_UNSUPPORTED);
    graph_free(g);
}
END_TEST

START_TEST(batchnorm_outputs_by_opset) {
    const int64_t xd[] = {2, 3, 4, 4}, cd[] = {3};
    for (int pass = 0; pass < 2; pass++) {
        Graph *g = rule_graph(pass ? 15 : 9);
        Value *in[5];
        in[0] = rule_input(g, "x", DT_FLOAT, 4, xd);
        for (int i = 1; i < 5; i++) in[i] = rule_input(g, arena_printf(&g->arena, "p%d", i), DT_FLOAT, 1, cd);
        Node *bn = rule_node(g, "BatchNormalization", 5, in, 5);
        Diag d = {0};
        if (pass) { /* opset 14 dropped the saved mean and variance */
            ck_assert_int_eq(rule_infer(g, &d), DIAG_GRAPH);
        } else {
            ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
            for (int k = 1; k < 5; k++) ck_assert_str_eq(rule_shape(g, bn->out[k]), "[3]");
        }
        graph_free(g);
    }
}
END_TEST

START_TEST(slice_backward_clamps_start) {
    /* A start before the front clamps to 0 when stepping backward. */
    Graph *g = rule_graph(13);
    const int64_t xd[] = {5};
    Value *x = rule_input(g, "x", DT_FLOAT, 1, xd);
    Value *st = rule_const(g, "st", DT_INT64, 1, 1, (double[]){-10});
    Value *en = rule_const(g, "en", DT_INT64, 1, 1, (double[]){-1e18});
    Value *ax = rule_const(g, "ax", DT_INT64, 1, 1, (double[]){0});
    Value *sp = rule_const(g, "sp", DT_INT64, 1, 1, (double[]){-1});
    Node *sl = rule_node(g, "Slice", 5, (Value *[]){x, st, en, ax, sp}, 1);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, sl->out[0]), "[1]");
    graph_free(g);
}
END_TEST

START_TEST(cast_targets) {
    Graph *g = rule_graph(13);
    Value *x = rule_const(g, "x", DT_FLOAT, 1, 3, (double[]){0.5, 0, -2});
    Node *cb = rule_node(g, "Cast", 1, (Value *[]){x}, 1);
    rule_attr_i(cb, "to", DT_BOOL);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_int_eq(cb->out[0]->dtype, DT_BOOL);
    ck_assert_ptr_nonnull(cb->out[0]->konst);
    ck_assert_int_eq(const_get_i(cb->out[0]->konst, 0), 1);
    ck_assert_int_eq(const_get_i(cb->out[0]->konst, 1), 0);
    ck_assert_int_eq(const_get_i(cb->out[0]->konst, 2), 1);
    graph_free(g);

    const int64_t targets[] = {DT_STRING, 17 /* float8e4m3fn */};
    for (int i = 0; i < 2; i++) {
        g = rule_graph(21);
        const int64_t xd[] = {2};
        Node *c = rule_node(g, "Cast", 1, (Value *[]){rule_input(g, "x", DT_FLOAT, 1, xd)}, 1);
        rule_attr_i(c, "to", targets[i]);
        d = (Diag){0};
        ck_assert_int_eq(rule_infer(g, &d), DIAG_UNSUPPORTED);
        graph_free(g);
    }
}
END_TEST

START_TEST(resize_and_convtranspose_forms) {
    /* Resize before opset 11 (scales second), Upsample 9, and
     * ConvTranspose keep a symbolic batch where they do not resize it. */
    const int64_t xd[] = {-1, 3, 4, 4}, wd[] = {3, 2, 3, 3};
    const double sc[] = {1, 1, 2, 1.5};
    const char *ops[] = {"Resize", "Upsample"};
    for (int i = 0; i < 2; i++) {
        Graph *g = rule_graph(i ? 9 : 10);
        Value *x = rule_input(g, "x", DT_FLOAT, 4, xd);
        Node *r = rule_node(g, ops[i], 2, (Value *[]){x, rule_const(g, "s", DT_FLOAT, 1, 4, sc)}, 1);
        Diag d = {0};
        ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
        ck_assert_str_eq(rule_shape(g, r->out[0]), "[N,3,8,6]");
        graph_free(g);
    }
    Graph *g = rule_graph(13);
    Value *x = rule_input(g, "x", DT_FLOAT, 4, xd);
    Node *ct = rule_node(g, "ConvTranspose", 2, (Value *[]){x, rule_input(g, "w", DT_FLOAT, 4, wd)}, 1);
    ct->attrs[ct->n_attr++] = (Attr){.name = "strides", .kind = ATTR_INTS, .n = 2, .ints = (int64_t[]){2, 3}};
    ct->attrs[ct->n_attr++] = (Attr){.name = "output_padding", .kind = ATTR_INTS, .n = 2, .ints = (int64_t[]){1, 0}};
    /* scales known only at run time: dims unknown */
    const int64_t four[] = {4};
    Node *rt = rule_node(g, "Resize", 3, (Value *[]){x, NULL, rule_input(g, "s", DT_FLOAT, 1, four)}, 1);
    Diag d = {0};
    ck_assert_msg(rule_infer(g, &d) == DIAG_OK, "%s", d.msg);
    ck_assert_str_eq(rule_shape(g, ct->out[0]), "[N,2,10,12]");
    ck_assert_str_eq(rule_shape(g, rt->out[0]), "[?,?,?,?]");
    graph_free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("onnx_node_tests");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, inferred_shapes_match_onnx_node_tests);
    suite_add_tcase(s, tc);
    TCase *rules = tcase_create("rules");
    tcase_add_test(rules, runtime_shape_operands_give_unknown_dims);
    tcase_add_test(rules, opset_dependent_defaults);
    tcase_add_test(rules, legacy_broadcast_aligns_at_axis);
    tcase_add_test(rules, range_lengths);
    tcase_add_test(rules, batchnorm_outputs_by_opset);
    tcase_add_test(rules, slice_backward_clamps_start);
    tcase_add_test(rules, cast_targets);
    tcase_add_test(rules, resize_and_convtranspose_forms);
    suite_add_tcase(s, rules);
    return test_run_suite(s);
}
