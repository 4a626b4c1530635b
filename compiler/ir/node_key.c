/* node_key.c - see node_key.h. */
#include "node_key.h"

#include <string.h>

void value_key(Text *t, const Value *v) {
    if (!v) {
        text_put(t, "-;");
        return;
    }
    text_put(t, "%d[", (int)v->dtype);
    for (int j = 0; j < v->rank; j++) text_put(t, "%lld:%d,", (long long)v->dims[j].k, (int)v->dims[j].sym);
    /* a constant input (a shape, axes) is part of what the kernel does */
    if (v->konst && !dtype_is_float(v->dtype))
        for (int64_t i = 0; i < v->konst->n; i++) text_put(t, "=%lld", (long long)const_get_i(v->konst, i));
    text_put(t, "];");
}

void node_key(Text *t, const Node *n) {
    text_put(t, "%s.%s|", n->domain ? n->domain : "", n->op_type);
    for (int a = 0; a < n->n_attr; a++) {
        const Attr *at = &n->attrs[a];
        text_put(t, "%s:%d=", at->name, (int)at->kind);
        switch (at->kind) {
        case ATTR_FLOAT: text_put(t, "%a", (double)at->f); break;
        case ATTR_INT: text_put(t, "%lld", (long long)at->i); break;
        case ATTR_STRING: text_put(t, "%zu:%s", strlen(at->s ? at->s : ""), at->s ? at->s : ""); break;
        case ATTR_INTS:
            for (int j = 0; j < at->n; j++) text_put(t, "%lld,", (long long)at->ints[j]);
            break;
        case ATTR_FLOATS:
            for (int j = 0; j < at->n; j++) text_put(t, "%a,", (double)at->floats[j]);
            break;
        case ATTR_STRINGS:
            for (int j = 0; j < at->n; j++) text_put(t, "%zu:%s,", strlen(at->strings[j]), at->strings[j]);
            break;
        default: break; /* tensors, graphs: by kind */
        }
        text_put(t, "|");
    }
    text_put(t, "%d/%d|", n->n_in, n->n_out);
    for (int i = 0; i < n->n_in; i++) value_key(t, n->in[i]);
    text_put(t, "|");
    for (int i = 0; i < n->n_out; i++) value_key(t, n->out[i]);
}
