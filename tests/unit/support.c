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
