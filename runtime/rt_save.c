/* rt_save.c - --save: the embedded ONNX model with the trained parameters.
 *
 * The program carries the model it was compiled from (cleave_model).  Each
 * initializer named like a parameter of the metadata gets the trained values
 * from the arena, in the initializer's own data type, as raw_data; its typed
 * fields and any external-data reference are dropped so exactly one copy of
 * the values remains.  Names, dims, data types and everything else in the
 * model stay as they were, so the file loads wherever the original did. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "out_file.h"
#include "rt.h"

/* float32 -> IEEE half, rounding to nearest even; overflow becomes infinity,
 * NaN stays NaN. */
uint16_t rt_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31) return sign | 0x7c00;
    if (e <= 0) {
        /* Subnormal half: the 24-bit significand shifted down by 14 - e. */
        if (e < -10) return sign;
        uint32_t full = man | 0x800000, shift = (uint32_t)(14 - e);
        uint32_t h = full >> shift, rem = full & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
    /* A carry out of the significand rolls into the exponent, as it should. */
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

uint16_t rt_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

float rt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | exp << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp - 15 + 127) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static size_t onnx_float_size(int32_t data_type) {
    switch (data_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return 8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16:
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: return 2;
    default: return 0;
    }
}

static Onnx__ModelProto *unpack(const RtProgram *p, RtErr *e) {
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, p->model_len, p->model);
    if (!mp) {
        rt_error(e, "--save: the ONNX model embedded in the program cannot be parsed (the program is broken)");
        return NULL;
    }
    if (!mp->graph) {
        onnx__model_proto__free_unpacked(mp, NULL);
        rt_error(e, "--save: the ONNX model embedded in the program has no graph (the program is broken)");
        return NULL;
    }
    return mp;
}

static Onnx__TensorProto *find_initializer(Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && strcmp(g->initializer[i]->name, name) == 0) return g->initializer[i];
    return NULL;
}

/* Every parameter has an initializer of a float type with as many values. */
static bool check_model(Onnx__ModelProto *mp, const RtMeta *m, RtErr *e) {
    for (int k = 0; k < m->n_params; k++) {
        const RtTensor *p = &m->params[k];
        Onnx__TensorProto *t = find_initializer(mp->graph, p->name);
        if (!t)
            return rt_error(e, "--save: parameter '%s' is not an initializer of the model embedded in the program",
                            p->name);
        int64_t count = 1;
        for (size_t i = 0; i < t->n_dims; i++)
            if (t->dims[i] < 0 || __builtin_mul_overflow(count, t->dims[i], &count))
                return rt_error(e, "--save: initializer '%s' has invalid dims", p->name);
        if (count != p->elems)
            return rt_error(e, "--save: initializer '%s' holds %" PRId64 " values but the program's parameter "
                            "has %" PRId64, p->name, count, p->elems);
        if (!onnx_float_size(t->data_type))
            return rt_error(e, "--save: initializer '%s' has ONNX data type %d; only float, float16, bfloat16 "
                            "and double parameters can be written back", p->name, (int)t->data_type);
    }
    return true;
}

/* Drops every other place the values could be stored. */
static void clear_contents(Onnx__TensorProto *t) {
    free(t->float_data);
    free(t->int32_data);
    free(t->int64_data);
    free(t->double_data);
    free(t->uint64_data);
    for (size_t i = 0; i < t->n_string_data; i++) free(t->string_data[i].data);
    free(t->string_data);
    t->float_data = NULL, t->n_float_data = 0;
    t->int32_data = NULL, t->n_int32_data = 0;
    t->int64_data = NULL, t->n_int64_data = 0;
    t->double_data = NULL, t->n_double_data = 0;
    t->uint64_data = NULL, t->n_uint64_data = 0;
    t->string_data = NULL, t->n_string_data = 0;
    for (size_t i = 0; i < t->n_external_data; i++)
        onnx__string_string_entry_proto__free_unpacked(t->external_data[i], NULL);
    free(t->external_data);
    t->external_data = NULL, t->n_external_data = 0;
    t->has_data_location = 0;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
    if (t->segment) protobuf_c_message_free_unpacked(&t->segment->base, NULL);
    t->segment = NULL;
}

static bool write_values(Onnx__TensorProto *t, const RtTensor *p, const char *arena, RtErr *e) {
    size_t esize = onnx_float_size(t->data_type), n = (size_t)p->elems, bytes = n * esize;
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) return rt_error(e, "--save: out of memory for parameter '%s'", p->name);
    const char *src = arena + p->offset;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, src + 4 * i, 4);
        switch (t->data_type) {
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: memcpy(buf + 4 * i, &v, 4); break;
        case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: { double d = v; memcpy(buf + 8 * i, &d, 8); break; }
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: { uint16_t h = rt_f32_to_f16(v); memcpy(buf + 2 * i, &h, 2); break; }
        default: { uint16_t h = rt_f32_to_bf16(v); memcpy(buf + 2 * i, &h, 2); break; }
        }
    }
    clear_contents(t);
    free(t->raw_data.data);
    t->raw_data.data = buf;
    t->raw_data.len = bytes;
    t->has_raw_data = 1;
    return true;
}

bool rt_save_check(const RtProgram *p, const RtMeta *m, RtErr *e) {
    Onnx__ModelProto *mp = unpack(p, e);
    if (!mp) return false;
    bool ok = check_model(mp, m, e);
    onnx__model_proto__free_unpacked(mp, NULL);
    return ok;
}

bool rt_save_pack(const RtProgram *p, const RtMeta *m, const char *arena, uint8_t **bytes, size_t *len, RtErr *e) {
    Onnx__ModelProto *mp = unpack(p, e);
    if (!mp) return false;
    bool ok = check_model(mp, m, e);
    for (int k = 0; ok && k < m->n_params; k++)
        ok = write_values(find_initializer(mp->graph, m->params[k].name), &m->params[k], arena, e);
    *bytes = NULL;
    *len = 0;
    if (ok) {
        *len = onnx__model_proto__get_packed_size(mp);
        *bytes = malloc(*len ? *len : 1);
        if (!*bytes) ok = rt_error(e, "--save: out of memory for %zu bytes", *len);
        else onnx__model_proto__pack(mp, *bytes);
    }
    onnx__model_proto__free_unpacked(mp, NULL);
    return ok;
}

bool rt_save_write(const char *path, const RtProgram *p, const RtMeta *m, const char *arena, RtErr *e) {
    uint8_t *bytes;
    size_t len;
    if (!rt_save_pack(p, m, arena, &bytes, &len, e)) return false;
    /* Beside the target and renamed over it: a full disk or a kill
     * during the write leaves the previous model at path whole. */
    OutFile out;
    int err = out_file_open(&out, path);
    if (err) {
        free(bytes);
        return rt_error(e, "--save %s: cannot write: %s", path, out_file_why(err));
    }
    out_file_write(&out, bytes, len);
    free(bytes);
    err = out_file_finish(&out);
    if (err) return rt_error(e, "--save %s: write failed, the file is as it was: %s", path, out_file_why(err));
    return true;
}

/* The model's identity apart from its weights: FNV-1a over the embedded
 * model with the parameters' values removed.  Two programs compiled from
 * the same file, under any plan, agree; another graph, another
 * initializer's shape or a changed constant do not. */
bool rt_save_model_hash(const RtProgram *p, const RtMeta *m, uint64_t *hash, RtErr *e) {
    Onnx__ModelProto *mp = unpack(p, e);
    if (!mp) return false;
    for (int k = 0; k < m->layout.n_all_params; k++) {
        Onnx__TensorProto *t = find_initializer(mp->graph, m->layout.all_params[k].name);
        if (!t) continue;
        clear_contents(t);
        free(t->raw_data.data);
        t->raw_data.data = NULL;
        t->raw_data.len = 0;
        t->has_raw_data = 0;
    }
    size_t len = onnx__model_proto__get_packed_size(mp);
    uint8_t *bytes = malloc(len ? len : 1);
    bool ok = bytes != NULL;
    if (ok) {
        onnx__model_proto__pack(mp, bytes);
        *hash = rt_fnv1a64(RT_FNV1A64_INIT, bytes, len);
    } else {
        rt_error(e, "out of memory for the model's %zu bytes", len);
    }
    free(bytes);
    onnx__model_proto__free_unpacked(mp, NULL);
    return ok;
}
