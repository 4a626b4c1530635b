#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with warnings as
# errors, runs every test, then again under AddressSanitizer and
# UndefinedBehaviorSanitizer, then the front-end fuzzer for a bounded time.
#   FUZZ_SECONDS (default 60) bounds the fuzzing; 0 skips it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/setup.sh

echo "== build (warnings are errors)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
echo "== tests"
(cd build && ctest --output-on-failure)

echo "== build with ASan+UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCLEAVE_WERROR=ON -DCLEAVE_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
echo "== tests under ASan+UBSan"
# CLEAVE_TEST_STRIDE: the forward conformance test compiles every 6th ONNX
# node test here (all of them in the plain run above), and py_cnn_train
# trains two of its nets (CLEAVE_CNN_MODELS), py_lm_train two of its
# transformers (CLEAVE_LM_MODELS), since ASan's
# allocator makes LLVM several times slower.
# Open MPI keeps memory from MPI_Init to exit: programs carry suppressions
# for its libraries (runtime/rt_main.c); the file here serves the same for
# the runtime's own tests.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  LSAN_OPTIONS=suppressions="$root/tests/runtime/lsan.supp":print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 CLEAVE_TEST_STRIDE=6 CK_TIMEOUT_MULTIPLIER=4 \
  CLEAVE_CNN_MODELS=cnn1d,unet CLEAVE_LM_MODELS=encoder,gpt \
  ctest --output-on-failure --timeout 3000)

# The CI fuzzing run is reproducible: a fixed seed and a fixed number of
# runs from the committed seeds (a fresh corpus), capped in time; longer,
# random runs are for developers (tests/fuzz/run_fuzz.sh BUILD SECONDS).
fuzz_seconds=${FUZZ_SECONDS:-300}
if [ "$fuzz_seconds" -gt 0 ] && [ -f tests/fuzz/run_fuzz.sh ]; then
  echo "== fuzzing the front end: ${FUZZ_RUNS:-60000} runs, seed ${FUZZ_SEED:-1}, at most ${fuzz_seconds}s"
  CC=clang-16 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCLEAVE_FUZZ=ON >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_onnx_load
  rm -rf build-fuzz/fuzz/corpus
  bash tests/fuzz/run_fuzz.sh build-fuzz "$fuzz_seconds" -seed="${FUZZ_SEED:-1}" -runs="${FUZZ_RUNS:-60000}"
fi
echo "== all tests passed"
