/* shapes.h - shape inference and constant folding.
 *
 * Requires: a loaded graph (ir_verify passes).  Provides: dtype and shape
 * of every value (unknown only downstream of unsupported ops), folded
 * constants in place of constant subgraphs (their nodes marked dead),
 * Identity nodes removed, and the batch symbol bound when asked. */
#ifndef CLEAVE_SHAPES_H
#define CLEAVE_SHAPES_H

#include "ir.h"

typedef struct ShapeOptions {
    int64_t batch; /* > 0: bind dim 0 of every graph input to this */
    bool fold;     /* fold constant subgraphs */
} ShapeOptions;

bool ir_infer_shapes(Graph *g, const ShapeOptions *opt, Diag *d);
/* Drops nodes whose outputs are all folded or unused and Identity nodes. */
void ir_prune(Graph *g);

#endif
