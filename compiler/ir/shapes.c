/* shapes.c - the inference driver: visits nodes in topological order,
 * checks arity and opset against the op table, applies each op's shape
 * rule, then its fold rule when the inputs are constant. */
#include "shapes.h"

#include <string.h>

#include "../ops/ops.h"

/* Rewrites symbol `sym` as the constant b in a dimension. */
static Dim bind_dim(Dim x, int sym, int64_t b) {
    if (x.sym == sym && sym > 0) return dim_const(x.k * b);
    return x;
}

static bool bind_batch(Graph *g, int64_t batch, Diag *d) {
    /* Dim 0 of every input becomes B, whatever it was; symbols that stood
     * there are bound everywhere else they appear too. */
    for (int i = 0; i < g->n_inputs; i++) {
        Value *v = g->inputs[i];
        if (v->rank < 1)
            return diag_error(d, DIAG_SHAPE, "%s: input '%s' has no dimension 0 to bind --batch to", g->path, v->name);
        int sym = v->dims[0].sym;
        if (!sym && v->dims[0].k != batch) {
            g->file_batch = v->dims[0].k;
            g->bound_batch = batch;
        }
        for (int k = 0; k < g->n_values; k++) {
            Value *w = g->values[k];
            for (int j = 0; j < w->rank; j++) w->dims[j] = bind_dim(w->dims[j], sym, batch);
        }
        v->dims[0] = dim_const(batch);
    }
    return true;
}

static bool check_arity(Graph *g, const Node *n, Diag *d) {
    const OpDef *def = n->def;
    int present_in = n->n_in;
    while (present_in > 0 && !n->in[present_in - 1]) present_in--;
    if (present_in < def->min_in || n->n_in > def->max_in)
        return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): has %d inputs; %d to %d expected", g->path, n->name,
                          n->op_type, n->n_in, def->min_in, def->max_in);
    if (n->n_out < def->min_out || n->n_out > def->max_out)
        return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): has %d outputs; %d to %d expected", g->path, n->name,
                          n->op_type, n->n_out, def->min_out, def->max_out);
    for (int k = 0; k < def->min_out; k++)
        if (!n->out[k])
            return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): required output %d is omitted", g->path, n->name,
                              n->op_type, k);
    for (int i = 0; i < def->min_in; i++)
        if (!n->in[i])
            return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): required input %d is missing", g->path, n->name,
                              n->op_type, i);
    for (const AttrSpec *s = def->attrs; s && s->name; s++)
        if (s->required && !node_attr(n, s->name))
            return diag_error(d, DIAG_GRAPH, "%s: node '%s' (%s): required attribute '%s' is missing", g->path,
                              n->name, n->op_type, s->name);
    return true;
}

/* Byte size of every inferred value must be representable. */
static bool check_size(Graph *g, const Node *n, const Value *v, Diag *d) {
    int64_t bytes = (int64_t)(dtype_size(v->dtype) ? dtype_size(v->dtype) : 1);
    for (int j = 0; j < v->rank; j++) {
        Dim x = v->dims[j];
        if (x.sym == DIM_UNKNOWN) continue;
        if (x.k < 0)
            return diag_error(d, DIAG_SHAPE, "%s: node '%s' (%s): output '%s' has negative dimension %lld", g->path,
                              n->name, n->op_type, v->name, (long long)x.k);
        if (x.k && bytes > INT64_MAX / 4 / x.k)
            return diag_error(d, DIAG_LIMIT, "%s: node '%s' (%s): output '%s' is too large (its byte size overflows)",
                              g->path, n->name, n->op_type, v->name);
        bytes *= x.k ? x.k : 1;
    }
    return true;
}

static bool infer_node(Graph *g, Node *n, const ShapeOptions *opt, Diag *d) {
    if (!n->def) return true; /* unsupported: keep declared value_info, if any */
    OpCtx c = {g, d, graph_opset(g, n->domain)};
    if (c.opset && (c.opset < n->def->since || (n->def->until && c.opset > n->def->until)))
        return diag_error(d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): opset %lld is outside the supported range %d..%d",
                          g->path, n->name, n->op_type, (long long)c.opset, n->def->since, n->def->until);
    if (!check_arity(g, n, d)) return false;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && n->in[i]->rank < 0) return true; /* downstream of unknown: leave unknown */
    if (!n->def->infer(&c, n)) return false;
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] && !check_size(g, n, n->out[k], d)) return false;
    if (opt->fold && n->def->fold) {
        FoldResult r = n->def->fold(&c, n);
        if (r == FOLD_ERROR) return false;
        if (g->arena.failed) return diag_error(d, DIAG_NOMEM, "%s: out of memory folding '%s'", g->path, n->name);
    }
    return true;
}

/* Declared input shapes obey the same byte-size bound as inferred ones, so
 * shape rules never see dimensions whose arithmetic could overflow. */
static bool check_inputs(Graph *g, Diag *d) {
    for (int i = 0; i < g->n_inputs; i++) {
        const Value *v = g->inputs[i];
        int64_t bytes = (int64_t)(dtype_size(v->dtype) ? dtype_size(v->dtype) : 1);
        for (int j = 0; j < v->rank; j++) {
            Dim x = v->dims[j];
            if (x.sym == DIM_UNKNOWN) continue;
            if (x.k && bytes > INT64_MAX / 4 / x.k)
                return diag_error(d, DIAG_LIMIT, "%s: input '%s' is too large (its byte size overflows)", g->path,
                                  v->name);
            bytes *= x.k ? x.k : 1;
        }
    }
    return true;
}

bool ir_infer_shapes(Graph *g, const ShapeOptions *opt, Diag *d) {
    if (opt->batch > 0 && !bind_batch(g, opt->batch, d)) return false;
    if (!check_inputs(g, d)) return false;
    int count;
    Node **order = ir_topo_order(g, &count, d);
    if (!order) return false;
    for (int i = 0; i < count; i++)
        if (!infer_node(g, order[i], opt, d)) return false;
    return true;
}

void ir_prune(Graph *g) {
    /* Identity: readers use its input directly (unless it names a graph
     * output, whose name must survive). */
    GRAPH_FOR_NODES(g, n) {
        if (strcmp(n->op_type, "Identity") || n->domain[0] || !n->in[0] || !n->out[0] || n->out[0]->is_output)
            continue;
        ir_replace_uses(g, n->out[0], n->in[0]);
        n->dead = true;
    }
    /* Folded nodes: every output now a constant. */
    GRAPH_FOR_NODES(g, n) {
        bool all = n->n_out > 0;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] && n->out[k]->kind != VAL_CONSTANT) all = false;
        if (!all) continue;
        n->dead = true;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k]) n->out[k]->producer = NULL;
    }
}
