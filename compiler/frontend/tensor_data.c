/* tensor_data.c - decoding of tensor contents: raw bytes, the typed repeated
 * fields, and external data files.  All integer types become int64 and all
 * 16-bit floats become float32, so later passes deal with three storages. */
#include "tensor_data.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "onnx.h"

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Little-endian element i of raw bytes of type t, stored into c. */
static void store_raw(Const *c, DType t, const uint8_t *p, int64_t i) {
    switch (t) {
    case DT_FLOAT: { float x; memcpy(&x, p, 4); const_set_f(c, i, x); break; }
    case DT_DOUBLE: { double x; memcpy(&x, p, 8); const_set_f(c, i, x); break; }
    case DT_FLOAT16: { uint16_t x; memcpy(&x, p, 2); const_set_f(c, i, half_to_float(x)); break; }
    case DT_BFLOAT16: { uint16_t x; memcpy(&x, p, 2); const_set_f(c, i, bf16_to_float(x)); break; }
    case DT_INT8: const_set_i(c, i, (int8_t)p[0]); break;
    case DT_UINT8: const_set_i(c, i, p[0]); break;
    case DT_BOOL: const_set_i(c, i, p[0] != 0); break;
    case DT_INT16: { int16_t x; memcpy(&x, p, 2); const_set_i(c, i, x); break; }
    case DT_UINT16: { uint16_t x; memcpy(&x, p, 2); const_set_i(c, i, x); break; }
    case DT_INT32: { int32_t x; memcpy(&x, p, 4); const_set_i(c, i, x); break; }
    case DT_UINT32: { uint32_t x; memcpy(&x, p, 4); const_set_i(c, i, x); break; }
    case DT_INT64: case DT_UINT64: { int64_t x; memcpy(&x, p, 8); const_set_i(c, i, x); break; }
    default: break;
    }
}

/* int32_data holds int8..int32, bool, and the bit patterns of 16-bit floats. */
static void store_int32_field(Const *c, DType t, int32_t x, int64_t i) {
    if (t == DT_FLOAT16) const_set_f(c, i, half_to_float((uint16_t)x));
    else if (t == DT_BFLOAT16) const_set_f(c, i, bf16_to_float((uint16_t)x));
    else if (t == DT_BOOL) const_set_i(c, i, x != 0);
    else const_set_i(c, i, x);
}

/* Reads [offset, offset+length) of an external data file, refusing any
 * location that leaves the model's folder. */
static uint8_t *read_external(const Onnx__TensorProto *t, const char *model_dir, const char *what,
                              const char *model_path, size_t want, Diag *d) {
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = t->external_data[i];
        if (!e->key || !e->value) continue;
        char *end = NULL;
        if (strcmp(e->key, "location") == 0) {
            location = e->value;
        } else if (strcmp(e->key, "offset") == 0 || strcmp(e->key, "length") == 0) {
            long long x = strtoll(e->value, &end, 10);
            if (!*e->value || *end || x < 0) {
                diag_error(d, DIAG_FORMAT, "%s: %s: external data %s '%s' is not a non-negative integer",
                           model_path, what, e->key, e->value);
                return NULL;
            }
            if (e->key[0] == 'o') offset = x;
            else length = x;
        }
    }
    if (!location || !*location) {
        diag_error(d, DIAG_FORMAT, "%s: %s: external data has no location", model_path, what);
        return NULL;
    }
    if (location[0] == '/' || strstr(location, "..")) {
        diag_error(d, DIAG_FORMAT, "%s: %s: external data location '%s' leaves the model's folder",
                   model_path, what, location);
        return NULL;
    }
    char joined[PATH_MAX], real_file[PATH_MAX], real_dir[PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", model_dir, location) >= (int)sizeof joined) {
        diag_error(d, DIAG_FORMAT, "%s: %s: external data location too long", model_path, what);
        return NULL;
    }
    if (!realpath(model_dir, real_dir) || !realpath(joined, real_file)) {
        diag_error(d, DIAG_IO, "%s: %s: external data file '%s' not found", model_path, what, location);
        return NULL;
    }
    size_t dl = strlen(real_dir);
    /* A symlink may still point outside: compare resolved paths. */
    if (strncmp(real_file, real_dir, dl) != 0 || (real_file[dl] != '/' && strcmp(real_dir, "/") != 0)) {
        diag_error(d, DIAG_FORMAT, "%s: %s: external data location '%s' resolves outside the model's folder",
                   model_path, what, location);
        return NULL;
    }
    /* Only the wanted range is read: one external file usually holds every
     * weight of the model, and reading all of it per tensor would cost
     * its size times the tensor count. */
    struct stat st;
    FILE *f = NULL;
    if (stat(real_file, &st) != 0 || !S_ISREG(st.st_mode) || !(f = fopen(real_file, "rb"))) {
        diag_error(d, DIAG_IO, "%s: %s: external data file '%s' is not a readable regular file", model_path, what,
                   location);
        return NULL;
    }
    int64_t flen = (int64_t)st.st_size;
    /* Offset first: a missing length defaults to the rest of the file,
     * which is negative when the offset lies past the end. */
    if (offset > flen) {
        fclose(f);
        diag_error(d, DIAG_FORMAT, "%s: %s: external data offset %lld lies past the end of '%s' (%lld bytes)",
                   model_path, what, (long long)offset, location, (long long)flen);
        return NULL;
    }
    if (length < 0) length = flen - offset;
    if (length > flen - offset) {
        fclose(f);
        diag_error(d, DIAG_FORMAT,
                   "%s: %s: external data [offset %lld, length %lld] lies outside '%s' (%lld bytes)", model_path,
                   what, (long long)offset, (long long)length, location, (long long)flen);
        return NULL;
    }
    if ((uint64_t)length != want) {
        fclose(f);
        diag_error(d, DIAG_FORMAT, "%s: %s: external data holds %lld bytes, the shape needs %zu", model_path,
                   what, (long long)length, want);
        return NULL;
    }
    uint8_t *out = malloc(want ? want : 1);
    if (!out) {
        fclose(f);
        diag_error(d, DIAG_NOMEM, "%s: %s: out of memory", model_path, what);
        return NULL;
    }
    bool ok = fseeko(f, (off_t)offset, SEEK_SET) == 0 && fread(out, 1, want, f) == want;
    fclose(f);
    if (!ok) {
        free(out);
        diag_error(d, DIAG_IO, "%s: %s: read error in external data file '%s'", model_path, what, location);
        return NULL;
    }
    return out;
}

/* The typed repeated field holding t's values when raw_data is absent. */
static size_t typed_count(const Onnx__TensorProto *t, DType dt, const char **field) {
    switch (dt) {
    case DT_FLOAT: *field = "float_data"; return t->n_float_data;
    case DT_DOUBLE: *field = "double_data"; return t->n_double_data;
    case DT_INT64: *field = "int64_data"; return t->n_int64_data;
    case DT_UINT32:
    case DT_UINT64: *field = "uint64_data"; return t->n_uint64_data;
    default: *field = "int32_data"; return t->n_int32_data;
    }
}

bool tensor_to_value(Graph *g, const Onnx__TensorProto *t, const char *model_dir, const char *what, Value *v,
                     Diag *d) {
    DType dt = (DType)t->data_type;
    size_t esize = dtype_size(dt);
    if (dt == DT_STRING) return diag_error(d, DIAG_UNSUPPORTED, "%s: %s: string tensors are not supported", g->path, what);
    if (esize == 0 || dtype_store(dt) == DT_UNDEFINED)
        return diag_error(d, DIAG_UNSUPPORTED, "%s: %s: unsupported tensor data type %d", g->path, what,
                          t->data_type);
    if (t->n_dims > MAX_RANK)
        return diag_error(d, DIAG_UNSUPPORTED, "%s: %s: rank %zu exceeds the maximum %d", g->path, what, t->n_dims,
                          MAX_RANK);
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        int64_t k = t->dims[i];
        if (k < 0) return diag_error(d, DIAG_FORMAT, "%s: %s: negative dimension %lld", g->path, what, (long long)k);
        if (k && n > ONNX_MAX_TENSOR_BYTES / (int64_t)esize / k)
            return diag_error(d, DIAG_LIMIT, "%s: %s: dimensions overflow the tensor size limit (%lld bytes)",
                              g->path, what, (long long)ONNX_MAX_TENSOR_BYTES);
        n *= k;
    }
    size_t bytes = (size_t)n * esize;

    /* The contents are checked against the shape before the Const is
     * allocated: a few bytes of protobuf can declare gigabytes. */
    uint8_t *ext = NULL;
    const uint8_t *raw = NULL;
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        ext = read_external(t, model_dir, what, g->path, bytes, d);
        if (!ext) return false;
        raw = ext;
    } else if (t->has_raw_data) {
        if (t->raw_data.len != bytes)
            return diag_error(d, DIAG_FORMAT, "%s: %s: raw_data holds %zu bytes, the shape needs %zu", g->path, what,
                              t->raw_data.len, bytes);
        raw = t->raw_data.data;
    } else {
        const char *field;
        size_t have = typed_count(t, dt, &field);
        if ((int64_t)have != n)
            return diag_error(d, DIAG_FORMAT, "%s: %s: %s holds %zu values, the shape needs %lld", g->path, what,
                              field, have, (long long)n);
    }
    v->dtype = dt;
    v->file_dtype = dt;
    v->rank = (int)t->n_dims;
    for (size_t i = 0; i < t->n_dims; i++) v->dims[i] = dim_const(t->dims[i]);
    Const *c = const_new(g, dtype_store(dt), n);
    if (!c) {
        free(ext);
        return diag_error(d, DIAG_NOMEM, "%s: %s: out of memory", g->path, what);
    }
    v->konst = c;
    if (raw) {
        for (int64_t i = 0; i < n; i++) store_raw(c, dt, raw + (size_t)i * esize, i);
        free(ext);
        return true;
    }
    switch (dt) {
    case DT_FLOAT:
        for (int64_t i = 0; i < n; i++) const_set_f(c, i, t->float_data[i]);
        break;
    case DT_DOUBLE:
        for (int64_t i = 0; i < n; i++) const_set_f(c, i, t->double_data[i]);
        break;
    case DT_INT64:
        for (int64_t i = 0; i < n; i++) const_set_i(c, i, t->int64_data[i]);
        break;
    case DT_UINT32:
    case DT_UINT64:
        for (int64_t i = 0; i < n; i++) const_set_i(c, i, (int64_t)t->uint64_data[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) store_int32_field(c, dt, t->int32_data[i], i);
        break;
    }
    return true;
}
