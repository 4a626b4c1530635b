/* ops_trilu.c - Trilu (opset 14): the upper or lower triangle of each
 * matrix in the last two axes, the rest zero.  PyTorch exports torch.triu
 * and torch.tril to it (causal attention masks, at opset 14 and later).
 *
 * With upper = 1 element (i, j) of a matrix is kept where j - i >= k, with
 * upper = 0 where j - i <= k; k is the optional second input (a scalar or
 * one-element int64 tensor, 0 when omitted), any value allowed: a k beyond
 * the matrix keeps everything or nothing.  Trilu is linear and keeps or
 * zeroes each element by its position alone, so its gradient is Trilu of
 * dY with the same k and upper. */
#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

/* Whether Trilu keeps element (i, j) for diagonal offset k. */
static bool trilu_keeps(bool upper, int64_t i, int64_t j, int64_t k) {
    /* compared as i + k, not j - i, after clamping k to the matrix's
     * reach, so no sum can overflow */
    return upper ? j >= i + k : j <= i + k;
}

/* k clamped to [-(rows + 1), cols + 1]: beyond that every element is on
 * the same side of the diagonal, so the clamped value selects the same
 * elements, and i + k stays far from overflow. */
static int64_t trilu_clamp_k(int64_t k, int64_t rows, int64_t cols) {
    return k < -(rows + 1) ? -(rows + 1) : k > cols + 1 ? cols + 1 : k;
}

static bool infer_trilu(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *k = n->n_in > 1 ? n->in[1] : NULL;
    if (x->rank < 2) return op_error(c, n, "input '%s' has rank %d; Trilu needs at least 2", x->name, x->rank);
    if (k) {
        if (k->dtype != DT_INT64) return op_error(c, n, "k '%s' is %s, not int64", k->name, dtype_name(k->dtype));
        if (k->rank > 1 || (k->rank == 1 && !(dim_is_const(k->dims[0]) && k->dims[0].k == 1)))
            return op_error(c, n, "k '%s' must be a scalar or hold one element", k->name);
    }
    same_as_input(n, 0, 0);
    return true;
}

/* k of the node: its constant value, 0 when omitted; false when it is
 * only known at run time. */
static bool trilu_const_k(const Node *n, int64_t *k) {
    *k = 0;
    if (n->n_in < 2 || !n->in[1]) return true;
    if (!in_const(n, 1) || n->in[1]->konst->sym || n->in[1]->konst->n != 1) return false;
    *k = const_get_i(n->in[1]->konst, 0);
    return true;
}

static FoldResult fold_trilu(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t k;
    if (!in_const(n, 0) || x->konst->sym || !value_shape_known(x) || !trilu_const_k(n, &k)) return FOLD_NO;
    int64_t rows = x->dims[x->rank - 2].k, cols = x->dims[x->rank - 1].k;
    bool upper = node_attr_i(n, "upper", 1) != 0;
    k = trilu_clamp_k(k, rows, cols);
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t e = 0; e < r->n; e++) {
        int64_t j = e % cols, i = e / cols % rows;
        if (trilu_keeps(upper, i, j, k)) {
            if (!const_copy_elem(c->g, r, e, x->konst, e)) return FOLD_NO;
        } else if (r->store == DT_INT64) {
            const_set_i(r, e, 0);
        } else {
            const_set_f(r, e, 0);
        }
    }
    return FOLD_DONE;
}

/* y[b, i, j] = keep(i, j) ? x[b, i, j] : 0, k read from its buffer (a
 * constant's or one fed at run time) once.  The inner loop is a compare
 * of the column with a bound fixed per row and a select, which LLVM
 * vectorises. */
static bool k_trilu(Cg *c, const Node *n) {
    const Value *x = n->in[0], *kv = n->n_in > 1 ? n->in[1] : NULL, *y = n->out[0];
    int64_t rows = x->dims[x->rank - 2].k, cols = x->dims[x->rank - 1].k;
    int64_t mats = rows > 0 && cols > 0 ? value_numel(x) / (rows * cols) : 0;
    bool upper = node_attr_i(n, "upper", 1) != 0, fl = dtype_is_float(x->dtype);
    if (!cg_kernel_begin_io(c, n)) return false;
    if (mats > 0) {
        LLVMValueRef k = kv ? cg_load_i(c, kv, cg_i64(c, 0)) : cg_i64(c, 0);
        /* the clamp of trilu_clamp_k, so that i + k cannot overflow */
        LLVMValueRef lo = cg_i64(c, -(rows + 1)), hi = cg_i64(c, cols + 1);
        k = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, k, lo, ""), lo, k, "");
        k = LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntSGT, k, hi, ""), hi, k, "");
        LLVMValueRef zero = fl ? cg_f32(c, 0) : cg_i64(c, 0);
        CgLoop lb, li, lj;
        LLVMValueRef b = cg_for(c, &lb, cg_i64(c, mats));
        LLVMValueRef i = cg_for(c, &li, cg_i64(c, rows));
        LLVMValueRef bound = cg_add(c, i, k), row = cg_mul(c, cg_mad(c, b, rows, i), cols);
        LLVMValueRef j = cg_for(c, &lj, cg_i64(c, cols));
        LLVMValueRef keep = LLVMBuildICmp(c->b, upper ? LLVMIntSGE : LLVMIntSLE, j, bound, "");
        LLVMValueRef e = cg_add(c, row, j);
        LLVMValueRef v = fl ? cg_load(c, x, e) : cg_load_i(c, x, e);
        cg_store(c, y, e, LLVMBuildSelect(c->b, keep, v, zero, ""));
        cg_for_end(c, &lj);
        cg_for_end(c, &li);
        cg_for_end(c, &lb);
    }
    cg_kernel_end(c);
    return true;
}

/* dX = Trilu(dY) with the same k and upper. */
static bool g_trilu(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value *in[2] = {dy[0], n->n_in > 1 ? n->in[1] : NULL};
    Node *g = gb_start(c, "", "Trilu", in[1] ? 2 : 1, in, 1);
    gb_attr_i(c, g, "upper", node_attr_i(n, "upper", 1));
    dx[0] = gb_finish(c, g);
    return true;
}

static double flops_zero(const Node *n) {
    (void)n;
    return 0;
}

static const AttrSpec attrs_trilu[] = {{"upper", ATTR_INT, .i = 1}, {0}};

const OpDef op_Trilu = {"Trilu", "", 14, 0, 1, 2, 1, 1, attrs_trilu, 0, infer_trilu, fold_trilu, flops_zero, .grad = g_trilu, .cg = k_trilu};
