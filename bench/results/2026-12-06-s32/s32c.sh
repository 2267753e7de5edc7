#!/usr/bin/env bash
# Thirty-second session, call d: the remembered calls as a list with a hash
# (a call found and moved to the back without moving the others): checks
# with the defaults and with calls dropped at once (also under memcheck);
# B = 1 stream-ordered steps over 8, 64 and 256 layers' caches in turn
# (the host's time to enqueue a step: 5.5, 8.3 us at 8, 64 layers with the
# vector of call c); B = 1 over 8k to 64k (two rounds); B = 64.
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*\(, "enqueue_us": [0-9.]*\)\?' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}
timeout 150 $N --reps=20 --batches=1,2,64 --long-check 4097 65536 > $R/check.jsonl 2>> $R/errors.log
echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"
timeout 150 env NSA_GRAPH_CALLS=2 NSA_GRAPH_MEMORY=1 $N --reps=20 --batches=1,2,64 4097 65536 \
  > $R/check-drop.jsonl 2>> $R/errors.log
echo "check drop rc=$? pass=$(grep -c '"pass": true' $R/check-drop.jsonl) fail=$(grep -c '"pass": false' $R/check-drop.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
for layers in 8 64 256; do
  timeout 150 $N --steps=1 --reps=$((layers * 10)) --batches=1 --layers=$layers 65535 \
    > $R/layers$layers.jsonl 2>> $R/errors.log
  echo "layers=$layers rc=$? $(times $R/layers$layers.jsonl)"
done
for round in 1 2; do
  timeout 80 $N --steps=1 --reps=400 --batches=1 65535 65536 8192 16384 32768 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 $round rc=$? $(times $R/b1-$round.jsonl)"
done
timeout 80 $N --steps=1 --reps=100 --batches=64 65536 > $R/b64.jsonl 2>> $R/errors.log
echo "b64 rc=$? $(times $R/b64.jsonl) $(grep -o '"hbm_fraction": [0-9.]*' $R/b64.jsonl | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
