#!/usr/bin/env bash
# Runs the GPU test binaries (built on the dev machine into build/test/GPU)
# on a machine with a GPU, e.g. the H200 through the device tool:
#   carry build/test/GPU, command: scripts/gpu-tests.sh
# Logs go to $OUT (or ./gpu-test-logs). Exit status: that of the tests.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${NSA_BUILD_DIR:-$root/build}
out=${OUT:-$root/gpu-test-logs}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
status=0
for t in "$build"/test/GPU/nsa-gpu-*-tests; do
  name=$(basename "$t")
  echo "== $name"
  "$t" 2>&1 | tee "$out/$name.log" || status=1
  if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer $name"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
      > "$out/$name.memcheck.log" 2>&1 || { status=1; tail -20 "$out/$name.memcheck.log"; }
    tail -2 "$out/$name.memcheck.log"
  fi
done
exit $status
