/* node_cost.h - per-node estimates read from the op table: forward FLOPs
 * and the trainable parameters a node owns. */
#ifndef CLEAVE_NODE_COST_H
#define CLEAVE_NODE_COST_H

#include "../ir/ir.h"

double cost_node_flops(const Node *n);
/* Elements of the trainable initializers this node is the first reader of
 * (so that shared weights count once); `seen` has g->n_values flags. */
int64_t cost_node_params(const Node *n, bool *seen, int64_t *bytes);
/* True for float initializers read in a weight slot by some node. */
bool value_is_trainable(const Graph *g, const Value *v);

#endif
