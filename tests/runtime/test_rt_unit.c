/* test_rt_unit.c - unit tests of the runtime's parts: metadata checks, the
 * command line, .npy and IDX decoding and conversion, the row order, half
 * floats, .npy writing, and the metadata of data-parallel and pipeline
 * programs.  Whole programs are tested by test_runtime.py. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

/* ---- helpers ------------------------------------------------------------ */

#define ASSERT_HAS(haystack, needle) \
    ck_assert_msg(strstr((haystack), (needle)) != NULL, "'%s' does not contain '%s'", (haystack), (needle))

/* A .npy file in memory: magic, version, header dict padded to 64, data. */
static uint8_t *make_npy(int major, const char *dict, const void *data, size_t data_len, size_t *len) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total_head = (pre + dl + 1 + 63) / 64 * 64, hlen = total_head - pre;
    uint8_t *b = malloc(total_head + data_len + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)major;
    b[7] = 0;
    if (major == 1) {
        b[8] = (uint8_t)hlen, b[9] = (uint8_t)(hlen >> 8);
    } else {
        b[8] = (uint8_t)hlen, b[9] = (uint8_t)(hlen >> 8), b[10] = (uint8_t)(hlen >> 16), b[11] = (uint8_t)(hlen >> 24);
    }
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', hlen - dl - 1);
    b[total_head - 1] = '\n';
    if (data_len) memcpy(b + total_head, data, data_len);
    *len = total_head + data_len;
    return b;
}

static RtTensor tensor(RtDType dtype, int ndim, const int64_t *shape) {
    RtTensor t = {.name = "x", .dtype = dtype, .ndim = ndim};
    t.elems = 1;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i], t.elems *= shape[i];
    t.row_elems = t.elems / shape[0];
    t.bytes = (uint64_t)t.elems * rt_dtype_size(dtype);
    return t;
}

/* Parses the .npy header in (dict, data) and returns the error, or "" */
static const char *npy_error(int major, const char *dict, size_t data_len) {
    static RtErr e;
    memset(&e, 0, sizeof e);
    uint8_t zeros[256] = {0};
    size_t len;
    uint8_t *b = make_npy(major, dict, zeros, data_len, &len);
    RtRaw raw;
    rt_npy_parse(b, len, "t.npy", &raw, &e);
    free(b);
    return e.msg;
}

/* Decodes a .npy file for a tensor; returns the error text, "" on success. */
static const char *decode_npy(const char *dict, const void *data, size_t data_len, const RtTensor *in,
                              RtArray *out) {
    static RtErr e;
    memset(&e, 0, sizeof e);
    size_t len;
    uint8_t *b = make_npy(1, dict, data, data_len, &len);
    rt_data_decode(b, len, "t.npy", in, out, &e);
    return e.msg;
}

/* ---- .npy --------------------------------------------------------------- */

START_TEST(npy_good_headers) {
    RtErr e = {0};
    RtRaw raw;
    float data[6] = {1, 2, 3, 4, 5, 6};
    size_t len;
    for (int major = 1; major <= 3; major++) {
        uint8_t *b = make_npy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data,
                              sizeof data, &len);
        ck_assert(rt_npy_parse(b, len, "t.npy", &raw, &e));
        ck_assert_int_eq(raw.elem, RT_E_F32);
        ck_assert_int_eq(raw.ndim, 2);
        ck_assert_int_eq(raw.dims[0], 2);
        ck_assert_int_eq(raw.dims[1], 3);
        ck_assert_uint_eq(raw.payload_bytes, sizeof data);
        ck_assert_int_eq(memcmp(b + raw.payload_offset, data, sizeof data), 0);
        free(b);
    }
    /* Key order, double quotes, no trailing comma, Python 2 long suffix. */
    ck_assert_str_eq(npy_error(1, "{\"shape\": (3L,), \"fortran_order\": False, \"descr\": \"|u1\"}", 3), "");
    ck_assert_str_eq(npy_error(1, "{'descr':'|b1','fortran_order':False,'shape':(2,)}", 2), "");
    ck_assert_str_eq(npy_error(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 5), }", 0), "");
    ck_assert_str_eq(npy_error(1, "{'descr': '|i1', 'fortran_order': False, 'shape': (), }", 1), "");
    /* Fortran order is harmless when at most one dimension exceeds 1. */
    ck_assert_str_eq(npy_error(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (5,), }", 20), "");
    ck_assert_str_eq(npy_error(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 5), }", 20), "");
}
END_TEST

START_TEST(npy_bad_headers) {
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), "Fortran-order");
    ASSERT_HAS(npy_error(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8), "big-endian");
    ASSERT_HAS(npy_error(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16), "dtype '<c8' is not supported");
    ASSERT_HAS(npy_error(1, "{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }", 24), "not supported");
    ASSERT_HAS(npy_error(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8), "structured");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, }", 8), "no 'shape'");
    ASSERT_HAS(npy_error(1, "{'fortran_order': False, 'shape': (2,), }", 8), "no 'descr'");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'shape': (2,), }", 8), "no 'fortran_order'");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "unexpected key 'x'");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8), "twice");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", 8), "True or False");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", 8), "not a tuple");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8), "other than integers");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", 8), "expected ','");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8), "too large");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x", 8), "after the closing");
    ASSERT_HAS(npy_error(1, "['descr']", 8), "not a dict");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8), "truncated");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8), "8 bytes of data, but the header announces 4");
    ASSERT_HAS(npy_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 8), "too large");

    RtErr e = {0};
    RtRaw raw;
    ck_assert(!rt_npy_parse((const uint8_t *)"PK\3\4 not numpy", 15, "t.npy", &raw, &e));
    ASSERT_HAS(e.msg, "t.npy: not a .npy file");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_npy_parse((const uint8_t *)"\x93NUMPY\x04\x00\x10\x00", 10, "t.npy", &raw, &e));
    ASSERT_HAS(e.msg, "version 4.0 is not supported");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_npy_parse((const uint8_t *)"\x93NUMPY\x01\x00\x40\x00{'descr'", 17, "t.npy", &raw, &e));
    ASSERT_HAS(e.msg, "header says 64 bytes");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_npy_parse((const uint8_t *)"\x93NUMPY\x01", 7, "t.npy", &raw, &e));
    ASSERT_HAS(e.msg, "truncated in its header");
}
END_TEST

START_TEST(npy_write_reads_back) {
    char path[] = "/tmp/rt_unit_XXXXXX.npy";
    int fd = mkstemps(path, 4);
    ck_assert_int_ge(fd, 0);
    close(fd);
    float data[12];
    for (int i = 0; i < 12; i++) data[i] = (float)i * 0.5f;
    int64_t shapes[3][3] = {{12}, {4, 3}, {2, 2, 3}};
    for (int nd = 1; nd <= 3; nd++) {
        RtErr e = {0};
        ck_assert(rt_npy_write(path, data, nd, shapes[nd - 1], &e));
        FILE *f = fopen(path, "rb");
        uint8_t buf[512];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        RtRaw raw;
        ck_assert_msg(rt_npy_parse(buf, len, path, &raw, &e), "%s", e.msg);
        ck_assert_uint_eq(raw.payload_offset % 64, 0);
        ck_assert_int_eq(buf[6], 1);
        ck_assert_int_eq(raw.ndim, nd);
        for (int i = 0; i < nd; i++) ck_assert_int_eq(raw.dims[i], shapes[nd - 1][i]);
        ck_assert_int_eq(memcmp(buf + raw.payload_offset, data, sizeof data), 0);
        if (nd == 1) ck_assert_ptr_nonnull(strstr((char *)buf + 10, "'shape': (12,)"));
    }
    unlink(path);
    RtErr e = {0};
    ck_assert(!rt_npy_write("/nonexistent-dir/p.npy", data, 1, shapes[0], &e));
    ASSERT_HAS(e.msg, "--predict /nonexistent-dir/p.npy: cannot write: No such file");
}
END_TEST

/* ---- IDX ---------------------------------------------------------------- */

START_TEST(idx_headers) {
    RtErr e = {0};
    RtRaw raw;
    uint8_t images[4 + 12 + 2 * 2 * 3] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
    ck_assert(rt_idx_parse(images, sizeof images, "i", &raw, &e));
    ck_assert(raw.idx);
    ck_assert_int_eq(raw.ndim, 3);
    ck_assert_int_eq(raw.dims[0], 2);
    ck_assert_int_eq(raw.dims[2], 3);
    ck_assert_uint_eq(raw.payload_offset, 16);
    ck_assert(!rt_idx_parse(images, sizeof images - 1, "i", &raw, &e));
    ASSERT_HAS(e.msg, "i: truncated: the IDX header announces 12 bytes of data, the file has 11");

    uint8_t labels[] = {0, 0, 8, 1, 0, 0, 0, 2, 7, 9, 1};
    memset(&e, 0, sizeof e);
    ck_assert(!rt_idx_parse(labels, sizeof labels, "l", &raw, &e));
    ASSERT_HAS(e.msg, "3 bytes of data, but the IDX header announces 2");
    memset(&e, 0, sizeof e);
    ck_assert(rt_idx_parse(labels, sizeof labels - 1, "l", &raw, &e));

    uint8_t floats[] = {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0};
    memset(&e, 0, sizeof e);
    ck_assert(!rt_idx_parse(floats, sizeof floats, "f", &raw, &e));
    ASSERT_HAS(e.msg, "element type 0x0d is not supported");
    uint8_t nodims[] = {0, 0, 8, 0};
    memset(&e, 0, sizeof e);
    ck_assert(!rt_idx_parse(nodims, sizeof nodims, "z", &raw, &e));
    ASSERT_HAS(e.msg, "0 dimensions");
    uint8_t short_head[] = {0, 0, 8, 2, 0, 0, 0, 1};
    memset(&e, 0, sizeof e);
    ck_assert(!rt_idx_parse(short_head, sizeof short_head, "s", &raw, &e));
    ASSERT_HAS(e.msg, "truncated in its header");
}
END_TEST

/* ---- decoding and conversion ------------------------------------------- */

START_TEST(decode_conversions) {
    int64_t s4[2] = {8, 4}, s1[1] = {8};
    RtTensor f_in = tensor(RT_F32, 2, s4), l_in = tensor(RT_I64, 1, s1);
    RtArray a;

    float f[2 * 4] = {1.5f, -2, 3, 4, 5, 6, 7, 8};
    ck_assert_str_eq(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", f, sizeof f, &f_in, &a), "");
    ck_assert_int_eq(a.rows, 2);
    ck_assert_uint_eq(a.row_bytes, 16);
    ck_assert_int_eq(memcmp(a.data, f, sizeof f), 0);
    rt_array_free(&a);

    /* 2x2 rows feed a 4-wide input: same number of values. */
    ck_assert_str_eq(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2), }", f, sizeof f, &f_in, &a), "");
    rt_array_free(&a);

    /* uint8 .npy into float32: the values, not scaled. */
    uint8_t u[8] = {0, 1, 2, 255, 4, 5, 6, 7};
    ck_assert_str_eq(decode_npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 4), }", u, sizeof u, &f_in, &a), "");
    ck_assert(((float *)a.data)[3] == 255.0f);
    rt_array_free(&a);

    /* int32, uint8 and bool labels widen to int64. */
    int32_t i4[3] = {2, 0, -1};
    ck_assert_str_eq(decode_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", i4, sizeof i4, &l_in, &a), "");
    ck_assert_int_eq(((int64_t *)a.data)[0], 2);
    ck_assert_int_eq(((int64_t *)a.data)[2], -1);
    rt_array_free(&a);
    ck_assert_str_eq(decode_npy("{'descr': '|u1', 'fortran_order': False, 'shape': (8,), }", u, sizeof u, &l_in, &a), "");
    ck_assert_int_eq(((int64_t *)a.data)[3], 255);
    rt_array_free(&a);
    uint8_t b1[2] = {1, 0};
    ck_assert_str_eq(decode_npy("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", b1, 2, &l_in, &a), "");
    ck_assert_int_eq(((int64_t *)a.data)[0], 1);
    rt_array_free(&a);
    int16_t i2[4] = {-3, 1000, 7, 8};
    ck_assert_str_eq(decode_npy("{'descr': '<i2', 'fortran_order': False, 'shape': (1, 4), }", i2, sizeof i2, &f_in, &a), "");
    ck_assert(((float *)a.data)[0] == -3.0f && ((float *)a.data)[1] == 1000.0f);
    rt_array_free(&a);
    int64_t i8[2] = {5, 1};
    ck_assert_str_eq(decode_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", i8, sizeof i8, &l_in, &a), "");
    ck_assert_int_eq(((int64_t *)a.data)[0], 5);
    rt_array_free(&a);

    /* Conversions that could change a value are refused, with the fix. */
    double f8[8] = {0};
    ASSERT_HAS(decode_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }", f8, sizeof f8, &f_in, &a),
               "t.npy: float64 data cannot feed float32 input 'x' without losing precision; convert it with numpy: "
               "np.save(path, a.astype(np.float32))");
    int32_t i4x[8] = {0};
    ASSERT_HAS(decode_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 4), }", i4x, sizeof i4x, &f_in, &a),
               "int32 data cannot feed float32 input 'x' exactly");
    ASSERT_HAS(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f, 8, &l_in, &a),
               "float32 data cannot feed int64 input 'x'");
    ASSERT_HAS(decode_npy("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", i8, 8, &l_in, &a),
               "uint64 data cannot feed int64 input");

    /* Rows of the wrong size, and a file without rows. */
    ASSERT_HAS(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, 24, &f_in, &a),
               "t.npy: each row holds 3 values (shape [3]) but input 'x' takes 4 per sample (shape [4])");
    ASSERT_HAS(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (8,), }", f, 32, &f_in, &a),
               "each row holds 1 values (shape [])");
    ASSERT_HAS(decode_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f, 4, &f_in, &a), "0-d array");

    /* Neither format. */
    RtErr e = {0};
    uint8_t *junk = malloc(8);
    memcpy(junk, "garbage!", 8);
    ck_assert(!rt_data_decode(junk, 8, "data.bin", &f_in, &a, &e));
    ASSERT_HAS(e.msg, "data.bin: neither a .npy file nor an IDX file");
    /* A .npy name with other contents gets the .npy message. */
    memset(&e, 0, sizeof e);
    junk = malloc(8);
    memcpy(junk, "garbage!", 8);
    ck_assert(!rt_data_decode(junk, 8, "x.npy", &f_in, &a, &e));
    ASSERT_HAS(e.msg, "x.npy: not a .npy file");
}
END_TEST

START_TEST(decode_idx) {
    int64_t s4[2] = {8, 4}, s1[1] = {8};
    RtTensor f_in = tensor(RT_F32, 2, s4), l_in = tensor(RT_I64, 1, s1);
    RtArray a;
    RtErr e = {0};
    uint8_t head[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 51, 102, 255, 1, 2, 3, 4};
    uint8_t *b = malloc(sizeof head);
    memcpy(b, head, sizeof head);
    ck_assert_msg(rt_data_decode(b, sizeof head, "img", &f_in, &a, &e), "%s", e.msg);
    const float *x = a.data;
    ck_assert(x[0] == 0.0f && x[1] == 51.0f / 255.0f && x[3] == 1.0f && x[4] == 1.0f / 255.0f);
    ck_assert_int_eq(a.rows, 2);
    rt_array_free(&a);

    uint8_t lab[] = {0, 0, 8, 1, 0, 0, 0, 3, 9, 0, 4};
    b = malloc(sizeof lab);
    memcpy(b, lab, sizeof lab);
    ck_assert(rt_data_decode(b, sizeof lab, "lab", &l_in, &a, &e));
    ck_assert_int_eq(((int64_t *)a.data)[0], 9);
    RtMeta m = {.classes = 5, .batch = 3};
    ck_assert(!rt_labels_check(&a, &m, &e));
    ck_assert_str_eq(e.msg, "lab: row 0: label 9 is out of range [0, 5)");
    memset(&e, 0, sizeof e);
    m.classes = 10;
    ck_assert(rt_labels_check(&a, &m, &e));
    ((int64_t *)a.data)[2] = -1;
    ck_assert(!rt_labels_check(&a, &m, &e));
    ck_assert_str_eq(e.msg, "lab: row 2: label -1 is out of range [0, 10)");
    /* the ignore index passes the check and does not count */
    RtOrder o = {.n = 3};
    ck_assert_int_eq(rt_labels_counted(&o, &a, &m, 0), 3);
    m.has_ignore = true;
    m.ignore_index = -1;
    memset(&e, 0, sizeof e);
    ck_assert(rt_labels_check(&a, &m, &e));
    ck_assert_int_eq(rt_labels_counted(&o, &a, &m, 0), 2);
    m.ignore_index = -100;
    ck_assert(!rt_labels_check(&a, &m, &e));
    ck_assert_str_eq(e.msg, "lab: row 2: label -1 is out of range [0, 10) and is not the ignore index -100");
    rt_array_free(&a);
}
END_TEST

START_TEST(load_files) {
    int64_t s4[2] = {8, 4};
    RtTensor f_in = tensor(RT_F32, 2, s4);
    RtArray a;
    RtErr e = {0};
    ck_assert(!rt_data_load("/nonexistent/x.npy", &f_in, &a, &e));
    ck_assert_str_eq(e.msg, "/nonexistent/x.npy: cannot open: No such file or directory");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_data_load("/tmp", &f_in, &a, &e));
    ck_assert_str_eq(e.msg, "/tmp: not a regular file");

    /* A gzip stream cut short. */
    char path[] = "/tmp/rt_unit_XXXXXX.gz";
    int fd = mkstemps(path, 3);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "head -c 3000 /dev/urandom | gzip -c | head -c 200 > %s", path);
    ck_assert_int_eq(system(cmd), 0);
    memset(&e, 0, sizeof e);
    ck_assert(!rt_data_load(path, &f_in, &a, &e));
    ck_assert_msg(strstr(e.msg, "truncated gzip data") || strstr(e.msg, "read error"), "%s", e.msg);
    unlink(path);
}
END_TEST

/* ---- metadata ----------------------------------------------------------- */

/* The metadata of a single program: one stage, one replica, one
 * micro-batch of 8 rows. */
static const char *good_meta =
    "{\"abi\": 2, \"plan_hash\": \"ab\", \"ranks\": 1, \"rank_programs\": 1, \"strategy\": \"single\","
    " \"batch\": 8, \"local_batch\": 8, \"stages\": 1, \"dp\": 1, \"microbatches\": 1, \"micro_batch\": 8,"
    " \"schedule\": \"layer\", \"tag_bound\": 0, \"lr\": {\"value\": 0.1},"
    " \"inputs\": [{\"name\": \"input\", \"dtype\": \"float32\", \"shape\": [8, 4]},"
    "  {\"name\": \"labels\", \"dtype\": \"int64\", \"shape\": [8]}],"
    " \"output\": {\"name\": \"logits\", \"shape\": [8, 3]},"
    " \"params\": [{\"name\": \"W\", \"dtype\": \"float32\", \"shape\": [4, 3], \"trainable\": true, \"stage\": 0}],"
    " \"loss_kind\": \"ce\", \"optimizer\": {\"name\": \"sgd\"}, \"programs\": ["
    "  {\"stage\": 0, \"arena_bytes\": 570, \"init_bytes\": 48, \"init_offset\": 0, \"peak_activation_bytes\": 0,"
    "   \"inputs\": [{\"name\": \"input\", \"offset\": 256}, {\"name\": \"labels\", \"offset\": 384}],"
    "   \"params\": [{\"name\": \"W\", \"offset\": 0}], \"buckets\": [],"
    "   \"loss\": {\"offset\": 64, \"count\": 1}, \"output\": {\"offset\": 448},"
    "   \"lr\": {\"offset\": 128}, \"step\": {\"offset\": 192}}]}";

/* The same program, data-parallel over 2 ranks (4 of 8 rows each). */
static const char *dp_meta =
    "{\"abi\": 2, \"plan_hash\": \"cd\", \"ranks\": 2, \"rank_programs\": 1, \"strategy\": \"dp\","
    " \"batch\": 8, \"local_batch\": 4, \"stages\": 1, \"dp\": 2, \"microbatches\": 1, \"micro_batch\": 4,"
    " \"schedule\": \"layer\", \"tag_bound\": 0, \"lr\": {\"value\": 0.1},"
    " \"inputs\": [{\"name\": \"input\", \"dtype\": \"float32\", \"shape\": [4, 4]},"
    "  {\"name\": \"labels\", \"dtype\": \"int64\", \"shape\": [4]}],"
    " \"output\": {\"name\": \"logits\", \"shape\": [4, 3]},"
    " \"params\": [{\"name\": \"W\", \"dtype\": \"float32\", \"shape\": [4, 3], \"trainable\": true, \"stage\": 0}],"
    " \"loss_kind\": \"ce\", \"optimizer\": {\"name\": \"sgd\"}, \"programs\": ["
    "  {\"stage\": 0, \"arena_bytes\": 576, \"init_bytes\": 48, \"init_offset\": 0, \"peak_activation_bytes\": 0,"
    "   \"inputs\": [{\"name\": \"input\", \"offset\": 256}, {\"name\": \"labels\", \"offset\": 384}],"
    "   \"params\": [{\"name\": \"W\", \"offset\": 0}],"
    "   \"buckets\": [{\"offset\": 536, \"count\": 6}, {\"offset\": 512, \"count\": 6}],"
    "   \"loss\": {\"offset\": 64, \"count\": 1}, \"output\": {\"offset\": 448},"
    "   \"lr\": {\"offset\": 128}, \"step\": {\"offset\": 192}}]}";

/* A 2-stage pipeline of 2 micro-batches: stage 0 reads the input and
 * holds W, stage 1 reads the labels and holds V, the loss and the output. */
static const char *pipeline_meta =
    "{\"abi\": 2, \"plan_hash\": \"ef\", \"ranks\": 2, \"rank_programs\": 2, \"strategy\": \"pipeline\","
    " \"batch\": 8, \"local_batch\": 8, \"stages\": 2, \"dp\": 1, \"microbatches\": 2, \"micro_batch\": 4,"
    " \"schedule\": \"gpipe\", \"tag_bound\": 9, \"lr\": {\"value\": 0.1},"
    " \"inputs\": [{\"name\": \"input\", \"dtype\": \"float32\", \"shape\": [8, 4]},"
    "  {\"name\": \"labels\", \"dtype\": \"int64\", \"shape\": [8]}],"
    " \"output\": {\"name\": \"logits\", \"shape\": [8, 3]},"
    " \"params\": [{\"name\": \"W\", \"dtype\": \"float32\", \"shape\": [4, 4], \"trainable\": true, \"stage\": 0},"
    "  {\"name\": \"V\", \"dtype\": \"float32\", \"shape\": [4, 3], \"trainable\": true, \"stage\": 1}],"
    " \"loss_kind\": \"ce\", \"optimizer\": {\"name\": \"sgd\"}, \"programs\": ["
    "  {\"stage\": 0, \"arena_bytes\": 512, \"init_bytes\": 256, \"init_offset\": 0, \"peak_activation_bytes\": 128,"
    "   \"inputs\": [{\"name\": \"input\", \"offset\": 64}], \"params\": [{\"name\": \"W\", \"offset\": 0}],"
    "   \"lr\": {\"offset\": 192}, \"step\": {\"offset\": 256}},"
    "  {\"stage\": 1, \"arena_bytes\": 640, \"init_bytes\": 320, \"init_offset\": 256, \"peak_activation_bytes\": 96,"
    "   \"inputs\": [{\"name\": \"labels\", \"offset\": 64}], \"params\": [{\"name\": \"V\", \"offset\": 0}],"
    "   \"loss\": {\"offset\": 128, \"count\": 2}, \"output\": {\"offset\": 192},"
    "   \"lr\": {\"offset\": 320}, \"step\": {\"offset\": 384}}]}";

/* meta with the first `from` replaced by `to`, parsed for `rank`; returns
 * the error or "". */
static const char *edit_error(const char *meta, const char *from, const char *to, int rank) {
    static char json[4096];
    static RtErr e;
    memset(&e, 0, sizeof e);
    const char *at = strstr(meta, from);
    ck_assert_msg(at != NULL, "'%s' not in the metadata", from);
    snprintf(json, sizeof json, "%.*s%s%s", (int)(at - meta), meta, to, at + strlen(from));
    RtMeta m;
    if (rt_meta_parse_rank(json, strlen(json), rank, &m, &e)) rt_meta_free(&m);
    return e.msg;
}

static const char *meta_error(const char *from, const char *to) { return edit_error(good_meta, from, to, 0); }

static const char *dp_meta_error(const char *from, const char *to) { return edit_error(dp_meta, from, to, 0); }

START_TEST(meta_good) {
    RtMeta m;
    RtErr e = {0};
    ck_assert_msg(rt_meta_parse(good_meta, strlen(good_meta), &m, &e), "%s", e.msg);
    ck_assert_int_eq(m.batch, 8);
    ck_assert_uint_eq(m.arena_bytes, 576); /* rounded up to 64 */
    ck_assert_int_eq(m.n_inputs, 2);
    ck_assert_int_eq(m.labels, 1);
    ck_assert_int_eq(m.classes, 3);
    ck_assert_int_eq(m.inputs[0].row_elems, 4);
    ck_assert_uint_eq(m.inputs[1].offset, 384);
    ck_assert_int_eq(m.inputs[1].dtype, RT_I64);
    ck_assert_int_eq(m.output.row_elems, 3);
    ck_assert_uint_eq(m.output.offset, 448);
    ck_assert_int_eq(m.params[0].elems, 12);
    ck_assert_uint_eq(m.loss_offset, 64);
    ck_assert_uint_eq(m.lr_offset, 128);
    ck_assert_uint_eq(m.step_offset, 192);
    ck_assert(m.lr == 0.1f);
    ck_assert_int_eq(rt_meta_input(&m, "labels"), 1);
    ck_assert_int_eq(rt_meta_input(&m, "nope"), -1);
    /* One stage of one replica holds everything. */
    ck_assert(!m.inputs[0].absent && !m.inputs[1].absent);
    ck_assert(m.layout.has_output && m.layout.has_lr && m.layout.has_step);
    ck_assert_int_eq(m.layout.loss_count, 1);
    ck_assert_int_eq(m.layout.n_all_params, 1);
    ck_assert_uint_eq(m.layout.init_offset, 0);
    ck_assert(!rt_layout_pipelined(&m.layout));
    rt_meta_free(&m);
    /* Other loss kinds need no labels; scalar parameters are fine. */
    ck_assert_str_eq(meta_error("\"ce\"", "\"model\""), "");
    ck_assert_str_eq(meta_error("\"ce\"", "\"mse\""), "");
    ck_assert_str_eq(meta_error("\"shape\": [4, 3]", "\"shape\": []"), "");
    ck_assert_str_eq(meta_error("\"params\": [{", "\"params\": [], \"x\": [{"), "");

    /* Under loss_kind model the output is the model's own loss, often a
     * scalar: accepted, with no rows to predict. */
    char json[4096];
    const char *at = strstr(good_meta, "\"shape\": [8, 3]");
    snprintf(json, sizeof json, "%.*s\"shape\": []%s", (int)(at - good_meta), good_meta, at + strlen("\"shape\": [8, 3]"));
    char *kind = strstr(json, "\"ce\"");
    memmove(kind + 7, kind + 4, strlen(kind + 4) + 1);
    memcpy(kind, "\"model\"", 7);
    ck_assert_msg(rt_meta_parse(json, strlen(json), &m, &e), "%s: %s", e.msg, json);
    ck_assert_int_eq(m.output.ndim, 0);
    ck_assert_int_eq(m.output.row_elems, 0);
    ck_assert_int_eq(m.loss_kind, RT_LOSS_MODEL);
    rt_meta_free(&m);
}
END_TEST

START_TEST(meta_bad) {
    ck_assert_str_eq(meta_error("\"abi\": 2", "\"abi\": 1"),
                     "program metadata has abi version 1 but this runtime implements 2: rebuild the program with "
                     "the matching cleave");
    ASSERT_HAS(meta_error("{\"abi\": 2,", "{"), "program metadata is invalid: \"abi\" is missing");
    ASSERT_HAS(meta_error("\"plan_hash\": \"ab\",", ""), "\"plan_hash\" is missing");
    ASSERT_HAS(meta_error("\"ranks\": 1", "\"ranks\": 0"), "\"ranks\" is 0, expected at least 1");
    ASSERT_HAS(meta_error("\"batch\": 8", "\"batch\": \"8\""), "\"batch\" is not an integer");
    ASSERT_HAS(meta_error("\"batch\": 8", "\"batch\": 8.5"), "\"batch\" is not an integer");
    ASSERT_HAS(meta_error("\"init_bytes\": 48", "\"init_bytes\": 999"), "\"init_bytes\" 999 exceeds");
    ASSERT_HAS(meta_error("\"loss\": {\"offset\": 64", "\"loss\": {\"offset\": 65"),
               "loss: offset 65 is not a multiple of 64");
    ASSERT_HAS(meta_error("\"loss\": {\"offset\": 64", "\"loss\": {\"offset\": 576"),
               "loss: 4 bytes at offset 576 end past the arena of 576 bytes");
    ASSERT_HAS(meta_error("\"loss\": {\"offset\": 64, \"count\": 1}", "\"loss\": 64"),
               "program: \"loss\" is not an object");
    ASSERT_HAS(meta_error(", \"count\": 1}", "}"), "loss: \"count\" is missing");
    ASSERT_HAS(meta_error("\"value\": 0.1", ""), "lr: \"value\" is missing");
    ASSERT_HAS(meta_error("\"value\": 0.1", "\"value\": -1"), "is not a non-negative float32");
    ASSERT_HAS(meta_error("\"value\": 0.1", "\"value\": 1e300"), "is not a non-negative float32");
    ASSERT_HAS(meta_error("\"step\": {\"offset\": 192}", "\"step\": {}"), "step: \"offset\" is missing");
    ASSERT_HAS(meta_error("\"offset\": 256", "\"offset\": 512"),
               "inputs[0]: 128 bytes at offset 512 end past the arena");
    ASSERT_HAS(meta_error("\"shape\": [8, 4]", "\"shape\": [4, 4]"),
               "inputs[0]: shape[0] is 4, expected the batch 8");
    ASSERT_HAS(meta_error("\"shape\": [8, 4]", "\"shape\": [8, 0]"), "inputs[0]: shape[1] is not a positive integer");
    ASSERT_HAS(meta_error("\"shape\": [8, 4]", "\"shape\": []"), "inputs[0]: shape is empty");
    ASSERT_HAS(meta_error("\"shape\": [8, 4]", "\"shape\": [8,1,1,1,1,1,1,1,1]"), "9 dimensions");
    ASSERT_HAS(meta_error("\"shape\": [8, 4]", "\"shape\": [8, 4611686018427387904, 4]"), "overflows");
    ASSERT_HAS(meta_error("\"dtype\": \"float32\"", "\"dtype\": \"float16\""),
               "inputs[0]: dtype \"float16\" is not float32 or int64");
    ASSERT_HAS(meta_error("\"name\": \"input\"", "\"name\": \"labels\""), "name \"labels\" is used twice");
    ASSERT_HAS(meta_error("\"name\": \"input\"", "\"name\": \"\""), "inputs[0]: \"name\" is empty");
    ASSERT_HAS(meta_error("\"inputs\": [{", "\"inputs\": [], \"x\": [{"), "\"inputs\" is empty");
    ASSERT_HAS(meta_error("\"name\": \"labels\"", "\"name\": \"targets\""),
               "loss_kind ce but no input is named \"labels\"");
    ASSERT_HAS(meta_error("\"dtype\": \"int64\"", "\"dtype\": \"float32\""), "\"labels\" is not int64");
    ASSERT_HAS(meta_error("\"shape\": [8, 3]", "\"shape\": [8]"), "output is not [batch, ..., classes]");
    ASSERT_HAS(meta_error("\"shape\": [8, 3]", "\"shape\": []"), "output: shape is empty, expected [batch, ...]");
    ASSERT_HAS(meta_error("\"shape\": [8, 3]", "\"shape\": [8, 2, 1]"),
               "an output of 2 values per sample over 1 classes needs 2 labels per sample, \"labels\" has 1");
    ASSERT_HAS(meta_error("\"output\": {", "\"outputs\": {"), "\"output\" is missing");
    ASSERT_HAS(meta_error("\"dtype\": \"float32\", \"shape\": [4, 3]", "\"dtype\": \"int64\", \"shape\": [4, 3]"),
               "params[0]: dtype \"int64\" is not float32");
    ASSERT_HAS(meta_error(", \"trainable\": true", ""), "params[0]: \"trainable\" is missing");
    ASSERT_HAS(meta_error("\"trainable\": true", "\"trainable\": 1"), "\"trainable\" is not a boolean");
    ASSERT_HAS(meta_error(", \"stage\": 0}]", "}]"), "params[0]: \"stage\" is missing");
    ASSERT_HAS(meta_error("\"loss_kind\": \"ce\"", "\"loss_kind\": \"hinge\""), "\"loss_kind\" \"hinge\" is not");
    ASSERT_HAS(meta_error(", \"optimizer\": {\"name\": \"sgd\"}", ""), "\"optimizer\" is missing");
    ASSERT_HAS(meta_error("\"stages\": 1, ", ""), "\"stages\" is missing");
    ASSERT_HAS(meta_error("\"schedule\": \"layer\"", "\"schedule\": 1"), "\"schedule\" is not a string");
    ASSERT_HAS(meta_error("\"tag_bound\": 0", "\"tag_bound\": 0, \"placement\": \"by_rank\""),
               "\"placement\" must be \"by_replica\" or \"by_stage\"");
    ASSERT_HAS(meta_error("\"programs\": [", "\"x\": ["), "\"programs\" is missing");
    ASSERT_HAS(meta_error("{\"stage\": 0, \"arena", "{\"arena"), "program: \"stage\" is missing");
    ASSERT_HAS(meta_error("\"programs\": [", "\"programs\": [[], "), "2 programs for 1 stages");
    ASSERT_HAS(meta_error("\"ranks\": 1", "\"ranks\": 1, \"ranks\": 2"), "not valid JSON");
    ASSERT_HAS(meta_error("}}", "}"), "program metadata is not valid JSON");
    ASSERT_HAS(meta_error("{\"abi\"", "[{\"abi\""), "not valid JSON");

    RtMeta m;
    RtErr e = {0};
    ck_assert(!rt_meta_parse("", 0, &m, &e));
    ck_assert_str_eq(e.msg, "program metadata is empty");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_meta_parse("[1]", 3, &m, &e));
    ASSERT_HAS(e.msg, "not a JSON object");
}
END_TEST

/* good_meta with a momentum buffer for W, held at offset 512. */
static const char *state_meta(void) {
    static char json[4096];
    const char *at = strstr(good_meta, " \"loss_kind\"");
    const char *prog = strstr(good_meta, " \"buckets\": []");
    snprintf(json, sizeof json,
             "%.*s \"state\": [{\"name\": \"W.momentum_buffer\", \"param\": \"W\", \"slot\": \"momentum_buffer\","
             " \"dtype\": \"float32\", \"shape\": [4, 3], \"stage\": 0}],%.*s \"state\": [{\"name\": "
             "\"W.momentum_buffer\", \"offset\": 512}],%s",
             (int)(at - good_meta), good_meta, (int)(prog - at), at, prog);
    return json;
}

START_TEST(meta_state) {
    RtMeta m;
    RtErr e = {0};
    ck_assert_msg(rt_meta_parse(good_meta, strlen(good_meta), &m, &e), "%s", e.msg);
    ck_assert(!m.has_state); /* no "state": a program that cannot write checkpoints */
    ck_assert_str_eq(m.optimizer, "{\"name\":\"sgd\"}");
    rt_meta_free(&m);
    const char *meta = state_meta();
    ck_assert_msg(rt_meta_parse(meta, strlen(meta), &m, &e), "%s: %s", e.msg, meta);
    ck_assert(m.has_state);
    ck_assert_int_eq(m.n_state, 1);
    ck_assert_str_eq(m.state[0].name, "W.momentum_buffer");
    ck_assert_int_eq(m.state[0].of_len, 1);
    ck_assert_uint_eq(m.state[0].offset, 512);
    ck_assert_int_eq(m.state[0].elems, 12);
    ck_assert_int_eq(m.layout.n_all_state, 1);
    ck_assert_int_eq(m.layout.state_stage[0], 0);
    rt_meta_free(&m);
    ASSERT_HAS(edit_error(meta, "\"slot\": \"momentum_buffer\"", "\"slot\": \"exp_avg\"", 0),
               "state[0]: \"name\" \"W.momentum_buffer\" is not \"param\".\"slot\"");
    ASSERT_HAS(edit_error(meta, "\"param\": \"W\", ", "", 0), "state[0]: \"param\" is missing");
    ASSERT_HAS(edit_error(meta, "\"offset\": 512", "\"offset\": 576", 0),
               "state[0]: 48 bytes at offset 576 end past the arena");
    ASSERT_HAS(edit_error(meta, "[4, 3], \"stage\": 0}], \"loss_kind", "[4, 3], \"stage\": 3}], \"loss_kind", 0),
               "state[0]: stage 3 of 1");
}
END_TEST

START_TEST(meta_pipeline) {
    RtMeta m;
    RtErr e = {0};
    ck_assert_msg(rt_meta_parse_rank(pipeline_meta, strlen(pipeline_meta), 0, &m, &e), "%s", e.msg);
    ck_assert_int_eq(m.layout.stage, 0);
    ck_assert_int_eq(m.layout.stages, 2);
    ck_assert_int_eq(m.layout.microbatches, 2);
    ck_assert(rt_layout_pipelined(&m.layout));
    ck_assert_uint_eq(m.arena_bytes, 512);
    ck_assert(!m.inputs[0].absent && m.inputs[1].absent); /* stage 0 reads the input, not the labels */
    ck_assert_uint_eq(m.inputs[0].offset, 64);
    ck_assert_int_eq(m.n_params, 1);
    ck_assert_str_eq(m.params[0].name, "W");
    ck_assert_int_eq(m.layout.n_all_params, 2);
    ck_assert_int_eq(m.layout.param_stage[1], 1);
    ck_assert(m.layout.has_lr && m.layout.has_step && !m.layout.has_output);
    ck_assert_int_eq(m.layout.loss_count, 0);
    rt_meta_free(&m);

    ck_assert_msg(rt_meta_parse_rank(pipeline_meta, strlen(pipeline_meta), 1, &m, &e), "%s", e.msg);
    ck_assert_int_eq(m.layout.stage, 1);
    ck_assert_uint_eq(m.layout.init_offset, 256);
    ck_assert(m.inputs[0].absent && !m.inputs[1].absent);
    ck_assert(m.layout.has_output);
    ck_assert_int_eq(m.layout.loss_count, 2);
    ck_assert_uint_eq(m.loss_offset, 128);
    ck_assert_int_eq(m.classes, 3);
    rt_meta_free(&m);
    /* A rank beyond the program's takes the place of rank % ranks (the
     * start-up check then refuses the run). */
    ck_assert_msg(rt_meta_parse_rank(pipeline_meta, strlen(pipeline_meta), 3, &m, &e), "%s", e.msg);
    ck_assert_int_eq(m.layout.stage, 1);
    rt_meta_free(&m);

    ASSERT_HAS(edit_error(pipeline_meta, "\"dp\": 1", "\"dp\": 2", 0), "\"dp\" 2 x \"stages\" 2 is not \"ranks\" 2");
    ASSERT_HAS(edit_error(pipeline_meta, "\"micro_batch\": 4", "\"micro_batch\": 3", 0),
               "\"micro_batch\" 3 x \"microbatches\" 2 is not \"local_batch\" 8");
    ASSERT_HAS(edit_error(pipeline_meta, "\"stage\": 1, \"arena", "\"stage\": 0, \"arena", 1),
               "programs[1] is stage 0");
    ASSERT_HAS(edit_error(pipeline_meta, "\"count\": 2", "\"count\": 3", 1), "\"count\" 3 is not the 2 micro-batches");
    ASSERT_HAS(edit_error(pipeline_meta, "\"output\": {\"offset\": 192}", "\"output\": {\"offset\": 640}", 1),
               "output: 96 bytes at offset 640 end past the arena of 640 bytes");
    ASSERT_HAS(edit_error(pipeline_meta, "\"stage\": 1}]", "\"stage\": 5}]", 0), "params[1]: stage 5 of 2");
    ASSERT_HAS(edit_error(pipeline_meta, "\"tag_bound\": 9", "\"tag_bound\": -1", 0), "\"tag_bound\" is -1");
    ASSERT_HAS(edit_error(pipeline_meta, "\"programs\": [", "\"programs\": [{}, ", 0), "3 programs for 2 stages");
}
END_TEST

START_TEST(meta_parallel) {
    RtMeta m;
    RtErr e = {0};
    /* A single program: 1 x 1, its rank running the whole batch, also on
     * a rank beyond its one (each rank of a run on several trains alone). */
    for (int rank = 0; rank < 3; rank += 2) {
        ck_assert_msg(rt_meta_parse_rank(good_meta, strlen(good_meta), rank, &m, &e), "%s", e.msg);
        ck_assert_int_eq(m.ranks, 1);
        ck_assert(m.layout.stages == 1 && m.layout.dp == 1 && m.layout.microbatches == 1);
        ck_assert(m.layout.stage == 0 && m.layout.replica == 0 && !m.layout.by_stage);
        ck_assert_int_eq(m.local_batch, 8);
        ck_assert_int_eq(m.n_buckets, 0);
        ck_assert_str_eq(m.plan_hash, "ab");
        rt_meta_free(&m);
    }
    ck_assert_str_eq(meta_error("\"buckets\": [], ", ""), ""); /* absent: none */
    ASSERT_HAS(meta_error("\"buckets\": []", "\"buckets\": [{\"offset\": 512, \"count\": 1}]"),
               "1 gradient buckets but no replicas to sum them over");

    ck_assert_msg(rt_meta_parse_rank(dp_meta, strlen(dp_meta), 1, &m, &e), "%s", e.msg);
    ck_assert(m.layout.stages == 1 && m.layout.dp == 2 && m.layout.microbatches == 1);
    ck_assert(m.layout.stage == 0 && m.layout.replica == 1);
    ck_assert(!rt_layout_pipelined(&m.layout));
    ck_assert_int_eq(m.ranks, 2);
    ck_assert_int_eq(m.batch, 8);
    ck_assert_int_eq(m.local_batch, 4);
    ck_assert_int_eq(m.inputs[0].row_elems, 4);
    ck_assert_int_eq(m.output.row_elems, 3);
    ck_assert_int_eq(m.n_buckets, 2);
    ck_assert_uint_eq(m.buckets[0].offset, 536); /* kept in the program's numbering */
    ck_assert_int_eq(m.buckets[0].count, 6);
    ck_assert_uint_eq(m.buckets[1].offset, 512);
    ck_assert_str_eq(m.plan_hash, "cd");
    rt_meta_free(&m);

    ck_assert_str_eq(dp_meta_error("\"buckets\": [{", "\"x\": [{"), ""); /* no buckets: nothing to sum */
    ck_assert_str_eq(dp_meta_error("\"count\": 6}, {", "\"count\": 0}, {"), "");
    /* The runtime goes by the layout, whatever the plan's strategy is called. */
    ck_assert_str_eq(dp_meta_error("\"strategy\": \"dp\"", "\"strategy\": \"tp\""), "");
    ASSERT_HAS(dp_meta_error("\"shape\": [4, 4]", "\"shape\": [8, 4]"),
               "inputs[0]: shape[0] is 8, expected the local batch 4 (batch 8 over 2 replicas)");
    ASSERT_HAS(dp_meta_error("\"shape\": [4, 3]}", "\"shape\": [8, 3]}"), "output: shape[0] is 8, expected the local batch 4");
    ASSERT_HAS(dp_meta_error("\"local_batch\": 4", "\"local_batch\": 3"),
               "\"local_batch\" 3 x \"dp\" 2 is not \"batch\" 8");
    ASSERT_HAS(dp_meta_error("\"local_batch\": 4", "\"local_batch\": 0"), "\"local_batch\" is 0, expected at least 1");
    ASSERT_HAS(dp_meta_error("\"dp\": 2", "\"dp\": 1"), "\"dp\" 1 x \"stages\" 1 is not \"ranks\" 2");
    ASSERT_HAS(dp_meta_error("\"offset\": 536", "\"offset\": 538"), "buckets[0]: offset 538 is not a multiple of 4");
    ASSERT_HAS(dp_meta_error("\"offset\": 536, \"count\": 6", "\"offset\": 536, \"count\": 11"),
               "buckets[0]: 11 values at offset 536 end past the arena of 576 bytes");
    ASSERT_HAS(dp_meta_error("\"offset\": 536", "\"offset\": 520"), "\"buckets\" overlap");
    ASSERT_HAS(dp_meta_error("\"count\": 6}, {", "\"count\": 4294967296}, {"), "more than one MPI call can sum");
    ASSERT_HAS(dp_meta_error("{\"offset\": 536, \"count\": 6}", "[]"), "buckets[0] is not an object");
    ASSERT_HAS(dp_meta_error("\"buckets\": [", "\"buckets\": 3, \"x\": ["), "\"buckets\" is not an array");
    ASSERT_HAS(dp_meta_error(", \"count\": 6}, {", "}, {"), "buckets[0]: \"count\" is missing");
    ASSERT_HAS(meta_error("\"plan_hash\": \"ab\"", "\"plan_hash\": \"\""), "\"plan_hash\" has 0 characters");
    ASSERT_HAS(meta_error("\"plan_hash\": \"ab\"",
                          "\"plan_hash\": \"0123456789012345678901234567890123456789012345678901234567890123456789\""),
               "\"plan_hash\" has 70 characters, expected 1 to 64");
}
END_TEST

/* ---- command line ------------------------------------------------------- */

static const char *args_error(const char *line, RtArgs *out) {
    static RtErr e;
    static char copy[1024];
    static RtArgs a;
    memset(&e, 0, sizeof e);
    snprintf(copy, sizeof copy, "prog %s", line);
    char *argv[64];
    int argc = 0;
    for (char *tok = strtok(copy, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    bool ok = rt_args_parse(argc, argv, &a, &e);
    ck_assert(ok == (e.status == 0));
    if (out && ok) *out = a;
    else rt_args_free(&a);
    return e.msg;
}

START_TEST(args_good) {
    RtArgs a;
    ck_assert_str_eq(args_error("--data input=x.npy --data=labels=y.npy --steps 10 --lr=0.5 --shuffle 42 "
                                "--metrics m.jsonl --save s.onnx --eval-data input=a=b.npy --eval-data labels=c "
                                "--predict p.npy --log-every 0", &a), "");
    ck_assert_int_eq(a.n_data, 2);
    ck_assert_str_eq(a.data[1].name, "labels");
    ck_assert_str_eq(a.data[1].path, "y.npy");
    ck_assert_str_eq(a.eval[0].name, "input");
    ck_assert_str_eq(a.eval[0].path, "a=b.npy");
    ck_assert_int_eq(a.steps, 10);
    ck_assert(a.has_lr && a.lr == 0.5f);
    ck_assert(a.shuffle && a.seed == 42);
    ck_assert_str_eq(a.metrics, "m.jsonl");
    ck_assert_str_eq(a.predict, "p.npy");
    ck_assert_int_eq(a.log_every, 0);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--data x=y --epochs 3", &a), "");
    ck_assert_int_eq(a.epochs, 3);
    ck_assert_int_eq(a.log_every, 100);
    ck_assert(!a.has_lr && !a.shuffle);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--help", &a), "");
    ck_assert(a.help);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--data x=y --steps 1 --shuffle 18446744073709551615", &a), "");
    ck_assert(a.seed == UINT64_MAX);
    ck_assert(!a.check_replicas);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--data x=y --check-replicas --steps 1", &a), "");
    ck_assert(a.check_replicas && a.steps == 1);
    ck_assert(a.timeout == RT_TIMEOUT_DEFAULT);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--data x=y --steps 1 --timeout 2.5", &a), "");
    ck_assert(a.timeout == 2.5);
    rt_args_free(&a);
    ck_assert_str_eq(args_error("--data x=y --steps 1 --timeout=0", &a), "");
    ck_assert(a.timeout == 0);
    rt_args_free(&a);
}
END_TEST

/* The flags every rank must agree on change the fingerprint; the ones only
 * rank 0 uses, or that do not change the collectives, do not. */
static uint64_t fingerprint(const char *line) {
    RtArgs a;
    ck_assert_str_eq(args_error(line, &a), "");
    uint64_t h = rt_args_fingerprint(&a);
    rt_args_free(&a);
    return h;
}

START_TEST(args_fingerprint) {
    uint64_t base = fingerprint("--data x=y --steps 3");
    ck_assert(base == fingerprint("--data x=z --steps 3 --metrics m --save s.onnx --log-every 7"));
    ck_assert(base == fingerprint("--steps=3 --data x=y"));
    ck_assert(base != fingerprint("--data x=y --steps 4"));
    ck_assert(base != fingerprint("--data x=y --epochs 3"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --shuffle 0"));
    ck_assert(fingerprint("--data x=y --steps 3 --shuffle 1") != fingerprint("--data x=y --steps 3 --shuffle 2"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --lr 0.1"));
    ck_assert(fingerprint("--data x=y --steps 3 --lr 0.1") != fingerprint("--data x=y --steps 3 --lr 0.2"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --eval-data x=e"));
    ck_assert(fingerprint("--data x=y --steps 3 --eval-data x=e") !=
              fingerprint("--data x=y --steps 3 --eval-data x=e --predict p.npy"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --check-replicas"));
    /* the learning rate the replicas update with */
    ck_assert(base != fingerprint("--data x=y --steps 3 --lr-schedule constant"));
    ck_assert(fingerprint("--data x=y --steps 3 --lr-schedule linear") !=
              fingerprint("--data x=y --steps 3 --lr-schedule cosine"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --warmup-steps 0"));
    ck_assert(fingerprint("--data x=y --steps 3 --warmup-steps 1") != fingerprint("--data x=y --steps 3 --warmup-steps 2"));
    ck_assert(base != fingerprint("--data x=y --steps 3 --timeout 3"));
    ck_assert(base == fingerprint("--data x=y --steps 3 --timeout 300"));
    ck_assert(fingerprint("--data x=y --steps 3 --timeout 0") == fingerprint("--data x=y --steps 3 --timeout -0"));
}
END_TEST

START_TEST(fnv1a) {
    /* Reference values of 64-bit FNV-1a. */
    ck_assert(rt_fnv1a64(RT_FNV1A64_INIT, "", 0) == 0xcbf29ce484222325ull);
    ck_assert(rt_fnv1a64(RT_FNV1A64_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
    ck_assert(rt_fnv1a64(RT_FNV1A64_INIT, "foobar", 6) == 0x85944171f73967e8ull);
    ck_assert(rt_fnv1a64(rt_fnv1a64(RT_FNV1A64_INIT, "foo", 3), "bar", 3) == 0x85944171f73967e8ull);
}
END_TEST

START_TEST(args_bad) {
    ck_assert_str_eq(args_error("--frob", NULL), "unknown option '--frob' (see --help)");
    ck_assert_str_eq(args_error("--data x=y --steps 1 extra", NULL), "unexpected argument 'extra' (see --help)");
    ck_assert_str_eq(args_error("--steps 1", NULL), "no --data given (see --help)");
    ck_assert_str_eq(args_error("--data x=y", NULL), "give --steps K or --epochs E");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --epochs 1", NULL), "give --steps or --epochs, not both");
    ck_assert_str_eq(args_error("--data x=y --steps 0", NULL), "--steps needs an integer of at least 1, got '0'");
    ck_assert_str_eq(args_error("--data x=y --steps 1x", NULL), "--steps needs an integer of at least 1, got '1x'");
    ck_assert_str_eq(args_error("--data x=y --epochs -2", NULL), "--epochs needs an integer of at least 1, got '-2'");
    ck_assert_str_eq(args_error("--data x=y --steps 99999999999999999999", NULL),
                     "--steps needs an integer of at least 1, got '99999999999999999999'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --steps 2", NULL), "--steps given twice");
    ck_assert_str_eq(args_error("--data x=y --steps", NULL), "--steps needs a value");
    ck_assert_str_eq(args_error("--data x=y --metrics --steps 3", NULL), "--metrics needs a value");
    ck_assert_str_eq(args_error("--data x --steps 1", NULL), "--data needs NAME=FILE, got 'x'");
    ck_assert_str_eq(args_error("--data =y --steps 1", NULL), "--data needs NAME=FILE, got '=y'");
    ck_assert_str_eq(args_error("--data x= --steps 1", NULL), "--data needs NAME=FILE, got 'x='");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr abc", NULL), "--lr needs a non-negative float32 number, got 'abc'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr -0.1", NULL), "--lr needs a non-negative float32 number, got '-0.1'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr 1e39", NULL), "--lr needs a non-negative float32 number, got '1e39'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr nan", NULL), "--lr needs a non-negative float32 number, got 'nan'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --shuffle -1", NULL), "--shuffle needs a seed from 0 to 18446744073709551615, got '-1'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --shuffle 18446744073709551616", NULL),
                     "--shuffle needs a seed from 0 to 18446744073709551615, got '18446744073709551616'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --save a --save b", NULL), "--save given twice");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --save=", NULL), "--save needs a file name");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --predict p.npy", NULL), "--predict needs --eval-data");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --log-every -1", NULL), "--log-every needs an integer of at least 0, got '-1'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --a-very-long-option-name-indeed=3", NULL),
                     "unknown option '--a-very-long-option-name-indeed' (see --help)");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --check-replicas=yes", NULL), "--check-replicas takes no value");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --check-replicasx", NULL), "unknown option '--check-replicasx' (see --help)");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr-schedule step", NULL),
                     "--lr-schedule must be constant, linear or cosine, got 'step'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --lr-schedule linear --lr-schedule=cosine", NULL),
                     "--lr-schedule given twice");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --warmup-steps -1", NULL),
                     "--warmup-steps needs an integer of at least 0, got '-1'");
    ck_assert_str_eq(args_error("--data x=y --steps 1 --warmup-steps 2 --warmup-steps 2", NULL),
                     "--warmup-steps given twice");
    ck_assert_str_eq(args_error("--calibrate-comm c.json --warmup-steps 2", NULL), "--calibrate-comm takes no other option");
    ck_assert_str_eq(args_error("--calibrate-comm c.json --timeout 2", NULL), "--calibrate-comm takes no other option");
    static const char *const bad_timeouts[] = {"-1", "abc", "inf", "1e999"};
    for (size_t i = 0; i < sizeof bad_timeouts / sizeof *bad_timeouts; i++) {
        char cmd[64], want[96];
        snprintf(cmd, sizeof cmd, "--data x=y --steps 1 --timeout %s", bad_timeouts[i]);
        snprintf(want, sizeof want, "--timeout needs a number of seconds >= 0, got '%s'", bad_timeouts[i]);
        ck_assert_str_eq(args_error(cmd, NULL), want);
    }
    ck_assert_str_eq(args_error("--data x=y --steps 1 --timeout 1 --timeout 1", NULL), "--timeout given twice");
}
END_TEST

START_TEST(args_bind) {
    RtMeta m;
    RtErr e = {0};
    ck_assert(rt_meta_parse(good_meta, strlen(good_meta), &m, &e));
    const char *paths[2];
    RtNamedFile ok[2] = {{"labels", "y.npy"}, {"input", "x.npy"}};
    ck_assert(rt_args_bind(&m, ok, 2, "--data", paths, &e));
    ck_assert_str_eq(paths[0], "x.npy");
    ck_assert_str_eq(paths[1], "y.npy");
    RtNamedFile unknown[2] = {{"input", "x.npy"}, {"image", "i.npy"}};
    ck_assert(!rt_args_bind(&m, unknown, 2, "--data", paths, &e));
    ck_assert_str_eq(e.msg, "--data image=i.npy: the program has no input 'image' (its inputs: input, labels)");
    ck_assert_int_eq(e.status, 2);
    memset(&e, 0, sizeof e);
    RtNamedFile twice[3] = {{"input", "x.npy"}, {"labels", "y.npy"}, {"input", "z.npy"}};
    ck_assert(!rt_args_bind(&m, twice, 3, "--eval-data", paths, &e));
    ck_assert_str_eq(e.msg, "--eval-data input given twice");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_args_bind(&m, ok, 1, "--data", paths, &e));
    ck_assert_str_eq(e.msg, "no --data for input 'input' (give --data input=FILE)");
    rt_meta_free(&m);

    memset(&e, 0, sizeof e);
    ck_assert(rt_args_check_writable("--save", "/tmp/rt_unit_new_file.onnx", &e));
    ck_assert(!rt_args_check_writable("--save", "/nonexistent-dir/m.onnx", &e));
    ck_assert_str_eq(e.msg, "--save /nonexistent-dir/m.onnx: folder /nonexistent-dir does not exist");
    memset(&e, 0, sizeof e);
    ck_assert(!rt_args_check_writable("--save", "/tmp", &e));
    ck_assert_str_eq(e.msg, "--save /tmp: is a folder");
}
END_TEST

/* ---- row order ---------------------------------------------------------- */

START_TEST(splitmix_reference) {
    /* First outputs of splitmix64 from state 0 and 1234567 (the reference
     * implementation by Vigna). */
    uint64_t s = 0;
    ck_assert(rt_splitmix64(&s) == 0xe220a8397b1dcdafull);
    ck_assert(rt_splitmix64(&s) == 0x6e789e6aa1b965f4ull);
    s = 1234567;
    ck_assert(rt_splitmix64(&s) == 6457827717110365317ull);
    ck_assert(rt_splitmix64(&s) == 3203168211198807973ull);
}
END_TEST

START_TEST(order_is_a_permutation) {
    RtErr e = {0};
    for (int64_t n = 1; n <= 40; n += 3) {
        RtOrder o;
        ck_assert(rt_order_init(&o, n, true, 7, &e));
        for (int64_t ep = 0; ep < 4; ep++) {
            rt_order_epoch(&o, ep);
            char seen[64] = {0};
            for (int64_t k = 0; k < n; k++) {
                ck_assert(o.perm[k] >= 0 && o.perm[k] < n);
                ck_assert(!seen[o.perm[k]]);
                seen[o.perm[k]] = 1;
            }
        }
        rt_order_free(&o);
    }
    /* Epochs differ, the same epoch repeats, and a documented case. */
    RtOrder o;
    ck_assert(rt_order_init(&o, 10, true, 1, &e));
    int64_t first[10], again[10];
    rt_order_epoch(&o, 0);
    memcpy(first, o.perm, sizeof first);
    rt_order_epoch(&o, 1);
    ck_assert(memcmp(first, o.perm, sizeof first) != 0);
    rt_order_epoch(&o, 0);
    memcpy(again, o.perm, sizeof again);
    ck_assert(memcmp(first, again, sizeof first) == 0);
    /* Replayed by hand from the algorithm in rt_batch.c. */
    uint64_t st = 1 * 1000003ull + 0;
    int64_t p[10];
    for (int k = 0; k < 10; k++) p[k] = k;
    for (int i = 9; i >= 1; i--) {
        int j = (int)(rt_splitmix64(&st) % (uint64_t)(i + 1));
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    ck_assert(memcmp(p, first, sizeof p) == 0);
    rt_order_free(&o);
}
END_TEST

START_TEST(batch_rows_wrap) {
    RtOrder o = {.n = 10};
    /* B = 4 over 10 rows: steps 0, 1, 2 take 0-3, 4-7, 8 9 0 1. */
    ck_assert_int_eq(rt_batch_row(&o, 4, 0, 3), 3);
    ck_assert_int_eq(rt_batch_row(&o, 4, 1, 0), 4);
    ck_assert_int_eq(rt_batch_row(&o, 4, 2, 1), 9);
    ck_assert_int_eq(rt_batch_row(&o, 4, 2, 2), 0);
    ck_assert_int_eq(rt_batch_row(&o, 4, 2, 3), 1);
    ck_assert_int_eq(rt_steps_per_epoch(10, 4), 3);
    ck_assert_int_eq(rt_steps_per_epoch(8, 4), 2);
    ck_assert_int_eq(rt_steps_per_epoch(4, 4), 1);

    /* Filling copies whole rows to consecutive positions, from r0 on. */
    float rows[10][2];
    for (int r = 0; r < 10; r++) rows[r][0] = (float)r, rows[r][1] = (float)(100 + r);
    int64_t shape[2] = {4, 2};
    RtTensor slot = tensor(RT_F32, 2, shape);
    slot.offset = 64;
    RtArray a = {.path = "x", .dtype = RT_F32, .rows = 10, .row_elems = 2, .row_bytes = 8, .data = rows};
    _Alignas(64) char arena[128] = {0};
    rt_batch_fill(&o, &slot, &a, 1, 4, 2, 0, 4, arena);
    float got[8];
    memcpy(got, arena + 64, sizeof got);
    float want[8] = {8, 108, 9, 109, 0, 100, 1, 101};
    ck_assert(memcmp(got, want, sizeof want) == 0);
    memset(arena, 0, sizeof arena);
    rt_batch_fill(&o, &slot, &a, 1, 4, 1, 2, 4, arena);
    memcpy(got, arena + 64, sizeof got);
    ck_assert(got[0] == 6 && got[2] == 7 && got[4] == 0);
}
END_TEST

/* ---- half floats -------------------------------------------------------- */

START_TEST(half_round_trip) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = rt_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            ck_assert(isnan(rt_f16_to_f32(rt_f32_to_f16(f))));
            continue;
        }
        ck_assert_msg(rt_f32_to_f16(f) == h, "half 0x%04x -> %g -> 0x%04x", h, (double)f, rt_f32_to_f16(f));
    }
    /* Ties round to even; overflow goes to infinity; tiny values to zero. */
    ck_assert_uint_eq(rt_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
    ck_assert_uint_eq(rt_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    ck_assert_uint_eq(rt_f32_to_f16(1.0f + 1.0f / 2048 + 1.0f / 65536), 0x3c01);
    ck_assert_uint_eq(rt_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(rt_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(rt_f32_to_f16(-1e10f), 0xfc00);
    ck_assert_uint_eq(rt_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* half of the smallest: tie to 0 */
    ck_assert_uint_eq(rt_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    ck_assert_uint_eq(rt_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp: tie to even */
    ck_assert_uint_eq(rt_f32_to_f16(ldexpf(1.0f, -14) - ldexpf(1.0f, -26)), 0x0400); /* rounds up to normal */
    ck_assert_uint_eq(rt_f32_to_f16(-0.0f), 0x8000);

    ck_assert_uint_eq(rt_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(rt_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
    ck_assert_uint_eq(rt_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    ck_assert_uint_eq(rt_f32_to_bf16(-2.5f), 0xc020);
    ck_assert_uint_eq(rt_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert(rt_f32_to_bf16(NAN) & 0x7f && (rt_f32_to_bf16(NAN) & 0x7f80) == 0x7f80);
}
END_TEST

START_TEST(shape_strings) {
    char buf[64];
    int64_t d[3] = {28, 28, 1};
    ck_assert_str_eq(rt_shape_str(buf, sizeof buf, 3, d), "[28, 28, 1]");
    ck_assert_str_eq(rt_shape_str(buf, sizeof buf, 0, d), "[]");
    char tiny[6];
    rt_shape_str(tiny, sizeof tiny, 3, d); /* truncates, stays terminated */
    ck_assert_uint_lt(strlen(tiny), sizeof tiny);
}
END_TEST

int main(void) {
    Suite *s = suite_create("runtime");
    struct {
        const char *name;
        const TTest *tests[8];
    } cases[] = {
        {"npy", {npy_good_headers, npy_bad_headers, npy_write_reads_back}},
        {"idx", {idx_headers}},
        {"data", {decode_conversions, decode_idx, load_files}},
        {"meta", {meta_good, meta_bad, meta_state, meta_parallel, meta_pipeline}},
        {"args", {args_good, args_bad, args_bind, args_fingerprint}},
        {"comm", {fnv1a}},
        {"order", {splitmix_reference, order_is_a_permutation, batch_rows_wrap}},
        {"half", {half_round_trip, shape_strings}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        TCase *tc = tcase_create(cases[i].name);
        for (int k = 0; cases[i].tests[k]; k++) tcase_add_test(tc, cases[i].tests[k]);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
