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
/* KIND_STATE: the optimizer's state of a parameter, float32 like it. */
typedef enum { KIND_INPUT, KIND_OUTPUT, KIND_MODEL_OUTPUT, KIND_PARAM, KIND_STATE } TensorKind;

/* A tensor described by o, at the offset of off (its entry in this
 * rank's program); absent when off is NULL. */
static bool get_tensor(json_t *o, json_t *off, const char *where, TensorKind kind, const RtMeta *m, RtTensor *t,
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
                        " (batch %" PRId64 " over %d replicas)", where, t->shape[0], m->local_batch, m->batch,
                        m->layout.dp);
    }
    if (kind == KIND_PARAM || kind == KIND_STATE) t->row_elems = t->elems;
    else if (nd >= 1 && t->shape[0] == m->local_batch) t->row_elems = t->elems / m->local_batch;
    else t->row_elems = 0; /* no rows: nothing to predict */
    if (__builtin_mul_overflow((uint64_t)t->elems, (uint64_t)rt_dtype_size(t->dtype), &t->bytes))
        return rt_error(e, BAD "%s: size overflows", where);
    json_t *fill = kind == KIND_INPUT ? json_object_get(o, "fill") : NULL;
    if (fill) {
        if (!json_is_string(fill) || strcmp(json_string_value(fill), "positions") != 0)
            return rt_error(e, BAD "%s: \"fill\" is not \"positions\"", where);
        if (t->dtype != RT_I64 || nd != 1)
            return rt_error(e, BAD "%s: positions are filled into int64 [batch], not %s with %zu dimensions", where,
                            rt_dtype_name(t->dtype), nd);
        t->positions = true;
    }
    t->absent = off == NULL;
    if (off && !get_offset(off, where, t->bytes, m, &t->offset, e)) return false;
    t->name = strdup(json_string_value(name));
    if (!t->name) return rt_error(e, "out of memory reading the program metadata");
    return true;
}

/* The entry of arr named `name`, or NULL. */
static json_t *find_named(json_t *arr, const char *name) {
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) {
        json_t *n = json_object_get(x, "name");
        if (json_is_string(n) && strcmp(json_string_value(n), name) == 0) return x;
    }
    return NULL;
}

/* Tensors root[key], their offsets from this rank's program prog[key] by
 * name; names missing there are absent, and absent parameters skipped. */
static bool get_tensor_list(json_t *root, json_t *prog, const char *key, TensorKind kind, RtMeta *m,
                            RtTensor **out, int *n_out, RtErr *e) {
    json_t *arr = member(root, key, "", JSON_ARRAY, e);
    if (!arr) return false;
    size_t n = json_array_size(arr);
    if (kind == KIND_INPUT && n == 0) return rt_error(e, BAD "\"inputs\" is empty");
    if (n > 1000000) return rt_error(e, BAD "\"%s\" has %zu entries", key, n);
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out) return rt_error(e, "out of memory reading the program metadata");
    json_t *offsets = member(prog, key, "program", JSON_ARRAY, e);
    if (!offsets) return false;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        json_t *o = json_array_get(arr, i), *name = json_object_get(o, "name");
        json_t *off = json_is_string(name) ? find_named(offsets, json_string_value(name)) : NULL;
        if (!off && (kind == KIND_PARAM || kind == KIND_STATE)) continue;
        int k = *n_out;
        if (!get_tensor(o, off, where, kind, m, &(*out)[k], e)) return false;
        *n_out = k + 1; /* counted before anything else can fail, so rt_meta_free frees its name */
        json_t *trainable = kind == KIND_PARAM ? member(o, "trainable", where, JSON_TRUE, e) : NULL;
        if (kind == KIND_PARAM && !trainable) return false;
        (*out)[k].trainable = json_is_true(trainable);
        /* PARAM of PARAM.SLOT, which parse_all checks */
        json_t *param = kind == KIND_STATE ? json_object_get(o, "param") : NULL;
        if (json_is_string(param)) (*out)[k].of_len = (int)strlen(json_string_value(param));
        for (int j = 0; j < k; j++)
            if (strcmp((*out)[j].name, (*out)[k].name) == 0)
                return rt_error(e, BAD "%s: name \"%s\" is used twice", key, (*out)[k].name);
    }
    return true;
}

static int cmp_bucket(const void *a, const void *b) {
    uint64_t x = ((const RtBucket *)a)->offset, y = ((const RtBucket *)b)->offset;
    return x < y ? -1 : x > y;
}

/* "buckets" of this rank's program: its gradient buckets, inside the
 * arena, summed over the replicas of its stage. */
static bool parse_buckets(json_t *prog, RtMeta *m, RtErr *e) {
    json_t *buckets = json_object_get(prog, "buckets");
    if (!buckets) return true;
    if (!json_is_array(buckets)) return rt_error(e, BAD "\"buckets\" is not an array");
    size_t n = json_array_size(buckets);
    if (n && m->layout.dp == 1) return rt_error(e, BAD "%zu gradient buckets but no replicas to sum them over", n);
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

int rt_layout_rank(const RtLayout *l, int replica, int stage) {
    return l->by_stage ? stage * l->dp + replica : replica * l->stages + stage;
}

bool rt_layout_pipelined(const RtLayout *l) { return l->stages > 1 || l->microbatches > 1; }

/* Whether a * b is want, without overflowing. */
static bool product_is(int64_t a, int64_t b, int64_t want) {
    int64_t p;
    return !__builtin_mul_overflow(a, b, &p) && p == want;
}

/* The layout (rt_abi.h): D x P ranks, M micro-batches; returns the
 * program of this rank's stage.  A rank beyond the ranks the program is
 * compiled for takes the place of rank % ranks: rt_comm_startup lets
 * only a one-rank program run so, each rank training alone. */
static json_t *parse_layout(json_t *root, int rank, RtMeta *m, RtErr *e) {
    RtLayout *l = &m->layout;
    int64_t P, D, M, mb, tags;
    if (!get_int(root, "stages", "", 1, &P, e) || !get_int(root, "dp", "", 1, &D, e) ||
        !get_int(root, "microbatches", "", 1, &M, e) || !get_int(root, "micro_batch", "", 1, &mb, e) ||
        !get_int(root, "local_batch", "", 1, &m->local_batch, e) || !get_int(root, "tag_bound", "", 0, &tags, e))
        return NULL;
    if (P > 1000000 || D > 1000000 || M > 1000000 || P * D != m->ranks)
        return rt_error(e, BAD "\"dp\" %" PRId64 " x \"stages\" %" PRId64 " is not \"ranks\" %d", D, P, m->ranks),
               NULL;
    if (!product_is(m->local_batch, D, m->batch))
        return rt_error(e, BAD "\"local_batch\" %" PRId64 " x \"dp\" %" PRId64 " is not \"batch\" %" PRId64,
                        m->local_batch, D, m->batch), NULL;
    if (!product_is(mb, M, m->local_batch))
        return rt_error(e, BAD "\"micro_batch\" %" PRId64 " x \"microbatches\" %" PRId64 " is not \"local_batch\" %"
                        PRId64, mb, M, m->local_batch), NULL;
    json_t *sched = member(root, "schedule", "", JSON_STRING, e);
    if (!sched) return NULL;
    snprintf(l->schedule, sizeof l->schedule, "%s", json_string_value(sched));
    l->stages = (int)P;
    l->dp = (int)D;
    l->microbatches = (int)M;
    l->micro_batch = mb;
    l->tag_bound = tags;
    json_t *place = json_object_get(root, "placement");
    const char *pl = place ? json_string_value(place) : "by_replica";
    if (!pl || (strcmp(pl, "by_replica") && strcmp(pl, "by_stage")))
        return rt_error(e, BAD "\"placement\" must be \"by_replica\" or \"by_stage\""), NULL;
    l->by_stage = strcmp(pl, "by_stage") == 0;
    int64_t node = 0;
    if (json_object_get(root, "allreduce_ranks_per_node") &&
        !get_int(root, "allreduce_ranks_per_node", "", 1, &node, e))
        return NULL;
    if (node > 1000000)
        return rt_error(e, BAD "\"allreduce_ranks_per_node\" is %" PRId64 ", expected at most 1000000", node), NULL;
    l->allreduce_node = (int)node;
    rank %= m->ranks;
    l->stage = l->by_stage ? rank / l->dp : rank % l->stages;
    l->replica = l->by_stage ? rank % l->dp : rank / l->stages;
    json_t *programs = member(root, "programs", "", JSON_ARRAY, e);
    if (!programs) return NULL;
    if (json_array_size(programs) != (size_t)P)
        return rt_error(e, BAD "%zu programs for %" PRId64 " stages", json_array_size(programs), P), NULL;
    json_t *prog = json_array_get(programs, (size_t)l->stage);
    int64_t stage, init_off, peak;
    if (!json_is_object(prog)) return rt_error(e, BAD "programs[%d] is not an object", l->stage), NULL;
    if (!get_int(prog, "stage", "program", 0, &stage, e) || !get_int(prog, "init_offset", "program", 0, &init_off, e) ||
        !get_int(prog, "peak_activation_bytes", "program", 0, &peak, e))
        return NULL;
    if (stage != l->stage) return rt_error(e, BAD "programs[%d] is stage %" PRId64, l->stage, stage), NULL;
    l->init_offset = (uint64_t)init_off;
    l->peak_act_bytes = peak;
    return prog;
}

/* An optional scalar slot of `bytes` bytes in this rank's program. */
static bool get_opt_slot(json_t *prog, const char *key, uint64_t bytes, const RtMeta *m, bool *has, uint64_t *out,
                         RtErr *e) {
    json_t *o = json_object_get(prog, key);
    *has = o != NULL;
    if (!o) return true;
    if (!json_is_object(o)) return rt_error(e, BAD "program: \"%s\" is not an object", key);
    return get_offset(o, key, bytes, m, out, e);
}

/* The scalar slots of this rank's program: lr and step when it runs
 * optimizer updates, the seed when it draws dropout masks, each
 * micro-batch's loss on the last stage. */
static bool parse_slots(json_t *prog, RtMeta *m, RtErr *e) {
    RtLayout *l = &m->layout;
    bool has_loss;
    if (!get_opt_slot(prog, "lr", 4, m, &l->has_lr, &m->lr_offset, e) ||
        !get_opt_slot(prog, "step", 4, m, &l->has_step, &m->step_offset, e) ||
        !get_opt_slot(prog, "seed", 8, m, &l->has_seed, &m->seed_offset, e) ||
        !get_opt_slot(prog, "label_count", 4, m, &l->has_label_count, &m->label_count_offset, e) ||
        !get_opt_slot(prog, "loss", 4, m, &has_loss, &m->loss_offset, e))
        return false;
    if (!has_loss) return true;
    int64_t count;
    if (!get_int(json_object_get(prog, "loss"), "count", "loss", 1, &count, e)) return false;
    if (count != l->microbatches || (uint64_t)count * 4 > m->arena_bytes - m->loss_offset)
        return rt_error(e, BAD "loss: \"count\" %" PRId64 " is not the %d micro-batches or ends past the arena", count,
                        l->microbatches);
    l->loss_count = (int)count;
    return true;
}

/* Every tensor of root[key] ("params" or "state") and the stage --save
 * and checkpoints read it from; offsets are that stage's (rank 0 places
 * them when it gathers them).  Optimizer state also names its parameter:
 * "name" is PARAM.SLOT. */
static bool parse_all(json_t *root, const char *key, TensorKind kind, RtMeta *m, RtTensor **all, int **stages,
                      int *n_all, RtErr *e) {
    RtLayout *l = &m->layout;
    json_t *arr = json_object_get(root, key);
    size_t n = json_array_size(arr);
    *all = calloc(n ? n : 1, sizeof **all);
    *stages = calloc(n ? n : 1, sizeof **stages);
    if (!*all || !*stages) return rt_error(e, "out of memory reading the program metadata");
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        json_t *o = json_array_get(arr, i);
        int64_t stage;
        if (!get_tensor(o, NULL, where, kind, m, &(*all)[i], e)) return false;
        *n_all = (int)i + 1;
        if (!get_int(o, "stage", where, 0, &stage, e)) return false;
        if (stage >= l->stages) return rt_error(e, BAD "%s: stage %" PRId64 " of %d", where, stage, l->stages);
        (*stages)[i] = (int)stage;
        if (kind != KIND_STATE) continue;
        json_t *param = member(o, "param", where, JSON_STRING, e), *slot = member(o, "slot", where, JSON_STRING, e);
        if (!param || !slot) return false;
        const char *name = (*all)[i].name, *p = json_string_value(param);
        size_t plen = strlen(p);
        if (strncmp(name, p, plen) != 0 || name[plen] != '.' || strcmp(name + plen + 1, json_string_value(slot)) != 0)
            return rt_error(e, BAD "%s: \"name\" \"%s\" is not \"param\".\"slot\"", where, name);
        (*all)[i].of_len = (int)plen;
    }
    return true;
}

/* The inputs, the output and the parameters, with this rank's offsets. */
static bool parse_tensors(json_t *root, json_t *prog, RtMeta *m, RtErr *e) {
    if (!get_tensor_list(root, prog, "inputs", KIND_INPUT, m, &m->inputs, &m->n_inputs, e)) return false;
    json_t *out = member(root, "output", "", JSON_OBJECT, e);
    TensorKind out_kind = m->loss_kind == RT_LOSS_MODEL ? KIND_MODEL_OUTPUT : KIND_OUTPUT;
    json_t *out_off = json_object_get(prog, "output");
    m->layout.has_output = out_off != NULL;
    if (!out || !get_tensor(out, out_off, "output", out_kind, m, &m->output, e)) return false;
    RtLayout *l = &m->layout;
    if (!get_tensor_list(root, prog, "params", KIND_PARAM, m, &m->params, &m->n_params, e) ||
        !parse_all(root, "params", KIND_PARAM, m, &l->all_params, &l->param_stage, &l->n_all_params, e))
        return false;
    /* Absent (rt_abi.h): an optimizer without state, or a program from
     * before checkpoints, which then cannot write any. */
    if (!json_object_get(root, "state")) return true;
    m->has_state = true;
    return get_tensor_list(root, prog, "state", KIND_STATE, m, &m->state, &m->n_state, e) &&
           parse_all(root, "state", KIND_STATE, m, &l->all_state, &l->state_stage, &l->n_all_state, e);
}

static bool parse_root(json_t *root, int rank, RtMeta *m, RtErr *e) {
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
        !get_int(root, "batch", "", 1, &m->batch, e))
        return false;
    if (ranks > 1000000) return rt_error(e, BAD "\"ranks\" is %" PRId64, ranks);
    m->ranks = (int)ranks;
    /* Each stage's program keeps its own arena, slots and parameters in
     * "programs"; the rest is shared. */
    json_t *prog = parse_layout(root, rank, m, e);
    if (!prog) return false;
    if (!get_int(prog, "arena_bytes", "", 1, &arena, e) || !get_int(prog, "init_bytes", "", 0, &init, e))
        return false;
    /* aligned_alloc wants a multiple of the alignment; the tail is unused. */
    if (arena > INT64_MAX - 63) return rt_error(e, BAD "\"arena_bytes\" is too large");
    m->arena_bytes = ((uint64_t)arena + 63) / 64 * 64;
    if (init > arena)
        return rt_error(e, BAD "\"init_bytes\" %" PRId64 " exceeds \"arena_bytes\" %" PRId64, init, arena);
    m->init_bytes = (uint64_t)init;
    if (!parse_buckets(prog, m, e) || !parse_slots(prog, m, e)) return false;

    json_t *lr = member(json_object_get(root, "lr"), "value", "lr", JSON_REAL, e);
    if (!lr) return false;
    double lrv = json_number_value(lr);
    if (!isfinite(lrv) || !isfinite((float)lrv) || lrv < 0)
        return rt_error(e, BAD "lr: \"value\" %g is not a non-negative float32", lrv);
    m->lr = (float)lrv;
    /* The schedule is optional (absent: constant, no warmup), and only
     * given when the program was compiled with one. */
    json_t *lr_obj = json_object_get(root, "lr"), *sched = json_object_get(lr_obj, "schedule");
    if (sched) {
        if (!json_is_string(sched) || !rt_lr_schedule_parse(json_string_value(sched), &m->lr_schedule))
            return rt_error(e, BAD "lr: \"schedule\" is not constant, linear or cosine");
        m->has_lr_schedule = true;
    }
    if (json_object_get(lr_obj, "warmup_steps") && !get_int(lr_obj, "warmup_steps", "lr", 0, &m->warmup_steps, e))
        return false;

    json_t *kind = member(root, "loss_kind", "", JSON_STRING, e);
    if (!kind) return false;
    const char *k = json_string_value(kind);
    if (strcmp(k, "ce") == 0) m->loss_kind = RT_LOSS_CE;
    else if (strcmp(k, "mse") == 0) m->loss_kind = RT_LOSS_MSE;
    else if (strcmp(k, "model") == 0) m->loss_kind = RT_LOSS_MODEL;
    else return rt_error(e, BAD "\"loss_kind\" \"%s\" is not ce, mse or model", k);
    if (!parse_tensors(root, prog, m, e)) return false;
    json_t *opt = member(root, "optimizer", "", JSON_OBJECT, e);
    if (!opt) return false;
    /* kept as text: a checkpoint records it, and resuming compares it */
    m->optimizer = json_dumps(opt, JSON_COMPACT | JSON_SORT_KEYS);
    if (!m->optimizer) return rt_error(e, "out of memory reading the program metadata");
    /* Absent: one thread (rt_abi.h). */
    int64_t threads = 1;
    if (json_object_get(root, "threads") && !get_int(root, "threads", "", 1, &threads, e)) return false;
    if (threads > RT_MAX_THREADS)
        return rt_error(e, BAD "\"threads\" is %" PRId64 ", expected at most %d", threads, RT_MAX_THREADS);
    m->threads = (int)threads;
    json_t *state0 = json_object_get(root, "state_from_replica0");
    if (state0 && !json_is_boolean(state0)) return rt_error(e, BAD "\"state_from_replica0\" is not a boolean");
    m->state_from_replica0 = json_is_true(state0);

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
        /* Absent: every label counts (rt_abi.h). */
        m->has_ignore = json_object_get(root, "ignore_index") != NULL;
        if (m->has_ignore && !get_int(root, "ignore_index", "", INT64_MIN, &m->ignore_index, e)) return false;
    }
    /* the runtime counts the labels for the slot from this rank's data */
    if (m->layout.has_label_count && (m->loss_kind != RT_LOSS_CE || m->inputs[m->labels].absent))
        return rt_error(e, BAD "program: \"label_count\" without the \"labels\" input of loss_kind ce");
    return true;
}

bool rt_meta_parse(const char *json, size_t len, RtMeta *m, RtErr *e) {
    return rt_meta_parse_rank(json, len, 0, m, e);
}

bool rt_meta_parse_rank(const char *json, size_t len, int rank, RtMeta *m, RtErr *e) {
    memset(m, 0, sizeof *m);
    m->labels = -1;
    if (!json || len == 0) return rt_error(e, "program metadata is empty");
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return rt_error(e, "program metadata is not valid JSON: %s at line %d column %d", jerr.text,
                        jerr.line, jerr.column);
    bool ok = parse_root(root, rank, m, e);
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
    for (int i = 0; i < m->layout.n_all_params; i++) free(m->layout.all_params[i].name);
    free(m->layout.all_params);
    free(m->layout.param_stage);
    for (int i = 0; i < m->n_state; i++) free(m->state[i].name);
    free(m->state);
    for (int i = 0; i < m->layout.n_all_state; i++) free(m->layout.all_state[i].name);
    free(m->layout.all_state);
    free(m->layout.state_stage);
    free(m->optimizer);
    memset(m, 0, sizeof *m);
    m->labels = -1;
}

const char *rt_loss_kind_name(RtLossKind k) { return k == RT_LOSS_CE ? "ce" : k == RT_LOSS_MSE ? "mse" : "model"; }

int rt_meta_input(const RtMeta *m, const char *name) {
    for (int i = 0; i < m->n_inputs; i++)
        if (strcmp(m->inputs[i].name, name) == 0) return i;
    return -1;
}
