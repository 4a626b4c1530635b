/* fuzz_onnx_load.c - libFuzzer target for the front end.
 *
 * Feeds arbitrary bytes to onnx_load_buffer() and, when they load, runs the
 * passes driver_front_end() runs (verify, shape inference and folding,
 * prune, verify again), once with the batch left symbolic and once bound
 * to 3; a bound graph every op of which is supported also gets its training
 * graph (mse loss, SGD), verified.  A crash, a sanitizer report, a leak or
 * a broken error contract is a finding; an error reported through the Diag
 * is the expected outcome for most inputs.
 *
 * The error contract checked here: a failing call leaves a Diag that is set,
 * is one non-empty line, starts with the model's path and is not
 * DIAG_INTERNAL (a broken invariant no input may reach); a succeeding one
 * leaves the Diag clear.
 *
 * External data: the model's path names a folder next to this executable
 * holding weights.bin (4 KiB), so locations, offsets and lengths read a
 * real, fixed file.
 *
 * Mutation: byte-level changes rarely get past protobuf decoding into the
 * passes, so a custom mutator also edits decoded models: op types from the
 * op table, rewired inputs, attribute values from each op's AttrSpec list,
 * shape-like initializers, input dims and the opset, then re-encodes them.
 * A quarter of the mutations stay libFuzzer's own. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autodiff/train.h"
#include "driver.h"
#include "frontend/onnx.h"
#include "ir/shapes.h"
#include "onnx.pb-c.h"
#include "ops/ops.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static char model_path[PATH_MAX];

/* The error contract failed: report it the way libFuzzer reports a crash. */
static void contract(const char *what, const Diag *d) {
    fprintf(stderr, "fuzz_onnx_load: %s (code %d, message \"%s\")\n", what, (int)d->code, d->msg);
    abort();
}

static void check_diag(bool ok, const Diag *d) {
    if (ok) {
        if (diag_failed(d)) contract("a call succeeded but left an error", d);
        return;
    }
    if (!diag_failed(d)) contract("a call failed without an error", d);
    if (d->code == DIAG_INTERNAL) contract("an input reached an internal error", d);
    if (!d->msg[0]) contract("an error has an empty message", d);
    if (strchr(d->msg, '\n') || strchr(d->msg, '\r')) contract("an error message spans several lines", d);
    if (strncmp(d->msg, model_path, strlen(model_path)) != 0) contract("an error message does not name the file", d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        perror("fuzz_onnx_load: /proc/self/exe");
        exit(1);
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    char dir[PATH_MAX], weights[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/fuzz_onnx_load.data", exe);
    snprintf(weights, sizeof weights, "%s/weights.bin", dir);
    snprintf(model_path, sizeof model_path, "%s/model.onnx", dir);
    if (mkdir(dir, 0755) != 0 && access(dir, W_OK) != 0) {
        perror(dir);
        exit(1);
    }
    /* Written under a private name and renamed, so parallel jobs never see
     * a partial file. */
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.%ld", weights, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        perror(tmp);
        exit(1);
    }
    for (int i = 0; i < 4096; i++) fputc(i * 37 & 0xff, f);
    if (fclose(f) != 0 || rename(tmp, weights) != 0) {
        perror(weights);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int bound = 0; bound < 2; bound++) {
        Diag d = {0};
        Graph *g = onnx_load_buffer(data, size, model_path, &d);
        check_diag(g != NULL, &d);
        if (!g) return 0; /* the second round would fail the same way */
        ShapeOptions so = {.batch = bound ? 3 : 0, .fold = true};
        bool ok = ir_verify(g, &d) && ir_infer_shapes(g, &so, &d);
        if (ok) {
            ir_prune(g);
            ok = ir_verify(g, &d);
        }
        if (ok && g->arena.failed) ok = diag_error(&d, DIAG_NOMEM, "%s: out of memory", g->path);
        check_diag(ok, &d);
        Diag strict = {0};
        bool supported = driver_check_supported(g, &strict);
        check_diag(supported, &strict);
        if (ok && supported && bound) {
            TrainOptions to = {.loss = LOSS_MSE, .optimizer = OPT_SGD, .lr = 0.1f, .replicas = 1};
            TrainGraph t;
            Diag td = {0};
            bool built = train_build(g, &to, &t, &td) && ir_verify(g, &td);
            if (built && g->arena.failed) built = diag_error(&td, DIAG_NOMEM, "%s: out of memory", g->path);
            check_diag(built, &td);
        }
        graph_free(g);
    }
    return 0;
}

/* ---- structure-aware mutation ---------------------------------------- */

/* Every block protobuf-c allocates while decoding, and every block the
 * mutator adds, is recorded here and released at once; its free is a
 * no-op, so the mutator can point fields at static strings. */
typedef struct Pool {
    void **blocks;
    size_t n, cap;
} Pool;

static void *pool_alloc(void *data, size_t size) {
    Pool *p = data;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        void **b = realloc(p->blocks, cap * sizeof *b);
        if (!b) return NULL;
        p->blocks = b;
        p->cap = cap;
    }
    void *m = calloc(1, size ? size : 1);
    if (m) p->blocks[p->n++] = m;
    return m;
}

static void pool_keep(void *data, void *ptr) {
    (void)data;
    (void)ptr;
}

static void pool_release(Pool *p) {
    for (size_t i = 0; i < p->n; i++) free(p->blocks[i]);
    free(p->blocks);
}

typedef struct Mut {
    uint64_t state;
    Pool *pool;
    Onnx__GraphProto *g;
} Mut;

static uint64_t rnd(Mut *m, uint64_t n) {
    m->state ^= m->state << 13;
    m->state ^= m->state >> 7;
    m->state ^= m->state << 17;
    return n ? m->state % n : 0;
}

/* Mostly small values, some at the edges of what a dimension or index can be. */
static int64_t some_int(Mut *m) {
    static const int64_t edges[] = {INT64_MIN, -(INT64_C(1) << 62), INT32_MIN, -65536, 65536, INT32_MAX,
                                    INT64_C(1) << 31, INT64_C(1) << 40, INT64_C(1) << 62, INT64_MAX};
    if (rnd(m, 8) == 0) return edges[rnd(m, sizeof edges / sizeof *edges)];
    return (int64_t)rnd(m, 12) - 3;
}

static void *pool_array(Mut *m, size_t n, size_t size) { return pool_alloc(m->pool, n * size); }

/* Name of a value the graph defines, or "" (an omitted input). */
static char *some_value_name(Mut *m) {
    Onnx__GraphProto *g = m->g;
    size_t total = g->n_input + g->n_initializer;
    for (size_t i = 0; i < g->n_node; i++) total += g->node[i]->n_output;
    if (!total || rnd(m, 16) == 0) return "";
    size_t k = rnd(m, total);
    if (k < g->n_input) return g->input[k]->name ? g->input[k]->name : "";
    k -= g->n_input;
    if (k < g->n_initializer) return g->initializer[k]->name ? g->initializer[k]->name : "";
    k -= g->n_initializer;
    for (size_t i = 0; i < g->n_node; i++) {
        if (k < g->node[i]->n_output) return g->node[i]->output[k];
        k -= g->node[i]->n_output;
    }
    return "";
}

static void set_attr_value(Mut *m, Onnx__AttributeProto *a, AttrKind kind) {
    a->has_type = 1;
    a->type = (Onnx__AttributeProto__AttributeType)kind;
    switch (kind) {
    case ATTR_INT: a->has_i = 1; a->i = some_int(m); break;
    case ATTR_FLOAT: a->has_f = 1; a->f = (float)some_int(m) / 2; break;
    case ATTR_INTS:
        a->n_ints = rnd(m, 6);
        a->ints = pool_array(m, a->n_ints, sizeof *a->ints);
        if (!a->ints) a->n_ints = 0;
        for (size_t i = 0; i < a->n_ints; i++) a->ints[i] = some_int(m);
        break;
    case ATTR_FLOATS:
        a->n_floats = rnd(m, 4);
        a->floats = pool_array(m, a->n_floats, sizeof *a->floats);
        if (!a->floats) a->n_floats = 0;
        for (size_t i = 0; i < a->n_floats; i++) a->floats[i] = (float)some_int(m);
        break;
    case ATTR_STRING: {
        static const char *const words[] = {"", "NOTSET", "SAME_UPPER", "VALID", "tanh", "none"};
        const char *w = words[rnd(m, sizeof words / sizeof *words)];
        a->has_s = 1;
        a->s.data = (uint8_t *)w;
        a->s.len = strlen(w);
        break;
    }
    case ATTR_TENSOR: {
        Onnx__TensorProto *t = pool_alloc(m->pool, sizeof *t);
        if (!t) break;
        onnx__tensor_proto__init(t);
        t->has_data_type = 1;
        t->data_type = rnd(m, 2) ? ONNX__TENSOR_PROTO__DATA_TYPE__INT64 : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        t->n_dims = rnd(m, 2);
        t->dims = pool_array(m, 1, sizeof *t->dims);
        if (t->dims) t->dims[0] = 1;
        else t->n_dims = 0;
        int64_t *i64 = pool_array(m, 1, sizeof *i64);
        float *f32 = pool_array(m, 1, sizeof *f32);
        if (!i64 || !f32) break;
        i64[0] = some_int(m);
        f32[0] = (float)i64[0];
        if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) t->n_int64_data = 1, t->int64_data = i64;
        else t->n_float_data = 1, t->float_data = f32;
        a->t = t;
        break;
    }
    default: break;
    }
}

static void mutate_node(Mut *m, Onnx__NodeProto *n) {
    int count;
    const OpDef *const *table = op_table(&count);
    switch (rnd(m, 6)) {
    case 0: /* another op, same inputs */
        n->op_type = (char *)table[rnd(m, (uint64_t)count)]->name;
        break;
    case 1: /* rewire one input */
        if (n->n_input) n->input[rnd(m, n->n_input)] = some_value_name(m);
        break;
    case 2: { /* one input more or less */
        size_t k = n->n_input ? n->n_input - 1 + 2 * rnd(m, 2) : 1;
        char **in = pool_array(m, k ? k : 1, sizeof *in);
        if (!in) break;
        for (size_t i = 0; i < k; i++) in[i] = i < n->n_input ? n->input[i] : some_value_name(m);
        n->input = in;
        n->n_input = k;
        break;
    }
    case 3: /* change an attribute the node has */
        if (n->n_attribute) {
            Onnx__AttributeProto *a = n->attribute[rnd(m, n->n_attribute)];
            set_attr_value(m, a, a->has_type ? (AttrKind)a->type : ATTR_INT);
        }
        break;
    default: { /* add or replace an attribute the op's table entry names */
        const OpDef *def = op_lookup(n->domain ? n->domain : "", n->op_type ? n->op_type : "");
        if (!def || !def->attrs || !def->attrs[0].name) break;
        int n_specs = 0;
        while (def->attrs[n_specs].name) n_specs++;
        const AttrSpec *spec = &def->attrs[rnd(m, (uint64_t)n_specs)];
        Onnx__AttributeProto *a = pool_alloc(m->pool, sizeof *a);
        Onnx__AttributeProto **list = pool_array(m, n->n_attribute + 1, sizeof *list);
        if (!a || !list) break;
        onnx__attribute_proto__init(a);
        a->name = (char *)spec->name;
        set_attr_value(m, a, spec->kind);
        size_t k = 0;
        for (size_t i = 0; i < n->n_attribute; i++)
            if (!n->attribute[i]->name || strcmp(n->attribute[i]->name, spec->name)) list[k++] = n->attribute[i];
        list[k++] = a;
        n->attribute = list;
        n->n_attribute = k;
        break;
    }
    }
}

/* Initializers: int64 vectors become new short vectors (shapes, axes,
 * indices); others get new dims, which the loader must refuse unless the
 * data still fits. */
static void mutate_initializer(Mut *m, Onnx__TensorProto *t) {
    if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 && rnd(m, 4)) {
        size_t len = rnd(m, 6);
        int64_t *v = pool_array(m, len ? len : 1, sizeof *v);
        int64_t *d = pool_array(m, 1, sizeof *d);
        if (!v || !d) return;
        for (size_t i = 0; i < len; i++) v[i] = some_int(m);
        d[0] = (int64_t)len;
        t->has_raw_data = 0;
        t->int64_data = v;
        t->n_int64_data = len;
        t->dims = d;
        t->n_dims = rnd(m, 8) ? 1 : 0;
        if (!t->n_dims && len != 1) t->n_dims = 1;
        return;
    }
    if (t->n_dims) t->dims[rnd(m, t->n_dims)] = some_int(m);
    else if (rnd(m, 2)) t->data_type = (int32_t)rnd(m, 17);
}

static void mutate_input(Mut *m, Onnx__ValueInfoProto *vi) {
    if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) return;
    Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
    if (rnd(m, 4) == 0) {
        static const int32_t types[] = {1, 1, 1, 6, 7, 7, 9, 10, 11, 16};
        tt->has_elem_type = 1;
        tt->elem_type = types[rnd(m, sizeof types / sizeof *types)];
        return;
    }
    if (!tt->shape) return;
    if (rnd(m, 8) == 0) { /* rank changes by one */
        size_t k = tt->shape->n_dim ? tt->shape->n_dim - 1 + 2 * rnd(m, 2) : 1;
        Onnx__TensorShapeProto__Dimension **dims = pool_array(m, k ? k : 1, sizeof *dims);
        if (!dims) return;
        for (size_t i = 0; i < k; i++) {
            if (i < tt->shape->n_dim) {
                dims[i] = tt->shape->dim[i];
                continue;
            }
            dims[i] = pool_alloc(m->pool, sizeof **dims);
            if (!dims[i]) return;
            onnx__tensor_shape_proto__dimension__init(dims[i]);
        }
        tt->shape->dim = dims;
        tt->shape->n_dim = k;
    }
    if (!tt->shape->n_dim) return;
    Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[rnd(m, tt->shape->n_dim)];
    switch (rnd(m, 4)) {
    case 0:
        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
        d->dim_param = rnd(m, 2) ? "N" : "seq";
        break;
    case 1: d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE__NOT_SET; break;
    default:
        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        d->dim_value = some_int(m);
        if (d->dim_value < 0 && rnd(m, 4)) d->dim_value = (int64_t)rnd(m, 8);
        break;
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    Mut m = {.state = ((uint64_t)seed << 1) | 1};
    if (rnd(&m, 4) == 0) return LLVMFuzzerMutate(data, size, max_size);
    /* Deeply nested bytes pass through the loader as an error but would
     * overflow the stack here. */
    if (!onnx_nesting_ok(data, size)) return LLVMFuzzerMutate(data, size, max_size);
    Pool pool = {0};
    ProtobufCAllocator alloc = {pool_alloc, pool_keep, &pool};
    Onnx__ModelProto *model = onnx__model_proto__unpack(&alloc, size, data);
    if (!model || !model->graph) {
        pool_release(&pool);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    m.pool = &pool;
    m.g = model->graph;
    for (uint64_t k = 1 + rnd(&m, 3); k > 0; k--) {
        Onnx__GraphProto *g = m.g;
        uint64_t what = rnd(&m, 10);
        if (what < 6 && g->n_node) mutate_node(&m, g->node[rnd(&m, g->n_node)]);
        else if (what < 8 && g->n_initializer) mutate_initializer(&m, g->initializer[rnd(&m, g->n_initializer)]);
        else if (what < 9 && g->n_input) mutate_input(&m, g->input[rnd(&m, g->n_input)]);
        else if (model->n_opset_import) {
            model->opset_import[0]->has_version = 1;
            model->opset_import[0]->version = 1 + (int64_t)rnd(&m, 20);
        }
    }
    size_t len = onnx__model_proto__get_packed_size(model);
    if (len <= max_size) onnx__model_proto__pack(model, data);
    pool_release(&pool);
    return len <= max_size ? len : LLVMFuzzerMutate(data, size, max_size);
}
