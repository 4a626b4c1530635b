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
