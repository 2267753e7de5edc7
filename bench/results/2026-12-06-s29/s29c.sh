#!/usr/bin/env bash
# Twenty-ninth session: traces, checks and a B = 1 A/B (default against
# nopush) of one binary; tarred into one file.
set -u
B=${B:-artifacts/nsa-decode-bench}
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for L in 128 65536; do
  timeout 60 $B --variant=trace --steps=1 --reps=5 --batches=1 $L \
    > $R/trace-$L.log 2>&1
  echo "trace $L rc=$?"
  python3 bench/trace.py $R/trace-$L.log | tee $R/trace-$L.txt
done
for v in ${CHECK:-default}; do
  timeout 150 $B --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl)"
done
times() {
  grep '"variant"' "$1" | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' |
    tr '\n' ' '
}
for round in 1 2; do
  for v in nopush default; do
    timeout 90 $B --variant=$v --steps=1 --reps=300 --batches=1 65536 128 \
      > $R/ab-$v-$round.jsonl 2>> $R/errors.log
    echo "ab $v $round rc=$? $(times $R/ab-$v-$round.jsonl)"
  done
done
tar -C /tmp -czf $OUT/results.tgz r
