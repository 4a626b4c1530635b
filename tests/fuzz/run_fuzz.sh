#!/usr/bin/env bash
# Runs the front-end fuzzer for a while and reports in one line.
#
# usage: run_fuzz.sh BUILD_DIR SECONDS [libFuzzer flags...]
#
# BUILD_DIR is a tree configured with -DCLEAVE_FUZZ=ON (clang); the target
# is built if needed.  The corpus lives in BUILD_DIR/fuzz/corpus and grows
# from run to run; it is seeded from samples/*.onnx and the inputs
# tests/cli/make_bad_models.py writes.  Findings (crash-*, leak-*,
# timeout-*, oom-*) go to BUILD_DIR/fuzz/artifacts and the log to
# BUILD_DIR/fuzz/fuzz.log.  Prints one summary line on stdout (notes go to
# stderr) and exits 0 only when the run found nothing.
#
# Environment: FUZZ_MAX_LEN (default 65536) caps input size; larger seeds
# are left out.  PYTHON (default /usr/bin/python3) writes the bad models.
set -u
if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
SECONDS_WANTED=$2
shift 2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MAX_LEN=${FUZZ_MAX_LEN:-65536}
OUT=$BUILD/fuzz
CORPUS=$OUT/corpus
SEEDS=$OUT/seeds
ARTIFACTS=$OUT/artifacts
LOG=$OUT/fuzz.log

mkdir -p "$OUT"
if ! make -C "$BUILD" fuzz_onnx_load >"$OUT/build.log" 2>&1; then
  echo "run_fuzz: building fuzz_onnx_load in $BUILD failed (configure with CC=clang-16 -DCLEAVE_FUZZ=ON); see $OUT/build.log"
  exit 2
fi
FUZZER=$(find "$BUILD" -name fuzz_onnx_load -type f -perm -u+x | head -n 1)
if [ -z "$FUZZER" ]; then
  echo "run_fuzz: no fuzz_onnx_load executable under $BUILD"
  exit 2
fi

mkdir -p "$CORPUS" "$ARTIFACTS"
rm -rf "$SEEDS"
mkdir -p "$SEEDS/bad"
skipped=0
for f in "$SRC"/samples/*.onnx; do
  if [ "$(stat -c %s "$f")" -le "$MAX_LEN" ]; then cp "$f" "$SEEDS/"; else skipped=$((skipped + 1)); fi
done
if [ -x "$PYTHON" ]; then
  "$PYTHON" "$SRC/tests/cli/make_bad_models.py" "$SEEDS/bad" 2>"$OUT/make_bad_models.err"
  case $? in
  0) ;;
  77) echo "run_fuzz: $(head -n 1 "$OUT/make_bad_models.err"); seeding with byte-level cases only" >&2 ;;
  *) echo "run_fuzz: make_bad_models.py failed; see $OUT/make_bad_models.err" >&2 ;;
  esac
fi
# Only regular files are inputs; the external-data helpers (weights.bin,
# link.bin, subdir) are not models.
find "$SEEDS/bad" -mindepth 1 ! -name '*.onnx' -exec rm -rf {} + 2>/dev/null
find "$SEEDS/bad" -name '*.onnx' -size +"$MAX_LEN"c -delete
[ "$skipped" -gt 0 ] && echo "run_fuzz: left out $skipped sample(s) larger than $MAX_LEN bytes" >&2

# Dictionary: names the mutator cannot guess byte by byte.  Op names come
# from the op table, attribute names from its AttrSpec lists, so both stay
# current; the rest are ONNX keywords the loader looks at.
DICT=$OUT/onnx.dict
{
  grep -ohE 'X\([A-Za-z]+\)' "$SRC/compiler/ops/ops_list.h" | sed 's/X(\(.*\))/"\1"/'
  grep -ohE '\{"[A-Za-z_]+", ATTR_' "$SRC"/compiler/ops/*.c | sed 's/{"\(.*\)", ATTR_/"\1"/'
  printf '"%s"\n' location offset length weights.bin ../weights.bin ai.onnx value_float value_ints \
    value_floats value_int then_branch If FooBar N batch
} | sort -u >"$DICT"

# UBSan only stops (and so only counts as a finding) when told to, unless
# the build passed -fno-sanitize-recover.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

before=$(ls "$ARTIFACTS" | wc -l)
start=$(date +%s)
"$FUZZER" -max_total_time="$SECONDS_WANTED" -rss_limit_mb=2048 -timeout=10 -max_len="$MAX_LEN" \
  -print_final_stats=1 -dict="$DICT" -artifact_prefix="$ARTIFACTS/" "$@" "$CORPUS" "$SEEDS" "$SEEDS/bad" >"$LOG" 2>&1
status=$?
elapsed=$(($(date +%s) - start))

final_stat() { sed -n "s/^stat::$1: *//p" "$LOG" | tail -n 1; }
execs=$(final_stat number_of_executed_units)
rate=$(final_stat average_exec_per_sec)
rss=$(final_stat peak_rss_mb)
if [ -z "$execs" ]; then # -fork=N prints no final stats, only progress lines
  last=$(grep -E '^#[0-9]+: cov:' "$LOG" | tail -n 1)
  execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
  rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<<"$last")
fi
findings=$(($(ls "$ARTIFACTS" | wc -l) - before))
new=$(ls -t "$ARTIFACTS" | head -n "$((findings < 3 ? findings : 3))" | tr '\n' ' ')
[ "$findings" -gt 3 ] && new="$new..."
kind=$(grep -m 1 -oE "ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [a-z-]+|runtime error: .*|fuzz_onnx_load: .*" "$LOG")
if [ "$status" -ne 0 ] && [ "$findings" -eq 0 ]; then findings=1; fi

summary="fuzz_onnx_load: ${execs:-?} execs in ${elapsed}s (${rate:-?}/s, peak RSS ${rss:-?} MB), corpus $(ls "$CORPUS" | wc -l) files, $findings finding(s)"
if [ "$findings" -gt 0 ]; then
  echo "$summary: ${kind:-exit status $status} ${new:+[$new]}; log $LOG"
  exit 1
fi
echo "$summary"
