/* calibrate.h - the parts of `cleave calibrate` (cmd_calibrate.c) that run
 * other programs: probe models written as ONNX and compiled like any
 * other (calibrate_probe.c), and the fit of a step's fixed costs from two
 * of them (calibrate_step.c). */
#ifndef CLEAVE_CALIBRATE_H
#define CLEAVE_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>

#include "../cost/cluster.h"
#include "../util/diag.h"

/* A chain of `layers` (1..64) MatMul [width x width] + Relu layers from
 * input x [1, width] to output y [1, width], written to path. */
bool calibrate_write_probe(const char *path, int layers, int width, Diag *d);
/* Whether prog is an executable on PATH. */
bool calibrate_on_path(const char *prog);
/* Runs argv with stdout and stderr into log; its exit status, or -1 when
 * it could not start or ran past timeout_s (its process group is then
 * killed: mpirun and the ranks it started). */
int calibrate_run(char *const argv[], const char *log, double timeout_s);
/* The last non-empty line of a log, for a note. */
void calibrate_last_line(const char *log, char *out, size_t size);
/* Fits c's kernel_overhead_s and step_overhead_s from two probe programs
 * compiled and run (mpirun -np 1) in dir, priced with c's measured rates;
 * false (c unchanged) with why in note. */
bool calibrate_step_overheads(Cluster *c, const char *dir, char *note, size_t len);

#endif
