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
#include "../codegen/cg_gemm.h"
#include "ops_cg.h"
#include "ops_pool.h"
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

/* ---- MaxPool and MaxPoolGrad in vectors ----
 *
 * Float32 pools over one or two spatial dims run in vectors of W output
 * columns (W = cg_vector_floats(), 16 with AVX-512): plane by plane,
 * output row by output row, W columns at a time.  A vector keeps its
 * lanes' running maxima (and for the gradient their positions) in
 * registers across the window.  For each valid kernel row and each kernel
 * column kx, lane t reads input column (ow0 + t)*sw - pw + kx*dw: the W*sw
 * floats from lane 0's column are read as one vector and lanes 0, sw,
 * 2sw... picked from it by a shuffle, so no stride needs a gather.  The
 * vectors whose reads all stay inside their row (the interior) run in a
 * loop of plain loads; the others (reads touching the padding or leaving
 * the row, and the row's last, partial vector) are emitted one by one,
 * their masks known at compile time.
 *
 * The bits are the scalar kernel's.  Each lane makes window_argmax's
 * comparisons on the same elements in the same order; lanes masked off
 * (padding) take no part.  The forward pass needs no "first element"
 * test: a lane starts at -inf and masked reads give -inf, and the first
 * element either replaces -inf (it is greater, or NaN) or is -inf itself,
 * so the lane ends where window_argmax's value does.  The gradient keeps
 * the test, since it routes dY to a position, and adds dY into dX one lane
 * at a time in lane order, vector after vector, row after row: the
 * scalar kernel's order of outputs, so where windows overlap (stride
 * below the kernel's extent) the adds into one element of dX happen in
 * the same order.
 *
 * The scalar kernels below keep what this does not take (vp_plan): other
 * dtypes (uint8), MaxPool's Indices output, three or more spatial dims,
 * windows that read only padding (possible when pads reach past the
 * kernel's extent; the scalar kernel's empty window has its own
 * result), strides above MAX_SW along the row (a read would span too
 * many floats), kernels wider than MAX_KW columns (they are unrolled),
 * rows with more than MAX_EDGE edge vectors (dilations large against
 * the vector), planes of 2^31 elements or more (positions are 32-bit
 * lanes), and every pool when tests force the scalar paths
 * (cg_gemm_forced() < 0). */

enum { MAX_KW = 16, MAX_SW = 4, MAX_EDGE = 8, MAX_SPAN = 16 * MAX_SW };

typedef struct VPool {
    const Win *w;
    int W;                  /* lanes */
    bool rows;              /* two spatial dims; with one, a plane is one row */
    int64_t iw, ow;         /* floats of an input and an output row */
    int64_t kw, sw, dw, pw; /* kernel, stride, dilation and leading pad along the row */
    int64_t span;           /* floats one read covers: W * sw */
    int64_t nvec;           /* vectors per output row */
    int64_t v_lo, v_hi;     /* the interior vectors [v_lo, v_hi) */
    LLVMTypeRef vf, vwide, vi; /* <W x float>, <span x float>, <W x i32> */
} VPool;

/* The pool's inputs and outputs: Y for MaxPool, dY and dX for its
 * gradient. */
typedef struct VPoolIo {
    const Value *X, *Y, *dY, *dX;
} VPoolIo;

/* Whether every output position along axis j reads at least one input
 * position. */
static bool axis_never_empty(const Win *w, int j) {
    for (int64_t o = 0; o < w->out[j]; o++) {
        int64_t first = o * w->s[j] - w->pb[j]; /* kernel offset 0 */
        int64_t k = first >= 0 ? 0 : (-first + w->d[j] - 1) / w->d[j];
        if (k >= w->k[j] || first + k * w->d[j] >= w->in[j]) return false;
    }
    return true;
}

/* Whether the vector of outputs at column ow0 reads inside its row for
 * every kernel column, whole. */
static bool vp_interior(const VPool *p, int64_t ow0) {
    int64_t col0 = ow0 * p->sw - p->pw;
    return ow0 + p->W <= p->ow && col0 >= 0 && col0 + (p->kw - 1) * p->dw + p->span <= p->iw;
}

/* Fills p for window w between x and y (the output, or dX for the
 * gradient, whose window reads x); false when the vector kernels do not
 * serve it (the list above).  vp_run sets the types. */
static bool vp_plan(const Win *w, const Value *x, const Value *y, VPool *p) {
    if (cg_gemm_forced() < 0 || x->dtype != DT_FLOAT || y->dtype != DT_FLOAT) return false;
    if (w->nsp < 1 || w->nsp > 2 || w->out_sz < 1 || w->in_sz >= INT32_MAX) return false;
    int j = w->nsp - 1;
    *p = (VPool){.w = w, .W = cg_vector_floats(), .rows = w->nsp == 2, .iw = w->in[j], .ow = w->out[j],
                 .kw = w->k[j], .sw = w->s[j], .dw = w->d[j], .pw = w->pb[j]};
    if (p->kw > MAX_KW || p->sw > MAX_SW) return false;
    for (int a = 0; a < w->nsp; a++)
        if (!axis_never_empty(w, a)) return false;
    p->span = p->W * p->sw;
    p->nvec = (p->ow + p->W - 1) / p->W;
    p->v_lo = p->v_hi = 0;
    for (int64_t v = 0; v < p->nvec; v++) {
        if (!vp_interior(p, v * p->W)) continue;
        if (p->v_hi == p->v_lo) p->v_lo = v;
        else if (v != p->v_hi) break; /* a second run: its vectors stay edges */
        p->v_hi = v + 1;
    }
    return p->nvec - (p->v_hi - p->v_lo) <= MAX_EDGE;
}

/* Node n's window (MaxPool or MaxPoolGrad), and whether the vector
 * kernels serve it: then p is their plan. */
static bool maxpool_plan(const Node *n, Win *w, VPool *p) {
    bool grad = strcmp(n->op_type, "MaxPoolGrad") == 0;
    const Value *X = n->in[grad ? 1 : 0], *Y = grad ? n->in[0] : n->out[0];
    const int64_t *ks;
    node_attr_ints(n, "kernel_shape", &ks);
    win_resolve(n, X, Y, ks, w);
    if (grad) return Y->dtype == DT_FLOAT && vp_plan(w, X, n->out[0], p);
    bool indices = n->n_out > 1 && n->out[1];
    return !indices && vp_plan(w, X, Y, p);
}

bool maxpool_vectorised(const Node *n) {
    Win w;
    VPool p;
    return maxpool_plan(n, &w, &p);
}

/* <n x i1> with element e set when 0 <= first + e*step < lim and e <
 * lanes; NULL when every element is set. */
static LLVMValueRef const_mask(Cg *c, int64_t n, int64_t first, int64_t step, int64_t lim, int64_t lanes) {
    LLVMValueRef bits[MAX_SPAN];
    bool all = true;
    for (int64_t e = 0; e < n; e++) {
        int64_t at = first + e * step;
        bool on = at >= 0 && at < lim && e < lanes;
        all = all && on;
        bits[e] = LLVMConstInt(c->t_i1, on, 0);
    }
    return all ? NULL : LLVMConstVector(bits, (unsigned)n);
}

/* <n x t> holding k in every element (t an integer type). */
static LLVMValueRef const_ints(LLVMTypeRef t, int64_t n, int64_t k, int64_t step) {
    LLVMValueRef e[MAX_SPAN];
    for (int64_t i = 0; i < n; i++) e[i] = LLVMConstInt(t, (unsigned long long)(k + i * step), 1);
    return LLVMConstVector(e, (unsigned)n);
}

/* The lanes' inputs at X[at + t*sw]: the span floats from X[at] read as
 * one vector (under mask, with -inf where it is off; NULL reads them
 * all), then every sw-th picked. */
static LLVMValueRef vp_read(Cg *c, const VPool *p, const Value *X, LLVMValueRef at, LLVMValueRef mask) {
    LLVMValueRef ptr = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, X), &at, 1, ""), v;
    if (mask) {
        LLVMValueRef ninf[MAX_SPAN];
        for (int64_t e = 0; e < p->span; e++) ninf[e] = cg_f32(c, -INFINITY);
        LLVMTypeRef over[2] = {p->vwide, c->t_ptr};
        LLVMValueRef args[4] = {ptr, LLVMConstInt(c->t_i32, 4, 0), mask, LLVMConstVector(ninf, (unsigned)p->span)};
        v = cg_intrinsic(c, "llvm.masked.load", over, 2, args, 4);
    } else {
        v = LLVMBuildLoad2(c->b, p->vwide, ptr, "");
        LLVMSetAlignment(v, 4);
    }
    if (p->sw == 1) return v;
    return LLVMBuildShuffleVector(c->b, v, LLVMGetUndef(p->vwide), const_ints(c->t_i32, p->W, 0, p->sw), "");
}

/* One step of window_argmax in every lane: v (read at plane position pos
 * + t*sw) replaces the lane's maximum when it is greater, or a NaN over a
 * number, or (with arg) the window's first element.  valid (NULL: all
 * lanes) marks the lanes that read inside the row. */
static void vp_take(Cg *c, const VPool *p, LLVMValueRef v, LLVMValueRef valid, LLVMValueRef pos, LLVMValueRef best,
                    LLVMValueRef arg) {
    LLVMValueRef cur = LLVMBuildLoad2(c->b, p->vf, best, "");
    LLVMValueRef gt = LLVMBuildFCmp(c->b, LLVMRealOGT, v, cur, "");
    LLVMValueRef nan = LLVMBuildAnd(c->b, LLVMBuildFCmp(c->b, LLVMRealUNO, v, v, ""),
                                    LLVMBuildFCmp(c->b, LLVMRealORD, cur, cur, ""), "");
    LLVMValueRef take = LLVMBuildOr(c->b, gt, nan, "");
    if (arg) {
        LLVMValueRef ca = LLVMBuildLoad2(c->b, p->vi, arg, "");
        take = LLVMBuildOr(c->b, take, LLVMBuildICmp(c->b, LLVMIntSLT, ca, LLVMConstNull(p->vi), ""), "");
        if (valid) take = LLVMBuildAnd(c->b, take, valid, "");
        LLVMValueRef p0 = LLVMBuildTrunc(c->b, pos, c->t_i32, "");
        LLVMValueRef at = LLVMBuildInsertElement(c->b, LLVMGetUndef(p->vi), p0, LLVMConstInt(c->t_i32, 0, 0), "");
        at = LLVMBuildShuffleVector(c->b, at, LLVMGetUndef(p->vi), LLVMConstNull(p->vi), "");
        at = LLVMBuildAdd(c->b, at, const_ints(c->t_i32, p->W, 0, p->sw), "");
        LLVMBuildStore(c->b, LLVMBuildSelect(c->b, take, at, ca, ""), arg);
    }
    LLVMBuildStore(c->b, LLVMBuildSelect(c->b, take, v, cur, ""), best);
}

/* The window of the vector of outputs at column ow0 of output row oh in
 * the plane at xb: best gets each lane's maximum, arg (unless NULL) its
 * position in the plane.  edge is ow0 for an edge vector (its reads
 * masked), -1 for an interior one. */
static void vp_window(Cg *c, const VPool *p, const Value *X, LLVMValueRef xb, LLVMValueRef oh, LLVMValueRef ow0,
                      int64_t edge, LLVMValueRef best, LLVMValueRef arg) {
    const Win *w = p->w;
    LLVMValueRef init[MAX_SPAN];
    for (int t = 0; t < p->W; t++) init[t] = cg_f32(c, -INFINITY);
    LLVMBuildStore(c->b, LLVMConstVector(init, (unsigned)p->W), best);
    if (arg) LLVMBuildStore(c->b, const_ints(c->t_i32, p->W, -1, 0), arg);
    LLVMValueRef lo = cg_i64(c, 0), hi = cg_i64(c, 1);
    if (p->rows) kernel_range(c, w, 0, oh, &lo, &hi);
    CgLoop l;
    LLVMValueRef kh = for_range(c, &l, lo, hi);
    LLVMValueRef row = p->rows ? cg_mul(c, in_pos(c, w, 0, oh, kh), p->iw) : cg_i64(c, 0);
    LLVMValueRef col0 = affine(c, -p->pw, ow0, p->sw);
    int64_t lanes = edge < 0 || p->ow - edge >= p->W ? p->W : p->ow - edge;
    for (int64_t kx = 0; kx < p->kw; kx++) {
        LLVMValueRef pos = cg_add(c, row, cg_add(c, col0, cg_i64(c, kx * p->dw)));
        LLVMValueRef rmask = NULL, valid = NULL;
        if (edge >= 0) {
            int64_t b = edge * p->sw - p->pw + kx * p->dw; /* lane 0's column */
            rmask = const_mask(c, p->span, b, 1, p->iw, p->span);
            valid = const_mask(c, p->W, b, p->sw, p->iw, lanes);
        }
        vp_take(c, p, vp_read(c, p, X, cg_add(c, xb, pos), rmask), valid, pos, best, arg);
    }
    cg_for_end(c, &l);
}

/* One vector of outputs at column ow0 of output row oh (yrow: the row's
 * first output): its window, then MaxPool's store of the maxima or the
 * gradient's adds of dY at their positions, one lane at a time in lane
 * order.  edge as for vp_window. */
static void vp_vector(Cg *c, const VPool *p, const VPoolIo *io, LLVMValueRef xb, LLVMValueRef yrow, LLVMValueRef oh,
                      LLVMValueRef ow0, int64_t edge, LLVMValueRef best, LLVMValueRef arg) {
    vp_window(c, p, io->X, xb, oh, ow0, edge, best, arg);
    int64_t lanes = edge < 0 || p->ow - edge >= p->W ? p->W : p->ow - edge;
    LLVMValueRef yi = cg_add(c, yrow, ow0);
    if (io->Y) {
        LLVMValueRef ptr = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, io->Y), &yi, 1, "");
        LLVMValueRef v = LLVMBuildLoad2(c->b, p->vf, best, "");
        if (lanes == p->W) {
            LLVMSetAlignment(LLVMBuildStore(c->b, v, ptr), 4);
        } else {
            LLVMTypeRef over[2] = {p->vf, c->t_ptr};
            LLVMValueRef args[4] = {v, ptr, LLVMConstInt(c->t_i32, 4, 0), const_mask(c, p->W, 0, 1, lanes, lanes)};
            cg_intrinsic(c, "llvm.masked.store", over, 2, args, 4);
        }
        return;
    }
    LLVMValueRef a = LLVMBuildLoad2(c->b, p->vi, arg, "");
    for (int64_t t = 0; t < lanes; t++) {
        LLVMValueRef at = LLVMBuildExtractElement(c->b, a, LLVMConstInt(c->t_i32, (unsigned long long)t, 0), "");
        LLVMValueRef g = cg_load(c, io->dY, cg_add(c, yi, cg_i64(c, t)));
        add_to(c, io->dX, cg_add(c, xb, LLVMBuildSExt(c->b, at, c->t_i64, "")), g);
    }
}

/* Every plane, output row by output row, each row's vectors in order: the
 * edge vectors one by one, the interior ones in a loop. */
static void vp_run(Cg *c, VPool *p, const VPoolIo *io) {
    const Win *w = p->w;
    p->vf = LLVMVectorType(c->t_f32, (unsigned)p->W);
    p->vwide = LLVMVectorType(c->t_f32, (unsigned)p->span);
    p->vi = LLVMVectorType(c->t_i32, (unsigned)p->W);
    LLVMValueRef best = cg_alloca(c, p->vf), arg = io->Y ? NULL : cg_alloca(c, p->vi);
    int64_t NC = io->X->dims[0].k * io->X->dims[1].k;
    Nest ns = {.n = 0};
    LLVMValueRef nc = nest_for(c, &ns, cg_i64(c, NC)), oh = nest_for(c, &ns, cg_i64(c, p->rows ? w->out[0] : 1));
    LLVMValueRef xb = cg_mul(c, nc, w->in_sz), yrow = cg_add(c, cg_mul(c, nc, w->out_sz), cg_mul(c, oh, p->ow));
    for (int64_t v = 0; v < p->nvec; v++) {
        if (v == p->v_lo && p->v_hi > p->v_lo) {
            CgLoop l;
            LLVMValueRef iv = cg_add(c, cg_i64(c, p->v_lo), cg_for(c, &l, cg_i64(c, p->v_hi - p->v_lo)));
            vp_vector(c, p, io, xb, yrow, oh, cg_mul(c, iv, p->W), -1, best, arg);
            cg_for_end(c, &l);
            v = p->v_hi - 1;
            continue;
        }
        vp_vector(c, p, io, xb, yrow, oh, cg_i64(c, v * p->W), v * p->W, best, arg);
    }
    nest_close(c, &ns);
}

/* MaxPool; Indices (when requested) are flat indices into X, batch and
 * channel included, with the spatial part row-major (storage_order 0) or
 * column-major (1), as ONNX defines them.  What maxpool_plan accepts runs
 * the vector kernels above; these loops are the reference they match. */
static bool k_maxpool(Cg *c, const Node *n) {
    const Value *X = n->in[0], *Y = n->out[0], *I = n->n_out > 1 ? n->out[1] : NULL;
    Win w;
    VPool vp;
    bool vec = maxpool_plan(n, &w, &vp);
    int64_t NC = X->dims[0].k * X->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    if (vec) {
        vp_run(c, &vp, &(VPoolIo){.X = X, .Y = Y});
        cg_kernel_end(c);
        return true;
    }
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

/* MaxPoolGrad(dY, X) -> dX: dY routed to the window's first maximum,
 * in vectors where maxpool_plan allows. */
static bool k_maxpool_grad(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *dX = n->out[0];
    Win w;
    VPool vp;
    bool vec = maxpool_plan(n, &w, &vp);
    int64_t NC = X->dims[0].k * X->dims[1].k;
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dX, value_numel(dX), cg_f32(c, 0));
    if (vec) {
        vp_run(c, &vp, &(VPoolIo){.X = X, .dY = dY, .dX = dX});
        cg_kernel_end(c);
        return true;
    }
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
