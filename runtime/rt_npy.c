/* rt_npy.c - NumPy .npy files: reading the header, writing float32 arrays.
 *
 * Format (numpy.lib.format): the magic "\x93NUMPY", a major and minor
 * version byte, the header length (2 bytes little-endian in version 1.0,
 * 4 bytes in 2.0 and 3.0), then a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), }
 * padded with spaces and a '\n', then the elements.  The dict is parsed
 * here by hand, strictly: the three keys exactly once, nothing else. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "out_file.h"
#include "rt.h"

static const struct {
    const char *name;
    size_t size;
} elem_info[] = {
    [RT_E_F32] = {"float32", 4}, [RT_E_F64] = {"float64", 8}, [RT_E_I8] = {"int8", 1},
    [RT_E_I16] = {"int16", 2},   [RT_E_I32] = {"int32", 4},   [RT_E_I64] = {"int64", 8},
    [RT_E_U8] = {"uint8", 1},    [RT_E_U16] = {"uint16", 2},  [RT_E_U32] = {"uint32", 4},
    [RT_E_U64] = {"uint64", 8},  [RT_E_BOOL] = {"bool", 1},
};

const char *rt_elem_name(RtElem t) { return elem_info[t].name; }
size_t rt_elem_size(RtElem t) { return elem_info[t].size; }

/* descr codes after the byte-order character; one-byte types are written
 * with '|' by numpy, wider ones with '<'. */
static const struct {
    const char *code;
    RtElem elem;
} descrs[] = {
    {"f4", RT_E_F32}, {"f8", RT_E_F64}, {"i1", RT_E_I8},  {"i2", RT_E_I16},
    {"i4", RT_E_I32}, {"i8", RT_E_I64}, {"u1", RT_E_U8},  {"u2", RT_E_U16},
    {"u4", RT_E_U32}, {"u8", RT_E_U64}, {"b1", RT_E_BOOL},
};

typedef struct {
    const char *p, *end;
    const char *path;
    RtErr *e;
} Cursor;

static bool bad(Cursor *c, const char *what) {
    return rt_error(c->e, "%s: bad .npy header: %s", c->path, what);
}

static void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static bool eat(Cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes, copied into out. */
static bool parse_str(Cursor *c, char *out, size_t size, const char *what) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return bad(c, what);
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= size) return bad(c, what);
        out[n++] = *c->p++;
    }
    if (c->p >= c->end) return bad(c, "unterminated string");
    c->p++;
    out[n] = 0;
    return true;
}

static bool parse_shape(Cursor *c, RtRaw *raw) {
    if (!eat(c, '(')) return bad(c, "'shape' is not a tuple");
    raw->ndim = 0;
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == ')') break;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return bad(c, "'shape' holds something other than integers");
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *c->p - '0', &v))
                return bad(c, "a dimension in 'shape' is too large");
            c->p++;
        }
        if (c->p < c->end && *c->p == 'L') c->p++; /* files written by Python 2 */
        if (raw->ndim == RT_FILE_MAX_DIMS) return bad(c, "'shape' has too many dimensions");
        raw->dims[raw->ndim++] = v;
        if (eat(c, ',')) continue;
        skip_ws(c);
        if (c->p < c->end && *c->p == ')') break;
        return bad(c, "expected ',' or ')' in 'shape'");
    }
    c->p++;
    return true;
}

static bool parse_descr(Cursor *c, RtRaw *raw) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '[')
        return rt_error(c->e, "%s: structured .npy arrays (record dtypes) are not supported", c->path);
    char d[32];
    if (!parse_str(c, d, sizeof d, "'descr' is not a dtype string")) return false;
    char order = d[0];
    const char *code = d + 1;
    for (size_t i = 0; i < sizeof descrs / sizeof *descrs; i++) {
        if (strcmp(code, descrs[i].code) != 0) continue;
        RtElem t = descrs[i].elem;
        bool one_byte = elem_info[t].size == 1;
        /* '=' is native order, little-endian here; byte order means nothing
         * for one-byte types. */
        if (order == '<' || order == '=' || (one_byte && (order == '|' || order == '>'))) {
            raw->elem = t;
            return true;
        }
        if (order == '>')
            return rt_error(c->e, "%s: big-endian data (dtype '%s') is not supported; convert it with "
                            "numpy: a.astype('<%s')", c->path, d, code);
        break;
    }
    return rt_error(c->e, "%s: .npy dtype '%s' is not supported (float32, float64, int8..int64, "
                    "uint8..uint64 and bool are)", c->path, d);
}

bool rt_npy_parse(const uint8_t *buf, size_t len, const char *path, RtRaw *raw, RtErr *e) {
    memset(raw, 0, sizeof *raw);
    if (len < 6 || memcmp(buf, "\x93NUMPY", 6) != 0)
        return rt_error(e, "%s: not a .npy file (no \\x93NUMPY magic)", path);
    if (len < 10) return rt_error(e, "%s: .npy file is truncated in its header", path);
    unsigned major = buf[6], minor = buf[7];
    size_t start, hlen;
    if (major == 1 && minor == 0) {
        start = 10;
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (len < 12) return rt_error(e, "%s: .npy file is truncated in its header", path);
        start = 12;
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    } else {
        return rt_error(e, "%s: .npy version %u.%u is not supported (1.0, 2.0 and 3.0 are)", path, major, minor);
    }
    if (hlen > len - start)
        return rt_error(e, "%s: .npy header says %zu bytes but the file ends after %zu", path, hlen, len - start);

    Cursor c = {(const char *)buf + start, (const char *)buf + start + hlen, path, e};
    bool seen_descr = false, seen_order = false, seen_shape = false, fortran = false;
    if (!eat(&c, '{')) return bad(&c, "not a dict");
    for (;;) {
        if (eat(&c, '}')) break;
        char key[32];
        if (!parse_str(&c, key, sizeof key, "expected a quoted key")) return false;
        if (!eat(&c, ':')) return bad(&c, "expected ':' after a key");
        if (strcmp(key, "descr") == 0) {
            if (seen_descr) return bad(&c, "'descr' appears twice");
            if (!parse_descr(&c, raw)) return false;
            seen_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (seen_order) return bad(&c, "'fortran_order' appears twice");
            skip_ws(&c);
            size_t left = (size_t)(c.end - c.p);
            if (left >= 4 && memcmp(c.p, "True", 4) == 0) fortran = true, c.p += 4;
            else if (left >= 5 && memcmp(c.p, "False", 5) == 0) fortran = false, c.p += 5;
            else return bad(&c, "'fortran_order' is not True or False");
            seen_order = true;
        } else if (strcmp(key, "shape") == 0) {
            if (seen_shape) return bad(&c, "'shape' appears twice");
            if (!parse_shape(&c, raw)) return false;
            seen_shape = true;
        } else {
            return rt_error(e, "%s: bad .npy header: unexpected key '%s'", path, key);
        }
        if (eat(&c, ',')) continue;
        if (eat(&c, '}')) break;
        return bad(&c, "expected ',' or '}'");
    }
    skip_ws(&c);
    if (c.p != c.end) return bad(&c, "text after the closing '}'");
    if (!seen_descr) return bad(&c, "no 'descr'");
    if (!seen_order) return bad(&c, "no 'fortran_order'");
    if (!seen_shape) return bad(&c, "no 'shape'");

    int nontrivial = 0;
    for (int i = 0; i < raw->ndim; i++) nontrivial += raw->dims[i] > 1;
    /* With at most one dimension above 1, both orders lay out the same bytes. */
    if (fortran && nontrivial > 1)
        return rt_error(e, "%s: Fortran-order arrays are not supported; save "
                        "np.ascontiguousarray(a) instead", path);

    uint64_t count = 1, bytes;
    for (int i = 0; i < raw->ndim; i++)
        if (__builtin_mul_overflow(count, (uint64_t)raw->dims[i], &count))
            return rt_error(e, "%s: .npy shape is too large", path);
    if (__builtin_mul_overflow(count, (uint64_t)elem_info[raw->elem].size, &bytes))
        return rt_error(e, "%s: .npy shape is too large", path);
    size_t data_at = start + hlen, have = len - data_at;
    /* Set before the length checks: rt_data.c reads a gzip stream's header
     * first and inflates no more than this announces. */
    raw->payload_offset = data_at;
    raw->payload_bytes = (size_t)bytes;
    if (bytes > have)
        return rt_error(e, "%s: truncated: the header announces %" PRIu64 " bytes of data, the file has %zu",
                        path, bytes, have);
    if (bytes < have)
        return rt_error(e, "%s: %zu bytes of data, but the header announces %" PRIu64, path, have, bytes);
    return true;
}

bool rt_npy_write(const char *path, const float *data, int ndim, const int64_t *shape, RtErr *e) {
    char dict[512];
    size_t n = (size_t)snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%" PRId64 "%s", shape[i],
                              ndim == 1 || i + 1 < ndim ? ", " : "");
        count *= (uint64_t)shape[i];
    }
    if (ndim == 1) n -= 1; /* "(13,)" as Python writes a 1-tuple */
    n += (size_t)snprintf(dict + n, sizeof dict - n, "), }");
    /* Version 1.0: magic, version, 2-byte length; the whole header is padded
     * with spaces to a multiple of 64 and ends with '\n'. */
    size_t total = (10 + n + 1 + 63) / 64 * 64;
    size_t hlen = total - 10;
    unsigned char head[640];
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (unsigned char)(hlen & 0xff);
    head[9] = (unsigned char)(hlen >> 8);
    memcpy(head + 10, dict, n);
    memset(head + 10 + n, ' ', hlen - n - 1);
    head[total - 1] = '\n';

    OutFile out;
    int err = out_file_open(&out, path);
    if (err) return rt_error(e, "--predict %s: cannot write: %s", path, out_file_why(err));
    out_file_write(&out, head, total);
    out_file_write(&out, data, sizeof *data * (size_t)count);
    err = out_file_finish(&out);
    if (err) return rt_error(e, "--predict %s: write failed: %s", path, out_file_why(err));
    return true;
}
