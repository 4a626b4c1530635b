/* make_fake_model.c - writes the C source that gives fake_program.c its
 * cleave_model (a real ONNX ModelProto) and cleave_init bytes.
 *
 *   make_fake_model VARIANT OUT.c
 *
 * The model computes logits = MatMul(input, W) + b for input [N, 4].  W is
 * the program's one parameter; b is an initializer the program does not
 * train, so --save must leave it exactly as it is.  The variant sets how W
 * is stored, to exercise each way --save must rewrite an initializer:
 *   f32  FLOAT in the typed float_data field
 *   f16  FLOAT16 in raw_data
 *   ext  DOUBLE kept in an external file (data_location EXTERNAL)
 *
 * W starts at W0[k] = ((k % 5) - 2) / 8 (k = row * 3 + column): exact in
 * every float format, and test_runtime.py computes the same values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"

enum { D = 4, C = 3 };

static float w0(int k) { return (float)((k % 5) - 2) / 8.0f; }

/* IEEE half of an exactly representable value (all W0 are). */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) == 0) return (uint16_t)(x >> 16);
    uint32_t sign = (x >> 16) & 0x8000, exp = ((x >> 23) & 0xff) - 127 + 15, man = (x & 0x7fffff) >> 13;
    return (uint16_t)(sign | exp << 10 | man);
}

typedef struct {
    Onnx__ValueInfoProto vi;
    Onnx__TypeProto type;
    Onnx__TypeProto__Tensor tensor;
    Onnx__TensorShapeProto shape;
    Onnx__TensorShapeProto__Dimension dims[2];
    Onnx__TensorShapeProto__Dimension *dim_ptrs[2];
} ValueInfo;

/* name: float [N, width] */
static void value_info(ValueInfo *v, char *name, int64_t width) {
    onnx__value_info_proto__init(&v->vi);
    onnx__type_proto__init(&v->type);
    onnx__type_proto__tensor__init(&v->tensor);
    onnx__tensor_shape_proto__init(&v->shape);
    for (int i = 0; i < 2; i++) {
        onnx__tensor_shape_proto__dimension__init(&v->dims[i]);
        v->dim_ptrs[i] = &v->dims[i];
    }
    v->dims[0].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
    v->dims[0].dim_param = "N";
    v->dims[1].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    v->dims[1].dim_value = width;
    v->shape.n_dim = 2;
    v->shape.dim = v->dim_ptrs;
    v->tensor.has_elem_type = 1;
    v->tensor.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    v->tensor.shape = &v->shape;
    v->type.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    v->type.tensor_type = &v->tensor;
    v->vi.name = name;
    v->vi.type = &v->type;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "f32") && strcmp(argv[1], "f16") && strcmp(argv[1], "ext"))) {
        fprintf(stderr, "usage: make_fake_model f32|f16|ext OUT.c\n");
        return 2;
    }
    const char *variant = argv[1];
    float w[D * C];
    uint16_t w_half[D * C];
    float b_values[C] = {0, 0, 0};
    for (int k = 0; k < D * C; k++) w[k] = w0(k), w_half[k] = to_half(w[k]);

    Onnx__TensorProto W, b;
    onnx__tensor_proto__init(&W);
    onnx__tensor_proto__init(&b);
    int64_t w_dims[2] = {D, C}, b_dims[1] = {C};
    W.name = "W";
    W.n_dims = 2;
    W.dims = w_dims;
    W.has_data_type = 1;
    Onnx__StringStringEntryProto loc, off, len;
    Onnx__StringStringEntryProto *ext[3] = {&loc, &off, &len};
    if (strcmp(variant, "f32") == 0) {
        W.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        W.n_float_data = D * C;
        W.float_data = w;
    } else if (strcmp(variant, "f16") == 0) {
        W.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
        W.has_raw_data = 1;
        W.raw_data.data = (uint8_t *)w_half;
        W.raw_data.len = sizeof w_half;
    } else {
        /* Points at a file that does not exist: --save must not need it. */
        W.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
        W.has_data_location = 1;
        W.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        onnx__string_string_entry_proto__init(&loc);
        onnx__string_string_entry_proto__init(&off);
        onnx__string_string_entry_proto__init(&len);
        loc.key = "location", loc.value = "W.bin";
        off.key = "offset", off.value = "0";
        len.key = "length", len.value = "96";
        W.n_external_data = 3;
        W.external_data = ext;
    }
    b.name = "b";
    b.n_dims = 1;
    b.dims = b_dims;
    b.has_data_type = 1;
    b.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    b.n_float_data = C;
    b.float_data = b_values;
    Onnx__TensorProto *inits[2] = {&W, &b};

    Onnx__NodeProto matmul, add;
    onnx__node_proto__init(&matmul);
    onnx__node_proto__init(&add);
    char *mm_in[2] = {"input", "W"}, *mm_out[1] = {"xw"}, *add_in[2] = {"xw", "b"}, *add_out[1] = {"logits"};
    matmul.name = "matmul", matmul.op_type = "MatMul";
    matmul.n_input = 2, matmul.input = mm_in, matmul.n_output = 1, matmul.output = mm_out;
    add.name = "add", add.op_type = "Add";
    add.n_input = 2, add.input = add_in, add.n_output = 1, add.output = add_out;
    Onnx__NodeProto *nodes[2] = {&matmul, &add};

    ValueInfo in, out;
    value_info(&in, "input", D);
    value_info(&out, "logits", C);
    Onnx__ValueInfoProto *inputs[1] = {&in.vi}, *outputs[1] = {&out.vi};

    Onnx__GraphProto g;
    onnx__graph_proto__init(&g);
    g.name = "fake";
    g.n_node = 2, g.node = nodes;
    g.n_initializer = 2, g.initializer = inits;
    g.n_input = 1, g.input = inputs;
    g.n_output = 1, g.output = outputs;

    Onnx__OperatorSetIdProto opset;
    onnx__operator_set_id_proto__init(&opset);
    opset.domain = "";
    opset.has_version = 1;
    opset.version = 17;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};

    Onnx__ModelProto m;
    onnx__model_proto__init(&m);
    m.has_ir_version = 1;
    m.ir_version = 8;
    m.producer_name = "cleave runtime tests";
    m.n_opset_import = 1;
    m.opset_import = opsets;
    m.graph = &g;

    size_t size = onnx__model_proto__get_packed_size(&m);
    uint8_t *bytes = malloc(size);
    if (!bytes) return 1;
    onnx__model_proto__pack(&m, bytes);

    FILE *f = fopen(argv[2], "w");
    if (!f) {
        perror(argv[2]);
        free(bytes);
        return 1;
    }
    fprintf(f, "/* Written by make_fake_model %s; do not edit. */\n"
               "#pragma GCC diagnostic push\n#pragma GCC diagnostic ignored \"-Wcomment\"\n"
               "#include \"rt_abi.h\"\n#pragma GCC diagnostic pop\n\n", variant);
    fprintf(f, "const unsigned char cleave_model[%zu] = {", size);
    for (size_t i = 0; i < size; i++) fprintf(f, "%s0x%02x,", i % 12 ? " " : "\n    ", bytes[i]);
    fprintf(f, "\n};\nconst uint64_t cleave_model_len = %zu;\n\n", size);
    const uint8_t *init = (const uint8_t *)w;
    fprintf(f, "const unsigned char cleave_init[%zu] = {", sizeof w);
    for (size_t i = 0; i < sizeof w; i++) fprintf(f, "%s0x%02x,", i % 12 ? " " : "\n    ", init[i]);
    fprintf(f, "\n};\n");
    free(bytes);
    if (fclose(f) != 0) {
        perror(argv[2]);
        return 1;
    }
    return 0;
}
