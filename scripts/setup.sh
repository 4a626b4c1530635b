#!/usr/bin/env bash
# Installs every Debian package cleave needs to build, test and run its samples.
# Idempotent: packages already present are skipped, and `apt-get update` runs only
# when something must be installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  llvm-16-dev clang-16 libclang-rt-16-dev lld-16
  libprotobuf-c-dev protobuf-c-compiler
  libopenmpi-dev openmpi-bin
  check libsubunit-dev
  libonnx-dev
  zlib1g-dev
  libjansson-dev
  python3 python3-numpy python3-torch python3-torchvision python3-onnx
  libopenblas-dev python3-jsonschema
  dataset-fashion-mnist
)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# Node.js runs the ONNX Runtime interop tests; the machine image may bring its own
# node, which conflicts with Debian's npm package, so only install it when absent.
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nodejs npm
fi

# onnxruntime-node for the ONNX Runtime interop test.
bash "$(dirname "${BASH_SOURCE[0]}")/setup_node.sh"
