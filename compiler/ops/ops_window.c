/* ops_window.c - window geometry and index arithmetic (ops_window.h). */
#include <string.h>

#include "op_util.h"
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
