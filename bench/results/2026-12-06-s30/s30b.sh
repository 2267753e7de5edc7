#!/usr/bin/env bash
# Thirtieth session, call b: steps captured into the caller's graph
# (nsaLayerDecodeAsync on a capturing stream): checks (every third step
# captured), memcheck, and the times a step stream-ordered and captured.
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for v in default q4; do
  timeout 150 $N --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl) captured=$(grep '"mode": "captured"' $R/check-$v.jsonl | grep -c '"pass": true')"
done
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
times() {
  grep '"impl": "nsa decode, ' "$1" | grep -o '"impl": "nsa decode, [a-z-]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, //; s/"//g' | tr '\n' ' '
}
for round in 1 2 3; do
  timeout 150 $N --steps=1 --reps=400 --batches=1 65535 65536 8192 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 $round rc=$? $(times $R/b1-$round.jsonl)"
done
timeout 150 $N --steps=1 --reps=100 --batches=64 65536 \
  > $R/b64.jsonl 2>> $R/errors.log
echo "b64 rc=$? $(times $R/b64.jsonl)"
timeout 120 ncu --clock-control none --cache-control none \
  --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
  --metrics gpu__time_duration.sum $N --steps=1 --reps=20 \
  --batches=1 65535 > $R/ncu.log 2>&1
echo "ncu rc=$? $(grep gpu__time_duration $R/ncu.log | awk '{print $NF}' | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
