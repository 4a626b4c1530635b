/* ops_pool.c - the pools (NCHW): MaxPool, AveragePool and
 * GlobalAveragePool, with their shape rules, kernels and gradient rules,
 * and the internal ops of domain "cleave" the gradients are built from
 * (MaxPoolGrad, AveragePoolGrad; GlobalAveragePool's gradient is a
 * ReduceGrad).  The window geometry is ops_window.c's, shared with Conv
 * (ops_nn.c). */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "ops_cg.h"
#include "ops_window.h"

/* ==== shape rules ==== */

static bool infer_pool(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (x->rank < 3) return op_error(c, n, "input rank %d; at least 3 (N, C, spatial...) required", x->rank);
    int nsp = x->rank - 2;
    const int64_t *ks;
    int nk = node_attr_ints(n, "kernel_shape", &ks);
    if (nk != nsp) return op_error(c, n, "kernel_shape must have %d entries", nsp);
    Dim out[MAX_RANK];
    out[0] = x->dims[0];
    out[1] = x->dims[1];
    if (!window_out(c, n, x, ks, nsp, node_attr_i(n, "ceil_mode", 0) != 0, out + 2)) return false;
    set_out(n, 0, x->dtype, x->rank, out);
    set_out(n, 1, DT_INT64, x->rank, out); /* MaxPool's Indices */
    return true;
}

static double flops_pool(const Node *n) {
    const int64_t *ks;
    int nk = node_attr_ints(n, "kernel_shape", &ks);
    double per = 1;
    for (int i = 0; i < nk; i++) per *= (double)ks[i];
    return flops_per_out_elem(n, per);
}

static bool infer_global_pool(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (x->rank < 3) return op_error(c, n, "input rank %d; at least 3 required", x->rank);
    Dim out[MAX_RANK];
    out[0] = x->dims[0];
    out[1] = x->dims[1];
    for (int i = 2; i < x->rank; i++) out[i] = dim_const(1);
    set_out(n, 0, x->dtype, x->rank, out);
    return true;
}

static double flops_global_pool(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : (double)e;
}

/* ==== kernels ==== */

/* Opens one loop per output spatial dim; o[] gets the positions, the
 * result is the flat spatial output offset. */
static LLVMValueRef open_out_loops(Cg *c, const Win *w, Nest *ns, LLVMValueRef *o) {
    LLVMValueRef off = cg_i64(c, 0);
    for (int j = 0; j < w->nsp; j++) {
        o[j] = nest_for(c, ns, cg_i64(c, w->out[j]));
        off = cg_mad(c, off, w->out[j], o[j]);
    }
    return off;
}

/* Valid kernel ranges at output position o[]. */
static void window_ranges(Cg *c, const Win *w, const LLVMValueRef *o, LLVMValueRef *lo, LLVMValueRef *hi) {
    for (int j = 0; j < w->nsp; j++) kernel_range(c, w, j, o[j], &lo[j], &hi[j]);
}

/* Opens the loops over the valid window positions, in row-major kernel
 * order; returns the flat spatial input offset. */
static LLVMValueRef open_window_loops(Cg *c, const Win *w, const LLVMValueRef *o, const LLVMValueRef *lo,
                                      const LLVMValueRef *hi, Nest *ns) {
    LLVMValueRef off = cg_i64(c, 0);
    for (int j = 0; j < w->nsp; j++) {
        LLVMValueRef k = nest_range(c, ns, lo[j], hi[j]);
        off = cg_mad(c, off, w->in[j], in_pos(c, w, j, o[j], k));
    }
    return off;
}

/* Divisor of AveragePool at output o[]: the valid positions, or with
 * count_include_pad the positions inside the padded input (a window that
 * ceil_mode lets run past the end padding counts only what it covers). */
static LLVMValueRef avg_count(Cg *c, const Win *w, const LLVMValueRef *o, const LLVMValueRef *lo,
                              const LLVMValueRef *hi, bool include_pad) {
    LLVMValueRef cnt = cg_i64(c, 1);
    for (int j = 0; j < w->nsp; j++) {
        LLVMValueRef len;
        if (include_pad)
            len = hi_bound(c, affine(c, w->in[j] + w->pb[j] + w->pe[j] - 1, o[j], -w->s[j]), w->d[j], w->k[j]);
        else
            len = imax(c, LLVMBuildNSWSub(c->b, hi[j], lo[j], ""), cg_i64(c, 0));
        cnt = LLVMBuildNSWMul(c->b, cnt, len, "");
    }
    return LLVMBuildSIToFP(c->b, cnt, c->t_f32, "");
}

/* Elements of MaxPool's input and output: uint8 needs unsigned
 * conversions, which cg_load and cg_store do not make. */
static LLVMValueRef pool_load(Cg *c, const Value *v, LLVMValueRef i) {
    if (v->dtype != DT_UINT8) return cg_load(c, v, i);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_i8, cg_buf(c, v), &i, 1, "");
    return LLVMBuildUIToFP(c->b, LLVMBuildLoad2(c->b, c->t_i8, p, ""), c->t_f32, "");
}

static void pool_store(Cg *c, const Value *v, LLVMValueRef i, LLVMValueRef x) {
    if (v->dtype != DT_UINT8) {
        cg_store(c, v, i, x);
        return;
    }
    LLVMValueRef p = LLVMBuildInBoundsGEP2(c->b, c->t_i8, cg_buf(c, v), &i, 1, "");
    LLVMBuildStore(c->b, LLVMBuildFPToUI(c->b, x, c->t_i8, ""), p);
}

/* The first maximum of the window at output o[] of the plane at xb, in
 * window order, NaN winning as in torch: *best gets its value and *arg its
 * flat spatial input offset (-1 for an empty window). */
static void window_argmax(Cg *c, const Win *w, const Value *x, LLVMValueRef xb, const LLVMValueRef *o,
                          LLVMValueRef best, LLVMValueRef arg) {
    LLVMValueRef lo[MAX_RANK], hi[MAX_RANK];
    window_ranges(c, w, o, lo, hi);
    LLVMBuildStore(c->b, cg_f32(c, -INFINITY), best);
    LLVMBuildStore(c->b, cg_i64(c, -1), arg);
    Nest ns = {.n = 0};
    LLVMValueRef off = open_window_loops(c, w, o, lo, hi, &ns);
    LLVMValueRef v = pool_load(c, x, cg_add(c, xb, off));
    LLVMValueRef cur = load_f(c, best), ca = LLVMBuildLoad2(c->b, c->t_i64, arg, "");
    LLVMValueRef first = LLVMBuildICmp(c->b, LLVMIntSLT, ca, cg_i64(c, 0), "");
    LLVMValueRef gt = LLVMBuildFCmp(c->b, LLVMRealOGT, v, cur, "");
    LLVMValueRef nan = LLVMBuildAnd(c->b, LLVMBuildFCmp(c->b, LLVMRealUNO, v, v, ""),
                                    LLVMBuildFCmp(c->b, LLVMRealORD, cur, cur, ""), "");
    LLVMValueRef take = LLVMBuildOr(c->b, first, LLVMBuildOr(c->b, gt, nan, ""), "");
    LLVMBuildStore(c->b, LLVMBuildSelect(c->b, take, v, cur, ""), best);
    LLVMBuildStore(c->b, LLVMBuildSelect(c->b, take, off, ca, ""), arg);
    nest_close(c, &ns);
}

/* Spatial offset a (row-major) in column-major order, for MaxPool's
 * Indices with storage_order=1. */
static LLVMValueRef col_major(Cg *c, const Win *w, LLVMValueRef a) {
    int64_t cs[MAX_RANK], s = 1;
    for (int j = 0; j < w->nsp; j++) {
        cs[j] = s;
        s *= w->in[j];
    }
    LLVMValueRef r = cg_i64(c, 0);
    for (int j = w->nsp - 1; j >= 0; j--) {
        LLVMValueRef pos = LLVMBuildSRem(c->b, a, cg_i64(c, w->in[j]), "");
        r = cg_add(c, r, cg_mul(c, pos, cs[j]));
        a = sdiv_k(c, a, w->in[j]);
    }
    return r;
}

/* MaxPool; Indices (when requested) are flat indices into X, batch and
 * channel included, with the spatial part row-major (storage_order 0) or
 * column-major (1), as ONNX defines them. */
static bool k_maxpool(Cg *c, const Node *n) {
    const Value *X = n->in[0], *Y = n->out[0], *I = n->n_out > 1 ? n->out[1] : NULL;
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, X, Y, ks, &w);
    int64_t NC = X->dims[0].k * X->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef best = cg_alloca(c, c->t_f32), arg = cg_alloca(c, c->t_i64);
    Nest ns = {.n = 0};
    LLVMValueRef nc = nest_for(c, &ns, cg_i64(c, NC)), o[MAX_RANK];
    LLVMValueRef xb = cg_mul(c, nc, w.in_sz), yi = cg_add(c, cg_mul(c, nc, w.out_sz), open_out_loops(c, &w, &ns, o));
    window_argmax(c, &w, X, xb, o, best, arg);
    pool_store(c, Y, yi, load_f(c, best));
    if (I) {
        LLVMValueRef a = LLVMBuildLoad2(c->b, c->t_i64, arg, "");
        if (node_attr_i(n, "storage_order", 0) != 0) a = col_major(c, &w, a);
        cg_store(c, I, yi, cg_add(c, xb, a));
    }
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* MaxPoolGrad(dY, X) -> dX: dY routed to the window's first maximum. */
static bool k_maxpool_grad(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *dX = n->out[0];
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, X, dY, ks, &w);
    int64_t NC = X->dims[0].k * X->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dX, value_numel(dX), cg_f32(c, 0));
    LLVMValueRef best = cg_alloca(c, c->t_f32), arg = cg_alloca(c, c->t_i64);
    Nest ns = {.n = 0};
    LLVMValueRef nc = nest_for(c, &ns, cg_i64(c, NC)), o[MAX_RANK];
    LLVMValueRef xb = cg_mul(c, nc, w.in_sz), yi = cg_add(c, cg_mul(c, nc, w.out_sz), open_out_loops(c, &w, &ns, o));
    window_argmax(c, &w, X, xb, o, best, arg);
    LLVMValueRef a = LLVMBuildLoad2(c->b, c->t_i64, arg, "");
    LLVMValueRef found = LLVMBuildICmp(c->b, LLVMIntSGE, a, cg_i64(c, 0), "");
    LLVMValueRef g = LLVMBuildSelect(c->b, found, cg_load(c, dY, yi), cg_f32(c, 0), "");
    add_to(c, dX, cg_add(c, xb, imax(c, a, cg_i64(c, 0))), g);
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

static bool k_avgpool(Cg *c, const Node *n) {
    const Value *X = n->in[0], *Y = n->out[0];
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, X, Y, ks, &w);
    bool include_pad = node_attr_i(n, "count_include_pad", 0) != 0;
    int64_t NC = X->dims[0].k * X->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef sum = cg_alloca(c, c->t_f32);
    Nest ns = {.n = 0};
    LLVMValueRef nc = nest_for(c, &ns, cg_i64(c, NC)), o[MAX_RANK], lo[MAX_RANK], hi[MAX_RANK];
    LLVMValueRef xb = cg_mul(c, nc, w.in_sz), yi = cg_add(c, cg_mul(c, nc, w.out_sz), open_out_loops(c, &w, &ns, o));
    window_ranges(c, &w, o, lo, hi);
    LLVMValueRef cnt = avg_count(c, &w, o, lo, hi, include_pad);
    LLVMBuildStore(c->b, cg_f32(c, 0), sum);
    Nest wn = {.n = 0};
    LLVMValueRef off = open_window_loops(c, &w, o, lo, hi, &wn);
    LLVMBuildStore(c->b, f_add(c, load_f(c, sum), cg_load(c, X, cg_add(c, xb, off))), sum);
    nest_close(c, &wn);
    cg_store(c, Y, yi, f_div(c, load_f(c, sum), cnt));
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* AveragePoolGrad(dY) -> dX: dY / count spread over each window. */
static bool k_avgpool_grad(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *dX = n->out[0];
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, dX, dY, ks, &w);
    bool include_pad = node_attr_i(n, "count_include_pad", 0) != 0;
    int64_t NC = dX->dims[0].k * dX->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dX, value_numel(dX), cg_f32(c, 0));
    Nest ns = {.n = 0};
    LLVMValueRef nc = nest_for(c, &ns, cg_i64(c, NC)), o[MAX_RANK], lo[MAX_RANK], hi[MAX_RANK];
    LLVMValueRef xb = cg_mul(c, nc, w.in_sz), yi = cg_add(c, cg_mul(c, nc, w.out_sz), open_out_loops(c, &w, &ns, o));
    window_ranges(c, &w, o, lo, hi);
    LLVMValueRef g = f_div(c, cg_load(c, dY, yi), avg_count(c, &w, o, lo, hi, include_pad));
    Nest wn = {.n = 0};
    LLVMValueRef off = open_window_loops(c, &w, o, lo, hi, &wn);
    add_to(c, dX, cg_add(c, xb, off), g);
    nest_close(c, &wn);
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* Y[n,c] = mean of the plane X[n,c] */
static bool k_global_avgpool(Cg *c, const Node *n) {
    const Value *X = n->in[0], *Y = n->out[0];
    int64_t NC = X->dims[0].k * X->dims[1].k, P = 1;
    for (int j = 2; j < X->rank; j++) P *= X->dims[j].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    CgLoop l;
    LLVMValueRef nc = cg_for(c, &l, cg_i64(c, NC));
    LLVMValueRef s = dot_rt(c, X, cg_mul(c, nc, P), NULL, NULL, 1, cg_i64(c, P));
    cg_store(c, Y, nc, f_div(c, s, cg_f32(c, (double)(P ? P : 1))));
    cg_for_end(c, &l);
    cg_kernel_end(c);
    return true;
}

/* ==== gradient rules ==== */

static bool g_maxpool(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *X = n->in[0], *Y = n->out[0];
    if (!need[0] || !dy[0]) return true;
    if (!spatial_known(X) || !spatial_known(Y)) return grad_refuse(c, n, "the gradient needs static spatial shapes");
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, X, Y, ks, &w);
    Value *in[2] = {dy[0], X};
    Node *g = gb_start(c, "cleave", "MaxPoolGrad", 2, in, 1);
    win_attrs(c, g, &w);
    dx[0] = gb_finish(c, g);
    return true;
}

static bool g_avgpool(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *X = n->in[0], *Y = n->out[0];
    if (!need[0]) return true;
    if (!spatial_known(X) || !spatial_known(Y)) return grad_refuse(c, n, "the gradient needs static spatial shapes");
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    Win w;
    win_resolve(n, X, Y, ks, &w);
    Value *in[1] = {dy[0]};
    Node *g = gb_start(c, "cleave", "AveragePoolGrad", 1, in, 1);
    win_attrs(c, g, &w);
    gb_attr_i(c, g, "count_include_pad", node_attr_i(n, "count_include_pad", 0));
    gb_attr_ints(c, g, "spatial", w.in, w.nsp);
    dx[0] = gb_finish(c, g);
    return true;
}

/* dX = dY broadcast over the plane, divided by its size (ReduceGrad). */
static bool g_global_avgpool(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *X = n->in[0];
    if (!need[0]) return true;
    if (!spatial_known(X)) return grad_refuse(c, n, "the gradient needs static spatial shapes");
    int64_t axes[MAX_RANK], P = 1;
    for (int j = 2; j < X->rank; j++) {
        axes[j - 2] = j;
        P *= X->dims[j].k;
    }
    Value *in[2] = {dy[0], X};
    Node *g = gb_start(c, "cleave", "ReduceGrad", 2, in, 1);
    gb_attr_ints(c, g, "axes", axes, X->rank - 2);
    gb_attr_f(c, g, "scale", 1.0f / (float)(P ? P : 1));
    dx[0] = gb_finish(c, g);
    return true;
}

/* ==== shape rules of the internal gradient ops ==== */

static bool infer_like_second(OpCtx *c, Node *n) {
    (void)c;
    same_as_input(n, 0, 1);
    return true;
}

static bool infer_avgpool_grad(OpCtx *c, Node *n) { return spatial_out(c, n, n->in[0]->dims[1]); }

static const AttrSpec attrs_maxpool[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"ceil_mode", ATTR_INT, .i = 0}, {"dilations", ATTR_INTS},
    {"kernel_shape", ATTR_INTS, .required = true}, {"pads", ATTR_INTS}, {"storage_order", ATTR_INT, .i = 0},
    {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_avgpool[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"ceil_mode", ATTR_INT, .i = 0},
    {"count_include_pad", ATTR_INT, .i = 0}, {"dilations", ATTR_INTS},
    {"kernel_shape", ATTR_INTS, .required = true}, {"pads", ATTR_INTS}, {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_none[] = {{0}};

/* Explicit geometry of the internal ops (auto_pad already resolved). */
static const AttrSpec attrs_maxpool_grad[] = {
    {"dilations", ATTR_INTS}, {"kernel_shape", ATTR_INTS, .required = true}, {"pads", ATTR_INTS},
    {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_avgpool_grad[] = {
    {"count_include_pad", ATTR_INT, .i = 0}, {"dilations", ATTR_INTS}, {"kernel_shape", ATTR_INTS, .required = true},
    {"pads", ATTR_INTS}, {"spatial", ATTR_INTS, .required = true}, {"strides", ATTR_INTS}, {0}};

const OpDef op_MaxPool = {"MaxPool", "", 1, 0, 1, 1, 1, 2, attrs_maxpool, 0, infer_pool, NULL, flops_pool, .grad = g_maxpool, .cg = k_maxpool};
const OpDef op_AveragePool = {"AveragePool", "", 1, 0, 1, 1, 1, 1, attrs_avgpool, 0, infer_pool, NULL, flops_pool, .grad = g_avgpool, .cg = k_avgpool};
const OpDef op_GlobalAveragePool = {"GlobalAveragePool", "", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer_global_pool, NULL, flops_global_pool, .grad = g_global_avgpool, .cg = k_global_avgpool};

const OpDef op_MaxPoolGrad = {"MaxPoolGrad", "cleave", 1, 0, 2, 2, 1, 1, attrs_maxpool_grad, 0, infer_like_second, NULL, flops_pool, .cg = k_maxpool_grad};
const OpDef op_AveragePoolGrad = {"AveragePoolGrad", "cleave", 1, 0, 1, 1, 1, 1, attrs_avgpool_grad, 0, infer_avgpool_grad, NULL, flops_pool, .cg = k_avgpool_grad};
