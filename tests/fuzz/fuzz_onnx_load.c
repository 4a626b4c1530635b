/* fuzz_onnx_load.c - libFuzzer target for the front end.
 *
 * Feeds arbitrary bytes to onnx_load_buffer() and, when they load, runs the
 * passes driver_front_end() runs (verify, shape inference and folding,
 * prune, verify again), once with the batch left symbolic and once bound
 * to 3.  A crash, a sanitizer report, a leak or a broken error contract is
 * a finding; an error reported through the Diag is the expected outcome for
 * most inputs.
 *
 * The error contract checked here: a failing call leaves a Diag that is set,
 * is one non-empty line, and starts with the model's path; a succeeding one
 * leaves the Diag clear.
 *
 * External data: the model's path names a folder next to this executable
 * holding weights.bin (4 KiB), so locations, offsets and lengths read a
 * real, fixed file. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"
#include "frontend/onnx.h"
#include "ir/shapes.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char model_path[PATH_MAX];

/* The error contract failed: report it the way libFuzzer reports a crash. */
static void contract(const char *what, const Diag *d) {
    fprintf(stderr, "fuzz_onnx_load: %s (code %d, message \"%s\")\n", what, (int)d->code, d->msg);
    abort();
}

static void check_diag(bool ok, const Diag *d) {
    if (ok) {
        if (diag_failed(d)) contract("a call succeeded but left an error", d);
        return;
    }
    if (!diag_failed(d)) contract("a call failed without an error", d);
    if (!d->msg[0]) contract("an error has an empty message", d);
    if (strchr(d->msg, '\n') || strchr(d->msg, '\r')) contract("an error message spans several lines", d);
    if (strncmp(d->msg, model_path, strlen(model_path)) != 0) contract("an error message does not name the file", d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        perror("fuzz_onnx_load: /proc/self/exe");
        exit(1);
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    *slash = 0;
    char dir[PATH_MAX], weights[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/fuzz_onnx_load.data", exe);
    snprintf(weights, sizeof weights, "%s/weights.bin", dir);
    snprintf(model_path, sizeof model_path, "%s/model.onnx", dir);
    if (mkdir(dir, 0755) != 0 && access(dir, W_OK) != 0) {
        perror(dir);
        exit(1);
    }
    /* Written under a private name and renamed, so parallel jobs never see
     * a partial file. */
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.%ld", weights, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        perror(tmp);
        exit(1);
    }
    for (int i = 0; i < 4096; i++) fputc(i * 37 & 0xff, f);
    if (fclose(f) != 0 || rename(tmp, weights) != 0) {
        perror(weights);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int bound = 0; bound < 2; bound++) {
        Diag d = {0};
        Graph *g = onnx_load_buffer(data, size, model_path, &d);
        check_diag(g != NULL, &d);
        if (!g) return 0; /* the second round would fail the same way */
        ShapeOptions so = {.batch = bound ? 3 : 0, .fold = true};
        bool ok = ir_verify(g, &d) && ir_infer_shapes(g, &so, &d);
        if (ok) {
            ir_prune(g);
            ok = ir_verify(g, &d);
        }
        if (ok && g->arena.failed) ok = diag_error(&d, DIAG_NOMEM, "%s: out of memory", g->path);
        check_diag(ok, &d);
        Diag strict = {0};
        check_diag(driver_check_supported(g, &strict), &strict);
        graph_free(g);
    }
    return 0;
}
