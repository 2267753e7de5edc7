#!/usr/bin/env bash
# Twenty-ninth session: the owners wait for the window's pushes and the
# selected splits' on two mbarriers (default) against nopush; checks,
# memcheck, B = 1 A/B at 64k (an append step: 65536, L % d == 0) and at
# steps without an append (65537, 65544), 128 and 8k, ncu, trace.
set -u
B=${B:-artifacts/nsa-decode-bench}
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in default q4; do
  timeout 150 $B --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl)"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    $B --variant=$v --steps=20 --reps=1 --batches=1,2 4096 \
    > $R/memcheck-$v.log 2>&1
  echo "memcheck $v rc=$? $(tail -1 $R/memcheck-$v.log)"
done
times() {
  grep '"variant"' "$1" | grep -o '"L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '
}
for round in 1 2 3; do
  for v in nopush default; do
    timeout 120 $B --variant=$v --steps=1 --reps=300 --batches=1 \
      65536 65537 65544 128 8192 > $R/ab-$v-$round.jsonl 2>> $R/errors.log
    echo "ab $v $round rc=$? $(times $R/ab-$v-$round.jsonl)"
  done
done
for L in 65536 65537; do
  for v in nopush default; do
    timeout 120 ncu --clock-control none --cache-control none \
      --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
      --metrics gpu__time_duration.sum $B --variant=$v --steps=1 --reps=20 \
      --batches=1 $L > $R/ncu-$v-$L.log 2>&1
    echo "ncu $v $L rc=$? $(grep gpu__time_duration $R/ncu-$v-$L.log | awk '{print $NF}' | tr '\n' ' ')"
  done
done
for L in 65536 65537; do
  timeout 60 $B --variant=trace --steps=1 --reps=5 --batches=1 $L \
    > $R/trace-$L.log 2>&1
  python3 bench/trace.py $R/trace-$L.log > $R/trace-$L.txt
done
cat $R/trace-65537.txt
tar -C /tmp -czf $OUT/results.tgz r
