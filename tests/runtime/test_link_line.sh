#!/bin/sh
# Links the fake program's objects with the command line the compiler uses
# for generated programs, then runs the result.
# usage: LINK_FLAGS=... test_link_line.sh OUT LSAN_SUPPRESSIONS libcleave_rt.a libonnx_proto.a OBJECT...
# LINK_FLAGS holds the extra flags of a sanitizer build (may be empty).
set -eu
out=$1
supp=$2
rt=$3
onnx=$4
shift 4
# shellcheck disable=SC2086  # LINK_FLAGS is a word list
mpicc ${LINK_FLAGS:-} -o "$out" "$@" "$rt" "$onnx" -lprotobuf-c -ljansson -lz -lm -pthread
# Open MPI's own allocations are not leaks of the program (see lsan.supp).
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$supp:print_suppressions=0"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
"$out" --help > "$out.help"
grep -q "^usage: linked_program --data NAME=FILE" "$out.help"
grep -q "labels *int64 \[8\]" "$out.help"
echo "PASS: linked with mpicc and ran $out --help"
