#!/bin/sh
# Links the fake program's objects with the command line the compiler uses
# for generated programs, then runs the result.
# usage: test_link_line.sh OUT "EXTRA_FLAGS" libcleave_rt.a libonnx_proto.a OBJECT...
set -eu
out=$1
flags=$2
rt=$3
onnx=$4
shift 4
# shellcheck disable=SC2086  # flags is a word list
mpicc $flags -o "$out" "$@" "$rt" "$onnx" -lprotobuf-c -ljansson -lz -lm
"$out" --help > "$out.help"
grep -q "^usage: linked_program --data NAME=FILE" "$out.help"
grep -q "labels *int64 \[8\]" "$out.help"
echo "PASS: linked with mpicc and ran $out --help"
