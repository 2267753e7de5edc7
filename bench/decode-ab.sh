#!/usr/bin/env bash
# Decoding A/B on the GPU machine: checks of the candidate variants of
# nsa-decode-bench against the forward, compute-sanitizer memcheck of them,
# then B = 1 and B = 64 steps at 64k tokens, the baseline and the
# candidates interleaved, ROUNDS times (one binary: the variants differ in
# their pipeline options only, bench/CMakeLists.txt). Writes one file a run
# and summary.txt to $OUT (or bench/results/latest).
#   device tool: carry build/bench (or a folder holding nsa-decode-bench
#   as NSA_DECODE_BENCH), command:
#   bench/decode-ab.sh "dsel q4dsel"
# BASE (default) names the baseline variant, ROUNDS (2) the A/B rounds
# (0: checks only), LENGTH (65536) the cache length of the A/B, NCU=0
# skips the ncu timing of the one-launch kernel.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/bench/results/latest}
bench=${NSA_DECODE_BENCH:-$root/build/bench/nsa-decode-bench}
candidates=${1:-dsel}
base=${BASE:-default}
length=${LENGTH:-65536}
mkdir -p "$out"
summary=$out/summary.txt
note() { echo "$*" | tee -a "$summary"; }
counts() {
  echo "pass=$(grep -c '"pass": true' "$1") fail=$(grep -c '"pass": false' "$1")"
}
times() {
  grep '"variant"' "$1" | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' |
    tr '\n' ' '
}
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for v in $candidates; do
  # B = 1, 2 take the one-launch step, B = 64 the split-K launches; the
  # lengths cover one and several selection spans and a cut tile.
  timeout 150 "$bench" --variant="$v" --reps=20 --batches=1,2,64 \
    4097 65536 > "$out/check-$v.jsonl" 2>> "$out/errors.log"
  note "check $v rc=$? $(counts "$out/check-$v.jsonl")"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bench" --variant="$v" --steps=20 --reps=1 --batches=1,2 4096 \
    > "$out/memcheck-$v.log" 2>&1
  note "memcheck $v rc=$? $(tail -1 "$out/memcheck-$v.log")"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in "$base" $candidates; do
    f=$out/ab-$v-$round.jsonl
    timeout 90 "$bench" --variant="$v" --steps=1 --reps=300 --batches=1,64 \
      "$length" > "$f" 2>> "$out/errors.log"
    note "ab $v round $round rc=$? $(times "$f")"
  done
done
# The one-launch kernel's own time (B = 1), without the launch gaps.
if [ "${NCU:-1}" != 0 ] && [ "${ROUNDS:-2}" != 0 ] &&
  command -v ncu > /dev/null; then
  for v in "$base" $candidates; do
    timeout 120 ncu --kernel-name regex:_cluster --launch-skip 20 \
      --launch-count 5 --metrics gpu__time_duration.sum "$bench" \
      --variant="$v" --steps=1 --reps=20 --batches=1 "$length" \
      > "$out/ncu-$v.log" 2>&1
    note "ncu $v rc=$? $(grep gpu__time_duration "$out/ncu-$v.log" |
      awk '{print $NF}' | tr '\n' ' ')"
  done
fi
