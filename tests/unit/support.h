/* support.h - helpers shared by the Check unit tests. */
#ifndef CLEAVE_TEST_SUPPORT_H
#define CLEAVE_TEST_SUPPORT_H

#include <check.h>

#include "driver.h"
#include "autodiff/grad.h"
#include "autodiff/train.h"
#include "codegen/cg.h"
#include "ir/ir.h"
#include "plan/plan.h"

/* Path under the source tree ("samples/mlp.onnx" -> absolute). */
const char *test_src_path(const char *rel);
/* Runs the front end on a model; fails the test with the Diag on error. */
Graph *test_load(const char *path, int64_t batch);
/* Runs a suite and returns the process exit status: 1 on a failure, else
 * TEST_SKIP_STATUS when every test called test_skip, else 0. */
int test_run_suite(Suite *s);
/* The status ctest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define TEST_SKIP_STATUS 77
/* Prints "SKIP: why" and counts the running test as skipped; the test
 * returns after it.  test_run_suite reports the count. */
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether a file can be opened for reading. */
bool test_file_exists(const char *path);
/* An empty hand-built graph at `opset` of the default domain, with room
 * for max_inputs graph inputs and max_outputs outputs (0: no array). */
Graph *test_graph_new(const char *name, int64_t opset, int max_inputs, int max_outputs);
/* A run-time input of g (room in g->inputs) of dtype t and static dims. */
Value *test_graph_input(Graph *g, const char *name, DType t, int rank, const int64_t *dims);
/* A node of the default domain whose one output is a graph output, with
 * room for 4 attributes (test_attr_i / test_attr_f). */
Node *test_graph_op(Graph *g, const char *op, int n_in, Value *const *in);
void test_attr_i(Node *n, const char *name, int64_t x);
void test_attr_f(Node *n, const char *name, float x);

/* ---- programs compiled in-process ---- */

/* A program compiled in this process: training graph (or forward only),
 * plan, LLVM code run by the JIT, and its arena initialised as the runtime
 * would. */
typedef struct TestProg {
    Graph *g;
    TrainGraph t;
    Plan p;
    CgJit *jit;
    void (*train)(char *arena);
    void (*eval)(char *arena);
    char *arena;
} TestProg;

/* false with the Diag's message in msg (for ck_assert_msg) on failure. */
bool test_prog_train(TestProg *tp, Graph *g, const TrainOptions *o, char *msg, size_t len);
bool test_prog_forward(TestProg *tp, Graph *g, char *msg, size_t len);
/* The same with the plan's --threads set: products split among `threads`
 * call cleave_rt_parallel, which the test must provide. */
bool test_prog_forward_threads(TestProg *tp, Graph *g, int threads, char *msg, size_t len);
/* Element pointer of a value's buffer in the arena. */
void *test_buf(TestProg *tp, const Value *v);
void test_prog_free(TestProg *tp);

/* ---- ONNX's operator tests (../shared/onnx-node-tests) ----
 *
 * Every folder test_* holds model.onnx and test_data_set_0/{input,output}_K.pb. */

#define NODE_TESTS_DIR CLEAVE_SHARED_DIR "/onnx-node-tests"

/* Sorted names of the test_* folders that `keep` accepts (NULL: all);
 * NULL when NODE_TESTS_DIR does not exist.  Free with node_test_names_free. */
char **node_test_names(bool (*keep)(const char *name), int *count);
void node_test_names_free(char **names, int count);

/* The op a model's results are grouped under: a single-op model under its
 * op; a multi-node ("expanded") model under "<Op>_expanded", Op being the
 * function the ONNX generator expanded (its value names read
 * "<Op>_test_..._function_..."), else under the folder name. */
void node_test_group(const Graph *g, const char *folder, char *out, size_t len);

/* One node test: its model, and the tensors read from its .pb files, which
 * live in `aux` (a .pb names its tensor like the graph value, and value
 * names in g must stay unique). */
typedef struct NodeTest {
    char dir[2048];   /* NODE_TESTS_DIR/<folder> */
    char model[4096]; /* dir/model.onnx */
    Graph *g;
    Graph *aux;
    /* filled by node_test_read_inputs, one entry per graph input */
    int n_in;
    Value **in_val;  /* the graph input */
    Value **in_data; /* its tensor, NULL when it has no file (or was not read) */
    bool has_int;    /* an integer (not bool) input has test data */
} NodeTest;

/* Loads the folder's model.onnx.  false with d set when the loader refuses
 * it; node_test_free is needed either way. */
bool node_test_load(NodeTest *nt, const char *folder, Diag *d);

/* What node_test_read_inputs does. */
enum {
    /* read the files of shape-like inputs only; without it every input
     * that has a file is read */
    NODE_INPUTS_INT_ONLY = 1,
    /* shape-like inputs with test data become constants of g holding it,
     * and leave g's inputs */
    NODE_INPUTS_CONSTIFY = 2,
};

/* Reads the inputs' test_data_set_0/input_K.pb.  Integer graph inputs of
 * these tests are shape-like operands (Reshape's shape, Slice's starts,
 * TopK's k, ...) that real models carry as initializers or Constant nodes,
 * and so are the float scales and roi of Resize and Upsample, hence
 * NODE_INPUTS_CONSTIFY; other float and bool inputs stay dynamic.  false
 * with d set on a reading error. */
bool node_test_read_inputs(NodeTest *nt, unsigned flags, Diag *d);

/* Makes graph input v of g a constant holding tensor t (read into another
 * graph); `path` names t in messages. */
bool node_test_constify(Graph *g, Value *v, const Value *t, const char *path, Diag *d);

/* Expected output k: true with *want set, or with *want NULL when the
 * test omits that (optional) output; false with d set when the file cannot
 * be read. */
bool node_test_expected(NodeTest *nt, int k, const Value **want, Diag *d);

void node_test_free(NodeTest *nt);

/* Pass counts by op group, printed sorted by name. */
typedef struct OpGroup {
    char name[256];
    int passed, total;
} OpGroup;

typedef struct OpGroups {
    OpGroup *v;
    int n, cap;
} OpGroups;

/* Counts one model under group `name`. */
void op_groups_count(OpGroups *t, const char *name, bool passed);
/* "<prefix> <name>: <passed>/<total> passed" for every group, by name. */
void op_groups_print(OpGroups *t, const char *prefix);
void op_groups_free(OpGroups *t);

/* ---- gradients checked by finite differences ----
 *
 * A case builds a small graph over float initializers (its parameters),
 * grad_check appends loss = ReduceSum(y * R) for a random R, compiles the
 * training program, takes every parameter's gradient from one train step
 * at learning rate 0, and compares it with central differences of the loss
 * computed by more train steps at learning rate 0 (which change no
 * parameter). */

typedef enum { FILL_UNIFORM, FILL_POSITIVE, FILL_DISTINCT } Fill;

/* What a test file's cases share: their random numbers and how a gradient
 * is judged against its finite difference. */
typedef struct GradRules {
    const char *graph_name;
    float (*rand)(uint64_t *state); /* uniform in [-1, 1) */
    uint64_t seed;                  /* each case starts from it */
    /* whether the program's gradient `an` agrees with finite difference fd
     * at tolerance tol (the case's own) */
    bool (*agree)(double fd, double an, double tol);
} GradRules;

/* Random number generators for GradRules.rand. */
float grad_rand_lcg(uint64_t *state);      /* 64-bit LCG, top 24 bits */
float grad_rand_xorshift(uint64_t *state); /* xorshift64* */

typedef struct GradCase {
    Graph *g;
    GradCtx gc;
    Diag d;
    uint64_t rng;
    const GradRules *rules;
} GradCase;

/* An empty graph at opset 17. */
void grad_case_init(GradCase *k, const GradRules *rules);
/* A float tensor of the given shape filled with random values:
 * FILL_POSITIVE takes 0.5 + |x| (for ops defined on positive numbers);
 * FILL_DISTINCT gives pairwise distinct values 0.05 apart in random order,
 * so finite differences of +-0.01 never change which element of a window
 * is the maximum. */
Value *grad_tensor(GradCase *k, const char *name, ValueKind kind, int rank, const int64_t *dims, Fill fill);
/* A constant of an integer type or bool holding x (indices, masks, k). */
Value *grad_int_const(GradCase *k, const char *name, DType t, int rank, const int64_t *dims, const int64_t *x);
/* A parameter: a uniformly filled initializer. */
Value *grad_param(GradCase *k, const char *name, int rank, const int64_t *dims);
/* gb_start and gb_finish with one output, failing the test on error. */
Node *grad_node(GradCase *k, const char *op, int n_in, Value **in);
Value *grad_finish(GradCase *k, Node *n);
/* Adds the loss, compiles, and checks every parameter's gradient
 * (GradRules.agree at tol); frees the case. */
void grad_check(GradCase *k, Value *y, double tol);

#endif
