/* ops_linalg.c - Gemm and MatMul. */
#include "op_util.h"
#include "ops_families.h"

/* Y[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, C broadcast to [M,N]. */
static bool infer_gemm(OpCtx *c, Node *n) {
    const Value *a = n->in[0], *b = n->in[1];
    if (a->rank != 2 || b->rank != 2)
        return op_error(c, n, "A and B must be 2-D, got rank %d and %d", a->rank, b->rank);
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    bool ta = node_attr_i(n, "transA", 0) != 0, tb = node_attr_i(n, "transB", 0) != 0;
    Dim m = a->dims[ta ? 1 : 0], ka = a->dims[ta ? 0 : 1];
    Dim kb = b->dims[tb ? 1 : 0], nn = b->dims[tb ? 0 : 1];
    if (dim_is_const(ka) && dim_is_const(kb) && ka.k != kb.k)
        return op_error(c, n, "inner dimensions differ: A gives K=%lld, B gives K=%lld", (long long)ka.k,
                        (long long)kb.k);
    Dim out[2] = {m, nn};
    if (n->n_in > 2 && n->in[2]) {
        const Value *cv = n->in[2];
        if (cv->rank > 2) return op_error(c, n, "C has rank %d; at most 2 is allowed", cv->rank);
        for (int j = 0; j < cv->rank; j++) {
            Dim d = cv->dims[j], o = out[2 - cv->rank + j];
            if (dim_is_const(d) && d.k != 1 && dim_is_const(o) && d.k != o.k)
                return op_error(c, n, "C's dimension %lld does not broadcast to %lld", (long long)d.k,
                                (long long)o.k);
        }
    }
    set_out(n, 0, t, 2, out);
    return true;
}

static bool infer_matmul(OpCtx *c, Node *n) {
    const Value *a = n->in[0], *b = n->in[1];
    if (a->rank < 1 || b->rank < 1) return op_error(c, n, "inputs must have rank >= 1");
    DType t;
    if (!same_dtype(c, n, 0, 2, &t)) return false;
    /* 1-D operands are promoted (a row for A, a column for B) and the added
     * dimension is removed again from the result, as numpy.matmul does. */
    Dim ad[MAX_RANK], bd[MAX_RANK];
    int ar = a->rank, br = b->rank;
    for (int i = 0; i < ar; i++) ad[i] = a->dims[i];
    for (int i = 0; i < br; i++) bd[i] = b->dims[i];
    if (ar == 1) { ad[1] = ad[0]; ad[0] = dim_const(1); ar = 2; }
    if (br == 1) { bd[1] = dim_const(1); br = 2; }
    Dim ka = ad[ar - 1], kb = bd[br - 2];
    if (dim_is_const(ka) && dim_is_const(kb) && ka.k != kb.k)
        return op_error(c, n, "inner dimensions differ: %lld vs %lld", (long long)ka.k, (long long)kb.k);
    /* batch dims broadcast */
    int batch = (ar > br ? ar : br) - 2;
    Dim out[MAX_RANK + 1];
    for (int i = 0; i < batch; i++) {
        int ai = i - (batch - (ar - 2)), bi = i - (batch - (br - 2));
        Dim x = ai >= 0 ? ad[ai] : dim_const(1), y = bi >= 0 ? bd[bi] : dim_const(1);
        if (dim_is_const(x) && x.k == 1) out[i] = y;
        else if (dim_is_const(y) && y.k == 1) out[i] = x;
        else if (dim_is_const(x) && dim_is_const(y) && x.k != y.k)
            return op_error(c, n, "batch dimensions %lld and %lld do not broadcast", (long long)x.k, (long long)y.k);
        else out[i] = dim_is_const(x) ? x : y;
    }
    int r = batch;
    if (a->rank != 1) out[r++] = ad[ar - 2];
    if (b->rank != 1) out[r++] = bd[br - 1];
    set_out(n, 0, t, r, out);
    return true;
}

/* 2*M*N*K multiply-adds plus M*N for the bias. */
static double flops_gemm(const Node *n) {
    const Value *a = n->in[0], *y = n->out[0];
    if (!value_shape_known(a) || !value_shape_known(y)) return 0;
    double k = (double)a->dims[node_attr_i(n, "transA", 0) ? 0 : 1].k;
    double mn = (double)value_numel(y);
    return 2 * mn * k + ((n->n_in > 2 && n->in[2]) ? mn : 0);
}

static double flops_matmul(const Node *n) {
    const Value *a = n->in[0], *y = n->out[0];
    if (!value_shape_known(a) || !value_shape_known(y)) return 0;
    return 2 * (double)value_numel(y) * (double)a->dims[a->rank - 1].k;
}

static const AttrSpec attrs_gemm[] = {
    {"alpha", ATTR_FLOAT, .f = 1.0f}, {"beta", ATTR_FLOAT, .f = 1.0f},
    {"transA", ATTR_INT, .i = 0},     {"transB", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_none[] = {{0}};

const OpDef op_Gemm = {"Gemm", "", 1, 0, 2, 3, 1, 1, attrs_gemm, 0, infer_gemm, NULL, flops_gemm};
const OpDef op_MatMul = {"MatMul", "", 1, 0, 2, 2, 1, 1, attrs_none, 0, infer_matmul, NULL, flops_matmul};
