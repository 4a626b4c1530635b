#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds cleave, compiles the sample MLP
# into a data-parallel training program for 2 MPI ranks and trains it on
# Fashion-MNIST for two epochs, reporting the test accuracy after each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)"

data=/usr/share/datasets/fashion-mnist
out=build/quickstart
mkdir -p "$out"
./build/cleave inspect samples/mlp.onnx --batch 64
./build/cleave compile samples/mlp.onnx -o "$out/mlp.train" --batch 64 --loss ce --optimizer adam --lr 0.001 \
  --ranks 2 --strategy dp
# Open MPI refuses to run as root unless told it is intended.
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 2 "$out/mlp.train" \
  --data input="$data/train-images-idx3-ubyte.gz" --data labels="$data/train-labels-idx1-ubyte.gz" \
  --eval-data input="$data/t10k-images-idx3-ubyte.gz" --eval-data labels="$data/t10k-labels-idx1-ubyte.gz" \
  --epochs 2 --shuffle 1 --metrics "$out/metrics.jsonl" --save "$out/mlp.trained.onnx" --check-replicas
