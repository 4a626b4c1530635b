#!/usr/bin/python3
"""Writes malformed inputs for test_cli_errors.sh (and seeds for the fuzzer).

usage: make_bad_models.py OUTDIR [--sample samples/mlp.onnx]

Byte-level cases (empty, truncated, random, text) need only the standard
library and are always written.  The model-level cases need the `onnx`
package; without it the script says SKIP on stderr and exits 77 after the
byte-level ones.  Models are built with onnx.helper and never passed through
onnx.checker: most of them are invalid on purpose.

OUTDIR/bad_data holds a valid model and .npy data for it with a token id
out of range, for the check that a compiled program stops on it.

Besides OUTDIR, two files are written into OUTDIR's parent folder
(escape.bin, outside.bin) so that the external-data cases point at files
that really exist and are refused for their location, not for being
missing.
"""
import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SAMPLE = os.path.join(HERE, "..", "..", "samples", "mlp.onnx")


def write(outdir, name, data):
    with open(os.path.join(outdir, name), "wb") as f:
        f.write(data)


def byte_cases(outdir, sample):
    write(outdir, "empty.onnx", b"")
    with open(sample, "rb") as f:
        whole = f.read()
    # Cut points: inside the first tag, right after a complete first field
    # (decodes, but has no graph), and at several depths inside the graph.
    for cut in (1, 2, 3, 10, 100, 1000, len(whole) // 2, len(whole) - 1):
        write(outdir, "truncated_%d.onnx" % cut, whole[:cut])
    rng = random.Random(20240229)
    write(outdir, "random.onnx", bytes(rng.getrandbits(8) for _ in range(4096)))
    write(outdir, "text.onnx", b'ir_version: 8\ngraph {\n  node { op_type: "Relu" input: "x" output: "y" }\n}\n')
    write(outdir, "deep_nesting.onnx", nested_subgraphs(5000))
    # Names with bytes a protobuf string must not hold, swapped in at equal
    # length so the file still decodes: "input" is the graph input's name
    # and its first node's input; "pytorch" the producer's name.
    for fname, old, new in (("name_bad_utf8.onnx", b"input", b"inp\xffu"),
                            ("name_nul.onnx", b"input", b"in\x00ut"),
                            ("name_equals.onnx", b"input", b"in=ut"),
                            ("producer_overlong_utf8.onnx", b"pytorch", b"py\xc0\xafrch")):
        if whole.count(old) >= 1:
            write(outdir, fname, whole.replace(old, new))


def varint(n):
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def nested_subgraphs(depth):
    """A ModelProto whose graph holds a node whose attribute holds a graph,
    `depth` times over: 11 bytes a level, written by hand so it needs no onnx.
    Recursive decoders run out of stack on it."""
    def field(number, payload):
        return varint(number << 3 | 2) + varint(len(payload)) + payload
    g = b""
    for _ in range(depth):
        # GraphProto.node = 1, NodeProto.attribute = 5, AttributeProto.g = 6
        g = field(1, field(5, field(6, g)))
    return varint(1 << 3) + varint(8) + field(7, g)  # ir_version = 8, graph = 7


# ---------------------------------------------------------------------------
# Model-level cases.


def model_cases(outdir):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    F, I64 = TensorProto.FLOAT, TensorProto.INT64

    def vi(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    def model(name, nodes, inputs, outputs, inits=(), opset=13, ir=8, value_info=()):
        g = helper.make_graph(nodes, name, list(inputs), list(outputs), initializer=list(inits),
                              value_info=list(value_info))
        m = helper.make_model(g, producer_name="make_bad_models",
                              opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = ir
        return m

    def save(fname, m):
        write(outdir, fname, m.SerializeToString())

    def const_init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    def tensor(name, dtype, dims, field=None, values=(), raw=None):
        # Built field by field: make_tensor refuses counts that do not
        # match the dims, which is what several cases need.
        t = TensorProto()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        if raw is not None:
            t.raw_data = raw
        if field:
            getattr(t, field).extend(values)
        return t

    # --- graph structure ---------------------------------------------------
    save("cycle.onnx", model("cycle", [
        helper.make_node("Add", ["x", "b_out"], ["a_out"], name="node_a"),
        helper.make_node("Relu", ["a_out"], ["b_out"], name="node_b"),
    ], [vi("x", F, [2, 3])], [vi("b_out", F, [2, 3])]))

    save("self_loop.onnx", model("self_loop", [
        helper.make_node("Add", ["x", "y"], ["y"], name="loop_add"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    save("undefined_input.onnx", model("undef", [
        helper.make_node("Relu", ["nowhere"], ["y"], name="relu_undef"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    save("defined_twice.onnx", model("twice", [
        helper.make_node("Relu", ["x"], ["y"], name="first"),
        helper.make_node("Neg", ["x"], ["y"], name="second"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    save("output_shadows_input.onnx", model("shadow", [
        helper.make_node("Relu", ["x"], ["x"], name="shadow_relu"),
    ], [vi("x", F, [2])], [vi("x", F, [2])]))

    save("initializer_twice.onnx", model("init_twice", [
        helper.make_node("Add", ["x", "w"], ["y"], name="add_w"),
    ], [vi("x", F, [2])], [vi("y", F, [2])],
        inits=[const_init("w", np.ones(2, np.float32)), const_init("w", np.zeros(2, np.float32))]))

    save("output_not_produced.onnx", model("no_out", [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ], [vi("x", F, [2])], [vi("ghost", F, [2])]))

    save("empty_op_type.onnx", model("no_op", [
        helper.make_node("", ["x"], ["y"], name="nameless_op"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    # A newline in a node name must not break the one-line error.
    save("newline_name.onnx", model("nl", [
        helper.make_node("Relu", ["nowhere"], ["y"], name="line1\nline2"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    m = model("no_graph", [], [], [])
    m.ClearField("graph")
    save("no_graph.onnx", m)

    m = model("bad_ir", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
              [vi("x", F, [2])], [vi("y", F, [2])])
    m.ir_version = 0
    save("bad_ir_version.onnx", m)

    # --- ops ---------------------------------------------------------------
    save("unknown_op.onnx", model("unknown", [
        helper.make_node("FooBar", ["x"], ["y"], name="foo_node"),
    ], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])]))

    save("too_few_inputs.onnx", model("few", [
        helper.make_node("Add", ["x"], ["y"], name="lonely_add"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    save("too_many_outputs.onnx", model("many_out", [
        helper.make_node("Relu", ["x"], ["y", "z"], name="relu_two_out"),
    ], [vi("x", F, [2])], [vi("y", F, [2])]))

    save("required_input_omitted.onnx", model("omitted", [
        helper.make_node("Gemm", ["", "x"], ["y"], name="gemm_no_a"),
    ], [vi("x", F, [2, 2])], [vi("y", F, [2, 2])]))

    save("concat_no_axis.onnx", model("concat", [
        helper.make_node("Concat", ["x", "x"], ["y"], name="concat_no_axis"),
    ], [vi("x", F, [2, 3])], [vi("y", F, [4, 3])]))

    save("cast_no_to.onnx", model("cast", [
        helper.make_node("Cast", ["x"], ["y"], name="cast_no_to"),
    ], [vi("x", F, [2])], [vi("y", I64, [2])]))

    save("opset_too_old.onnx", model("old", [
        helper.make_node("Expand", ["x", "s"], ["y"], name="expand_v7"),
    ], [vi("x", F, [2]), vi("s", I64, [1])], [vi("y", F, None)], opset=7))

    save("subgraph_if.onnx", model("with_if", [
        helper.make_node("If", ["cond"], ["y"], name="branch",
                         then_branch=helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then",
                                                       [], [vi("t", F, [2])]),
                         else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else",
                                                       [], [vi("e", F, [2])])),
    ], [vi("cond", TensorProto.BOOL, []), vi("x", F, [2])], [vi("y", F, [2])]))

    m = model("func", [helper.make_node("Relu", ["x"], ["y"], name="relu")],
              [vi("x", F, [2])], [vi("y", F, [2])])
    f = m.functions.add()
    f.name, f.domain = "MyFn", "local"
    save("local_function.onnx", m)

    m = model("sparse", [helper.make_node("Add", ["x", "sp"], ["y"], name="add_sparse")],
              [vi("x", F, [4])], [vi("y", F, [4])])
    sp = m.graph.sparse_initializer.add()
    sp.values.CopyFrom(helper.make_tensor("sp", F, [1], [1.0]))
    sp.indices.CopyFrom(helper.make_tensor("sp_idx", I64, [1], [0]))
    sp.dims.extend([4])
    save("sparse_initializer.onnx", m)

    # --- shape mismatches --------------------------------------------------
    save("add_mismatch.onnx", model("add", [
        helper.make_node("Add", ["a", "b"], ["y"], name="add_2x3_4x5"),
    ], [vi("a", F, [2, 3]), vi("b", F, [4, 5])], [vi("y", F, None)]))

    save("matmul_mismatch.onnx", model("matmul", [
        helper.make_node("MatMul", ["a", "b"], ["y"], name="mm_3_vs_4"),
    ], [vi("a", F, [2, 3]), vi("b", F, [4, 5])], [vi("y", F, None)]))

    save("gemm_mismatch.onnx", model("gemm", [
        helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="gemm_k", transB=1),
    ], [vi("a", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("w", np.zeros((5, 4), np.float32)), const_init("c", np.zeros(5, np.float32))]))

    save("gemm_bias_mismatch.onnx", model("gemm_c", [
        helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="gemm_c"),
    ], [vi("a", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("w", np.zeros((3, 4), np.float32)), const_init("c", np.zeros(7, np.float32))]))

    save("reshape_mismatch.onnx", model("reshape", [
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_6_to_4"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("shape", np.array([4], np.int64))]))

    save("reshape_bad_target.onnx", model("reshape_neg", [
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_minus2"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("shape", np.array([-2, 3], np.int64))]))

    save("gather_out_of_range.onnx", model("gather_oob", [
        helper.make_node("Gather", ["x", "idx"], ["y"], name="gather_oob", axis=0),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("idx", np.array([5], np.int64))]))

    save("transpose_bad_perm.onnx", model("perm", [
        helper.make_node("Transpose", ["x"], ["y"], name="bad_perm", perm=[0, 0]),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)]))

    # Lists and strings that are present but empty: protobuf-c hands them
    # over as NULL pointers.
    transpose = helper.make_node("Transpose", ["x"], ["y"], name="empty_perm")
    transpose.attribute.add(name="perm", type=onnx.AttributeProto.INTS)
    transpose.attribute.add(name="note", type=onnx.AttributeProto.STRING, s=b"")
    transpose.attribute.add(name="scales", type=onnx.AttributeProto.FLOATS)
    transpose.attribute.add(name="labels", type=onnx.AttributeProto.STRINGS, strings=[b""])
    save("empty_list_attribute.onnx", model("empty_attr", [transpose], [vi("x", F, [2, 3])], [vi("y", F, None)]))

    save("bad_axis.onnx", model("axis", [
        helper.make_node("Softmax", ["x"], ["y"], name="softmax_axis9", axis=9),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)]))

    # Clip, HardSigmoid, Pad and Split: bad attributes, operands and parts.
    save("clip_nonscalar_min.onnx", model("clip_min", [
        helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip_vector_min"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("lo", np.zeros(2, np.float32)), const_init("hi", np.ones((), np.float32))]))

    save("clip_int_bound.onnx", model("clip_int", [
        helper.make_node("Clip", ["x", "lo"], ["y"], name="clip_int64_min"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("lo", np.array(0, np.int64))]))

    save("clip_inputs_opset10.onnx", model("clip_v10", [
        helper.make_node("Clip", ["x", "lo"], ["y"], name="clip_v10_inputs"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("lo", np.zeros((), np.float32))], opset=10))

    save("hardsigmoid_int.onnx", model("hsig", [
        helper.make_node("HardSigmoid", ["x"], ["y"], name="hardsigmoid_int64"),
    ], [vi("x", I64, [2, 3])], [vi("y", I64, None)]))

    save("pad_pads_length.onnx", model("pad_len", [
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_three_pads"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("pads", np.array([0, 1, 0], np.int64))]))

    save("pad_unknown_mode.onnx", model("pad_mode", [
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_mirror", mode="mirror"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("pads", np.array([0, 1, 0, 1], np.int64))]))

    save("pad_crop_too_much.onnx", model("pad_crop", [
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_crop_4_of_3"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("pads", np.array([0, -2, 0, -2], np.int64))]))

    save("pad_int64_min.onnx", model("pad_min", [
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_int64_min"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("pads", np.array([0, np.iinfo(np.int64).min, 0, 1], np.int64))]))

    save("pad_reflect_too_far.onnx", model("pad_reflect", [
        helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_reflect_3", mode="reflect"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[const_init("pads", np.array([0, 3, 0, 0], np.int64))]))

    save("pad_attr_missing.onnx", model("pad_v2", [
        helper.make_node("Pad", ["x"], ["y"], name="pad_no_pads"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], opset=10))

    save("split_parts_sum.onnx", model("split_sum", [
        helper.make_node("Split", ["x", "parts"], ["a", "b"], name="split_2_2_of_5", axis=1),
    ], [vi("x", F, [2, 5])], [vi("a", F, None), vi("b", F, None)],
        inits=[const_init("parts", np.array([2, 2], np.int64))]))

    save("split_parts_count.onnx", model("split_count", [
        helper.make_node("Split", ["x", "parts"], ["a", "b", "c"], name="split_2_parts_3_outputs", axis=1),
    ], [vi("x", F, [2, 5])], [vi("a", F, None), vi("b", F, None), vi("c", F, None)],
        inits=[const_init("parts", np.array([2, 3], np.int64))]))

    save("split_unequal.onnx", model("split_eq", [
        helper.make_node("Split", ["x"], ["a", "b"], name="split_5_in_halves", axis=1),
    ], [vi("x", F, [2, 5])], [vi("a", F, None), vi("b", F, None)]))

    save("split_no_num_outputs.onnx", model("split18", [
        helper.make_node("Split", ["x"], ["a", "b"], name="split18_bare", axis=1),
    ], [vi("x", F, [2, 4])], [vi("a", F, None), vi("b", F, None)], opset=18))

    # Training forms of BatchNormalization and Dropout: refused when compiled.
    save("dropout_mode_input.onnx", model("drop_mode", [
        helper.make_node("ReduceMax", ["x"], ["mx"], name="max_of_x", keepdims=0),
        helper.make_node("Greater", ["mx", "zero"], ["mode"], name="mode_from_x"),
        helper.make_node("Dropout", ["x", "ratio", "mode"], ["y"], name="dropout_mode_fed"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("ratio", np.array(0.5, np.float32)), const_init("zero", np.array(0, np.float32))]))
    save("dropout_ratio_one.onnx", model("drop_all", [
        helper.make_node("Dropout", ["x", "ratio", "mode"], ["y"], name="dropout_everything"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("ratio", np.array(1.0, np.float32)), const_init("mode", np.array(True))]))
    save("dropout_mask_read.onnx", model("drop_mask", [
        helper.make_node("Dropout", ["x", "ratio", "mode"], ["d", "mask"], name="dropout_with_mask"),
        helper.make_node("Cast", ["mask"], ["m"], name="mask_to_float", to=F),
        helper.make_node("Mul", ["d", "m"], ["y"], name="times_mask"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)],
        inits=[const_init("ratio", np.array(0.5, np.float32)), const_init("mode", np.array(True))]))
    bn_params = [const_init(n, np.full(3, v, np.float32)) for n, v in
                 (("scale", 1), ("bias", 0), ("mean", 0), ("var", 1))]
    save("bn_stats_read.onnx", model("bn_read", [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                         ["bn", "rmean", "rvar", "smean", "svar"], name="bn_reads_stats"),
        helper.make_node("Add", ["bn", "rmean"], ["y"], name="add_running_mean"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=bn_params))
    save("bn_one_value.onnx", model("bn_one", [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], name="bn_batch_of_one",
                         training_mode=1),
    ], [vi("x", F, [1, 3])], [vi("y", F, None)], inits=bn_params, opset=15))

    # ConvTranspose, Resize and Upsample: bad attributes, operands and modes.
    def convt(fname, x, w, **attrs):
        save(fname, model(fname[:-5], [
            helper.make_node("ConvTranspose", ["x", "w"], ["y"], name=fname[:-5], **attrs),
        ], [vi("x", F, x)], [vi("y", F, None)], inits=[const_init("w", np.ones(w, np.float32))]))

    convt("convt_channels.onnx", [1, 4, 5, 5], [3, 2, 3, 3])
    convt("convt_groups.onnx", [1, 4, 5, 5], [4, 2, 3, 3], group=3)
    convt("convt_pads_length.onnx", [1, 2, 5, 5], [2, 2, 3, 3], pads=[1, 1])
    convt("convt_output_padding.onnx", [1, 2, 5, 5], [2, 2, 3, 3], strides=[2, 2], output_padding=[2, 0])
    convt("convt_auto_pad.onnx", [1, 2, 5, 5], [2, 2, 3, 3], auto_pad="SAME")
    convt("convt_pads_too_big.onnx", [1, 2, 2, 2], [2, 2, 2, 2], pads=[3, 0, 3, 0])
    convt("convt_output_shape_before_start.onnx", [1, 2, 3, 3], [2, 2, 3, 3], output_shape=[7, 7],
          auto_pad="SAME_UPPER")

    def resize(fname, ins, inits, opset=13, x=(1, 2, 4, 4), dtype=F, op="Resize", **attrs):
        save(fname, model(fname[:-5], [helper.make_node(op, ["x"] + ins, ["y"], name=fname[:-5], **attrs)],
                          [vi("x", dtype, list(x))], [vi("y", dtype, None)],
                          inits=[const_init(k, v) for k, v in inits.items()], opset=opset))

    s2 = {"s": np.array([1, 1, 2, 2], np.float32)}
    resize("resize_cubic.onnx", ["", "s"], s2, mode="cubic")
    resize("resize_unknown_mode.onnx", ["", "s"], s2, mode="bilinear")
    resize("resize_tf_crop.onnx", ["", "s"], s2, mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    resize("resize_unknown_coordinates.onnx", ["", "s"], s2, coordinate_transformation_mode="corner")
    resize("resize_antialias.onnx", ["", "s"], s2, opset=18, mode="linear", antialias=1)
    resize("resize_scales_and_sizes.onnx", ["", "s", "z"], dict(s2, z=np.array([1, 2, 8, 8], np.int64)))
    resize("resize_no_scales.onnx", [], {})
    resize("resize_scales_count.onnx", ["", "s"], {"s": np.array([1, 2, 2], np.float32)})
    resize("resize_scale_zero.onnx", ["", "s"], {"s": np.array([1, 1, 0, 2], np.float32)})
    resize("resize_sizes_float.onnx", ["", "", "z"], {"z": np.array([1, 2, 8, 8], np.float32)})
    resize("resize_axes_repeated.onnx", ["", "", "z"], {"z": np.array([8, 8], np.int64)}, opset=18, axes=[2, -2])
    resize("resize_linear_int.onnx", ["", "s"], s2, dtype=I64, mode="linear")
    resize("upsample_shrinks.onnx", ["s"], {"s": np.array([1, 1, 0.5, 2], np.float32)}, opset=9, op="Upsample")
    resize("upsample_no_scales.onnx", [], {}, opset=7, op="Upsample")

    # --- dtypes and tensor contents -----------------------------------------
    save("add_float_int64.onnx", model("mixed", [
        helper.make_node("Add", ["a", "b"], ["y"], name="add_mixed"),
    ], [vi("a", F, [2]), vi("b", I64, [2])], [vi("y", F, None)]))

    save("gather_float_indices.onnx", model("gather_f", [
        helper.make_node("Gather", ["x", "idx"], ["y"], name="gather_float_idx"),
    ], [vi("x", F, [4, 3]), vi("idx", F, [2])], [vi("y", F, None)]))

    w = tensor("w_raw", F, [2, 3], raw=b"\0" * 10)
    save("raw_data_length.onnx", model("raw", [
        helper.make_node("Add", ["x", "w_raw"], ["y"], name="add_raw"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[w]))

    w = tensor("w_fd", F, [2, 3], "float_data", [1.0, 2.0, 3.0, 4.0, 5.0])
    save("float_data_count.onnx", model("fd", [
        helper.make_node("Add", ["x", "w_fd"], ["y"], name="add_fd"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)], inits=[w]))

    w = tensor("w_i64", I64, [3], "int64_data", [1, 2])
    save("int64_data_count.onnx", model("i64", [
        helper.make_node("Reshape", ["x", "w_i64"], ["y"], name="reshape_i64"),
    ], [vi("x", F, [6])], [vi("y", F, None)], inits=[w]))

    w = tensor("w_str", TensorProto.STRING, [1], "string_data", [b"hello"])
    save("string_tensor.onnx", model("str", [
        helper.make_node("Identity", ["w_str"], ["y"], name="id_str"),
    ], [], [vi("y", TensorProto.STRING, [1])], inits=[w]))

    w = tensor("w_c64", TensorProto.COMPLEX64, [1], "float_data", [1.0, 2.0])
    save("complex_tensor.onnx", model("c64", [
        helper.make_node("Identity", ["w_c64"], ["y"], name="id_c64"),
    ], [], [vi("y", TensorProto.COMPLEX64, [1])], inits=[w]))

    save("input_bad_elem_type.onnx", model("elem", [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ], [vi("x", 99, [2])], [vi("y", F, None)]))

    w = tensor("w_rank9", F, [1] * 9, "float_data", [0.0])
    save("rank_too_high.onnx", model("rank9", [
        helper.make_node("Relu", ["w_rank9"], ["y"], name="relu9"),
    ], [], [vi("y", F, None)], inits=[w]))

    const_no_tensor = helper.make_node("Constant", [], ["y"], name="const_bad")
    const_no_tensor.attribute.add(name="value", type=onnx.AttributeProto.TENSOR)
    save("constant_no_tensor.onnx", model("const", [const_no_tensor], [], [vi("y", F, None)]))

    # --- absurd and negative sizes -----------------------------------------
    huge = tensor("w_huge", F, [2 ** 40, 2 ** 40])
    save("huge_initializer.onnx", model("huge", [
        helper.make_node("Add", ["x", "w_huge"], ["y"], name="add_huge"),
    ], [vi("x", F, [1])], [vi("y", F, None)], inits=[huge]))

    # Within the size limit, but the 32 GiB it declares are not in the file.
    save("big_without_data.onnx", model("big_nodata", [
        helper.make_node("Add", ["x", "w_big"], ["y"], name="add_big"),
    ], [vi("x", F, [1])], [vi("y", F, None)], inits=[tensor("w_big", F, [2 ** 33])]))

    save("huge_input.onnx", model("huge_in", [
        helper.make_node("Relu", ["x"], ["y"], name="relu_huge"),
    ], [vi("x", F, [4, 2 ** 62])], [vi("y", F, None)]))

    save("huge_matmul.onnx", model("huge_mm", [
        helper.make_node("MatMul", ["a", "b"], ["y"], name="mm_huge"),
    ], [vi("a", F, [2 ** 40, 2]), vi("b", F, [2, 2 ** 40])], [vi("y", F, None)]))

    save("huge_reshape.onnx", model("huge_rs", [
        helper.make_node("Flatten", ["x"], ["y"], name="flatten_huge", axis=0),
    ], [vi("x", F, [2 ** 40, 2 ** 40])], [vi("y", F, None)]))

    # More tensors than one kernel takes: refused by name, not a compiler bug.
    wide = [const_init("w_cat%d" % k, np.ones((1, 2), np.float32)) for k in range(70)]
    save("wide_concat.onnx", model("wide_cat", [
        helper.make_node("Concat", ["x"] + ["w_cat%d" % k for k in range(70)], ["y"], name="cat71", axis=1),
    ], [vi("x", F, [1, 2])], [vi("y", F, None)], inits=wide))

    save("negative_input_dim.onnx", model("neg_in", [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ], [vi("x", F, [2, -3])], [vi("y", F, None)]))

    neg = tensor("w_neg", F, [-1])
    save("negative_initializer_dim.onnx", model("neg_init", [
        helper.make_node("Relu", ["w_neg"], ["y"], name="relu"),
    ], [], [vi("y", F, None)], inits=[neg]))

    # --- found by the fuzzer ------------------------------------------------
    save("reshape_no_shape_input.onnx", model("reshape_1in", [
        helper.make_node("Reshape", ["x"], ["y"], name="reshape_one_input"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)]))

    save("omitted_required_output.onnx", model("no_out0", [
        helper.make_node("Shape", ["x"], [""], name="shape_no_output"),
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ], [vi("x", F, [2, 3])], [vi("y", F, None)]))

    save("pool_pads_overflow.onnx", model("pool_pads", [
        helper.make_node("MaxPool", ["x"], ["y"], name="pool_huge_pads", kernel_shape=[2, 2],
                         pads=[2 ** 63 - 1, 0, 7, 0]),
    ], [vi("x", F, [1, 1, 8, 8])], [vi("y", F, None)]))

    save("conv_group_overflow.onnx", model("conv_group", [
        helper.make_node("Conv", ["x", "w"], ["y"], name="conv_huge_group", group=2 ** 40),
    ], [vi("x", F, [1, 4, 8, 8]), vi("w", F, [2, 2 ** 40, 3, 3])], [vi("y", F, None)]))

    save("concat_dim_overflow.onnx", model("concat_big", [
        helper.make_node("Concat", ["a", "b"], ["y"], name="concat_huge", axis=0),
    ], [vi("a", F, [2 ** 62, 1]), vi("b", F, [2 ** 62, 1])], [vi("y", F, None)]))

    # --- external data -----------------------------------------------------
    parent = os.path.dirname(os.path.abspath(outdir))
    write(parent, "escape.bin", b"\0" * 24)
    write(parent, "outside.bin", b"\0" * 24)
    write(outdir, "weights.bin", b"\0" * 24)
    os.makedirs(os.path.join(outdir, "subdir"), exist_ok=True)
    link = os.path.join(outdir, "link.bin")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(parent, "outside.bin"), link)

    def external(fname, location, offset=None, length=None, dims=(2, 3)):
        t = tensor("w_ext", F, dims)
        t.data_location = TensorProto.EXTERNAL
        entries = [("location", location)]
        if offset is not None:
            entries.append(("offset", str(offset)))
        if length is not None:
            entries.append(("length", str(length)))
        for k, v in entries:
            e = t.external_data.add()
            e.key, e.value = k, v
        save(fname, model("ext", [
            helper.make_node("Add", ["x", "w_ext"], ["y"], name="add_ext"),
        ], [vi("x", F, list(dims))], [vi("y", F, None)], inits=[t]))

    external("ext_escape.onnx", "../escape.bin")
    external("ext_escape_nested.onnx", "sub/../../escape.bin")
    external("ext_absolute.onnx", "/etc/passwd")
    external("ext_symlink.onnx", "link.bin")
    external("ext_missing.onnx", "no_such_weights.bin")
    external("ext_offset_past_end.onnx", "weights.bin", offset=100)
    external("ext_length_past_end.onnx", "weights.bin", offset=8, length=24)
    external("ext_length_short.onnx", "weights.bin", offset=0, length=12)
    external("ext_offset_garbage.onnx", "weights.bin", offset="12abc")
    external("ext_offset_negative.onnx", "weights.bin", offset=-4)
    external("ext_no_location.onnx", "")
    external("ext_directory.onnx", "subdir")
    external("ext_big.onnx", "weights.bin", dims=(2 ** 33,))

    # A valid model using external data: the suite checks it loads.
    external("ext_ok.onnx", "weights.bin", offset=0, length=24)

    # --- a valid model fed bad data ------------------------------------------
    # In bad_data/ (the suite's loops over OUTDIR/*.onnx do not see it): an
    # embedding of 7 rows read by int64 token ids, pooled and classified.
    # ids_oob.npy holds one id past the table (row 3, column 1); the
    # compiled program must stop on it with one line naming the node.
    data = os.path.join(outdir, "bad_data")
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(7)
    g = helper.make_graph([
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="tok_embed", axis=0),
        helper.make_node("ReduceMean", ["emb"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["logits"], name="classify"),
    ], "embedding", [vi("ids", I64, ["batch", 3])], [vi("logits", F, ["batch", 2])],
        initializer=[const_init("table", rng.standard_normal((7, 4)).astype(np.float32)),
                     const_init("w", rng.standard_normal((4, 2)).astype(np.float32))])
    write(data, "embedding.onnx", helper.make_model(
        g, producer_name="make_bad_models", opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ids = rng.integers(-7, 7, (4, 3)).astype(np.int64)
    ids[3, 1] = 7
    np.save(os.path.join(data, "ids_oob.npy"), ids)
    np.save(os.path.join(data, "labels.npy"), rng.integers(0, 2, 4).astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--sample", default=DEFAULT_SAMPLE, help="model to truncate (default: samples/mlp.onnx)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    byte_cases(args.outdir, args.sample)
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        print("SKIP: model-level cases need onnx and numpy (%s)" % e, file=sys.stderr)
        return 77
    model_cases(args.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
