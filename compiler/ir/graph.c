/* graph.c - construction and queries of the IR graph. */
#include "ir.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../ops/ops.h"

static const struct {
    DType t;
    const char *name;
    size_t size;
} dtype_table[] = {
    {DT_FLOAT, "float32", 4}, {DT_UINT8, "uint8", 1},     {DT_INT8, "int8", 1},
    {DT_UINT16, "uint16", 2}, {DT_INT16, "int16", 2},     {DT_INT32, "int32", 4},
    {DT_INT64, "int64", 8},   {DT_STRING, "string", 0},   {DT_BOOL, "bool", 1},
    {DT_FLOAT16, "float16", 2}, {DT_DOUBLE, "float64", 8}, {DT_UINT32, "uint32", 4},
    {DT_UINT64, "uint64", 8}, {DT_BFLOAT16, "bfloat16", 2},
};

const char *dtype_name(DType t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof *dtype_table; i++)
        if (dtype_table[i].t == t) return dtype_table[i].name;
    return "undefined";
}

size_t dtype_size(DType t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof *dtype_table; i++)
        if (dtype_table[i].t == t) return dtype_table[i].size;
    return 0;
}

bool dtype_is_float(DType t) {
    return t == DT_FLOAT || t == DT_DOUBLE || t == DT_FLOAT16 || t == DT_BFLOAT16;
}

bool dtype_is_int(DType t) {
    switch (t) {
    case DT_UINT8: case DT_INT8: case DT_UINT16: case DT_INT16: case DT_INT32:
    case DT_INT64: case DT_BOOL: case DT_UINT32: case DT_UINT64:
        return true;
    default:
        return false;
    }
}

DType dtype_store(DType t) {
    if (t == DT_DOUBLE) return DT_DOUBLE;
    if (dtype_is_float(t)) return DT_FLOAT;
    if (dtype_is_int(t)) return DT_INT64;
    return DT_UNDEFINED;
}

Graph *graph_new(const char *path) {
    Arena a;
    arena_init(&a);
    Graph *g = ARENA_NEW(&a, Graph);
    if (!g) {
        arena_free(&a);
        return NULL;
    }
    g->arena = a;
    g->path = arena_strdup(&g->arena, path ? path : "<memory>");
    g->n_syms = 1; /* id 0 means "no symbol" */
    g->syms = ARENA_ARRAY(&g->arena, const char *, 64);
    if (!g->path || !g->syms) {
        graph_free(g);
        return NULL;
    }
    return g;
}

void graph_free(Graph *g) {
    if (!g) return;
    Arena a = g->arena; /* g itself lives in the arena */
    arena_free(&a);
}

/* Grows an arena array by doubling; old storage stays in the arena. */
static void *grow(Arena *a, void *old, int count, int *cap, size_t elem) {
    if (count < *cap) return old;
    int ncap = *cap ? *cap * 2 : 16;
    void *p = arena_alloc(a, (size_t)ncap, elem);
    if (!p) return NULL;
    if (old) memcpy(p, old, (size_t)count * elem);
    *cap = ncap;
    return p;
}

Value *graph_add_value(Graph *g, const char *name) {
    Value **vals = grow(&g->arena, g->values, g->n_values, &g->cap_values, sizeof *vals);
    Value *v = ARENA_NEW(&g->arena, Value);
    const char *vname = arena_strdup(&g->arena, name ? name : "");
    if (!vals || !v || !vname) return NULL;
    g->values = vals;
    v->id = g->n_values;
    v->name = vname;
    v->rank = -1;
    g->values[g->n_values++] = v;
    return v;
}

Node *graph_add_node(Graph *g, const char *name, const char *op_type, const char *domain, int n_in,
                     int n_out) {
    Node **nodes = grow(&g->arena, g->nodes, g->n_nodes, &g->cap_nodes, sizeof *nodes);
    Node *n = ARENA_NEW(&g->arena, Node);
    if (!nodes || !n) return NULL;
    g->nodes = nodes;
    n->id = g->n_nodes;
    n->name = (name && *name) ? arena_strdup(&g->arena, name)
                              : arena_printf(&g->arena, "%s_%d", op_type, g->n_nodes);
    n->op_type = arena_strdup(&g->arena, op_type);
    n->domain = arena_strdup(&g->arena, domain ? domain : "");
    n->n_in = n_in;
    n->n_out = n_out;
    n->in = ARENA_ARRAY(&g->arena, Value *, n_in ? n_in : 1);
    n->out = ARENA_ARRAY(&g->arena, Value *, n_out ? n_out : 1);
    if (!n->in || !n->out || !n->name || !n->op_type || !n->domain) return NULL;
    g->nodes[g->n_nodes++] = n;
    return n;
}

Value *graph_find_value(const Graph *g, const char *name) {
    /* Later definitions shadow nothing: names are unique once verified. */
    for (int i = 0; i < g->n_values; i++)
        if (strcmp(g->values[i]->name, name) == 0) return g->values[i];
    return NULL;
}

int graph_symbol(Graph *g, const char *name) {
    for (int i = 1; i < g->n_syms; i++)
        if (strcmp(g->syms[i], name) == 0) return i;
    if (g->n_syms >= 64) return DIM_UNKNOWN;
    g->syms[g->n_syms] = arena_strdup(&g->arena, name);
    if (!g->syms[g->n_syms]) return DIM_UNKNOWN; /* arena->failed reports it */
    return g->n_syms++;
}

int64_t graph_opset(const Graph *g, const char *domain) {
    for (int i = 0; i < g->n_opsets; i++) {
        const char *d = g->opsets[i].domain;
        if (strcmp(d, domain) == 0 || (!*domain && strcmp(d, "ai.onnx") == 0))
            return g->opsets[i].version;
    }
    return 0;
}

/* ---- attributes ---- */

const Attr *node_attr(const Node *n, const char *name) {
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t node_attr_i(const Node *n, const char *name, int64_t dflt) {
    const Attr *a = node_attr(n, name);
    if (a && a->kind == ATTR_INT) return a->i;
    const AttrSpec *s = op_attr_spec(n->def, name);
    return s ? s->i : dflt;
}

float node_attr_f(const Node *n, const char *name, float dflt) {
    const Attr *a = node_attr(n, name);
    if (a && a->kind == ATTR_FLOAT) return a->f;
    const AttrSpec *s = op_attr_spec(n->def, name);
    return s ? s->f : dflt;
}

const char *node_attr_s(const Node *n, const char *name, const char *dflt) {
    const Attr *a = node_attr(n, name);
    if (a && a->kind == ATTR_STRING) return a->s;
    const AttrSpec *s = op_attr_spec(n->def, name);
    return s && s->s ? s->s : dflt;
}

int node_attr_ints(const Node *n, const char *name, const int64_t **out) {
    const Attr *a = node_attr(n, name);
    if (!a || a->kind != ATTR_INTS) return -1;
    *out = a->ints;
    return a->n;
}

/* ---- shapes ---- */

bool value_shape_known(const Value *v) {
    if (v->rank < 0) return false;
    for (int i = 0; i < v->rank; i++)
        if (!dim_is_const(v->dims[i])) return false;
    return true;
}

int64_t value_numel(const Value *v) {
    if (!value_shape_known(v)) return -1;
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) {
        if (v->dims[i].k && n > INT64_MAX / v->dims[i].k) return -1;
        n *= v->dims[i].k;
    }
    return n;
}

void value_set_shape(Value *v, int rank, const Dim *dims) {
    CLEAVE_CHECK(rank >= 0 && rank <= MAX_RANK, "value '%s' given rank %d (at most %d)", v->name, rank, MAX_RANK);
    v->rank = rank;
    for (int i = 0; i < rank; i++) v->dims[i] = dims[i];
}

const char *dim_str(const Graph *g, Dim d, char *buf, size_t len) {
    if (d.sym == DIM_UNKNOWN)
        snprintf(buf, len, "?");
    else if (d.sym == 0)
        snprintf(buf, len, "%" PRId64, d.k);
    else if (d.k == 1)
        snprintf(buf, len, "%s", g->syms[d.sym]);
    else
        snprintf(buf, len, "%" PRId64 "*%s", d.k, g->syms[d.sym]);
    return buf;
}

const char *shape_str(const Graph *g, const Value *v, char *buf, size_t len) {
    if (v->rank < 0) {
        snprintf(buf, len, "?");
        return buf;
    }
    size_t pos = 0;
    pos += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < v->rank && pos < len; i++) {
        char d[64];
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%s", i ? "," : "", dim_str(g, v->dims[i], d, sizeof d));
    }
    if (pos < len) snprintf(buf + pos, len - pos, "]");
    return buf;
}

/* ---- constants ---- */

Const *const_new(Graph *g, DType store, int64_t n) {
    CLEAVE_CHECK(store == DT_FLOAT || store == DT_DOUBLE || store == DT_INT64, "constant stored as %s", dtype_name(store));
    if (n < 0) return NULL;
    Const *c = ARENA_NEW(&g->arena, Const);
    if (!c) return NULL;
    c->store = store;
    c->n = n;
    c->data = arena_alloc(&g->arena, (size_t)n, store == DT_FLOAT ? 4 : 8);
    return c->data ? c : NULL;
}

double const_get_f(const Const *c, int64_t i) {
    switch (c->store) {
    case DT_FLOAT: return ((const float *)c->data)[i];
    case DT_DOUBLE: return ((const double *)c->data)[i];
    default: return (double)((const int64_t *)c->data)[i];
    }
}

/* Float to integer saturates (NaN gives 0) instead of being undefined. */
static int64_t f_to_i(double x) {
    if (!(x == x)) return 0;
    if (x >= 9.2e18) return INT64_MAX;
    if (x <= -9.2e18) return INT64_MIN;
    return (int64_t)x;
}

int64_t const_get_i(const Const *c, int64_t i) {
    switch (c->store) {
    case DT_FLOAT: return f_to_i(((const float *)c->data)[i]);
    case DT_DOUBLE: return f_to_i(((const double *)c->data)[i]);
    default: return ((const int64_t *)c->data)[i];
    }
}

void const_set_f(Const *c, int64_t i, double x) {
    switch (c->store) {
    case DT_FLOAT: ((float *)c->data)[i] = (float)x; break;
    case DT_DOUBLE: ((double *)c->data)[i] = x; break;
    default: ((int64_t *)c->data)[i] = f_to_i(x); break;
    }
}

void const_set_i(Const *c, int64_t i, int64_t x) {
    switch (c->store) {
    case DT_FLOAT: ((float *)c->data)[i] = (float)x; break;
    case DT_DOUBLE: ((double *)c->data)[i] = (double)x; break;
    default: ((int64_t *)c->data)[i] = x; break;
    }
}

Dim const_get_dim(const Const *c, int64_t i) {
    int64_t k = const_get_i(c, i);
    if (c->sym && c->sym[i]) return (Dim){k, c->sym[i]};
    return dim_const(k);
}

bool const_copy_elem(Graph *g, Const *dst, int64_t di, const Const *src, int64_t si) {
    if (dst->store == DT_INT64) const_set_i(dst, di, const_get_i(src, si));
    else const_set_f(dst, di, const_get_f(src, si));
    if (src->sym && src->sym[si]) {
        if (!dst->sym) dst->sym = ARENA_ARRAY(&g->arena, int32_t, dst->n);
        if (!dst->sym) return false;
        dst->sym[di] = src->sym[si];
    }
    return true;
}

bool value_is_const(const Value *v) {
    if (!v || !v->konst) return false;
    return v->kind == VAL_CONSTANT || (v->kind == VAL_INITIALIZER && !dtype_is_float(v->dtype));
}
