#!/usr/bin/env bash
# Thirty-second session: the s31 head (single launches with programmatic
# serialization, tournament select) on whichever card comes, for an H200:
# checks with the long check (70,001 tokens: the selection's several
# passes), q4 and nopush, memcheck, the time a step at B = 1 over 8k to 64k
# (three rounds), graph replays (NSA_SINGLE_LAUNCHES=0) for comparison,
# B = 64, SDPA, ncu. The radix build runs only where it was carried.
set -u
N=artifacts/nsa-decode-bench
P=artifacts/nsa-decode-bench-radix
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
check() {  # name variant [flags]
  timeout 150 $N --variant=$2 --reps=20 --batches=1,2,64 "${@:3}" 4097 65536 \
    > $R/check-$1.jsonl 2>> $R/errors.log
  echo "check $1 rc=$? pass=$(grep -c '"pass": true' $R/check-$1.jsonl) fail=$(grep -c '"pass": false' $R/check-$1.jsonl)"
}
check default-long default --long-check
check q4 q4
check nopush nopush
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}
for round in 1 2 3; do
  timeout 80 $N --steps=1 --reps=400 --batches=1 65535 65536 8192 16384 32768 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 head $round rc=$? $(times $R/b1-$round.jsonl)"
done
if [[ -x $P ]]; then
  timeout 80 $P --steps=1 --reps=400 --batches=1 65535 65536 > $R/b1-radix.jsonl 2>> $R/errors.log
  echo "b1 radix rc=$? $(times $R/b1-radix.jsonl)"
fi
timeout 80 env NSA_SINGLE_LAUNCHES=0 $N --steps=1 --reps=400 --batches=1 65535 65536 > $R/b1-graphs.jsonl 2>> $R/errors.log
echo "b1 graphs rc=$? $(times $R/b1-graphs.jsonl)"
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
