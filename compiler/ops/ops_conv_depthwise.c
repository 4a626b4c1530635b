/* ops_conv_depthwise.c - Conv's training kernels for depthwise
 * convolutions (one input channel per group: MobileNet's and
 * ShuffleNet's 3x3 layers), declared in ops_conv.h.
 *
 * A depthwise convolution has too few multiply-adds per value for a packed
 * product (K is the kernel's 9 elements), so these kernels run directly
 * over the planes, in vectors of W outputs along the last spatial dim.  Each
 * vector's sum stays in a register across the whole window, and the reads
 * of the window are masked vector loads (stride 1) or gathers (other
 * strides), the masks covering the padding, so no inner loop tests bounds
 * or calls anything.  The order of every sum is fixed by the shapes. */
#include <stdint.h>
#include <string.h>

#include "../codegen/cg_gemm.h"
#include "op_util.h"
#include "ops_cg.h"
#include "ops_conv.h"

bool conv_depthwise_applies(const ConvShape *s, const Value *x, const Value *f, const Value *y) {
    if (cg_gemm_forced() < 0 || s->G != s->C || s->G < 1) return false;
    return x->dtype == DT_FLOAT && f->dtype == DT_FLOAT && y->dtype == DT_FLOAT;
}

/* ---- vectors ---- */

typedef struct Vec {
    int w;           /* lanes */
    LLVMTypeRef vf;  /* <w x float> */
    LLVMValueRef iota; /* <0, 1, ..., w-1> (i64) */
} Vec;

static Vec vec_init(Cg *c) {
    Vec v = {.w = cg_vector_floats()};
    v.vf = LLVMVectorType(c->t_f32, (unsigned)v.w);
    LLVMValueRef lanes[16];
    for (int i = 0; i < v.w; i++) lanes[i] = cg_i64(c, i);
    v.iota = LLVMConstVector(lanes, (unsigned)v.w);
    return v;
}

static LLVMValueRef splat(Cg *c, const Vec *v, LLVMValueRef x) {
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(x), (unsigned)v->w);
    LLVMValueRef s = LLVMBuildInsertElement(c->b, LLVMGetUndef(vt), x, LLVMConstInt(c->t_i32, 0, 0), "");
    return LLVMBuildShuffleVector(c->b, s, LLVMGetUndef(vt), LLVMConstNull(LLVMVectorType(c->t_i32, (unsigned)v->w)),
                                  "");
}

static LLVMValueRef vsplat_i(Cg *c, const Vec *v, int64_t k) { return splat(c, v, cg_i64(c, k)); }

static LLVMValueRef vand(Cg *c, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAnd(c->b, a, b, ""); }

/* a <= x < b lane-wise (i64 vectors) */
static LLVMValueRef within(Cg *c, LLVMValueRef x, LLVMValueRef a, LLVMValueRef b) {
    return vand(c, LLVMBuildICmp(c->b, LLVMIntSGE, x, a, ""), LLVMBuildICmp(c->b, LLVMIntSLT, x, b, ""));
}

/* The lanes of v's buffer at base + idx (an i64 vector) where mask holds,
 * zeros elsewhere.  contiguous: idx is base0 + iota, read as one masked
 * load; otherwise a gather. */
static LLVMValueRef vread(Cg *c, const Vec *v, const Value *buf, LLVMValueRef first, LLVMValueRef idx, bool contiguous,
                          LLVMValueRef mask) {
    LLVMValueRef align = LLVMConstInt(c->t_i32, 4, 0), zero = LLVMConstNull(v->vf);
    if (contiguous) {
        LLVMValueRef p = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, buf), &first, 1, "");
        LLVMTypeRef over[2] = {v->vf, c->t_ptr};
        return cg_intrinsic(c, "llvm.masked.load", over, 2, (LLVMValueRef[]){p, align, mask, zero}, 4);
    }
    /* 32-bit indices where they suffice: x86 then gathers 16 lanes per
     * instruction instead of 8 */
    if (value_numel(buf) < INT32_MAX) idx = LLVMBuildTrunc(c->b, idx, LLVMVectorType(c->t_i32, (unsigned)v->w), "");
    LLVMValueRef ps = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, buf), &idx, 1, "");
    LLVMTypeRef over[2] = {v->vf, LLVMTypeOf(ps)};
    return cg_intrinsic(c, "llvm.masked.gather", over, 2, (LLVMValueRef[]){ps, align, mask, zero}, 4);
}

static void vwrite(Cg *c, const Vec *v, const Value *buf, LLVMValueRef first, LLVMValueRef x, LLVMValueRef mask) {
    LLVMValueRef p = LLVMBuildGEP2(c->b, c->t_f32, cg_buf(c, buf), &first, 1, "");
    LLVMTypeRef over[2] = {v->vf, c->t_ptr};
    cg_intrinsic(c, "llvm.masked.store", over, 2, (LLVMValueRef[]){x, p, LLVMConstInt(c->t_i32, 4, 0), mask}, 4);
}

static LLVMValueRef vfma(Cg *c, const Vec *v, LLVMValueRef a, LLVMValueRef b, LLVMValueRef acc) {
    LLVMTypeRef t = v->vf;
    return cg_intrinsic(c, "llvm.fmuladd", &t, 1, (LLVMValueRef[]){a, b, acc}, 3);
}

/* The lanes of x added in a fixed tree order. */
static LLVMValueRef vsum(Cg *c, const Vec *v, LLVMValueRef x) {
    LLVMValueRef lanes[16];
    for (int i = 0; i < v->w; i++) lanes[i] = LLVMBuildExtractElement(c->b, x, LLVMConstInt(c->t_i32, (unsigned)i, 0), "");
    for (int n = v->w; n > 1; n /= 2)
        for (int i = 0; i < n / 2; i++) lanes[i] = f_add(c, lanes[2 * i], lanes[2 * i + 1]);
    return lanes[0];
}

/* A vector slot (alloca) holding zeros or x. */
static LLVMValueRef vslot(Cg *c, const Vec *v, LLVMValueRef x) {
    LLVMValueRef s = cg_alloca(c, v->vf);
    LLVMBuildStore(c->b, x ? x : LLVMConstNull(v->vf), s);
    return s;
}

/* ---- the window ---- */

/* Opens one loop per kernel dim into k[] and returns the flat offset. */
static LLVMValueRef kernel_loops(Cg *c, const Win *w, Nest *ns, LLVMValueRef *k) {
    LLVMValueRef kf = cg_i64(c, 0);
    for (int j = 0; j < w->nsp; j++) {
        k[j] = nest_for(c, ns, cg_i64(c, w->k[j]));
        kf = cg_mad(c, kf, w->k[j], k[j]);
    }
    return kf;
}

/* The input values that the output lanes o0 + [0, W) of the plane at xp
 * (its offset in X) read through kernel offsets k[], at outer output
 * positions o[]: zeros where the window reads padding or the lanes run
 * past the row.  A masked load at stride 1, else a gather. */
static LLVMValueRef window_read(Cg *c, const Vec *v, const Win *w, const Value *X, LLVMValueRef xp,
                                const LLVMValueRef *o, const LLVMValueRef *k, LLVMValueRef o0) {
    int64_t is[MAX_RANK];
    strides_of(w->in, w->nsp, is);
    int j = w->nsp - 1;
    LLVMValueRef ok = LLVMConstInt(c->t_i1, 1, 0);
    for (int t = 0; t < j; t++) { /* the outer dims: inside or not, for the whole run */
        LLVMValueRef ip = in_pos(c, w, t, o[t], k[t]);
        ok = vand(c, ok, vand(c, LLVMBuildICmp(c->b, LLVMIntSGE, ip, cg_i64(c, 0), ""),
                              LLVMBuildICmp(c->b, LLVMIntSLT, ip, cg_i64(c, w->in[t]), "")));
        xp = cg_add(c, xp, cg_mul(c, ip, is[t]));
    }
    LLVMValueRef ov = LLVMBuildAdd(c->b, splat(c, v, o0), v->iota, "");
    LLVMValueRef iv = LLVMBuildAdd(c->b, LLVMBuildMul(c->b, ov, vsplat_i(c, v, w->s[j]), ""),
                                   splat(c, v, affine(c, -w->pb[j], k[j], w->d[j])), "");
    LLVMValueRef mask = vand(c, within(c, iv, vsplat_i(c, v, 0), vsplat_i(c, v, w->in[j])),
                             LLVMBuildICmp(c->b, LLVMIntSLT, ov, vsplat_i(c, v, w->out[j]), ""));
    mask = vand(c, mask, splat(c, v, ok));
    LLVMValueRef first = cg_add(c, xp, cg_add(c, cg_mul(c, o0, w->s[j]), affine(c, -w->pb[j], k[j], w->d[j])));
    return vread(c, v, X, first, LLVMBuildAdd(c->b, splat(c, v, xp), iv, ""), w->s[j] == 1, mask);
}

/* ---- the three kernels ---- */

void conv_depthwise_forward(Cg *c, const ConvShape *s, const Value *X, const Value *W, const Value *B, const Value *Y,
                            const CgEpilogue *epi) {
    const Win *w = &s->w;
    Vec v = vec_init(c);
    int r = w->nsp;
    int64_t Mpg = s->M / s->G, os[MAX_RANK], last = w->out[r - 1];
    strides_of(w->out, r, os);
    CgLoop ln;
    LLVMValueRef n = cg_for(c, &ln, cg_i64(c, s->N));
    Nest ns = {.n = 0};
    LLVMValueRef m = nest_for(c, &ns, cg_i64(c, s->M));
    LLVMValueRef xp = cg_mul(c, cg_mad(c, n, s->C, sdiv_k(c, m, Mpg)), w->in_sz);
    LLVMValueRef yp = cg_mul(c, cg_mad(c, n, s->M, m), w->out_sz), o[MAX_RANK];
    LLVMValueRef bias = B ? splat(c, &v, cg_load(c, B, m)) : NULL;
    for (int j = 0; j < r - 1; j++) {
        o[j] = nest_for(c, &ns, cg_i64(c, w->out[j]));
        yp = cg_add(c, yp, cg_mul(c, o[j], os[j]));
    }
    LLVMValueRef o0 = cg_mul(c, nest_for(c, &ns, cg_i64(c, (last + v.w - 1) / v.w)), v.w);
    LLVMValueRef ov = LLVMBuildAdd(c->b, splat(c, &v, o0), v.iota, "");
    LLVMValueRef acc = vslot(c, &v, bias);
    Nest kn = {.n = 0};
    LLVMValueRef k[MAX_RANK], kf = kernel_loops(c, w, &kn, k);
    LLVMValueRef xv = window_read(c, &v, w, X, xp, o, k, o0);
    LLVMValueRef wv = splat(c, &v, cg_load(c, W, cg_mad(c, m, w->k_sz, kf)));
    LLVMBuildStore(c->b, vfma(c, &v, wv, xv, LLVMBuildLoad2(c->b, v.vf, acc, "")), acc);
    nest_close(c, &kn);
    LLVMValueRef store_mask = LLVMBuildICmp(c->b, LLVMIntSLT, ov, vsplat_i(c, &v, last), "");
    vwrite(c, &v, Y, cg_add(c, yp, o0), LLVMBuildLoad2(c->b, v.vf, acc, ""), store_mask);
    nest_close(c, &ns);
    if (epi) epi->fn(c, epi->ctx, n, 1); /* sample n is complete */
    cg_for_end(c, &ln);
}

/* dX[n, g] = sum over the group's Mpg output channels m and kernel
 * offsets k of W[m, k] * dY[n, m] at the output that reads the input
 * position through k (when one does: (i + pb - k*d) divisible by s and
 * inside the output). */
void conv_depthwise_grad_input(Cg *c, const ConvShape *s, const Value *dY, const Value *W, const Value *dX) {
    const Win *w = &s->w;
    Vec v = vec_init(c);
    int r = w->nsp, j = r - 1;
    int64_t Mpg = s->M / s->G, is[MAX_RANK], os[MAX_RANK], last = w->in[j];
    strides_of(w->in, r, is);
    strides_of(w->out, r, os);
    Nest ns = {.n = 0};
    LLVMValueRef n = nest_for(c, &ns, cg_i64(c, s->N)), g = nest_for(c, &ns, cg_i64(c, s->C));
    LLVMValueRef xp = cg_mul(c, cg_mad(c, n, s->C, g), w->in_sz), i[MAX_RANK];
    for (int t = 0; t < r - 1; t++) {
        i[t] = nest_for(c, &ns, cg_i64(c, w->in[t]));
        xp = cg_add(c, xp, cg_mul(c, i[t], is[t]));
    }
    LLVMValueRef i0 = cg_mul(c, nest_for(c, &ns, cg_i64(c, (last + v.w - 1) / v.w)), v.w);
    LLVMValueRef iv = LLVMBuildAdd(c->b, splat(c, &v, i0), v.iota, "");
    LLVMValueRef acc = vslot(c, &v, NULL);
    Nest kn = {.n = 0};
    LLVMValueRef m = cg_mad(c, g, Mpg, nest_for(c, &kn, cg_i64(c, Mpg)));
    LLVMValueRef k[MAX_RANK], kf = kernel_loops(c, w, &kn, k);
    /* the outer output position of each outer dim */
    LLVMValueRef ok = LLVMConstInt(c->t_i1, 1, 0), yp = cg_mul(c, cg_mad(c, n, s->M, m), w->out_sz);
    for (int t = 0; t < r - 1; t++) {
        LLVMValueRef u = cg_add(c, i[t], cg_i64(c, w->pb[t])), dk = cg_mul(c, k[t], w->d[t]);
        LLVMValueRef tt = LLVMBuildNSWSub(c->b, u, dk, "");
        LLVMValueRef ot = sdiv_k(c, tt, w->s[t]);
        LLVMValueRef exact = w->s[t] == 1 ? LLVMConstInt(c->t_i1, 1, 0)
                                          : LLVMBuildICmp(c->b, LLVMIntEQ, LLVMBuildSRem(c->b, tt, cg_i64(c, w->s[t]), ""),
                                                          cg_i64(c, 0), "");
        ok = vand(c, ok, vand(c, exact, vand(c, LLVMBuildICmp(c->b, LLVMIntSGE, tt, cg_i64(c, 0), ""),
                                             LLVMBuildICmp(c->b, LLVMIntSLT, ot, cg_i64(c, w->out[t]), ""))));
        yp = cg_add(c, yp, cg_mul(c, ot, os[t]));
    }
    /* the last dim, lane-wise: t = i + pb - k*d, o = t / s */
    LLVMValueRef tv = LLVMBuildSub(c->b, iv, splat(c, &v, affine(c, -w->pb[j], k[j], w->d[j])), "");
    LLVMValueRef ov = w->s[j] == 1 ? tv : LLVMBuildSDiv(c->b, tv, vsplat_i(c, &v, w->s[j]), "");
    LLVMValueRef mask = vand(c, within(c, tv, vsplat_i(c, &v, 0), vsplat_i(c, &v, w->out[j] * w->s[j])),
                             LLVMBuildICmp(c->b, LLVMIntSLT, iv, vsplat_i(c, &v, last), ""));
    mask = vand(c, mask, LLVMBuildICmp(c->b, LLVMIntSLT, ov, vsplat_i(c, &v, w->out[j]), ""));
    if (w->s[j] != 1)
        mask = vand(c, mask, LLVMBuildICmp(c->b, LLVMIntEQ, LLVMBuildSRem(c->b, tv, vsplat_i(c, &v, w->s[j]), ""),
                                           vsplat_i(c, &v, 0), ""));
    mask = vand(c, mask, splat(c, &v, ok));
    LLVMValueRef first = cg_add(c, yp, LLVMBuildNSWSub(c->b, i0, affine(c, -w->pb[j], k[j], w->d[j]), ""));
    LLVMValueRef dyv = vread(c, &v, dY, first, LLVMBuildAdd(c->b, splat(c, &v, yp), ov, ""), w->s[j] == 1, mask);
    LLVMValueRef wv = splat(c, &v, cg_load(c, W, cg_mad(c, m, w->k_sz, kf)));
    LLVMBuildStore(c->b, vfma(c, &v, wv, dyv, LLVMBuildLoad2(c->b, v.vf, acc, "")), acc);
    nest_close(c, &kn);
    vwrite(c, &v, dX, cg_add(c, xp, i0), LLVMBuildLoad2(c->b, v.vf, acc, ""),
           LLVMBuildICmp(c->b, LLVMIntSLT, iv, vsplat_i(c, &v, last), ""));
    nest_close(c, &ns);
}

/* dW[m, k] = sum over samples and outputs of dY[n, m, o] * X[n, g, i(o,
 * k)]: each sample's sum in float32 vector lanes, the samples' sums added
 * lane by lane in float64, the lanes at the end in a fixed tree.  (The
 * float64 sum serves the filters followed by batch normalisation, whose
 * gradient is a small difference of large terms; the scratch output acc
 * is not needed here.) */
void conv_depthwise_grad_weight(Cg *c, const ConvShape *s, const Value *dY, const Value *X, const Value *dW,
                                const Value *acc) {
    (void)acc;
    const Win *w = &s->w;
    Vec v = vec_init(c);
    int r = w->nsp, j = r - 1;
    int64_t Mpg = s->M / s->G, os[MAX_RANK], last = w->out[j];
    strides_of(w->out, r, os);
    LLVMTypeRef vd = LLVMVectorType(c->t_f64, (unsigned)v.w);
    Nest ns = {.n = 0};
    LLVMValueRef m = nest_for(c, &ns, cg_i64(c, s->M)), k[MAX_RANK];
    LLVMValueRef kf = kernel_loops(c, w, &ns, k);
    LLVMValueRef dsum = cg_alloca(c, vd);
    LLVMBuildStore(c->b, LLVMConstNull(vd), dsum);
    LLVMValueRef n = nest_for(c, &ns, cg_i64(c, s->N));
    LLVMValueRef xp = cg_mul(c, cg_mad(c, n, s->C, sdiv_k(c, m, Mpg)), w->in_sz);
    LLVMValueRef yp = cg_mul(c, cg_mad(c, n, s->M, m), w->out_sz);
    LLVMValueRef sum = vslot(c, &v, NULL);
    Nest on = {.n = 0};
    LLVMValueRef o[MAX_RANK];
    for (int t = 0; t < r - 1; t++) {
        o[t] = nest_for(c, &on, cg_i64(c, w->out[t]));
        yp = cg_add(c, yp, cg_mul(c, o[t], os[t]));
    }
    LLVMValueRef o0 = cg_mul(c, nest_for(c, &on, cg_i64(c, (last + v.w - 1) / v.w)), v.w);
    LLVMValueRef ov = LLVMBuildAdd(c->b, splat(c, &v, o0), v.iota, "");
    LLVMValueRef xv = window_read(c, &v, w, X, xp, o, k, o0);
    LLVMValueRef dyv = vread(c, &v, dY, cg_add(c, yp, o0), NULL, true,
                             LLVMBuildICmp(c->b, LLVMIntSLT, ov, vsplat_i(c, &v, last), ""));
    LLVMBuildStore(c->b, vfma(c, &v, dyv, xv, LLVMBuildLoad2(c->b, v.vf, sum, "")), sum);
    nest_close(c, &on);
    LLVMValueRef wide = LLVMBuildFPExt(c->b, LLVMBuildLoad2(c->b, v.vf, sum, ""), vd, "");
    LLVMBuildStore(c->b, LLVMBuildFAdd(c->b, LLVMBuildLoad2(c->b, vd, dsum, ""), wide, ""), dsum);
    cg_for_end(c, &ns.l[--ns.n]); /* the samples' loop */
    LLVMValueRef total = vsum(c, &v, LLVMBuildLoad2(c->b, vd, dsum, ""));
    cg_store(c, dW, cg_mad(c, m, w->k_sz, kf), LLVMBuildFPTrunc(c->b, total, c->t_f32, ""));
    nest_close(c, &ns);
}
