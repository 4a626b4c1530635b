/* ops_reduce.c - reductions (ReduceMean, ReduceSum, ReduceMax). */
#include <string.h>

#include "op_util.h"
#include "ops_families.h"

/* Axes moved from attribute to input in opset 13 for ReduceSum and in
 * opset 18 for the others. */
static bool infer_reduce(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t since = strcmp(n->op_type, "ReduceSum") == 0 ? 13 : 18;
    int64_t axes[MAX_RANK * 2];
    int k;
    if (c->opset >= since) {
        k = n->n_in > 1 && n->in[1] ? in_ints(n, 1, axes, MAX_RANK * 2) : 0;
        if (k == -1) {
            set_out(n, 0, x->dtype, node_attr_i(n, "keepdims", 1) ? x->rank : -1, NULL);
            for (int j = 0; j < n->out[0]->rank; j++) n->out[0]->dims[j] = dim_unknown();
            return true;
        }
    } else {
        const int64_t *a;
        k = node_attr_ints(n, "axes", &a);
        if (k < 0) k = 0;
        if (k > MAX_RANK * 2) k = -2;
        if (k > 0) memcpy(axes, a, sizeof *a * (size_t)k);
    }
    if (k == -2) return op_error(c, n, "too many axes");
    bool red[MAX_RANK] = {0};
    bool noop = k == 0 && node_attr_i(n, "noop_with_empty_axes", 0) != 0;
    for (int i = 0; i < k; i++) {
        if (!norm_axis(c, n, &axes[i], x->rank)) return false;
        red[axes[i]] = true;
    }
    if (k == 0 && !noop)
        for (int j = 0; j < x->rank; j++) red[j] = true;
    bool keep = node_attr_i(n, "keepdims", 1) != 0;
    Dim out[MAX_RANK];
    int r = 0;
    for (int j = 0; j < x->rank; j++) {
        if (!red[j]) out[r++] = x->dims[j];
        else if (keep) out[r++] = dim_const(1);
    }
    set_out(n, 0, x->dtype, r, out);
    return true;
}

static double flops_reduce(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : (double)e;
}

static const AttrSpec attrs_reduce[] = {
    {"axes", ATTR_INTS}, {"keepdims", ATTR_INT, .i = 1}, {"noop_with_empty_axes", ATTR_INT, .i = 0}, {0}};

const OpDef op_ReduceMean = {"ReduceMean", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce};
const OpDef op_ReduceSum = {"ReduceSum", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce};
const OpDef op_ReduceMax = {"ReduceMax", "", 1, 0, 1, 2, 1, 1, attrs_reduce, 0, infer_reduce, NULL, flops_reduce};
