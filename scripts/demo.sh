#!/usr/bin/env bash
# README command 1: set up, build, and compile the paper's NSA layer
# (examples/paper_layer.mlir) through every stage the project has; where a
# GPU is present, run it there (scripts/demo-gpu.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
build=${NSA_BUILD_DIR:-$root/build}
"$build/bin/nsa-demo" "$root/examples/paper_layer.mlir" "$@"
if nvidia-smi -L >/dev/null 2>&1; then
  NSA_BUILD_DIR=$build "$root/scripts/demo-gpu.sh"
else
  echo "No GPU here: the GPU part (scripts/demo-gpu.sh) is skipped."
fi
