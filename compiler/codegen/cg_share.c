/* cg_share.c - one kernel for nodes that would generate the same code.
 *
 * A kernel is a function of its buffers' addresses: two nodes of the same
 * op with the same attributes, the same dtypes and shapes in every slot
 * and the same pattern of buffers that may overlap get the same code.
 * Deep models repeat their layers, so most nodes of a step have a twin;
 * building, optimising and emitting each kernel once takes a large part
 * of the compile time away, and the binary is smaller.
 *
 * A node's signature is its node_key (op, attributes, each slot's dtype
 * and shape: everything its code generation reads from the node), and for
 * every pair of its buffers whether they are the same value or may share
 * bytes in some call (which decides the kernel's noalias flags).  Code generation may read the contents of
 * constant inputs and tensor attributes (a Reshape's shape, say), so
 * nodes with either are never shared, nor are nodes whose kernels name
 * them in run-time errors (OpDef.names_node). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_share.h"
#include "../ir/node_key.h"
#include "../ops/ops.h"

typedef struct Entry {
    uint64_t hash;
    char *sig;
    const Node *node; /* the node whose kernel is shared */
} Entry;

struct CgShare {
    int n, cap, reused;
    Entry *e;
};

CgShare *cg_share_new(void) { return calloc(1, sizeof(CgShare)); }

void cg_share_free(CgShare *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->e[i].sig);
    free(s->e);
    free(s);
}

int cg_share_count(const CgShare *s) { return s ? s->reused : 0; }

/* The node's buffers in slot order: inputs, then outputs. */
static int slots(const Node *n, const Value **v) {
    int k = 0;
    for (int i = 0; i < n->n_in; i++) v[k++] = n->in[i];
    for (int i = 0; i < n->n_out; i++) v[k++] = n->out[i];
    return k;
}

/* NULL when the node must have a kernel of its own. */
static char *signature(const Cg *c, const Node *n) {
    if (n->n_in + n->n_out > 2 * CG_MAX_BUFS) return NULL;
    if (n->def && n->def->names_node) return NULL; /* its messages name it: the name is part of its code */
    for (int i = 0; i < n->n_in; i++) {
        const Value *v = n->in[i];
        if (v && v->konst && !(v->kind == VAL_INITIALIZER && dtype_is_float(v->dtype))) return NULL;
    }
    for (int a = 0; a < n->n_attr; a++) {
        AttrKind k = n->attrs[a].kind;
        bool in_key = k == ATTR_FLOAT || k == ATTR_INT || k == ATTR_STRING || k == ATTR_FLOATS || k == ATTR_INTS ||
                      k == ATTR_STRINGS;
        if (!in_key) return NULL; /* tensors, graphs: contents the key does not hold */
    }
    Text t = {0};
    node_key(&t, n);
    text_put(&t, "|");
    const Value *v[2 * CG_MAX_BUFS];
    int k = slots(n, v);
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++) {
            if (!v[i] || !v[j]) continue;
            text_put(&t, "%c", v[i] == v[j]                     ? '='
                               : cg_always_same(c, n, v[i], v[j]) ? '#'
                               : cg_may_share(c, n, v[i], v[j])   ? '~'
                                                                  : '.');
        }
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const Entry *lookup(const CgShare *s, const char *sig, uint64_t h) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i].hash == h && strcmp(s->e[i].sig, sig) == 0) return &s->e[i];
    return NULL;
}

bool cg_share_reuse(Cg *c, CgShare *s, const Node *n) {
    char *sig = signature(c, n);
    if (!sig) return false;
    const Entry *e = lookup(s, sig, fnv(sig));
    free(sig);
    if (!e) return false;
    const CgKernel *src = &c->kernels[e->node->id];
    if (!src->fn) return false; /* a view: nothing to share */
    const Value *from[2 * CG_MAX_BUFS], *to[2 * CG_MAX_BUFS];
    int k = slots(e->node, from);
    slots(n, to);
    CgKernel mine = {src->fn, src->n_bufs, {0}};
    for (int b = 0; b < src->n_bufs; b++) {
        int slot = -1;
        for (int i = 0; i < k && slot < 0; i++)
            if (from[i] == src->bufs[b]) slot = i;
        if (slot < 0) return false; /* a buffer that is no slot of the node */
        mine.bufs[b] = to[slot];
    }
    c->kernels[n->id] = mine;
    s->reused++;
    return true;
}

void cg_share_add(Cg *c, CgShare *s, const Node *n) {
    if (!c->kernels[n->id].fn) return;
    char *sig = signature(c, n);
    if (!sig) return;
    uint64_t h = fnv(sig);
    if (lookup(s, sig, h)) {
        free(sig);
        return;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        Entry *ne = realloc(s->e, sizeof *ne * (size_t)cap);
        if (!ne) {
            free(sig);
            return; /* sharing is an economy: without memory, build every kernel */
        }
        s->e = ne;
        s->cap = cap;
    }
    s->e[s->n++] = (Entry){h, sig, n};
}
