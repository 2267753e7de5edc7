#!/usr/bin/env bash
# Twenty-ninth session: a candidate build (artifacts/nsa-decode-bench, N)
# against the build before it (artifacts/nsa-decode-bench-prev, P), both
# default variant: checks, memcheck, three B = 1 A/B rounds at LENGTHS,
# ncu at 65536, the trace (README: which commits each folder compared).
set -u
N=artifacts/nsa-decode-bench P=artifacts/nsa-decode-bench-prev
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in default q4; do
  timeout 150 $N --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl)"
done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
times() {
  grep '"variant"' "$1" | grep -o '"L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '
}
for round in 1 2 3; do
  for b in P N; do
    timeout 120 ${!b} --steps=1 --reps=300 --batches=1 ${LENGTHS:-65535 65536 128 8192} \
      > $R/ab-$b-$round.jsonl 2>> $R/errors.log
    echo "ab $b $round rc=$? $(times $R/ab-$b-$round.jsonl)"
  done
done
for b in P N; do
  timeout 120 ncu --clock-control none --cache-control none \
    --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
    --metrics gpu__time_duration.sum ${!b} --steps=1 --reps=20 \
    --batches=1 65536 > $R/ncu-$b.log 2>&1
  echo "ncu $b rc=$? $(grep gpu__time_duration $R/ncu-$b.log | awk '{print $NF}' | tr '\n' ' ')"
done
timeout 60 $N --variant=trace --steps=1 --reps=5 --batches=1 65536 \
  > $R/trace-65536.log 2>&1
python3 bench/trace.py $R/trace-65536.log | tee $R/trace-65536.txt
gzip $R/trace-65536.log
tar -C /tmp -czf $OUT/results.tgz r
