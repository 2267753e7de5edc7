#!/usr/bin/env bash
# Twenty-ninth session: phase stamps of the one-launch step (the trace
# variant: the default pipeline with flash-decode-trace=1), B = 1 at 128,
# 8k and 64k tokens; bench/trace.py tabulates the last launch.
set -u
B=${B:-artifacts/nsa-decode-bench}
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
for L in 128 8192 65536; do
  timeout 60 $B --variant=trace --steps=1 --reps=5 --batches=1 $L \
    > $R/trace-$L.log 2>&1
  echo "trace $L rc=$?"
  python3 bench/trace.py $R/trace-$L.log | tee $R/trace-$L.txt
done
tar -C /tmp -czf $OUT/results.tgz r
