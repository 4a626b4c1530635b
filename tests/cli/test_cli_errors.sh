#!/usr/bin/env bash
# Command-line behaviour of `cleave`: exit codes and one-line errors.
# usage: test_cli_errors.sh CLEAVE WORKDIR
set -u
CLEAVE=$1
WORK=$2
mkdir -p "$WORK"
pass=0
fail=0

# expect STATUS PATTERN -- command...: the command exits with STATUS and its
# stderr is one line matching PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  local err status
  err=$("$@" 2>&1 >/dev/null)
  status=$?
  if [ "$status" -eq "$want" ] && printf '%s' "$err" | grep -qE -- "$pattern" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $* -> status $status (want $want), stderr: $err"
  fi
}

expect 2 "unknown command" -- "$CLEAVE" frobnicate
expect 2 "no model given" -- "$CLEAVE" inspect
expect 2 "--batch needs a positive integer" -- "$CLEAVE" inspect x.onnx --batch 0
expect 1 "missing.onnx: cannot open" -- "$CLEAVE" inspect "$WORK/missing.onnx"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
