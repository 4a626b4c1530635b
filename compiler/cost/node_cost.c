#include "node_cost.h"

#include "../ops/ops.h"

double cost_node_flops(const Node *n) {
    if (!n->def) return 0;
    if (n->def->flops) return n->def->flops(n);
    int64_t e = n->out[0] ? value_numel(n->out[0]) : -1;
    return e < 0 ? 0 : (double)e;
}

static bool is_weight_slot(const Node *n, int i) {
    const Value *v = n->in[i];
    if (!v || v->kind != VAL_INITIALIZER || !dtype_is_float(v->dtype)) return false;
    return !(n->def && i < 32 && ((n->def->state_inputs | n->def->const_inputs) >> i) & 1);
}

int64_t cost_node_params(const Node *n, bool *seen, int64_t *bytes) {
    int64_t total = 0;
    for (int i = 0; i < n->n_in; i++) {
        const Value *v = n->in[i];
        if (!is_weight_slot(n, i) || seen[v->id]) continue;
        seen[v->id] = true;
        total += v->konst->n;
        *bytes += v->konst->n * (int64_t)dtype_size(v->file_dtype);
    }
    return total;
}

bool value_is_trainable(const Graph *g, const Value *v) {
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == v && is_weight_slot(n, i)) return true;
    }
    return false;
}
