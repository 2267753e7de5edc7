#!/usr/bin/env bash
# Thirtieth session, call a: the gap between back-to-back launches of a
# `_cluster`-shaped kernel by the ways a step could be enqueued
# (bench/micro/launch_gap.cu), and the submitted decoding step's times.
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for smem in 100000 200000; do
  for ns in 2000 18000; do
    artifacts/launch_gap --smem=$smem --ns=$ns | tee -a $R/launch_gap.jsonl
  done
done
times() {
  grep '"variant"' "$1" | grep -o '"L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '
}
for round in 1 2 3; do
  timeout 120 $N --steps=1 --reps=300 --batches=1 65535 65536 8192 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 $round rc=$? $(times $R/b1-$round.jsonl)"
done
timeout 120 ncu --clock-control none --cache-control none \
  --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
  --metrics gpu__time_duration.sum $N --steps=1 --reps=20 \
  --batches=1 65535 > $R/ncu.log 2>&1
echo "ncu rc=$? $(grep gpu__time_duration $R/ncu.log | awk '{print $NF}' | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
