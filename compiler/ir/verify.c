/* verify.c - structural checks of a graph and its topological order.
 *
 * The loader already guarantees unique names; the verifier re-checks every
 * invariant so it can run between any two passes. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

void ir_replace_uses(Graph *g, Value *from, Value *to) {
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == from) n->in[i] = to;
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == from) g->outputs[i] = to;
}

/* Kahn's algorithm over live nodes; values without a producer are ready. */
Node **ir_topo_order(Graph *g, int *count, Diag *d) {
    int n_nodes = g->n_nodes;
    Node **order = ARENA_ARRAY(&g->arena, Node *, n_nodes ? n_nodes : 1);
    int *pending = calloc((size_t)(n_nodes ? n_nodes : 1), sizeof *pending);
    /* users[v] lists the nodes reading value v, as a CSR array. */
    int *first = calloc((size_t)g->n_values + 1, sizeof *first);
    int n_edges = 0;
    GRAPH_FOR_NODES(g, n) { n_edges += n->n_in; }
    int *users = malloc(sizeof *users * (size_t)(n_edges ? n_edges : 1));
    if (!order || !pending || !first || !users) {
        free(pending); free(first); free(users);
        diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        return NULL;
    }
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && n->in[i]->id >= 0) first[n->in[i]->id + 1]++;
    }
    for (int v = 0; v < g->n_values; v++) first[v + 1] += first[v];
    int *fill = calloc((size_t)g->n_values + 1, sizeof *fill);
    if (!fill) {
        free(pending); free(first); free(users);
        diag_error(d, DIAG_NOMEM, "%s: out of memory", g->path);
        return NULL;
    }
    int head = 0, tail = 0;
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++) {
            Value *v = n->in[i];
            if (!v || v->id < 0) continue;
            users[first[v->id] + fill[v->id]++] = n->id;
            if (v->producer && !v->producer->dead) pending[n->id]++;
        }
        if (pending[n->id] == 0) order[tail++] = n;
    }
    while (head < tail) {
        Node *n = order[head++];
        for (int k = 0; k < n->n_out; k++) {
            Value *v = n->out[k];
            if (!v) continue;
            for (int u = first[v->id]; u < first[v->id] + fill[v->id]; u++)
                if (--pending[users[u]] == 0) order[tail++] = g->nodes[users[u]];
        }
    }
    int live = 0;
    GRAPH_FOR_NODES(g, n) { live++; }
    Node *stuck = NULL;
    if (tail != live) {
        GRAPH_FOR_NODES(g, n) {
            if (pending[n->id] > 0 && !stuck) stuck = n;
        }
    }
    free(pending); free(first); free(users); free(fill);
    if (stuck) {
        diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s) is part of a cycle", g->path, stuck->name, stuck->op_type);
        return NULL;
    }
    *count = tail;
    return order;
}

bool ir_verify(Graph *g, Diag *d) {
    for (int i = 0; i < g->n_values; i++) {
        Value *v = g->values[i];
        if (v->id != i) return diag_error(d, DIAG_INTERNAL, "%s: value '%s' has a stale id", g->path, v->name);
        for (int j = 0; j < i; j++)
            if (strcmp(g->values[j]->name, v->name) == 0)
                return diag_error(d, DIAG_GRAPH, "%s: value '%s' is defined more than once", g->path, v->name);
        if (v->producer && (v->producer->out[v->producer_slot] != v))
            return diag_error(d, DIAG_INTERNAL, "%s: value '%s' disagrees with its producer", g->path, v->name);
        if ((v->kind == VAL_INITIALIZER || v->kind == VAL_CONSTANT) && !v->konst)
            return diag_error(d, DIAG_INTERNAL, "%s: constant '%s' has no contents", g->path, v->name);
    }
    GRAPH_FOR_NODES(g, n) {
        for (int i = 0; i < n->n_in; i++) {
            Value *v = n->in[i];
            if (!v) continue;
            if (v->id < 0 || v->id >= g->n_values || g->values[v->id] != v)
                return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): input %d is not a value of the graph", g->path,
                                  n->name, n->op_type, i);
            if (v->producer && v->producer->dead)
                return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): input '%s' comes from a removed node", g->path,
                                  n->name, n->op_type, v->name);
        }
    }
    int count;
    return ir_topo_order(g, &count, d) != NULL;
}
