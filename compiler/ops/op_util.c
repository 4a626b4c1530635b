#include "op_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool op_verror(OpCtx *c, const Node *n, DiagCode code, const char *fmt, va_list ap) {
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return diag_error(c->d, code, "%s: node '%s' (%s): %s", c->g->path, n->name, n->op_type, msg);
}

bool op_error(OpCtx *c, const Node *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    op_verror(c, n, DIAG_SHAPE, fmt, ap);
    va_end(ap);
    return false;
}

bool op_error_kind(OpCtx *c, const Node *n, DiagCode code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    op_verror(c, n, code, fmt, ap);
    va_end(ap);
    return false;
}

void set_out(Node *n, int k, DType t, int rank, const Dim *dims) {
    if (k >= n->n_out || !n->out[k]) return;
    Value *v = n->out[k];
    v->dtype = t;
    if (rank < 0) v->rank = -1;
    else value_set_shape(v, rank, dims);
}

void set_out_unknown(Node *n, int k, DType t, int rank) {
    Dim unk[MAX_RANK];
    for (int i = 0; i < rank && i < MAX_RANK; i++) unk[i] = dim_unknown();
    set_out(n, k, t, rank, unk);
}

void same_as_input(Node *n, int k, int i) {
    const Value *x = n->in[i];
    set_out(n, k, x->dtype, x->rank, x->dims);
}

bool infer_shape_attr(OpCtx *c, Node *n) {
    const int64_t *shape;
    int r = node_attr_ints(n, "shape", &shape);
    if (r != n->in[0]->rank) return op_error(c, n, "shape has %d entries for rank %d", r, n->in[0]->rank);
    Dim out[MAX_RANK];
    for (int j = 0; j < r; j++) out[j] = dim_const(shape[j]);
    set_out(n, 0, n->in[0]->dtype, r, out);
    return true;
}

bool in_const(const Node *n, int i) {
    if (i >= n->n_in || !n->in[i]) return false;
    const Value *v = n->in[i];
    bool const_slot = v->kind == VAL_INITIALIZER && v->konst && i < 32 && n->def && (n->def->const_inputs >> i) & 1;
    return value_is_const(v) || const_slot;
}

int in_ints(const Node *n, int i, int64_t *buf, int max) {
    if (!in_const(n, i)) return -1;
    const Const *k = n->in[i]->konst;
    if (k->n > max) return -2;
    for (int64_t j = 0; j < k->n; j++) {
        if (k->sym && k->sym[j]) return -1;
        buf[j] = const_get_i(k, j);
    }
    return (int)k->n;
}

bool norm_axis(OpCtx *c, const Node *n, int64_t *axis, int rank) {
    if (*axis < -rank || *axis >= rank)
        return op_error(c, n, "axis %lld is out of range for rank %d", (long long)*axis, rank);
    if (*axis < 0) *axis += rank;
    return true;
}

bool broadcast_inputs(OpCtx *c, const Node *n, int first, int count, Dim *dims, int *rank) {
    int r = 0;
    for (int i = first; i < first + count && i < n->n_in; i++)
        if (n->in[i] && n->in[i]->rank > r) r = n->in[i]->rank;
    for (int j = 0; j < r; j++) dims[j] = dim_const(1);
    for (int i = first; i < first + count && i < n->n_in; i++) {
        const Value *v = n->in[i];
        if (!v) continue;
        for (int j = 0; j < v->rank; j++) {
            Dim *o = &dims[r - v->rank + j];
            Dim x = v->dims[j];
            if (dim_is_const(x) && x.k == 1) continue;
            if (dim_is_const(*o) && o->k == 1) { *o = x; continue; }
            if (dim_eq(*o, x)) continue;
            if (o->sym == DIM_UNKNOWN || x.sym == DIM_UNKNOWN) {
                /* unknown against known: the known one wins (it cannot be 1) */
                if (o->sym == DIM_UNKNOWN) *o = x;
                continue;
            }
            if (dim_is_const(*o) && dim_is_const(x))
                return op_error(c, n, "cannot broadcast dimension %lld of '%s' against %lld", (long long)x.k,
                                v->name, (long long)o->k);
            /* symbolic against a different value: assume the symbol binds
             * to it, as it must for the model to be valid */
            if (dim_is_const(x)) *o = x;
        }
    }
    *rank = r;
    return true;
}

bool same_dtype(OpCtx *c, const Node *n, int first, int count, DType *t) {
    *t = DT_UNDEFINED;
    for (int i = first; i < first + count && i < n->n_in; i++) {
        const Value *v = n->in[i];
        if (!v || v->dtype == DT_UNDEFINED) continue;
        if (*t == DT_UNDEFINED) *t = v->dtype;
        else if (*t != v->dtype)
            return op_error(c, n, "input '%s' is %s but '%s' is %s", v->name, dtype_name(v->dtype),
                            n->in[first]->name, dtype_name(*t));
    }
    return true;
}

bool dims_product(const Dim *d, int rank, Dim *out) {
    Dim p = dim_const(1);
    for (int i = 0; i < rank; i++) {
        if (d[i].sym == DIM_UNKNOWN) return false;
        if (d[i].sym && p.sym) return false;
        if (d[i].k && p.k > INT64_MAX / d[i].k) return false;
        p.k *= d[i].k;
        if (d[i].sym) p.sym = d[i].sym;
    }
    *out = p;
    return true;
}

Const *fold_out(OpCtx *c, Node *n, int k) {
    Value *v = n->out[k];
    int64_t numel = value_numel(v);
    if (numel < 0 || numel > FOLD_MAX_ELEMS || dtype_store(v->dtype) == DT_UNDEFINED) return NULL;
    Const *r = const_new(c->g, dtype_store(v->dtype), numel);
    if (!r) return NULL;
    v->konst = r;
    v->kind = VAL_CONSTANT;
    return r;
}

void shape_strides(const Value *v, int64_t *strides) {
    int64_t s = 1;
    for (int i = v->rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= v->dims[i].k;
    }
}

int64_t broadcast_src_index(const Value *out, const Value *in, int64_t flat) {
    int64_t idx = 0, in_stride = 1;
    for (int j = out->rank - 1, ij = in->rank - 1; j >= 0; j--, ij--) {
        int64_t coord = flat % out->dims[j].k;
        flat /= out->dims[j].k;
        if (ij < 0) continue;
        int64_t ik = in->dims[ij].k;
        if (ik != 1) idx += coord * in_stride;
        in_stride *= ik;
    }
    return idx;
}

FoldResult fold_elementwise(OpCtx *c, Node *n, FoldFnF fn_f, FoldFnI fn_i) {
    enum { MAXIN = 4 };
    if (n->n_in > MAXIN) return FOLD_NO;
    /* Binary ops before opset 7 align B with A at 'axis', not numpy-style
     * as broadcast_src_index does: such nodes stay unfolded. */
    if (c->opset < 7 && node_attr(n, "axis")) return FOLD_NO;
    for (int i = 0; i < n->n_in; i++) {
        if (!n->in[i]) continue;
        if (!in_const(n, i) || !value_shape_known(n->in[i]) || n->in[i]->konst->sym) return FOLD_NO;
    }
    Value *out = n->out[0];
    if (!value_shape_known(out)) return FOLD_NO;
    int64_t numel = value_numel(out);
    if (numel > FOLD_MAX_ELEMS) return FOLD_NO;
    /* Integer results computed from integer inputs stay exact in int64. */
    bool int_path = fn_i && dtype_store(out->dtype) == DT_INT64;
    for (int i = 0; i < n->n_in && int_path; i++)
        if (n->in[i] && n->in[i]->konst->store != DT_INT64) int_path = false;
    Const *r = fold_out(c, n, 0);
    if (!r) return FOLD_NO;
    for (int64_t e = 0; e < numel; e++) {
        double xf[MAXIN] = {0};
        int64_t xi[MAXIN] = {0};
        for (int i = 0; i < n->n_in; i++) {
            if (!n->in[i]) continue;
            int64_t si = broadcast_src_index(out, n->in[i], e);
            xf[i] = const_get_f(n->in[i]->konst, si);
            xi[i] = const_get_i(n->in[i]->konst, si);
        }
        if (int_path) {
            bool ok = true;
            int64_t y = fn_i(xi, n, &ok);
            if (!ok) return op_error(c, n, "integer division by zero in a constant expression") ? FOLD_ERROR : FOLD_ERROR;
            const_set_i(r, e, y);
        } else {
            const_set_f(r, e, fn_f(xf, n));
        }
    }
    return FOLD_DONE;
}

double flops_per_out_elem(const Node *n, double per) {
    int64_t e = value_numel(n->out[0]);
    return e < 0 ? 0 : per * (double)e;
}
