/* onnx_load.c - ModelProto into the IR.
 *
 * Two sweeps over the graph: first every value is defined (initializers,
 * inputs, node outputs), then node inputs are resolved by name, so graphs
 * whose nodes are not stored in topological order load too; ir_verify then
 * rejects cycles. */
#include "onnx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_util.h"
#include "onnx.pb-c.h"
#include "tensor_data.h"
#include "../ops/ops.h"

typedef struct Loader {
    Graph *g;
    Diag *d;
    const char *dir;
} Loader;

/* Declared dtype and shape of a graph input, output or value_info. */
static bool read_value_type(Loader *L, const Onnx__ValueInfoProto *vi, Value *v) {
    const Onnx__TypeProto *tp = vi->type;
    if (!tp) return true; /* untyped outputs are allowed; inference fills them */
    if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return diag_error(L->d, DIAG_UNSUPPORTED, "%s: value '%s': only tensor types are supported", L->g->path,
                          v->name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    v->dtype = tt->has_elem_type ? (DType)tt->elem_type : DT_UNDEFINED;
    if (v->dtype != DT_UNDEFINED && !dtype_size(v->dtype))
        return diag_error(L->d, DIAG_UNSUPPORTED, "%s: value '%s': unsupported element type %d", L->g->path,
                          v->name, (int)v->dtype);
    if (!tt->shape) {
        v->rank = -1;
        return true;
    }
    if (tt->shape->n_dim > MAX_RANK)
        return diag_error(L->d, DIAG_UNSUPPORTED, "%s: value '%s': rank %zu exceeds the maximum %d", L->g->path,
                          v->name, tt->shape->n_dim, MAX_RANK);
    v->rank = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            if (dim->dim_value < 0)
                return diag_error(L->d, DIAG_FORMAT, "%s: value '%s': negative dimension %lld", L->g->path, v->name,
                                  (long long)dim->dim_value);
            v->dims[i] = dim_const(dim->dim_value);
        } else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && *dim->dim_param) {
            int s = graph_symbol(L->g, dim->dim_param);
            v->dims[i] = s == DIM_UNKNOWN ? dim_unknown() : (Dim){1, s};
        } else {
            v->dims[i] = dim_unknown();
        }
    }
    return true;
}

static bool define(Loader *L, const char *name, Value **out) {
    if (!name || !*name) return diag_error(L->d, DIAG_GRAPH, "%s: a value has an empty name", L->g->path);
    if (graph_find_value(L->g, name))
        return diag_error(L->d, DIAG_GRAPH, "%s: value '%s' is defined more than once", L->g->path, name);
    *out = graph_add_value(L->g, name);
    if (!*out) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", L->g->path);
    return true;
}

static bool read_attr(Loader *L, Node *n, const Onnx__AttributeProto *ap, Attr *a) {
    Graph *g = L->g;
    a->name = arena_strdup(&g->arena, ap->name ? ap->name : "");
    a->kind = ap->has_type ? (AttrKind)ap->type : ATTR_UNDEFINED;
    if (a->kind == ATTR_UNDEFINED) { /* pre-IR-v3 files: infer from the field set */
        if (ap->n_ints) a->kind = ATTR_INTS;
        else if (ap->n_floats) a->kind = ATTR_FLOATS;
        else if (ap->n_strings) a->kind = ATTR_STRINGS;
        else if (ap->t) a->kind = ATTR_TENSOR;
        else if (ap->g) a->kind = ATTR_GRAPH;
        else if (ap->has_s) a->kind = ATTR_STRING;
        else if (ap->has_f) a->kind = ATTR_FLOAT;
        else if (ap->has_i) a->kind = ATTR_INT;
    }
    switch (a->kind) {
    case ATTR_FLOAT: a->f = ap->f; return true;
    case ATTR_INT: a->i = ap->i; return true;
    case ATTR_STRING:
        a->s = arena_strndup(&g->arena, (const char *)ap->s.data, ap->s.len);
        return a->s != NULL;
    /* An empty list arrives as a NULL array, which memcpy may not see even
     * for 0 bytes. */
    case ATTR_FLOATS:
        a->n = (int)ap->n_floats;
        a->floats = ARENA_ARRAY(&g->arena, float, ap->n_floats);
        if (a->floats && ap->n_floats) memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
        return a->floats != NULL;
    case ATTR_INTS:
        a->n = (int)ap->n_ints;
        a->ints = ARENA_ARRAY(&g->arena, int64_t, ap->n_ints);
        if (a->ints && ap->n_ints) memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
        return a->ints != NULL;
    case ATTR_STRINGS:
        a->n = (int)ap->n_strings;
        a->strings = ARENA_ARRAY(&g->arena, const char *, ap->n_strings);
        if (!a->strings) return false;
        for (size_t i = 0; i < ap->n_strings; i++)
            a->strings[i] = arena_strndup(&g->arena, (const char *)ap->strings[i].data, ap->strings[i].len);
        return true;
    case ATTR_TENSOR: {
        if (!ap->t) return diag_error(L->d, DIAG_FORMAT, "%s: node '%s': attribute '%s' has no tensor", g->path, n->name, a->name);
        Value *v = ARENA_NEW(&g->arena, Value);
        if (!v) return false;
        v->name = a->name;
        v->kind = VAL_CONSTANT;
        v->id = -1;
        char what[256];
        snprintf(what, sizeof what, "node '%s' attribute '%s'", n->name, a->name);
        if (!tensor_to_value(g, ap->t, L->dir, what, v, L->d)) return false;
        a->tensor = v;
        return true;
    }
    case ATTR_GRAPH:
    case ATTR_GRAPHS:
        return diag_error(L->d, DIAG_UNSUPPORTED,
                          "%s: node '%s' (%s): attribute '%s' holds a subgraph; control flow (If/Loop/Scan bodies) is not supported",
                          g->path, n->name, n->op_type, a->name);
    default:
        /* Sparse tensors and type protos: kept by name only; ops that need
         * them are not supported and report it themselves. */
        return true;
    }
}

static bool read_nodes_outputs(Loader *L, const Onnx__GraphProto *gp) {
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        if (!np->op_type || !*np->op_type)
            return diag_error(L->d, DIAG_FORMAT, "%s: node #%zu has no op_type", L->g->path, i);
        Node *n = graph_add_node(L->g, np->name, np->op_type, np->domain, (int)np->n_input, (int)np->n_output);
        if (!n) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", L->g->path);
        n->def = op_lookup(n->domain, n->op_type);
        for (size_t k = 0; k < np->n_output; k++) {
            if (!np->output[k] || !*np->output[k]) continue; /* omitted optional output */
            Value *v;
            if (graph_find_value(L->g, np->output[k]))
                return diag_error(L->d, DIAG_GRAPH, "%s: node '%s' (%s): output '%s' is already defined elsewhere",
                                  L->g->path, n->name, n->op_type, np->output[k]);
            if (!define(L, np->output[k], &v)) return false;
            v->producer = n;
            v->producer_slot = (int)k;
            n->out[k] = v;
        }
        n->n_attr = (int)np->n_attribute;
        n->attrs = ARENA_ARRAY(&L->g->arena, Attr, np->n_attribute ? np->n_attribute : 1);
        if (!n->attrs) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", L->g->path);
        for (size_t k = 0; k < np->n_attribute; k++)
            if (!read_attr(L, n, np->attribute[k], &n->attrs[k])) {
                return diag_failed(L->d) ? false : diag_error(L->d, DIAG_NOMEM, "%s: out of memory", L->g->path);
            }
    }
    return true;
}

static bool resolve_node_inputs(Loader *L, const Onnx__GraphProto *gp) {
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        Node *n = L->g->nodes[i];
        for (size_t k = 0; k < np->n_input; k++) {
            if (!np->input[k] || !*np->input[k]) continue; /* omitted optional input */
            n->in[k] = graph_find_value(L->g, np->input[k]);
            if (!n->in[k])
                return diag_error(L->d, DIAG_GRAPH, "%s: node '%s' (%s): input '%s' is not defined", L->g->path,
                                  n->name, n->op_type, np->input[k]);
        }
    }
    return true;
}

static bool read_graph(Loader *L, const Onnx__GraphProto *gp) {
    Graph *g = L->g;
    g->graph_name = arena_strdup(&g->arena, gp->name ? gp->name : "");
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        Value *v;
        if (!define(L, t->name, &v)) return false;
        v->kind = VAL_INITIALIZER;
        char what[256];
        snprintf(what, sizeof what, "initializer '%s'", v->name);
        if (!tensor_to_value(g, t, L->dir, what, v, L->d)) return false;
    }
    if (gp->n_sparse_initializer)
        return diag_error(L->d, DIAG_UNSUPPORTED, "%s: sparse initializers are not supported", g->path);
    g->inputs = ARENA_ARRAY(&g->arena, Value *, gp->n_input ? gp->n_input : 1);
    if (!g->inputs) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < gp->n_input; i++) {
        const char *name = gp->input[i]->name;
        Value *v = name ? graph_find_value(g, name) : NULL;
        /* An input that is also an initializer is a parameter with a
         * default value (IR < 4 lists every initializer as an input): it is
         * not fed at run time. */
        if (v && v->kind == VAL_INITIALIZER) continue;
        /* Programs are fed with --data NAME=FILE, split at the first '='. */
        if (name && strchr(name, '='))
            return diag_error(L->d, DIAG_UNSUPPORTED, "%s: graph input '%s' has '=' in its name, which --data "
                              "NAME=FILE cannot give; rename it on export", g->path, name);
        if (!define(L, name, &v)) return false;
        v->kind = VAL_INPUT;
        if (!read_value_type(L, gp->input[i], v)) return false;
        g->inputs[g->n_inputs++] = v;
    }
    if (!read_nodes_outputs(L, gp) || !resolve_node_inputs(L, gp)) return false;
    g->outputs = ARENA_ARRAY(&g->arena, Value *, gp->n_output ? gp->n_output : 1);
    if (!g->outputs) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name ? gp->output[i]->name : "";
        Value *v = graph_find_value(g, name);
        if (!v)
            return diag_error(L->d, DIAG_GRAPH, "%s: graph output '%s' is not produced by any node", g->path, name);
        /* Declared types of outputs are checked against inference later;
         * keep them in a detached value. */
        Value decl = {.name = v->name, .rank = -1};
        if (!read_value_type(L, gp->output[i], &decl)) return false;
        if (v->kind == VAL_INTERMEDIATE && v->dtype == DT_UNDEFINED) {
            v->dtype = decl.dtype;
            v->rank = decl.rank;
            memcpy(v->dims, decl.dims, sizeof v->dims);
        }
        v->is_output = true;
        g->outputs[g->n_outputs++] = v;
    }
    /* value_info: declared types of intermediates, used where an op's own
     * rule cannot tell (unsupported ops). */
    for (size_t i = 0; i < gp->n_value_info; i++) {
        const char *name = gp->value_info[i]->name;
        Value *v = name ? graph_find_value(g, name) : NULL;
        if (!v || v->kind != VAL_INTERMEDIATE || v->is_output) continue;
        if (!read_value_type(L, gp->value_info[i], v)) return false;
    }
    return true;
}

static bool read_model(Loader *L, const Onnx__ModelProto *m) {
    Graph *g = L->g;
    if (!m->graph) return diag_error(L->d, DIAG_FORMAT, "%s: not an ONNX model (no graph)", g->path);
    if (!m->has_ir_version || m->ir_version < 1 || m->ir_version > 100)
        return diag_error(L->d, DIAG_FORMAT, "%s: not an ONNX model (missing or invalid ir_version)", g->path);
    g->ir_version = m->ir_version;
    g->model_version = m->has_model_version ? m->model_version : 0;
    g->producer_name = arena_strdup(&g->arena, m->producer_name ? m->producer_name : "");
    g->producer_version = arena_strdup(&g->arena, m->producer_version ? m->producer_version : "");
    g->doc = arena_strdup(&g->arena, m->doc_string ? m->doc_string : "");
    g->opsets = ARENA_ARRAY(&g->arena, Opset, m->n_opset_import ? m->n_opset_import : 1);
    if (!g->opsets || g->arena.failed) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", g->path);
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        g->opsets[g->n_opsets].domain = arena_strdup(&g->arena, o->domain ? o->domain : "");
        if (!g->opsets[g->n_opsets].domain) return diag_error(L->d, DIAG_NOMEM, "%s: out of memory", g->path);
        g->opsets[g->n_opsets].version = o->has_version ? o->version : 0;
        g->n_opsets++;
    }
    if (m->n_opset_import == 0) { /* IR v1/v2 files: opset 1 implied */
        g->opsets[0] = (Opset){"", 1};
        g->n_opsets = 1;
    }
    if (m->n_functions)
        return diag_error(L->d, DIAG_UNSUPPORTED, "%s: model-local functions are not supported", g->path);
    return read_graph(L, m->graph);
}

/* protobuf-c unpacks nested messages by recursion without a depth limit:
 * subgraph attributes (Graph -> Node -> Attribute -> Graph ...) or nested
 * TypeProtos a few bytes per level deep overflow the stack in a file of
 * tens of kilobytes.  Real models nest a handful of levels. */
enum { MAX_NESTING = 100 };

static bool read_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *out) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *i < len; shift += 7) {
        uint8_t b = p[(*i)++];
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = x;
            return true;
        }
    }
    return false;
}

/* The first string field of a model that is not valid UTF-8 or holds a
 * NUL byte.  protobuf-c hands strings over as C strings without checking
 * them: a NUL cuts a name short, and invalid UTF-8 reaches JSON writers
 * (jansson refuses it) and name lookups, where an input so named was
 * silently fed nothing.  So they are refused on the raw bytes. */
typedef struct BadString {
    const char *message, *field; /* e.g. onnx.NodeProto, name */
    const uint8_t *bytes;
    size_t len;
    const char *why;
} BadString;

/* Why s[0..n) is not a clean UTF-8 string, or NULL. */
static const char *utf8_problem(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c == 0) return "holds a NUL byte";
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (k == 0 || n - i < k) return "is not valid UTF-8";
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1fu : k == 3 ? c & 0x0fu : c & 0x07u;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return "is not valid UTF-8";
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        /* Overlong forms, surrogates and code points past U+10FFFF. */
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < least[k] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return "is not valid UTF-8";
        i += k;
    }
    return NULL;
}

enum { WALK_OK, WALK_DEEP, WALK_BAD_STRING };

/* Walks the message of type `desc` in p[0..len): WALK_DEEP when
 * message-typed fields nest deeper than MAX_NESTING, WALK_BAD_STRING (and
 * *bad) at the first string field that utf8_problem refuses.  Follows the
 * schema, so bytes fields and packed scalars are skipped whole; malformed
 * bytes end the walk and are left to the decoder to report.  Recursion is
 * bounded by `depth`. */
static int walk(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t len, int depth, BadString *bad) {
    if (depth > MAX_NESTING) return WALK_DEEP;
    size_t i = 0;
    while (i < len) {
        uint64_t tag, n;
        if (!read_varint(p, len, &i, &tag)) return WALK_OK;
        switch (tag & 7) {
        case 0:
            if (!read_varint(p, len, &i, &n)) return WALK_OK;
            break;
        case 1:
            if (len - i < 8) return WALK_OK;
            i += 8;
            break;
        case 5:
            if (len - i < 4) return WALK_OK;
            i += 4;
            break;
        case 2: {
            if (!read_varint(p, len, &i, &n) || n > len - i) return WALK_OK;
            const ProtobufCFieldDescriptor *f =
                tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                int r = walk(f->descriptor, p + i, (size_t)n, depth + 1, bad);
                if (r != WALK_OK) return r;
            } else if (f && f->type == PROTOBUF_C_TYPE_STRING && bad) {
                const char *why = utf8_problem(p + i, (size_t)n);
                if (why) {
                    *bad = (BadString){desc->name, f->name, p + i, (size_t)n, why};
                    return WALK_BAD_STRING;
                }
            }
            i += (size_t)n;
            break;
        }
        default:
            return WALK_OK; /* groups and invalid wire types: the decoder refuses them */
        }
    }
    return WALK_OK;
}

bool onnx_nesting_ok(const uint8_t *buf, size_t len) {
    return walk(&onnx__model_proto__descriptor, buf, len, 0, NULL) != WALK_DEEP;
}

/* s[0..n) for a message: printable ASCII as it is, other bytes as \xNN,
 * at most about 60 bytes of it. */
static void escape(const uint8_t *s, size_t n, char *out, size_t size) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < size; i++) {
        if (i == 60) {
            snprintf(out + o, size - o, "...");
            return;
        }
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\') out[o++] = (char)s[i];
        else o += (size_t)snprintf(out + o, size - o, "\\x%02x", s[i]);
    }
    out[o] = 0;
}

Graph *onnx_load_buffer(const uint8_t *buf, size_t len, const char *path, Diag *d) {
    if (len == 0) {
        diag_error(d, DIAG_FORMAT, "%s: empty file, not an ONNX model", path);
        return NULL;
    }
    BadString bad;
    int walked = walk(&onnx__model_proto__descriptor, buf, len, 0, &bad);
    if (walked == WALK_DEEP) {
        diag_error(d, DIAG_LIMIT, "%s: protobuf messages nested more than %d levels deep", path, MAX_NESTING);
        return NULL;
    }
    if (walked == WALK_BAD_STRING) {
        char text[256];
        escape(bad.bytes, bad.len, text, sizeof text);
        diag_error(d, DIAG_FORMAT, "%s: a string in %s.%s %s: \"%s\"", path, bad.message, bad.field, bad.why, text);
        return NULL;
    }
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m) {
        diag_error(d, DIAG_FORMAT, "%s: not an ONNX model (protobuf decoding failed: truncated or corrupt file)", path);
        return NULL;
    }
    Graph *g = graph_new(path);
    char *dir = path_dirname(path);
    if (!g || !dir) {
        free(dir);
        graph_free(g);
        onnx__model_proto__free_unpacked(m, NULL);
        diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    Loader L = {g, d, dir};
    bool ok = read_model(&L, m);
    if (ok && g->arena.failed) ok = diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
    free(dir);
    onnx__model_proto__free_unpacked(m, NULL);
    if (!ok) {
        graph_free(g);
        return NULL;
    }
    return g;
}

Graph *onnx_load(const char *path, Diag *d) {
    size_t len = 0;
    uint8_t *buf = file_read_all(path, &len, d);
    if (!buf) return NULL;
    Graph *g = onnx_load_buffer(buf, len, path, d);
    free(buf);
    return g;
}

Value *onnx_load_tensor_file(Graph *g, const char *path, Diag *d) {
    size_t len = 0;
    uint8_t *buf = file_read_all(path, &len, d);
    if (!buf) return NULL;
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, buf);
    free(buf);
    if (!t) {
        diag_error(d, DIAG_FORMAT, "%s: not a serialized ONNX tensor", path);
        return NULL;
    }
    char *dir = path_dirname(path);
    Value *v = graph_add_value(g, t->name ? t->name : path);
    bool ok = dir && v;
    if (ok) {
        v->kind = VAL_CONSTANT;
        ok = tensor_to_value(g, t, dir, path, v, d);
    } else {
        diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
    }
    free(dir);
    onnx__tensor_proto__free_unpacked(t, NULL);
    return ok ? v : NULL;
}
