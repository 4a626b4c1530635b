/* ops_shape.c - operators that move or describe data without arithmetic:
 * Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
 * Slice, Pad, Split, Expand, Constant, ConstantOfShape, Range, and the
 * gradient ops of Slice and Pad (Gather is in ops_gather.c).  Their fold
 * rules let the shape subgraphs PyTorch exports (Shape -> Gather ->
 * Unsqueeze -> Concat -> Reshape) collapse to constants. */
#include <math.h>
#include <string.h>

#include "op_util.h"
#include "ops_families.h"
#include "../autodiff/grad.h"
#include "../codegen/cg.h"

/* Folds a single-input data movement op: out[e] = in[map(e)]. */
typedef int64_t (*IndexMap)(const Node *n, int64_t out_flat, const void *ctx);

static FoldResult fold_map(OpCtx *c, Node *n, IndexMap map, const void *ctx) {
    const Value *x = n->in[0];
    if (!in_const(n, 0) || !value_shape_known(x) || !value_shape_known(n->out[0])) return FOLD_NO;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t e = 0; e < r->n; e++)
        if (!const_copy_elem(c->g, r, e, x->konst, map ? map(n, e, ctx) : e)) return FOLD_NO;
    return FOLD_DONE;
}

/* Reshape, Flatten, Squeeze, Unsqueeze keep element order. */
static FoldResult fold_same_order(OpCtx *c, Node *n) { return fold_map(c, n, NULL, NULL); }

/* Axes given by attribute before `input_since`, by input `slot` after. */
static int read_axes(OpCtx *c, const Node *n, int64_t input_since, int slot, int64_t *axes) {
    if (c->opset >= input_since) {
        if (slot >= n->n_in || !n->in[slot]) return -3; /* absent */
        return in_ints(n, slot, axes, MAX_RANK * 2);
    }
    const int64_t *a;
    int k = node_attr_ints(n, "axes", &a);
    if (k < 0) return -3;
    if (k > MAX_RANK * 2) return -2;
    memcpy(axes, a, sizeof *a * (size_t)k);
    return k;
}

/* ---- Shape ---- */

/* The dims [start, end) that Shape reports: opset 15 added the attributes,
 * negative values count from the back, and both clamp to [0, rank].  'end'
 * has no default in the op table because it defaults to the rank. */
static void shape_window(const OpCtx *c, const Node *n, int rank, int64_t *start, int64_t *end) {
    const Attr *e = node_attr(n, "end");
    *start = c->opset >= 15 ? node_attr_i(n, "start", 0) : 0;
    *end = c->opset >= 15 && e ? e->i : rank;
    if (*start < 0) *start += rank;
    if (*end < 0) *end += rank;
    *start = *start < 0 ? 0 : *start > rank ? rank : *start;
    *end = *end < *start ? *start : *end > rank ? rank : *end;
}

static bool infer_shape(OpCtx *c, Node *n) {
    int64_t start, end;
    shape_window(c, n, n->in[0]->rank, &start, &end);
    Dim len = dim_const(end - start);
    set_out(n, 0, DT_INT64, 1, &len);
    return true;
}

static FoldResult fold_shape(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t start, end;
    shape_window(c, n, x->rank, &start, &end);
    for (int64_t i = start; i < end; i++)
        if (x->dims[i].sym == DIM_UNKNOWN) return FOLD_NO;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t i = 0; i < r->n; i++) {
        Dim d = x->dims[start + i];
        const_set_i(r, i, d.k);
        if (d.sym) {
            if (!r->sym) r->sym = ARENA_ARRAY(&c->g->arena, int32_t, r->n);
            if (!r->sym) return FOLD_NO;
            r->sym[i] = d.sym;
        }
    }
    return FOLD_DONE;
}

/* ---- Size ---- */

static bool infer_size(OpCtx *c, Node *n) {
    (void)c;
    set_out(n, 0, DT_INT64, 0, NULL);
    return true;
}

/* The element count; symbolic when one dimension is. */
static FoldResult fold_size(OpCtx *c, Node *n) {
    Dim total;
    if (!dims_product(n->in[0]->dims, n->in[0]->rank, &total)) return FOLD_NO;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    const_set_i(r, 0, total.k);
    if (total.sym) {
        r->sym = ARENA_ARRAY(&c->g->arena, int32_t, 1);
        if (!r->sym) return FOLD_NO;
        r->sym[0] = total.sym;
    }
    return FOLD_DONE;
}

/* ---- Reshape ---- */

static bool infer_reshape(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t target[MAX_RANK];
    Dim tdims[MAX_RANK];
    int k;
    if (c->opset >= 5 && (n->n_in < 2 || !n->in[1]))
        return op_error(c, n, "the shape input is required from opset 5");
    if (c->opset < 5) {
        const int64_t *a;
        k = node_attr_ints(n, "shape", &a);
        if (k > MAX_RANK) return op_error(c, n, "target rank %d exceeds %d", k, MAX_RANK);
        for (int i = 0; i < k; i++) tdims[i] = dim_const(a[i]);
    } else {
        const Value *s = n->in[1];
        if (s->rank != 1) return op_error(c, n, "shape input '%s' must be 1-D", s->name);
        if (!dim_is_const(s->dims[0])) { set_out(n, 0, x->dtype, -1, NULL); return true; }
        k = (int)s->dims[0].k;
        if (k > MAX_RANK) return op_error(c, n, "target rank %d exceeds %d", k, MAX_RANK);
        if (!in_const(n, 1)) {
            set_out_unknown(n, 0, x->dtype, k);
            return true;
        }
        for (int i = 0; i < k; i++) tdims[i] = const_get_dim(s->konst, i);
    }
    if (k < 0) return op_error(c, n, "no target shape");
    bool allowzero = node_attr_i(n, "allowzero", 0) != 0;
    int infer_at = -1;
    for (int i = 0; i < k; i++) {
        target[i] = tdims[i].k;
        if (dim_is_const(tdims[i]) && target[i] == 0 && !allowzero) {
            if (i >= x->rank) return op_error(c, n, "shape entry %d is 0 (copy) but the input has rank %d", i, x->rank);
            tdims[i] = x->dims[i];
        } else if (dim_is_const(tdims[i]) && target[i] == -1) {
            if (infer_at >= 0) return op_error(c, n, "more than one -1 in the target shape");
            infer_at = i;
        } else if (dim_is_const(tdims[i]) && target[i] < 0) {
            return op_error(c, n, "invalid target dimension %lld", (long long)target[i]);
        }
    }
    Dim total;
    if (!dims_product(x->dims, x->rank, &total)) {
        if (infer_at >= 0) tdims[infer_at] = dim_unknown();
        set_out(n, 0, x->dtype, k, tdims);
        return true;
    }
    Dim known = dim_const(1);
    bool known_ok = true;
    for (int i = 0; i < k && known_ok; i++) {
        if (i == infer_at) continue;
        Dim p2[2] = {known, tdims[i]};
        known_ok = dims_product(p2, 2, &known);
    }
    if (infer_at >= 0) {
        /* total = t.k * S^a, known = q.k * S^b: the quotient must be a
         * whole multiple of at most one symbol */
        if (!known_ok || known.k == 0 || (known.sym && known.sym != total.sym) || total.k % known.k) {
            if (known_ok && known.k && !known.sym && !total.sym && total.k % known.k)
                return op_error(c, n, "cannot reshape %lld elements into a shape with %lld elements per -1",
                                (long long)total.k, (long long)known.k);
            tdims[infer_at] = dim_unknown();
        } else {
            tdims[infer_at] = (Dim){total.k / known.k, known.sym ? 0 : total.sym};
        }
    } else if (known_ok && dim_is_const(known) && dim_is_const(total) && known.k != total.k) {
        if (c->g->file_batch)
            return op_error(c, n, "cannot reshape %lld elements into %lld: the model was exported for a batch of "
                            "%lld and runs %lld rows at a time here (per replica and micro-batch), and the target "
                            "shape may hold the exported batch; export with dynamic_axes={'%s': {0: 'batch'}}",
                            (long long)total.k, (long long)known.k, (long long)c->g->file_batch,
                            (long long)c->g->bound_batch, c->g->n_inputs ? c->g->inputs[0]->name : "input");
        return op_error(c, n, "cannot reshape %lld elements into %lld", (long long)total.k, (long long)known.k);
    }
    set_out(n, 0, x->dtype, k, tdims);
    return true;
}

/* ---- Flatten ---- */

static bool infer_flatten(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t axis = node_attr_i(n, "axis", 1);
    if (axis < -x->rank || axis > x->rank)
        return op_error(c, n, "axis %lld is out of range for rank %d", (long long)axis, x->rank);
    if (axis < 0) axis += x->rank;
    Dim out[2];
    if (!dims_product(x->dims, (int)axis, &out[0])) out[0] = dim_unknown();
    if (!dims_product(x->dims + axis, x->rank - (int)axis, &out[1])) out[1] = dim_unknown();
    set_out(n, 0, x->dtype, 2, out);
    return true;
}

/* ---- Squeeze / Unsqueeze ---- */

static bool infer_squeeze(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t axes[MAX_RANK * 2];
    int k = read_axes(c, n, 13, 1, axes);
    if (k == -2) return op_error(c, n, "too many axes");
    bool drop[MAX_RANK] = {0};
    if (k == -1) { set_out(n, 0, x->dtype, -1, NULL); return true; }
    if (k == -3) { /* no axes: every dimension of size 1 */
        for (int i = 0; i < x->rank; i++) {
            if (x->dims[i].sym == DIM_UNKNOWN) { set_out(n, 0, x->dtype, -1, NULL); return true; }
            drop[i] = dim_is_const(x->dims[i]) && x->dims[i].k == 1;
        }
    }
    for (int i = 0; i < k; i++) {
        if (!norm_axis(c, n, &axes[i], x->rank)) return false;
        Dim d = x->dims[axes[i]];
        if (dim_is_const(d) && d.k != 1)
            return op_error(c, n, "cannot squeeze axis %lld of size %lld", (long long)axes[i], (long long)d.k);
        drop[axes[i]] = true;
    }
    Dim out[MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i]) out[r++] = x->dims[i];
    set_out(n, 0, x->dtype, r, out);
    return true;
}

static bool infer_unsqueeze(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t axes[MAX_RANK * 2];
    int k = read_axes(c, n, 13, 1, axes);
    if (k == -3) return op_error(c, n, "axes are required");
    if (k == -2 || (k >= 0 && x->rank + k > MAX_RANK)) return op_error(c, n, "result rank exceeds %d", MAX_RANK);
    if (k < 0) { set_out(n, 0, x->dtype, -1, NULL); return true; }
    int r = x->rank + k;
    bool ins[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        if (!norm_axis(c, n, &axes[i], r)) return false;
        if (ins[axes[i]]) return op_error(c, n, "axis %lld is repeated", (long long)axes[i]);
        ins[axes[i]] = true;
    }
    Dim out[MAX_RANK];
    for (int i = 0, j = 0; i < r; i++) out[i] = ins[i] ? dim_const(1) : x->dims[j++];
    set_out(n, 0, x->dtype, r, out);
    return true;
}

/* ---- Transpose ---- */

static int read_perm(const Node *n, int rank, int64_t *perm) {
    const int64_t *p;
    int k = node_attr_ints(n, "perm", &p);
    if (k < 0) {
        for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
        return rank;
    }
    for (int i = 0; i < k && i < MAX_RANK; i++) perm[i] = p[i];
    return k;
}

static bool infer_transpose(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t perm[MAX_RANK];
    int k = read_perm(n, x->rank, perm);
    if (k != x->rank) return op_error(c, n, "perm has %d entries for rank %d", k, x->rank);
    bool seen[MAX_RANK] = {0};
    Dim out[MAX_RANK];
    for (int i = 0; i < k; i++) {
        if (perm[i] < 0 || perm[i] >= k || seen[perm[i]])
            return op_error(c, n, "perm is not a permutation of 0..%d", k - 1);
        seen[perm[i]] = true;
        out[i] = x->dims[perm[i]];
    }
    set_out(n, 0, x->dtype, k, out);
    return true;
}

static int64_t map_transpose(const Node *n, int64_t e, const void *ctx) {
    (void)ctx;
    const Value *x = n->in[0], *y = n->out[0];
    int64_t perm[MAX_RANK], xs[MAX_RANK], src = 0;
    read_perm(n, x->rank, perm);
    shape_strides(x, xs);
    for (int i = y->rank - 1; i >= 0; i--) {
        src += (e % y->dims[i].k) * xs[perm[i]];
        e /= y->dims[i].k;
    }
    return src;
}

static FoldResult fold_transpose(OpCtx *c, Node *n) { return fold_map(c, n, map_transpose, NULL); }

/* ---- Concat ---- */

/* 'axis' is required since opset 4; Concat-1 defaulted it to 1. */
static int64_t concat_axis(const OpCtx *c, const Node *n) {
    const Attr *a = node_attr(n, "axis");
    return a ? a->i : c->opset < 4 ? 1 : 0;
}

static bool infer_concat(OpCtx *c, Node *n) {
    const Value *x0 = n->in[0];
    int64_t axis = concat_axis(c, n);
    if (!node_attr(n, "axis") && c->opset >= 4) return op_error(c, n, "attribute 'axis' is required");
    if (!norm_axis(c, n, &axis, x0->rank)) return false;
    DType t;
    if (!same_dtype(c, n, 0, n->n_in, &t)) return false;
    Dim out[MAX_RANK];
    memcpy(out, x0->dims, sizeof out);
    out[axis] = dim_const(0);
    for (int i = 0; i < n->n_in; i++) {
        const Value *x = n->in[i];
        if (!x) continue;
        if (x->rank != x0->rank)
            return op_error(c, n, "input '%s' has rank %d, expected %d", x->name, x->rank, x0->rank);
        for (int j = 0; j < x->rank; j++) {
            if (j == axis) continue;
            if (dim_is_const(x->dims[j]) && dim_is_const(out[j]) && x->dims[j].k != out[j].k)
                return op_error(c, n, "input '%s' has dimension %d = %lld, expected %lld", x->name, j,
                                (long long)x->dims[j].k, (long long)out[j].k);
            if (!dim_is_const(out[j])) out[j] = x->dims[j];
        }
        Dim a = out[axis], b = x->dims[axis];
        if (a.sym == DIM_UNKNOWN || b.sym == DIM_UNKNOWN) out[axis] = dim_unknown();
        else if (a.sym == b.sym || a.k == 0 || b.k == 0) {
            int64_t sum;
            if (__builtin_add_overflow(a.k, b.k, &sum))
                return op_error(c, n, "the concatenated dimension overflows");
            out[axis] = (Dim){sum, a.sym ? a.sym : b.sym};
        }
        else out[axis] = dim_unknown();
    }
    set_out(n, 0, t, x0->rank, out);
    return true;
}

static FoldResult fold_concat(OpCtx *c, Node *n) {
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && (!in_const(n, i) || !value_shape_known(n->in[i]))) return FOLD_NO;
    const Value *y = n->out[0];
    if (!value_shape_known(y)) return FOLD_NO;
    int64_t axis = concat_axis(c, n);
    if (axis < 0) axis += y->rank;
    int64_t outer = 1, inner = 1;
    for (int j = 0; j < axis; j++) outer *= y->dims[j].k;
    for (int j = (int)axis + 1; j < y->rank; j++) inner *= y->dims[j].k;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    int64_t e = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < n->n_in; i++) {
            const Value *x = n->in[i];
            if (!x) continue;
            int64_t chunk = x->dims[axis].k * inner;
            for (int64_t q = 0; q < chunk; q++)
                if (!const_copy_elem(c->g, r, e++, x->konst, o * chunk + q)) return FOLD_NO;
        }
    return FOLD_DONE;
}

/* ---- Slice ---- */

typedef struct SliceSpec {
    int64_t start[MAX_RANK], step[MAX_RANK];
} SliceSpec;

/* Resolves starts/ends/axes/steps into per-axis start and step of the
 * output and sets its dims; false with *err on invalid input, false
 * without it when the parameters are not constant. */
static bool slice_params(OpCtx *c, const Node *n, SliceSpec *sp, Dim *out, bool *err) {
    const Value *x = n->in[0];
    int64_t starts[MAX_RANK * 2], ends[MAX_RANK * 2], axes[MAX_RANK * 2], steps[MAX_RANK * 2];
    int ks, ke, ka, kt;
    *err = false;
    /* Slice-1 takes starts, ends and axes as attributes, Slice-10 on as
     * inputs.  The node's inputs say which: a gradient rule builds the
     * input form whatever the model's opset. */
    if (n->n_in < 2 || !n->in[1]) {
        const int64_t *p;
        ks = node_attr_ints(n, "starts", &p);
        if (ks > 0 && ks <= MAX_RANK) memcpy(starts, p, sizeof *p * (size_t)ks);
        ke = node_attr_ints(n, "ends", &p);
        if (ke > 0 && ke <= MAX_RANK) memcpy(ends, p, sizeof *p * (size_t)ke);
        ka = node_attr_ints(n, "axes", &p);
        if (ka > 0 && ka <= MAX_RANK) memcpy(axes, p, sizeof *p * (size_t)ka);
        kt = -3;
    } else {
        ks = in_ints(n, 1, starts, MAX_RANK * 2);
        ke = in_ints(n, 2, ends, MAX_RANK * 2);
        ka = n->n_in > 3 && n->in[3] ? in_ints(n, 3, axes, MAX_RANK * 2) : -3;
        kt = n->n_in > 4 && n->in[4] ? in_ints(n, 4, steps, MAX_RANK * 2) : -3;
        if (ks == -1 || ke == -1 || ka == -1 || kt == -1) return false;
    }
    if (ks < 0 || ke != ks || ks > x->rank || (ka >= 0 && ka != ks) || (kt >= 0 && kt != ks)) {
        *err = true;
        return op_error((OpCtx *)c, n, "starts, ends, axes and steps must have equal lengths up to the rank");
    }
    if (ka < 0) for (int i = 0; i < ks; i++) axes[i] = i;
    if (kt < 0) for (int i = 0; i < ks; i++) steps[i] = 1;
    for (int j = 0; j < x->rank; j++) {
        out[j] = x->dims[j];
        sp->start[j] = 0;
        sp->step[j] = 1;
    }
    bool seen[MAX_RANK] = {0};
    for (int i = 0; i < ks; i++) {
        int64_t a = axes[i];
        if (!norm_axis(c, n, &a, x->rank)) {
            *err = true;
            return false;
        }
        if (seen[a]) {
            *err = true;
            return op_error(c, n, "axis %lld repeated", (long long)a);
        }
        seen[a] = true;
        if (steps[i] == 0) { *err = true; return op_error(c, n, "step is 0"); }
        Dim d = x->dims[a];
        int64_t s = starts[i], e = ends[i], st = steps[i];
        if (!dim_is_const(d)) {
            /* A full slice of a symbolic dimension keeps it. */
            if (s == 0 && st == 1 && e >= INT32_MAX) continue;
            out[a] = dim_unknown();
            continue;
        }
        int64_t len = d.k;
        if (s < 0) s += len;
        if (e < 0) e += len;
        /* Clamping as ONNX specifies: forward, start and end to [0, len];
         * backward, start to [0, len-1] and end to [-1, len-1]. */
        if (st > 0) {
            s = s < 0 ? 0 : s > len ? len : s;
            e = e < 0 ? 0 : e > len ? len : e;
            out[a] = dim_const(e > s ? (e - s + st - 1) / st : 0);
        } else {
            s = s > len - 1 ? len - 1 : s < 0 ? 0 : s;
            e = e < -1 ? -1 : e > len - 1 ? len - 1 : e;
            out[a] = dim_const(s > e ? (s - e - st - 1) / -st : 0);
        }
        sp->start[a] = s;
        sp->step[a] = st;
    }
    return true;
}

static bool infer_slice(OpCtx *c, Node *n) {
    SliceSpec sp;
    Dim out[MAX_RANK];
    bool err;
    if (!slice_params(c, n, &sp, out, &err)) {
        if (err) return false;
        set_out_unknown(n, 0, n->in[0]->dtype, n->in[0]->rank);
        return true;
    }
    set_out(n, 0, n->in[0]->dtype, n->in[0]->rank, out);
    return true;
}

static int64_t map_slice(const Node *n, int64_t e, const void *ctx) {
    const SliceSpec *sp = ctx;
    const Value *x = n->in[0], *y = n->out[0];
    int64_t xs[MAX_RANK], src = 0;
    shape_strides(x, xs);
    for (int i = y->rank - 1; i >= 0; i--) {
        int64_t coord = e % y->dims[i].k;
        e /= y->dims[i].k;
        src += (sp->start[i] + coord * sp->step[i]) * xs[i];
    }
    return src;
}

static FoldResult fold_slice(OpCtx *c, Node *n) {
    SliceSpec sp;
    Dim out[MAX_RANK];
    bool err;
    if (!slice_params(c, n, &sp, out, &err)) return err ? FOLD_ERROR : FOLD_NO;
    return fold_map(c, n, map_slice, &sp);
}

/* ---- Pad ---- */

typedef enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP } PadMode;
static const char *const pad_modes[] = {"constant", "reflect", "edge", "wrap"};

/* Pads of every axis, before and after it; negative ones crop. */
typedef struct PadSpec {
    PadMode mode;
    int64_t begin[MAX_RANK], end[MAX_RANK];
} PadSpec;

/* Reads the mode and the pads of each of r axes: from the pads input
 * (opset 11 on, with opset 18's optional axes input) or, when the node has
 * none, the attribute (Pad before opset 11, and cleave.PadGrad, which the
 * gradient rule builds in that form).  false with *err on invalid ones,
 * without it when they are not constant. */
static bool pad_params(OpCtx *c, const Node *n, int r, PadSpec *p, bool *err) {
    int64_t pads[MAX_RANK * 2], axes[MAX_RANK];
    int k, ka = -3;
    *err = true;
    if (n->n_in > 1 && n->in[1]) {
        k = in_ints(n, 1, pads, MAX_RANK * 2);
        if (n->n_in > 3 && n->in[3]) ka = in_ints(n, 3, axes, MAX_RANK);
        if (k == -1 || ka == -1) {
            *err = false;
            return false;
        }
    } else {
        const int64_t *a;
        k = node_attr_ints(n, "pads", &a);
        if (k < 0) return op_error(c, n, "pads are missing");
        if (k <= MAX_RANK * 2) memcpy(pads, a, sizeof *a * (size_t)k);
    }
    if (k == -2 || ka == -2) return op_error(c, n, "pads and axes cover more than %d axes", MAX_RANK);
    int na = ka >= 0 ? ka : r;
    if (k != 2 * na)
        return op_error(c, n, "pads has %d entries; a begin and an end for each of %d axes (%d) expected", k, na,
                        2 * na);
    const char *mode = node_attr_s(n, "mode", "constant");
    int m = 0;
    while (m <= PAD_WRAP && strcmp(mode, pad_modes[m])) m++;
    if (m > PAD_WRAP) return op_error(c, n, "unknown mode '%s' (constant, reflect, edge or wrap)", mode);
    p->mode = (PadMode)m;
    for (int j = 0; j < r; j++) p->begin[j] = p->end[j] = 0;
    bool seen[MAX_RANK] = {0};
    for (int i = 0; i < na; i++) {
        int64_t a = ka >= 0 ? axes[i] : i;
        if (!norm_axis(c, n, &a, r)) return false;
        if (seen[a]) return op_error(c, n, "axis %lld repeated", (long long)a);
        seen[a] = true;
        /* Bounded so that negating, adding and comparing pads cannot
         * overflow; no tensor axis comes near 2^31 elements of padding. */
        for (int e = 0; e < 2; e++) {
            int64_t v = pads[i + e * na];
            if (v < -INT32_MAX || v > INT32_MAX)
                return op_error(c, n, "pad %lld on axis %lld is out of range (at most 2^31-1 either way)",
                                (long long)v, (long long)a);
        }
        p->begin[a] = pads[i];
        p->end[a] = pads[na + i];
    }
    return true;
}

/* Axis j of length len: the window [*crop, *crop + *kept) of x that
 * negative pads leave, and the padding *lead before it. */
static void pad_window(const PadSpec *p, int j, int64_t len, int64_t *crop, int64_t *kept, int64_t *lead) {
    int64_t b = p->begin[j], e = p->end[j];
    *crop = b < 0 ? -b : 0;
    *kept = len - *crop - (e < 0 ? -e : 0);
    *lead = b > 0 ? b : 0;
}

/* Position in x (length len along axis j) that padded position o reads;
 * -1 where the constant mode fills.  Reflection stays within one period:
 * pad_length allows no more. */
static int64_t pad_source(const PadSpec *p, int j, int64_t len, int64_t o) {
    int64_t crop, kept, lead;
    pad_window(p, j, len, &crop, &kept, &lead);
    int64_t i = o - lead;
    if (i < 0 || i >= kept) {
        switch (p->mode) {
        case PAD_CONSTANT: return -1;
        case PAD_EDGE: i = i < 0 ? 0 : kept - 1; break;
        case PAD_REFLECT: i = i < 0 ? -i : 2 * (kept - 1) - i; break;
        case PAD_WRAP: i = (i % kept + kept) % kept; break;
        }
    }
    return crop + i;
}

/* Length of the padded axis j of x.  The pads must leave something of
 * the axis to copy when the mode copies, and reflect within one period of
 * it, as PyTorch requires (ONNX's reference reflects again beyond). */
static bool pad_length(OpCtx *c, const Node *n, const PadSpec *p, int j, Dim d, Dim *out) {
    int64_t b = p->begin[j], e = p->end[j], crop, kept, lead, len;
    if (b == 0 && e == 0) {
        *out = d;
        return true;
    }
    if (!dim_is_const(d)) {
        *out = dim_unknown();
        return true;
    }
    pad_window(p, j, d.k, &crop, &kept, &lead);
    if (kept < 0)
        return op_error(c, n, "pads %lld and %lld crop more than the %lld elements of axis %d", (long long)b,
                        (long long)e, (long long)d.k, j);
    if (__builtin_add_overflow(d.k, b, &len) || __builtin_add_overflow(len, e, &len))
        return op_error(c, n, "the padded length of axis %d overflows", j);
    int64_t most = b > e ? b : e;
    if (p->mode != PAD_CONSTANT && most > 0 && kept == 0)
        return op_error(c, n, "%s padding of axis %d, which has no elements left to copy", pad_modes[p->mode], j);
    if (p->mode == PAD_REFLECT && most >= kept)
        return op_error_kind(c, n, DIAG_UNSUPPORTED,
                             "reflect padding by %lld on axis %d needs more than %lld elements there (PyTorch's limit; "
                             "cleave reflects once)", (long long)most, j, (long long)kept);
    *out = dim_const(len);
    return true;
}

static bool infer_pad(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *v = n->n_in > 2 ? n->in[2] : NULL;
    if (v && v->dtype != DT_UNDEFINED && v->dtype != x->dtype)
        return op_error(c, n, "constant_value '%s' is %s but '%s' is %s", v->name, dtype_name(v->dtype), x->name,
                        dtype_name(x->dtype));
    if (v && value_numel(v) != 1) return op_error(c, n, "constant_value '%s' must be a scalar (one element)", v->name);
    PadSpec p;
    bool err;
    if (!pad_params(c, n, x->rank, &p, &err)) {
        if (err) return false;
        set_out_unknown(n, 0, x->dtype, x->rank);
        return true;
    }
    Dim out[MAX_RANK];
    for (int j = 0; j < x->rank; j++)
        if (!pad_length(c, n, &p, j, x->dims[j], &out[j])) return false;
    set_out(n, 0, x->dtype, x->rank, out);
    return true;
}

/* Flat index in x that element e of the padded y reads, -1 for the fill. */
static int64_t pad_source_flat(const PadSpec *p, const Value *x, const Value *y, int64_t e) {
    int64_t xs[MAX_RANK], src = 0;
    shape_strides(x, xs);
    for (int j = y->rank - 1; j >= 0; j--) {
        int64_t i = pad_source(p, j, x->dims[j].k, e % y->dims[j].k);
        if (i < 0) return -1;
        src += i * xs[j];
        e /= y->dims[j].k;
    }
    return src;
}

static FoldResult fold_pad(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *y = n->out[0], *v = n->n_in > 2 ? n->in[2] : NULL;
    if (!in_const(n, 0) || !value_shape_known(x) || !value_shape_known(y) || (v && !in_const(n, 2))) return FOLD_NO;
    PadSpec p;
    bool err;
    if (!pad_params(c, n, x->rank, &p, &err)) return err ? FOLD_ERROR : FOLD_NO;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t e = 0; e < r->n; e++) {
        int64_t src = pad_source_flat(&p, x, y, e);
        if (src >= 0 || v) {
            if (!const_copy_elem(c->g, r, e, src >= 0 ? x->konst : v->konst, src >= 0 ? src : 0)) return FOLD_NO;
        } else {
            const_set_f(r, e, node_attr_f(n, "value", 0));
        }
    }
    return FOLD_DONE;
}

/* ---- Split ---- */

/* Length of output k's part of an axis of length len (-1: unknown):
 * `split` when given (the input, or the attribute before opset 13), else
 * equal parts, the last one smaller from opset 18 (num_outputs). */
static int64_t split_part(const Node *n, const Const *split, const int64_t *split_attr, int k, int64_t len) {
    if (split) return const_get_i(split, k);
    if (split_attr) return split_attr[k];
    if (len < 0) return -1;
    int64_t chunk = (len + n->n_out - 1) / n->n_out;
    return k < n->n_out - 1 ? chunk : len - chunk * (n->n_out - 1);
}

static bool infer_split(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    int64_t axis = node_attr_i(n, "axis", 0);
    if (!norm_axis(c, n, &axis, x->rank)) return false;
    Dim d = x->dims[axis];
    int64_t len = dim_is_const(d) ? d.k : -1;
    const Const *split = NULL;
    const int64_t *split_attr = NULL;
    int count = -1;
    for (int k = 0; k < n->n_out; k++)
        if (!n->out[k]) return op_error_kind(c, n, DIAG_UNSUPPORTED, "output %d is omitted", k);
    if (n->n_in > 1 && n->in[1]) {
        if (!in_const(n, 1) || n->in[1]->konst->sym) {
            for (int k = 0; k < n->n_out; k++) set_out_unknown(n, k, x->dtype, x->rank);
            return true;
        }
        split = n->in[1]->konst;
        count = (int)split->n;
    } else if (node_attr(n, "split")) {
        count = node_attr_ints(n, "split", &split_attr);
    } else if (c->opset >= 18) {
        const Attr *a = node_attr(n, "num_outputs");
        if (!a) return op_error(c, n, "either the split input or attribute 'num_outputs' is required from opset 18");
        if (a->i != n->n_out)
            return op_error(c, n, "num_outputs is %lld but the node has %d outputs", (long long)a->i, n->n_out);
    } else if (len >= 0 && len % n->n_out) {
        return op_error(c, n, "axis %lld of length %lld does not split into %d equal parts", (long long)axis,
                        (long long)len, n->n_out);
    }
    if (count >= 0 && count != n->n_out)
        return op_error(c, n, "split has %d parts for %d outputs", count, n->n_out);
    int64_t sum = 0;
    for (int k = 0; k < n->n_out; k++) {
        int64_t part = split_part(n, split, split_attr, k, len);
        if (part < 0 && (split || split_attr || len >= 0))
            return op_error(c, n, "part %d of axis %lld has length %lld", k, (long long)axis, (long long)part);
        if (part >= 0 && __builtin_add_overflow(sum, part, &sum)) return op_error(c, n, "the parts' lengths overflow");
        Dim out[MAX_RANK];
        memcpy(out, x->dims, sizeof out);
        out[axis] = part >= 0 ? dim_const(part) : dim_unknown();
        set_out(n, k, x->dtype, x->rank, out);
    }
    if (len >= 0 && sum != len)
        return op_error(c, n, "the parts sum to %lld but axis %lld has length %lld", (long long)sum, (long long)axis,
                        (long long)len);
    return true;
}

/* Each output is its stretch of x along the axis, the part lengths being
 * the outputs' own. */
static FoldResult fold_split(OpCtx *c, Node *n) {
    const Value *x = n->in[0];
    if (!in_const(n, 0) || !value_shape_known(x)) return FOLD_NO;
    for (int k = 0; k < n->n_out; k++)
        if (!value_shape_known(n->out[k])) return FOLD_NO;
    int64_t axis = node_attr_i(n, "axis", 0), outer, len, inner, at = 0;
    if (axis < 0) axis += x->rank;
    cg_axis_split(x, (int)axis, &outer, &len, &inner);
    for (int k = 0; k < n->n_out; k++) {
        int64_t part = n->out[k]->dims[axis].k;
        Const *r = fold_out(c, n, k);
        if (!r) return FOLD_NO;
        for (int64_t e = 0; e < r->n; e++) {
            int64_t o = e / (part * inner), rest = e % (part * inner);
            if (!const_copy_elem(c->g, r, e, x->konst, (o * len + at) * inner + rest)) return FOLD_NO;
        }
        at += part;
    }
    return FOLD_DONE;
}

/* ---- gradient ops: SliceGrad(dy), PadGrad(dy) ---- */

/* dx has the shape the slice was taken from (attribute 'shape'). */
/* dx has dy's shape without the pads; only the modes that copy x need
 * this op (constant padding's gradient is a Pad). */
static bool infer_pad_grad(OpCtx *c, Node *n) {
    const Value *dy = n->in[0];
    PadSpec p;
    bool err;
    if (!pad_params(c, n, dy->rank, &p, &err)) return false;
    CLEAVE_CHECK(p.mode != PAD_CONSTANT, "PadGrad of constant padding");
    Dim out[MAX_RANK];
    for (int j = 0; j < dy->rank; j++) out[j] = dim_const(dy->dims[j].k - p.begin[j] - p.end[j]);
    set_out(n, 0, dy->dtype, dy->rank, out);
    return true;
}

/* ---- Expand ---- */

static bool infer_expand(OpCtx *c, Node *n) {
    const Value *x = n->in[0], *s = n->in[1];
    if (s->rank != 1 || !dim_is_const(s->dims[0]))
        return op_error(c, n, "shape input '%s' must be 1-D with a known length", s->name);
    int k = (int)s->dims[0].k;
    if (k > MAX_RANK) return op_error(c, n, "target rank %d exceeds %d", k, MAX_RANK);
    int r = k > x->rank ? k : x->rank;
    if (!in_const(n, 1)) {
        set_out_unknown(n, 0, x->dtype, r);
        return true;
    }
    /* Broadcast the input against a temporary value holding the shape. */
    Value tmp = {.name = s->name, .rank = k};
    for (int i = 0; i < k; i++) tmp.dims[i] = const_get_dim(s->konst, i);
    Node probe = *n;
    Value *ins[2] = {n->in[0], &tmp};
    probe.in = ins;
    probe.n_in = 2;
    Dim out[MAX_RANK];
    if (!broadcast_inputs(c, &probe, 0, 2, out, &r)) return false;
    set_out(n, 0, x->dtype, r, out);
    return true;
}

static int64_t map_expand(const Node *n, int64_t e, const void *ctx) {
    (void)ctx;
    return broadcast_src_index(n->out[0], n->in[0], e);
}

static FoldResult fold_expand(OpCtx *c, Node *n) { return fold_map(c, n, map_expand, NULL); }

/* ---- Constant ---- */

static bool infer_constant(OpCtx *c, Node *n) {
    if (n->n_attr != 1) return op_error(c, n, "exactly one value attribute is required, found %d", n->n_attr);
    const Attr *a = &n->attrs[0];
    Value *y = n->out[0];
    if (strcmp(a->name, "value") == 0 && a->tensor) {
        set_out(n, 0, a->tensor->dtype, a->tensor->rank, a->tensor->dims);
    } else if (strcmp(a->name, "value_float") == 0 || strcmp(a->name, "value_int") == 0) {
        set_out(n, 0, a->name[6] == 'f' ? DT_FLOAT : DT_INT64, 0, NULL);
    } else if (strcmp(a->name, "value_floats") == 0 || strcmp(a->name, "value_ints") == 0) {
        Dim d = dim_const(a->n);
        set_out(n, 0, a->name[6] == 'f' ? DT_FLOAT : DT_INT64, 1, &d);
    } else {
        return op_error_kind(c, n, DIAG_UNSUPPORTED, "attribute '%s' is not supported", a->name);
    }
    (void)y;
    return true;
}

static FoldResult fold_constant(OpCtx *c, Node *n) {
    const Attr *a = &n->attrs[0];
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t i = 0; i < r->n; i++) {
        if (a->tensor) const_copy_elem(c->g, r, i, a->tensor->konst, i);
        else if (a->kind == ATTR_FLOAT) const_set_f(r, i, a->f);
        else if (a->kind == ATTR_INT) const_set_i(r, i, a->i);
        else if (a->kind == ATTR_FLOATS) const_set_f(r, i, a->floats[i]);
        else const_set_i(r, i, a->ints[i]);
    }
    return FOLD_DONE;
}

/* ---- ConstantOfShape ---- */

static bool infer_constant_of_shape(OpCtx *c, Node *n) {
    const Attr *a = node_attr(n, "value");
    DType t = a && a->tensor ? a->tensor->dtype : DT_FLOAT;
    if (a && a->tensor && a->tensor->konst->n != 1) return op_error(c, n, "'value' must hold one element");
    const Value *s = n->in[0];
    if (s->rank != 1 || !dim_is_const(s->dims[0]) || s->dims[0].k > MAX_RANK)
        return op_error(c, n, "shape input must be 1-D with at most %d entries", MAX_RANK);
    int k = (int)s->dims[0].k;
    Dim out[MAX_RANK];
    for (int i = 0; i < k; i++) {
        out[i] = in_const(n, 0) ? const_get_dim(s->konst, i) : dim_unknown();
        if (dim_is_const(out[i]) && out[i].k < 0) return op_error(c, n, "negative dimension %lld", (long long)out[i].k);
    }
    set_out(n, 0, t, k, out);
    return true;
}

static FoldResult fold_constant_of_shape(OpCtx *c, Node *n) {
    if (!value_shape_known(n->out[0])) return FOLD_NO;
    const Attr *a = node_attr(n, "value");
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t i = 0; i < r->n; i++)
        if (a && a->tensor) const_copy_elem(c->g, r, i, a->tensor->konst, 0);
    return FOLD_DONE;
}

/* ---- Range ---- */

/* The length is ceil((limit - start) / delta).  Inputs known only at run
 * time would make it data-dependent, which a static training program cannot
 * hold, so they are refused.  Symbolic inputs (from Shape of an unbound
 * batch) give a symbolic length only for Range(0, k*S, 1); other symbolic
 * forms stay unknown until the batch is bound. */
static bool infer_range(OpCtx *c, Node *n) {
    DType t;
    if (!same_dtype(c, n, 0, 3, &t)) return false;
    for (int i = 0; i < 3; i++)
        if (n->in[i]->rank != 0) return op_error(c, n, "input '%s' must be a scalar", n->in[i]->name);
    for (int i = 0; i < 3; i++)
        if (!in_const(n, i))
            return op_error_kind(c, n, DIAG_UNSUPPORTED,
                                 "input '%s' is known only at run time, so the output length is data-dependent; "
                                 "cleave needs start, limit and delta to be constants", n->in[i]->name);
    const Const *ks = n->in[0]->konst, *kl = n->in[1]->konst, *kd = n->in[2]->konst;
    Dim len = dim_unknown();
    if (ks->sym || kl->sym || kd->sym) {
        if (!ks->sym && !kd->sym && const_get_f(ks, 0) == 0 && const_get_f(kd, 0) == 1) len = const_get_dim(kl, 0);
    } else {
        double s = const_get_f(ks, 0), l = const_get_f(kl, 0), d = const_get_f(kd, 0);
        if (d == 0) return op_error(c, n, "delta is 0");
        double cnt = ceil((l - s) / d);
        if (!(cnt < 1e12)) return op_error(c, n, "range is too long");
        len = dim_const(cnt > 0 ? (int64_t)cnt : 0);
    }
    set_out(n, 0, t, 1, &len);
    return true;
}

static FoldResult fold_range(OpCtx *c, Node *n) {
    if (!value_shape_known(n->out[0])) return FOLD_NO;
    for (int i = 0; i < 3; i++)
        if (n->in[i]->konst->sym) return FOLD_NO;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    bool ints = r->store == DT_INT64;
    for (int64_t i = 0; i < r->n; i++) {
        if (ints) const_set_i(r, i, const_get_i(n->in[0]->konst, 0) + i * const_get_i(n->in[2]->konst, 0));
        else const_set_f(r, i, const_get_f(n->in[0]->konst, 0) + (double)i * const_get_f(n->in[2]->konst, 0));
    }
    return FOLD_DONE;
}

static double flops_zero(const Node *n) { (void)n; return 0; }

/* ---- code generation ---- */

static void dims_of(const Value *v, int64_t *d) {
    for (int j = 0; j < v->rank; j++) d[j] = v->dims[j].k;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: the bytes do not change. */
static bool k_same_order(Cg *c, const Node *n) {
    const Value *bufs[2] = {n->in[0], n->out[0]};
    if (!cg_kernel_begin(c, n, 2, bufs)) return false;
    cg_copy(c, n->out[0], n->in[0]);
    cg_kernel_end(c);
    return true;
}

static bool k_transpose(Cg *c, const Node *n) {
    const Value *x = n->in[0], *y = n->out[0];
    int64_t perm[MAX_RANK], xs[MAX_RANK], ys[MAX_RANK], src[MAX_RANK], d[MAX_RANK];
    read_perm(n, x->rank, perm);
    shape_strides(x, xs);
    shape_strides(y, ys);
    for (int j = 0; j < y->rank; j++) src[j] = xs[perm[j]];
    dims_of(y, d);
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_strided_copy(c, y, 0, ys, x, 0, src, y->rank, d);
    cg_kernel_end(c);
    return true;
}

/* Offset and strides in x of the elements a slice with these starts and
 * steps visits, in the order of the slice's own elements. */
static int64_t slice_walk(const Value *x, const int64_t *start, const int64_t *step, int64_t *strides) {
    int64_t xs[MAX_RANK], off = 0;
    shape_strides(x, xs);
    for (int j = 0; j < x->rank; j++) {
        off += start[j] * xs[j];
        strides[j] = step[j] * xs[j];
    }
    return off;
}

static bool k_slice(Cg *c, const Node *n) {
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    SliceSpec sp;
    Dim out[MAX_RANK];
    bool err;
    if (!slice_params(&oc, n, &sp, out, &err))
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Slice): parameters must be constant", c->g->path,
                          n->name);
    const Value *x = n->in[0], *y = n->out[0];
    int64_t ys[MAX_RANK], src[MAX_RANK], d[MAX_RANK];
    int64_t off = slice_walk(x, sp.start, sp.step, src);
    shape_strides(y, ys);
    dims_of(y, d);
    const Value *bufs[2] = {x, y};
    if (!cg_kernel_begin(c, n, 2, bufs)) return false;
    if (value_numel(y) > 0) cg_strided_copy(c, y, 0, ys, x, off, src, y->rank, d);
    cg_kernel_end(c);
    return true;
}

/* SliceGrad(dy) -> dx: zeros, and dy written where the slice read. */
static bool k_slice_grad(Cg *c, const Node *n) {
    const Value *dy = n->in[0], *dx = n->out[0];
    const int64_t *starts, *steps;
    node_attr_ints(n, "starts", &starts);
    node_attr_ints(n, "steps", &steps);
    int64_t ys[MAX_RANK], dst[MAX_RANK], d[MAX_RANK];
    int64_t off = slice_walk(dx, starts, steps, dst);
    shape_strides(dy, ys);
    dims_of(dy, d);
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dx, value_numel(dx), cg_f32(c, 0));
    if (value_numel(dy) > 0) cg_strided_copy(c, dx, off, dst, dy, 0, ys, dy->rank, d);
    cg_kernel_end(c);
    return true;
}

/* Pad's parameters at code generation, where they must be constant. */
static bool pad_spec_cg(Cg *c, const Node *n, int r, PadSpec *p) {
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    bool err;
    if (pad_params(&oc, n, r, p, &err)) return true;
    if (!err)
        diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (%s): pads and axes must be constant", c->g->path, n->name,
                   n->op_type);
    return false;
}

/* pad_source in the kernel, for the edge, reflect and wrap modes. */
static LLVMValueRef pad_source_v(Cg *c, const PadSpec *p, int j, int64_t len, LLVMValueRef o) {
    if (p->begin[j] == 0 && p->end[j] == 0) return o;
    int64_t crop, kept, lead;
    pad_window(p, j, len, &crop, &kept, &lead);
    LLVMValueRef i = LLVMBuildSub(c->b, o, cg_i64(c, lead), "");
    LLVMValueRef below = LLVMBuildICmp(c->b, LLVMIntSLT, i, cg_i64(c, 0), "");
    LLVMValueRef above = LLVMBuildICmp(c->b, LLVMIntSGE, i, cg_i64(c, kept), "");
    LLVMValueRef k = cg_i64(c, kept);
    switch (p->mode) {
    case PAD_EDGE:
        i = LLVMBuildSelect(c->b, below, cg_i64(c, 0), i, "");
        i = LLVMBuildSelect(c->b, above, cg_i64(c, kept - 1), i, "");
        break;
    case PAD_REFLECT:
        i = LLVMBuildSelect(c->b, below, LLVMBuildNeg(c->b, i, ""), i, "");
        i = LLVMBuildSelect(c->b, above, LLVMBuildSub(c->b, cg_i64(c, 2 * (kept - 1)), i, ""), i, "");
        break;
    default: /* wrap: (i mod kept), non-negative */
        i = LLVMBuildSRem(c->b, LLVMBuildAdd(c->b, LLVMBuildSRem(c->b, i, k, ""), k, ""), k, "");
        break;
    }
    return cg_add(c, i, cg_i64(c, crop));
}

/* Opens a loop over each axis of the padded value and sets *pi to its
 * element and *si to the element of `plain` (the unpadded shape) that it
 * reads; the caller closes the loops, innermost first. */
static void pad_nest(Cg *c, const PadSpec *p, const Value *padded, const Value *plain, CgLoop *loops,
                     LLVMValueRef *pi, LLVMValueRef *si) {
    int64_t xs[MAX_RANK];
    shape_strides(plain, xs);
    *pi = *si = cg_i64(c, 0);
    for (int j = 0; j < padded->rank; j++) {
        LLVMValueRef o = cg_for(c, &loops[j], cg_i64(c, padded->dims[j].k));
        *pi = cg_mad(c, *pi, padded->dims[j].k, o);
        *si = cg_add(c, *si, cg_mul(c, pad_source_v(c, p, j, plain->dims[j].k, o), xs[j]));
    }
}

/* Constant mode: y filled with the value, then x's window copied in. */
static void pad_fill_copy(Cg *c, const Node *n, const PadSpec *p) {
    const Value *x = n->in[0], *y = n->out[0], *v = n->n_in > 2 ? n->in[2] : NULL;
    bool fl = dtype_is_float(y->dtype);
    LLVMValueRef val = v ? (fl ? cg_load(c, v, cg_i64(c, 0)) : cg_load_i(c, v, cg_i64(c, 0)))
                         : fl ? cg_f32(c, node_attr_f(n, "value", 0)) : cg_i64(c, 0);
    int64_t xs[MAX_RANK], ys[MAX_RANK], d[MAX_RANK], xoff = 0, yoff = 0;
    shape_strides(x, xs);
    shape_strides(y, ys);
    bool grows = false, empty = false;
    for (int j = 0; j < x->rank; j++) {
        int64_t crop, lead;
        pad_window(p, j, x->dims[j].k, &crop, &d[j], &lead);
        xoff += crop * xs[j];
        yoff += lead * ys[j];
        grows |= p->begin[j] > 0 || p->end[j] > 0;
        empty |= d[j] == 0;
    }
    if (grows) cg_fill(c, y, value_numel(y), val);
    if (!empty) cg_strided_copy(c, y, yoff, ys, x, xoff, xs, x->rank, d);
}

static bool k_pad(Cg *c, const Node *n) {
    const Value *x = n->in[0], *y = n->out[0], *v = n->n_in > 2 ? n->in[2] : NULL;
    PadSpec p;
    if (!pad_spec_cg(c, n, x->rank, &p)) return false;
    const Value *bufs[3] = {x, y, v};
    if (!cg_kernel_begin(c, n, v ? 3 : 2, bufs)) return false;
    if (p.mode == PAD_CONSTANT) {
        pad_fill_copy(c, n, &p);
    } else if (value_numel(y) > 0) {
        CgLoop loops[MAX_RANK];
        LLVMValueRef yi, xi;
        pad_nest(c, &p, y, x, loops, &yi, &xi);
        cg_store(c, y, yi, dtype_is_float(x->dtype) ? cg_load(c, x, xi) : cg_load_i(c, x, xi));
        for (int j = y->rank - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    }
    cg_kernel_end(c);
    return true;
}

/* PadGrad(dy) -> dx: each element of dy added to the element of x it was
 * read from. */
static bool k_pad_grad(Cg *c, const Node *n) {
    const Value *dy = n->in[0], *dx = n->out[0];
    PadSpec p;
    if (!pad_spec_cg(c, n, dx->rank, &p)) return false;
    if (!cg_kernel_begin_io(c, n)) return false;
    cg_fill(c, dx, value_numel(dx), cg_f32(c, 0));
    if (value_numel(dy) > 0) {
        CgLoop loops[MAX_RANK];
        LLVMValueRef yi, xi;
        pad_nest(c, &p, dy, dx, loops, &yi, &xi);
        cg_store(c, dx, xi, LLVMBuildFAdd(c->b, cg_load(c, dx, xi), cg_load(c, dy, yi), ""));
        for (int j = dy->rank - 1; j >= 0; j--) cg_for_end(c, &loops[j]);
    }
    cg_kernel_end(c);
    return true;
}

/* Each output is its stretch of x along the axis. */
static bool k_split(Cg *c, const Node *n) {
    const Value *x = n->in[0];
    int64_t axis = node_attr_i(n, "axis", 0), xs[MAX_RANK], at = 0;
    if (axis < 0) axis += x->rank;
    shape_strides(x, xs);
    if (!cg_kernel_begin_io(c, n)) return false;
    for (int k = 0; k < n->n_out; k++) {
        const Value *y = n->out[k];
        int64_t ys[MAX_RANK], d[MAX_RANK];
        shape_strides(y, ys);
        dims_of(y, d);
        if (value_numel(y) > 0) cg_strided_copy(c, y, 0, ys, x, at * xs[axis], xs, x->rank, d);
        at += y->dims[axis].k;
    }
    cg_kernel_end(c);
    return true;
}

static bool k_concat(Cg *c, const Node *n) {
    const Value *y = n->out[0];
    int64_t axis = node_attr_i(n, "axis", graph_opset(c->g, "") < 4 ? 1 : 0);
    if (axis < 0) axis += y->rank;
    int64_t ys[MAX_RANK];
    shape_strides(y, ys);
    if (!cg_kernel_begin_io(c, n)) return false;
    int64_t at = 0;
    for (int i = 0; i < n->n_in; i++) {
        const Value *x = n->in[i];
        if (!x) continue;
        int64_t xs[MAX_RANK], d[MAX_RANK];
        shape_strides(x, xs);
        dims_of(x, d);
        if (value_numel(x) > 0) cg_strided_copy(c, y, at * ys[axis], ys, x, 0, xs, x->rank, d);
        at += x->dims[axis].k;
    }
    cg_kernel_end(c);
    return true;
}

static bool k_expand(Cg *c, const Node *n) {
    const Value *x = n->in[0], *y = n->out[0];
    int64_t ys[MAX_RANK], src[MAX_RANK], d[MAX_RANK], s = 1;
    shape_strides(y, ys);
    for (int j = y->rank - 1; j >= 0; j--) {
        int jx = j - (y->rank - x->rank);
        int64_t dk = jx >= 0 ? x->dims[jx].k : 1;
        src[j] = dk == 1 ? 0 : s;
        s *= dk;
    }
    dims_of(y, d);
    const Value *bufs[2] = {x, y};
    if (!cg_kernel_begin(c, n, 2, bufs)) return false;
    cg_strided_copy(c, y, 0, ys, x, 0, src, y->rank, d);
    cg_kernel_end(c);
    return true;
}

/* ---- gradient rules ---- */

static bool g_same_order(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_reshape_like(c, dy[0], n->in[0]);
    return true;
}

/* Each input's gradient is its stretch of dy along the axis, a Slice. */
static bool g_concat(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    const Value *y = n->out[0];
    const Attr *a = node_attr(n, "axis");
    int64_t axis = a ? a->i : graph_opset(c->g, "") < 4 ? 1 : 0;
    if (axis < 0) axis += y->rank;
    int64_t at = 0;
    for (int k = 0; k < n->n_in; k++) {
        const Value *x = n->in[k];
        if (!x) continue;
        if (!dim_is_const(x->dims[axis]))
            return diag_error(c->d, DIAG_UNSUPPORTED,
                              "%s: node '%s' (Concat): the gradient needs a fixed length of input '%s' along axis %lld",
                              c->g->path, n->name, x->name, (long long)axis);
        int64_t end = at + x->dims[axis].k;
        if (need[k]) {
            Value *in[4] = {dy[0], gb_const_ints(c, &at, 1), gb_const_ints(c, &end, 1), gb_const_ints(c, &axis, 1)};
            dx[k] = gb_finish(c, gb_start(c, "", "Slice", 4, in, 1));
        }
        at = end;
    }
    return true;
}

/* Slice's gradient scatters dy into zeros of x's shape where the slice
 * read, for any starts and steps (cleave.SliceGrad). */
static bool g_slice(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    const Value *x = n->in[0];
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    SliceSpec sp;
    Dim out[MAX_RANK];
    int64_t shape[MAX_RANK];
    bool err, known = slice_params(&oc, n, &sp, out, &err);
    if (err) return false;
    for (int j = 0; known && j < x->rank; j++) {
        known = dim_is_const(x->dims[j]);
        shape[j] = x->dims[j].k;
    }
    if (!known)
        return diag_error(c->d, DIAG_UNSUPPORTED,
                          "%s: node '%s' (Slice): the gradient needs constant starts, ends, axes and steps and a "
                          "known input shape", c->g->path, n->name);
    Node *g = gb_start(c, "cleave", "SliceGrad", 1, dy, 1);
    gb_attr_ints(c, g, "starts", sp.start, x->rank);
    gb_attr_ints(c, g, "steps", sp.step, x->rank);
    gb_attr_ints(c, g, "shape", shape, x->rank);
    dx[0] = gb_finish(c, g);
    return true;
}

/* Constant padding's gradient is dy with the padding cut off again: Pad by
 * the negated pads (what was cropped comes back as zeros).  The other
 * modes add the border's gradient to the elements it copied
 * (cleave.PadGrad). */
static bool g_pad(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (n->n_in > 2 && need[2])
        return diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Pad): no gradient for the constant value '%s'",
                          c->g->path, n->name, n->in[2]->name);
    if (!need[0]) return true;
    OpCtx oc = {c->g, c->d, graph_opset(c->g, "")};
    int r = n->in[0]->rank;
    PadSpec p;
    bool err;
    if (!pad_params(&oc, n, r, &p, &err))
        return err ? false
                   : diag_error(c->d, DIAG_UNSUPPORTED, "%s: node '%s' (Pad): the gradient needs constant pads",
                                c->g->path, n->name);
    bool constant = p.mode == PAD_CONSTANT;
    int64_t pads[2 * MAX_RANK];
    for (int j = 0; j < r; j++) {
        pads[j] = constant ? -p.begin[j] : p.begin[j];
        pads[r + j] = constant ? -p.end[j] : p.end[j];
    }
    if (constant) {
        Value *in[2] = {dy[0], gb_const_ints(c, pads, 2 * r)};
        dx[0] = gb_finish(c, gb_start(c, "", "Pad", 2, in, 1));
    } else {
        Node *g = gb_start(c, "cleave", "PadGrad", 1, dy, 1);
        gb_attr_ints(c, g, "pads", pads, 2 * r);
        gb_attr_s(c, g, "mode", pad_modes[p.mode]);
        dx[0] = gb_finish(c, g);
    }
    return true;
}

/* Split's gradient is the outputs' gradients concatenated back along the
 * axis, zeros standing for outputs nothing read. */
static bool g_split(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    Value **parts = ARENA_ARRAY(&c->g->arena, Value *, n->n_out);
    if (!parts) return diag_error(c->d, DIAG_NOMEM, "%s: out of memory building the training graph", c->g->path);
    for (int k = 0; k < n->n_out; k++) parts[k] = dy[k] ? dy[k] : gb_zeros_like(c, n->out[k]);
    Node *g = gb_start(c, "", "Concat", n->n_out, parts, 1);
    gb_attr_i(c, g, "axis", node_attr_i(n, "axis", 0));
    dx[0] = gb_finish(c, g);
    return true;
}

static bool g_transpose(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (!need[0]) return true;
    int64_t perm[MAX_RANK], inv[MAX_RANK];
    int r = n->in[0]->rank;
    read_perm(n, r, perm);
    for (int j = 0; j < r; j++) inv[perm[j]] = j;
    dx[0] = gb_transpose(c, dy[0], inv, r);
    return true;
}

static const AttrSpec attrs_none[] = {{0}};
static const AttrSpec attrs_shape[] = {{"start", ATTR_INT, .i = 0}, {"end", ATTR_INT}, {0}}; /* end: the rank */
static const AttrSpec attrs_reshape[] = {{"allowzero", ATTR_INT, .i = 0}, {"shape", ATTR_INTS}, {0}};
static const AttrSpec attrs_axis1[] = {{"axis", ATTR_INT, .i = 1}, {0}};
static const AttrSpec attrs_axis0[] = {{"axis", ATTR_INT, .i = 0}, {0}};
static const AttrSpec attrs_axes[] = {{"axes", ATTR_INTS}, {0}};
static const AttrSpec attrs_perm[] = {{"perm", ATTR_INTS}, {0}};
static const AttrSpec attrs_slice[] = {{"starts", ATTR_INTS}, {"ends", ATTR_INTS}, {"axes", ATTR_INTS}, {0}};
static const AttrSpec attrs_value[] = {{"value", ATTR_TENSOR}, {0}};
static const AttrSpec attrs_pad[] = {{"mode", ATTR_STRING, .s = "constant"}, {"pads", ATTR_INTS}, {"value", ATTR_FLOAT, .f = 0}, {0}};
static const AttrSpec attrs_split[] = {{"axis", ATTR_INT, .i = 0}, {"split", ATTR_INTS}, {"num_outputs", ATTR_INT}, {0}};
static const AttrSpec attrs_slice_grad[] = {{"starts", ATTR_INTS, .required = true}, {"steps", ATTR_INTS, .required = true}, {"shape", ATTR_INTS, .required = true}, {0}};
static const AttrSpec attrs_pad_grad[] = {{"pads", ATTR_INTS, .required = true}, {"mode", ATTR_STRING, .required = true}, {0}};

const OpDef op_Shape = {"Shape", "", 1, 0, 1, 1, 1, 1, attrs_shape, 0, infer_shape, fold_shape, flops_zero};
const OpDef op_Size = {"Size", "", 1, 0, 1, 1, 1, 1, attrs_none, 0, infer_size, fold_size, flops_zero};
const OpDef op_Reshape = {"Reshape", "", 1, 0, 1, 2, 1, 1, attrs_reshape, 0, infer_reshape, fold_same_order, flops_zero, .grad = g_same_order, .cg = k_same_order};
const OpDef op_Flatten = {"Flatten", "", 1, 0, 1, 1, 1, 1, attrs_axis1, 0, infer_flatten, fold_same_order, flops_zero, .grad = g_same_order, .cg = k_same_order};
const OpDef op_Squeeze = {"Squeeze", "", 1, 0, 1, 2, 1, 1, attrs_axes, 0, infer_squeeze, fold_same_order, flops_zero, .grad = g_same_order, .cg = k_same_order};
const OpDef op_Unsqueeze = {"Unsqueeze", "", 1, 0, 1, 2, 1, 1, attrs_axes, 0, infer_unsqueeze, fold_same_order, flops_zero, .grad = g_same_order, .cg = k_same_order};
const OpDef op_Transpose = {"Transpose", "", 1, 0, 1, 1, 1, 1, attrs_perm, 0, infer_transpose, fold_transpose, flops_zero, .grad = g_transpose, .cg = k_transpose};
const OpDef op_Concat = {"Concat", "", 1, 0, 1, 1 << 16, 1, 1, attrs_axis0, 0, infer_concat, fold_concat, flops_zero, .grad = g_concat, .cg = k_concat};
const OpDef op_Slice = {"Slice", "", 1, 0, 1, 5, 1, 1, attrs_slice, 0, infer_slice, fold_slice, flops_zero, .grad = g_slice, .cg = k_slice};
const OpDef op_Pad = {"Pad", "", 2, 0, 1, 4, 1, 1, attrs_pad, 0, infer_pad, fold_pad, flops_zero, .grad = g_pad, .cg = k_pad};
const OpDef op_Split = {"Split", "", 1, 0, 1, 2, 1, 1 << 16, attrs_split, 0, infer_split, fold_split, flops_zero, .grad = g_split, .cg = k_split};
/* dX: dY summed over the dimensions X was broadcast along. */
static bool g_expand(GradCtx *c, Node *n, Value *const *dy, Value **dx, const bool *need) {
    if (need[0]) dx[0] = gb_sum_to(c, dy[0], n->in[0]);
    return true;
}

const OpDef op_Expand = {"Expand", "", 8, 0, 2, 2, 1, 1, attrs_none, 0, infer_expand, fold_expand, flops_zero, .grad = g_expand, .cg = k_expand};
const OpDef op_Constant = {"Constant", "", 1, 0, 0, 0, 1, 1, attrs_none, 0, infer_constant, fold_constant, flops_zero};
const OpDef op_ConstantOfShape = {"ConstantOfShape", "", 9, 0, 1, 1, 1, 1, attrs_value, 0, infer_constant_of_shape, fold_constant_of_shape, flops_zero};
const OpDef op_Range = {"Range", "", 11, 0, 3, 3, 1, 1, attrs_none, 0, infer_range, fold_range, flops_zero};

/* Gradient ops (domain "cleave"). */
const OpDef op_SliceGrad = {"SliceGrad", "cleave", 1, 0, 1, 1, 1, 1, attrs_slice_grad, 0, infer_shape_attr, NULL, flops_zero, .cg = k_slice_grad};
const OpDef op_PadGrad = {"PadGrad", "cleave", 1, 0, 1, 1, 1, 1, attrs_pad_grad, 0, infer_pad_grad, NULL, NULL, .cg = k_pad_grad};
