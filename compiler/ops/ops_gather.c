/* ops_gather.c - Gather and its gradient.
 *
 * Gather(data, indices) picks slices of data along one axis: an embedding
 * (nn.Embedding exports as Gather on axis 0 of a [V, d] table with int64
 * token ids), an index pick such as x[:, 0] (a scalar index on axis 1),
 * and the Shape -> Gather steps of PyTorch's shape subgraphs, which fold.
 * Its gradient, cleave.GatherGrad, scatters dY back into zeros of the
 * data's shape, adding where an index repeats.
 *
 * Indices may be negative (counting from the end, ONNX opset 11 on).
 * Constant indices are checked when the shape rule runs; indices that
 * arrive at run time are checked by both kernels before any memory is
 * touched, and one out of range stops the program with an error naming
 * the node (cg_checked_index): never a read or write outside the tensors,
 * and never a silently clamped or zeroed row. */
#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

/* The node's axis of data, normalised to [0, rank). */
static int64_t gather_axis(const Value *x, const Node *n) {
    int64_t axis = node_attr_i(n, "axis", 0);
    return axis < 0 ? axis + x->rank : axis;
}

/* ---- shapes and folding ---- */

static bool infer_gather(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *idx = n->in[1];
    if (idx->dtype != DT_UNDEFINED && idx->dtype != DT_INT64 && idx->dtype != DT_INT32)
        return op_error(c, n, "indices '%s' are %s; int32 or int64 required", idx->name, dtype_name(idx->dtype));
    int64_t axis = node_attr_i(n, "axis", 0);
    if (!norm_axis(c, n, &axis, x->rank)) return false;
    int r = x->rank - 1 + idx->rank;
    if (r > MAX_RANK) return op_error(c, n, "result rank %d exceeds %d", r, MAX_RANK);
    Dim out[MAX_RANK];
    int k = 0;
    for (int j = 0; j < axis; j++) out[k++] = x->dims[j];
    for (int j = 0; j < idx->rank; j++) out[k++] = idx->dims[j];
    for (int j = (int)axis + 1; j < x->rank; j++) out[k++] = x->dims[j];
    /* Constant indices must lie inside the axis. */
    if (in_const(n, 1) && dim_is_const(x->dims[axis])) {
        int64_t len = x->dims[axis].k;
        for (int64_t i = 0; i < idx->konst->n; i++) {
            int64_t v = const_get_i(idx->konst, i);
            if (v < -len || v >= len)
                return op_error(c, n, "index %lld is out of range for axis %lld of size %lld", (long long)v,
                                (long long)axis, (long long)len);
        }
    }
    set_out(n, 0, x->dtype, r, out);
    return true;
}

/* Constant data and indices (the shape subgraphs): y[o, i, k] =
 * x[o, indices[i], k], the indices checked by the shape rule. */
static FoldResult fold_gather(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *idx = n->in[1];
    if (!in_const(n, 0) || !in_const(n, 1) || idx->konst->sym || !value_shape_known(x) || !value_shape_known(idx) ||
        !value_shape_known(n->out[0]))
        return FOLD_NO;
    int64_t outer, len, inner, ni = idx->konst->n;
    cg_axis_split(x, (int)gather_axis(x, n), &outer, &len, &inner);
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t e = 0; e < r->n; e++) {
        int64_t k = e % inner, i = e / inner % ni, o = e / inner / ni;
        int64_t v = const_get_i(idx->konst, i);
        if (v < 0) v += len;
        if (!const_copy_elem(c->g, r, e, x->konst, (o * len + v) * inner + k)) return FOLD_NO;
    }
    return FOLD_DONE;
}

/* GatherGrad(dY, indices) -> dX of the "shape" attribute: dY must be
 * that shape with the axis replaced by the indices' dims. */
static bool infer_gather_grad(OpCtx *c, Node *n) {
    const Value *dy = n->in[0], *idx = n->in[1];
    if (!dtype_is_float(dy->dtype)) return op_error(c, n, "dY '%s' is %s, not a float type", dy->name, dtype_name(dy->dtype));
    if (idx->dtype != DT_INT64 && idx->dtype != DT_INT32)
        return op_error(c, n, "indices '%s' are %s; int32 or int64 required", idx->name, dtype_name(idx->dtype));
    const int64_t *shape;
    int r = node_attr_ints(n, "shape", &shape);
    int64_t axis = node_attr_i(n, "axis", 0);
    if (r < 1 || axis < 0 || axis >= r) return op_error(c, n, "axis %lld is out of range for rank %d", (long long)axis, r);
    if (dy->rank != r - 1 + idx->rank)
        return op_error(c, n, "dY has rank %d; %d expected for data of rank %d and indices of rank %d", dy->rank,
                        r - 1 + idx->rank, r, idx->rank);
    for (int j = 0, k = 0; j < r; j++) {
        int take = j == axis ? idx->rank : 1;
        for (int q = 0; q < take; q++, k++) {
            Dim want = j == axis ? idx->dims[q] : dim_const(shape[j]);
            if (!dim_eq(dy->dims[k], want))
                return op_error(c, n, "dY's dimension %d does not match the data and the indices", k);
        }
    }
    Dim out[MAX_RANK];
    for (int j = 0; j < r; j++) out[j] = dim_const(shape[j]);
    set_out(n, 0, dy->dtype, r, out);
    return true;
}

/* Gather moves data and computes nothing. */
static double flops_zero(const Node *n) {
    (void)n;
    return 0;
}

/* One addition per element of dY. */
static double flops_gather_grad(const Node *n) { return (double)value_numel(n->in[0]); }

/* ---- kernels ---- */

/* &buf(v)[elem] for an element of `eb` bytes. */
static LLVMValueRef byte_ptr(Cg *c, const Value *v, LLVMValueRef elem, int64_t eb) {
    LLVMValueRef off = cg_mul(c, elem, eb);
    return LLVMBuildInBoundsGEP2(c->b, c->t_i8, cg_buf(c, v), &off, 1, "");
}

/* y[o, i, :] = x[o, indices[i], :]: each row (the `inner` elements after
 * the axis, contiguous in both) is one memcpy, which LLVM expands into
 * vector moves or a call of the C library's vectorised copy.  Every index
 * is read and checked once, outside the loop over the outer rows. */
static bool k_gather(Cg *c, const Node *n) {
    const Value *x = n->in[0], *idx = n->in[1], *y = n->out[0];
    int64_t axis = gather_axis(x, n), outer, len, inner, ni = value_numel(idx);
    cg_axis_split(x, (int)axis, &outer, &len, &inner);
    if (!cg_kernel_begin_io(c, n)) return false;
    if (value_numel(y) > 0) {
        int64_t eb = plan_value_bytes(y) / value_numel(y);
        CgLoop li, lo;
        LLVMValueRef i = cg_for(c, &li, cg_i64(c, ni));
        LLVMValueRef v = cg_checked_index(c, n, idx, i, axis, len);
        LLVMValueRef o = cg_for(c, &lo, cg_i64(c, outer));
        LLVMValueRef src = cg_mul(c, cg_add(c, cg_mul(c, o, len), v), inner);
        LLVMValueRef dst = cg_mul(c, cg_add(c, cg_mul(c, o, ni), i), inner);
        LLVMBuildMemCpy(c->b, byte_ptr(c, y, dst, eb), (unsigned)eb, byte_ptr(c, x, src, eb), (unsigned)eb,
                        cg_i64(c, inner * eb));
        cg_for_end(c, &lo);
        cg_for_end(c, &li);
    }
    cg_kernel_end(c);
    return true;
}

/* dx[xbase + k] += dy[ybase + k] for k < inner: float32 in vectors of 8
 * and a scalar tail; other float types element by element, through
 * cg_store's rounding to their precision.  Each element is one addition,
 * so the bits do not depend on the vector width. */
static void row_add(Cg *c, const Value *dx, LLVMValueRef xbase, const Value *dy, LLVMValueRef ybase, int64_t inner) {
    enum { W = 8 };
    int64_t nv = dx->dtype == DT_FLOAT ? inner / W : 0;
    if (nv > 0) {
        LLVMTypeRef vt = LLVMVectorType(c->t_f32, W);
        CgLoop l;
        LLVMValueRef off = cg_mul(c, cg_for(c, &l, cg_i64(c, nv)), W);
        LLVMValueRef xi = cg_add(c, xbase, off), yi = cg_add(c, ybase, off);
        LLVMValueRef px = LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, dx), &xi, 1, "");
        LLVMValueRef py = LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, dy), &yi, 1, "");
        LLVMValueRef a = LLVMBuildLoad2(c->b, vt, px, ""), b = LLVMBuildLoad2(c->b, vt, py, "");
        LLVMSetAlignment(a, 4);
        LLVMSetAlignment(b, 4);
        LLVMSetAlignment(LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, a, b, ""), px), 4);
        cg_for_end(c, &l);
    }
    if (inner > nv * W) {
        CgLoop l;
        LLVMValueRef k = cg_add(c, cg_for(c, &l, cg_i64(c, inner - nv * W)), cg_i64(c, nv * W));
        LLVMValueRef xi = cg_add(c, xbase, k);
        cg_store(c, dx, xi, LLVMBuildFAdd(c->b, cg_load(c, dx, xi), cg_load(c, dy, cg_add(c, ybase, k)), ""));
        cg_for_end(c, &l);
    }
}

/* dX = 0, then dX[o, indices[i], :] += dY[o, i, :] for i in order and o in
 * order: a fixed order of additions, so repeated indices sum to the same
 * bits on every run.  Out-of-range indices stop the program, naming the
 * forward Gather. */
static bool k_gather_grad(Cg *c, const Node *n) {
    const Value *dy = n->in[0], *idx = n->in[1], *dx = n->out[0];
    int64_t axis = node_attr_i(n, "axis", 0), outer, len, inner, ni = value_numel(idx);
    cg_axis_split(dx, (int)axis, &outer, &len, &inner);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMBuildMemSet(c->b, cg_buf(c, dx), LLVMConstInt(c->t_i8, 0, 0), cg_i64(c, plan_value_bytes(dx)), 4);
    if (value_numel(dy) > 0) {
        CgLoop li, lo;
        LLVMValueRef i = cg_for(c, &li, cg_i64(c, ni));
        LLVMValueRef v = cg_checked_index(c, n->origin ? n->origin : n, idx, i, axis, len);
        LLVMValueRef o = cg_for(c, &lo, cg_i64(c, outer));
        row_add(c, dx, cg_mul(c, cg_add(c, cg_mul(c, o, len), v), inner), dy,
                cg_mul(c, cg_add(c, cg_mul(c, o, ni), i), inner), inner);
        cg_for_end(c, &lo);
        cg_for_end(c, &li);
    }
    cg_kernel_end(c);
    return true;
}

/* ---- gradient rule ---- */

/* dData = GatherGrad(dY, indices); the indices get none. */
static bool g_gather(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    const Value *x = n->in[0];
    int64_t shape[MAX_RANK];
    for (int j = 0; j < x->rank; j++) {
        if (!dim_is_const(x->dims[j]))
            return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Gather): the gradient needs a known shape of '%s'",
                              c->g->path, n->name, x->name);
        shape[j] = x->dims[j].k;
    }
    Value *in[2] = {dy[0], n->in[1]};
    Node *g = gb_start(c, "cleave", "GatherGrad", 2, in, 1);
    gb_attr_i(c, g, "axis", gather_axis(x, n));
    gb_attr_ints(c, g, "shape", shape, x->rank);
    dx[0] = gb_finish(c, g);
    return true;
}

static const AttrSpec attrs_gather[] = {{"axis", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_gather_grad[] = {{"axis", ATTR_INT, .required = true}, {"shape", ATTR_INTS, .required = true}, {0}};

const OpDef op_Gather = {"Gather", "", 1, 0, 2, 2, 1, 1, attrs_gather, 0, infer_gather, fold_gather, flops_zero, .grad = g_gather, .cg = k_gather, .names_node = true};
const OpDef op_GatherGrad = {"GatherGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_gather_grad, 0, infer_gather_grad, NULL, flops_gather_grad, .cg = k_gather_grad, .names_node = true};
