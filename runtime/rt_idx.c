/* rt_idx.c - IDX files, the format MNIST and Fashion-MNIST ship in.
 *
 * Layout: two zero bytes, an element type byte, a dimension count byte, one
 * big-endian uint32 per dimension, then the elements in C order.  The data
 * sets use unsigned bytes only (0x08): 0x00000801 label files and
 * 0x00000803 image files; other element types are refused by name. */
#include <inttypes.h>
#include <string.h>

#include "rt.h"

bool rt_idx_parse(const uint8_t *buf, size_t len, const char *path, RtRaw *raw, RtErr *e) {
    memset(raw, 0, sizeof *raw);
    if (len < 4 || buf[0] != 0 || buf[1] != 0)
        return rt_error(e, "%s: not an IDX file (it does not start with two zero bytes)", path);
    unsigned type = buf[2], ndim = buf[3];
    if (type != 0x08)
        return rt_error(e, "%s: IDX element type 0x%02x is not supported (only 0x08, unsigned byte)", path, type);
    if (ndim == 0 || ndim > RT_FILE_MAX_DIMS)
        return rt_error(e, "%s: IDX header gives %u dimensions (1 to %d are supported)", path, ndim,
                        RT_FILE_MAX_DIMS);
    size_t head = 4 + 4 * (size_t)ndim;
    if (len < head) return rt_error(e, "%s: IDX file is truncated in its header", path);
    uint64_t count = 1;
    for (unsigned i = 0; i < ndim; i++) {
        const uint8_t *p = buf + 4 + 4 * i;
        raw->dims[i] = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
        if (__builtin_mul_overflow(count, (uint64_t)raw->dims[i], &count))
            return rt_error(e, "%s: IDX shape is too large", path);
    }
    size_t have = len - head;
    raw->payload_offset = head; /* before the length checks, as rt_npy_parse */
    raw->payload_bytes = (size_t)count;
    if (count > have)
        return rt_error(e, "%s: truncated: the IDX header announces %" PRIu64 " bytes of data, the file has %zu",
                        path, count, have);
    if (count < have)
        return rt_error(e, "%s: %zu bytes of data, but the IDX header announces %" PRIu64, path, have, count);
    raw->elem = RT_E_U8;
    raw->idx = true;
    raw->ndim = (int)ndim;
    return true;
}
