/* rt_abi.h - the contract between a generated training program and the
 * runtime linked into it.
 *
 * The compiler emits one object file per program.  It defines the symbols
 * below; the runtime (runtime/ *.c, with main()) defines everything else: it
 * parses the command line, reads the metadata, allocates the arena once,
 * loads the data, and calls the step functions.  All tensor math is in the
 * generated functions; the runtime only moves bytes, reduces metrics and
 * talks to MPI.
 *
 * Edits here go together with compiler/codegen/cg_module.c (grep RT_ABI). */
#ifndef CLEAVE_RT_ABI_H
#define CLEAVE_RT_ABI_H

#include <stdint.h>

#define CLEAVE_ABI_VERSION 1

/* JSON text describing the program (not NUL-terminated; length given):
 *
 * {"abi": 1, "plan_hash": "hex",   hash of the plan; every rank of a run
 *                                   must hold the same program
 *  "ranks": N,                      ranks the program is compiled for
 *  "rank_programs": 1,              (staged programs: one per stage, below)
 *  "strategy": "single"|"dp",       "dp": data parallelism over N ranks
 *                                   ("layer", "pipeline", "hybrid": below)
 *                                   (absent: "single", N must be 1)
 *  "batch": B,                      global batch: rows of one optimizer step
 *  "local_batch": L,                rows each rank computes, B / N under
 *                                   "dp" (absent: B); dim 0 of every input
 *                                   and of the output below
 *  "buckets": [{"offset": o, "count": n}],
 *                                   "dp": the gradient buckets, n float32
 *                                   values at byte o, contiguous, in the
 *                                   numbering the collectives below use
 *                                   (absent: none)
 *  "arena_bytes": N,                bytes the runtime allocates (64-aligned)
 *  "init_bytes": N,                 cleave_init is copied to arena[0..N)
 *  "loss": {"offset": o},           float32 scalar: the step's mean loss
 *  "lr": {"offset": o, "value": x}, float32 scalar the runtime sets (--lr)
 *  "step": {"offset": o},           float32 scalar: 1-based optimizer step
 *                                   count, set by the runtime before each
 *                                   train step (Adam's bias correction)
 *  "inputs": [{"name": s, "dtype": "float32"|"int64", "shape": [L, ...],
 *              "offset": o}],       one per graph input incl. "labels";
 *                                   the runtime writes each step's rows here
 *                                   (under "dp" this rank's share of them)
 *  "output": {"name": s, "offset": o, "shape": [L, ...]},
 *                                   the model's first graph output (logits
 *                                   for --loss ce), valid after any step;
 *                                   read for accuracy and --predict
 *  "params": [{"name": s, "dtype": "float32", "shape": [...],
 *              "offset": o, "trainable": bool}],
 *                                   initializers as the ONNX file names
 *                                   them; --save writes these back
 *  "loss_kind": "ce"|"mse"|"model", "optimizer": {...},
 *  "threads": T}                    threads each rank runs its large matrix
 *                                   products on, 1 to 64 (absent: 1); the
 *                                   runtime starts T - 1 workers for
 *                                   cleave_rt_parallel before the first step
 *
 * Offsets are byte offsets into the arena, aligned to 64. */
/* How the runtime reads the metadata (runtime/README.md): every field above
 * is required and checked; fields it does not know are ignored.  "output"
 * is float32.  For loss_kind "ce" the input named "labels" is int64 and
 * holds one class index per row of logits over the output's last
 * dimension.  Under loss_kind "model" the output is the model's loss and
 * may have any shape, a scalar [] included; without a batch dimension it
 * has no rows and --predict is refused.  "arena_bytes" is rounded up to a
 * multiple of 64.  Under "dp", batch = local_batch * ranks, the loss slot
 * holds the mean over this rank's L rows, and the loss gradient is seeded
 * with 1/N so that summing the gradients over the ranks gives the gradient
 * of the global batch's mean loss. */
extern const char cleave_meta[];
extern const uint64_t cleave_meta_len;

/* Initial contents of arena[0 .. init_bytes): parameters and constants. */
extern const unsigned char cleave_init[];

/* The input ONNX model, for --save (initializers are replaced by the
 * trained values, matched by name). */
extern const unsigned char cleave_model[];
extern const uint64_t cleave_model_len;

/* One training step on the batch in the input buffers: forward, loss,
 * backward, optimizer update.  Writes the loss slot. */
void cleave_train_step(char *arena);
/* Forward and loss only (no update): writes the loss slot and output. */
void cleave_eval_step(char *arena);

/* Defined by the runtime, called by cleave_train_step of a "dp" program
 * (the buckets are numbered as in the metadata's "buckets"; the runtime
 * knows the arena and the communicator, set up before the first step).
 * Each step sums every bucket exactly once: either a start and later a
 * wait, in that order, or (nothing to overlap) one cleave_rt_allreduce:
 *
 * Starts summing bucket `bucket` over the ranks, in place: MPI_Iallreduce
 * (MPI_IN_PLACE, arena + offset, count, MPI_FLOAT, MPI_SUM) on the
 * program's communicator.  Called as soon as the bucket's last gradient is
 * written; nothing may write to the bucket until its wait returns. */
void cleave_rt_allreduce_start(int32_t bucket);
/* Returns when the bucket's sum is complete (MPI_Wait); called before the
 * first kernel that reads one of its gradients. */
void cleave_rt_allreduce_wait(int32_t bucket);
/* Start and wait at once, for a bucket with no kernel between the two
 * (the last bucket of a step, typically): a blocking MPI_Allreduce, which
 * Open MPI runs at two to three times the speed of MPI_Iallreduce and
 * MPI_Wait on large buckets. */
void cleave_rt_allreduce(int32_t bucket);
/* Called after every kernel while any bucket is started and not waited
 * for: tests the outstanding requests so that the non-blocking collectives
 * make progress during the backward pass (Open MPI has no progress thread).
 * Cheap when nothing is outstanding. */
void cleave_rt_progress(void);

/* Runs task(ctx, t, T) for t = 0 .. T-1, T the program's "threads", and
 * returns when every call has returned: t = 0 on the calling thread, the
 * others on the runtime's workers (rt_pool.c), at the same time.  Called
 * by the generated matrix products, which give each t a fixed share of
 * the work that depends only on t and T; with T = 1 (or no workers) it
 * simply calls task(ctx, 0, 1). */
void cleave_rt_parallel(void (*task)(void *ctx, int64_t t, int64_t T), void *ctx);

/* Staged programs (strategy "layer", "pipeline", "hybrid"): one module
 * holds a program per stage; the runtime stores the stage of its rank in
 * cleave_program before the first step, and cleave_train_step and
 * cleave_eval_step run that program.  Their metadata adds, at the top
 * level, "stages" P, "dp" D (ranks = D x P), "microbatches" M,
 * "micro_batch" (rows of one), "schedule", "tag_bound" (every message tag
 * is below it), "placement" ("by_replica", the default: rank = replica x
 * P + stage; "by_stage": rank = stage x D + replica); "inputs", "output" and "params" there give names, dtypes
 * and shapes ([local_batch, ...] for inputs; params add "stage", the
 * stage whose copy --save writes) without offsets; "lr" only its "value";
 * and "programs", one per stage:
 *   {"stage": s, "arena_bytes": N, "init_bytes": N,
 *    "init_offset": o,               this program's image in cleave_init
 *    "peak_activation_bytes": N,     planned peak of live activations
 *    "inputs": [{"name", "offset"}], the inputs this stage reads; the M
 *                                    micro-batches' rows back to back
 *                                    from offset, as one [local_batch,
 *                                    ...] tensor
 *    "params": [{"name", "offset"}], the parameters it holds
 *    "loss": {"offset", "count": M}, last stage: each micro-batch's mean
 *                                    loss (the step's is their mean)
 *    "output": {"offset"},           last stage: the M micro-batches'
 *                                    output rows, back to back
 *    "lr": {"offset"}, "step": {"offset"}}  when it runs optimizer updates
 * Rank replica * P + stage runs program `stage` of data-parallel
 * `replica`, on rows [replica * local_batch, +local_batch) of each batch.
 * The generated step names peers by stage; the runtime adds
 * replica * P.  Sends complete at cleave_rt_send_wait or, for the last
 * ones, after the step function returns, before the next step writes any
 * input. */
extern int32_t cleave_program;

/* Non-blocking send of `bytes` bytes at buf to stage `peer` of this
 * rank's replica (MPI_Isend); the buffer stays untouched until the end of
 * the step. */
void cleave_rt_send(int32_t peer, int32_t tag, void *buf, int64_t bytes);
/* Completes the send to stage `peer` with `tag` (MPI_Wait); its buffer
 * may be reused after it. */
void cleave_rt_send_wait(int32_t peer, int32_t tag);
/* Blocking receive of exactly `bytes` bytes from stage `peer`. */
void cleave_rt_recv(int32_t peer, int32_t tag, void *buf, int64_t bytes);
/* In-place sum of `count` floats over the replicas of stage `group` (the
 * caller's own stage). */
void cleave_rt_group_allreduce(int32_t group, void *buf, int64_t count);
/* The step starts a unit of work, for traces: kind 0 the forward of
 * micro-batch `micro`, 1 its backward, 2 the once-per-step update
 * (micro -1). */
void cleave_rt_unit(int32_t kind, int32_t micro);

#endif
