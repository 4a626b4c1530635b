/* calibrate_step.c - what a training step costs beyond its kernels.
 *
 * Kernels timed alone in a tight loop (cmd_calibrate.c) run on hot caches
 * and pay a few nanoseconds per call; inside a compiled training step each
 * call also passes the runtime's MPI progress check and finds its data
 * colder, and every step pays the runtime's own work (filling the batch,
 * reading and reducing the loss).  Two probe programs tell the two apart:
 * chains of 1 and of 8 tiny MatMul + Relu layers, whose kernels do almost
 * no arithmetic, trained at batch 1.  Each measured step is its simulated
 * step (cost/simulate.h, the measured rates, no overheads) plus
 * step_overhead + kernels x kernel_overhead; the two probes give the two
 * unknowns. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "cli.h"
#include "../cost/simulate.h"
#include "../driver.h"
#include "compile_options.h"
#include "../plan/plan.h"
#include "../util/sort.h"

enum { PROBE_WIDTH = 4, PROBE_STEPS = 3000, PROBE_SKIP = 200 };

/* A float32 [1, width] .npy file. */
static bool write_row(const char *path, int width) {
    char header[128];
    int n = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, %d), }", width);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    unsigned short hlen = (unsigned short)(n + pad + 1);
    bool ok = fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && fputc(hlen & 0xff, f) != EOF && fputc(hlen >> 8, f) != EOF &&
              fwrite(header, 1, (size_t)n, f) == (size_t)n;
    for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    for (int i = 0; ok && i < width; i++) {
        float v = 0.5f + 0.1f * (float)i;
        ok = fwrite(&v, sizeof v, 1, f) == 1;
    }
    return fclose(f) == 0 && ok;
}


/* The median step of a metrics file after the first `skip` steps, from
 * samples_per_s (the runtime's own timing of the step: batch, kernels,
 * loss; not the writing of the metrics line); -1 when unreadable. */
static double median_step(const char *path, int skip) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double *t = malloc(sizeof *t * PROBE_STEPS);
    int n = 0;
    char line[512];
    while (t && fgets(line, sizeof line, f) && n < PROBE_STEPS) {
        long long step;
        const char *sps = strstr(line, "\"samples_per_s\": ");
        if (sscanf(line, "{\"step\": %lld", &step) != 1 || !sps || step <= skip) continue;
        double rate = strtod(sps + strlen("\"samples_per_s\": "), NULL);
        if (rate > 0) t[n++] = 1.0 / rate; /* batch 1 */
    }
    fclose(f);
    double med = -1;
    if (t && n > 0) {
        sort_doubles(t, (size_t)n);
        med = t[n / 2];
    }
    free(t);
    return med;
}

/* Compiles the probe of `layers` layers in dir, runs it, and gives its
 * measured step, its step simulated on c without overheads, and its
 * kernel count; false with why in note. */
static bool probe(const Cluster *c, const char *dir, int layers, double *measured, double *simulated, int *kernels,
                  char *note, size_t len) {
    char model[4200], prog[4200], metrics[4200], log[4200], x[4200], y[4200];
    snprintf(model, sizeof model, "%s/step%d.onnx", dir, layers);
    snprintf(prog, sizeof prog, "%s/step%d", dir, layers);
    snprintf(metrics, sizeof metrics, "%s/step%d.jsonl", dir, layers);
    snprintf(log, sizeof log, "%s/step%d.log", dir, layers);
    snprintf(x, sizeof x, "x=%s/x.npy", dir);
    snprintf(y, sizeof y, "labels=%s/y.npy", dir);
    CompileOptions co = {.model = model, .output = prog, .emit = "exe", .strategy = STRATEGY_SINGLE, .batch = 1, .ranks = 1,
                         .train = {.loss = LOSS_MSE, .optimizer = OPT_SGD, .lr = 0.001f}};
    Diag d = {0};
    Graph *g = NULL;
    TrainGraph t;
    Plan p;
    Layout l;
    if (!calibrate_write_probe(model, layers, PROBE_WIDTH, &d) || !compile_options_layout(&co, &l, &d) ||
        !driver_compile(&co, &l, NULL, &d) || !driver_build_plan(&co, &l, NULL, &g, &t, &p, &d)) {
        snprintf(note, len, "the %d-layer probe did not compile: %.300s", layers, d.msg);
        return false;
    }
    SimResult r;
    bool ok = simulate_plan(&p, c, &r, &d);
    if (ok) {
        *simulated = r.step_s;
        *kernels = 0;
        for (int i = 0; i < p.ranks[0].n_train; i++) *kernels += p.ranks[0].train[i].kind == STEP_COMPUTE;
        sim_result_free(&r);
    } else {
        snprintf(note, len, "simulating the probe failed: %.300s", d.msg);
    }
    graph_free(g);
    if (!ok) return false;
    char steps[32];
    snprintf(steps, sizeof steps, "%d", PROBE_STEPS);
    char *argv[] = {"mpirun", "-np", "1", prog, "--data", x, "--data", y, "--steps", steps, "--metrics", metrics,
                    "--log-every", "0", NULL};
    int status = calibrate_run(argv, log, 120);
    *measured = status == 0 ? median_step(metrics, PROBE_SKIP) : -1;
    if (*measured <= 0) {
        char why[400];
        calibrate_last_line(log, why, sizeof why);
        snprintf(note, len, "the %d-layer probe did not run (%s)", layers, why);
        return false;
    }
    return true;
}

bool calibrate_step_overheads(Cluster *c, const char *dir, char *note, size_t len) {
    char x[4200], y[4200];
    snprintf(x, sizeof x, "%s/x.npy", dir);
    snprintf(y, sizeof y, "%s/y.npy", dir);
    if (!write_row(x, PROBE_WIDTH) || !write_row(y, PROBE_WIDTH)) {
        snprintf(note, len, "cannot write the probe's data in %s", dir);
        return false;
    }
    Cluster bare = *c; /* the rates just measured, no overheads */
    bare.kernel_overhead_s = 0;
    bare.step_overhead_s = 0;
    bare.rank_speed = NULL;
    bare.name = NULL;
    double m1, s1, m8, s8;
    int k1, k8;
    if (!probe(&bare, dir, 1, &m1, &s1, &k1, note, len) || !probe(&bare, dir, 8, &m8, &s8, &k8, note, len))
        return false;
    double extra1 = m1 - s1, extra8 = m8 - s8;
    double per_kernel = k8 > k1 ? (extra8 - extra1) / (k8 - k1) : 0;
    if (!(per_kernel >= 0)) per_kernel = 0; /* noise: a longer chain measured no slower per kernel */
    double per_step = extra1 - per_kernel * k1;
    if (!(per_step >= 0)) per_step = 0;
    c->kernel_overhead_s = per_kernel;
    c->step_overhead_s = per_step;
    snprintf(note, len, "steps of %d and %d kernels measured %.3g and %.3g s", k1, k8, m1, m8);
    return true;
}
