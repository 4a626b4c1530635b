/* kernel_run.h - a graph's generated code run in this process, to time
 * its kernels: what `cleave calibrate` measures rates with and what
 * `--profile` (profile.h) times a model's own kernels with.
 *
 * Requires: a graph whose inputs have static shapes.  Provides: its
 * forward program built as the compiler builds programs (O3, this CPU),
 * JIT-compiled, with an arena whose float inputs hold 0.5 (no denormals)
 * and whose other inputs are zeros (valid indices and labels). */
#ifndef CLEAVE_KERNEL_RUN_H
#define CLEAVE_KERNEL_RUN_H

#include "../codegen/cg.h"
#include "../ir/ir.h"

typedef struct KernelRun {
    Graph *g;
    CgJit *jit;
    void (*eval)(char *);
    char *arena;
    size_t arena_bytes;
} KernelRun;

/* Builds g (taken over, freed by kernel_run_free even on failure). */
bool kernel_run_build(Graph *g, KernelRun *k, Diag *d);
/* Seconds of one run: the median over `reps` (at most 16) repetitions of
 * as many runs as fill min_s, after one run that warms caches and pages. */
double kernel_run_time(KernelRun *k, double min_s, int reps);
/* The same on cold caches: the median over `reps` repetitions of the mean
 * of `calls` runs, each after walking a buffer four times the L2 cache's size
 * (the walk not timed); with `memory` the arena is also flushed from
 * every cache level first, so that the run reads it from memory. */
double kernel_run_time_cold(KernelRun *k, int calls, int reps, bool memory);
/* The bytes of this core's L2 cache (2 MiB when it cannot be told): what
 * the cold timing's walk evicts, and so what a warm run keeps. */
size_t kernel_run_cache_bytes(void);
/* The bytes of the last-level cache that keep this process's data:
 * measured once by reading buffers of growing size (kernel_run.c), at
 * most twice the size the system reports, itself taken as at most 64 MiB
 * (and as 64 MiB when it cannot be told). */
size_t kernel_run_llc_bytes(void);
void kernel_run_free(KernelRun *k);

#endif
