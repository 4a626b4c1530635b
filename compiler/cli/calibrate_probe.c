/* calibrate_probe.c - the programs `cleave calibrate` runs as separate
 * processes (calibrate.h): a tiny model written as ONNX, compiled like
 * any other, and run under mpirun with a time limit. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "calibrate.h"
#include "onnx.pb-c.h"

static Onnx__TensorShapeProto__Dimension *dim(Onnx__TensorShapeProto__Dimension *d, int64_t n) {
    onnx__tensor_shape_proto__dimension__init(d);
    d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    d->dim_value = n;
    return d;
}

/* A float32 [1, width] graph input or output named `name`; the parts live
 * in *slots, which must outlive the value info. */
typedef struct Io {
    Onnx__TensorShapeProto__Dimension d[2];
    Onnx__TensorShapeProto__Dimension *pd[2];
    Onnx__TensorShapeProto shape;
    Onnx__TypeProto__Tensor tensor;
    Onnx__TypeProto type;
    Onnx__ValueInfoProto info;
} Io;

static Onnx__ValueInfoProto *io(Io *s, const char *name, int64_t width) {
    s->pd[0] = dim(&s->d[0], 1);
    s->pd[1] = dim(&s->d[1], width);
    onnx__tensor_shape_proto__init(&s->shape);
    s->shape.n_dim = 2;
    s->shape.dim = s->pd;
    onnx__type_proto__tensor__init(&s->tensor);
    s->tensor.has_elem_type = 1;
    s->tensor.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    s->tensor.shape = &s->shape;
    onnx__type_proto__init(&s->type);
    s->type.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    s->type.tensor_type = &s->tensor;
    onnx__value_info_proto__init(&s->info);
    s->info.name = (char *)name;
    s->info.type = &s->type;
    return &s->info;
}

bool calibrate_write_probe(const char *path, int layers, int width, Diag *d) {
    if (layers < 1 || layers > 64 || width < 1 || width > 64)
        return diag_error(d, DIAG_INTERNAL, "probe of %d layers of %d", layers, width);
    enum { MAXL = 64 };
    /* layer k: h_{k+1} = Relu(h_k W_k), h_0 = x, the last one named y */
    static char names[2 * MAXL + 1][16], wnames[MAXL][16];
    Onnx__TensorProto w[MAXL], *inits[MAXL];
    Onnx__NodeProto nodes[2 * MAXL], *pnodes[2 * MAXL];
    char *ins[2 * MAXL][2], *outs[2 * MAXL][1];
    float *data = malloc(sizeof *data * (size_t)width * (size_t)width);
    if (!data) return diag_error(d, DIAG_NOMEM, "out of memory");
    /* small weights so that the values stay finite over many steps */
    for (int i = 0; i < width * width; i++) data[i] = 0.01f * (float)(1 + i % 7);
    int64_t wdims[2] = {width, width};
    snprintf(names[0], sizeof names[0], "x");
    for (int k = 0; k < layers; k++) {
        snprintf(wnames[k], sizeof wnames[k], "w%d", k);
        snprintf(names[2 * k + 1], sizeof names[0], "m%d", k);
        if (k + 1 == layers) snprintf(names[2 * k + 2], sizeof names[0], "y");
        else snprintf(names[2 * k + 2], sizeof names[0], "h%d", k + 1);
        onnx__tensor_proto__init(&w[k]);
        w[k].name = wnames[k];
        w[k].has_data_type = 1;
        w[k].data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        w[k].n_dims = 2;
        w[k].dims = wdims;
        w[k].n_float_data = (size_t)width * (size_t)width;
        w[k].float_data = data;
        inits[k] = &w[k];
        for (int j = 0; j < 2; j++) {
            Onnx__NodeProto *n = &nodes[2 * k + j];
            onnx__node_proto__init(n);
            n->op_type = j ? "Relu" : "MatMul";
            ins[2 * k + j][0] = names[2 * k + j];
            ins[2 * k + j][1] = wnames[k];
            outs[2 * k + j][0] = names[2 * k + j + 1];
            n->n_input = j ? 1 : 2;
            n->input = ins[2 * k + j];
            n->n_output = 1;
            n->output = outs[2 * k + j];
            pnodes[2 * k + j] = n;
        }
    }
    Io xi, yo;
    Onnx__ValueInfoProto *in[1] = {io(&xi, "x", width)}, *out[1] = {io(&yo, "y", width)};
    Onnx__GraphProto gr = ONNX__GRAPH_PROTO__INIT;
    gr.name = "probe";
    gr.n_node = (size_t)(2 * layers);
    gr.node = pnodes;
    gr.n_initializer = (size_t)layers;
    gr.initializer = inits;
    gr.n_input = 1;
    gr.input = in;
    gr.n_output = 1;
    gr.output = out;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    opset.domain = "";
    opset.has_version = 1;
    opset.version = 13;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};
    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    model.has_ir_version = 1;
    model.ir_version = 8;
    model.n_opset_import = 1;
    model.opset_import = opsets;
    model.graph = &gr;

    size_t len = onnx__model_proto__get_packed_size(&model);
    uint8_t *buf = malloc(len);
    bool ok = buf != NULL;
    if (ok) {
        onnx__model_proto__pack(&model, buf);
        FILE *f = fopen(path, "wb");
        ok = f && fwrite(buf, 1, len, f) == len;
        if (f && fclose(f) != 0) ok = false;
    }
    free(buf);
    free(data);
    return ok || diag_error(d, DIAG_IO, "%s: cannot write: %s", path, strerror(errno));
}

bool calibrate_on_path(const char *prog) {
    const char *path = getenv("PATH");
    if (!path) return false;
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        char full[4096];
        snprintf(full, sizeof full, "%.*s/%s", (int)len, p, prog);
        if (len && access(full, X_OK) == 0) return true;
        p += len + (colon != NULL);
    }
    return false;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int calibrate_run(char *const argv[], const char *log, double timeout_s) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);
        FILE *f = freopen(log, "w", stdout);
        if (f) dup2(fileno(stdout), STDERR_FILENO);
        /* mpirun refuses root unless told; containers and CI often are */
        if (geteuid() == 0) {
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    double end = seconds_now() + timeout_s;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (r < 0) return -1;
        if (seconds_now() > end) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        nanosleep(&(struct timespec){0, 20000000L}, NULL);
    }
}

void calibrate_last_line(const char *log, char *out, size_t size) {
    snprintf(out, size, "no output");
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0]) snprintf(out, size, "%.380s", line);
    }
    fclose(f);
}
