#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds cleave, and runs the main job
# on a sample model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)"
./build/cleave inspect samples/mlp.onnx --batch 64
