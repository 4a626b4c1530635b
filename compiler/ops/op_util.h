/* op_util.h - helpers shared by the op-table rules: errors that name the
 * node, output setters, broadcasting, reading constant operands, and the
 * generic constant evaluators that fold rules build on. */
#ifndef CLEAVE_OP_UTIL_H
#define CLEAVE_OP_UTIL_H

#include "ops.h"

/* "<file>: node '<name>' (<op>): <message>" as a DIAG_SHAPE error. */
bool op_error(OpCtx *c, const Node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Same with another error kind. */
bool op_error_kind(OpCtx *c, const Node *n, DiagCode code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sets output k's dtype and shape (rank -1: unknown). */
void set_out(Node *n, int k, DType t, int rank, const Dim *dims);
/* Sets output k's dtype and a rank whose dims are all unknown (rank -1:
 * unknown rank), for rules whose operands are not constant. */
void set_out_unknown(Node *n, int k, DType t, int rank);
/* Output k takes input i's dtype and shape. */
void same_as_input(Node *n, int k, int i);

/* Shape rule of the gradient ops that scatter dy (input 0) back into a
 * tensor of the forward input's shape, given as the "shape" attribute
 * (cleave.SliceGrad, cleave.ResizeGrad): output 0 has that shape and dy's
 * dtype. */
bool infer_shape_attr(OpCtx *c, Node *n);

/* Input i is present and constant (a float initializer counts in the
 * op's const_inputs slots). */
bool in_const(const Node *n, int i);
/* Reads constant integer input i (concrete elements only) into buf.
 * Returns the element count, -1 if not constant/not concrete, -2 if it has
 * more than max elements. */
int in_ints(const Node *n, int i, int64_t *buf, int max);
/* Normalises axis into [0, rank); false with an error when out of range. */
bool norm_axis(OpCtx *c, const Node *n, int64_t *axis, int rank);

/* Numpy broadcasting of inputs [first, first+count) (NULL inputs skipped)
 * into dims/rank. */
bool broadcast_inputs(OpCtx *c, const Node *n, int first, int count, Dim *dims, int *rank);
/* Checks that the float inputs listed agree in dtype; sets *t. */
bool same_dtype(OpCtx *c, const Node *n, int first, int count, DType *t);

/* Product of dims (symbolic allowed when at most one factor is symbolic);
 * false when not expressible. */
bool dims_product(const Dim *d, int rank, Dim *out);

/* New constant contents for output k, with the output's dtype and shape
 * already set by the shape rule. */
Const *fold_out(OpCtx *c, Node *n, int k);
/* Row-major strides of a shape. */
void shape_strides(const Value *v, int64_t *strides);
/* Multi-index of a flat index, and the flat index of input `in` that it
 * reads under numpy broadcasting against the output shape. */
int64_t broadcast_src_index(const Value *out, const Value *in, int64_t flat);

/* Elementwise fold: every present input constant, output small enough.
 * fn_f works in double for float outputs; fn_i on int64 for integer ones
 * (NULL: integers computed in double and truncated). */
typedef double (*FoldFnF)(const double *x, const Node *n);
typedef int64_t (*FoldFnI)(const int64_t *x, const Node *n, bool *ok);
FoldResult fold_elementwise(OpCtx *c, Node *n, FoldFnF fn_f, FoldFnI fn_i);

/* Elements of a folded result beyond which folding is not attempted. */
#define FOLD_MAX_ELEMS ((int64_t)1 << 20)

/* FLOP helpers */
double flops_per_out_elem(const Node *n, double per);

#endif
