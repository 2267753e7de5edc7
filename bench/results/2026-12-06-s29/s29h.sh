#!/usr/bin/env bash
# Twenty-ninth session, last call: the submitted code (default) against
# nopush (the merge after a second cluster barrier) in one binary, B = 1,
# 2, 4 at 65535 (a step without an append) and 65536 (an append step: L %
# d == 0), B = 64 at 65536; SDPA dense decode in the same call; ncu.
set -u
B=${B:-artifacts/nsa-decode-bench}
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 150 $B --reps=20 --batches=1,2,64 4097 65536 > $R/check.jsonl 2>> $R/errors.log
echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"
times() {
  grep '"variant"' "$1" | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '
}
for round in 1 2 3; do
  for v in nopush default; do
    timeout 150 $B --variant=$v --steps=1 --reps=300 --batches=1,2,4 65535 65536 \
      > $R/ab-$v-$round.jsonl 2>> $R/errors.log
    echo "ab $v $round rc=$? $(times $R/ab-$v-$round.jsonl)"
  done
done
timeout 150 $B --steps=1 --reps=300 --batches=64 65536 > $R/b64.jsonl 2>> $R/errors.log
echo "b64 rc=$? $(grep '"variant"' $R/b64.jsonl | grep -o '"us": [0-9.]*[^}]*hbm_fraction": [0-9.]*' | tr '\n' ' ')"
timeout 60 python3 bench/sdpa.py --decode 65536 > $R/sdpa-decode.jsonl 2>> $R/errors.log
echo "sdpa rc=$? $(grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
for L in 65535 65536; do
  timeout 120 ncu --clock-control none --cache-control none \
    --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
    --metrics gpu__time_duration.sum $B --steps=1 --reps=20 \
    --batches=1 $L > $R/ncu-$L.log 2>&1
  echo "ncu $L rc=$? $(grep gpu__time_duration $R/ncu-$L.log | awk '{print $NF}' | tr '\n' ' ')"
done
tar -C /tmp -czf $OUT/results.tgz r
