#!/usr/bin/env bash
# README command 1: set up, build, and compile the paper's NSA layer
# (examples/paper_layer.mlir) through every stage the project has.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
build=${NSA_BUILD_DIR:-$root/build}
exec "$build/bin/nsa-demo" "$root/examples/paper_layer.mlir" "$@"
