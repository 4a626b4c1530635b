/* ops_window.c - window geometry, index arithmetic and the shape and
 * gradient helpers Conv and the pools share (ops_window.h). */
#include <string.h>

#include "op_util.h"
#include "ops_cg.h"
#include "ops_window.h"

/* The sizes, strides and dilations of node n's window between input-shaped
 * x and output-shaped y (both NCHW), no padding yet. */
void win_init(const Node *n, const Value *x, const Value *y, const int64_t *kernel, Win *w) {
    int nsp = x->rank - 2;
    const int64_t *strides = NULL, *dil = NULL;
    int ks = node_attr_ints(n, "strides", &strides), kd = node_attr_ints(n, "dilations", &dil);
    w->nsp = nsp;
    w->in_sz = w->out_sz = w->k_sz = 1;
    for (int i = 0; i < nsp; i++) {
        w->in[i] = x->dims[2 + i].k;
        w->out[i] = y->dims[2 + i].k;
        w->k[i] = kernel[i];
        w->s[i] = ks == nsp ? strides[i] : 1;
        w->d[i] = kd == nsp ? dil[i] : 1;
        w->pb[i] = w->pe[i] = 0;
        w->in_sz *= w->in[i];
        w->out_sz *= w->out[i];
        w->k_sz *= w->k[i];
    }
}

/* Geometry of node n whose input-shaped value is x and output-shaped value
 * y (both NCHW), with the given kernel sizes: strides, dilations, and the
 * padding auto_pad or pads amount to. */
void win_resolve(const Node *n, const Value *x, const Value *y, const int64_t *kernel, Win *w) {
    win_init(n, x, y, kernel, w);
    const int64_t *pads = NULL;
    int kp = node_attr_ints(n, "pads", &pads);
    const char *ap = node_attr_s(n, "auto_pad", "NOTSET");
    bool upper = strcmp(ap, "SAME_UPPER") == 0, lower = strcmp(ap, "SAME_LOWER") == 0;
    if (strcmp(ap, "VALID") == 0 || (!upper && !lower && kp != 2 * w->nsp)) return;
    for (int i = 0; i < w->nsp; i++) {
        if (upper || lower) {
            /* SAME: the total padding that makes out = ceil(in / s), the
             * odd element at the end (UPPER) or the beginning (LOWER) */
            int64_t total = (w->out[i] - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1 - w->in[i];
            if (total < 0) total = 0;
            w->pb[i] = upper ? total / 2 : total - total / 2;
            w->pe[i] = total - w->pb[i];
        } else {
            w->pb[i] = pads[i];
            w->pe[i] = pads[w->nsp + i];
        }
    }
}

/* Row-major strides of dims[0..r). */
void win_flatten_pointwise(Win *w) {
    for (int j = 0; j < w->nsp; j++)
        if (w->k[j] != 1 || w->s[j] != 1 || w->pb[j] != 0 || w->pe[j] != 0 || w->in[j] != w->out[j]) return;
    *w = (Win){.nsp = 1, .in = {w->in_sz}, .out = {w->out_sz}, .k = {1}, .s = {1}, .d = {1},
               .in_sz = w->in_sz, .out_sz = w->out_sz, .k_sz = 1};
}

void strides_of(const int64_t *dims, int r, int64_t *st) {
    int64_t s = 1;
    for (int j = r - 1; j >= 0; j--) {
        st[j] = s;
        s *= dims[j];
    }
}

LLVMValueRef imax(Cg *c, LLVMValueRef a, LLVMValueRef b) {
    return LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntSGT, a, b, ""), a, b, "");
}

LLVMValueRef imin(Cg *c, LLVMValueRef a, LLVMValueRef b) {
    return LLVMBuildSelect(c->b, LLVMBuildICmp(c->b, LLVMIntSLT, a, b, ""), a, b, "");
}

/* a + x*m for constants a and m. */
LLVMValueRef affine(Cg *c, int64_t a, LLVMValueRef x, int64_t m) {
    return cg_add(c, cg_i64(c, a), cg_mul(c, x, m));
}

LLVMValueRef sdiv_k(Cg *c, LLVMValueRef a, int64_t k) {
    return k == 1 ? a : LLVMBuildSDiv(c->b, a, cg_i64(c, k), "");
}

/* Smallest j >= 0 with j*div >= t: max(0, ceil(t/div)). */
LLVMValueRef lo_bound(Cg *c, LLVMValueRef t, int64_t div) {
    return sdiv_k(c, cg_add(c, imax(c, t, cg_i64(c, 0)), cg_i64(c, div - 1)), div);
}

/* One past the largest j < limit with j*div <= u: clamp(floor(u/div)+1,
 * 0, limit); 0 when u < 0. */
LLVMValueRef hi_bound(Cg *c, LLVMValueRef u, int64_t div, int64_t limit) {
    LLVMValueRef v = sdiv_k(c, cg_add(c, imax(c, u, cg_i64(c, -1)), cg_i64(c, div)), div);
    return imin(c, v, cg_i64(c, limit));
}

/* Kernel offsets k of axis j that read inside the input at output o. */
void kernel_range(Cg *c, const Win *w, int j, LLVMValueRef o, LLVMValueRef *lo, LLVMValueRef *hi) {
    *lo = lo_bound(c, affine(c, w->pb[j], o, -w->s[j]), w->d[j]);
    *hi = hi_bound(c, affine(c, w->in[j] - 1 + w->pb[j], o, -w->s[j]), w->d[j], w->k[j]);
}

/* Output positions o of axis j whose kernel offset k reads inside. */
void output_range(Cg *c, const Win *w, int j, LLVMValueRef k, LLVMValueRef *lo, LLVMValueRef *hi) {
    *lo = lo_bound(c, affine(c, w->pb[j], k, -w->d[j]), w->s[j]);
    *hi = hi_bound(c, affine(c, w->in[j] - 1 + w->pb[j], k, -w->d[j]), w->s[j], w->out[j]);
}

/* Input position o*s - pb + k*d of axis j. */
LLVMValueRef in_pos(Cg *c, const Win *w, int j, LLVMValueRef o, LLVMValueRef k) {
    return cg_add(c, affine(c, -w->pb[j], o, w->s[j]), cg_mul(c, k, w->d[j]));
}

/* ---- shared by the shape rules, kernels and gradient rules ---- */

/* Spatial output sizes for Conv and the pools, honouring auto_pad, pads,
 * strides, dilations and ceil_mode.  `kernel` holds the window size per
 * spatial axis; out[] receives spatial dims. */
bool window_out(OpCtx *c, const Node *n, const Value *x, const int64_t *kernel, int nsp, bool ceil_mode,
                Dim *out) {
    const int64_t *strides = NULL, *pads = NULL, *dil = NULL;
    int ks = node_attr_ints(n, "strides", &strides), kp = node_attr_ints(n, "pads", &pads),
        kd = node_attr_ints(n, "dilations", &dil);
    if ((ks >= 0 && ks != nsp) || (kp >= 0 && kp != 2 * nsp) || (kd >= 0 && kd != nsp))
        return op_error((OpCtx *)c, n, "strides/pads/dilations do not match %d spatial dimensions", nsp);
    const char *auto_pad = node_attr_s(n, "auto_pad", "NOTSET");
    for (int i = 0; i < nsp; i++) {
        Dim in = x->dims[2 + i];
        int64_t s = ks >= 0 ? strides[i] : 1, d = kd >= 0 ? dil[i] : 1;
        if (s <= 0 || d <= 0 || kernel[i] <= 0)
            return op_error(c, n, "strides, dilations and kernel sizes must be positive");
        /* Bounds that keep every sum below in 64-bit range. */
        const int64_t big = (int64_t)1 << 40;
        if (kp >= 0 && (pads[i] < 0 || pads[i + nsp] < 0)) return op_error(c, n, "negative padding");
        if (s > big || d > big || kernel[i] > big || (kp >= 0 && (pads[i] > big || pads[i + nsp] > big)))
            return op_error(c, n, "strides, dilations, kernel sizes or pads beyond 2^40 on spatial axis %d", i);
        if (!dim_is_const(in)) { out[i] = dim_unknown(); continue; }
        if (in.k > big) return op_error(c, n, "spatial dimension %lld is beyond 2^40", (long long)in.k);
        int64_t ek; /* effective kernel extent (kernel - 1) * d + 1 */
        if (__builtin_mul_overflow(kernel[i] - 1, d, &ek) || ek > big)
            return op_error(c, n, "kernel extent on spatial axis %d is beyond 2^40", i);
        ek += 1;
        int64_t o;
        if (strcmp(auto_pad, "SAME_UPPER") == 0 || strcmp(auto_pad, "SAME_LOWER") == 0) {
            o = (in.k + s - 1) / s;
        } else if (strcmp(auto_pad, "VALID") == 0) {
            o = in.k >= ek ? (in.k - ek) / s + 1 : 0;
        } else {
            int64_t p = kp >= 0 ? pads[i] + pads[i + nsp] : 0;
            if (kp >= 0 && (pads[i] < 0 || pads[i + nsp] < 0)) return op_error(c, n, "negative padding");
            int64_t span = in.k + p - ek;
            if (span < 0) return op_error(c, n, "kernel extent %lld exceeds padded input %lld on spatial axis %d",
                                          (long long)ek, (long long)(in.k + p), i);
            o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
            /* With ceil_mode the last window must start inside the input
             * or left padding, as the reference implementations do. */
            if (ceil_mode && (o - 1) * s >= in.k + (kp >= 0 ? pads[i] : 0)) o--;
        }
        out[i] = dim_const(o);
    }
    return true;
}

/* sum over t < len of a[ab + t] * b[bb + t*bs], or of a[ab + t] alone when
 * b is NULL, len known at run time.  When both run contiguously the sum
 * is kept in 8 vector lanes combined in a fixed order at the end (as
 * cg_dot does); otherwise it is a scalar loop. */
LLVMValueRef dot_rt(Cg *c, const Value *a, LLVMValueRef ab, const Value *b, LLVMValueRef bb, int64_t bs,
                    LLVMValueRef len) {
    enum { W = 8 };
    LLVMTypeRef vt = LLVMVectorType(c->t_f32, W);
    LLVMValueRef tail = cg_alloca(c, c->t_f32), vacc = NULL;
    LLVMBuildStore(c->b, cg_f32(c, 0), tail);
    len = imax(c, len, cg_i64(c, 0));
    LLVMValueRef done = cg_i64(c, 0);
    if (!b || bs == 1) {
        vacc = cg_alloca(c, vt);
        LLVMBuildStore(c->b, LLVMConstNull(vt), vacc);
        LLVMValueRef nv = LLVMBuildLShr(c->b, len, cg_i64(c, 3), "");
        CgLoop l;
        LLVMValueRef off = cg_mul(c, cg_for(c, &l, nv), W);
        LLVMValueRef ia = cg_add(c, ab, off);
        LLVMValueRef va = LLVMBuildLoad2(c->b, vt, LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, a), &ia, 1, ""), "");
        LLVMSetAlignment(va, 4);
        if (b) {
            LLVMValueRef ib = cg_add(c, bb, off);
            LLVMValueRef vb =
                LLVMBuildLoad2(c->b, vt, LLVMBuildInBoundsGEP2(c->b, c->t_f32, cg_buf(c, b), &ib, 1, ""), "");
            LLVMSetAlignment(vb, 4);
            va = f_mul(c, va, vb);
        }
        LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, vt, vacc, ""), va), vacc);
        cg_for_end(c, &l);
        done = cg_mul(c, nv, W);
    }
    CgLoop l;
    LLVMValueRef t = cg_add(c, done, cg_for(c, &l, LLVMBuildNSWSub(c->b, len, done, "")));
    LLVMValueRef x = cg_load(c, a, cg_add(c, ab, t));
    if (b) x = f_mul(c, x, cg_load(c, b, cg_add(c, bb, cg_mul(c, t, bs))));
    LLVMBuildStore(c->b, f_add(c, load_f(c, tail), x), tail);
    cg_for_end(c, &l);
    LLVMValueRef sum = load_f(c, tail);
    if (vacc) {
        LLVMValueRef v = LLVMBuildLoad2(c->b, vt, vacc, ""), lanes[W];
        for (int i = 0; i < W; i++)
            lanes[i] = LLVMBuildExtractElement(c->b, v, LLVMConstInt(c->t_i32, (unsigned)i, 0), "");
        for (int n = W; n > 1; n /= 2)
            for (int i = 0; i < n / 2; i++) lanes[i] = f_add(c, lanes[2 * i], lanes[2 * i + 1]);
        sum = f_add(c, lanes[0], sum);
    }
    return sum;
}

bool grad_refuse(GradCtx *c, const Node *n, const char *why) {
    return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): %s", c->g->path, n->name, n->op_type, why);
}

/* The geometry of a windowed node as explicit attributes of a gradient
 * node: strides, pads (auto_pad resolved), dilations, kernel_shape. */
void win_attrs(GradCtx *c, Node *g, const Win *w) {
    int64_t pads[2 * MAX_RANK];
    for (int i = 0; i < w->nsp; i++) {
        pads[i] = w->pb[i];
        pads[w->nsp + i] = w->pe[i];
    }
    gb_attr_ints(c, g, "kernel_shape", w->k, w->nsp);
    gb_attr_ints(c, g, "strides", w->s, w->nsp);
    gb_attr_ints(c, g, "pads", pads, 2 * w->nsp);
    gb_attr_ints(c, g, "dilations", w->d, w->nsp);
}

bool spatial_known(const Value *v) {
    if (v->rank < 3) return false;
    for (int j = 2; j < v->rank; j++)
        if (!dim_is_const(v->dims[j])) return false;
    return true;
}

/* [N, C, spatial...] with N and C from dY and the spatial dims from the
 * "spatial" attribute. */
bool spatial_out(OpCtx *c, Node *n, Dim ch) {
    const Value *dy = n->in[0];
    const int64_t *sp;
    int ns = node_attr_ints(n, "spatial", &sp);
    if (ns != dy->rank - 2) return op_error(c, n, "'spatial' needs %d entries", dy->rank - 2);
    Dim out[MAX_RANK];
    out[0] = dy->dims[0];
    out[1] = ch;
    for (int i = 0; i < ns; i++) out[2 + i] = dim_const(sp[i]);
    set_out(n, 0, dy->dtype, dy->rank, out);
    return true;
}
