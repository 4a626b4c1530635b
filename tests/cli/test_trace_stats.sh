#!/usr/bin/env bash
# `cleave trace-stats` on traces written here by hand, whose busy, idle and
# bubble figures follow from the events by arithmetic (worked out next to
# each trace), and on broken traces: each of those must exit non-zero with
# exactly one line on stderr naming the file, and not crash.
#
# usage: test_trace_stats.sh CLEAVE WORKDIR
set -u
if [ $# -ne 2 ]; then
  echo "usage: $0 CLEAVE WORKDIR" >&2
  exit 2
fi
# Absolute, as the checks run from inside WORKDIR.
CLEAVE=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
WORK=$2
PYTHON=${CLEAVE_TEST_PYTHON:-/usr/bin/python3}
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
pass=0
fail=0
skipped=0 # checks that could not run (counted apart, never as passes)

# run COMMAND...: sets `status` and `err`; stdout goes to ./stdout.
run() {
  # The outer redirection drops bash's own "Segmentation fault" notice;
  # a crash shows in the status.
  { timeout -k 5 60 "$@" >stdout 2>stderr; } 2>/dev/null
  status=$?
  err=$(cat stderr)
}

ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  echo "FAIL: $*"
}

# expect STATUS PATTERN -- command...: exits with STATUS, stderr is one
# line matching PATTERN, nothing on stdout.
expect() {
  local want=$1 pattern=$2
  shift 3
  run "$@"
  if [ "$status" -eq "$want" ] && [ "$(wc -l <stderr)" -eq 1 ] && grep -qE -- "$pattern" stderr && [ ! -s stdout ]; then
    ok
  else
    bad "$* -> status $status (want $want), stderr: $err"
  fi
}

# expect_line PATTERN -- command...: exits 0, nothing on stderr, and some
# stdout line matches PATTERN (an extended regex).
expect_line() {
  local pattern=$1
  shift 2
  run "$@"
  if [ "$status" -eq 0 ] && [ -z "$err" ] && grep -qE -- "$pattern" stdout; then
    ok
  else
    bad "$* -> status $status, stderr: $err, no line matching '$pattern' in: $(cat stdout)"
  fi
}

# expect_json PYEXPR -- command...: exits 0 and PYEXPR holds of the JSON it
# printed, bound to j; near(a, b) compares floats.
expect_json() {
  local check=$1
  shift 2
  run "$@"
  if [ "$status" -ne 0 ] || [ -n "$err" ]; then
    bad "$* -> status $status, stderr: $err"
  elif ! "$PYTHON" -c '
import json, sys
def near(a, b): return abs(a - b) < 1e-9
j = json.load(open("stdout"))
sys.exit(0 if eval("(" + sys.argv[1] + ")") else 1)' "$check"; then
    bad "$*: not true of the output: $check; output: $(cat stdout)"
  else
    ok
  fi
}

# ---- a two-rank trace ------------------------------------------------------
#
# Times in microseconds; events in mixed order, as nothing promises
# otherwise.  Three steps per rank:
#
#   rank 0  step 1  [0, 20000)      forward 10000                 (warm-up)
#           step 2  [20000, 30000)  forward 2000 + 1000 (two segments of
#                                   "F 0"), backward 2000, update 1000:
#                                   busy 6000; recv 2500
#           step 3  [30000, 40000)  forward 3000, backward 3000: busy 6000;
#                                   send 1000, allreduce 2000
#   rank 1  step 1  [0, 20000)      forward 15000                 (warm-up)
#           step 2  [20000, 28000)  forward 4000, backward 4000: busy 8000
#           step 3  [30000, 42000)  forward 6000: busy 6000; 3000 of an
#                                   unknown category, which is not busy
#
# With --skip 1 (the default), steps 2 and 3:
#   rank 0  wall 20000, busy 12000, idle 8000, wait 3500, allreduce 2000,
#           bubble 0.4
#   rank 1  wall 20000, busy 14000, idle 6000, bubble 0.3
#   overall bubble (8000 + 6000) / 40000 = 0.35; mean step: step 2 slowest
#   10000, step 3 slowest 12000, mean 11000 = 11 ms
# With --skip 0, all three:
#   rank 0  wall 40000, busy 22000, bubble 0.45
#   rank 1  wall 40000, busy 29000, bubble 0.275
#   overall (18000 + 11000) / 80000 = 0.3625; mean step (20000 + 10000 +
#   12000) / 3 = 14000
# With --skip 2, step 3 alone: rank 0 bubble 0.4, rank 1 0.5, overall
# (4000 + 6000) / 22000, mean step 12000.
# With --skip 3 no rank has the 4 steps skipping needs: as --skip 0.
cat >two.json <<'EOF'
{"traceEvents": [
 {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "cleave program"}},
 {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "rank 1 (stage 1, replica 0)"}},
 {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0 (stage 0, replica 0)"}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": 30000, "dur": 6000},
 {"name": "step 3", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 30000, "dur": 12000, "args": {"step": 3}},
 {"name": "gc", "cat": "mystery", "ph": "X", "pid": 0, "tid": 1, "ts": 36000, "dur": 3000},
 {"name": "step 1", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 20000.0, "args": {"step": 1}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 10000.0},
 {"name": "step 2", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 20000, "dur": 10000, "args": {"step": 2}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 20000, "dur": 2000},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 23000, "dur": 1000},
 {"name": "B 0", "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": 24000, "dur": 2000},
 {"name": "update", "cat": "update", "ph": "X", "pid": 0, "tid": 0, "ts": 26000, "dur": 1000},
 {"name": "recv", "cat": "wait", "ph": "X", "pid": 0, "tid": 0, "ts": 27000, "dur": 2500},
 {"name": "mark", "ph": "i", "pid": 0, "tid": 0, "ts": 29000, "s": "t"},
 {"name": "step 3", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 30000, "dur": 10000, "args": {"step": 3}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 30000, "dur": 3000},
 {"name": "B 0", "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": 33000, "dur": 3000},
 {"name": "send", "cat": "wait", "ph": "X", "pid": 0, "tid": 0, "ts": 36000, "dur": 1000},
 {"name": "allreduce", "cat": "allreduce", "ph": "X", "pid": 0, "tid": 0, "ts": 37000, "dur": 2000},
 {"name": "step 1", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 20000, "args": {"step": 1}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 15000},
 {"name": "step 2", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 20000, "dur": 8000, "args": {"step": 2}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": 20000, "dur": 4000},
 {"name": "B 0", "cat": "backward", "ph": "X", "pid": 0, "tid": 1, "ts": 24000, "dur": 4000}
 ],
 "displayTimeUnit": "ms",
 "otherData": {"ranks": 2, "stages": 2, "microbatches": 4, "schedule": "1f1b", "steps_traced": 3}}
EOF

T="$CLEAVE trace-stats"
expect_line "^trace two\.json: 2 ranks, 2 stages, 4 microbatches, schedule 1f1b$" -- $T two.json
#            rank steps wall    busy    idle    wait   allreduce bubble
expect_line "^ +0 +2 +20\.000 +12\.000 +8\.000 +3\.500 +2\.000 +40\.0%$" -- $T two.json
expect_line "^ +1 +2 +20\.000 +14\.000 +6\.000 +0\.000 +0\.000 +30\.0%$" -- $T two.json
expect_line "^steps used: 2 \(the first 1 of each rank skipped as warm-up\)$" -- $T two.json
expect_line "^bubble 35\.0% \(idle / wall over all ranks\), mean step 11\.000 ms$" -- $T two.json
expect_line "^ +0 +3 +40\.000 +22\.000 +18\.000 .* 45\.0%$" -- $T two.json --skip 0
expect_line "^steps used: 3 \(--skip 0: none skipped\)$" -- $T two.json --skip 0
expect_line "mean step 14\.000 ms$" -- $T --skip 0 two.json
expect_line "^ +1 +1 +12\.000 +6\.000 +6\.000 .* 50\.0%$" -- $T two.json --skip 2
expect_line "^steps used: 3 \(none skipped: --skip 3 needs at least 4 steps per rank\)$" -- $T two.json --skip 3
expect_line "mean step 14\.000 ms$" -- $T two.json --skip 3

if [ ! -x "$PYTHON" ]; then
  echo "SKIP: $PYTHON not found; JSON output unchecked (6 checks)"
  skipped=$((skipped + 6))
else
  expect_json 'j["file"] == "two.json" and j["steps_used"] == 2 and near(j["bubble"], 0.35) and
near(j["mean_step_s"], 0.011) and j["stages"] == 2 and j["microbatches"] == 4 and j["schedule"] == "1f1b"' \
    -- $T two.json --format json
  expect_json '[r["rank"] for r in j["ranks"]] == [0, 1] and [r["steps"] for r in j["ranks"]] == [2, 2]' \
    -- $T two.json --format json
  expect_json 'near(j["ranks"][0]["wall_s"], 0.02) and near(j["ranks"][0]["busy_s"], 0.012) and
near(j["ranks"][0]["idle_s"], 0.008) and near(j["ranks"][0]["wait_s"], 0.0035) and
near(j["ranks"][0]["allreduce_s"], 0.002) and near(j["ranks"][0]["bubble"], 0.4)' -- $T two.json --format json
  expect_json 'near(j["ranks"][1]["busy_s"], 0.014) and near(j["ranks"][1]["wait_s"], 0) and
near(j["ranks"][1]["bubble"], 0.3)' -- $T two.json --format json
  expect_json 'j["steps_used"] == 3 and near(j["bubble"], 0.3625) and near(j["mean_step_s"], 0.014) and
near(j["ranks"][0]["bubble"], 0.45) and near(j["ranks"][1]["bubble"], 0.275)' -- $T two.json --format json --skip 0
  expect_json 'j["steps_used"] == 1 and near(j["bubble"], 10000 / 22000) and near(j["mean_step_s"], 0.012)' \
    -- $T two.json --skip 2 --format json
fi

# ---- steps without args.step are matched by order ---------------------------
#
# Skipping nothing: rank 0 steps 10000 and 4000 (busy 5000 + 4000), rank 1
# steps 6000 and 8000 (busy 6000 + 2000); slowest per step 10000 and 8000,
# mean 9000.  Rank 2 traced no step, so it is not a rank of the table.
cat >order.json <<'EOF'
{"traceEvents": [
 {"name": "step", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 10000},
 {"name": "step", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 10000, "dur": 4000},
 {"name": "step", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 6000},
 {"name": "step", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 6000, "dur": 8000},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 5000},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 10000, "dur": 4000},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 6000},
 {"name": "B 0", "cat": "backward", "ph": "X", "pid": 0, "tid": 1, "ts": 6000, "dur": 2000},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 2, "ts": 0, "dur": 2000}
]}
EOF
expect_line "^trace order\.json: 2 ranks$" -- $T order.json --skip 0
expect_line "^ +0 +2 +14\.000 +9\.000 +5\.000 .* 35\.7%$" -- $T order.json --skip 0
expect_line "^ +1 +2 +14\.000 +8\.000 +6\.000 .* 42\.9%$" -- $T order.json --skip 0
expect_line "mean step 9\.000 ms$" -- $T order.json --skip 0
# The default --skip 1 leaves the second steps: 4000 and 8000.
expect_line "mean step 8\.000 ms$" -- $T order.json

# ---- partial traces --------------------------------------------------------
#
# One rank of four traced; its second forward lies outside its only step
# and is ignored: busy 250 of 1000.  A step of no duration has bubble 0.
cat >partial.json <<'EOF'
{"traceEvents": [
 {"name": "step 7", "cat": "step", "ph": "X", "pid": 0, "tid": 3, "ts": 100.5, "dur": 1000, "args": {"step": 7}},
 {"name": "F 0", "cat": "forward", "ph": "X", "pid": 0, "tid": 3, "ts": 100.5, "dur": 250},
 {"name": "F 1", "cat": "forward", "ph": "X", "pid": 0, "tid": 3, "ts": 5000, "dur": 700}
], "otherData": {"ranks": 4}}
EOF
cat >zero.json <<'EOF'
{"traceEvents": [{"name": "step 1", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 5, "dur": 0}]}
EOF
expect_line "^trace partial\.json: 1 of 4 ranks$" -- $T partial.json
expect_line "^ +3 +1 +1\.000 +0\.250 +0\.750 .* 75\.0%$" -- $T partial.json
expect_line "^steps used: 1 \(none skipped: --skip 1 needs at least 2 steps per rank\)$" -- $T partial.json
if [ -x "$PYTHON" ]; then
  expect_json 'j["ranks"][0]["rank"] == 3 and near(j["bubble"], 0.75) and "stages" not in j and
"schedule" not in j' -- $T partial.json --format json
  expect_json 'j["bubble"] == 0 and j["ranks"][0]["bubble"] == 0 and j["mean_step_s"] == 0' -- $T zero.json --format json
fi

# A one-rank program without micro-batches traces its work as "compute":
# busy 700 of each 1000 step (bubble 0.3).  The runtime says when it had to
# drop events.
cat >single.json <<'EOF'
{"traceEvents": [
 {"name": "step 1", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1000, "args": {"step": 1}},
 {"name": "compute", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 700, "args": {"step": 1}},
 {"name": "step 2", "cat": "step", "ph": "X", "pid": 0, "tid": 0, "ts": 1000, "dur": 1000, "args": {"step": 2}},
 {"name": "compute", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 1100, "dur": 700, "args": {"step": 2}}
], "otherData": {"ranks": 1, "stages": 1, "microbatches": 1, "schedule": "single", "truncated": true}}
EOF
expect_line "^trace single\.json: 1 rank, 1 stage, 1 microbatch, schedule single$" -- $T single.json
expect_line "^ +0 +1 +1\.000 +0\.700 +0\.300 .* 30\.0%$" -- $T single.json
expect_line "^note: the trace is truncated" -- $T single.json
if [ -x "$PYTHON" ]; then
  expect_json 'near(j["bubble"], 0.3) and j["truncated"] is True and j["schedule"] == "single"' \
    -- $T single.json --format json
fi

# ---- errors ----------------------------------------------------------------

# trace NAME EVENTS: writes NAME.json with EVENTS (the contents of a JSON
# array) as its traceEvents.
trace() { printf '{"traceEvents": [%s]}\n' "$2" >"$1.json"; }
STEP='{"name": "step 1", "cat": "step", "ph": "X", "tid": 0, "ts": 0, "dur": 10}'

# Command line: status 2.
expect 2 "no trace file given" -- $T
expect 2 "no trace file given" -- $T --format json
expect 2 "unknown flag '--frob'" -- $T two.json --frob
expect 2 "unknown format 'xml'" -- $T two.json --format xml
expect 2 "--format needs text or json" -- $T two.json --format
expect 2 "--skip needs a non-negative integer" -- $T two.json --skip -1
expect 2 "--skip needs a non-negative integer" -- $T two.json --skip 1x
expect 2 "--skip needs a non-negative integer" -- $T two.json --skip
expect 2 "one trace at a time" -- $T two.json order.json
expect_line "^usage: cleave trace-stats FILE" -- $T two.json --help

# Files: status 1, naming the file.
mkdir -p adir
: >empty.json
head -c 300 two.json >truncated.json
echo 'step 1 took 10 ms' >text.json
expect 1 "^cleave: error: missing\.json: cannot open" -- $T missing.json
expect 1 "^cleave: error: adir: not a regular file" -- $T adir
expect 1 "^cleave: error: empty\.json: not JSON: line [0-9]+, column [0-9]+: " -- $T empty.json
expect 1 "^cleave: error: truncated\.json: not JSON: line 4, column [0-9]+: " -- $T truncated.json
expect 1 "^cleave: error: text\.json: not JSON: line 1, column [0-9]+: " -- $T text.json --format json

echo '[{"name": "step 1", "ph": "X"}]' >array.json
echo '{"traceEvents": {"name": "step 1"}}' >notarray.json
echo '{"otherData": {"ranks": 2}}' >noarray.json
for f in array notarray noarray; do
  expect 1 "^cleave: error: $f\.json: no traceEvents array$" -- $T $f.json
done
trace notobject "$STEP, 17"
expect 1 "^cleave: error: notobject\.json: traceEvents\[1\] is not an object$" -- $T notobject.json
trace nots "$STEP, "'{"name": "F 0", "cat": "forward", "ph": "X", "tid": 0, "dur": 3}'
expect 1 "^cleave: error: nots\.json: traceEvents\[1\] \(\"F 0\"\): an X event needs numeric ts and dur$" -- $T nots.json
trace stringts '{"name": "step 1", "cat": "step", "ph": "X", "tid": 0, "ts": "0", "dur": 10}'
expect 1 "^cleave: error: stringts\.json: traceEvents\[0\] \(\"step 1\"\): an X event needs numeric ts and dur$" \
  -- $T stringts.json
# Events of unknown categories are checked like the others.
trace nodur "$STEP, "'{"name": "?", "cat": "mystery", "ph": "X", "tid": 0, "ts": 3}'
expect 1 "^cleave: error: nodur\.json: traceEvents\[1\] \(\"\?\"\): an X event needs numeric ts and dur$" -- $T nodur.json
trace negdur "$STEP, "'{"name": "recv", "cat": "wait", "ph": "X", "tid": 0, "ts": 3, "dur": -2.5}'
expect 1 "^cleave: error: negdur\.json: traceEvents\[1\] \(\"recv\"\): negative dur -2\.5$" -- $T negdur.json
trace hugedur "$STEP, "'{"name": "F 0", "cat": "forward", "ph": "X", "tid": 0, "ts": 3, "dur": 1e300}'
expect 1 "^cleave: error: hugedur\.json: traceEvents\[1\] \(\"F 0\"\): ts or dur beyond" -- $T hugedur.json --format json
trace notid '{"name": "step 1", "cat": "step", "ph": "X", "ts": 0, "dur": 10}'
expect 1 "^cleave: error: notid\.json: traceEvents\[0\] \(\"step 1\"\): tid \(the rank\) is not an integer$" \
  -- $T notid.json
NOSTEP="no step events \(was it written by a program run with --trace\?\)$"
trace nosteps '{"name": "F 0", "cat": "forward", "ph": "X", "tid": 0, "ts": 0, "dur": 10}'
expect 1 "^cleave: error: nosteps\.json: $NOSTEP" -- $T nosteps.json
trace noevents ''
expect 1 "^cleave: error: noevents\.json: $NOSTEP" -- $T noevents.json
# A "step" that is not a complete ("X") event is no step.
trace instantstep '{"name": "step 1", "cat": "step", "ph": "i", "tid": 0, "ts": 0}'
expect 1 "^cleave: error: instantstep\.json: $NOSTEP" -- $T instantstep.json

echo "$pass passed, $fail failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
[ "$fail" -eq 0 ]
