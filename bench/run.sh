#!/usr/bin/env bash
# Times the nsa layer (build/bench/nsa-bench, built on the dev machine) and
# PyTorch SDPA cuDNN in the same run on the GPU machine; writes
# results.json and table.md to $OUT (or bench/results/latest).
#   device tool: carry build/bench, command:
#   NSA_COMMIT=<sha> bench/run.sh "8192 16384" "8192 16384 32768 65536"
# NSA_REPS (3) sets the timed repetitions, NSA_CONFIGS (all) picks the nsa
# configurations whose name contains it, NSA_BRANCHES=1 adds one profiled
# call per point that times each branch's kernels (nsaProfileBegin/End).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/bench/results/latest}
mkdir -p "$out"
nsaLengths=${1:-"8192 16384"}
sdpaLengths=${2:-"8192 16384 32768 65536"}
export NSA_GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 "$root/bench/sdpa.py" $sdpaLengths > "$out/sdpa.jsonl"
"$root/build/bench/nsa-bench" $nsaLengths --reps=${NSA_REPS:-3} \
  ${NSA_CONFIGS:+--configs="$NSA_CONFIGS"} ${NSA_BRANCHES:+--branches} > "$out/nsa.jsonl"
python3 "$root/bench/report.py" "$out" "$out/nsa.jsonl" "$out/sdpa.jsonl"
