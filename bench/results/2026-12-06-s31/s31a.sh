#!/usr/bin/env bash
# Thirty-first session, call a: a step at small B launched by the runtime
# itself with programmatic serialization (nsaRunGraph's single launches)
# against graph replays, in one binary: checks (every third step three
# times back to back), memcheck, the times a step three ways, interleaved:
#   pdl     - the default: single launches, programmatic serialization;
#   nopdl   - NSA_PDL=0: single launches, plain;
#   graphs  - NSA_SINGLE_LAUNCHES=0: graph replays (the runtime before).
set -u
N=artifacts/nsa-decode-bench
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
for v in default q4; do
  timeout 150 $N --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl) async=$(grep '"mode": "async"' $R/check-$v.jsonl | grep -c '"pass": true')"
done
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
times() {
  grep '"impl": "nsa decode, ' "$1" | grep -o '"impl": "nsa decode, [a-z-]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, //; s/"//g' | tr '\n' ' '
}
for round in 1 2; do
  for way in pdl nopdl graphs; do
    case $way in
      pdl) env=() ;;
      nopdl) env=(NSA_PDL=0) ;;
      graphs) env=(NSA_SINGLE_LAUNCHES=0) ;;
    esac
    timeout 100 env "${env[@]}" $N --steps=1 --reps=400 --batches=1 65535 65536 8192 \
      > $R/b1-$way-$round.jsonl 2>> $R/errors.log
    echo "b1 $way $round rc=$? $(times $R/b1-$way-$round.jsonl)"
  done
done
for way in pdl graphs; do
  [[ $way == graphs ]] && env=(NSA_SINGLE_LAUNCHES=0) || env=()
  timeout 100 env "${env[@]}" $N --steps=1 --reps=100 --batches=2,64 65536 \
    > $R/b64-$way.jsonl 2>> $R/errors.log
  echo "b2,64 $way rc=$? $(times $R/b64-$way.jsonl)"
done
timeout 100 python3 bench/sdpa.py --decode 65536 > $R/sdpa.jsonl 2>> $R/errors.log
echo "sdpa rc=$? $(tr '\n' ' ' < $R/sdpa.jsonl | cut -c1-400)"
timeout 100 ncu --clock-control none --cache-control none \
  --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
  --metrics gpu__time_duration.sum $N --steps=1 --reps=20 \
  --batches=1 65535 > $R/ncu.log 2>&1
echo "ncu rc=$? $(grep gpu__time_duration $R/ncu.log | awk '{print $NF}' | tr '\n' ' ')"
tar -C /tmp -czf $OUT/results.tgz r
