/* ops_nn.c - convolution, pooling and normalisation layers (NCHW): shape
 * rules, forward kernels, gradient rules, and the internal ops of domain
 * "cleave" those gradients are built from (ConvGradInput, ConvGradWeight,
 * ConvGradBias, MaxPoolGrad, AveragePoolGrad, BatchNormGrad,
 * LayerNormGrad).  Forward and gradient kernels walk the same window
 * geometry, so they live together. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

/* Spatial output sizes for Conv and the pools, honouring auto_pad, pads,
 * strides, dilations and ceil_mode.  `kernel` holds the window size per
 * spatial axis; out[] receives spatial dims. */
static bool window_out(OpCtx *c, const Node *n, const Value *x, const int64_t *kernel, int nsp, bool ceil_mode,
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
        if (!dim_is_const(in)) { out[i] = dim_unknown(); continue; }
        int64_t ek = (kernel[i] - 1) * d + 1; /* effective kernel extent */
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

/* 2 * Cin/group * prod(kernel) per output element, plus the bias. */
static double flops_conv(const Node *n) {
    const Value *w = n->in[1];
    int64_t y = value_numel(n->out[0]);
    if (y < 0 || !value_shape_known(w)) return 0;
    double per = 1;
    for (int i = 1; i < w->rank; i++) per *= (double)w->dims[i].k;
    return 2 * per * (double)y + ((n->n_in > 2 && n->in[2]) ? (double)y : 0);
}

static bool infer_pool(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (x->rank < 3) return op_error(c, n, "input rank %d; at least 3 (N, C, spatial...) required", x->rank);
    int nsp = x->rank - 2;
    const int64_t *ks;
    int nk = node_attr_ints(n, "kernel_shape", &ks);
    if (nk != nsp) return op_error(c, n, "kernel_shape must have %d entries", nsp);
    if (node_attr_i(n, "storage_order", 0) != 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "storage_order=1 is not supported");
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

/* X, scale, B, mean, var.  The optional outputs are statistics of length
 * C: running mean and variance (training mode), and before opset 14 also
 * the saved batch mean and variance; means take the type of input 3 and
 * variances that of input 4. */
static bool infer_batchnorm(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (x->rank < 2) return op_error(c, n, "input rank %d; at least 2 required", x->rank);
    if (c->opset < 9 && node_attr_i(n, "spatial", 1) == 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED,
                             "spatial=0 (statistics per element, not per channel) is not supported");
    int max_out = c->opset >= 14 ? 3 : 5;
    if (n->n_out > max_out)
        return op_error_kind(c, n, DIAG_GRAPH, "has %d outputs; opset %lld allows at most %d", n->n_out,
                             (long long)c->opset, max_out);
    Dim ch = x->dims[1];
    for (int i = 1; i < n->n_in; i++) {
        const Value *p = n->in[i];
        if (!p) continue;
        if (p->rank != 1 || (dim_is_const(p->dims[0]) && dim_is_const(ch) && p->dims[0].k != ch.k)) {
            char cs[64];
            return op_error(c, n, "'%s' must be 1-D of length C = %s", p->name, dim_str(c->g, ch, cs, sizeof cs));
        }
    }
    same_as_input(n, 0, 0);
    for (int k = 1; k < n->n_out; k++) set_out(n, k, n->in[k % 2 ? 3 : 4]->dtype, 1, &ch);
    return true;
}

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

static const AttrSpec attrs_conv[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"dilations", ATTR_INTS}, {"group", ATTR_INT, .i = 1},
    {"kernel_shape", ATTR_INTS},              {"pads", ATTR_INTS},      {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_maxpool[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"ceil_mode", ATTR_INT, .i = 0}, {"dilations", ATTR_INTS},
    {"kernel_shape", ATTR_INTS, .required = true}, {"pads", ATTR_INTS}, {"storage_order", ATTR_INT, .i = 0},
    {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_avgpool[] = {
    {"auto_pad", ATTR_STRING, .s = "NOTSET"}, {"ceil_mode", ATTR_INT, .i = 0},
    {"count_include_pad", ATTR_INT, .i = 0}, {"dilations", ATTR_INTS},
    {"kernel_shape", ATTR_INTS, .required = true}, {"pads", ATTR_INTS}, {"strides", ATTR_INTS}, {0}};
static const AttrSpec attrs_none[] = {{0}};
static const AttrSpec attrs_bn[] = {
    {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {"momentum", ATTR_FLOAT, .f = 0.9f}, {"training_mode", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_ln[] = {
    {"axis", ATTR_INT, .i = -1}, {"epsilon", ATTR_FLOAT, .f = 1e-5f}, {"stash_type", ATTR_INT, .i = 1}, {0}};

const OpDef op_Conv = {"Conv", "", 1, 0, 2, 3, 1, 1, attrs_conv, 0, infer_conv, NULL, flops_conv};
const OpDef op_MaxPool = {"MaxPool", "", 1, 0, 1, 1, 1, 2, attrs_maxpool, 0, infer_pool, NULL, flops_pool};
const OpDef op_AveragePool = {"AveragePool", "", 1, 0, 1, 1, 1, 1, attrs_avgpool, 0, infer_pool, NULL, flops_pool};
const OpDef op_GlobalAveragePool = {"GlobalAveragePool", "", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer_global_pool, NULL, flops_global_pool};
/* Inputs 3 and 4 (running mean and variance) are state, not weights. */
const OpDef op_BatchNormalization = {"BatchNormalization", "", 1, 0, 5, 5, 1, 5, attrs_bn, (1u << 3) | (1u << 4), infer_batchnorm, NULL, flops_norm};
const OpDef op_LayerNormalization = {"LayerNormalization", "", 17, 0, 2, 3, 1, 3, attrs_ln, 0, infer_layernorm, NULL, flops_norm};
