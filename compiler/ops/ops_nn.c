/* ops_nn.c - convolution (and its transpose) and layer normalisation
 * (NCHW): shape rules, forward kernels, gradient rules, and the internal
 * ops of domain "cleave" those gradients are built from (ConvGradInput,
 * ConvGradWeight, ConvGradBias, LayerNormGrad).  Forward and gradient
 * kernels walk the same window geometry, so they live together.  The
 * pools are in ops_pool.c, batch normalisation in ops_batchnorm.c. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "../codegen/cg_gemm.h"
#include "ops_cg.h"
#include "ops_conv.h"
#include "ops_window.h"

static bool infer_conv(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *w = n->in[1];
    if (x->rank < 3 || w->rank != x->rank)
        return op_error(c, n, "X (rank %d) and W (rank %d) must have the same rank >= 3", x->rank, w->rank);
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    int nsp = x->rank - 2;
    int64_t group = node_attr_i(n, "group", 1);
    if (group <= 0) return op_error(c, n, "group must be positive");
    Dim cin = x->dims[1], cw = w->dims[1], m = w->dims[0];
    int64_t cw_total;
    if (dim_is_const(cw) && __builtin_mul_overflow(cw.k, group, &cw_total))
        return op_error(c, n, "W's %lld channels times group %lld overflow", (long long)cw.k, (long long)group);
    if (dim_is_const(cin) && dim_is_const(cw) && cin.k != cw.k * group)
        return op_error(c, n, "input has %lld channels but W expects %lld x group %lld", (long long)cin.k,
                        (long long)cw.k, (long long)group);
    if (dim_is_const(m) && m.k % group)
        return op_error(c, n, "%lld output channels do not divide into %lld groups", (long long)m.k, (long long)group);
    if (n->n_in > 2 && n->in[2]) {
        const Value *b = n->in[2];
        if (b->rank != 1 || (dim_is_const(b->dims[0]) && dim_is_const(m) && b->dims[0].k != m.k))
            return op_error(c, n, "bias '%s' must be 1-D of length M", b->name);
    }
    int64_t kernel[MAX_RANK];
    const int64_t *ks;
    int nk = node_attr_ints(n, "kernel_shape", &ks);
    for (int i = 0; i < nsp; i++) {
        if (nk >= 0 && nk != nsp) return op_error(c, n, "kernel_shape has %d entries for %d spatial dims", nk, nsp);
        if (nk >= 0) kernel[i] = ks[i];
        else if (dim_is_const(w->dims[2 + i])) kernel[i] = w->dims[2 + i].k;
        else return op_error(c, n, "kernel size is unknown");
    }
    Dim out[MAX_RANK];
    out[0] = x->dims[0];
    out[1] = m;
    if (!window_out(c, n, x, kernel, nsp, false, out + 2)) return false;
    set_out(n, 0, t, x->rank, out);
    return true;
}

/* A multiply and an add for every element of a (a convolution's output,
 * or a transposed convolution's input) and every filter element of one
 * channel of w (w's dims after the first). */
static double conv_flops(const Value *a, const Value *w) {
    int64_t e = value_numel(a);
    if (e < 0 || !value_shape_known(w)) return 0;
    double per = 1;
    for (int i = 1; i < w->rank; i++) per *= (double)w->dims[i].k;
    return 2 * per * (double)e;
}

/* One add per output element when node n (Conv, ConvTranspose) has a bias. */
static double bias_flops(const Node *n) {
    int64_t y = value_numel(n->out[0]);
    return n->n_in > 2 && n->in[2] && y > 0 ? (double)y : 0;
}

static double flops_conv(const Node *n) { return conv_flops(n->out[0], n->in[1]) + bias_flops(n); }

/* ---- ConvTranspose ----
 *
 * X [N, C, spatial], W [C, M/group, kernel], B [M] -> Y [N, M, spatial'].
 * Y is the input gradient of the convolution of Y by W whose output has
 * X's shape, so the kernel and the gradients are Conv's (see
 * k_conv_transpose and g_conv_transpose). */

/* An entry of an integer list attribute, or dflt when the list is absent. */
static int64_t attr_at(const Node *n, const char *name, int j, int64_t dflt) {
    const int64_t *v;
    return node_attr_ints(n, name, &v) > j ? v[j] : dflt;
}

/* The per-axis attributes have one entry per spatial axis (two for pads),
 * within the bounds the window arithmetic allows; output_padding is below
 * its axis's stride or dilation, as ONNX and PyTorch both require. */
static bool convt_check_attrs(OpCtx *c, const Node *n, int nsp) {
    static const struct {
        const char *name;
        int per_axis;
        int64_t least;
    } lists[] = {{"kernel_shape", 1, 1}, {"strides", 1, 1},        {"dilations", 1, 1},
                 {"pads", 2, 0},         {"output_padding", 1, 0}, {"output_shape", 1, 1}};
    const int64_t big = (int64_t)1 << 40;
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        const int64_t *v;
        int k = node_attr_ints(n, lists[i].name, &v);
        if (k >= 0 && k != lists[i].per_axis * nsp)
            return op_error(c, n, "%s has %d entries for %d spatial dimensions", lists[i].name, k, nsp);
        for (int j = 0; j < k; j++)
            if (v[j] < lists[i].least || v[j] > big)
                return op_error(c, n, "%s[%d] = %lld is outside [%lld, 2^40]", lists[i].name, j, (long long)v[j],
                                (long long)lists[i].least);
    }
    const char *ap = node_attr_s(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER") && strcmp(ap, "VALID"))
        return op_error(c, n, "unknown auto_pad '%s' (NOTSET, SAME_UPPER, SAME_LOWER or VALID)", ap);
    for (int j = 0; j < nsp; j++) {
        int64_t op = attr_at(n, "output_padding", j, 0), s = attr_at(n, "strides", j, 1),
                d = attr_at(n, "dilations", j, 1);
        if (op >= s && op >= d)
            return op_error(c, n,
                            "output_padding %lld on spatial axis %d is not below its stride %lld or dilation %lld",
                            (long long)op, j, (long long)s, (long long)d);
    }
    return true;
}

/* floor(t / 2) */
static int64_t half_down(int64_t t) { return t >= 0 ? t / 2 : -((1 - t) / 2); }

/* Output length of ConvTranspose node n along spatial axis j (input length
 * in, kernel k) and the pads cut from the full result, whose length is
 * s*(in-1) + output_padding + (k-1)*d + 1.  output_shape fixes the length
 * and auto_pad SAME_* makes it in*s; the pads are then the difference,
 * halved as ONNX's reference does, rounding down: the odd one goes to the
 * end for SAME_UPPER and to the start otherwise.  A length beyond the full
 * result makes the end pad negative: zeros (or the bias) past the end, as
 * output_padding adds them; a negative start pad is refused. */
static bool convt_axis(OpCtx *c, const Node *n, int j, int64_t in, int64_t k, int64_t *out, int64_t *pb,
                       int64_t *pe) {
    int nsp = n->in[0]->rank - 2;
    int64_t s = attr_at(n, "strides", j, 1), d = attr_at(n, "dilations", j, 1), span, ext, full;
    if (in < 1) return op_error(c, n, "spatial axis %d of the input is empty", j);
    if (__builtin_mul_overflow(s, in - 1, &span) || __builtin_mul_overflow(k - 1, d, &ext) ||
        __builtin_add_overflow(span, ext, &full) ||
        __builtin_add_overflow(full, attr_at(n, "output_padding", j, 0) + 1, &full))
        return op_error(c, n, "the output length on spatial axis %d overflows", j);
    const char *ap = node_attr_s(n, "auto_pad", "NOTSET");
    bool upper = strcmp(ap, "SAME_UPPER") == 0, fixed = attr_at(n, "output_shape", j, 0) > 0;
    if (fixed || upper || strcmp(ap, "SAME_LOWER") == 0) {
        int64_t want = attr_at(n, "output_shape", j, 0);
        if (!fixed && __builtin_mul_overflow(in, s, &want))
            return op_error(c, n, "the output length on spatial axis %d overflows", j);
        int64_t total = full - want;
        *pb = upper ? half_down(total) : total - half_down(total);
        *pe = total - *pb;
        if (*pb < 0)
            return op_error_kind(c, n, DIAG_UNSUPPORTED,
                                 "output length %lld on spatial axis %d needs padding before the start of the %lld the "
                                 "transposed convolution gives", (long long)want, j, (long long)full);
        *out = want;
        return true;
    }
    bool valid = strcmp(ap, "VALID") == 0;
    *pb = valid ? 0 : attr_at(n, "pads", j, 0);
    *pe = valid ? 0 : attr_at(n, "pads", nsp + j, 0);
    *out = full - *pb - *pe;
    if (*out < 1)
        return op_error(c, n, "pads %lld and %lld leave nothing of the %lld outputs on spatial axis %d",
                        (long long)*pb, (long long)*pe, (long long)full, j);
    return true;
}

static bool infer_conv_transpose(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    if (x->rank < 3 || w->rank != x->rank)
        return op_error(c, n, "X (rank %d) and W (rank %d) must have the same rank >= 3", x->rank, w->rank);
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    int nsp = x->rank - 2;
    int64_t group = node_attr_i(n, "group", 1);
    if (group <= 0) return op_error(c, n, "group must be positive");
    Dim cin = x->dims[1], cw = w->dims[0], m = dim_unknown();
    if (dim_is_const(cin) && dim_is_const(cw) && cin.k != cw.k)
        return op_error(c, n, "input has %lld channels but W has %lld", (long long)cin.k, (long long)cw.k);
    if (dim_is_const(cw) && cw.k % group)
        return op_error(c, n, "W's %lld input channels do not divide into %lld groups", (long long)cw.k,
                        (long long)group);
    if (dim_is_const(w->dims[1])) {
        int64_t mk;
        if (__builtin_mul_overflow(w->dims[1].k, group, &mk))
            return op_error(c, n, "W's %lld channels times group %lld overflow", (long long)w->dims[1].k,
                            (long long)group);
        m = dim_const(mk);
    }
    if (b && (b->rank != 1 || (dim_is_const(b->dims[0]) && dim_is_const(m) && b->dims[0].k != m.k)))
        return op_error(c, n, "bias '%s' must be 1-D of length M", b->name);
    if (!convt_check_attrs(c, n, nsp)) return false;
    Dim out[MAX_RANK];
    out[0] = x->dims[0];
    out[1] = m;
    for (int i = 0; i < nsp; i++) {
        Dim kd = w->dims[2 + i], in = x->dims[2 + i];
        if (!dim_is_const(kd)) return op_error(c, n, "kernel size is unknown");
        int64_t ks = attr_at(n, "kernel_shape", i, kd.k), len, pb, pe;
        if (ks != kd.k)
            return op_error(c, n, "kernel_shape %lld differs from W's %lld on spatial axis %d", (long long)ks,
                            (long long)kd.k, i);
        if (!dim_is_const(in)) {
            out[2 + i] = dim_unknown();
            continue;
        }
        if (!convt_axis(c, n, i, in.k, kd.k, &len, &pb, &pe)) return false;
        out[2 + i] = dim_const(len);
    }
    set_out(n, 0, t, x->rank, out);
    return true;
}

static double flops_conv_transpose(const Node *n) { return conv_flops(n->in[0], n->in[1]) + bias_flops(n); }

static bool infer_layernorm(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t axis = node_attr_i(n, "axis", -1);
    if (!norm_axis(c, n, &axis, x->rank)) return false;
    for (int i = 1; i < n->n_in; i++) {
        const Value *p = n->in[i];
        if (!p) continue;
        if (p->rank > x->rank - axis)
            return op_error(c, n, "'%s' has rank %d; the normalised part has rank %lld", p->name, p->rank,
                            (long long)(x->rank - axis));
        for (int j = 0; j < p->rank; j++) {
            Dim pd = p->dims[j], xd = x->dims[x->rank - p->rank + j];
            if (dim_is_const(pd) && dim_is_const(xd) && pd.k != 1 && pd.k != xd.k)
                return op_error(c, n, "'%s' does not broadcast over the normalised dimensions", p->name);
        }
    }
    same_as_input(n, 0, 0);
    /* Mean and InvStdDev keep the leading dims and 1 elsewhere. */
    Dim st[MAX_RANK];
    for (int j = 0; j < x->rank; j++) st[j] = j < axis ? x->dims[j] : dim_const(1);
    DType stash = (DType)node_attr_i(n, "stash_type", DT_FLOAT);
    for (int k = 1; k < n->n_out; k++) set_out(n, k, stash, x->rank, st);
    return true;
}

static double flops_norm(const Node *n) { return flops_per_out_elem(n, 5); }

/* The window of the convolution whose input gradient ConvTranspose node n
 * computes: it reads y, the ConvTranspose's output, and writes x, its
 * input. */
static bool convt_win(OpCtx *c, const Node *n, const Value *x, const Value *y, const int64_t *kernel, Win *w) {
    win_init(n, y, x, kernel, w);
    for (int j = 0; j < w->nsp; j++) {
        int64_t len;
        if (!convt_axis(c, n, j, w->out[j], w->k[j], &len, &w->pb[j], &w->pe[j])) return false;
    }
    return true;
}

/* ==== Conv and its gradients ====
 *
 * The three convolution kernels share one walk over (output, kernel)
 * pairs of a single input plane / output plane / filter: loops over the
 * outer output dims, each followed by its valid kernel range, then the
 * last kernel dim; the body gets the range of the last output dim, which
 * it runs innermost, so every inner loop reads and writes the output
 * contiguously (and the input too at stride 1). */

typedef struct ConvAt {
    LLVMValueRef o_off;  /* spatial output offset of the outer dims */
    LLVMValueRef i_off;  /* spatial input offset at o_last = 0 (may be negative) */
    LLVMValueRef k_off;  /* flat kernel offset */
    LLVMValueRef lo, hi; /* range of o_last */
} ConvAt;

typedef struct ConvBufs {
    const Value *x, *w, *y; /* input-shaped, filter-shaped, output-shaped */
    LLVMValueRef xb, wb, yb; /* plane / filter base offsets */
    const Value *acc;        /* filter-shaped float64 sums (NULL: into w) */
} ConvBufs;

typedef void (*ConvBody)(Cg *c, const Win *w, const ConvAt *at, const ConvBufs *b);

static void conv_walk(Cg *c, const Win *w, const ConvBufs *b, ConvBody body) {
    int r = w->nsp;
    int64_t is[MAX_RANK], os[MAX_RANK], ks[MAX_RANK];
    strides_of(w->in, r, is);
    strides_of(w->out, r, os);
    strides_of(w->k, r, ks);
    Nest ns = {.n = 0};
    ConvAt at = {cg_i64(c, 0), cg_i64(c, 0), cg_i64(c, 0), NULL, NULL};
    for (int j = 0; j < r - 1; j++) {
        LLVMValueRef o = nest_for(c, &ns, cg_i64(c, w->out[j]));
        at.o_off = cg_add(c, at.o_off, cg_mul(c, o, os[j]));
        LLVMValueRef lo, hi;
        kernel_range(c, w, j, o, &lo, &hi);
        LLVMValueRef k = nest_range(c, &ns, lo, hi);
        at.i_off = cg_add(c, at.i_off, cg_mul(c, in_pos(c, w, j, o, k), is[j]));
        at.k_off = cg_add(c, at.k_off, cg_mul(c, k, ks[j]));
    }
    int j = r - 1;
    LLVMValueRef k = nest_for(c, &ns, cg_i64(c, w->k[j]));
    at.i_off = cg_add(c, at.i_off, affine(c, -w->pb[j], k, w->d[j]));
    at.k_off = cg_add(c, at.k_off, k);
    output_range(c, w, j, k, &at.lo, &at.hi);
    body(c, w, &at, b);
    nest_close(c, &ns);
}

/* y[o] += w[k] * x[i] over the last output dim */
static void body_conv(Cg *c, const Win *w, const ConvAt *at, const ConvBufs *b) {
    LLVMValueRef wv = cg_load(c, b->w, cg_add(c, b->wb, at->k_off));
    LLVMValueRef yb = cg_add(c, b->yb, at->o_off), xb = cg_add(c, b->xb, at->i_off);
    CgLoop l;
    LLVMValueRef o = for_range(c, &l, at->lo, at->hi);
    LLVMValueRef yi = cg_add(c, yb, o);
    add_to(c, b->y, yi, f_mul(c, wv, cg_load(c, b->x, cg_add(c, xb, cg_mul(c, o, w->s[w->nsp - 1])))));
    cg_for_end(c, &l);
}

/* dx[i] += w[k] * dy[o]: the transposed convolution */
static void body_conv_dx(Cg *c, const Win *w, const ConvAt *at, const ConvBufs *b) {
    LLVMValueRef wv = cg_load(c, b->w, cg_add(c, b->wb, at->k_off));
    LLVMValueRef yb = cg_add(c, b->yb, at->o_off), xb = cg_add(c, b->xb, at->i_off);
    CgLoop l;
    LLVMValueRef o = for_range(c, &l, at->lo, at->hi);
    LLVMValueRef xi = cg_add(c, xb, cg_mul(c, o, w->s[w->nsp - 1]));
    add_to(c, b->x, xi, f_mul(c, wv, cg_load(c, b->y, cg_add(c, yb, o))));
    cg_for_end(c, &l);
}

/* Element i of the float64 buffer v (a float32 value of twice the elements). */
static LLVMValueRef f64_at(Cg *c, const Value *v, LLVMValueRef i) {
    return LLVMBuildGEP2(c->b, c->t_f64, cg_buf(c, v), &i, 1, "");
}

/* dw[k] += sum_o dy[o] * x[i]: each row's dot product in float32, their
 * sum over rows and samples in float64 when there is an accumulator.  A
 * filter followed by batch normalisation has a gradient orthogonal to
 * itself, a small difference of large terms, which a float32 running sum
 * over every sample would round away. */
static void body_conv_dw(Cg *c, const Win *w, const ConvAt *at, const ConvBufs *b) {
    int64_t s = w->s[w->nsp - 1];
    LLVMValueRef yb = cg_add(c, cg_add(c, b->yb, at->o_off), at->lo);
    LLVMValueRef xb = cg_add(c, cg_add(c, b->xb, at->i_off), cg_mul(c, at->lo, s));
    LLVMValueRef dot = dot_rt(c, b->y, yb, b->x, xb, s, LLVMBuildNSWSub(c->b, at->hi, at->lo, ""));
    LLVMValueRef k = cg_add(c, b->wb, at->k_off);
    if (!b->acc) {
        add_to(c, b->w, k, dot);
        return;
    }
    LLVMValueRef p = f64_at(c, b->acc, k);
    LLVMValueRef sum = f_add(c, LLVMBuildLoad2(c->b, c->t_f64, p, ""), LLVMBuildFPExt(c->b, dot, c->t_f64, ""));
    LLVMBuildStore(c->b, sum, p);
}

static void conv_kernel_sizes(const Value *w, int64_t *kernel) {
    for (int i = 2; i < w->rank; i++) kernel[i - 2] = w->dims[i].k;
}

/* Conv node n's sizes and window, and the path its kernels take. */
static ConvPath conv_shape(const Node *n, ConvShape *cs) {
    const Value *X = n->in[0], *W = n->in[1], *Y = n->out[0];
    int64_t kernel[MAX_RANK];
    conv_kernel_sizes(W, kernel);
    Win w;
    win_resolve(n, X, Y, kernel, &w);
    win_flatten_pointwise(&w);
    *cs = (ConvShape){w, X->dims[0].k, X->dims[1].k, Y->dims[1].k, node_attr_i(n, "group", 1)};
    return conv_path(cs, X, W, Y);
}

/* The forward pass on a fast path, a sample block at a time (OpDef.cg_blocks). */
static bool k_conv_blocks(Cg *c, const Node *n, const CgEpilogue *epi) {
    ConvShape cs;
    ConvPath path = conv_shape(n, &cs);
    if (path == CONV_DIRECT) return false;
    if (epi) conv_fast_forward(c, path, &cs, n->in[0], n->in[1], n->n_in > 2 ? n->in[2] : NULL, n->out[0], epi);
    return true;
}

/* Y[n,m] = B[m] + sum_{c in m's group} X[n,c] (*) W[m,c] */
static bool k_conv(Cg *c, const Node *n) {
    const Value *X = n->in[0], *W = n->in[1], *B = n->n_in > 2 ? n->in[2] : NULL, *Y = n->out[0];
    ConvShape cs;
    ConvPath path = conv_shape(n, &cs);
    const Win w = cs.w;
    int64_t N = cs.N, C = cs.C, M = cs.M, G = cs.G, Cpg = C / G, Mpg = M / G;
    if (!cg_kernel_begin_io(c, n)) return false;
    if (path != CONV_DIRECT) {
        conv_fast_forward(c, path, &cs, X, W, B, Y, NULL);
        cg_kernel_end(c);
        return true;
    }
    Nest ns = {.n = 0};
    LLVMValueRef in = nest_for(c, &ns, cg_i64(c, N)), g = nest_for(c, &ns, cg_i64(c, G));
    LLVMValueRef m = cg_mad(c, g, Mpg, nest_for(c, &ns, cg_i64(c, Mpg)));
    LLVMValueRef yb = cg_mul(c, cg_mad(c, in, M, m), w.out_sz);
    LLVMValueRef init = B ? cg_load(c, B, m) : cg_f32(c, 0);
    CgLoop lf;
    LLVMValueRef i = cg_for(c, &lf, cg_i64(c, w.out_sz));
    cg_store(c, Y, cg_add(c, yb, i), init);
    cg_for_end(c, &lf);
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg));
    ConvBufs b = {X, W, Y, cg_mul(c, cg_add(c, cg_mul(c, in, C), cg_mad(c, g, Cpg, ch)), w.in_sz),
                  cg_mul(c, cg_mad(c, m, Cpg, ch), w.k_sz), yb};
    conv_walk(c, &w, &b, body_conv);
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* dX = the transposed convolution of dY by W over window w, plus B[c]
 * when B is given: each plane of dX gathers the contributions of the
 * output channels of its group.  It is Conv's input gradient and
 * ConvTranspose's forward pass. */
static bool conv_transposed(Cg *c, const Node *n, const Value *dY, const Value *W, const Value *B, const Value *dX,
                            Win *w) {
    win_flatten_pointwise(w);
    int64_t N = dX->dims[0].k, C = dX->dims[1].k, M = dY->dims[1].k, G = node_attr_i(n, "group", 1);
    int64_t Cpg = C / G, Mpg = M / G;
    if (!cg_kernel_begin_io(c, n)) return false;
    Nest ns = {.n = 0};
    LLVMValueRef in = nest_for(c, &ns, cg_i64(c, N)), g = nest_for(c, &ns, cg_i64(c, G));
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg));
    LLVMValueRef xb = cg_mul(c, cg_add(c, cg_mul(c, in, C), cg_mad(c, g, Cpg, ch)), w->in_sz);
    LLVMValueRef init = B ? cg_load(c, B, cg_mad(c, g, Cpg, ch)) : cg_f32(c, 0);
    CgLoop lf;
    LLVMValueRef i = cg_for(c, &lf, cg_i64(c, w->in_sz));
    cg_store(c, dX, cg_add(c, xb, i), init);
    cg_for_end(c, &lf);
    LLVMValueRef m = cg_mad(c, g, Mpg, nest_for(c, &ns, cg_i64(c, Mpg)));
    ConvBufs b = {dX, W, dY, xb, cg_mul(c, cg_mad(c, m, Cpg, ch), w->k_sz), cg_mul(c, cg_mad(c, in, M, m), w->out_sz)};
    conv_walk(c, w, &b, body_conv_dx);
    nest_close(c, &ns);
    cg_kernel_end(c);
    return true;
}

/* ConvGradInput(dY, W) -> dX */
static bool k_conv_grad_input(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *W = n->in[1], *dX = n->out[0];
    int64_t kernel[MAX_RANK];
    conv_kernel_sizes(W, kernel);
    Win w;
    win_resolve(n, dX, dY, kernel, &w);
    win_flatten_pointwise(&w);
    ConvShape cs = {w, dX->dims[0].k, dX->dims[1].k, dY->dims[1].k, node_attr_i(n, "group", 1)};
    ConvPath path = conv_path(&cs, dX, W, dY);
    if (path != CONV_DIRECT) {
        if (!cg_kernel_begin_io(c, n)) return false;
        conv_fast_grad_input(c, path, &cs, dY, W, dX);
        cg_kernel_end(c);
        return true;
    }
    return conv_transposed(c, n, dY, W, NULL, dX, &w);
}

/* ConvTranspose(X, W, B) -> Y: the input gradient of the convolution of Y
 * by W whose output X is. */
static bool k_conv_transpose(Cg *c, const Node *n) {
    const Value *X = n->in[0], *W = n->in[1], *B = n->n_in > 2 ? n->in[2] : NULL, *Y = n->out[0];
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    int64_t kernel[MAX_RANK];
    conv_kernel_sizes(W, kernel);
    Win w;
    return convt_win(&oc, n, X, Y, kernel, &w) && conv_transposed(c, n, X, W, B, Y, &w);
}

/* ConvGradWeight(dY, X) -> dW [, sums]: correlation of each output plane
 * with the input planes of its group, summed over the batch (in float64
 * through the optional scratch output `sums`). */
static bool k_conv_grad_weight(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *dW = n->out[0];
    int64_t kernel[MAX_RANK];
    conv_kernel_sizes(dW, kernel);
    Win w;
    win_resolve(n, X, dY, kernel, &w);
    win_flatten_pointwise(&w);
    int64_t N = X->dims[0].k, C = X->dims[1].k, M = dY->dims[1].k, G = node_attr_i(n, "group", 1);
    int64_t Cpg = C / G, Mpg = M / G, E = value_numel(dW);
    const Value *acc = n->n_out > 1 ? n->out[1] : NULL;
    if (!cg_kernel_begin_io(c, n)) return false;
    ConvShape cs = {w, N, C, M, G};
    ConvPath path = conv_path(&cs, X, dW, dY);
    if (path != CONV_DIRECT) {
        conv_fast_grad_weight(c, path, &cs, dY, X, dW, acc);
        cg_kernel_end(c);
        return true;
    }
    cg_fill(c, acc ? acc : dW, acc ? 2 * E : E, cg_f32(c, 0)); /* float64 zeros are float32 zeros */
    /* batch outermost: one sample's planes stay in cache while every
     * filter of it accumulates */
    Nest ns = {.n = 0};
    LLVMValueRef in = nest_for(c, &ns, cg_i64(c, N));
    LLVMValueRef g = nest_for(c, &ns, cg_i64(c, G));
    LLVMValueRef m = cg_mad(c, g, Mpg, nest_for(c, &ns, cg_i64(c, Mpg)));
    LLVMValueRef ch = nest_for(c, &ns, cg_i64(c, Cpg));
    ConvBufs b = {X, dW, dY, cg_mul(c, cg_add(c, cg_mul(c, in, C), cg_mad(c, g, Cpg, ch)), w.in_sz),
                  cg_mul(c, cg_mad(c, m, Cpg, ch), w.k_sz), cg_mul(c, cg_mad(c, in, M, m), w.out_sz), acc};
    conv_walk(c, &w, &b, body_conv_dw);
    nest_close(c, &ns);
    if (acc) {
        CgLoop l;
        LLVMValueRef i = cg_for(c, &l, cg_i64(c, E));
        cg_store(c, dW, i, LLVMBuildFPTrunc(c->b, LLVMBuildLoad2(c->b, c->t_f64, f64_at(c, acc, i), ""), c->t_f32, ""));
        cg_for_end(c, &l);
    }
    cg_kernel_end(c);
    return true;
}

/* ConvGradBias(dY) -> dB[m] = sum over batch and space of dY[:, m] */
static bool k_conv_grad_bias(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *dB = n->out[0];
    int64_t N = dY->dims[0].k, M = dY->dims[1].k, P = value_numel(dY) / (N * M > 0 ? N * M : 1);
    if (!cg_kernel_begin_io(c, n)) return false;
    LLVMValueRef acc = cg_alloca(c, c->t_f32);
    CgLoop lm, ln;
    LLVMValueRef m = cg_for(c, &lm, cg_i64(c, M));
    LLVMBuildStore(c->b, cg_f32(c, 0), acc);
    LLVMValueRef in = cg_for(c, &ln, cg_i64(c, N));
    LLVMValueRef s = dot_rt(c, dY, cg_mul(c, cg_mad(c, in, M, m), P), NULL, NULL, 1, cg_i64(c, P));
    LLVMBuildStore(c->b, f_add(c, load_f(c, acc), s), acc);
    cg_for_end(c, &ln);
    cg_store(c, dB, m, load_f(c, acc));
    cg_for_end(c, &lm);
    cg_kernel_end(c);
    return true;
}

/* ==== LayerNormalization ==== */

/* Index of a parameter p (Scale or B) broadcast over the normalised dims
 * [axis, rank) of x, at flat offset j inside a row. */
typedef struct Bcast {
    int nd;                   /* normalised dims */
    int64_t dims[MAX_RANK];   /* their sizes */
    int64_t after[MAX_RANK];  /* elements after each of them in a row */
    int64_t pst[MAX_RANK];    /* p's stride along each (0: broadcast) */
    bool same, scalar;        /* p spans the row exactly / is one element */
} Bcast;

static void bcast_init(Bcast *bc, const Value *x, int axis, const Value *p) {
    bc->nd = x->rank - axis;
    int64_t row = 1, pn = value_numel(p), s = 1;
    for (int t = bc->nd - 1; t >= 0; t--) {
        bc->dims[t] = x->dims[axis + t].k;
        bc->after[t] = row;
        row *= bc->dims[t];
        int pj = t - (bc->nd - p->rank);
        int64_t pd = pj >= 0 ? p->dims[pj].k : 1;
        bc->pst[t] = pd == 1 ? 0 : s;
        s *= pd;
    }
    bc->same = pn == row;
    bc->scalar = pn == 1;
}

static LLVMValueRef bcast_index(Cg *c, const Bcast *bc, LLVMValueRef j) {
    if (bc->same) return j;
    if (bc->scalar) return cg_i64(c, 0);
    LLVMValueRef idx = cg_i64(c, 0);
    for (int t = 0; t < bc->nd; t++) {
        if (!bc->pst[t]) continue;
        LLVMValueRef q = LLVMBuildSRem(c->b, sdiv_k(c, j, bc->after[t]), cg_i64(c, bc->dims[t]), "");
        idx = cg_add(c, idx, cg_mul(c, q, bc->pst[t]));
    }
    return idx;
}

/* Mean and 1/sqrt(var + eps) of the row of `len` elements at base, as
 * ONNX's function body computes them (D = X - mean, var = mean(D*D)),
 * summed in double. */
static void ln_stats(Cg *c, const Value *x, LLVMValueRef base, int64_t len, float eps, LLVMValueRef *mean,
                     LLVMValueRef *inv) {
    LLVMValueRef acc = cg_alloca(c, c->t_f64);
    LLVMBuildStore(c->b, LLVMConstReal(c->t_f64, 0), acc);
    CgLoop l1, l2;
    LLVMValueRef j = cg_for(c, &l1, cg_i64(c, len));
    LLVMValueRef xv = LLVMBuildFPExt(c->b, cg_load(c, x, cg_add(c, base, j)), c->t_f64, "");
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, c->t_f64, acc, ""), xv), acc);
    cg_for_end(c, &l1);
    LLVMValueRef rl = LLVMConstReal(c->t_f64, 1.0 / (double)len);
    *mean = LLVMBuildFPTrunc(c->b, f_mul(c, LLVMBuildLoad2(c->b, c->t_f64, acc, ""), rl), c->t_f32, "");
    LLVMBuildStore(c->b, LLVMConstReal(c->t_f64, 0), acc);
    j = cg_for(c, &l2, cg_i64(c, len));
    LLVMValueRef dv = f_sub(c, cg_load(c, x, cg_add(c, base, j)), *mean);
    LLVMValueRef sq = LLVMBuildFPExt(c->b, f_mul(c, dv, dv), c->t_f64, "");
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, c->t_f64, acc, ""), sq), acc);
    cg_for_end(c, &l2);
    LLVMValueRef var = LLVMBuildFPTrunc(c->b, f_mul(c, LLVMBuildLoad2(c->b, c->t_f64, acc, ""), rl), c->t_f32, "");
    *inv = inv_std(c, var, eps);
}

/* ---- LayerNormalization over contiguous float32 rows, in vectors ----
 * Scale and B (when present) span the row exactly.  The statistics are
 * the scalar kernel's (sums in double, the variance of X - mean), summed
 * in double lanes and combined in a fixed order; the element-wise passes
 * compute each element as the scalar kernel does. */
typedef enum { LN_SUM, LN_SQ, LN_Y, LN_GSUM, LN_DX } LnPass;

typedef struct LnRow {
    const Value *x, *s, *b, *y, *dy, *dx, *ds, *db;
    LLVMValueRef base, mean, inv, mg, mgx; /* row offset and its scalars */
    LLVMValueRef acc, acc2;                /* slots of <w x double> sums */
    int w;
    LnPass pass;
} LnRow;

static void ln_acc(Cg *c, LLVMValueRef slot, LLVMValueRef v, int w) {
    LLVMTypeRef dt = LLVMVectorType(c->t_f64, (unsigned)w);
    LLVMValueRef d = LLVMBuildFPExt(c->b, v, dt, "");
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, dt, slot, ""), d), slot);
}

static void ln_vec(Cg *c, void *ctx, LLVMValueRef off, int lanes) {
    LnRow *r = ctx;
    int w = r->w;
    LLVMValueRef i = cg_add(c, r->base, off), mean = cg_vsplat(c, r->mean, w);
    if (r->pass == LN_SUM) {
        ln_acc(c, r->acc, cg_vload(c, r->x, i, w, lanes, NULL), w);
        return;
    }
    if (r->pass == LN_SQ) {
        /* padding lanes read the mean: they add 0 */
        LLVMValueRef d = f_sub(c, cg_vload(c, r->x, i, w, lanes, mean), mean);
        ln_acc(c, r->acc, f_mul(c, d, d), w);
        return;
    }
    LLVMValueRef xh = f_mul(c, f_sub(c, cg_vload(c, r->x, i, w, lanes, NULL), mean), cg_vsplat(c, r->inv, w));
    LLVMValueRef sc = cg_vload(c, r->s, off, w, lanes, NULL);
    if (r->pass == LN_Y) {
        LLVMValueRef y = f_mul(c, xh, sc);
        if (r->b) y = f_add(c, y, cg_vload(c, r->b, off, w, lanes, NULL));
        cg_vstore(c, r->y, i, y, lanes);
        return;
    }
    LLVMValueRef dy = cg_vload(c, r->dy, i, w, lanes, NULL), g = f_mul(c, dy, sc);
    if (r->pass == LN_GSUM) { /* padding lanes: dy = 0, so g = 0 */
        ln_acc(c, r->acc, g, w);
        ln_acc(c, r->acc2, f_mul(c, g, xh), w);
        return;
    }
    LLVMValueRef d = f_sub(c, f_sub(c, g, cg_vsplat(c, r->mg, w)), f_mul(c, xh, cg_vsplat(c, r->mgx, w)));
    cg_vstore(c, r->dx, i, f_mul(c, cg_vsplat(c, r->inv, w), d), lanes);
    cg_vstore(c, r->ds, off, f_add(c, cg_vload(c, r->ds, off, w, lanes, NULL), f_mul(c, dy, xh)), lanes);
    cg_vstore(c, r->db, off, f_add(c, cg_vload(c, r->db, off, w, lanes, NULL), dy), lanes);
}

/* The row's sum (or sums) of one pass, as float32 means. */
static void ln_pass(Cg *c, LnRow *r, LnPass pass, int64_t len, LLVMValueRef *m1, LLVMValueRef *m2) {
    LLVMTypeRef dt = LLVMVectorType(c->t_f64, (unsigned)r->w);
    if (m1) LLVMBuildStore(c->b, LLVMConstNull(dt), r->acc);
    if (m2) LLVMBuildStore(c->b, LLVMConstNull(dt), r->acc2);
    r->pass = pass;
    cg_vrow(c, len, r->w, ln_vec, r);
    LLVMValueRef rl = LLVMConstReal(c->t_f64, 1.0 / (double)len);
    if (m1) *m1 = LLVMBuildFPTrunc(c->b, f_mul(c, cg_vsum(c, LLVMBuildLoad2(c->b, dt, r->acc, "")), rl), c->t_f32, "");
    if (m2) *m2 = LLVMBuildFPTrunc(c->b, f_mul(c, cg_vsum(c, LLVMBuildLoad2(c->b, dt, r->acc2, "")), rl), c->t_f32, "");
}

/* Mean and 1/sqrt(var + eps) of row r->base. */
static void ln_vec_stats(Cg *c, LnRow *r, int64_t len, float eps) {
    LLVMValueRef var;
    r->mean = cg_f32(c, 0);
    ln_pass(c, r, LN_SUM, len, &r->mean, NULL);
    ln_pass(c, r, LN_SQ, len, &var, NULL);
    r->inv = inv_std(c, var, eps);
}

static LnRow ln_row(Cg *c) {
    LnRow r = {.w = cg_vector_floats()};
    LLVMTypeRef dt = LLVMVectorType(c->t_f64, (unsigned)r.w);
    r.acc = cg_alloca(c, dt);
    r.acc2 = cg_alloca(c, dt);
    return r;
}

static bool ln_vector_form(const Value *x, const Bcast *bs, const Value *b, const Bcast *bb) {
    return x->dtype == DT_FLOAT && bs->same && (!b || bb->same);
}

static int ln_axis(const Node *n, const Value *x) {
    int64_t axis = node_attr_i(n, "axis", -1);
    return (int)(axis < 0 ? axis + x->rank : axis);
}

/* Y = (X - mean) * invstd * Scale + B per row; Mean and InvStdDev stored
 * when requested. */
static bool k_layernorm(Cg *c, const Node *n) {
    const Value *X = n->in[0], *S = n->in[1], *B = n->n_in > 2 ? n->in[2] : NULL, *Y = n->out[0];
    const Value *Mo = n->n_out > 1 ? n->out[1] : NULL, *Io = n->n_out > 2 ? n->out[2] : NULL;
    int axis = ln_axis(n, X);
    float eps = node_attr_f(n, "epsilon", 1e-5f);
    int64_t outer = 1, len = 1;
    for (int j = 0; j < X->rank; j++) *(j < axis ? &outer : &len) *= X->dims[j].k;
    Bcast bs, bb;
    bcast_init(&bs, X, axis, S);
    if (B) bcast_init(&bb, X, axis, B);
    if (!cg_kernel_begin_io(c, n)) return false;
    if (ln_vector_form(X, &bs, B, &bb) && S->dtype == DT_FLOAT && (!B || B->dtype == DT_FLOAT)) {
        LnRow v = ln_row(c);
        v.x = X, v.s = S, v.b = B, v.y = Y;
        CgLoop lr;
        LLVMValueRef r = cg_for(c, &lr, cg_i64(c, outer));
        v.base = cg_mul(c, r, len);
        ln_vec_stats(c, &v, len, eps);
        if (Mo) cg_store(c, Mo, r, v.mean);
        if (Io) cg_store(c, Io, r, v.inv);
        v.pass = LN_Y;
        cg_vrow(c, len, v.w, ln_vec, &v);
        cg_for_end(c, &lr);
        cg_kernel_end(c);
        return true;
    }
    CgLoop lr, lj;
    LLVMValueRef r = cg_for(c, &lr, cg_i64(c, outer)), base = cg_mul(c, r, len), mean, inv;
    ln_stats(c, X, base, len, eps, &mean, &inv);
    if (Mo) cg_store(c, Mo, r, mean);
    if (Io) cg_store(c, Io, r, inv);
    LLVMValueRef j = cg_for(c, &lj, cg_i64(c, len)), i = cg_add(c, base, j);
    LLVMValueRef y = f_mul(c, f_mul(c, f_sub(c, cg_load(c, X, i), mean), inv), cg_load(c, S, bcast_index(c, &bs, j)));
    if (B) y = f_add(c, y, cg_load(c, B, bcast_index(c, &bb, j)));
    cg_store(c, Y, i, y);
    cg_for_end(c, &lj);
    cg_for_end(c, &lr);
    cg_kernel_end(c);
    return true;
}

/* LayerNormGrad(dY, X, Scale) -> dX, dScale, dB, the latter two over the
 * normalised dims (summed to the parameters' shapes by the rule).  With
 * g = dY*Scale and xhat = (X - mean)*invstd, per row:
 *   dX = invstd * (g - mean(g) - xhat * mean(g*xhat)). */
static bool k_layernorm_grad(Cg *c, const Node *n) {
    const Value *dY = n->in[0], *X = n->in[1], *S = n->in[2];
    const Value *dX = n->out[0], *dS = n->out[1], *dB = n->out[2];
    int axis = ln_axis(n, X);
    float eps = node_attr_f(n, "epsilon", 1e-5f);
    int64_t outer = 1, len = 1;
    for (int j = 0; j < X->rank; j++) *(j < axis ? &outer : &len) *= X->dims[j].k;
    Bcast bs;
    bcast_init(&bs, X, axis, S);
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dS, len, cg_f32(c, 0));
    cg_fill(c, dB, len, cg_f32(c, 0));
    if (ln_vector_form(X, &bs, NULL, NULL) && S->dtype == DT_FLOAT && dY->dtype == DT_FLOAT) {
        LnRow v = ln_row(c);
        v.x = X, v.s = S, v.dy = dY, v.dx = dX, v.ds = dS, v.db = dB;
        CgLoop lr;
        v.base = cg_mul(c, cg_for(c, &lr, cg_i64(c, outer)), len);
        ln_vec_stats(c, &v, len, eps);
        ln_pass(c, &v, LN_GSUM, len, &v.mg, &v.mgx);
        v.pass = LN_DX;
        cg_vrow(c, len, v.w, ln_vec, &v);
        cg_for_end(c, &lr);
        cg_kernel_end(c);
        return true;
    }
    LLVMValueRef sg = cg_alloca(c, c->t_f64), sgx = cg_alloca(c, c->t_f64);
    CgLoop lr, l1, l2;
    LLVMValueRef r = cg_for(c, &lr, cg_i64(c, outer)), base = cg_mul(c, r, len), mean, inv;
    ln_stats(c, X, base, len, eps, &mean, &inv);
    LLVMBuildStore(c->b, LLVMConstReal(c->t_f64, 0), sg);
    LLVMBuildStore(c->b, LLVMConstReal(c->t_f64, 0), sgx);
    LLVMValueRef j = cg_for(c, &l1, cg_i64(c, len)), i = cg_add(c, base, j);
    LLVMValueRef g = f_mul(c, cg_load(c, dY, i), cg_load(c, S, bcast_index(c, &bs, j)));
    LLVMValueRef xh = f_mul(c, f_sub(c, cg_load(c, X, i), mean), inv);
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, c->t_f64, sg, ""), LLVMBuildFPExt(c->b, g, c->t_f64, "")), sg);
    LLVMBuildStore(c->b, f_add(c, LLVMBuildLoad2(c->b, c->t_f64, sgx, ""),
                              LLVMBuildFPExt(c->b, f_mul(c, g, xh), c->t_f64, "")), sgx);
    cg_for_end(c, &l1);
    LLVMValueRef rl = LLVMConstReal(c->t_f64, 1.0 / (double)len);
    LLVMValueRef mg = LLVMBuildFPTrunc(c->b, f_mul(c, LLVMBuildLoad2(c->b, c->t_f64, sg, ""), rl), c->t_f32, "");
    LLVMValueRef mgx = LLVMBuildFPTrunc(c->b, f_mul(c, LLVMBuildLoad2(c->b, c->t_f64, sgx, ""), rl), c->t_f32, "");
    j = cg_for(c, &l2, cg_i64(c, len));
    i = cg_add(c, base, j);
    LLVMValueRef dy = cg_load(c, dY, i);
    g = f_mul(c, dy, cg_load(c, S, bcast_index(c, &bs, j)));
    xh = f_mul(c, f_sub(c, cg_load(c, X, i), mean), inv);
    cg_store(c, dX, i, f_mul(c, inv, f_sub(c, f_sub(c, g, mg), f_mul(c, xh, mgx))));
    add_to(c, dS, j, f_mul(c, dy, xh));
    add_to(c, dB, j, dy);
    cg_for_end(c, &l2);
    cg_for_end(c, &lr);
    cg_kernel_end(c);
    return true;
}

/* ==== gradient rules ==== */

/* cleave.<op>(a, b) over window w with the given group, for the caller to
 * add what else it needs and finish. */
static Node *conv_grad_node(GradCtx *c, const char *op, Value *a, Value *b, const Win *w, int64_t group) {
    Value *in[2] = {a, b};
    /* ConvGradWeight: dW and its float64 sums */
    Node *g = gb_start(c, "cleave", op, 2, in, strcmp(op, "ConvGradWeight") == 0 ? 2 : 1);
    win_attrs(c, g, w);
    gb_attr_i(c, g, "group", group);
    return g;
}

static Value *conv_grad_bias(GradCtx *c, Value *dy) {
    Value *in[1] = {dy};
    return gb_finish(c, gb_start(c, "cleave", "ConvGradBias", 1, in, 1));
}

/* dX = ConvGradInput(dY, W), dW = ConvGradWeight(dY, X), dB = ConvGradBias(dY) */
static bool g_conv(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *X = n->in[0], *W = n->in[1], *Y = n->out[0];
    if (!spatial_known(X) || !spatial_known(Y) || !value_shape_known(W))
        return grad_refuse(c, n, "the gradient needs static spatial and filter shapes");
    int64_t kernel[MAX_RANK], group = node_attr_i(n, "group", 1);
    conv_kernel_sizes(W, kernel);
    Win w;
    win_resolve(n, X, Y, kernel, &w);
    if (need[0]) {
        Node *g = conv_grad_node(c, "ConvGradInput", dy[0], W, &w, group);
        gb_attr_ints(c, g, "spatial", w.in, w.nsp);
        dx[0] = gb_finish(c, g);
    }
    if (need[1]) dx[1] = gb_finish(c, conv_grad_node(c, "ConvGradWeight", dy[0], X, &w, group));
    if (n->n_in > 2 && n->in[2] && need[2]) dx[2] = conv_grad_bias(c, dy[0]);
    return true;
}

/* ConvTranspose's input gradient: Conv(dY, W) over the window w of the
 * convolution it transposes (input dY, output X's shape).  w's end padding
 * only decides which outputs exist, so the Conv gets the end padding that
 * ends it at X's length; where the output_padding makes dY longer than
 * that reaches even without end padding, a Slice cuts the rest off. */
static Value *convt_grad_input(GradCtx *c, Value *dy, Value *W, const Win *w, int64_t group) {
    int nsp = w->nsp;
    int64_t pads[2 * MAX_RANK], starts[MAX_RANK], axes[MAX_RANK];
    bool crop = false;
    for (int j = 0; j < nsp; j++) {
        int64_t ext = (w->k[j] - 1) * w->d[j] + 1;
        int64_t pe = (w->out[j] - 1) * w->s[j] + ext - w->in[j] - w->pb[j];
        pads[j] = w->pb[j];
        pads[nsp + j] = pe > 0 ? pe : 0;
        crop |= pe < 0 && (w->in[j] + w->pb[j] - ext) / w->s[j] + 1 > w->out[j];
        starts[j] = 0;
        axes[j] = 2 + j;
    }
    Value *in[2] = {dy, W};
    Node *g = gb_start(c, "", "Conv", 2, in, 1);
    gb_attr_ints(c, g, "kernel_shape", w->k, nsp);
    gb_attr_ints(c, g, "strides", w->s, nsp);
    gb_attr_ints(c, g, "pads", pads, 2 * nsp);
    gb_attr_ints(c, g, "dilations", w->d, nsp);
    gb_attr_i(c, g, "group", group);
    Value *dx = gb_finish(c, g);
    if (!crop) return dx;
    Value *s_in[4] = {dx, gb_const_ints(c, starts, nsp), gb_const_ints(c, w->out, nsp), gb_const_ints(c, axes, nsp)};
    return gb_finish(c, gb_start(c, "", "Slice", 4, s_in, 1));
}

/* Y = ConvTranspose(X, W) is the input gradient of Conv(Y, W) over window
 * w, so dX is that convolution of dY (convt_grad_input), dW is its weight
 * gradient with X in the place of its output gradient, and dB sums dY. */
static bool g_conv_transpose(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    Value *X = n->in[0], *W = n->in[1], *Y = n->out[0];
    if (!spatial_known(X) || !spatial_known(Y) || !value_shape_known(W))
        return grad_refuse(c, n, "the gradient needs static spatial and filter shapes");
    int64_t kernel[MAX_RANK], group = node_attr_i(n, "group", 1);
    conv_kernel_sizes(W, kernel);
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    Win w;
    if (!convt_win(&oc, n, X, Y, kernel, &w)) return false;
    if (need[0]) dx[0] = convt_grad_input(c, dy[0], W, &w, group);
    if (need[1]) dx[1] = gb_finish(c, conv_grad_node(c, "ConvGradWeight", X, dy[0], &w, group));
    if (n->n_in > 2 && n->in[2] && need[2]) dx[2] = conv_grad_bias(c, dy[0]);
    return true;
}

static bool g_layernorm(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if ((n->n_out > 1 && dy[1]) || (n->n_out > 2 && dy[2]))
        return grad_refuse(c, n, "gradients flowing into the Mean or InvStdDev outputs are not supported");
    if (!dy[0]) return true;
    Value *X = n->in[0], *S = n->in[1], *B = n->n_in > 2 ? n->in[2] : NULL;
    if (!value_shape_known(X)) return grad_refuse(c, n, "the gradient needs a static input shape");
    Value *in[3] = {dy[0], X, S};
    Node *g = gb_start(c, "cleave", "LayerNormGrad", 3, in, 3);
    if (!g) return false;
    gb_attr_i(c, g, "axis", ln_axis(n, X));
    gb_attr_f(c, g, "epsilon", node_attr_f(n, "epsilon", 1e-5f));
    if (!gb_finish(c, g)) return false;
    if (need[0]) dx[0] = g->out[0];
    if (need[1]) dx[1] = gb_sum_to(c, g->out[1], S);
    if (B && need[2]) dx[2] = gb_sum_to(c, g->out[2], B);
    return true;
}

/* ==== shape rules of the internal gradient ops ==== */

static bool infer_conv_grad_input(OpCtx *c, Node *n) {
    const Value *w = n->in[1];
    if (!dim_is_const(w->dims[1])) return op_error(c, n, "filter channels must be known");
    return spatial_out(c, n, dim_const(w->dims[1].k * node_attr_i(n, "group", 1)));
}

static bool infer_conv_grad_weight(OpCtx *c, Node *n) {
    const Value *dy = n->in[0], *x = n->in[1];
    const int64_t *ks;
    int nk = node_attr_ints(n, "kernel_shape", &ks);
    int64_t group = node_attr_i(n, "group", 1);
    if (nk != x->rank - 2 || !dim_is_const(x->dims[1]) || group <= 0)
        return op_error(c, n, "kernel_shape, group and input channels must be known");
    Dim out[MAX_RANK];
    out[0] = dy->dims[1];
    out[1] = dim_const(x->dims[1].k / group);
    for (int i = 0; i < nk; i++) out[2 + i] = dim_const(ks[i]);
    set_out(n, 0, dy->dtype, x->rank, out);
    /* Optional output 1: scratch for the float64 sums, as float32 pairs. */
    if (n->n_out > 1) {
        Dim pairs;
        if (!dims_product(out, x->rank, &pairs) || !dim_is_const(pairs))
            return op_error(c, n, "the filter's shape must be known");
        pairs.k *= 2;
        set_out(n, 1, DT_FLOAT, 1, &pairs);
    }
    return true;
}

static bool infer_conv_grad_bias(OpCtx *c, Node *n) {
    (void)c;
    set_out(n, 0, n->in[0]->dtype, 1, &n->in[0]->dims[1]);
    return true;
}

static bool infer_ln_grad(OpCtx *c, Node *n) {
    const Value *x = n->in[1];
    int64_t axis = node_attr_i(n, "axis", -1);
    if (!norm_axis(c, n, &axis, x->rank)) return false;
    same_as_input(n, 0, 1);
    for (int k = 1; k < 3; k++) set_out(n, k, x->dtype, x->rank - (int)axis, x->dims + axis);
    return true;
}

/* 2 * (filter elements per output channel) per dY element, as the forward
 * convolution. */
static double flops_conv_grad(const Node *n) {
    return conv_flops(n->in[0], strcmp(n->op_type, "ConvGradInput") == 0 ? n->in[1] : n->out[0]);
}

static double flops_in_elems(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : (double)e;
}

static double flops_norm_grad(const Node *n) {
    int64_t e = value_numel(n->in[0]);
    return e < 0 ? 0 : 8.0 * (double)e;
}

static const AttrSpec attrs_conv[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"dilations", ATTR_INTS}, {"group", ATTR_INT, .i = 1},
    {"kernel_shape", ATTR_INTS},              {"pads", ATTR_INTS},      {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_none[] = {{0}};
static const AttrSpec attrs_ln[] = {
    {"axis", ATTR_INT, .i = -1}, {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {"stash_type", ATTR_INT, .i = 1}, {0}};

/* Explicit geometry of the internal ops (auto_pad already resolved). */
static const AttrSpec attrs_conv_grad_input[] = {
    {"dilations", ATTR_INTS}, {"group", ATTR_INT, .i = 1}, {"kernel_shape", ATTR_INTS}, {"pads", ATTR_INTS},
    {"spatial", ATTR_INTS, .required = true}, {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_conv_grad_weight[] = {
    {"dilations", ATTR_INTS}, {"group", ATTR_INT, .i = 1}, {"kernel_shape", ATTR_INTS, .required = true},
    {"pads", ATTR_INTS}, {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_ln_grad[] = {{"axis", ATTR_INT, .i = -1}, {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {0}};

static const AttrSpec attrs_conv_transpose[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"dilations", ATTR_INTS}, {"group", ATTR_INT, .i = 1},
    {"kernel_shape", ATTR_INTS}, {"output_padding", ATTR_INTS}, {"output_shape", ATTR_INTS}, {"pads", ATTR_INTS},
    {"strides", ATTR_INTS}, {0}};

const OpDef op_Conv = {"Conv", "", 1, 0, 2, 3, 1, 1, attrs_conv, 0, infer_conv, NULL, flops_conv, .grad = g_conv, .cg = k_conv, .dense = DENSE_CONV, .cg_blocks = k_conv_blocks};
const OpDef op_ConvTranspose = {"ConvTranspose", "", 1, 0, 2, 3, 1, 1, attrs_conv_transpose, 0, infer_conv_transpose, NULL, flops_conv_transpose, .grad = g_conv_transpose, .cg = k_conv_transpose, .dense = DENSE_CONV};
const OpDef op_LayerNormalization = {"LayerNormalization", "", 17, 0, 2, 3, 1, 3, attrs_ln, 0, infer_layernorm, NULL, flops_norm, .grad = g_layernorm, .cg = k_layernorm};

const OpDef op_ConvGradInput = {"ConvGradInput", "cleave", 1, 0, 2, 2, 1, 1, attrs_conv_grad_input, 0, infer_conv_grad_input, NULL, flops_conv_grad, .cg = k_conv_grad_input, .dense = DENSE_CONV};
const OpDef op_ConvGradWeight = {"ConvGradWeight", "cleave", 1, 0, 2, 2, 1, 2, attrs_conv_grad_weight, 0, infer_conv_grad_weight, NULL, flops_conv_grad, .cg = k_conv_grad_weight, .dense = DENSE_CONV};
const OpDef op_ConvGradBias = {"ConvGradBias", "cleave", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer_conv_grad_bias, NULL, flops_in_elems, .cg = k_conv_grad_bias};
const OpDef op_LayerNormGrad = {"LayerNormGrad", "cleave", 1, 0, 3, 3, 3, 3, attrs_ln_grad, 0, infer_ln_grad, NULL, flops_norm_grad, .cg = k_layernorm_grad};
