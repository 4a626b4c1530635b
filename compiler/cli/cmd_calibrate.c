/* cmd_calibrate.c - `cleave calibrate`: measures this machine and writes a
 * cluster file ("source": "calibrated", docs/cluster.md) for the cost
 * model.
 *
 * Compute is measured on the kernels cleave itself generates, built and
 * run in this process (as the unit tests do), because the cost model
 * prices those kernels, not a BLAS.  Messages are measured by a generated
 * program under mpirun (the runtime's --calibrate-comm), because the
 * compiler is not an MPI program: two ranks of this node for intra_node,
 * and with --hostfile one rank on each of its hosts, every pair of them
 * timed in turn, for the link between each pair of nodes (`links`, and
 * their median as inter_node).  What cannot be measured keeps its stated
 * default (cluster_defaults), and both the summary and the file's name
 * say which; a --hostfile whose links cannot be measured is an error. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "calibrate.h"
#include "cli.h"
#include "out_file.h"
#include "onnx.pb-c.h"
#include "../codegen/cg.h"
#include "../cost/cluster.h"
#include "../cost/kernel_run.h"
#include "../cost/node_cost.h"
#include "../driver.h"
#include "compile_options.h"
#include "../ir/shapes.h"
#include "../ops/ops.h"
#include "../plan/plan.h"

static const char calibrate_help[] =
    "usage: cleave calibrate (-o CLUSTER.json | --cache) [--ranks-per-node R] [--nodes N]\n"
    "                        [--memory-per-rank BYTES] [--hostfile FILE] [--quick]\n"
    "\n"
    "Measures this machine and writes a cluster file (\"source\": \"calibrated\") for\n"
    "cleave plan --cluster and cleave compile --strategy auto --cluster:\n"
    "  compute    GEMM rate of generated MatMul kernels of several sizes, the\n"
    "             bandwidth of an element-wise Add, the cost of a tiny kernel call\n"
    "  intra_node latency and bandwidth between 2 ranks (mpirun -np 2)\n"
    "  inter_node the same between every pair of the hostfile's hosts (links),\n"
    "             and the rate a sum of two ranks reaches over each (allreduce_gbps),\n"
    "             and the sender's time inside a send (send_overhead_s, send_gbps),\n"
    "             only with --hostfile; otherwise defaults, said so in the file\n"
    "\n"
    "  -o FILE                the cluster file to write\n"
    "  --cache                store it as this machine's calibration, which cleave plan\n"
    "                         and --strategy auto use when no --cluster is given\n"
    "                         ($CLEAVE_CLUSTER_CACHE, else ~/.cache/cleave/cluster.json)\n"
    "  --ranks-per-node R     ranks on each node (default: this machine's CPUs)\n"
    "  --nodes N              nodes (default 1; with --hostfile, its hosts)\n"
    "  --memory-per-rank B    bytes per rank (default: physical memory / R)\n"
    "  --hostfile FILE        mpirun host file of 2 or more hosts: measure the link\n"
    "                         between every pair (one rank per host, --map-by node)\n"
    "  --quick                fewer sizes and shorter timing (a few seconds)\n";

typedef struct Opts {
    const char *out, *hostfile;
    int64_t nodes, ranks_per_node, memory;
    bool quick, cache, nodes_given;
    int hosts; /* distinct hosts of --hostfile */
    char cache_path[1024];
} Opts;

/* ---- compute: kernels built and run in this process ---------------------- */

/* An INTS attribute of a node built here (room for 8, made on first use). */
static void set_ints(Graph *g, Node *n, const char *name, const int64_t *v, int count) {
    if (n && !n->attrs) n->attrs = ARENA_ARRAY(&g->arena, Attr, 8);
    if (!n || !n->attrs || n->n_attr >= 8) return;
    Attr *a = &n->attrs[n->n_attr++];
    a->name = name;
    a->kind = ATTR_INTS;
    a->ints = ARENA_ARRAY(&g->arena, int64_t, count);
    if (a->ints) memcpy(a->ints, v, sizeof *v * (size_t)count);
    a->n = a->ints ? count : 0;
}

/* A graph of one node `op` of `domain` over two float inputs, a of shape
 * adims and b of bdims (ranks up to 4). */
static Graph *op_graph_in(const char *domain, const char *op, int arank, const int64_t *adims, int brank,
                          const int64_t *bdims) {
    Graph *g = graph_new("calibrate");
    if (!g) return NULL;
    g->opsets = ARENA_NEW(&g->arena, Opset);
    g->inputs = ARENA_ARRAY(&g->arena, Value *, 2);
    g->outputs = ARENA_ARRAY(&g->arena, Value *, 1);
    Node *n = graph_add_node(g, NULL, op, domain, 2, 1);
    Value *y = graph_add_value(g, "y");
    if (!g->opsets || !g->inputs || !g->outputs || !n || !y) {
        graph_free(g);
        return NULL;
    }
    g->opsets[0] = (Opset){"", 13};
    g->n_opsets = 1;
    n->def = op_lookup(domain, op);
    for (int i = 0; i < 2; i++) {
        Value *v = graph_add_value(g, i ? "b" : "a");
        if (!v) {
            graph_free(g);
            return NULL;
        }
        v->kind = VAL_INPUT;
        v->dtype = v->file_dtype = DT_FLOAT;
        v->rank = i ? brank : arank;
        for (int j = 0; j < v->rank; j++) v->dims[j] = dim_const(i ? bdims[j] : adims[j]);
        g->inputs[g->n_inputs++] = v;
        n->in[i] = v;
    }
    y->producer = n;
    y->is_output = true;
    n->out[0] = y;
    g->outputs[g->n_outputs++] = y;
    return g;
}

static Graph *op_graph(const char *op, int arank, const int64_t *adims, int brank, const int64_t *bdims) {
    return op_graph_in("", op, arank, adims, brank, bdims);
}

/* Seconds per call of op over two inputs of the same shape. */
static bool time_op(const char *op, int rank, const int64_t *dims, double min_s, int reps, double *s, Diag *d) {
    KernelRun k;
    bool ok = kernel_run_build(op_graph(op, rank, dims, rank, dims), &k, d);
    if (ok) *s = kernel_run_time(&k, min_s, reps);
    kernel_run_free(&k);
    return ok;
}

/* Seconds per call of the three kernels of a 3x3 convolution of x [n, c,
 * h, h] with c to c channels (no padding) in training: the forward Conv,
 * ConvGradInput (dY, W -> dX) and ConvGradWeight (dY, X -> dW); and the
 * FLOPs of the three as the cost model counts them. */
static bool time_conv(int64_t n, int64_t c, int64_t h, double min_s, int reps, double *s, double *flops, Diag *d) {
    int64_t x[4] = {n, c, h, h}, w[4] = {c, c, 3, 3}, dy[4] = {n, c, h - 2, h - 2}, ks[2] = {3, 3}, sp[2] = {h, h};
    Graph *g[3] = {op_graph("Conv", 4, x, 4, w), op_graph_in("cleave", "ConvGradInput", 4, dy, 4, w),
                   op_graph_in("cleave", "ConvGradWeight", 4, dy, 4, x)};
    for (int i = 1; i < 3; i++) {
        Node *node = g[i] && g[i]->n_nodes ? g[i]->nodes[0] : NULL;
        set_ints(g[i], node, "kernel_shape", ks, 2);
        if (i == 1) set_ints(g[i], node, "spatial", sp, 2);
    }
    *s = *flops = 0;
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        KernelRun k;
        if (!ok) {
            graph_free(g[i]);
            continue;
        }
        ok = kernel_run_build(g[i], &k, d);
        if (ok) {
            GRAPH_FOR_NODES(k.g, node) *flops += cost_node_flops(node);
            *s += kernel_run_time(&k, min_s, reps);
        }
        kernel_run_free(&k);
    }
    return ok;
}

static bool measure_compute(Cluster *c, bool quick, Diag *d) {
    static const int64_t full[] = {16, 32, 64, 128, 256, 512}, short_[] = {16, 64, 256};
    const int64_t *sizes = quick ? short_ : full;
    int n_sizes = quick ? 3 : 6, reps = quick ? 3 : 7;
    double min_s = quick ? 0.01 : 0.05;
    c->n_gemm = 0;
    for (int i = 0; i < n_sizes; i++) {
        int64_t n = sizes[i], dims[2] = {n, n};
        double s;
        if (!time_op("MatMul", 2, dims, min_s, reps, &s, d)) return false;
        double flops = 2.0 * (double)n * (double)n * (double)n;
        c->gemm_flops[c->n_gemm] = flops;
        c->gemm_gflops[c->n_gemm++] = flops / s / 1e9;
        fprintf(stderr, "cleave: calibrate: MatMul %lldx%lld: %.3g s per call, %.2f GFLOP/s\n", (long long)n,
                (long long)n, s, flops / s / 1e9);
        /* a larger size would spend far more time than it teaches */
        if (s > 0.5) break;
    }
    /* Convolutions run their own kernels: a curve of their own, over
     * channel counts of small CNNs up to wide layers.  Each point times
     * the forward kernel and both gradient kernels together, the mix a
     * training step runs, so the rate is their FLOPs over their time. */
    static const int64_t chans[] = {4, 16, 64};
    c->n_conv = 0;
    for (int i = 0; i < 3; i++) {
        double s, flops;
        if (!time_conv(8, chans[i], 16, min_s, reps, &s, &flops, d)) return false;
        c->conv_flops[c->n_conv] = flops;
        c->conv_gflops[c->n_conv++] = flops / s / 1e9;
        fprintf(stderr, "cleave: calibrate: Conv 3x3 %lld->%lld channels, 8x16x16, forward and both gradients: %.3g s, "
                "%.2f GFLOP/s\n",
                (long long)chans[i], (long long)chans[i], s, flops / s / 1e9);
    }
    /* Vectors well past the last-level cache: the rate from memory. */
    int64_t len = quick ? (int64_t)1 << 22 : (int64_t)1 << 23, one = 1;
    double s;
    if (!time_op("Add", 1, &len, min_s, reps, &s, d)) return false;
    c->elementwise_gbps = 3.0 * 4.0 * (double)len / s / 1e9;
    if (!time_op("Add", 1, &one, min_s, reps, &s, d)) return false;
    c->kernel_overhead_s = s;
    return true;
}

/* ---- communication: a generated program under mpirun --------------------- */

/* One probe run over `ranks` ranks (with a hostfile, one per host): true
 * with the parsed --calibrate-comm file in *res (json_decref it), or false
 * with why in note. */
static bool probe_comm(const char *prog, const char *dir, const char *hostfile, int ranks, json_t **res, char *note,
                       size_t note_size) {
    char out[4200], log[4200], np[16];
    snprintf(out, sizeof out, "%s/comm%s.json", dir, hostfile ? "-inter" : "");
    snprintf(log, sizeof log, "%s/mpirun%s.log", dir, hostfile ? "-inter" : "");
    snprintf(np, sizeof np, "%d", ranks);
    char *argv[16];
    int n = 0;
    argv[n++] = "mpirun";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = np;
    if (hostfile) {
        /* one rank per host: rank i on the hostfile's i-th host */
        argv[n++] = "--hostfile";
        argv[n++] = (char *)hostfile;
        argv[n++] = "--map-by";
        argv[n++] = "node";
    }
    argv[n++] = (char *)prog;
    argv[n++] = "--calibrate-comm";
    argv[n++] = out;
    argv[n] = NULL;
    /* the probe sizes itself by each link (a few seconds a pair); room
     * for slow links and for mpirun's start */
    int pairs = ranks * (ranks - 1) / 2;
    int status = calibrate_run(argv, log, 60.0 + 20.0 * pairs);
    if (status != 0) {
        char why[400];
        calibrate_last_line(log, why, sizeof why);
        snprintf(note, note_size, "mpirun %s (%s)", status < 0 ? "did not finish" : "failed", why);
        return false;
    }
    json_error_t err;
    *res = json_load_file(out, 0, &err);
    json_t *pl = json_object_get(*res, "pairs");
    if (!json_is_array(pl) || json_array_size(pl) != (size_t)pairs) {
        snprintf(note, note_size, "the probe wrote no usable %.400s", out);
        json_decref(*res);
        *res = NULL;
        return false;
    }
    return true;
}

/* Pair i of a probe's result: its ranks, link and whether its two ranks
 * shared a host; false when malformed. */
static bool probe_pair(json_t *res, size_t i, int *a, int *b, ClusterLink *link, bool *same_node) {
    json_t *p = json_array_get(json_object_get(res, "pairs"), i);
    json_t *r = json_object_get(p, "ranks"), *lat = json_object_get(p, "latency_s");
    json_t *bw = json_object_get(p, "bandwidth_gbps"), *same = json_object_get(p, "same_node");
    if (!json_is_array(r) || json_array_size(r) != 2 || !json_is_number(lat) || !json_is_number(bw) ||
        !json_is_boolean(same) || json_number_value(lat) < 0 || !(json_number_value(bw) > 0))
        return false;
    *a = (int)json_integer_value(json_array_get(r, 0));
    *b = (int)json_integer_value(json_array_get(r, 1));
    link->latency_s = json_number_value(lat);
    link->bandwidth_gbps = json_number_value(bw);
    /* a probe of this cleave always times the pair's allreduce */
    json_t *ar = json_object_get(p, "allreduce_gbps");
    if (!json_is_number(ar) || !(json_number_value(ar) > 0)) return false;
    link->allreduce_gbps = json_number_value(ar);
    /* ... and the sender's time in the send call (send_gbps 0: no cost per
     * byte could be told) */
    json_t *so = json_object_get(p, "send_overhead_s"), *sg = json_object_get(p, "send_gbps");
    if (!json_is_number(so) || !(json_number_value(so) >= 0) || !json_is_number(sg) || !(json_number_value(sg) >= 0))
        return false;
    link->send_overhead_s = json_number_value(so);
    link->send_gbps = json_number_value(sg);
    *same_node = json_is_true(same);
    return true;
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The links between every pair of the hostfile's hosts into c (links, and
 * their median latency and bandwidth as inter_node); false with why in
 * note. */
static bool inter_links(Cluster *c, json_t *res, int hosts, const char *hostfile, char *note, size_t note_size) {
    size_t n = (size_t)hosts * (size_t)(hosts - 1) / 2;
    c->links = calloc(n, sizeof *c->links);
    double *lat = malloc(n * sizeof *lat), *bw = malloc(n * sizeof *bw), *ar = malloc(n * sizeof *ar);
    double *so = malloc(n * sizeof *so), *sg = malloc(n * sizeof *sg);
    bool ok = c->links && lat && bw && ar && so && sg;
    if (!ok) snprintf(note, note_size, "out of memory");
    for (size_t i = 0; ok && i < n; i++) {
        int a, b;
        bool same;
        ClusterLink l;
        if (!probe_pair(res, i, &a, &b, &l, &same) || a < 0 || b <= a || b >= hosts) {
            snprintf(note, note_size, "the probe's pair %zu is malformed", i);
            ok = false;
        } else if (same) {
            snprintf(note, note_size, "ranks %d and %d of %s ran on one host: each host of the file must be a "
                     "node of its own (with a host name of its own)", a, b, hostfile);
            ok = false;
        } else {
            c->links[i] = (ClusterPairLink){a, b, l};
            lat[i] = l.latency_s;
            bw[i] = l.bandwidth_gbps;
            ar[i] = l.allreduce_gbps;
            so[i] = l.send_overhead_s;
            sg[i] = l.send_gbps;
        }
    }
    if (ok) {
        c->n_links = (int)n;
        qsort(lat, n, sizeof *lat, by_value);
        qsort(bw, n, sizeof *bw, by_value);
        qsort(ar, n, sizeof *ar, by_value);
        qsort(so, n, sizeof *so, by_value);
        qsort(sg, n, sizeof *sg, by_value);
        c->inter_node = (ClusterLink){lat[n / 2], bw[n / 2], ar[n / 2], so[n / 2], sg[n / 2]};
    } else {
        free(c->links);
        c->links = NULL;
    }
    free(lat);
    free(bw);
    free(ar);
    free(so);
    free(sg);
    return ok;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* What the programs run under mpirun measured, and why not when not. */
typedef struct RunResult {
    bool intra, inter, step; /* measured */
    char intra_note[600], inter_note[600], step_note[600];
} RunResult;

static void measure_with_mpirun(Cluster *c, const Opts *o, RunResult *r) {
    snprintf(r->inter_note, sizeof r->inter_note, "no --hostfile");
    if (!calibrate_on_path("mpirun")) {
        snprintf(r->intra_note, sizeof r->intra_note, "mpirun not found on PATH");
        snprintf(r->step_note, sizeof r->step_note, "mpirun not found on PATH");
        return;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/cleave-calibrate-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(r->intra_note, sizeof r->intra_note, "cannot make a folder in %s: %s", tmp && *tmp ? tmp : "/tmp",
                 strerror(errno));
        return;
    }
    char model[4200], prog[4200];
    snprintf(model, sizeof model, "%s/probe.onnx", dir);
    snprintf(prog, sizeof prog, "%s/probe", dir);
    fprintf(stderr, "cleave: calibrate: compiling a probe program for mpirun\n");
    CompileOptions co = {.model = model, .output = prog, .emit = "exe", .strategy = STRATEGY_SINGLE, .batch = 1,
                         .ranks = 1, .train = {.loss = LOSS_MSE, .optimizer = OPT_SGD, .lr = 0.01f}};
    Diag d = {0};
    Layout single;
    if (!calibrate_write_probe(model, 1, 4, &d) || !compile_options_layout(&co, &single, &d) ||
        !driver_compile(&co, &single, NULL, &d)) {
        snprintf(r->intra_note, sizeof r->intra_note, "compiling the probe program failed: %.500s", d.msg);
        snprintf(r->step_note, sizeof r->step_note, "%s", r->intra_note);
    } else {
        json_t *res = NULL;
        int a, b;
        bool same = true;
        r->intra = probe_comm(prog, dir, NULL, 2, &res, r->intra_note, sizeof r->intra_note);
        if (r->intra && !probe_pair(res, 0, &a, &b, &c->intra_node, &same)) {
            snprintf(r->intra_note, sizeof r->intra_note, "the probe's result is malformed");
            r->intra = false;
        }
        /* a node's ranks sum over shared memory at its bandwidth: the
         * allreduce rate is for links between nodes (cluster.h) */
        c->intra_node.allreduce_gbps = 0;
        /* and a send within a node is a copy the link's bandwidth prices */
        c->intra_node.send_overhead_s = c->intra_node.send_gbps = 0;
        json_decref(res);
        res = NULL;
        if (o->hostfile) {
            fprintf(stderr, "cleave: calibrate: timing the links between the %d hosts of %s\n", o->hosts, o->hostfile);
            r->inter = probe_comm(prog, dir, o->hostfile, o->hosts, &res, r->inter_note, sizeof r->inter_note) &&
                       inter_links(c, res, o->hosts, o->hostfile, r->inter_note, sizeof r->inter_note);
            json_decref(res);
        }
        r->step = calibrate_step_overheads(c, dir, r->step_note, sizeof r->step_note);
    }
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- the command ---------------------------------------------------------- */

/* The distinct hosts of an mpirun host file (a host per line, the first
 * word; '#' starts a comment), in o->hosts. */
static bool count_hosts(Opts *o, Diag *d) {
    FILE *f = fopen(o->hostfile, "r");
    if (!f) return diag_error(d, DIAG_IO, "--hostfile %s: %s", o->hostfile, strerror(errno));
    enum { MAX_HOSTS = 256 };
    static char seen[MAX_HOSTS][256];
    char line[1024];
    int n = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'), host[256];
        if (hash) *hash = 0;
        if (sscanf(line, "%255s", host) != 1) continue;
        bool known = false;
        for (int i = 0; i < n && !known; i++) known = strcmp(seen[i], host) == 0;
        if (known) continue;
        if (n == MAX_HOSTS) ok = diag_error(d, DIAG_LIMIT, "--hostfile %s: more than %d hosts", o->hostfile, MAX_HOSTS);
        else snprintf(seen[n++], sizeof seen[0], "%s", host);
    }
    fclose(f);
    if (ok && n < 2)
        ok = diag_error(d, DIAG_USAGE, "--hostfile %s: names %d host%s; measuring the links between nodes needs 2 or "
                        "more", o->hostfile, n, n == 1 ? "" : "s");
    if (ok && o->nodes_given && o->nodes != n)
        ok = diag_error(d, DIAG_USAGE, "--nodes %lld: --hostfile %s names %d hosts, one node each", (long long)o->nodes,
                        o->hostfile, n);
    o->hosts = n;
    if (ok) o->nodes = n;
    return ok;
}

/* Fails now, before a minute of measuring, when -o could not be written. */
/* A FIFO -o writes to, held open for writing from the check until the
 * file is written: a reader attached now sees no end of file in between,
 * and one that is missing is found before the measurements, not after. */
static int g_fifo = -1;

static bool check_writable(const char *path, Diag *d) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return diag_error(d, DIAG_IO, "%s: is a folder", path);
    if (stat(path, &st) == 0 && S_ISFIFO(st.st_mode)) {
        g_fifo = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (g_fifo < 0)
            return diag_error(d, DIAG_IO, "-o %s: %s", path,
                              errno == ENXIO ? "a FIFO with no reader: start its reader first" : strerror(errno));
        return true;
    }
    if (stat(path, &st) == 0)
        return access(path, W_OK) == 0 || diag_error(d, DIAG_IO, "%s: not writable: %s", path, strerror(errno));
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == path ? 1 : (int)(slash - path)) : 1, slash ? path : ".");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return diag_error(d, DIAG_IO, "%s: folder %s does not exist", path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return diag_error(d, DIAG_IO, "%s: cannot create files in %s: %s", path, dir, strerror(errno));
    return true;
}

static int parse_opts(int argc, char **argv, Opts *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(calibrate_help, stdout);
            return 0;
        }
        if (strcmp(a, "--quick") == 0) {
            o->quick = true;
            continue;
        }
        if (strcmp(a, "--cache") == 0) {
            o->cache = true;
            continue;
        }
        bool known = strcmp(a, "-o") == 0 || strcmp(a, "--ranks-per-node") == 0 || strcmp(a, "--nodes") == 0 ||
                     strcmp(a, "--memory-per-rank") == 0 || strcmp(a, "--hostfile") == 0;
        if (!known) return cli_usage("calibrate", "unknown option '%s'", a);
        if (i + 1 >= argc) return cli_usage("calibrate", "%s needs a value", a);
        const char *v = argv[++i];
        if (strcmp(a, "-o") == 0) o->out = v;
        else if (strcmp(a, "--hostfile") == 0) o->hostfile = v;
        else if (strcmp(a, "--nodes") == 0 && !(o->nodes_given = cli_parse_i64(v, 1, CLUSTER_MAX_RANKS, &o->nodes)))
            return cli_usage("calibrate", "--nodes needs an integer from 1 to %d, got '%s'", CLUSTER_MAX_RANKS, v);
        else if (strcmp(a, "--ranks-per-node") == 0 && !cli_parse_i64(v, 1, CLUSTER_MAX_RANKS, &o->ranks_per_node))
            return cli_usage("calibrate", "--ranks-per-node needs an integer from 1 to %d, got '%s'",
                             CLUSTER_MAX_RANKS, v);
        else if (strcmp(a, "--memory-per-rank") == 0 && !cli_parse_i64(v, 1, INT64_MAX, &o->memory))
            return cli_usage("calibrate", "--memory-per-rank needs a positive number of bytes, got '%s'", v);
    }
    if (o->cache && o->out) return cli_usage("calibrate", "give -o FILE or --cache, not both");
    if (o->cache) {
        if (!cluster_cache_path(o->cache_path, sizeof o->cache_path))
            return cli_usage("calibrate", "--cache: set HOME or CLEAVE_CLUSTER_CACHE to say where the cache goes");
        o->out = o->cache_path;
    }
    if (!o->out || !*o->out) return cli_usage("calibrate", "no output file: give -o CLUSTER.json or --cache");
    if (o->nodes * o->ranks_per_node > CLUSTER_MAX_RANKS)
        return cli_usage("calibrate", "--nodes x --ranks-per-node is more than %d ranks", CLUSTER_MAX_RANKS);
    return -1;
}

int cmd_calibrate(int argc, char **argv) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    Opts o = {.nodes = 1, .ranks_per_node = cpus > 0 ? cpus : 1};
    int status = parse_opts(argc, argv, &o);
    if (status >= 0) return status;
    const char *memory_from = "--memory-per-rank";
    if (!o.memory) {
        /* the machine's memory shared by its ranks */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        o.memory = pages > 0 && page > 0 ? (int64_t)pages * page / o.ranks_per_node : 0;
        memory_from = o.memory > 0 ? "physical memory / ranks per node" : "default";
    }
    Diag d = {0};
    if (o.hostfile && !count_hosts(&o, &d)) return cli_fail(&d);
    if (o.nodes * o.ranks_per_node > CLUSTER_MAX_RANKS)
        return cli_usage("calibrate", "%lld nodes x --ranks-per-node is more than %d ranks", (long long)o.nodes,
                         CLUSTER_MAX_RANKS);
    if (o.cache && !cluster_cache_dir(o.out, &d)) return cli_fail(&d);
    if (!check_writable(o.out, &d)) return cli_fail(&d);

    Cluster c;
    cluster_defaults(&c, (int)o.ranks_per_node);
    c.nodes = (int)o.nodes;
    c.ranks_per_node = (int)o.ranks_per_node;
    c.cores_per_node = cpus > 0 && cpus <= CLUSTER_MAX_RANKS ? (int)cpus : 0; /* this node's, taken for every node */
    if (o.memory > 0) c.memory_per_rank_bytes = o.memory;
    snprintf(c.source, sizeof c.source, "calibrated");
    if (!measure_compute(&c, o.quick, &d)) return cli_fail(&d);
    RunResult comm = {0};
    measure_with_mpirun(&c, &o, &comm);
    if (o.hostfile && !comm.inter) {
        cluster_free(&c);
        if (g_fifo >= 0) close(g_fifo);
        diag_error(&d, DIAG_IO, "--hostfile %s: the links between its hosts could not be measured: %s", o.hostfile,
                   comm.inter_note);
        return cli_fail(&d);
    }

    char host[256] = "this machine";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    char name[640];
    /* what was not measured is said in the file too, not only on stderr */
    snprintf(name, sizeof name, "calibrated on %s%s%s%s%s", host, o.quick ? " (--quick)" : "",
             comm.intra ? "" : "; intra_node: stated default, not measured",
             comm.inter ? "" : "; inter_node: stated default, not measured",
             comm.step ? "" : "; step_overhead_s: stated default, not measured");
    c.name = strdup(name);
    char *text = cluster_to_json(&c);
    if (!c.name || !text) {
        free(text);
        cluster_free(&c);
        diag_error(&d, DIAG_NOMEM, "out of memory");
        return cli_fail(&d);
    }
    OutFile out;
    int err = out_file_open(&out, o.out);
    if (!err) {
        out_file_write(&out, text, strlen(text));
        err = out_file_finish(&out);
    }
    free(text);
    if (g_fifo >= 0) close(g_fifo);
    if (err) {
        cluster_free(&c);
        diag_error(&d, DIAG_IO, "-o %s: cannot write: %s", o.out, out_file_why(err));
        return cli_fail(&d);
    }

    fprintf(stderr, "cleave: calibrate: wrote %s (%d node%s x %d ranks, %lld bytes per rank: %s)\n", o.out,
            c.nodes, c.nodes > 1 ? "s" : "", c.ranks_per_node, (long long)c.memory_per_rank_bytes, memory_from);
    fprintf(stderr, "  gemm_gflops       measured:");
    for (int i = 0; i < c.n_gemm; i++) fprintf(stderr, " %.3g FLOPs %.2f;", c.gemm_flops[i], c.gemm_gflops[i]);
    fprintf(stderr, "\n  conv_gflops       measured:");
    for (int i = 0; i < c.n_conv; i++) fprintf(stderr, " %.3g FLOPs %.2f;", c.conv_flops[i], c.conv_gflops[i]);
    fprintf(stderr, "\n  elementwise_gbps  measured: %.2f GB/s\n", c.elementwise_gbps);
    fprintf(stderr, "  kernel_overhead_s measured %s: %.3g s\n", comm.step ? "in a training step" : "alone",
            c.kernel_overhead_s);
    fprintf(stderr, "  step_overhead_s   %s: %.3g s (%s)\n", comm.step ? "measured" : "default", c.step_overhead_s,
            comm.step_note);
    fprintf(stderr, "  intra_node        %s: %.3g s + %.3g GB/s%s%s%s\n", comm.intra ? "measured" : "default",
            c.intra_node.latency_s, c.intra_node.bandwidth_gbps, comm.intra ? "" : " (", comm.intra ? "" : comm.intra_note,
            comm.intra ? "" : ")");
    fprintf(stderr, "  inter_node        %s: %.3g s + %.3g GB/s", comm.inter ? "measured, the median of the links" : "default",
            c.inter_node.latency_s, c.inter_node.bandwidth_gbps);
    if (comm.inter)
        fprintf(stderr, ", allreduce %.3g GB/s, sender's CPU %.3g s + %.3g GB/s\n", c.inter_node.allreduce_gbps,
                c.inter_node.send_overhead_s, c.inter_node.send_gbps);
    else fprintf(stderr, " (%s)\n", comm.inter_note);
    for (int i = 0; i < c.n_links; i++) {
        const ClusterLink *l = &c.links[i].link;
        fprintf(stderr, "  link %d - %d        measured: %.3g s + %.3g GB/s, allreduce %.3g GB/s, sender's CPU %.3g s + "
                "%.3g GB/s\n", c.links[i].a, c.links[i].b, l->latency_s, l->bandwidth_gbps, l->allreduce_gbps,
                l->send_overhead_s, l->send_gbps);
    }
    cluster_free(&c);
    return 0;
}
