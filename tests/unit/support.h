/* support.h - helpers shared by the Check unit tests. */
#ifndef CLEAVE_TEST_SUPPORT_H
#define CLEAVE_TEST_SUPPORT_H

#include <check.h>

#include "driver.h"
#include "ir/ir.h"

/* Path under the source tree ("samples/mlp.onnx" -> absolute). */
const char *test_src_path(const char *rel);
/* Runs the front end on a model; fails the test with the Diag on error. */
Graph *test_load(const char *path, int64_t batch);
/* Runs a suite and returns the process exit status. */
int test_run_suite(Suite *s);

#endif

#include "autodiff/train.h"
#include "codegen/cg.h"
#include "plan/plan.h"

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
/* Element pointer of a value's buffer in the arena. */
void *test_buf(TestProg *tp, const Value *v);
void test_prog_free(TestProg *tp);
