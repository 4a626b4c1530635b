#!/usr/bin/env bash
# Installs onnxruntime-node into tests/js for the ONNX Runtime interop test
# (tests/py/test_ort_interop.py).  Idempotent: does nothing when
# tests/js/node_modules/onnxruntime-node is already there.
#
# `npm install --ignore-scripts` is enough: the npm package ships the CPU
# binding (bin/napi-v6/linux/x64) itself; its install script only fetches the
# optional CUDA files from outside the npm registry, which we neither need nor
# can reach.  Without npm the interop test skips, so a missing npm is a note,
# not an error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JS="$ROOT/tests/js"

if [ -d "$JS/node_modules/onnxruntime-node" ]; then
  echo "setup_node: onnxruntime-node already installed in tests/js"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup_node: npm not found; skipping onnxruntime-node (the ONNX Runtime interop test will skip)"
  exit 0
fi

echo "setup_node: npm install --ignore-scripts in tests/js"
cd "$JS"
npm install --ignore-scripts --no-audit --no-fund
if node ort_run.js --check; then
  echo "setup_node: onnxruntime-node loads"
else
  echo "setup_node: onnxruntime-node installed but does not load; the interop test will fail" >&2
  exit 1
fi
