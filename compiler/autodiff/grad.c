/* grad.c - graph builders used by gradient rules and by the loss and
 * optimizer constructions. */
#include "grad.h"

#include <stdio.h>
#include <string.h>

#include "../ops/ops.h"

static Value *fresh_value(GradCtx *c, const char *hint) {
    char name[160];
    snprintf(name, sizeof name, "%s:%d", hint, c->g->n_values);
    return graph_add_value(c->g, name);
}

Node *gb_start(GradCtx *c, const char *domain, const char *op, int n_in, Value *const *in, int n_out) {
    if (diag_failed(c->d)) return NULL;
    for (int i = 0; i < n_in; i++)
        if (!in[i] && i == 0) return NULL; /* an earlier builder failed */
    char name[160];
    snprintf(name, sizeof name, "grad/%s_%d", op, c->g->n_nodes);
    Node *n = graph_add_node(c->g, name, op, domain, n_in, n_out);
    if (!n) {
        diag_error(c->d, DIAG_NOMEM, "%s: out of memory building the training graph", c->g->path);
        return NULL;
    }
    n->def = op_lookup(domain, op);
    if (!n->def) {
        diag_error(c->d, DIAG_INTERNAL, "%s: training graph uses unknown op %s.%s", c->g->path, domain, op);
        return NULL;
    }
    n->phase = c->phase;
    n->origin = c->origin;
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    n->attrs = ARENA_ARRAY(&c->g->arena, Attr, 8);
    for (int k = 0; k < n_out; k++) {
        n->out[k] = fresh_value(c, op);
        if (!n->out[k] || !n->attrs) {
            diag_error(c->d, DIAG_NOMEM, "%s: out of memory building the training graph", c->g->path);
            return NULL;
        }
        n->out[k]->producer = n;
        n->out[k]->producer_slot = k;
    }
    return n;
}

static Attr *new_attr(GradCtx *c, Node *n, const char *name, AttrKind kind) {
    if (!n || n->n_attr >= 8) return NULL;
    Attr *a = &n->attrs[n->n_attr++];
    a->name = arena_strdup(&c->g->arena, name);
    a->kind = kind;
    return a;
}

void gb_attr_i(GradCtx *c, Node *n, const char *name, int64_t v) {
    Attr *a = new_attr(c, n, name, ATTR_INT);
    if (a) a->i = v;
}

void gb_attr_f(GradCtx *c, Node *n, const char *name, float v) {
    Attr *a = new_attr(c, n, name, ATTR_FLOAT);
    if (a) a->f = v;
}

void gb_attr_ints(GradCtx *c, Node *n, const char *name, const int64_t *v, int count) {
    Attr *a = new_attr(c, n, name, ATTR_INTS);
    if (!a) return;
    a->ints = ARENA_ARRAY(&c->g->arena, int64_t, count ? count : 1);
    if (a->ints) memcpy(a->ints, v, sizeof *v * (size_t)count);
    a->n = count;
}

void gb_attr_floats(GradCtx *c, Node *n, const char *name, const float *v, int count) {
    Attr *a = new_attr(c, n, name, ATTR_FLOATS);
    if (!a) return;
    a->floats = ARENA_ARRAY(&c->g->arena, float, count ? count : 1);
    if (a->floats) memcpy(a->floats, v, sizeof *v * (size_t)count);
    a->n = count;
}

void gb_attr_s(GradCtx *c, Node *n, const char *name, const char *v) {
    Attr *a = new_attr(c, n, name, ATTR_STRING);
    if (a) a->s = arena_strdup(&c->g->arena, v);
}

Value *gb_finish(GradCtx *c, Node *n) {
    if (!n || diag_failed(c->d)) return NULL;
    OpCtx oc = {c->g, c->d, graph_opset(c->g, n->domain)};
    if (!*n->domain && oc.opset == 0) oc.opset = 17;
    if (!*n->domain && oc.opset < 13) oc.opset = 13; /* built nodes use current forms */
    if (!n->def->infer(&oc, n)) return NULL;
    return n->n_out ? n->out[0] : NULL;
}

Value *gb_finish_replacing(GradCtx *c, Node *n, Node *old) {
    if (!n || diag_failed(c->d)) return NULL;
    n->name = old->name;
    n->out[0]->producer = NULL; /* the value gb_start made stays unused */
    n->out[0] = old->out[0];
    n->out[0]->producer = n;
    n->out[0]->producer_slot = 0;
    old->dead = true;
    return gb_finish(c, n);
}

Value *gb_op1(GradCtx *c, const char *op, Value *a) {
    Value *in[1] = {a};
    return gb_finish(c, gb_start(c, "", op, 1, in, 1));
}

Value *gb_op2(GradCtx *c, const char *op, Value *a, Value *b) {
    if (!a || !b) return NULL;
    Value *in[2] = {a, b};
    return gb_finish(c, gb_start(c, "", op, 2, in, 1));
}

Value *gb_internal2(GradCtx *c, const char *op, Value *a, Value *b) {
    if (!a || !b) return NULL;
    Value *in[2] = {a, b};
    return gb_finish(c, gb_start(c, "cleave", op, 2, in, 1));
}

Value *gb_const_f(GradCtx *c, float x) {
    if (diag_failed(c->d)) return NULL;
    Value *v = fresh_value(c, "const");
    if (!v || !(v->konst = const_new(c->g, DT_FLOAT, 1))) {
        diag_error(c->d, DIAG_NOMEM, "%s: out of memory", c->g->path);
        return NULL;
    }
    v->kind = VAL_CONSTANT;
    v->dtype = DT_FLOAT;
    v->rank = 0;
    const_set_f(v->konst, 0, x);
    return v;
}

Value *gb_scale(GradCtx *c, Value *x, float s) {
    if (s == 1.0f) return x;
    return gb_op2(c, "Mul", x, gb_const_f(c, s));
}

Value *gb_sum_to(GradCtx *c, Value *x, const Value *like) {
    if (!x) return NULL;
    bool same = x->rank == like->rank;
    for (int j = 0; same && j < x->rank; j++) same = dim_eq(x->dims[j], like->dims[j]);
    if (same) return x;
    return gb_internal2(c, "SumTo", x, (Value *)like);
}

/* hint names the value, as in "shape:42". */
static Value *const_ints(GradCtx *c, const char *hint, const int64_t *v, int count) {
    if (diag_failed(c->d)) return NULL;
    Value *k = fresh_value(c, hint);
    if (!k || !(k->konst = const_new(c->g, DT_INT64, count))) {
        diag_error(c->d, DIAG_NOMEM, "%s: out of memory", c->g->path);
        return NULL;
    }
    k->kind = VAL_CONSTANT;
    k->dtype = DT_INT64;
    k->rank = 1;
    k->dims[0] = dim_const(count);
    for (int j = 0; j < count; j++) const_set_i(k->konst, j, v[j]);
    return k;
}

Value *gb_const_ints(GradCtx *c, const int64_t *v, int count) { return const_ints(c, "ints", v, count); }

Value *gb_zeros_like(GradCtx *c, const Value *like) {
    if (diag_failed(c->d)) return NULL;
    int64_t shape[MAX_RANK];
    for (int j = 0; j < like->rank; j++) shape[j] = like->dims[j].k;
    return gb_op2(c, "Expand", gb_const_f(c, 0), const_ints(c, "shape", shape, like->rank));
}

Value *gb_reshape_like(GradCtx *c, Value *x, const Value *like) {
    if (!x || diag_failed(c->d)) return NULL;
    int64_t shape[MAX_RANK];
    for (int j = 0; j < like->rank; j++) shape[j] = like->dims[j].k;
    return gb_op2(c, "Reshape", x, const_ints(c, "shape", shape, like->rank));
}

Value *gb_transpose(GradCtx *c, Value *x, const int64_t *perm, int rank) {
    if (!x) return NULL;
    Value *in[1] = {x};
    Node *n = gb_start(c, "", "Transpose", 1, in, 1);
    gb_attr_ints(c, n, "perm", perm, rank);
    return gb_finish(c, n);
}
