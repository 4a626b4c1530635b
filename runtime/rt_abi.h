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
 * {"abi": 1, "plan_hash": "hex", "ranks": 1, "rank_programs": 1,
 *  "batch": B,                      global batch
 *  "arena_bytes": N,                bytes the runtime allocates (64-aligned)
 *  "init_bytes": N,                 cleave_init is copied to arena[0..N)
 *  "loss": {"offset": o},           float32 scalar: the step's mean loss
 *  "lr": {"offset": o, "value": x}, float32 scalar the runtime sets (--lr)
 *  "step": {"offset": o},           float32 scalar: 1-based optimizer step
 *                                   count, set by the runtime before each
 *                                   train step (Adam's bias correction)
 *  "inputs": [{"name": s, "dtype": "float32"|"int64", "shape": [B, ...],
 *              "offset": o}],       one per graph input incl. "labels";
 *                                   the runtime writes each step's rows here
 *  "output": {"name": s, "offset": o, "shape": [B, ...]},
 *                                   the model's first graph output (logits
 *                                   for --loss ce), valid after any step;
 *                                   read for accuracy and --predict
 *  "params": [{"name": s, "dtype": "float32", "shape": [...],
 *              "offset": o, "trainable": bool}],
 *                                   initializers as the ONNX file names
 *                                   them; --save writes these back
 *  "loss_kind": "ce"|"mse"|"model", "optimizer": {...}}
 *
 * Offsets are byte offsets into the arena, aligned to 64. */
/* How the runtime reads the metadata (runtime/README.md): every field above
 * is required and checked; fields it does not know are ignored.  "output"
 * is float32.  For loss_kind "ce" the input named "labels" is int64 and
 * holds one class index per row of logits over the output's last
 * dimension.  Under loss_kind "model" the output is the model's loss and
 * may have any shape, a scalar [] included; without a batch dimension it
 * has no rows and --predict is refused.  "arena_bytes" is rounded up to a
 * multiple of 64. */
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

#endif
