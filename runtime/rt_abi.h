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

#define CLEAVE_ABI_VERSION 2

/* JSON text describing the program (not NUL-terminated; length given).
 * Every plan is D data-parallel replicas of a P-stage pipeline on D x P
 * ranks, each replica's rows split into M micro-batches: a single program
 * is 1 x 1 x 1, a data-parallel one D x 1 x 1, and layer, pipeline and
 * hybrid programs fill in the rest.  The module holds one program per
 * stage; what every rank shares is at the top level, what each stage's
 * arena holds is in "programs":
 *
 * {"abi": 2, "plan_hash": "hex",   hash of the plan; every rank of a run
 *                                   must hold the same program
 *  "ranks": N,                      ranks the program is compiled for,
 *                                   D x P
 *  "rank_programs": P,              programs in the module, one per stage
 *  "strategy": s,                   the plan's strategy ("single", "dp",
 *                                   "layer", "pipeline", "hybrid"), for
 *                                   readers: the runtime goes by the layout
 *  "batch": B,                      global batch: rows of one optimizer step
 *  "local_batch": L,                rows of each replica, B / D; dim 0 of
 *                                   every input and of a batched output
 *  "stages": P, "dp": D, "microbatches": M,
 *  "micro_batch": L / M,            rows of one micro-batch
 *  "schedule": "layer"|"gpipe"|"1f1b",  order of the micro-batches' units
 *                                   ("layer" for single and dp)
 *  "tag_bound": T,                  every message tag is below it
 *  "placement": "by_replica"|"by_stage",  rank = replica x P + stage
 *                                   (by_replica, the default when absent)
 *                                   or stage x D + replica
 *  "lr": {"value": x,               the learning rate compiled in (--lr),
 *         "schedule": s,            and when compiled with --lr-schedule, the
 *         "warmup_steps": W},       schedule ("constant", "linear" or
 *                                   "cosine") and its warmup (absent:
 *                                   constant without warmup)
 *  "inputs": [{"name": s, "dtype": "float32"|"int64", "shape": [L, ...],
 *              "fill": "positions"}],
 *                                   one per graph input incl. "labels";
 *                                   the runtime writes each step's rows of
 *                                   this rank's replica to the stages
 *                                   reading them.  With "fill" (int64 [L],
 *                                   no file): each row's position in the
 *                                   global batch, replica x L + r, which
 *                                   keys dropout masks
 *  "output": {"name": s, "shape": [L, ...]},
 *                                   the model's first graph output (logits
 *                                   for --loss ce), valid after any step on
 *                                   the stages holding it; read for
 *                                   accuracy and --predict
 *  "params": [{"name": s, "dtype": "float32", "shape": [...],
 *              "trainable": bool, "stage": s}],
 *                                   initializers as the ONNX file names
 *                                   them; --save writes these back, each
 *                                   from the first stage `s` holding it
 *  "state": [{"name": "P.SLOT", "param": P, "slot": s, "dtype": "float32",
 *             "shape": [...], "stage": s}],
 *                                   the optimizer's state (SGD's
 *                                   momentum_buffer, Adam's exp_avg and
 *                                   exp_avg_sq) of parameter P, zero to start
 *                                   with; checkpoints save and restore it by
 *                                   name (absent: a program that cannot write
 *                                   checkpoints)
 *  "loss_kind": "ce"|"mse"|"model",
 *  "optimizer": {"name": s, "weight_decay": x, "clip_grad_norm": x,
 *                "momentum": x, "nesterov": b,  (momentum)
 *                "beta1": x, "beta2": x, "eps": x},  (adam, adamw)
 *                                   recorded in checkpoints; resuming under
 *                                   other values is refused
 *  "ignore_index": I,               loss_kind ce: labels equal to I count
 *                                   for nothing (absent: none is ignored)
 *  "threads": T,                    threads each rank runs its large matrix
 *                                   products on, 1 to 64 (absent: 1); the
 *                                   runtime starts T - 1 workers for
 *                                   cleave_rt_parallel before the first step
 *  "programs": [                    one per stage, in stage order:
 *   {"stage": s, "arena_bytes": N,  bytes the runtime allocates (64-aligned)
 *    "init_bytes": N,               cleave_init + init_offset is copied to
 *    "init_offset": o,              arena[0..N): this program's image
 *    "peak_activation_bytes": N,    planned peak of live activations
 *    "inputs": [{"name", "offset"}],  the inputs this stage reads; the M
 *                                   micro-batches' rows back to back from
 *                                   offset, as one [L, ...] tensor
 *    "params": [{"name", "offset"}],  the parameters it holds
 *    "state": [{"name", "offset"}],   the optimizer state it holds
 *    "buckets": [{"offset": o, "count": n}],
 *                                   with replicas (D > 1): the gradient
 *                                   buckets, n float32 values at byte o,
 *                                   contiguous, in the numbering the
 *                                   collectives below use (absent: none)
 *    "loss": {"offset", "count": M},  last stage: each micro-batch's
 *                                   loss, float32 (the step's is their mean)
 *    "output": {"offset"},          the stages holding the output: the M
 *                                   micro-batches' output rows, back to back
 *    "lr": {"offset"},              float32 scalars the runtime sets before
 *    "step": {"offset"},            each train step when the stage reads
 *                                   them: the learning rate and the 1-based
 *                                   optimizer step count (Adam's bias
 *                                   correction, dropout masks)
 *    "seed": {"offset"},            int64 the runtime sets once to --seed
 *                                   (0 without) when the stage draws
 *                                   dropout masks
 *    "label_count": {"offset"}}]}   loss_kind ce, the stage holding the
 *                                   loss: float32 the runtime sets before
 *                                   each step (train and eval) to the
 *                                   number of labels of the global batch
 *                                   that count (not ignore_index) divided
 *                                   by D x M; each micro-batch's loss is
 *                                   its rows' sum over that
 *
 * Offsets are byte offsets into the stage's arena, aligned to 64. */
/* How the runtime reads the metadata (runtime/README.md): every field above
 * is required and checked, but for those that say what their absence
 * means, a program's slots only some stages hold, and "strategy", which it
 * does not read; fields it does not know are ignored.  "output" is float32.  For loss_kind "ce" the input named
 * "labels" is int64 and holds one class index per row of logits over the
 * output's last dimension.  Under loss_kind "model" the output is the
 * model's loss and may have any shape, a scalar [] included; without a
 * batch dimension it has no rows and --predict is refused.  "arena_bytes"
 * is rounded up to a multiple of 64.  Rank replica x P + stage (under
 * by_replica) runs program `stage` of replica `replica`, on rows
 * [replica x L, +L) of each batch.  With replicas, the gradients are
 * scaled so that summing them over the replicas of a stage gives the
 * gradient of the global batch's mean loss; the step's loss is the mean of
 * the replicas' losses.  A program compiled for one
 * rank runs on any number, each rank training alone; one compiled for
 * several needs exactly its ranks. */
extern const char cleave_meta[];
extern const uint64_t cleave_meta_len;

/* The programs' initial arena images (parameters and constants), back to
 * back: a program's arena[0 .. init_bytes) starts at its init_offset. */
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

/* Defined by the runtime, called by cleave_train_step of a program with
 * replicas (the buckets are numbered as in its program's "buckets"; the
 * runtime knows the arena and the communicator, set up before the first
 * step).  Each step sums every bucket exactly once: either a start and
 * later a wait, in that order, or (nothing to overlap) one
 * cleave_rt_allreduce:
 *
 * Starts summing bucket `bucket` over the replicas of this rank's stage, in
 * place: MPI_Iallreduce (MPI_IN_PLACE, arena + offset, count, MPI_FLOAT,
 * MPI_SUM) on their communicator (the program's, with one stage).  Called
 * as soon as the bucket's last gradient is written; nothing may write to
 * the bucket until its wait returns. */
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

/* The stage this rank runs: the runtime stores it before the first step,
 * and cleave_train_step and cleave_eval_step run that stage's program (0
 * in a module of one).  The generated step names peers by stage; the
 * runtime turns a stage into the rank that runs it in this rank's replica
 * ("placement").  Sends complete at cleave_rt_send_wait or, for the last
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
/* In-place sum of `count` floats over a group: with `group` below the
 * program's stages, the replicas of stage `group` (the caller's own
 * stage); with `group` equal to the number of stages, the stages of the
 * caller's replica (gradient clipping's sum of squares). */
void cleave_rt_group_allreduce(int32_t group, void *buf, int64_t count);
/* The step starts a unit of work, for traces: kind 0 the forward of
 * micro-batch `micro`, 1 its backward, 2 the once-per-step update
 * (micro -1). */
void cleave_rt_unit(int32_t kind, int32_t micro);

#endif
