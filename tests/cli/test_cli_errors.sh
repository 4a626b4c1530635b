#!/usr/bin/env bash
# Command-line behaviour of `cleave`: exit codes and one-line errors, on bad
# command lines and on malformed inputs (written by make_bad_models.py),
# and of a compiled program fed data it cannot run on.
#
# Every failing run must exit with the status of its kind (2 for usage
# errors, 1 for bad input), print exactly one line on stderr naming the
# file, and not crash.  None may exit 70, the status of an internal error
# (a compiler bug): every malformed model is also compiled, which runs the
# passes past the front end, and must fail as the user's error or compile.  Under -DCLEAVE_SANITIZE=ON a sanitizer report adds
# lines to stderr, so it fails the check too.
#
# usage: test_cli_errors.sh CLEAVE WORKDIR
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 CLEAVE WORKDIR" >&2
  exit 2
fi
# Absolute, as the model checks run from inside the models' folder.
CLEAVE=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${CLEAVE_TEST_PYTHON:-/usr/bin/python3}
LIMIT=60 # seconds per command; a hang counts as a failure
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
BAD=$WORK/bad
rm -rf "$BAD"
mkdir -p "$BAD"
RUN_DIR=$WORK # folder the checked commands run in
pass=0
fail=0
skipped=0 # groups of checks that could not run (never counted as passes)
label=FAIL # how expect reports a failed check

# run COMMAND...: runs it in RUN_DIR under the time limit; sets `status`
# and `err` and leaves stdout in $WORK/stdout.
run() {
  # The outer redirection drops bash's own "Segmentation fault" notice;
  # crashes are reported from the status.
  { (cd "$RUN_DIR" && exec timeout -k 5 "$LIMIT" "$@") >"$WORK/stdout" 2>"$WORK/stderr"; } 2>/dev/null
  status=$?
  err=$(cat "$WORK/stderr")
}

# Why a finished run is not a clean exit, or nothing.
crashed() {
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then echo " (timed out after ${LIMIT}s)"
  elif [ "$status" -eq 70 ]; then echo " (internal error: a compiler bug, not the input's)"
  elif [ "$status" -ge 128 ]; then echo " (crashed: signal $((status - 128)))"
  fi
}

# expect STATUS PATTERN -- command...: the command exits with STATUS and its
# stderr is one line matching PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  run "$@"
  if [ "$status" -eq "$want" ] && printf '%s' "$err" | grep -qE -- "$pattern" &&
    [ "$(wc -l <"$WORK/stderr")" -eq 1 ] && [ "$(tail -c 1 "$WORK/stderr" | od -An -c | tr -d ' ')" = '\n' ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "$label: $* -> status $status (want $want)$(crashed), stderr: $err"
  fi
}

# expect_ok PATTERN -- command...: the command exits 0, prints nothing on
# stderr, and its stdout matches PATTERN.
expect_ok() {
  local pattern=$1
  shift 2
  run "$@"
  if [ "$status" -eq 0 ] && [ -z "$err" ] && grep -qE -- "$pattern" "$WORK/stdout"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $* -> status $status (want 0)$(crashed), stderr: $err, stdout: $(head -c 200 "$WORK/stdout")"
  fi
}

# ---- command line ----------------------------------------------------------

expect 2 "unknown command" -- "$CLEAVE" frobnicate
expect 2 "no model given" -- "$CLEAVE" inspect
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch 0
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch -4
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch 12abc
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch 99999999999999999999
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch
expect 2 "unknown format 'xml'" -- "$CLEAVE" inspect x.onnx --format xml
expect 2 "--format needs text or json" -- "$CLEAVE" inspect x.onnx --format
expect 2 "unknown flag '--frob'" -- "$CLEAVE" inspect x.onnx --frob
expect 2 "one model at a time" -- "$CLEAVE" inspect a.onnx b.onnx

# compile: usage errors name the flag; the model is the sample MLP
MLP=$(cd "$HERE/../.." && pwd)/samples/mlp.onnx
OUTP=$WORK/never_written
expect 2 "no output given" -- "$CLEAVE" compile "$MLP" --batch 8
expect 2 "--batch is required" -- "$CLEAVE" compile "$MLP" -o "$OUTP"
expect 2 "--loss must be ce, mse or model, got 'l1'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --loss l1
expect 2 "--optimizer must be sgd, momentum, adam or adamw, got 'rmsprop'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --optimizer rmsprop
# The optimizer's transformer flags (the program's own are checked in tests/py/test_optim.py).
expect 2 "--lr-schedule must be constant, linear or cosine, got 'step'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --lr-schedule step
expect 2 "--warmup-steps needs --lr-schedule" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --warmup-steps 10
expect 2 "--warmup-steps needs a non-negative integer, got '-3'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --lr-schedule linear --warmup-steps -3
expect 2 "--clip-grad-norm needs a positive number, got '-1'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --clip-grad-norm -1
expect 2 "--clip-grad-norm needs a positive number, got '0'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --clip-grad-norm 0
expect 2 "--clip-grad-norm needs a positive number, got 'inf'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --clip-grad-norm inf
expect 2 "--no-decay needs weight decay \\(--weight-decay, or --optimizer adamw\\)" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --no-decay bias
expect 2 "--no-decay needs name patterns, got ','" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --optimizer adamw --no-decay ,
expect 2 "--no-decay: 'nosuch' matches no trained parameter \\(they are: fc1.weight, fc1.bias" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --optimizer adamw --no-decay bias,nosuch
expect 2 "--lr needs a finite non-negative float32 number, got 'fast'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --lr fast
for bad_number in inf nan 1e39 -1; do
  expect 2 "--lr needs a finite non-negative float32 number, got '$bad_number'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --lr "$bad_number"
done
expect 2 "--weight-decay needs a finite non-negative float32 number, got 'inf'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --weight-decay inf
expect 2 "--beta1 needs a number in \[0, 1\), got '2'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --optimizer adam --beta1 2
expect 2 "--beta2 needs a number in \[0, 1\), got '1'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --optimizer adam --beta2 1
expect 2 "--nesterov needs --optimizer momentum" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --nesterov
expect 2 "--emit must be exe, obj or llvm" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --emit asm
expect 2 "--threads needs an integer from 1 to 64, got '0'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --threads 0
expect 2 "--threads needs an integer from 1 to 64, got '65'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --threads 65
expect 2 "--threads needs an integer from 1 to 64, got '2x'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --threads 2x
expect 2 "--threads needs an integer from 1 to 64, got '-1'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --threads -1
expect 2 "--threads needs a value" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --threads
expect 2 "--ranks 2 needs a --strategy \\(dp, layer, pipeline or hybrid\\)" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2
expect 2 "--batch 9 does not divide among --ranks 2" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 9 --ranks 2 --strategy dp
expect 2 "--strategy must be single, dp, layer, pipeline, hybrid or auto, got 'zigzag'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --strategy zigzag
# Layer, pipeline and hybrid flags.
expect 2 "--microbatches 3 does not divide the 8 rows of --batch" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --microbatches 3
expect 2 "--microbatches 8 does not divide the 4 rows of each replica's batch" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --strategy hybrid --dp 2 --pp 2 --microbatches 8
expect 2 "--microbatches needs a positive integer, got '0'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --microbatches 0
expect 2 "--schedule must be gpipe or 1f1b, got 'zigzag'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --schedule zigzag
expect 2 "--schedule 1f1b needs --strategy pipeline or hybrid" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy layer --schedule 1f1b
expect 2 "--strategy layer runs the whole batch through the stages at once" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy layer --microbatches 2
expect 2 "--microbatches, --schedule, --stages, --dp and --pp need --strategy layer, pipeline or hybrid" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --microbatches 2
expect 2 "--dp 3 x --pp 2 does not make --ranks 4" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 12 --ranks 4 --strategy hybrid --dp 3 --pp 2
expect 2 "--strategy hybrid needs --dp D and --pp P" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 4 --strategy hybrid
expect 2 "--dp needs --strategy hybrid" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --dp 2
expect 2 "--stages names 2 nodes; 2 stages need 1" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --stages a,b
expect 2 "--stages needs node names, got ','" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy pipeline --stages ,
expect 2 "--stages: the model has no node named 'nosuchnode'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ranks 2 --strategy layer --stages nosuchnode
expect 2 "--target-cpu 'frobcpu' is not a processor LLVM knows" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --target-cpu frobcpu
expect 2 "--freeze: 'nope' is not a float initializer" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --freeze nope
expect 1 "--loss model needs a scalar first output; 'output' has 1024 elements" -- "$CLEAVE" compile "$(cd "$HERE/../.." && pwd)/samples/transformer.onnx" -o "$OUTP" --batch 2 --loss model
expect 2 "--accumulate needs an integer from 1 to 65536, got '0'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --accumulate 0
expect 2 "--accumulate does not go with --strategy auto yet" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --accumulate 2 --ranks 2 --strategy auto
expect 2 "--accumulate runs K batches through the stages one after another" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --accumulate 2 --ranks 2 --strategy layer
expect 2 "--ignore-index needs an integer, got '1.5'" -- "$CLEAVE" compile "$MLP" -o "$OUTP" --batch 8 --ignore-index 1.5

# No arguments at all: the overall usage text, on stderr, with status 2.
run "$CLEAVE"
if [ "$status" -eq 2 ] && grep -q "^usage: cleave" "$WORK/stderr"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL: $CLEAVE (no arguments) -> status $status (want 2)$(crashed), stderr: $err"
fi

expect_ok "^cleave [0-9]+\.[0-9]+\.[0-9]+$" -- "$CLEAVE" --version
for flag in --help -h help; do
  expect_ok "^usage: cleave <command>" -- "$CLEAVE" $flag
done
# Every command the overall help lists answers --help (and -h) itself.
commands=$("$CLEAVE" --help | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p')
if [ -z "$commands" ]; then
  fail=$((fail + 1))
  echo "FAIL: '$CLEAVE --help' lists no commands"
fi
for cmd in $commands; do
  expect_ok "^usage: cleave $cmd" -- "$CLEAVE" "$cmd" --help
  expect_ok "^usage: cleave $cmd" -- "$CLEAVE" "$cmd" -h
done
expect_ok "^usage: cleave inspect" -- "$CLEAVE" inspect some.onnx --batch 2 --help

# ---- files that are not models ---------------------------------------------

expect 1 "missing\.onnx: cannot open" -- "$CLEAVE" inspect "$WORK/missing.onnx"
expect 1 ": not a regular file" -- "$CLEAVE" inspect "$WORK"
expect 1 "^cleave: error: /dev/null: not a regular file" -- "$CLEAVE" inspect /dev/null

# ---- malformed inputs ------------------------------------------------------

RUN_DIR=$BAD
checked=" "

# bad NAME PATTERN [FLAGS...]: `cleave inspect NAME FLAGS` run inside the
# models' folder fails with "cleave: error: NAME: PATTERN".
bad() {
  local name=$1 pattern=$2
  shift 2
  checked="$checked$name "
  expect 1 "^cleave: error: ${name//./\\.}: $pattern" -- "$CLEAVE" inspect "$name" "$@"
}

# bad_train NAME PATTERN [FLAGS]: compiling the model for training (--loss
# mse, batch 2 unless FLAGS say) fails with PATTERN.
bad_train() {
  local name=$1 pattern=$2
  shift 2
  checked="$checked$name "
  expect 1 "^cleave: error: ${name//./\\.}: $pattern" -- "$CLEAVE" compile "$name" -o "$OUTP" --loss mse --batch 2 "$@"
}

if [ ! -x "$PYTHON" ]; then
  gen=127
  echo "SKIP: $PYTHON not found; malformed-input checks skipped"
  skipped=$((skipped + 1))
else
  "$PYTHON" "$HERE/make_bad_models.py" "$BAD" 2>"$WORK/make_bad_models.err"
  gen=$?
  if [ "$gen" -eq 77 ]; then
    # make_bad_models.py says SKIP and why; byte-level cases are still checked.
    echo "$(head -n 1 "$WORK/make_bad_models.err") [$PYTHON]"
    skipped=$((skipped + 1))
  elif [ "$gen" -ne 0 ]; then
    fail=$((fail + 1))
    echo "FAIL: make_bad_models.py exited $gen: $(tail -n 3 "$WORK/make_bad_models.err")"
  fi
fi

if [ "$gen" -eq 0 ] || [ "$gen" -eq 77 ]; then
  # Byte-level damage: written without onnx.
  bad empty.onnx "empty file, not an ONNX model"
  bad random.onnx "not an ONNX model"
  bad text.onnx "not an ONNX model"
  bad deep_nesting.onnx "protobuf messages nested more than [0-9]+ levels deep"
  bad name_bad_utf8.onnx "a string in onnx.NodeProto.input is not valid UTF-8: \"inp\\\\xffu\""
  bad name_nul.onnx "a string in onnx.NodeProto.input holds a NUL byte: \"in\\\\x00ut\""
  bad name_equals.onnx "graph input 'in=ut' has '=' in its name, which --data NAME=FILE cannot give"
  bad producer_overlong_utf8.onnx "a string in onnx.ModelProto.producer_name is not valid UTF-8"
  for f in "$BAD"/truncated_*.onnx; do
    bad "$(basename "$f")" "not an ONNX model"
    bad "$(basename "$f")" "not an ONNX model" --batch 3 --format json
  done
fi

if [ "$gen" -eq 0 ]; then
  # Graph structure
  bad cycle.onnx "node 'node_(a|b)' \((Add|Relu)\) is part of a cycle"
  bad self_loop.onnx "node 'loop_add' \(Add\) is part of a cycle"
  bad undefined_input.onnx "node 'relu_undef' \(Relu\): input 'nowhere' is not defined"
  bad defined_twice.onnx "node 'second' \(Neg\): output 'y' is already defined elsewhere"
  bad output_shadows_input.onnx "node 'shadow_relu' \(Relu\): output 'x' is already defined elsewhere"
  bad initializer_twice.onnx "value 'w' is defined more than once"
  bad output_not_produced.onnx "graph output 'ghost' is not produced by any node"
  bad empty_op_type.onnx "node #0 has no op_type"
  bad newline_name.onnx "node 'line1 line2' \(Relu\): input 'nowhere' is not defined"
  bad no_graph.onnx "not an ONNX model \(no graph\)"
  bad bad_ir_version.onnx "not an ONNX model \(missing or invalid ir_version\)"
  bad local_function.onnx "model-local functions are not supported"
  bad sparse_initializer.onnx "sparse initializers are not supported"

  # Ops: unknown, arity, attributes, opset, subgraphs
  bad unknown_op.onnx "node 'foo_node': op 'FooBar' is not supported \(supported: [A-Za-z, ]*\bAdd\b[A-Za-z, ]*\bMatMul\b" --strict
  expect_ok "FooBar: foo_node" -- "$CLEAVE" inspect unknown_op.onnx
  bad too_few_inputs.onnx "node 'lonely_add' \(Add\): has 1 inputs"
  bad too_many_outputs.onnx "node 'relu_two_out' \(Relu\): has 2 outputs"
  bad required_input_omitted.onnx "node 'gemm_no_a' \(Gemm\): required input 0 is missing"
  bad concat_no_axis.onnx "node 'concat_no_axis' \(Concat\): .*attribute 'axis' is (required|missing)"
  bad cast_no_to.onnx "node 'cast_no_to' \(Cast\): required attribute 'to' is missing"
  bad constant_no_tensor.onnx "node 'const_bad'.*attribute 'value' has no tensor"
  bad opset_too_old.onnx "node 'expand_v7' \(Expand\): opset 7 is outside the supported range"
  bad subgraph_if.onnx "node 'branch' \(If\): attribute '(then|else)_branch' holds a subgraph"

  # Shapes
  bad add_mismatch.onnx "node 'add_2x3_4x5' \(Add\): cannot broadcast dimension"
  bad matmul_mismatch.onnx "node 'mm_3_vs_4' \(MatMul\): inner dimensions differ: 3 vs 4"
  bad gemm_mismatch.onnx "node 'gemm_k' \(Gemm\): inner dimensions differ"
  bad gemm_bias_mismatch.onnx "node 'gemm_c' \(Gemm\): C's dimension 7 does not broadcast to 4"
  bad reshape_mismatch.onnx "node 'reshape_6_to_4' \(Reshape\): cannot reshape 6 elements into 4"
  bad reshape_bad_target.onnx "node 'reshape_minus2' \(Reshape\): invalid target dimension -2"
  bad gather_out_of_range.onnx "node 'gather_oob' \(Gather\): index 5 is out of range"
  bad transpose_bad_perm.onnx "node 'bad_perm' \(Transpose\): perm is not a permutation"
  bad empty_list_attribute.onnx "node 'empty_perm' \(Transpose\): perm has 0 entries for rank 2"
  bad bad_axis.onnx "node 'softmax_axis9' \(Softmax\): axis 9 is out of range"

  # Clip, HardSigmoid, Pad and Split
  bad clip_nonscalar_min.onnx "node 'clip_vector_min' \(Clip\): min 'lo' must be a scalar"
  bad clip_int_bound.onnx "node 'clip_int64_min' \(Clip\): input 'lo' is int64 but 'x' is float32"
  bad clip_inputs_opset10.onnx "node 'clip_v10_inputs' \(Clip\): min and max are attributes before opset 11"
  bad hardsigmoid_int.onnx "node 'hardsigmoid_int64' \(HardSigmoid\): input 'x' is int64; a floating-point type is required"
  bad pad_pads_length.onnx "node 'pad_three_pads' \(Pad\): pads has 3 entries; a begin and an end for each of 2 axes \(4\) expected"
  bad pad_unknown_mode.onnx "node 'pad_mirror' \(Pad\): unknown mode 'mirror' \(constant, reflect, edge or wrap\)"
  bad pad_crop_too_much.onnx "node 'pad_crop_4_of_3' \(Pad\): pads -2 and -2 crop more than the 3 elements of axis 1"
  bad pad_int64_min.onnx "node 'pad_int64_min' \(Pad\): pad -9223372036854775808 on axis 1 is out of range"
  bad pad_reflect_too_far.onnx "node 'pad_reflect_3' \(Pad\): reflect padding by 3 on axis 1 needs more than 3 elements"
  bad pad_attr_missing.onnx "node 'pad_no_pads' \(Pad\): pads are missing"
  bad split_parts_sum.onnx "node 'split_2_2_of_5' \(Split\): the parts sum to 4 but axis 1 has length 5"
  bad split_parts_count.onnx "node 'split_2_parts_3_outputs' \(Split\): split has 2 parts for 3 outputs"
  bad split_unequal.onnx "node 'split_5_in_halves' \(Split\): axis 1 of length 5 does not split into 2 equal parts"
  bad split_no_num_outputs.onnx "node 'split18_bare' \(Split\): either the split input or attribute 'num_outputs' is required"

  # Training forms, refused by compile (inspect's training check says the same)
  bad_train dropout_mode_input.onnx "node 'dropout_mode_fed' \(Dropout\): ratio and training_mode must be constant scalars"
  bad_train dropout_ratio_one.onnx "node 'dropout_everything' \(Dropout\): ratio 1; training needs a ratio in \[0, 1\)"
  bad_train dropout_mask_read.onnx "node 'dropout_with_mask' \(Dropout\): its mask is read by 'mask_to_float'"
  bad_train bn_stats_read.onnx "node 'bn_reads_stats' \(BatchNormalization\): output 1 \('rmean'\) is read by add_running_mean"
  bad_train bn_one_value.onnx "node 'bn_batch_of_one' \(BatchNormalization\): training needs more than one value per channel, and a batch of this size gives 1" --batch 1

  # ConvTranspose, Resize and Upsample
  bad convt_channels.onnx "node 'convt_channels' \(ConvTranspose\): input has 4 channels but W has 3"
  bad convt_groups.onnx "node 'convt_groups' \(ConvTranspose\): W's 4 input channels do not divide into 3 groups"
  bad convt_pads_length.onnx "node 'convt_pads_length' \(ConvTranspose\): pads has 2 entries for 2 spatial dimensions"
  bad convt_output_padding.onnx "node 'convt_output_padding' \(ConvTranspose\): output_padding 2 on spatial axis 0 is not below its stride 2 or dilation 1"
  bad convt_auto_pad.onnx "node 'convt_auto_pad' \(ConvTranspose\): unknown auto_pad 'SAME' \(NOTSET, SAME_UPPER, SAME_LOWER or VALID\)"
  bad convt_pads_too_big.onnx "node 'convt_pads_too_big' \(ConvTranspose\): pads 3 and 3 leave nothing of the 3 outputs on spatial axis 0"
  bad convt_output_shape_before_start.onnx "node 'convt_output_shape_before_start' \(ConvTranspose\): output length 7 on spatial axis 0 needs padding before the start of the 5"
  bad resize_cubic.onnx "node 'resize_cubic' \(Resize\): mode 'cubic' is not supported \(nearest and linear are\)"
  bad resize_unknown_mode.onnx "node 'resize_unknown_mode' \(Resize\): unknown mode 'bilinear' \(nearest, linear or cubic\)"
  bad resize_tf_crop.onnx "node 'resize_tf_crop' \(Resize\): coordinate_transformation_mode 'tf_crop_and_resize' is not supported"
  bad resize_unknown_coordinates.onnx "node 'resize_unknown_coordinates' \(Resize\): unknown coordinate_transformation_mode 'corner'"
  bad resize_antialias.onnx "node 'resize_antialias' \(Resize\): antialias is not supported"
  bad resize_scales_and_sizes.onnx "node 'resize_scales_and_sizes' \(Resize\): only one of scales and sizes may be given"
  bad resize_no_scales.onnx "node 'resize_no_scales' \(Resize\): one of scales and sizes is required"
  bad resize_scales_count.onnx "node 'resize_scales_count' \(Resize\): scales has 3 entries for 4 axes"
  bad resize_scale_zero.onnx "node 'resize_scale_zero' \(Resize\): scale 0 on axis 2 is not a positive number"
  bad resize_sizes_float.onnx "node 'resize_sizes_float' \(Resize\): sizes 'z' is float32, not int64"
  bad resize_axes_repeated.onnx "node 'resize_axes_repeated' \(Resize\): axis 2 repeated"
  bad resize_linear_int.onnx "node 'resize_linear_int' \(Resize\): linear mode on int64 is not supported"
  bad upsample_shrinks.onnx "node 'upsample_shrinks' \(Upsample\): scale 0.5 on axis 2 is below 1 \(Upsample only enlarges\)"
  bad upsample_no_scales.onnx "node 'upsample_no_scales' \(Upsample\): the scales are missing"

  # Dtypes and tensor contents
  bad add_float_int64.onnx "node 'add_mixed' \(Add\): input 'b' is int64 but 'a' is float32"
  bad gather_float_indices.onnx "node 'gather_float_idx' \(Gather\): indices 'idx' are float32"
  bad raw_data_length.onnx "initializer 'w_raw': raw_data holds 10 bytes, the shape needs 24"
  bad float_data_count.onnx "initializer 'w_fd': float_data holds 5 values, the shape needs 6"
  bad int64_data_count.onnx "initializer 'w_i64': int64_data holds 2 values, the shape needs 3"
  bad string_tensor.onnx "initializer 'w_str': string tensors are not supported"
  bad complex_tensor.onnx "initializer 'w_c64': unsupported tensor data type 14"
  bad input_bad_elem_type.onnx "value 'x': unsupported element type 99"
  bad rank_too_high.onnx "initializer 'w_rank9': rank 9 exceeds the maximum 8"

  # Sizes
  bad huge_initializer.onnx "initializer 'w_huge': dimensions overflow the tensor size limit"
  bad big_without_data.onnx "initializer 'w_big': float_data holds 0 values, the shape needs 8589934592"
  # Declared inputs are bounded like inferred values, before any rule runs.
  bad huge_input.onnx "input 'x' is too large"
  bad huge_input.onnx "input 'x' is too large" --batch 3
  bad huge_matmul.onnx "node 'mm_huge' \(MatMul\): output 'y' is too large"
  bad negative_input_dim.onnx "value 'x': negative dimension -3"
  bad negative_initializer_dim.onnx "initializer 'w_neg': negative dimension -1"
  bad huge_reshape.onnx "input 'x' is too large"

  # Found by the fuzzer: rules that once crashed or overflowed on these.
  bad reshape_no_shape_input.onnx "node 'reshape_one_input' \(Reshape\): "
  bad omitted_required_output.onnx "node 'shape_no_output' \(Shape\): "
  bad pool_pads_overflow.onnx "node 'pool_huge_pads' \(MaxPool\): "
  bad conv_group_overflow.onnx "node 'conv_huge_group' \(Conv\): "
  bad concat_dim_overflow.onnx "input 'a' is too large"

  # External data
  bad ext_escape.onnx "initializer 'w_ext': external data location '\.\./escape\.bin' leaves the model's folder"
  bad ext_escape_nested.onnx "initializer 'w_ext': external data location 'sub/\.\./\.\./escape\.bin' leaves"
  bad ext_absolute.onnx "initializer 'w_ext': external data location '/etc/passwd' leaves the model's folder"
  bad ext_symlink.onnx "initializer 'w_ext': external data location 'link\.bin' resolves outside the model's folder"
  bad ext_missing.onnx "initializer 'w_ext': external data file 'no_such_weights\.bin' not found"
  bad ext_directory.onnx "initializer 'w_ext': external data file 'subdir' is not a readable regular file"
  bad ext_offset_past_end.onnx "initializer 'w_ext': external data offset 100 lies past the end of 'weights\.bin' \(24 bytes\)"
  bad ext_length_past_end.onnx "initializer 'w_ext': external data \[offset 8, length 24\] lies outside 'weights\.bin'"
  bad ext_length_short.onnx "initializer 'w_ext': external data holds 12 bytes, the shape needs 24"
  bad ext_big.onnx "initializer 'w_ext': external data holds 24 bytes, the shape needs 34359738368"
  bad ext_offset_garbage.onnx "initializer 'w_ext': external data offset '12abc' is not a non-negative integer"
  bad ext_offset_negative.onnx "initializer 'w_ext': external data offset '-4' is not a non-negative integer"
  bad ext_no_location.onnx "initializer 'w_ext': external data has no location"
  # The valid one loads from any working folder.
  checked="${checked}ext_ok.onnx "
  expect_ok "add_ext" -- "$CLEAVE" inspect ext_ok.onnx
  RUN_DIR=/
  expect_ok "add_ext" -- "$CLEAVE" inspect "$BAD/ext_ok.onnx" --batch 2
  expect 1 "^cleave: error: $WORK/bad/ext_escape\.onnx: .*leaves the model's folder" -- "$CLEAVE" inspect "$BAD/ext_escape.onnx"
  RUN_DIR=$BAD
fi

# A valid model with more tensors than one kernel takes: refused by name.
checked="${checked}wide_concat.onnx "
if [ -e "$BAD/wide_concat.onnx" ]; then
  expect 1 "node 'cat71' \\(Concat\\): more than 64 inputs and outputs are not compiled" -- \
    "$CLEAVE" compile "$BAD/wide_concat.onnx" -o "$OUTP" --batch 1 --loss mse
fi

# Cases make_bad_models.py wrote that no check above names: each must still
# fail cleanly with one line naming the file.
for f in "$BAD"/*.onnx; do
  [ -e "$f" ] || continue
  name=$(basename "$f")
  case "$checked" in
  *" $name "*) ;;
  *)
    echo "note: $name has no specific check"
    bad "$name" ""
    ;;
  esac
done

# ---- outputs never destroy inputs (common/out_file.c) ----------------------

# check LABEL CONDITION...: one pass or failure for a condition on files.
check() {
  local what=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $what"
  fi
}
OUTS=$WORK/outputs
rm -rf "$OUTS"
mkdir -p "$OUTS/folder"
cp "$MLP" "$OUTS/model.onnx"
model_sum=$(sha256sum <"$OUTS/model.onnx")
expect 2 "-o .*model.onnx: the same file as the model .*model.onnx; an output must not overwrite an input" -- \
  "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/../outputs/model.onnx"
expect 2 "--emit-plan .*model.onnx: the same file as the model" -- \
  "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/prog" --emit-plan "$OUTS/model.onnx"
expect 2 "--emit-plan .*prog: the same file as -o .*prog; give each output its own file" -- \
  "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/prog" --emit-plan "$OUTS/prog"
expect 2 "-o .*folder: is a folder; name the file to write" -- "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/folder"
expect 2 "-o /dev/null: a device or FIFO, where only a regular file will do" -- \
  "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o /dev/null
# Inputs that are FIFOs are refused at once, never waited on.
mkfifo "$OUTS/model.fifo" "$OUTS/cluster.fifo" "$OUTS/trace.fifo"
expect 1 "model.fifo: not a regular file \(a FIFO\)" -- "$CLEAVE" inspect "$OUTS/model.fifo"
expect 1 "cluster.fifo: not a regular file \(a FIFO\)" -- \
  "$CLEAVE" plan "$OUTS/model.onnx" --batch 8 --ranks 2 --cluster "$OUTS/cluster.fifo"
expect 1 "trace.fifo: not a regular file \(a FIFO\)" -- "$CLEAVE" trace-stats "$OUTS/trace.fifo"
# An output FIFO nobody reads is refused before calibrate measures anything.
mkfifo "$OUTS/cluster_out.fifo"
expect 1 "-o .*cluster_out.fifo: a FIFO with no reader: start its reader first" -- \
  timeout 10 "$CLEAVE" calibrate --quick -o "$OUTS/cluster_out.fifo"
check "a refused compile leaves the model as it was" [ "$(sha256sum <"$OUTS/model.onnx")" = "$model_sum" ]
# Planning a very wide data-parallel job takes bounded memory: 65,536
# ranks in 3 GB of address space (each rank's plan text is hashed on its
# own; all of it at once took about 10 GB).  Not under AddressSanitizer,
# which reserves more address space than that for itself.
if ldd "$CLEAVE" 2>/dev/null | grep -q libasan; then
  echo "SKIP: the address-space limit of a wide dp compile (an ASan build)"
  skipped=$((skipped + 1))
elif command -v prlimit >/dev/null; then
  run prlimit --as=3000000000 "$CLEAVE" compile "$OUTS/model.onnx" --batch 65536 --ranks 65536 --strategy dp \
    -o "$OUTS/wide_prog"
  check "a 65536-rank dp program compiles in 3 GB of address space (status $status: $err)" [ "$status" -eq 0 ]
  rm -f "$OUTS/wide_prog"
fi
# A failing linker: one line naming the program, no linker chatter, and
# nothing left behind; an unrelated PROG.o is never touched.
echo "someone's object" >"$OUTS/prog.o"
echo "an earlier program" >"$OUTS/prog"
CLEAVE_MPICC=false expect 1 "linking .*prog failed \(false \.\.\. .*libcleave_rt.a\)" -- \
  "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/prog"
check "a failed link leaves the earlier program as it was" [ "$(cat "$OUTS/prog")" = "an earlier program" ]
run "$CLEAVE" compile "$OUTS/model.onnx" --batch 8 -o "$OUTS/prog" --emit-plan "$OUTS/plan.json"
written=no
[ "$status" -eq 0 ] && [ -x "$OUTS/prog" ] && [ -s "$OUTS/plan.json" ] && written=yes
check "compile -o PROG --emit-plan: both written (status $status: $err)" [ "$written" = yes ]
check "compile leaves an existing PROG.o alone" [ "$(cat "$OUTS/prog.o")" = "someone's object" ]
check "compile leaves no temporaries ($(ls -A "$OUTS" | tr '\n' ' '))" \
  [ -z "$(find "$OUTS" -name '.*.tmp-*' -print -quit)" ]

# ---- a compiled program fed bad data ---------------------------------------

# A token id past the embedding's table, fed at run time: the program stops
# with status 1 and one line naming the model, the node and the index
# (cg_checked_index), before reading outside the table.
DATA=$BAD/bad_data
if [ -e "$DATA/embedding.onnx" ]; then
  RUN_DIR=$DATA
  run "$CLEAVE" compile embedding.onnx -o "$WORK/embedding.train" --batch 4 --loss ce
  if [ "$status" -eq 0 ]; then
    expect 1 "^embedding\.train: error: embedding\.onnx: node 'tok_embed' \(Gather\): index 7 is out of range for axis 0 of size 7$" -- \
      "$WORK/embedding.train" --data ids=ids_oob.npy --data labels=labels.npy --epochs 1
  else
    fail=$((fail + 1))
    echo "FAIL: compiling bad_data/embedding.onnx -> status $status$(crashed), stderr: $err"
  fi
  RUN_DIR=$BAD
fi

# ---- no input reaches an internal error ------------------------------------

# no_bug COMMAND...: the command compiles (0) or fails as the user's error
# (1, or 2 for usage) with one line "cleave: error: ..."; exit 70 or a crash
# fails the check.  Under ASan an allocation larger than any machine has
# returns NULL, as it does without ASan, instead of aborting (its warning
# line is dropped; any other sanitizer report still fails the check).
no_bug() {
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" run "$@"
  if grep -q "^==[0-9]*==WARNING: AddressSanitizer failed to allocate" "$WORK/stderr"; then
    grep -v "^==[0-9]*==WARNING: AddressSanitizer failed to allocate" "$WORK/stderr" >"$WORK/stderr.kept"
    mv "$WORK/stderr.kept" "$WORK/stderr"
    err=$(cat "$WORK/stderr")
  fi
  if [ "$status" -eq 0 ] || { { [ "$status" -eq 1 ] || [ "$status" -eq 2 ]; } &&
    [ "$(wc -l <"$WORK/stderr")" -eq 1 ] && printf '%s' "$err" | grep -q "^cleave: error: "; }; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $* -> status $status$(crashed), stderr: $(head -c 600 "$WORK/stderr")"
  fi
}

for f in "$BAD"/*.onnx; do
  [ -e "$f" ] || continue
  no_bug "$CLEAVE" compile "$(basename "$f")" -o "$WORK/bad_compiled" --batch 2
done

echo "$pass passed, $fail failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
[ "$fail" -eq 0 ]
