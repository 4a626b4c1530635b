/* rt_data.c - loading a data file for one input, in full, before training.
 *
 * Files are read through zlib's gzread, which reads gzip and plain files
 * alike, so train-images-idx3-ubyte.gz needs no unpacking.  The format is
 * told by the content (.npy magic, IDX zero bytes), not by the name.
 *
 * Elements are converted to the input's dtype only where no value can
 * change: that way a wrong file is an error now, not a silently different
 * model later. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "rt.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The bytes a file announces in its header (.npy or IDX, told apart as
 * rt_data_decode does) when buf[0..len) holds all of the header, else 0. */
static size_t announced_bytes(const uint8_t *buf, size_t len, const char *path) {
    RtRaw raw;
    RtErr scratch = {0};
    bool npy = (len >= 1 && buf[0] == 0x93) || ends_with(path, ".npy") || ends_with(path, ".npy.gz");
    if (npy) rt_npy_parse(buf, len, path, &raw, &scratch);
    else if (len >= 2 && buf[0] == 0 && buf[1] == 0) rt_idx_parse(buf, len, path, &raw, &scratch);
    else return 0;
    if (raw.payload_offset == 0) return 0;
    size_t total;
    return __builtin_add_overflow(raw.payload_offset, raw.payload_bytes, &total) ? SIZE_MAX : total;
}

/* Reads the whole (decompressed) file.  A gzip stream is inflated no
 * further than one byte past what its header announces, so a small file
 * that inflates to gigabytes costs no more memory than the data it claims
 * to hold; the decoder then reports the excess. */
static bool read_all(const char *path, uint8_t **out, size_t *out_len, RtErr *e) {
    struct stat st;
    if (stat(path, &st) != 0) return rt_error(e, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return rt_error(e, "%s: not a regular file", path);
    gzFile g = gzopen(path, "rb");
    if (!g) return rt_error(e, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
    gzbuffer(g, 1 << 18);
    /* A plain file decompresses to its own size; a gzipped one grows. */
    size_t cap = (size_t)st.st_size + 1, len = 0, limit = SIZE_MAX;
    bool inflating = gzdirect(g) == 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        gzclose(g);
        return rt_error(e, "%s: out of memory reading %zu bytes", path, cap);
    }
    for (;;) {
        if (len == cap) {
            size_t grown = cap * 2;
            uint8_t *nb = grown > cap ? realloc(buf, grown) : NULL;
            if (!nb) {
                free(buf);
                gzclose(g);
                return rt_error(e, "%s: out of memory reading more than %zu bytes", path, cap);
            }
            buf = nb;
            cap = grown;
        }
        size_t want = cap - len;
        if (want > limit - len) want = limit - len;
        if (want > (1u << 30)) want = 1u << 30; /* gzread counts in unsigned int */
        int got = gzread(g, buf + len, (unsigned)want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(g, &zerr);
            rt_error(e, "%s: read error: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
            free(buf);
            gzclose(g);
            return false;
        }
        if (got == 0) break;
        len += (size_t)got;
        if (inflating && limit == SIZE_MAX) {
            size_t total = announced_bytes(buf, len, path);
            if (total && total < SIZE_MAX) limit = total + 1;
        }
        if (len >= limit) {
            free(buf);
            gzclose(g);
            return rt_error(e, "%s: inflates to more than the %zu bytes its header announces (header and data)",
                            path, limit - 1);
        }
    }
    /* A gzip stream cut short reads as a clean end; gzclose reports it. */
    int zc = gzclose(g);
    if (zc != Z_OK) {
        free(buf);
        return rt_error(e, "%s: %s", path, zc == Z_BUF_ERROR ? "truncated gzip data" : "read error");
    }
    *out = buf;
    *out_len = len;
    return true;
}

/* Whether every value of type t is exactly representable in `to`. */
static bool lossless(RtElem t, RtDType to) {
    switch (t) {
    case RT_E_I8: case RT_E_I16: case RT_E_U8: case RT_E_U16: case RT_E_BOOL:
        return true;
    case RT_E_I32: case RT_E_I64: case RT_E_U32:
        return to == RT_I64;
    case RT_E_F32:
        return to == RT_F32;
    case RT_E_F64: case RT_E_U64:
        return false;
    }
    return false;
}

static bool refuse(const char *path, RtElem t, const RtTensor *in, RtErr *e) {
    const char *name = rt_elem_name(t);
    if (in->dtype == RT_F32 && t == RT_E_F64)
        return rt_error(e, "%s: float64 data cannot feed float32 input '%s' without losing precision; "
                        "convert it with numpy: np.save(path, a.astype(np.float32))", path, in->name);
    if (in->dtype == RT_F32)
        return rt_error(e, "%s: %s data cannot feed float32 input '%s' exactly (integers above 2^24 change); "
                        "convert it with numpy: np.save(path, a.astype(np.float32))", path, name, in->name);
    if (t == RT_E_U64)
        return rt_error(e, "%s: uint64 data cannot feed int64 input '%s' (values above 2^63 do not fit); "
                        "convert it with numpy: np.save(path, a.astype(np.int64))", path, in->name);
    return rt_error(e, "%s: %s data cannot feed int64 input '%s', which takes integers; "
                    "convert it with numpy: np.save(path, a.astype(np.int64))", path, name, in->name);
}

/* Element i of little-endian type t, as int64 (integer types only). */
static int64_t get_int(const uint8_t *p, RtElem t, size_t i) {
    switch (t) {
    case RT_E_I8: return (int8_t)p[i];
    case RT_E_U8: return p[i];
    case RT_E_BOOL: return p[i] != 0;
    case RT_E_I16: { int16_t x; memcpy(&x, p + 2 * i, 2); return x; }
    case RT_E_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); return x; }
    case RT_E_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case RT_E_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case RT_E_I64: { int64_t x; memcpy(&x, p + 8 * i, 8); return x; }
    default: return 0;
    }
}

bool rt_data_decode(uint8_t *buf, size_t len, const char *path, const RtTensor *in, RtArray *out,
                    RtErr *e) {
    memset(out, 0, sizeof *out);
    RtRaw raw;
    bool ok;
    if ((len >= 1 && buf[0] == 0x93) || ends_with(path, ".npy") || ends_with(path, ".npy.gz"))
        ok = rt_npy_parse(buf, len, path, &raw, e);
    else if (len >= 2 && buf[0] == 0 && buf[1] == 0)
        ok = rt_idx_parse(buf, len, path, &raw, e);
    else
        ok = rt_error(e, "%s: neither a .npy file nor an IDX file", path);
    if (!ok) {
        free(buf);
        return false;
    }
    if (raw.ndim == 0) {
        free(buf);
        return rt_error(e, "%s: holds a single value (a 0-d array), not rows", path);
    }

    /* Rows must carry exactly one sample each: the same shape, or the same
     * number of values (28x28 images feeding a 784-wide input). */
    int64_t rows = raw.dims[0], row_elems = 1;
    for (int i = 1; i < raw.ndim; i++) row_elems *= raw.dims[i];
    if (row_elems != in->row_elems) {
        char fs[160], is[160];
        rt_shape_str(fs, sizeof fs, raw.ndim - 1, raw.dims + 1);
        rt_shape_str(is, sizeof is, in->ndim - 1, in->shape + 1);
        free(buf);
        return rt_error(e, "%s: each row holds %" PRId64 " values (shape %s) but input '%s' takes %" PRId64
                        " per sample (shape %s)", path, row_elems, fs, in->name, in->row_elems, is);
    }
    if (!lossless(raw.elem, in->dtype)) {
        free(buf);
        return refuse(path, raw.elem, in, e);
    }

    size_t esize = rt_dtype_size(in->dtype), count = (size_t)rows * (size_t)row_elems;
    out->path = path;
    out->dtype = in->dtype;
    out->rows = rows;
    out->row_elems = row_elems;
    out->row_bytes = (size_t)row_elems * esize;
    const uint8_t *src = buf + raw.payload_offset;
    bool same = (raw.elem == RT_E_F32 && in->dtype == RT_F32) || (raw.elem == RT_E_I64 && in->dtype == RT_I64);
    if (same) {
        /* Reuse the file's buffer: the elements move to its start. */
        memmove(buf, src, raw.payload_bytes);
        uint8_t *shrunk = realloc(buf, raw.payload_bytes ? raw.payload_bytes : 1);
        out->data = shrunk ? shrunk : buf;
        return true;
    }
    size_t bytes;
    if (__builtin_mul_overflow(count, esize, &bytes)) {
        free(buf);
        return rt_error(e, "%s: too many values", path);
    }
    void *dst = malloc(bytes ? bytes : 1);
    if (!dst) {
        free(buf);
        return rt_error(e, "%s: out of memory converting %zu values", path, count);
    }
    if (in->dtype == RT_F32) {
        float *f = dst;
        /* IDX bytes are pixel intensities (MNIST): scaled to [0, 1]. */
        if (raw.idx)
            for (size_t i = 0; i < count; i++) f[i] = (float)src[i] / 255.0f;
        else
            for (size_t i = 0; i < count; i++) f[i] = (float)get_int(src, raw.elem, i);
    } else {
        int64_t *d = dst;
        for (size_t i = 0; i < count; i++) d[i] = get_int(src, raw.elem, i);
    }
    free(buf);
    out->data = dst;
    return true;
}

bool rt_data_load(const char *path, const RtTensor *in, RtArray *out, RtErr *e) {
    uint8_t *buf = NULL;
    size_t len = 0;
    memset(out, 0, sizeof *out);
    if (!read_all(path, &buf, &len, e)) return false;
    return rt_data_decode(buf, len, path, in, out, e);
}

void rt_array_free(RtArray *a) {
    free(a->data);
    memset(a, 0, sizeof *a);
}

bool rt_labels_check(const RtArray *labels, const RtMeta *m, RtErr *e) {
    const int64_t *v = labels->data;
    for (int64_t r = 0; r < labels->rows; r++)
        for (int64_t j = 0; j < labels->row_elems; j++) {
            int64_t x = v[r * labels->row_elems + j];
            if ((x < 0 || x >= m->classes) && !(m->has_ignore && x == m->ignore_index)) {
                if (m->has_ignore)
                    return rt_error(e, "%s: row %" PRId64 ": label %" PRId64 " is out of range [0, %" PRId64
                                    ") and is not the ignore index %" PRId64, labels->path, r, x, m->classes,
                                    m->ignore_index);
                return rt_error(e, "%s: row %" PRId64 ": label %" PRId64 " is out of range [0, %" PRId64 ")",
                                labels->path, r, x, m->classes);
            }
        }
    return true;
}

int64_t rt_labels_counted(const RtOrder *o, const RtArray *labels, const RtMeta *m, int64_t step) {
    int64_t per_row = labels->row_elems, n = 0;
    if (!m->has_ignore) return m->batch * per_row;
    for (int64_t r = 0; r < m->batch; r++) {
        const int64_t *v = (const int64_t *)labels->data + rt_batch_row(o, m->batch, step, r) * per_row;
        for (int64_t j = 0; j < per_row; j++) n += v[j] != m->ignore_index;
    }
    return n;
}
