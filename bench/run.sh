#!/usr/bin/env bash
# The one benchmark entry point: runs named steps on a machine with a GPU
# over binaries built on the dev machine (build/bench, build/test/GPU,
# build/lib), each beside its yardstick (PyTorch SDPA's cuDNN dense
# attention) in the same run, and writes the card's current figures:
#   bench/run.sh [STEP...]            (default: forward gradient decode)
#   device tool: carry build/bench build/lib build/test/GPU, command:
#   bench/run.sh forward decode
# into $NSA_RESULTS (default: $OUT/<card> on the device machine, else
# bench/results/<card>), <card> being h100 or h200 from nvidia-smi:
#   results.json    every row the steps printed, with the card, commit,
#                   date and command
#   table.md        the tables docs/Benchmarks.md quotes
#   gpu.txt         the card, its clock, driver and memory
#   <step>.log      what a failed step printed on stderr
# Steps:
#   forward    nsa-bench: the paper, D128 and G4 layers; SDPA forward
#   branches   nsa-bench --branches: each branch's kernels, profiled
#   variants   nsa-bench: every pipeline variant bench/CMakeLists.txt builds
#   gradient   nsa-bench --gradient: training forward + gradient; SDPA's
#   decode     nsa-decode-bench: decode rows against the forward's, then
#              B = 1 and B = 64 steps; SDPA dense decode
#   memcheck   compute-sanitizer memcheck of 20 decoding steps
#   torch      bench/torch_op.py: the Python package's call against C's
#   tests      scripts/gpu-tests.sh (every GPU test binary, + memcheck) and
#              the Python package's GPU tests
# NSA_LENGTHS ("8192 65536") sets the forward and gradient lengths,
# NSA_DECODE_LENGTHS ("8192 65536") the decoding caches, NSA_REPS (5) the
# timed repetitions.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${NSA_BUILD_DIR:-$root/build}
lengths=${NSA_LENGTHS:-"8192 65536"}
decodeLengths=${NSA_DECODE_LENGTHS:-"8192 65536"}
reps=${NSA_REPS:-5}
steps=("$@")
((${#steps[@]})) || steps=(forward gradient decode)

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[[ -n $gpu ]] || { echo "bench/run.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
case $gpu in
  *H200*) card=h200 ;;
  *H100*) card=h100 ;;
  *) card=$(echo "$gpu" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-') ;;
esac
if [[ -n ${NSA_RESULTS:-} ]]; then out=$NSA_RESULTS
elif [[ -n ${OUT:-} ]]; then out=$OUT/$card
else out=$root/bench/results/$card; fi
mkdir -p "$out"
rm -f "$out"/*.log
# Each step's rows and stderr, until report.py merges them.
rows=$(mktemp -d)
trap 'rm -rf "$rows"' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total \
  --format=csv,noheader > "$out/gpu.txt"
export NSA_GPU=$gpu NSA_CARD=$card
export NSA_COMMAND="bench/run.sh ${steps[*]}"
export NSA_COMMIT=${NSA_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?)}
export PYTHONPATH=$build/lib/python${PYTHONPATH:+:$PYTHONPATH}
bench=$build/bench/nsa-bench
decodeBench=$build/bench/nsa-decode-bench
status=0

# `run STEP COMMAND...`: appends COMMAND's JSON lines to STEP.jsonl, its
# stderr to STEP.log (kept in $out where it failed), and says how it ended.
run() {
  local step=$1; shift
  echo "== $step: $*"
  "$@" >> "$rows/$step.jsonl" 2>> "$rows/$step.log"
  local rc=$?
  if ((rc != 0)); then
    status=1
    cp "$rows/$step.log" "$out/$step.log"
    echo "   exit $rc (see $out/$step.log)"; tail -3 "$out/$step.log"
  fi
}

step_forward() {
  run forward "$bench" --reps="$reps" --configs="(HQ" $lengths
  run forward python3 "$root/bench/sdpa.py" $lengths
}
step_branches() { run branches "$bench" --reps=1 --configs="(HQ" --branches $lengths; }
step_variants() { run variants "$bench" --reps="$reps" $lengths; }
step_gradient() {
  run gradient "$bench" --reps="$reps" --gradient $lengths
  run gradient python3 "$root/bench/sdpa.py" --backward $lengths
}
step_decode() {
  run decode "$decodeBench" --reps=20 --batches=1,2,64 --long-check 4097 65536
  local L
  for L in $decodeLengths; do
    run decode "$decodeBench" --steps=1 --reps=400 --batches=1 "$L"
    run decode "$decodeBench" --steps=1 --reps=100 --batches=64 "$L"
  done
  run decode python3 "$root/bench/sdpa.py" --decode $decodeLengths
}
step_memcheck() {
  echo "== memcheck: compute-sanitizer nsa-decode-bench"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$decodeBench" \
    --steps=20 --reps=1 --batches=1,2 4096 > "$rows/memcheck.log" 2>&1 ||
    { status=1; cp "$rows/memcheck.log" "$out/"; }
  tail -1 "$rows/memcheck.log"
}
step_torch() { run torch python3 "$root/bench/torch_op.py" --reps=100 $lengths; }
step_tests() {
  echo "== tests: scripts/gpu-tests.sh, test/Python/test_gpu.py"
  local log=$rows/tests.log ok=1
  OUT=$rows/tests "$root/scripts/gpu-tests.sh" > "$log" 2>&1 || ok=0
  NSA_PYTHON_DIR=$build/lib/python python3 "$root/test/Python/test_gpu.py" \
    >> "$log" 2>&1 || ok=0
  ((ok)) || { status=1; cp "$log" "$out/"; }
  grep -E "PASSED|FAILED|ERROR SUMMARY|^Ran |^OK|^FAILED" "$log" | tail -20
}

for step in "${steps[@]}"; do
  if ! declare -F "step_$step" >/dev/null; then
    echo "bench/run.sh: unknown step '$step' (forward branches variants" \
      "gradient decode memcheck torch tests)" >&2
    exit 2
  fi
  "step_$step"
done
python3 "$root/bench/report.py" "$rows" "$out" || status=1
exit $status
