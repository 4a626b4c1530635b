/* node_key.h - what makes two nodes compute the same (node_key.c). */
#ifndef CLEAVE_NODE_KEY_H
#define CLEAVE_NODE_KEY_H

#include "ir.h"
#include "../util/text.h"

/* Appends a value's dtype, dims (with their symbols) and, for integer
 * constants (shapes, axes), their contents. */
void value_key(Text *t, const Value *v);
/* Appends everything a node's code generation reads from the node: op and
 * domain, every attribute exactly (tensor and graph attributes by kind
 * only), and value_key of each input and output slot.  Two nodes with the
 * same key build the same kernel (cg_share.c, which also refuses tensor
 * attributes) and take the same time (cost/profile.c). */
void node_key(Text *t, const Node *n);

#endif
