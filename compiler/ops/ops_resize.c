/* ops_resize.c - Resize (opsets 10 to 19) and the deprecated Upsample
 * (opsets 7 to 9): shape rules, kernels, gradient rules, and the gradient
 * op cleave.ResizeGrad.
 *
 * Along each axis both ops map output position o to a coordinate in the
 * input (coordinate_transformation_mode) and read the input element
 * nearest to it (nearest_mode), or the two around it weighted linearly.  A
 * linear output is the interpolation along the first resized axis of the
 * interpolations along the later ones, the order PyTorch computes it in.
 * The map depends only on the lengths, the scales and the modes, so it is
 * computed at compile time into tables of input offsets and weights: the
 * forward kernel gathers through them, and the gradient scatters dY back
 * through the same tables (onto the source element for nearest, with the
 * weights for linear).  Cubic interpolation, antialiasing and
 * tf_crop_and_resize are refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"
#include "ops_cg.h"

typedef enum { RS_NEAREST, RS_LINEAR } RsMode;
static const char *const rs_modes[] = {"nearest", "linear"};

typedef enum {
    CT_HALF_PIXEL,
    CT_HALF_PIXEL_SYMMETRIC,
    CT_PYTORCH_HALF_PIXEL,
    CT_ALIGN_CORNERS,
    CT_TF_HALF_PIXEL_FOR_NN,
    CT_ASYMMETRIC,
} CtMode;
static const char *const ct_modes[] = {"half_pixel",    "half_pixel_symmetric", "pytorch_half_pixel",
                                       "align_corners", "tf_half_pixel_for_nn", "asymmetric"};

/* nearest_mode.  "simple" is ONNX Runtime's name for the rule of Resize
 * before opset 11 and of Upsample, which had no nearest_mode: round down,
 * or up on an axis that shrinks.  Only cleave.ResizeGrad spells it. */
typedef enum { NM_ROUND_PREFER_FLOOR, NM_ROUND_PREFER_CEIL, NM_FLOOR, NM_CEIL, NM_SIMPLE } NmMode;
static const char *const nm_modes[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"};

/* How outputs map to inputs.  ONNX's reference maps coordinates by the
 * scales when they are given (the resized length being input length times
 * scale, before floor()), and by the output lengths when sizes are. */
typedef struct ResizeSpec {
    RsMode mode;
    CtMode coord;
    NmMode nearest;
    bool sized;            /* sizes were given: the lengths define the map */
    float scale[MAX_RANK]; /* otherwise the scale of each axis does */
} ResizeSpec;

static int lookup(const char *name, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

/* The modes of node n.  Upsample and Resize before opset 11 had none but
 * `mode`: their coordinates are asymmetric and their rounding "simple". */
static bool rs_modes_of(OpCtx *c, const Node *n, bool legacy, ResizeSpec *s) {
    const char *m = node_attr_s(n, "mode", "nearest");
    int k = lookup(m, rs_modes, 2);
    if (strcmp(m, "cubic") == 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "mode 'cubic' is not supported (nearest and linear are)");
    if (k < 0) return op_error(c, n, "unknown mode '%s' (nearest, linear or cubic)", m);
    s->mode = (RsMode)k;
    if (legacy) {
        s->coord = CT_ASYMMETRIC;
        s->nearest = NM_SIMPLE;
        return true;
    }
    const char *ct = node_attr_s(n, "coordinate_transformation_mode", "half_pixel");
    if (strcmp(ct, "tf_crop_and_resize") == 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "coordinate_transformation_mode 'tf_crop_and_resize' is not "
                                                     "supported");
    k = lookup(ct, ct_modes, 6);
    if (k < 0)
        return op_error(c, n, "unknown coordinate_transformation_mode '%s' (half_pixel, half_pixel_symmetric, "
                              "pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn or "
                              "tf_crop_and_resize)", ct);
    s->coord = (CtMode)k;
    const char *nm = node_attr_s(n, "nearest_mode", "round_prefer_floor");
    k = lookup(nm, nm_modes, n->domain[0] ? 5 : 4);
    if (k < 0)
        return op_error(c, n, "unknown nearest_mode '%s' (round_prefer_floor, round_prefer_ceil, floor or ceil)", nm);
    s->nearest = (NmMode)k;
    if (node_attr_i(n, "antialias", 0) != 0)
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "antialias is not supported");
    return true;
}

/* The scales in input i: *count gets their number, 0 when the input is
 * omitted or empty, -1 when they are not constant. */
static bool rs_scales_input(OpCtx *c, const Node *n, int i, float *buf, int *count) {
    *count = 0;
    if (i >= n->n_in || !n->in[i]) return true;
    const Value *v = n->in[i];
    if (!dtype_is_float(v->dtype)) return op_error(c, n, "scales '%s' is %s, not float", v->name, dtype_name(v->dtype));
    if (value_numel(v) == 0) return true;
    if (!in_const(n, i)) {
        *count = -1;
        return true;
    }
    if (v->konst->n > MAX_RANK)
        return op_error(c, n, "scales '%s' has %lld entries, more than the rank", v->name, (long long)v->konst->n);
    for (int64_t k = 0; k < v->konst->n; k++) buf[k] = (float)const_get_f(v->konst, k);
    *count = (int)v->konst->n;
    return true;
}

/* The sizes in input i, as rs_scales_input reads the scales. */
static bool rs_sizes_input(OpCtx *c, const Node *n, int i, int64_t *buf, int *count) {
    *count = 0;
    if (i >= n->n_in || !n->in[i]) return true;
    const Value *v = n->in[i];
    if (v->dtype != DT_INT64) return op_error(c, n, "sizes '%s' is %s, not int64", v->name, dtype_name(v->dtype));
    if (value_numel(v) == 0) return true;
    *count = in_ints(n, i, buf, MAX_RANK);
    if (*count == -2) return op_error(c, n, "sizes '%s' has more entries than the rank", v->name);
    return true;
}

/* The axes scales or sizes are given for: opset 18's `axes`, else all. */
static bool rs_axes(OpCtx *c, const Node *n, int r, int64_t *axes, int *na) {
    const int64_t *a;
    int k = node_attr_ints(n, "axes", &a);
    *na = r;
    if (k < 0) {
        for (int j = 0; j < r; j++) axes[j] = j;
        return true;
    }
    if (k > r) return op_error(c, n, "axes has %d entries for rank %d", k, r);
    bool seen[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        axes[i] = a[i];
        if (!norm_axis(c, n, &axes[i], r)) return false;
        if (seen[axes[i]]) return op_error(c, n, "axis %lld repeated", (long long)axes[i]);
        seen[axes[i]] = true;
    }
    *na = k;
    return true;
}

/* Output length of an axis of length d scaled by sc: floor(d * sc).  A
 * symbolic length stays itself at scale 1 and becomes unknown otherwise. */
static bool rs_scaled(OpCtx *c, const Node *n, int j, Dim d, float sc, Dim *out) {
    if (!(sc > 0) || !isfinite(sc)) return op_error(c, n, "scale %g on axis %d is not a positive number", sc, j);
    if (!dim_is_const(d)) {
        *out = sc == 1 ? d : dim_unknown();
        return true;
    }
    double len = floor((double)d.k * sc);
    if (len < 1) return op_error(c, n, "axis %d of length %lld scaled by %g leaves nothing", j, (long long)d.k, sc);
    if (len > (double)((int64_t)1 << 40)) return op_error(c, n, "axis %d scaled by %g is beyond 2^40", j, sc);
    *out = dim_const((int64_t)len);
    return true;
}

/* Sizes to output lengths: each size as it is ("stretch"), or one scale
 * for all the given axes that keeps their aspect, the largest that fits in
 * the sizes ("not_larger") or the smallest that covers them
 * ("not_smaller"), with lengths rounded to the nearest; that scale then
 * maps the coordinates. */
static bool rs_sizes(OpCtx *c, const Node *n, const Value *x, const int64_t *axes, int na, const int64_t *sizes,
                     ResizeSpec *s, Dim *out) {
    const char *policy = node_attr_s(n, "keep_aspect_ratio_policy", "stretch");
    bool larger = strcmp(policy, "not_larger") == 0, smaller = strcmp(policy, "not_smaller") == 0;
    if (!larger && !smaller && strcmp(policy, "stretch"))
        return op_error(c, n, "unknown keep_aspect_ratio_policy '%s' (stretch, not_larger or not_smaller)", policy);
    float common = 0;
    for (int i = 0; i < na; i++) {
        Dim d = x->dims[axes[i]];
        if (sizes[i] < 1 || sizes[i] > ((int64_t)1 << 40))
            return op_error(c, n, "size %lld on axis %lld is outside [1, 2^40]", (long long)sizes[i],
                            (long long)axes[i]);
        float sc = dim_is_const(d) ? (float)sizes[i] / (float)d.k : 0;
        out[axes[i]] = dim_const(sizes[i]);
        if (i == 0 || (larger && sc < common) || (smaller && sc > common)) common = sc;
    }
    s->sized = !larger && !smaller;
    if (s->sized) return true;
    for (int i = 0; i < na; i++) {
        Dim d = x->dims[axes[i]];
        s->scale[axes[i]] = common;
        out[axes[i]] = dim_is_const(d) ? dim_const((int64_t)floor(common * (float)d.k + 0.5)) : dim_unknown();
    }
    return true;
}

/* Node n's scales (Upsample's attribute before opset 9, else the input
 * before the sizes) and sizes (Resize's fourth input from opset 11), as
 * rs_scales_input counts them. */
static bool rs_factors(OpCtx *c, const Node *n, bool legacy, float *scales, int *ns, int64_t *sizes, int *nz) {
    *nz = 0;
    if (strcmp(n->op_type, "Upsample") == 0 && n->n_in < 2) {
        const Attr *a = node_attr(n, "scales");
        if (!a || a->kind != ATTR_FLOATS) return op_error(c, n, "the scales are missing");
        if (a->n > MAX_RANK) return op_error(c, n, "scales has %d entries, more than the rank", a->n);
        memcpy(scales, a->floats, sizeof *scales * (size_t)a->n);
        *ns = a->n;
        return true;
    }
    return rs_scales_input(c, n, legacy ? 1 : 2, scales, ns) && (legacy || rs_sizes_input(c, n, 3, sizes, nz));
}

/* Node n's modes, the scale of every axis and the output dims.  *known is
 * false when the scales or sizes are not constant (the output dims are
 * then unknown). */
static bool rs_spec(OpCtx *c, const Node *n, const Value *x, ResizeSpec *s, Dim *out, bool *known) {
    bool resize = strcmp(n->op_type, "Resize") == 0, legacy = !resize || c->opset < 11;
    int r = x->rank, ns = 0, nz = 0, na;
    float scales[MAX_RANK];
    int64_t sizes[MAX_RANK], axes[MAX_RANK];
    if (!rs_modes_of(c, n, legacy, s) || !rs_factors(c, n, legacy, scales, &ns, sizes, &nz)) return false;
    if (ns > 0 && nz > 0) return op_error(c, n, "only one of scales and sizes may be given");
    if (ns == 0 && nz == 0) return op_error(c, n, "one of scales and sizes is required");
    if (!rs_axes(c, n, r, axes, &na)) return false;
    s->sized = false;
    for (int j = 0; j < r; j++) {
        s->scale[j] = 1;
        out[j] = x->dims[j];
    }
    *known = ns >= 0 && nz >= 0;
    if (!*known) return true;
    if ((ns ? ns : nz) != na)
        return op_error(c, n, "%s has %d entries for %d axes", ns ? "scales" : "sizes", ns ? ns : nz, na);
    if (nz) return rs_sizes(c, n, x, axes, na, sizes, s, out);
    for (int i = 0; i < na; i++) {
        int j = (int)axes[i];
        if (!resize && scales[i] < 1)
            return op_error(c, n, "scale %g on axis %d is below 1 (Upsample only enlarges)", scales[i], j);
        s->scale[j] = scales[i];
        if (!rs_scaled(c, n, j, x->dims[j], scales[i], &out[j])) return false;
    }
    return true;
}

static bool infer_resize(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    ResizeSpec s;
    Dim out[MAX_RANK];
    bool known;
    if (!rs_spec(c, n, x, &s, out, &known)) return false;
    if (s.mode == RS_LINEAR && !dtype_is_float(x->dtype))
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "linear mode on %s is not supported (floating-point types are)",
                             dtype_name(x->dtype));
    if (known) set_out(n, 0, x->dtype, x->rank, out);
    else set_out_unknown(n, 0, x->dtype, x->rank);
    return true;
}

/* cleave.ResizeGrad(dY) -> dX carries the forward node's modes by name,
 * whether it was given sizes ("sized"), the scale of every axis ("scales")
 * and X's shape ("shape"). */
static bool rs_grad_spec(OpCtx *c, const Node *n, ResizeSpec *s) {
    if (!rs_modes_of(c, n, false, s)) return false;
    s->sized = node_attr_i(n, "sized", 0) != 0;
    const Attr *a = node_attr(n, "scales");
    int r = n->in[0]->rank;
    if (!a || a->kind != ATTR_FLOATS || a->n != r) return op_error(c, n, "scales needs %d entries", r);
    memcpy(s->scale, a->floats, sizeof *s->scale * (size_t)r);
    return true;
}

static bool infer_resize_grad(OpCtx *c, Node *n) {
    ResizeSpec s;
    return rs_grad_spec(c, n, &s) && infer_shape_attr(c, n);
}

/* ==== the map ==== */

/* The input coordinate that output position o of axis j reads (input
 * length in, output length out), as ONNX defines each mode: from the scale
 * sc and the resized length len = in * sc before floor(), or from the
 * lengths when sizes were given. */
static double rs_coord(const ResizeSpec *s, int j, int64_t o, int64_t in, int64_t out) {
    double x = (double)o, sc = s->sized ? (double)out / (double)in : s->scale[j];
    double len = s->sized ? (double)out : (double)in * sc;
    switch (s->coord) {
    case CT_HALF_PIXEL: return (x + 0.5) / sc - 0.5;
    case CT_HALF_PIXEL_SYMMETRIC:
        /* the half-pixel grid shifted so that the output's centre meets
         * the input's when floor() shortened the output */
        return (double)in / 2 * (1 - (double)out / len) + (x + 0.5) / sc - 0.5;
    case CT_PYTORCH_HALF_PIXEL: return len > 1 ? (x + 0.5) / sc - 0.5 : 0;
    case CT_ALIGN_CORNERS: return len > 1 ? x * (double)(in - 1) / (len - 1) : 0;
    case CT_TF_HALF_PIXEL_FOR_NN: return (x + 0.5) / sc;
    case CT_ASYMMETRIC: break;
    }
    return x / sc;
}

static int64_t rs_round(const ResizeSpec *s, int j, double x) {
    switch (s->nearest) {
    case NM_ROUND_PREFER_FLOOR: return (int64_t)ceil(x - 0.5);
    case NM_ROUND_PREFER_CEIL: return (int64_t)floor(x + 0.5);
    case NM_FLOOR: return (int64_t)floor(x);
    case NM_CEIL: return (int64_t)ceil(x);
    case NM_SIMPLE: break;
    }
    return (int64_t)(s->scale[j] < 1 ? ceil(x) : floor(x));
}

static int64_t clamp_pos(int64_t i, int64_t in) { return i < 0 ? 0 : i >= in ? in - 1 : i; }

/* Where output position o of axis j reads: positions *i0 and *i1 with
 * weights *w0 and *w1 (nearest: *i0 alone, weight 1).  Linear reads the
 * positions around the coordinate, clamped into the axis, as ONNX's edge
 * padding and PyTorch's clamping both do. */
static void rs_source(const ResizeSpec *s, int j, int64_t o, int64_t in, int64_t out, int64_t *i0, int64_t *i1,
                      float *w0, float *w1) {
    double x = rs_coord(s, j, o, in, out);
    if (s->mode == RS_NEAREST) {
        *i0 = *i1 = clamp_pos(rs_round(s, j, x), in);
        *w0 = 1;
        *w1 = 0;
        return;
    }
    double f = floor(x);
    *w1 = (float)(x - f);
    *w0 = 1 - *w1;
    *i0 = clamp_pos((int64_t)f, in);
    *i1 = clamp_pos((int64_t)f + 1, in);
}

/* Whether axis j maps every output position to the same input position
 * with weight 1: such an axis is a plain copy. */
static bool rs_identity(const ResizeSpec *s, int j, int64_t in, int64_t out) {
    if (in != out) return false;
    for (int64_t o = 0; o < out; o++) {
        int64_t i0, i1;
        float w0, w1;
        rs_source(s, j, o, in, out, &i0, &i1, &w0, &w1);
        if (i0 != o || w1 != 0) return false;
    }
    return true;
}

/* The map as one kernel reads it: for each resized axis (the others are
 * copies), from entry 2 * (first + o) on, the offsets of the two input
 * elements output position o reads (position times the axis's stride in
 * the input) and their weights. */
typedef struct RsMap {
    int n;                   /* resized axes */
    int axis[MAX_RANK];      /* which, in order */
    int64_t first[MAX_RANK]; /* each one's first position in the tables */
    LLVMValueRef off, wt;    /* int64 and float32 tables */
} RsMap;

/* Builds the map from x (input-shaped) to y (output-shaped). */
static bool rs_map(Cg *c, const Node *n, const ResizeSpec *s, const Value *x, const Value *y, RsMap *m) {
    int64_t xs[MAX_RANK], total = 0;
    shape_strides(x, xs);
    m->n = 0;
    for (int j = 0; j < x->rank; j++) {
        if (rs_identity(s, j, x->dims[j].k, y->dims[j].k)) continue;
        m->axis[m->n] = j;
        m->first[m->n++] = total;
        total += y->dims[j].k;
    }
    int64_t *off = malloc(sizeof *off * (size_t)(2 * total + 1));
    float *wt = malloc(sizeof *wt * (size_t)(2 * total + 1));
    if (!off || !wt) {
        free(off);
        free(wt);
        return diag_error(c->d, DIAG_NOMEM, "%s: node '%s' (%s): out of memory", c->g->path, n->name, n->op_type);
    }
    for (int k = 0; k < m->n; k++) {
        int j = m->axis[k];
        for (int64_t o = 0, e = 2 * m->first[k]; o < y->dims[j].k; o++, e += 2) {
            rs_source(s, j, o, x->dims[j].k, y->dims[j].k, &off[e], &off[e + 1], &wt[e], &wt[e + 1]);
            off[e] *= xs[j];
            off[e + 1] *= xs[j];
        }
    }
    m->off = cg_table(c, off, sizeof *off * (size_t)(2 * total));
    m->wt = cg_table(c, wt, sizeof *wt * (size_t)(2 * total));
    free(off);
    free(wt);
    return true;
}

/* The table entries of the output position being computed. */
typedef struct RsAt {
    int n, corners;                   /* resized axes; 1 (nearest) or 2 (linear) */
    LLVMValueRef off[MAX_RANK][2], w[MAX_RANK][2];
} RsAt;

/* The value at input offset base plus the resized axes k.. interpolated:
 * the weighted sum over this axis's corners of the later axes' values. */
static LLVMValueRef rs_gather(Cg *c, const Value *x, const RsAt *at, int k, LLVMValueRef base) {
    if (k == at->n) return dtype_is_float(x->dtype) ? cg_load(c, x, base) : cg_load_i(c, x, base);
    LLVMValueRef v = NULL;
    for (int t = 0; t < at->corners; t++) {
        LLVMValueRef part = rs_gather(c, x, at, k + 1, cg_add(c, base, at->off[k][t]));
        if (at->corners > 1) part = f_mul(c, part, at->w[k][t]);
        v = v ? f_add(c, v, part) : part;
    }
    return v;
}

/* rs_gather's transpose: g times the product of the weights along the way
 * (wt so far, NULL for 1) added to every input element it read, in the
 * order PyTorch's backward adds them. */
static void rs_scatter(Cg *c, const Value *dx, const RsAt *at, int k, LLVMValueRef base, LLVMValueRef wt,
                       LLVMValueRef g) {
    if (k == at->n) {
        add_to(c, dx, base, wt ? f_mul(c, wt, g) : g);
        return;
    }
    for (int t = 0; t < at->corners; t++) {
        LLVMValueRef w = at->corners == 1 ? wt : wt ? f_mul(c, wt, at->w[k][t]) : at->w[k][t];
        rs_scatter(c, dx, at, k + 1, cg_add(c, base, at->off[k][t]), w, g);
    }
}

/* The forward kernel (y from x) or, with grad, the gradient's (x, zeroed,
 * from y): loops over y, each resized axis reading its table entries at
 * its own loop level. */
static bool rs_kernel(Cg *c, const Node *n, const ResizeSpec *s, const Value *x, const Value *y, bool grad) {
    const Value *bufs[2] = {grad ? y : x, grad ? x : y};
    RsMap m = {0};
    if (!cg_kernel_begin(c, n, 2, bufs) || !rs_map(c, n, s, x, y, &m)) return false;
    if (grad) cg_fill(c, x, value_numel(x), cg_f32(c, 0));
    if (value_numel(y) > 0) {
        int64_t xs[MAX_RANK];
        shape_strides(x, xs);
        RsAt at = {.n = m.n, .corners = s->mode == RS_LINEAR ? 2 : 1};
        Nest ns = {.n = 0};
        LLVMValueRef yi = cg_i64(c, 0), base = cg_i64(c, 0);
        for (int j = 0, k = 0; j < y->rank; j++) {
            LLVMValueRef o = nest_for(c, &ns, cg_i64(c, y->dims[j].k));
            yi = cg_mad(c, yi, y->dims[j].k, o);
            if (k == m.n || m.axis[k] != j) {
                base = cg_add(c, base, cg_mul(c, o, xs[j]));
                continue;
            }
            LLVMValueRef e = cg_mul(c, cg_add(c, o, cg_i64(c, m.first[k])), 2);
            for (int t = 0; t < at.corners; t++) {
                LLVMValueRef et = cg_add(c, e, cg_i64(c, t));
                at.off[k][t] = cg_table_get(c, m.off, c->t_i64, et);
                at.w[k][t] = cg_table_get(c, m.wt, c->t_f32, et);
            }
            k++;
        }
        if (grad) rs_scatter(c, x, &at, 0, base, NULL, cg_load(c, y, yi));
        else cg_store(c, y, yi, rs_gather(c, x, &at, 0, base));
        nest_close(c, &ns);
    }
    cg_kernel_end(c);
    return true;
}

static bool k_resize(Cg *c, const Node *n) {
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    ResizeSpec s;
    Dim out[MAX_RANK];
    bool known;
    if (!rs_spec(&oc, n, n->in[0], &s, out, &known)) return false;
    if (!known)
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): scales and sizes must be constant", c->g->path,
                          n->name, n->op_type);
    return rs_kernel(c, n, &s, n->in[0], n->out[0], false);
}

static bool k_resize_grad(Cg *c, const Node *n) {
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    ResizeSpec s;
    return rs_grad_spec(&oc, n, &s) && rs_kernel(c, n, &s, n->out[0], n->in[0], true);
}

/* dX = cleave.ResizeGrad(dY): the forward map's transpose. */
static bool g_resize(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value *X = n->in[0];
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    ResizeSpec s;
    Dim out[MAX_RANK];
    bool known;
    if (!rs_spec(&oc, n, X, &s, out, &known)) return false;
    if (!known || !value_shape_known(X))
        return diag_error(c->d, DIAG_UNSUPPORTED,
                          "%s: node '%s' (%s): the gradient needs a static input shape and constant scales or sizes",
                          c->g->path, n->name, n->op_type);
    int64_t shape[MAX_RANK];
    for (int j = 0; j < X->rank; j++) shape[j] = X->dims[j].k;
    Node *g = gb_start(c, "cleave", "ResizeGrad", 1, dy, 1);
    gb_attr_s(c, g, "mode", rs_modes[s.mode]);
    gb_attr_s(c, g, "coordinate_transformation_mode", ct_modes[s.coord]);
    gb_attr_s(c, g, "nearest_mode", nm_modes[s.nearest]);
    gb_attr_i(c, g, "sized", s.sized);
    gb_attr_floats(c, g, "scales", s.scale, X->rank);
    gb_attr_ints(c, g, "shape", shape, X->rank);
    dx[0] = gb_finish(c, g);
    return true;
}

static const AttrSpec attrs_resize[] = {
    {"antialias", ATTR_INT, .i = 0},
    {"axes", ATTR_INTS},
    {"coordinate_transformation_mode", ATTR_STRING, .s = "half_pixel"},
    {"cubic_coeff_a", ATTR_FLOAT, .f = -0.75f},
    {"exclude_outside", ATTR_INT, .i = 0},
    {"extrapolation_value", ATTR_FLOAT, .f = 0},
    {"keep_aspect_ratio_policy", ATTR_STRING, .s = "stretch"},
    {"mode", ATTR_STRING, .s = "nearest"},
    {"nearest_mode", ATTR_STRING, .s = "round_prefer_floor"},
    {0}};
static const AttrSpec attrs_upsample[] = {{"mode", ATTR_STRING, .s = "nearest"}, {"scales", ATTR_FLOATS}, {0}};
static const AttrSpec attrs_resize_grad[] = {{"mode", ATTR_STRING, .required = true},
                                             {"coordinate_transformation_mode", ATTR_STRING, .required = true},
                                             {"nearest_mode", ATTR_STRING, .required = true},
                                             {"sized", ATTR_INT, .i = 0},
                                             {"scales", ATTR_FLOATS, .required = true},
                                             {"shape", ATTR_INTS, .required = true},
                                             {0}};

const OpDef op_Resize = {"Resize", "", 10, 0, 1, 4, 1, 1, attrs_resize, 0, infer_resize, NULL, NULL, .grad = g_resize, .cg = k_resize, .const_inputs = 6};
const OpDef op_Upsample = {"Upsample", "", 7, 9, 1, 2, 1, 1, attrs_upsample, 0, infer_resize, NULL, NULL, .grad = g_resize, .cg = k_resize, .const_inputs = 2};
const OpDef op_ResizeGrad = {"ResizeGrad", "cleave", 1, 0, 1, 1, 1, 1, attrs_resize_grad, 0, infer_resize_grad, NULL, NULL, .cg = k_resize_grad};
