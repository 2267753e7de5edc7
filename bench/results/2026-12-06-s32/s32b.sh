#!/usr/bin/env bash
# Thirty-second session, call b: the remembered calls' limits
# (NSA_GRAPH_CALLS, 512 by default, 32 before; NSA_GRAPH_MEMORY, 4096 MiB of
# workspace): B = 1 stream-ordered steps over 64 layers' caches in turn
# (--layers=64) with the defaults, with 32 calls and with 16 MiB; checks
# with the defaults and with calls dropped at once (NSA_GRAPH_CALLS=2
# NSA_GRAPH_MEMORY=1), the latter also under memcheck; a bad
# NSA_GRAPH_CALLS; B = 1 over 8k to 64k (two rounds); B = 64; SDPA.
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*\(, "enqueue_us": [0-9.]*\)\?' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}
timeout 150 $N --reps=20 --batches=1,2,64 4097 65536 > $R/check.jsonl 2>> $R/errors.log
echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"
timeout 150 env NSA_GRAPH_CALLS=2 NSA_GRAPH_MEMORY=1 $N --reps=20 --batches=1,2,64 4097 65536 \
  > $R/check-drop.jsonl 2>> $R/errors.log
echo "check drop rc=$? pass=$(grep -c '"pass": true' $R/check-drop.jsonl) fail=$(grep -c '"pass": false' $R/check-drop.jsonl)"
timeout 150 env NSA_GRAPH_CALLS=2 NSA_GRAPH_MEMORY=1 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck-drop.log 2>&1
echo "memcheck drop rc=$? $(tail -1 $R/memcheck-drop.log)"
for limits in default calls32 mem16; do
  case $limits in
    default) env=() ;;
    calls32) env=(NSA_GRAPH_CALLS=32) ;;
    mem16) env=(NSA_GRAPH_MEMORY=16) ;;
  esac
  timeout 150 env "${env[@]}" $N --steps=1 --reps=640 --batches=1 --layers=64 65535 \
    > $R/layers64-$limits.jsonl 2>> $R/errors.log
  echo "layers=64 $limits rc=$? $(times $R/layers64-$limits.jsonl)"
done
NSA_GRAPH_CALLS=lots timeout 60 $N --steps=1 --reps=20 --batches=1 4096 > $R/badenv.jsonl 2> $R/badenv.err
echo "bad NSA_GRAPH_CALLS rc=$? $(grep -c '"pass": true' $R/badenv.jsonl) $(head -c 300 $R/badenv.err)"
for round in 1 2; do
  timeout 80 $N --steps=1 --reps=400 --batches=1 65535 65536 8192 16384 32768 \
    > $R/b1-$round.jsonl 2>> $R/errors.log
  echo "b1 $round rc=$? $(times $R/b1-$round.jsonl)"
done
timeout 80 $N --steps=1 --reps=100 --batches=64 65536 > $R/b64.jsonl 2>> $R/errors.log
echo "b64 rc=$? $(times $R/b64.jsonl) $(grep -o '"hbm_fraction": [0-9.]*' $R/b64.jsonl | tr '\n' ' ')"
timeout 80 python3 bench/sdpa.py --decode 65536 > $R/sdpa.jsonl 2>> $R/errors.log
echo "sdpa rc=$? $(grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' $R/sdpa.jsonl | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
