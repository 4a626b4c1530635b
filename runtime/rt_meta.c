/* rt_meta.c - reading and checking the metadata JSON of rt_abi.h.
 *
 * The metadata tells the runtime where every slot of the arena is.  A wrong
 * offset would make the runtime write outside the arena, so every field is
 * checked here, once, and everything after trusts RtMeta. */
#include <jansson.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

#define BAD "program metadata is invalid: "

const char *rt_dtype_name(RtDType t) { return t == RT_F32 ? "float32" : "int64"; }
size_t rt_dtype_size(RtDType t) { return t == RT_F32 ? 4 : 8; }

static json_t *member(json_t *obj, const char *key, const char *where, json_type type, RtErr *e) {
    static const char *type_names[] = {
        [JSON_OBJECT] = "an object", [JSON_ARRAY] = "an array", [JSON_STRING] = "a string",
        [JSON_INTEGER] = "an integer", [JSON_REAL] = "a number", [JSON_TRUE] = "a boolean",
        [JSON_FALSE] = "a boolean", [JSON_NULL] = "null",
    };
    json_t *v = json_object_get(obj, key);
    if (!v) {
        rt_error(e, BAD "%s%s\"%s\" is missing", where, *where ? ": " : "", key);
        return NULL;
    }
    bool ok = json_typeof(v) == type || (type == JSON_REAL && json_is_number(v)) ||
              (type == JSON_TRUE && json_is_boolean(v));
    if (!ok) {
        rt_error(e, BAD "%s%s\"%s\" is not %s", where, *where ? ": " : "", key, type_names[type]);
        return NULL;
    }
    return v;
}

static bool get_int(json_t *obj, const char *key, const char *where, int64_t min, int64_t *out,
                    RtErr *e) {
    json_t *v = member(obj, key, where, JSON_INTEGER, e);
    if (!v) return false;
    json_int_t x = json_integer_value(v);
    if (x < min)
        return rt_error(e, BAD "%s%s\"%s\" is %" PRId64 ", expected at least %" PRId64, where,
                        *where ? ": " : "", key, (int64_t)x, min);
    *out = (int64_t)x;
    return true;
}

/* A slot of `bytes` bytes at obj.offset: aligned and inside the arena. */
static bool get_offset(json_t *obj, const char *where, uint64_t bytes, const RtMeta *m,
                       uint64_t *out, RtErr *e) {
    int64_t off;
    if (!get_int(obj, "offset", where, 0, &off, e)) return false;
    if (off % 64)
        return rt_error(e, BAD "%s: offset %" PRId64 " is not a multiple of 64", where, off);
    if ((uint64_t)off > m->arena_bytes || bytes > m->arena_bytes - (uint64_t)off)
        return rt_error(e, BAD "%s: %" PRIu64 " bytes at offset %" PRId64
                        " end past the arena of %" PRIu64 " bytes",
                        where, bytes, off, m->arena_bytes);
    *out = (uint64_t)off;
    return true;
}

/* KIND_MODEL_OUTPUT: the output under loss_kind "model", where the model's
 * first output is its loss and may well be a scalar rather than rows. */
typedef enum { KIND_INPUT, KIND_OUTPUT, KIND_MODEL_OUTPUT, KIND_PARAM } TensorKind;

static bool get_tensor(json_t *o, const char *where, TensorKind kind, const RtMeta *m, RtTensor *t,
                       RtErr *e) {
    if (!json_is_object(o)) return rt_error(e, BAD "%s is not an object", where);
    json_t *name = member(o, "name", where, JSON_STRING, e);
    if (!name) return false;
    if (!*json_string_value(name)) return rt_error(e, BAD "%s: \"name\" is empty", where);
    bool output = kind == KIND_OUTPUT || kind == KIND_MODEL_OUTPUT;
    bool batched = kind == KIND_INPUT || kind == KIND_OUTPUT; /* shape [batch, ...] */
    t->dtype = RT_F32;
    json_t *dtype = output ? json_object_get(o, "dtype") : member(o, "dtype", where, JSON_STRING, e);
    if (!output && !dtype) return false;
    if (dtype) {
        const char *s = json_is_string(dtype) ? json_string_value(dtype) : "";
        if (strcmp(s, "float32") == 0) t->dtype = RT_F32;
        else if (kind == KIND_INPUT && strcmp(s, "int64") == 0) t->dtype = RT_I64;
        else
            return rt_error(e, BAD "%s: dtype \"%s\" is not %s", where, s,
                            kind == KIND_INPUT ? "float32 or int64" : "float32");
    }
    json_t *shape = member(o, "shape", where, JSON_ARRAY, e);
    if (!shape) return false;
    size_t nd = json_array_size(shape);
    if (nd > RT_MAX_DIMS)
        return rt_error(e, BAD "%s: %zu dimensions, at most %d are supported", where, nd, RT_MAX_DIMS);
    if (batched && nd == 0) return rt_error(e, BAD "%s: shape is empty, expected [batch, ...]", where);
    t->ndim = (int)nd;
    t->elems = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < (batched ? 1 : 0))
            return rt_error(e, BAD "%s: shape[%zu] is not a %s integer", where, i,
                            batched ? "positive" : "non-negative");
        t->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(t->elems, t->shape[i], &t->elems))
            return rt_error(e, BAD "%s: shape overflows", where);
    }
    if (batched && t->shape[0] != m->local_batch) {
        if (m->local_batch == m->batch)
            return rt_error(e, BAD "%s: shape[0] is %" PRId64 ", expected the batch %" PRId64, where,
                            t->shape[0], m->batch);
        return rt_error(e, BAD "%s: shape[0] is %" PRId64 ", expected the local batch %" PRId64
                        " (batch %" PRId64 " over %d ranks)", where, t->shape[0], m->local_batch, m->batch,
                        m->ranks);
    }
    if (kind == KIND_PARAM) t->row_elems = t->elems;
    else if (nd >= 1 && t->shape[0] == m->local_batch) t->row_elems = t->elems / m->local_batch;
    else t->row_elems = 0; /* no rows: nothing to predict */
    if (__builtin_mul_overflow((uint64_t)t->elems, (uint64_t)rt_dtype_size(t->dtype), &t->bytes))
        return rt_error(e, BAD "%s: size overflows", where);
    if (!get_offset(o, where, t->bytes, m, &t->offset, e)) return false;
    t->name = strdup(json_string_value(name));
    if (!t->name) return rt_error(e, "out of memory reading the program metadata");
    return true;
}

static bool get_scalar_slot(json_t *root, const char *key, const RtMeta *m, uint64_t *out, RtErr *e) {
    json_t *o = member(root, key, "", JSON_OBJECT, e);
    return o && get_offset(o, key, 4, m, out, e);
}

static bool get_tensor_list(json_t *root, const char *key, TensorKind kind, RtMeta *m,
                            RtTensor **out, int *n_out, RtErr *e) {
    json_t *arr = member(root, key, "", JSON_ARRAY, e);
    if (!arr) return false;
    size_t n = json_array_size(arr);
    if (kind == KIND_INPUT && n == 0) return rt_error(e, BAD "\"inputs\" is empty");
    if (n > 1000000) return rt_error(e, BAD "\"%s\" has %zu entries", key, n);
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out) return rt_error(e, "out of memory reading the program metadata");
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        if (!get_tensor(json_array_get(arr, i), where, kind, m, &(*out)[i], e)) return false;
        *n_out = (int)i + 1;
        for (size_t j = 0; j < i; j++)
            if (strcmp((*out)[j].name, (*out)[i].name) == 0)
                return rt_error(e, BAD "%s: name \"%s\" is used twice", key, (*out)[i].name);
    }
    return true;
}

static int cmp_bucket(const void *a, const void *b) {
    uint64_t x = ((const RtBucket *)a)->offset, y = ((const RtBucket *)b)->offset;
    return x < y ? -1 : x > y;
}

/* "strategy", "local_batch", "ranks" and "buckets": how the batch is shared
 * among the ranks.  Absent fields describe a single-rank program. */
static bool parse_parallel(json_t *root, int64_t ranks, RtMeta *m, RtErr *e) {
    if (ranks > 1000000) return rt_error(e, BAD "\"ranks\" is %" PRId64, ranks);
    m->ranks = (int)ranks;
    json_t *strategy = json_object_get(root, "strategy");
    if (strategy) {
        if (!json_is_string(strategy)) return rt_error(e, BAD "\"strategy\" is not a string");
        const char *s = json_string_value(strategy);
        if (strcmp(s, "dp") == 0) m->dp = true;
        else if (strcmp(s, "single") != 0)
            return rt_error(e, "program metadata has strategy \"%s\", which this runtime does not run (single, dp): "
                            "rebuild the program with the matching cleave", s);
    }
    m->local_batch = m->batch;
    if (json_object_get(root, "local_batch") && !get_int(root, "local_batch", "", 1, &m->local_batch, e))
        return false;
    if (!m->dp && (ranks != 1 || m->local_batch != m->batch))
        return rt_error(e, BAD "strategy single with \"ranks\" %" PRId64 " and \"local_batch\" %" PRId64
                        " (expected 1 and the batch %" PRId64 ")", ranks, m->local_batch, m->batch);
    if (m->dp && (m->local_batch > m->batch / ranks || m->local_batch * ranks != m->batch))
        return rt_error(e, BAD "strategy dp: \"local_batch\" %" PRId64 " times \"ranks\" %" PRId64
                        " is not \"batch\" %" PRId64, m->local_batch, ranks, m->batch);

    json_t *buckets = json_object_get(root, "buckets");
    if (!buckets) return true;
    if (!json_is_array(buckets)) return rt_error(e, BAD "\"buckets\" is not an array");
    size_t n = json_array_size(buckets);
    if (n && !m->dp) return rt_error(e, BAD "strategy single with %zu gradient buckets", n);
    if (n > 1000000) return rt_error(e, BAD "\"buckets\" has %zu entries", n);
    m->buckets = calloc(n ? n : 1, sizeof *m->buckets);
    if (!m->buckets) return rt_error(e, "out of memory reading the program metadata");
    m->n_buckets = (int)n;
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "buckets[%zu]", i);
        json_t *b = json_array_get(buckets, i);
        if (!json_is_object(b)) return rt_error(e, BAD "%s is not an object", where);
        int64_t off, count;
        if (!get_int(b, "offset", where, 0, &off, e) || !get_int(b, "count", where, 0, &count, e)) return false;
        if (off % 4) return rt_error(e, BAD "%s: offset %" PRId64 " is not a multiple of 4", where, off);
        if (count > INT32_MAX)
            return rt_error(e, BAD "%s: %" PRId64 " values, more than one MPI call can sum (%d)", where, count,
                            INT32_MAX);
        if ((uint64_t)off > m->arena_bytes || (uint64_t)count * 4 > m->arena_bytes - (uint64_t)off)
            return rt_error(e, BAD "%s: %" PRId64 " values at offset %" PRId64 " end past the arena of %" PRIu64
                            " bytes", where, count, off, m->arena_bytes);
        m->buckets[i] = (RtBucket){(uint64_t)off, (int)count};
    }
    /* Overlapping buckets would be summed twice. */
    RtBucket *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return rt_error(e, "out of memory reading the program metadata");
    memcpy(sorted, m->buckets, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_bucket);
    bool overlap = false;
    for (size_t i = 1; i < n && !overlap; i++)
        overlap = sorted[i - 1].offset + 4 * (uint64_t)sorted[i - 1].count > sorted[i].offset;
    free(sorted);
    if (overlap) return rt_error(e, BAD "\"buckets\" overlap");
    return true;
}

static bool parse_root(json_t *root, RtMeta *m, RtErr *e) {
    if (!json_is_object(root)) return rt_error(e, BAD "not a JSON object");
    int64_t abi, ranks, programs, arena, init;
    if (!get_int(root, "abi", "", 0, &abi, e)) return false;
    if (abi != CLEAVE_ABI_VERSION)
        return rt_error(e, "program metadata has abi version %" PRId64 " but this runtime implements %d: "
                        "rebuild the program with the matching cleave", abi, CLEAVE_ABI_VERSION);
    json_t *hash = member(root, "plan_hash", "", JSON_STRING, e);
    if (!hash) return false;
    size_t hash_len = strlen(json_string_value(hash));
    if (hash_len == 0 || hash_len > RT_HASH_MAX)
        return rt_error(e, BAD "\"plan_hash\" has %zu characters, expected 1 to %d", hash_len, RT_HASH_MAX);
    memcpy(m->plan_hash, json_string_value(hash), hash_len + 1);
    if (!get_int(root, "ranks", "", 1, &ranks, e) || !get_int(root, "rank_programs", "", 1, &programs, e) ||
        !get_int(root, "batch", "", 1, &m->batch, e) || !get_int(root, "arena_bytes", "", 1, &arena, e) ||
        !get_int(root, "init_bytes", "", 0, &init, e))
        return false;
    /* aligned_alloc wants a multiple of the alignment; the tail is unused. */
    if (arena > INT64_MAX - 63) return rt_error(e, BAD "\"arena_bytes\" is too large");
    m->arena_bytes = ((uint64_t)arena + 63) / 64 * 64;
    if (init > arena)
        return rt_error(e, BAD "\"init_bytes\" %" PRId64 " exceeds \"arena_bytes\" %" PRId64, init, arena);
    m->init_bytes = (uint64_t)init;
    if (!parse_parallel(root, ranks, m, e)) return false;

    if (!get_scalar_slot(root, "loss", m, &m->loss_offset, e) ||
        !get_scalar_slot(root, "lr", m, &m->lr_offset, e) ||
        !get_scalar_slot(root, "step", m, &m->step_offset, e))
        return false;
    json_t *lr = member(json_object_get(root, "lr"), "value", "lr", JSON_REAL, e);
    if (!lr) return false;
    double lrv = json_number_value(lr);
    if (!isfinite(lrv) || !isfinite((float)lrv) || lrv < 0)
        return rt_error(e, BAD "lr: \"value\" %g is not a non-negative float32", lrv);
    m->lr = (float)lrv;

    json_t *kind = member(root, "loss_kind", "", JSON_STRING, e);
    if (!kind) return false;
    const char *k = json_string_value(kind);
    if (strcmp(k, "ce") == 0) m->loss_kind = RT_LOSS_CE;
    else if (strcmp(k, "mse") == 0) m->loss_kind = RT_LOSS_MSE;
    else if (strcmp(k, "model") == 0) m->loss_kind = RT_LOSS_MODEL;
    else return rt_error(e, BAD "\"loss_kind\" \"%s\" is not ce, mse or model", k);

    if (!get_tensor_list(root, "inputs", KIND_INPUT, m, &m->inputs, &m->n_inputs, e)) return false;
    json_t *out = member(root, "output", "", JSON_OBJECT, e);
    TensorKind out_kind = m->loss_kind == RT_LOSS_MODEL ? KIND_MODEL_OUTPUT : KIND_OUTPUT;
    if (!out || !get_tensor(out, "output", out_kind, m, &m->output, e)) return false;
    if (!get_tensor_list(root, "params", KIND_PARAM, m, &m->params, &m->n_params, e)) return false;
    json_t *params = json_object_get(root, "params");
    for (int i = 0; i < m->n_params; i++) {
        char where[64];
        snprintf(where, sizeof where, "params[%d]", i);
        if (!member(json_array_get(params, (size_t)i), "trainable", where, JSON_TRUE, e)) return false;
    }

    if (!member(root, "optimizer", "", JSON_OBJECT, e)) return false;

    m->labels = rt_meta_input(m, "labels");
    if (m->loss_kind == RT_LOSS_CE) {
        /* Accuracy and the label range check read the output as logits over
         * its last dimension, one label per logits row. */
        if (m->labels < 0) return rt_error(e, BAD "loss_kind ce but no input is named \"labels\"");
        const RtTensor *lab = &m->inputs[m->labels];
        if (lab->dtype != RT_I64) return rt_error(e, BAD "loss_kind ce but \"labels\" is not int64");
        if (m->output.ndim < 2)
            return rt_error(e, BAD "loss_kind ce but the output is not [batch, ..., classes]");
        m->classes = m->output.shape[m->output.ndim - 1];
        if (lab->row_elems * m->classes != m->output.row_elems)
            return rt_error(e, BAD "loss_kind ce: an output of %" PRId64 " values per sample over %" PRId64
                            " classes needs %" PRId64 " labels per sample, \"labels\" has %" PRId64,
                            m->output.row_elems, m->classes, m->output.row_elems / m->classes, lab->row_elems);
    }
    return true;
}

bool rt_meta_parse(const char *json, size_t len, RtMeta *m, RtErr *e) {
    memset(m, 0, sizeof *m);
    m->labels = -1;
    if (!json || len == 0) return rt_error(e, "program metadata is empty");
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return rt_error(e, "program metadata is not valid JSON: %s at line %d column %d", jerr.text,
                        jerr.line, jerr.column);
    bool ok = parse_root(root, m, e);
    json_decref(root);
    if (!ok) rt_meta_free(m);
    return ok;
}

void rt_meta_free(RtMeta *m) {
    for (int i = 0; i < m->n_inputs; i++) free(m->inputs[i].name);
    for (int i = 0; i < m->n_params; i++) free(m->params[i].name);
    free(m->inputs);
    free(m->params);
    free(m->output.name);
    free(m->buckets);
    memset(m, 0, sizeof *m);
    m->labels = -1;
}

int rt_meta_input(const RtMeta *m, const char *name) {
    for (int i = 0; i < m->n_inputs; i++)
        if (strcmp(m->inputs[i].name, name) == 0) return i;
    return -1;
}
