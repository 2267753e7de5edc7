#!/usr/bin/env bash
# Thirty-third session: the head (de5d905: the graph cache's policy in
# CallCache.h) on whichever card comes, for an H200. Checks (--long-check;
# calls dropped at once), memcheck, B = 1 stream-ordered over 8k to 64k
# (three rounds), over 64 layers' caches, B = 64, SDPA, ncu of `_cluster`.
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
source bench/decode_times.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 150 $N --reps=20 --batches=1,2,64 --long-check 4097 65536 > $R/check.jsonl 2>> $R/errors.log
echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"
timeout 150 env NSA_GRAPH_CALLS=2 NSA_GRAPH_MEMORY=1 $N --reps=20 --batches=1,2,64 4097 65536 \
  > $R/check-drop.jsonl 2>> $R/errors.log
echo "check drop rc=$? pass=$(grep -c '"pass": true' $R/check-drop.jsonl) fail=$(grep -c '"pass": false' $R/check-drop.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
for round in 1 2 3; do
  timeout 80 $N --steps=1 --reps=400 --batches=1 65535 65536 8192 16384 32768 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 $round rc=$? $(times $R/b1-$round.jsonl)"
done
timeout 150 $N --steps=1 --reps=640 --batches=1 --layers=64 65535 65536 \
  > $R/layers64.jsonl 2>> $R/errors.log
echo "layers=64 rc=$? $(times $R/layers64.jsonl)"
timeout 80 $N --steps=1 --reps=100 --batches=64 65536 > $R/b64.jsonl 2>> $R/errors.log
echo "b64 rc=$? $(times $R/b64.jsonl) $(grep -o '"hbm_fraction": [0-9.]*' $R/b64.jsonl | tr '\n' ' ')"
timeout 80 python3 bench/sdpa.py --decode 8192 65536 > $R/sdpa.jsonl 2>> $R/errors.log
echo "sdpa rc=$? $(grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' $R/sdpa.jsonl | tr '\n' ' ')"
timeout 60 ncu --clock-control none --cache-control none \
  --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
  --metrics gpu__time_duration.sum $N --steps=1 --reps=20 \
  --batches=1 65535 > $R/ncu.log 2>&1
echo "ncu rc=$? $(grep gpu__time_duration $R/ncu.log | awk '{print $NF}' | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
