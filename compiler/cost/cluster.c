#include "cluster.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/file_util.h"
#include "../util/text.h"

/* ---- reading ---- */

typedef struct Reader {
    const char *path;
    Diag *d;
} Reader;

static bool fail(Reader *R, DiagCode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool fail(Reader *R, DiagCode code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return diag_error(R->d, code, "%s: %s", R->path, msg);
}

/* A field as messages write it: "key" at the top level, "parent"."key"
 * inside an object, and inside an array's entry "links"[2]."key" (a
 * parent already quoted is written as it is).  Keys come from the file,
 * so they are cut short. */
typedef struct FieldName {
    char s[160];
} FieldName;

static FieldName field(const char *parent, const char *key) {
    FieldName f;
    if (parent && parent[0] == '"') snprintf(f.s, sizeof f.s, "%s.\"%.100s\"", parent, key);
    else if (parent) snprintf(f.s, sizeof f.s, "\"%s\".\"%.100s\"", parent, key);
    else snprintf(f.s, sizeof f.s, "\"%.100s\"", key);
    return f;
}

/* The object's keys must all be in `known` (NULL-terminated), so that a
 * misspelt optional field is an error rather than a silent default.  The
 * first unknown key in file order is reported. */
static bool check_keys(Reader *R, json_t *obj, const char *parent, const char *const *known) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(key, known[i]) == 0;
        if (ok) continue;
        char list[320] = "";
        size_t used = 0;
        for (int i = 0; known[i]; i++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", known[i]);
            if (w < 0 || (size_t)w >= sizeof list - used) break;
            used += (size_t)w;
        }
        return fail(R, DIAG_FORMAT, "unknown field %s (known: %s)", field(parent, key).s, list);
    }
    return true;
}

static json_t *required(Reader *R, json_t *obj, const char *parent, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (!v) fail(R, DIAG_FORMAT, "missing required field %s", field(parent, key).s);
    return v;
}

static json_t *object_field(Reader *R, json_t *obj, const char *key) {
    json_t *v = required(R, obj, NULL, key);
    if (v && !json_is_object(v)) {
        fail(R, DIAG_FORMAT, "%s must be an object", field(NULL, key).s);
        return NULL;
    }
    return v;
}

/* A number > 0, or >= 0 with zero_ok; finite, as JSON has no infinities
 * and jansson refuses reals that overflow. */
static bool number_ok(json_t *v, bool zero_ok, double *out) {
    if (!json_is_number(v)) return false;
    double x = json_number_value(v);
    if (!(zero_ok ? x >= 0 : x > 0) || !isfinite(x)) return false;
    *out = x;
    return true;
}

static bool read_number(Reader *R, json_t *obj, const char *parent, const char *key, bool zero_ok, double *out) {
    json_t *v = required(R, obj, parent, key);
    if (!v) return false;
    if (!number_ok(v, zero_ok, out))
        return fail(R, DIAG_FORMAT, "%s must be a %s number", field(parent, key).s,
                    zero_ok ? "non-negative" : "positive");
    return true;
}

/* A positive integer; above max it is DIAG_LIMIT.  JSON Schema counts 8.0
 * as an integer, so a real without a fractional part is one here too. */
static bool read_int(Reader *R, json_t *obj, const char *key, int64_t max, int64_t *out) {
    json_t *v = required(R, obj, NULL, key);
    if (!v) return false;
    double x = json_number_value(v);
    if (!(json_is_integer(v) || (json_is_real(v) && x == floor(x))) || !(x >= 1))
        return fail(R, DIAG_FORMAT, "%s must be a positive integer", field(NULL, key).s);
    /* A real above 2^63 must not reach the conversion below. */
    if (json_is_integer(v) ? json_integer_value(v) > max : !(x < (double)max + 1.0))
        return fail(R, DIAG_LIMIT, "%s is more than the limit of %lld", field(NULL, key).s, (long long)max);
    *out = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)x;
    return true;
}

/* A link's optional numbers, each 0 when absent: "allreduce_gbps", and
 * the sender's CPU per message, "send_overhead_s" and "send_gbps". */
static bool read_allreduce(Reader *R, json_t *o, const char *where, ClusterLink *l) {
    l->allreduce_gbps = l->send_overhead_s = l->send_gbps = 0;
    return (!json_object_get(o, "allreduce_gbps") ||
            read_number(R, o, where, "allreduce_gbps", false, &l->allreduce_gbps)) &&
           (!json_object_get(o, "send_overhead_s") ||
            read_number(R, o, where, "send_overhead_s", true, &l->send_overhead_s)) &&
           (!json_object_get(o, "send_gbps") || read_number(R, o, where, "send_gbps", false, &l->send_gbps));
}

static bool read_link(Reader *R, json_t *root, const char *key, ClusterLink *l) {
    static const char *const known[] = {"latency_s", "bandwidth_gbps", "allreduce_gbps", "send_overhead_s",
                                        "send_gbps", NULL};
    json_t *o = object_field(R, root, key);
    return o && check_keys(R, o, key, known) && read_number(R, o, key, "latency_s", true, &l->latency_s) &&
           read_number(R, o, key, "bandwidth_gbps", false, &l->bandwidth_gbps) && read_allreduce(R, o, key, l);
}

static int by_pair(const void *x, const void *y) {
    const ClusterPairLink *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* One entry of "links": {"nodes": [x, y], "latency_s", "bandwidth_gbps"}
 * with x != y nodes of the cluster. */
static bool read_pair_link(Reader *R, json_t *o, size_t i, int nodes, ClusterPairLink *out) {
    static const char *const known[] = {"nodes", "latency_s", "bandwidth_gbps", "allreduce_gbps", "send_overhead_s",
                                        "send_gbps", NULL};
    char where[48];
    snprintf(where, sizeof where, "\"links\"[%zu]", i);
    if (!json_is_object(o)) return fail(R, DIAG_FORMAT, "\"links\"[%zu] must be an object", i);
    json_t *pair = json_object_get(o, "nodes");
    if (!check_keys(R, o, where, known)) return false;
    if (!pair) return fail(R, DIAG_FORMAT, "missing required field \"links\"[%zu].\"nodes\"", i);
    int node[2];
    for (int k = 0; k < 2; k++) {
        json_t *v = json_is_array(pair) && json_array_size(pair) == 2 ? json_array_get(pair, (size_t)k) : NULL;
        double x = json_number_value(v);
        if (!v || !(json_is_integer(v) || (json_is_real(v) && x == floor(x))) || !(x >= 0))
            return fail(R, DIAG_FORMAT, "\"links\"[%zu].\"nodes\" must be a pair [x, y] of node numbers", i);
        if (!(x < nodes))
            return fail(R, DIAG_FORMAT, "\"links\"[%zu].\"nodes\": node %g is not one of the %d nodes", i, x,
                        nodes);
        node[k] = (int)x;
    }
    if (node[0] == node[1])
        return fail(R, DIAG_FORMAT, "\"links\"[%zu].\"nodes\": a link joins two different nodes, not node %d to "
                    "itself", i, node[0]);
    out->a = node[0] < node[1] ? node[0] : node[1];
    out->b = node[0] < node[1] ? node[1] : node[0];
    return read_number(R, o, where, "latency_s", true, &out->link.latency_s) &&
           read_number(R, o, where, "bandwidth_gbps", false, &out->link.bandwidth_gbps) &&
           read_allreduce(R, o, where, &out->link);
}

/* "links": links between particular pairs of nodes, overriding
 * inter_node for them; a pair given twice (in either order) is an error,
 * since one of the two would silently lose. */
static bool read_links(Reader *R, json_t *root, Cluster *c) {
    json_t *a = json_object_get(root, "links");
    if (!a) return true;
    if (!json_is_array(a)) return fail(R, DIAG_FORMAT, "\"links\" must be an array of node-pair links");
    size_t n = json_array_size(a);
    if (n == 0) return true;
    if ((double)n > 0.5 * (double)c->nodes * (c->nodes - 1))
        return fail(R, DIAG_FORMAT, "\"links\" has %zu entries, more than the %d nodes have pairs", n, c->nodes);
    c->links = malloc(n * sizeof *c->links);
    if (!c->links) return fail(R, DIAG_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!read_pair_link(R, json_array_get(a, i), i, c->nodes, &c->links[i])) return false;
        c->n_links = (int)i + 1;
    }
    qsort(c->links, n, sizeof *c->links, by_pair);
    for (size_t i = 1; i < n; i++)
        if (by_pair(&c->links[i - 1], &c->links[i]) == 0)
            return fail(R, DIAG_FORMAT, "\"links\": nodes %d and %d are given twice", c->links[i].a, c->links[i].b);
    return true;
}

/* A rate curve compute[key]: [flops, gflops] pairs, sizes ascending. */
static bool read_curve(Reader *R, json_t *compute, const char *key, int *n_out, double *flops, double *gflops) {
    char where[64];
    snprintf(where, sizeof where, "\"compute\".\"%s\"", key);
    json_t *a = required(R, compute, "compute", key);
    if (!a) return false;
    if (!json_is_array(a) || json_array_size(a) == 0)
        return fail(R, DIAG_FORMAT, "%s must be a non-empty array of [flops, gflops] pairs", where);
    size_t n = json_array_size(a);
    if (n > CLUSTER_MAX_GEMM_POINTS)
        return fail(R, DIAG_FORMAT, "%s has %zu points, at most %d are allowed", where, n, CLUSTER_MAX_GEMM_POINTS);
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(a, i);
        double f, g;
        if (!json_is_array(p) || json_array_size(p) != 2 || !number_ok(json_array_get(p, 0), false, &f) ||
            !number_ok(json_array_get(p, 1), false, &g))
            return fail(R, DIAG_FORMAT, "%s[%zu] must be a pair [flops, gflops] of positive numbers", where, i);
        if (i > 0 && !(f > flops[i - 1]))
            return fail(R, DIAG_FORMAT, "%s[%zu]: problem sizes must be strictly ascending (%g after %g)", where, i,
                        f, flops[i - 1]);
        flops[i] = f;
        gflops[i] = g;
    }
    *n_out = (int)n;
    return true;
}

static bool read_compute(Reader *R, json_t *root, Cluster *c) {
    static const char *const known[] = {"gemm_gflops",       "conv_gflops",     "elementwise_gbps",
                                        "kernel_overhead_s", "step_overhead_s", NULL};
    json_t *o = object_field(R, root, "compute");
    return o && check_keys(R, o, "compute", known) &&
           read_curve(R, o, "gemm_gflops", &c->n_gemm, c->gemm_flops, c->gemm_gflops) &&
           (!json_object_get(o, "conv_gflops") ||
            read_curve(R, o, "conv_gflops", &c->n_conv, c->conv_flops, c->conv_gflops)) &&
           read_number(R, o, "compute", "elementwise_gbps", false, &c->elementwise_gbps) &&
           read_number(R, o, "compute", "kernel_overhead_s", true, &c->kernel_overhead_s) &&
           (!json_object_get(o, "step_overhead_s") ||
            read_number(R, o, "compute", "step_overhead_s", true, &c->step_overhead_s));
}

static bool read_rank_speed(Reader *R, json_t *root, Cluster *c) {
    json_t *a = json_object_get(root, "rank_speed");
    if (!a) return true;
    if (!json_is_array(a)) return fail(R, DIAG_FORMAT, "\"rank_speed\" must be an array of positive numbers");
    size_t n = json_array_size(a), want = (size_t)cluster_ranks(c);
    if (n != want)
        return fail(R, DIAG_FORMAT, "\"rank_speed\" has %zu entries, expected %zu (nodes x ranks_per_node)", n,
                    want);
    c->rank_speed = malloc(n * sizeof *c->rank_speed);
    if (!c->rank_speed) return fail(R, DIAG_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (!number_ok(json_array_get(a, i), false, &c->rank_speed[i]))
            return fail(R, DIAG_FORMAT, "\"rank_speed\"[%zu] must be a positive number", i);
    return true;
}

static bool read_root(Reader *R, json_t *root, Cluster *c) {
    static const char *const known[] = {
        "format", "version", "name", "source", "nodes", "ranks_per_node", "cores_per_node", "memory_per_rank_bytes",
        "compute", "intra_node", "inter_node", "links", "rank_speed", NULL,
    };
    if (!json_is_object(root)) return fail(R, DIAG_FORMAT, "the top level must be an object");
    /* Format and version first: a plan or trace given by mistake should
     * say so, not list its fields as unknown. */
    json_t *v = required(R, root, NULL, "format");
    if (!v) return false;
    if (!json_is_string(v) || strcmp(json_string_value(v), "cleave-cluster") != 0)
        return fail(R, DIAG_FORMAT, "\"format\" must be \"cleave-cluster\"");
    if (!(v = required(R, root, NULL, "version"))) return false;
    double version = json_number_value(v);
    if (!json_is_number(v) || version != floor(version))
        return fail(R, DIAG_FORMAT, "\"version\" must be an integer");
    if (version != 1)
        return fail(R, DIAG_UNSUPPORTED, "\"version\" %g is not supported (this cleave reads version 1)", version);
    if (!check_keys(R, root, NULL, known)) return false;

    snprintf(c->source, sizeof c->source, "user");
    if ((v = json_object_get(root, "source"))) {
        const char *s = json_string_value(v);
        if (!s || (strcmp(s, "user") != 0 && strcmp(s, "calibrated") != 0 && strcmp(s, "defaults") != 0))
            return fail(R, DIAG_FORMAT, "\"source\" must be \"user\", \"calibrated\" or \"defaults\"");
        snprintf(c->source, sizeof c->source, "%s", s);
    }
    if ((v = json_object_get(root, "name"))) {
        if (!json_is_string(v)) return fail(R, DIAG_FORMAT, "\"name\" must be a string");
        if (!(c->name = strdup(json_string_value(v)))) return fail(R, DIAG_NOMEM, "out of memory");
    }

    int64_t nodes, per_node;
    if (!read_int(R, root, "nodes", CLUSTER_MAX_RANKS, &nodes) ||
        !read_int(R, root, "ranks_per_node", CLUSTER_MAX_RANKS, &per_node))
        return false;
    if (nodes * per_node > CLUSTER_MAX_RANKS)
        return fail(R, DIAG_LIMIT, "%lld nodes x %lld ranks per node is more than the limit of %d ranks",
                    (long long)nodes, (long long)per_node, CLUSTER_MAX_RANKS);
    c->nodes = (int)nodes;
    c->ranks_per_node = (int)per_node;
    if (json_object_get(root, "cores_per_node")) {
        int64_t cores;
        if (!read_int(R, root, "cores_per_node", CLUSTER_MAX_RANKS, &cores)) return false;
        c->cores_per_node = (int)cores;
    }
    return read_int(R, root, "memory_per_rank_bytes", INT64_MAX, &c->memory_per_rank_bytes) &&
           read_compute(R, root, c) && read_link(R, root, "intra_node", &c->intra_node) &&
           read_link(R, root, "inter_node", &c->inter_node) && read_links(R, root, c) && read_rank_speed(R, root, c);
}

bool cluster_parse(const char *text, size_t len, const char *path, Cluster *c, Diag *d) {
    memset(c, 0, sizeof *c);
    if (len == 0) return diag_error(d, DIAG_FORMAT, "%s: empty file, not a cluster file", path);
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        if (json_error_code(&err) == json_error_out_of_memory)
            return diag_error(d, DIAG_NOMEM, "%s: out of memory", path);
        return diag_error(d, DIAG_FORMAT, "%s: invalid JSON at line %d, column %d: %s", path, err.line, err.column,
                          err.text);
    }
    Reader R = {path, d};
    bool ok = read_root(&R, root, c);
    json_decref(root);
    if (!ok) {
        cluster_free(c);
        memset(c, 0, sizeof *c);
        return false;
    }
    snprintf(c->origin, sizeof c->origin, "%s", path);
    return true;
}

bool cluster_load(const char *path, Cluster *c, Diag *d) {
    memset(c, 0, sizeof *c);
    size_t len;
    uint8_t *buf = file_read_all(path, &len, d);
    if (!buf) return false;
    bool ok = cluster_parse((const char *)buf, len, path, c, d);
    free(buf);
    return ok;
}

void cluster_defaults(Cluster *c, int ranks) {
    CLEAVE_CHECK(ranks >= 1 && ranks <= CLUSTER_MAX_RANKS, "a cluster of %d ranks", ranks);
    static const double curve[][2] = {{1e3, 2}, {1e5, 10}, {1e7, 30}, {1e9, 40}};
    /* The medians of three `cleave calibrate` runs on the development
     * machine (2 cores of an AMD EPYC with AVX-512) with the packed
     * convolution kernels: the probe of 4 channels takes the direct loops
     * (fewer than 8 output channels), the other two the packed products.
     * Unlike the GEMM curve they are not scaled down for slower cores
     * (docs/cluster.md says why). */
    static const double conv[][2] = {{1.35e6, 4.6}, {2.17e7, 86}, {3.47e8, 125}};
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "defaults");
    snprintf(c->origin, sizeof c->origin, "defaults");
    c->nodes = 1;
    c->ranks_per_node = ranks;
    c->memory_per_rank_bytes = (int64_t)2 << 30;
    c->n_gemm = (int)(sizeof curve / sizeof curve[0]);
    for (int i = 0; i < c->n_gemm; i++) {
        c->gemm_flops[i] = curve[i][0];
        c->gemm_gflops[i] = curve[i][1];
    }
    c->n_conv = (int)(sizeof conv / sizeof conv[0]);
    for (int i = 0; i < c->n_conv; i++) {
        c->conv_flops[i] = conv[i][0];
        c->conv_gflops[i] = conv[i][1];
    }
    c->elementwise_gbps = 5.0;
    c->kernel_overhead_s = 3e-7;
    c->step_overhead_s = 1e-5;
    c->intra_node = (ClusterLink){1e-6, 5.0};
    c->inter_node = (ClusterLink){5e-6, 1.25};
}

void cluster_free(Cluster *c) {
    free(c->rank_speed);
    free(c->links);
    free(c->name);
    c->rank_speed = NULL;
    c->links = NULL;
    c->n_links = 0;
    c->name = NULL;
}

/* ---- writing ----
 *
 * By hand rather than with json_dumps, which writes every real with 17
 * digits (3e-7 as 2.9999999999999999e-07) and every curve point over four
 * lines: a calibration cache is meant to be read by people too. */

/* The shortest of %.15g, %.16g, %.17g that reads back as x. */
static void out_number(Text *o, double x) {
    char buf[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    text_put(o, "%s", buf);
}

static void out_string(Text *o, const char *s) {
    text_put(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') text_put(o, "\\%c", ch);
        else if (ch < 0x20) text_put(o, "\\u%04x", ch);
        else text_put(o, "%c", ch);
    }
    text_put(o, "\"");
}

/* A link's numbers after its opening brace (the optional ones when
 * given). */
static void out_link_numbers(Text *o, const ClusterLink *l) {
    text_put(o, "\"latency_s\": ");
    out_number(o, l->latency_s);
    text_put(o, ", \"bandwidth_gbps\": ");
    out_number(o, l->bandwidth_gbps);
    if (l->allreduce_gbps > 0) {
        text_put(o, ", \"allreduce_gbps\": ");
        out_number(o, l->allreduce_gbps);
    }
    if (l->send_overhead_s > 0) {
        text_put(o, ", \"send_overhead_s\": ");
        out_number(o, l->send_overhead_s);
    }
    if (l->send_gbps > 0) {
        text_put(o, ", \"send_gbps\": ");
        out_number(o, l->send_gbps);
    }
    text_put(o, "}");
}

static void out_link(Text *o, const char *key, const ClusterLink *l) {
    text_put(o, "  \"%s\": {", key);
    out_link_numbers(o, l);
}

char *cluster_to_json(const Cluster *c) {
    Text o = {0};
    text_put(&o, "{\n  \"format\": \"cleave-cluster\",\n  \"version\": 1,\n");
    if (c->name) {
        text_put(&o, "  \"name\": ");
        out_string(&o, c->name);
        text_put(&o, ",\n");
    }
    text_put(&o, "  \"source\": ");
    out_string(&o, c->source);
    text_put(&o, ",\n  \"nodes\": %d,\n  \"ranks_per_node\": %d,\n  \"memory_per_rank_bytes\": %lld,\n", c->nodes,
        c->ranks_per_node, (long long)c->memory_per_rank_bytes);
    if (c->cores_per_node > 0) text_put(&o, "  \"cores_per_node\": %d,\n", c->cores_per_node);
    text_put(&o, "  \"compute\": {\n    \"gemm_gflops\": [");
    for (int i = 0; i < c->n_gemm; i++) {
        text_put(&o, "%s[", i ? ", " : "");
        out_number(&o, c->gemm_flops[i]);
        text_put(&o, ", ");
        out_number(&o, c->gemm_gflops[i]);
        text_put(&o, "]");
    }
    if (c->n_conv > 0) {
        text_put(&o, "],\n    \"conv_gflops\": [");
        for (int i = 0; i < c->n_conv; i++) {
            text_put(&o, "%s[", i ? ", " : "");
            out_number(&o, c->conv_flops[i]);
            text_put(&o, ", ");
            out_number(&o, c->conv_gflops[i]);
            text_put(&o, "]");
        }
    }
    text_put(&o, "],\n    \"elementwise_gbps\": ");
    out_number(&o, c->elementwise_gbps);
    text_put(&o, ",\n    \"kernel_overhead_s\": ");
    out_number(&o, c->kernel_overhead_s);
    if (c->step_overhead_s > 0) { /* absent means 0: files without it read back as they were */
        text_put(&o, ",\n    \"step_overhead_s\": ");
        out_number(&o, c->step_overhead_s);
    }
    text_put(&o, "\n  },\n");
    out_link(&o, "intra_node", &c->intra_node);
    text_put(&o, ",\n");
    out_link(&o, "inter_node", &c->inter_node);
    if (c->n_links > 0) { /* a pair to a line */
        text_put(&o, ",\n  \"links\": [");
        for (int i = 0; i < c->n_links; i++) {
            const ClusterPairLink *l = &c->links[i];
            text_put(&o, "%s\n    {\"nodes\": [%d, %d], ", i ? "," : "", l->a, l->b);
            out_link_numbers(&o, &l->link);
        }
        text_put(&o, "\n  ]");
    }
    if (c->rank_speed) {
        /* A node's ranks to a line (at most 16 a line). */
        int n = cluster_ranks(c), per_line = c->ranks_per_node < 16 ? c->ranks_per_node : 16;
        text_put(&o, ",\n  \"rank_speed\": [");
        for (int r = 0; r < n; r++) {
            text_put(&o, "%s", r == 0 ? "\n    " : r % per_line == 0 ? ",\n    " : ", ");
            out_number(&o, c->rank_speed[r]);
        }
        text_put(&o, "\n  ]");
    }
    text_put(&o, "\n}\n");
    if (o.failed) {
        free(o.s);
        return NULL;
    }
    return o.s;
}

/* ---- costs ---- */

int cluster_ranks(const Cluster *c) { return c->nodes * c->ranks_per_node; }

double cluster_rank_speed(const Cluster *c, int rank) {
    CLEAVE_CHECK(rank >= 0 && rank < cluster_ranks(c), "rank %d of a %d-rank cluster", rank, cluster_ranks(c));
    return c->rank_speed ? c->rank_speed[rank] : 1.0;
}

/* Linear in log(flops) between a curve's points, its ends beyond them. */
static double curve_rate(int n, const double *f, const double *g, double flops) {
    CLEAVE_CHECK(n >= 1, "a group of %d ranks", n);
    if (!(flops > f[0])) return g[0];
    if (flops >= f[n - 1]) return g[n - 1];
    int lo = 0, hi = n - 1; /* f[lo] < flops < f[hi] */
    while (hi - lo > 1) {
        int m = lo + (hi - lo) / 2;
        if (f[m] <= flops) lo = m;
        else hi = m;
    }
    double t = log(flops / f[lo]) / log(f[hi] / f[lo]);
    return g[lo] + t * (g[hi] - g[lo]);
}

double cluster_gemm_gflops(const Cluster *c, double flops) {
    return curve_rate(c->n_gemm, c->gemm_flops, c->gemm_gflops, flops);
}

double cluster_conv_gflops(const Cluster *c, double flops) {
    if (c->n_conv < 1) return cluster_gemm_gflops(c, flops);
    return curve_rate(c->n_conv, c->conv_flops, c->conv_gflops, flops);
}

double cluster_conv_seconds(const Cluster *c, int rank, double flops) {
    double speed = cluster_rank_speed(c, rank);
    if (!(flops > 0)) return 0;
    return flops / (cluster_conv_gflops(c, flops) * 1e9) / speed;
}

double cluster_gemm_seconds(const Cluster *c, int rank, double flops) {
    double speed = cluster_rank_speed(c, rank);
    if (!(flops > 0)) return 0;
    return flops / (cluster_gemm_gflops(c, flops) * 1e9) / speed;
}

double cluster_mem_seconds(const Cluster *c, int rank, double bytes) {
    double speed = cluster_rank_speed(c, rank);
    if (!(bytes > 0)) return 0;
    return bytes / (c->elementwise_gbps * 1e9) / speed;
}

double cluster_core_share(const Cluster *c, int rank, int used) {
    int per = c->ranks_per_node, node = rank / per;
    int here = used - node * per < per ? used - node * per : per;
    if (c->cores_per_node <= 0 || here <= c->cores_per_node) return 1.0;
    return (double)c->cores_per_node / here;
}

int cluster_core_of(const Cluster *c, int rank, int used) {
    if (cluster_core_share(c, rank, used) >= 1) return -1;
    return rank % c->ranks_per_node % c->cores_per_node;
}

bool cluster_same_node(const Cluster *c, int a, int b) {
    CLEAVE_CHECK(a >= 0 && a < cluster_ranks(c) && b >= 0 && b < cluster_ranks(c), "link %d -> %d of a %d-rank cluster", a, b,
                 cluster_ranks(c));
    return a / c->ranks_per_node == b / c->ranks_per_node;
}

int cluster_node_of(const Cluster *c, int rank) { return rank / c->ranks_per_node; }

const ClusterLink *cluster_node_link(const Cluster *c, int x, int y) {
    if (c->n_links > 0) {
        ClusterPairLink key = {x < y ? x : y, x < y ? y : x, {0, 0}};
        const ClusterPairLink *l = bsearch(&key, c->links, (size_t)c->n_links, sizeof key, by_pair);
        if (l) return &l->link;
    }
    return &c->inter_node;
}

const ClusterLink *cluster_link(const Cluster *c, int a, int b) {
    if (cluster_same_node(c, a, b)) return &c->intra_node;
    return cluster_node_link(c, cluster_node_of(c, a), cluster_node_of(c, b));
}

double cluster_p2p_seconds(const Cluster *c, int a, int b, double bytes) {
    const ClusterLink *l = cluster_link(c, a, b);
    if (a == b) return 0;
    return l->latency_s + (bytes > 0 ? bytes / (l->bandwidth_gbps * 1e9) : 0);
}

double cluster_send_cpu_seconds(const Cluster *c, int a, int b, double bytes) {
    const ClusterLink *l = cluster_link(c, a, b);
    if (a == b) return 0;
    return l->send_overhead_s + (bytes > 0 && l->send_gbps > 0 ? bytes / (l->send_gbps * 1e9) : 0);
}

double cluster_ring_seconds(const Cluster *c, int a, int b, double bytes) {
    const ClusterLink *l = cluster_link(c, a, b);
    if (a == b || cluster_same_node(c, a, b) || !(l->allreduce_gbps > 0)) return cluster_p2p_seconds(c, a, b, bytes);
    return l->latency_s + (bytes > 0 ? bytes / (l->allreduce_gbps * 1e9) : 0);
}

double cluster_allreduce_seconds(const Cluster *c, const int *ranks, int n, double bytes) {
    if (n <= 1) return 0;
    double chunk = bytes / n, step = 0;
    for (int i = 0; i < n; i++) {
        double t = cluster_ring_seconds(c, ranks[i], ranks[(i + 1) % n], chunk);
        if (t > step) step = t;
    }
    /* the reduce-scatter half adds each received chunk into the rank's own:
     * n - 1 adds of bytes / n, reading two and writing one */
    double adds = (n - 1) * 3.0 * chunk / (c->elementwise_gbps * 1e9);
    return 2.0 * (n - 1) * step + adds;
}
