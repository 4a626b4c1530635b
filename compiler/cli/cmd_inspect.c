/* cmd_inspect.c - `cleave inspect`: what a model holds and costs, before any
 * cluster time is spent on it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../cost/node_cost.h"
#include "../driver.h"
#include "../ops/ops.h"

static const char inspect_help[] =
    "usage: cleave inspect MODEL.onnx [--batch B] [--loss ce|mse|model] [--format text|json] [--strict]\n"
    "\n"
    "Reads an ONNX model, infers every shape (binding dimension 0 of each input\n"
    "to B when --batch is given), folds constant subgraphs, and prints the model's\n"
    "metadata, inputs and outputs, one row per node (output shapes, parameters,\n"
    "forward FLOPs), totals, and the ops cleave does not support.  It then builds\n"
    "the training graph as compile does (training forms, the loss, a gradient for\n"
    "every op between a parameter and the loss) and says whether compile would\n"
    "accept the model, and warns when the model looks exported in eval mode.\n"
    "\n"
    "  --batch B        bind the batch dimension (default: keep it symbolic;\n"
    "                   FLOPs are then counted at batch 1, training at batch 2)\n"
    "  --loss L         the loss the training check builds (default ce, as compile)\n"
    "  --format F       text (default) or json\n"
    "  --strict         exit 1 when the model uses an unsupported op or would not\n"
    "                   train\n";

typedef struct NodeRow {
    const Node *n;
    int64_t params;
    double flops;
} NodeRow;

typedef struct Report {
    Graph *g;
    int64_t batch;   /* 0: symbolic */
    int n_rows;
    NodeRow *rows;
    int64_t params, param_bytes;
    double flops, flops_per_sample;
    const char *loss;     /* the training check's loss */
    Diag training;        /* its first error; code 0: compile would accept the model */
    json_t *warnings;     /* signs of an eval-mode export, one string each */
} Report;

static json_t *shape_json(const Graph *g, const Value *v) {
    if (v->rank < 0) return json_null();
    json_t *a = json_array();
    for (int j = 0; j < v->rank; j++) {
        Dim d = v->dims[j];
        char buf[64];
        json_array_append_new(a, dim_is_const(d) ? json_integer(d.k) : json_string(dim_str(g, d, buf, sizeof buf)));
    }
    return a;
}

static json_t *value_json(const Graph *g, const Value *v) {
    return json_pack("{s:s, s:s, s:o}", "name", v->name, "dtype", dtype_name(v->dtype), "shape", shape_json(g, v));
}

/* Unsupported ops, grouped: op -> node names, in first-seen order. */
static json_t *unsupported_json(const Graph *g) {
    json_t *list = json_array();
    GRAPH_FOR_NODES(g, n) {
        if (n->def) continue;
        json_t *entry = NULL;
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            if (strcmp(json_string_value(json_object_get(e, "op")), n->op_type) == 0) entry = e;
        }
        if (!entry) {
            entry = json_pack("{s:s, s:s, s:[]}", "op", n->op_type, "domain", n->domain, "nodes");
            json_array_append_new(list, entry);
        }
        json_array_append_new(json_object_get(entry, "nodes"), json_string(n->name));
    }
    return list;
}

/* Supported ops without a gradient rule: training fails on them if they
 * lie between a parameter and the loss, so this is the pre-flight check. */
static json_t *no_gradient_json(const Graph *g) {
    json_t *list = json_array();
    GRAPH_FOR_NODES(g, n) {
        if (!n->def || n->def->grad) continue;
        size_t i;
        json_t *e;
        bool seen = false;
        json_array_foreach(list, i, e) seen |= strcmp(json_string_value(e), n->op_type) == 0;
        if (!seen) json_array_append_new(list, json_string(n->op_type));
    }
    return list;
}

static json_t *report_json(const Report *r) {
    const Graph *g = r->g;
    json_t *opsets = json_array();
    for (int i = 0; i < g->n_opsets; i++)
        json_array_append_new(opsets, json_pack("{s:s, s:I}", "domain", g->opsets[i].domain, "version",
                                                (json_int_t)g->opsets[i].version));
    json_t *ins = json_array(), *outs = json_array(), *nodes = json_array();
    for (int i = 0; i < g->n_inputs; i++) json_array_append_new(ins, value_json(g, g->inputs[i]));
    for (int i = 0; i < g->n_outputs; i++) json_array_append_new(outs, value_json(g, g->outputs[i]));
    for (int i = 0; i < r->n_rows; i++) {
        const Node *n = r->rows[i].n;
        json_t *o = json_array();
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k]) json_array_append_new(o, value_json(g, n->out[k]));
        json_array_append_new(nodes, json_pack("{s:s, s:s, s:s, s:o, s:I, s:I, s:b}", "name", n->name, "op",
                                               n->op_type, "domain", n->domain, "outputs", o, "params",
                                               (json_int_t)r->rows[i].params, "flops", (json_int_t)r->rows[i].flops,
                                               "supported", n->def != NULL));
    }
    json_t *model = json_pack("{s:s, s:s, s:s, s:I, s:I, s:o}", "path", g->path, "producer", g->producer_name,
                              "producer_version", g->producer_version, "ir_version", (json_int_t)g->ir_version,
                              "model_version", (json_int_t)g->model_version, "opsets", opsets);
    json_t *totals = json_pack("{s:I, s:I, s:I, s:I}", "params", (json_int_t)r->params, "param_bytes",
                               (json_int_t)r->param_bytes, "flops", (json_int_t)r->flops, "flops_per_sample",
                               (json_int_t)r->flops_per_sample);
    json_t *root = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "model", model, "batch",
                     r->batch ? json_integer(r->batch) : json_null(), "inputs", ins, "outputs", outs, "nodes", nodes,
                     "totals", totals, "unsupported", unsupported_json(g));
    json_object_set_new(root, "no_gradient", no_gradient_json(g));
    json_object_set_new(root, "training", json_pack("{s:s, s:b, s:s?}", "loss", r->loss, "ok", !r->training.code,
                                                    "error", r->training.code ? r->training.msg : NULL));
    json_object_set_new(root, "warnings", json_incref(r->warnings));
    return root;
}

/* 1234567 -> "1,234,567" */
static const char *thousands(double x, char *buf, size_t len) {
    char raw[32];
    snprintf(raw, sizeof raw, "%.0f", x);
    size_t n = strlen(raw), o = 0;
    for (size_t i = 0; i < n && o + 2 < len; i++) {
        buf[o++] = raw[i];
        size_t left = n - 1 - i;
        if (left && left % 3 == 0 && raw[i] != '-') buf[o++] = ',';
    }
    buf[o] = 0;
    return buf;
}

static void print_value_line(const Graph *g, const Value *v) {
    char s[256];
    printf("  %-24s %-8s %s\n", v->name, dtype_name(v->dtype), shape_str(g, v, s, sizeof s));
}

static void report_text(const Report *r) {
    const Graph *g = r->g;
    printf("model      %s\n", g->path);
    printf("producer   %s %s\n", *g->producer_name ? g->producer_name : "(none)", g->producer_version);
    printf("ir_version %lld\nopsets    ", (long long)g->ir_version);
    for (int i = 0; i < g->n_opsets; i++)
        printf(" %s %lld", *g->opsets[i].domain ? g->opsets[i].domain : "ai.onnx", (long long)g->opsets[i].version);
    if (r->batch) printf("\nbatch      %lld\n", (long long)r->batch);
    else printf("\nbatch      symbolic (FLOPs counted at batch 1; bind with --batch)\n");
    printf("\ninputs\n");
    for (int i = 0; i < g->n_inputs; i++) print_value_line(g, g->inputs[i]);
    printf("outputs\n");
    for (int i = 0; i < g->n_outputs; i++) print_value_line(g, g->outputs[i]);
    printf("\n%-4s %-32s %-20s %-24s %12s %14s\n", "#", "node", "op", "output shape", "params", "FLOPs");
    for (int i = 0; i < r->n_rows; i++) {
        const Node *n = r->rows[i].n;
        char s[256], p[32], f[32];
        shape_str(g, n->out[0] ? n->out[0] : n->in[0], s, sizeof s);
        printf("%-4d %-32.32s %-20.20s %-24s %12s %14s%s\n", i, n->name, n->op_type, s,
               thousands((double)r->rows[i].params, p, sizeof p), thousands(r->rows[i].flops, f, sizeof f),
               n->def ? "" : "  (unsupported)");
    }
    char a[32], b[32], c[32], e[32];
    printf("\ntotals     %s parameters (%s bytes), %s forward FLOPs, %s per sample\n",
           thousands((double)r->params, a, sizeof a), thousands((double)r->param_bytes, b, sizeof b),
           thousands(r->flops, c, sizeof c), thousands(r->flops_per_sample, e, sizeof e));
    json_t *un = unsupported_json(g);
    if (json_array_size(un) == 0) {
        printf("unsupported ops: none\n");
    } else {
        printf("unsupported ops:\n");
        size_t i;
        json_t *u;
        json_array_foreach(un, i, u) {
            printf("  %s:", json_string_value(json_object_get(u, "op")));
            size_t j;
            json_t *nm;
            json_array_foreach(json_object_get(u, "nodes"), j, nm) printf(" %s", json_string_value(nm));
            printf("\n");
        }
    }
    json_decref(un);
    json_t *ng = no_gradient_json(g);
    printf("ops without a gradient rule: ");
    if (json_array_size(ng) == 0) printf("none\n");
    else {
        size_t i;
        json_t *name;
        json_array_foreach(ng, i, name) printf("%s%s", i ? ", " : "", json_string_value(name));
        printf(" (training fails if they lie between a parameter and the loss)\n");
    }
    json_decref(ng);
    if (r->training.code) printf("training (--loss %s): compile would refuse it: %s\n", r->loss, r->training.msg);
    else printf("training (--loss %s): compile accepts it\n", r->loss);
    size_t i;
    json_t *w;
    json_array_foreach(r->warnings, i, w) printf("warning: %s\n", json_string_value(w));
}

/* The training graph compile would build, at one replica: its first error
 * in r->training. */
static void check_training(Report *r, const char *model, int64_t batch, LossKind loss) {
    DriverOptions opt = {.model = model, .batch = batch, .require_supported = true};
    Graph *g = driver_front_end(&opt, &r->training);
    if (!g) return;
    TrainOptions to = {.loss = loss, .optimizer = OPT_SGD, .lr = 0.01f, .replicas = 1, .ignore_index = -100};
    TrainGraph t;
    if (train_build(g, &to, &t, &r->training)) ir_verify(g, &r->training);
    graph_free(g);
}

/* Signs that the model was exported in eval mode: BatchNormalization in
 * its inference form (frozen statistics), and float initializers that
 * several nodes read as weights, which an export with constant folding
 * makes of parameters whose values happen to be equal (they then train as
 * one). */
static void eval_mode_warnings(Report *r) {
    const Graph *g = r->g;
    int inference_bn = 0;
    const Node *first_bn = NULL;
    GRAPH_FOR_NODES(g, n) {
        bool training = n->n_out > 1 || node_attr_i(n, "training_mode", 0) != 0;
        if (strcmp(n->op_type, "BatchNormalization") == 0 && !*n->domain && !training && inference_bn++ == 0)
            first_bn = n;
    }
    char buf[1024];
    if (inference_bn) {
        snprintf(buf, sizeof buf, "%d BatchNormalization node%s ('%s'%s) in inference form: the model looks exported "
                 "in eval mode, and would train with frozen statistics; export it with torch.onnx.export(model.train(), "
                 "..., training=torch.onnx.TrainingMode.TRAINING) (docs/export.md)", inference_bn,
                 inference_bn > 1 ? "s" : "", first_bn->name, inference_bn > 1 ? ", ..." : "");
        json_array_append_new(r->warnings, json_string(buf));
    }
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = g->values[i];
        if (v->kind != VAL_INITIALIZER || !dtype_is_float(v->dtype) || !value_is_trainable(g, v)) continue;
        int readers = 0;
        const Node *a = NULL, *b = NULL;
        GRAPH_FOR_NODES(g, n) {
            bool reads = false;
            for (int k = 0; k < n->n_in; k++) reads |= n->in[k] == v;
            if (!reads) continue;
            if (readers++ == 0) a = n;
            else if (!b) b = n;
        }
        if (readers < 2) continue;
        snprintf(buf, sizeof buf, "initializer '%s' is read by %d nodes ('%s', '%s'%s), which train it as one "
                 "parameter; an export with constant folding merges parameters whose values are equal: unless they "
                 "are meant to be tied, export with do_constant_folding=False (docs/export.md)", v->name, readers,
                 a->name, b->name, readers > 2 ? ", ..." : "");
        json_array_append_new(r->warnings, json_string(buf));
    }
}

/* Fills rows from g; FLOPs come from `fg` (the same model at a bound batch). */
static bool build_report(Report *r, Graph *g, Graph *fg, int64_t flop_batch) {
    r->g = g;
    r->rows = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *r->rows);
    bool *seen = calloc((size_t)(g->n_values ? g->n_values : 1), sizeof *seen);
    if (!r->rows || !seen) {
        free(seen);
        return false;
    }
    GRAPH_FOR_NODES(g, n) {
        NodeRow *row = &r->rows[r->n_rows++];
        row->n = n;
        row->params = cost_node_params(n, seen, &r->param_bytes);
        /* Folding is deterministic, so node ids match between g and fg. */
        row->flops = cost_node_flops(fg->nodes[n->id]);
        r->params += row->params;
        r->flops += row->flops;
    }
    r->flops_per_sample = r->flops / (double)flop_batch;
    free(seen);
    return true;
}

int cmd_inspect(int argc, char **argv) {
    const char *model = NULL, *format = "text", *loss = "ce";
    int64_t batch = 0;
    bool strict = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(inspect_help, stdout);
            return 0;
        } else if (strcmp(a, "--batch") == 0) {
            if (i + 1 >= argc || !cli_parse_i64(argv[++i], 1, (int64_t)1 << 31, &batch))
                return cli_usage("inspect", "--batch needs a positive integer");
        } else if (strcmp(a, "--format") == 0) {
            if (i + 1 >= argc) return cli_usage("inspect", "--format needs text or json");
            format = argv[++i];
            if (strcmp(format, "text") && strcmp(format, "json"))
                return cli_usage("inspect", "unknown format '%s' (text or json)", format);
        } else if (strcmp(a, "--loss") == 0) {
            if (i + 1 >= argc) return cli_usage("inspect", "--loss needs ce, mse or model");
            loss = argv[++i];
            if (strcmp(loss, "ce") && strcmp(loss, "mse") && strcmp(loss, "model"))
                return cli_usage("inspect", "--loss must be ce, mse or model, got '%s'", loss);
        } else if (strcmp(a, "--strict") == 0) {
            strict = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("inspect", "unknown flag '%s'", a);
        } else if (model) {
            return cli_usage("inspect", "one model at a time ('%s' and '%s')", model, a);
        } else {
            model = a;
        }
    }
    if (!model) return cli_usage("inspect", "no model given");
    Diag d = {0};
    DriverOptions opt = {.model = model, .batch = batch, .require_supported = strict};
    Graph *g = driver_front_end(&opt, &d);
    if (!g) return cli_fail(&d);
    Graph *fg = g;
    if (!batch) { /* FLOPs need concrete shapes: the same model at batch 1 */
        opt.batch = 1;
        fg = driver_front_end(&opt, &d);
        if (!fg) {
            graph_free(g);
            return cli_fail(&d);
        }
    }
    Report r = {.batch = batch, .loss = loss, .warnings = json_array()};
    check_training(&r, model, batch ? batch : 2,
                   strcmp(loss, "ce") == 0 ? LOSS_CE : strcmp(loss, "mse") == 0 ? LOSS_MSE : LOSS_MODEL);
    int status = 0;
    bool built = r.warnings && build_report(&r, g, fg, batch ? batch : 1);
    if (built) eval_mode_warnings(&r);
    if (!built) {
        diag_error(&d, DIAG_NOMEM, "%s: out of memory", model);
        status = cli_fail(&d);
    } else if (strcmp(format, "json") == 0) {
        json_t *j = report_json(&r);
        char *s = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
        if (s) puts(s);
        else status = 1;
        free(s);
        json_decref(j);
    } else {
        report_text(&r);
    }
    if (!status && strict && r.training.code) status = 1;
    free(r.rows);
    json_decref(r.warnings);
    if (fg != g) graph_free(fg);
    graph_free(g);
    return status;
}
