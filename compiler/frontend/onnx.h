/* onnx.h - the ONNX front end: model files and tensor files into the IR.
 *
 * Requires: a file path.  Provides: a Graph whose values carry the declared
 * dtypes and shapes, initializers with their contents (normalised per
 * Const), and nodes bound to op-table entries where cleave supports them.
 * Shapes of intermediate values are left to ir/shapes.c. */
#ifndef CLEAVE_ONNX_H
#define CLEAVE_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "../ir/ir.h"

/* Largest tensor cleave accepts, in bytes: guards against absurd dims. */
#define ONNX_MAX_TENSOR_BYTES ((int64_t)1 << 36)

Graph *onnx_load(const char *path, Diag *d);
/* Same from bytes already in memory; `path` names them in messages and its
 * folder anchors external data. */
Graph *onnx_load_buffer(const uint8_t *buf, size_t len, const char *path, Diag *d);
/* False when buf nests protobuf messages deeper than the loader accepts:
 * the decoder recurses once per level, so deep nesting would overflow the
 * stack.  onnx_load_buffer checks it; exposed for other decoders of the
 * same bytes (the fuzzer's mutator). */
bool onnx_nesting_ok(const uint8_t *buf, size_t len);
/* Reads a serialized TensorProto (as in the .pb files of ONNX test data sets) into a
 * new constant value of g. */
Value *onnx_load_tensor_file(Graph *g, const char *path, Diag *d);

#endif
