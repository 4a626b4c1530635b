/* test_ir.c - arena, diagnostics, graph construction, verifier,
 * topological order, broadcasting and folding on small hand-built graphs
 * and on the sample models. */
#include <stdint.h>
#include <string.h>

#include "support.h"
#include "ir/shapes.h"
#include "ops/ops.h"

START_TEST(arena_zeroes_and_refuses_overflow) {
    Arena a;
    arena_init(&a);
    int64_t *p = ARENA_ARRAY(&a, int64_t, 1000);
    ck_assert_ptr_nonnull(p);
    for (int i = 0; i < 1000; i++) ck_assert_int_eq(p[i], 0);
    ck_assert_ptr_null(arena_alloc(&a, SIZE_MAX / 2, 4));
    ck_assert(a.failed);
    arena_free(&a);
}
END_TEST

START_TEST(arena_fault_injection_fails_the_nth) {
    Arena a;
    arena_init(&a);
    arena_fail_after(3);
    ck_assert_ptr_nonnull(arena_alloc(&a, 1, 8));
    ck_assert_ptr_nonnull(arena_alloc(&a, 1, 8));
    ck_assert_ptr_null(arena_alloc(&a, 1, 8));
    ck_assert_ptr_nonnull(arena_alloc(&a, 1, 8));
    arena_free(&a);
}
END_TEST

START_TEST(diag_keeps_first_error) {
    Diag d = {0};
    ck_assert(!diag_error(&d, DIAG_SHAPE, "first %d", 1));
    diag_error(&d, DIAG_IO, "second");
    ck_assert_int_eq(d.code, DIAG_SHAPE);
    ck_assert_str_eq(d.msg, "first 1");
    ck_assert_int_eq(diag_exit_status(DIAG_USAGE), 2);
    ck_assert_int_eq(diag_exit_status(DIAG_SHAPE), 1);
}
END_TEST

/* x:[N,3] (input) + b:[3] (initializer) -> y; y MatMul w:[k,4] */
static Graph *small_graph(int64_t k) {
    Graph *g = graph_new("small.onnx");
    g->opsets = ARENA_NEW(&g->arena, Opset);
    g->opsets[0] = (Opset){"", 13};
    g->n_opsets = 1;
    Value *x = graph_add_value(g, "x");
    x->kind = VAL_INPUT;
    x->dtype = DT_FLOAT;
    x->rank = 2;
    x->dims[0] = (Dim){1, graph_symbol(g, "N")};
    x->dims[1] = dim_const(3);
    g->inputs = ARENA_ARRAY(&g->arena, Value *, 1);
    g->inputs[g->n_inputs++] = x;
    Value *b = graph_add_value(g, "b");
    b->kind = VAL_INITIALIZER;
    b->dtype = b->file_dtype = DT_FLOAT;
    b->rank = 1;
    b->dims[0] = dim_const(3);
    b->konst = const_new(g, DT_FLOAT, 3);
    Value *w = graph_add_value(g, "w");
    w->kind = VAL_INITIALIZER;
    w->dtype = w->file_dtype = DT_FLOAT;
    w->rank = 2;
    w->dims[0] = dim_const(k);
    w->dims[1] = dim_const(4);
    w->konst = const_new(g, DT_FLOAT, k * 4);
    Node *add = graph_add_node(g, "add0", "Add", "", 2, 1);
    add->def = op_lookup("", "Add");
    add->in[0] = x;
    add->in[1] = b;
    add->out[0] = graph_add_value(g, "y");
    add->out[0]->producer = add;
    Node *mm = graph_add_node(g, "mm0", "MatMul", "", 2, 1);
    mm->def = op_lookup("", "MatMul");
    mm->in[0] = add->out[0];
    mm->in[1] = w;
    mm->out[0] = graph_add_value(g, "z");
    mm->out[0]->producer = mm;
    mm->out[0]->is_output = true;
    g->outputs = ARENA_ARRAY(&g->arena, Value *, 1);
    g->outputs[g->n_outputs++] = mm->out[0];
    return g;
}

START_TEST(infers_broadcast_and_matmul_with_symbolic_batch) {
    Graph *g = small_graph(3);
    Diag d = {0};
    ck_assert_msg(ir_verify(g, &d), "%s", d.msg);
    ShapeOptions so = {.batch = 0, .fold = true};
    ck_assert_msg(ir_infer_shapes(g, &so, &d), "%s", d.msg);
    Value *z = graph_find_value(g, "z");
    char buf[64];
    ck_assert_str_eq(shape_str(g, z, buf, sizeof buf), "[N,4]");
    ck_assert_int_eq(z->dtype, DT_FLOAT);
    graph_free(g);
}
END_TEST

START_TEST(binding_the_batch_makes_shapes_concrete) {
    Graph *g = small_graph(3);
    Diag d = {0};
    ShapeOptions so = {.batch = 8, .fold = true};
    ck_assert_msg(ir_infer_shapes(g, &so, &d), "%s", d.msg);
    char buf[64];
    ck_assert_str_eq(shape_str(g, graph_find_value(g, "z"), buf, sizeof buf), "[8,4]");
    graph_free(g);
}
END_TEST

START_TEST(inner_dimension_mismatch_names_the_node) {
    Graph *g = small_graph(5);
    Diag d = {0};
    ShapeOptions so = {.batch = 2, .fold = true};
    ck_assert(!ir_infer_shapes(g, &so, &d));
    ck_assert_int_eq(d.code, DIAG_SHAPE);
    ck_assert_ptr_nonnull(strstr(d.msg, "small.onnx: node 'mm0' (MatMul)"));
    graph_free(g);
}
END_TEST

START_TEST(cycle_is_reported) {
    Graph *g = small_graph(3);
    /* feed z back into the Add */
    Node *add = g->nodes[0];
    add->in[1] = graph_find_value(g, "z");
    Diag d = {0};
    ck_assert(!ir_verify(g, &d));
    ck_assert_int_eq(d.code, DIAG_GRAPH);
    ck_assert_ptr_nonnull(strstr(d.msg, "cycle"));
    graph_free(g);
}
END_TEST

START_TEST(topological_order_respects_edges) {
    Graph *g = small_graph(3);
    /* store the nodes in reverse: the order must still put Add first */
    Node *t = g->nodes[0];
    g->nodes[0] = g->nodes[1];
    g->nodes[1] = t;
    g->nodes[0]->id = 0;
    g->nodes[1]->id = 1;
    Diag d = {0};
    int count = 0;
    Node **order = ir_topo_order(g, &count, &d);
    ck_assert_ptr_nonnull(order);
    ck_assert_int_eq(count, 2);
    ck_assert_str_eq(order[0]->op_type, "Add");
    ck_assert_str_eq(order[1]->op_type, "MatMul");
    graph_free(g);
}
END_TEST

/* PyTorch's Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains fold:
 * no shape-computing node survives, with the batch bound or symbolic. */
static void check_folded(int64_t batch) {
    Graph *g = test_load(test_src_path("samples/transformer.onnx"), batch);
    static const char *shape_ops[] = {"Shape", "Gather", "Unsqueeze", "Concat", "Constant", "Identity"};
    GRAPH_FOR_NODES(g, n) {
        for (size_t i = 0; i < sizeof shape_ops / sizeof *shape_ops; i++)
            ck_assert_msg(strcmp(n->op_type, shape_ops[i]) != 0, "node %s (%s) was not folded", n->name, n->op_type);
        if (strcmp(n->op_type, "Reshape") == 0) ck_assert(value_is_const(n->in[1]));
    }
    Value *out = g->outputs[0];
    char buf[64];
    ck_assert_str_eq(shape_str(g, out, buf, sizeof buf), batch ? "[5,16,32]" : "[batch,16,32]");
    graph_free(g);
}

START_TEST(pytorch_shape_subgraphs_fold) {
    check_folded(0);
    check_folded(5);
}
END_TEST

/* Every allocation site of the loader and passes fails cleanly: a NULL
 * graph with an out-of-memory Diag, never a crash (run under ASan). */
START_TEST(out_of_memory_at_every_allocation_is_reported) {
    const char *path = test_src_path("samples/cnn.onnx");
    int failures = 0;
    for (long nth = 1; nth < 4000; nth++) {
        arena_fail_after(nth);
        Diag d = {0};
        DriverOptions opt = {.model = path, .batch = 2};
        Graph *g = driver_front_end(&opt, &d);
        arena_fail_after(0);
        if (g) { /* nth is past the last allocation: done */
            graph_free(g);
            break;
        }
        ck_assert_msg(d.code == DIAG_NOMEM, "allocation %ld: expected out of memory, got: %s", nth, d.msg);
        failures++;
    }
    ck_assert_int_gt(failures, 10);
}
END_TEST

START_TEST(op_table_entries_are_well_formed) {
    int count;
    const OpDef *const *t = op_table(&count);
    ck_assert_int_gt(count, 40);
    for (int i = 0; i < count; i++) {
        ck_assert_ptr_nonnull(t[i]->infer);
        ck_assert_int_le(t[i]->min_in, t[i]->max_in);
        ck_assert_int_le(t[i]->min_out, t[i]->max_out);
        ck_assert_ptr_eq(op_lookup(t[i]->domain, t[i]->name), t[i]);
        for (int j = 0; j < i; j++) ck_assert_str_ne(t[i]->name, t[j]->name);
    }
}
END_TEST

/* Input errors exit 1 (2 for usage), compiler bugs 70. */
START_TEST(exit_statuses_by_kind) {
    ck_assert_int_eq(diag_exit_status(DIAG_USAGE), 2);
    for (DiagCode c = DIAG_IO; c < DIAG_INTERNAL; c++) ck_assert_int_eq(diag_exit_status(c), 1);
    ck_assert_int_eq(diag_exit_status(DIAG_INTERNAL), 70);
}
END_TEST

/* A broken invariant where no Diag can be returned stops the process with
 * the internal-error status, in release builds too (no assert()). */
START_TEST(broken_invariant_exits_70) {
    Graph *g = test_graph_new("bug", 17, 0, 0);
    Value *v = graph_add_value(g, "v");
    Dim dims[MAX_RANK + 1] = {0};
    value_set_shape(v, MAX_RANK + 1, dims);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ir");
    TCase *tc = tcase_create("ir");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, arena_zeroes_and_refuses_overflow);
    tcase_add_test(tc, arena_fault_injection_fails_the_nth);
    tcase_add_test(tc, diag_keeps_first_error);
    tcase_add_test(tc, exit_statuses_by_kind);
    tcase_add_exit_test(tc, broken_invariant_exits_70, 70);
    tcase_add_test(tc, infers_broadcast_and_matmul_with_symbolic_batch);
    tcase_add_test(tc, binding_the_batch_makes_shapes_concrete);
    tcase_add_test(tc, inner_dimension_mismatch_names_the_node);
    tcase_add_test(tc, cycle_is_reported);
    tcase_add_test(tc, topological_order_respects_edges);
    tcase_add_test(tc, pytorch_shape_subgraphs_fold);
    tcase_add_test(tc, out_of_memory_at_every_allocation_is_reported);
    tcase_add_test(tc, op_table_entries_are_well_formed);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
