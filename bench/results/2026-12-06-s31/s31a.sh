#!/usr/bin/env bash
# Thirty-first session, call a: a step at small B launched by the runtime
# itself with programmatic serialization (nsaRunGraph's single launches)
# against graph replays, in one binary, and the tournament select against
# the radix select in two: checks (every third step three times back to
# back), memcheck, the times a step four ways, interleaved:
#   pdl     - nsa-decode-bench (radix select): single launches,
#             programmatic serialization (the default);
#   tour    - nsa-decode-bench-tour: the same with the tournament select;
#   nopdl   - nsa-decode-bench, NSA_PDL=0: single launches, plain;
#   graphs  - nsa-decode-bench, NSA_SINGLE_LAUNCHES=0: graph replays (the
#             runtime before).
set -u
A=artifacts/nsa-decode-bench
T=artifacts/nsa-decode-bench-tour
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
check() {  # name binary variant
  timeout 120 $2 --variant=$3 --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$1.jsonl 2>> $R/errors.log
  echo "check $1 rc=$? pass=$(grep -c '"pass": true' $R/check-$1.jsonl) fail=$(grep -c '"pass": false' $R/check-$1.jsonl) async=$(grep '"mode": "async"' $R/check-$1.jsonl | grep -c '"pass": true')"
}
check pdl-default $A default
check tour-default $T default
check tour-q4 $T q4
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1
echo "memcheck tour rc=$? $(tail -1 $R/memcheck.log)"
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}
for round in 1 2; do
  for way in pdl tour nopdl graphs; do
    N=$A; env=()
    case $way in
      tour) N=$T ;;
      nopdl) env=(NSA_PDL=0) ;;
      graphs) env=(NSA_SINGLE_LAUNCHES=0) ;;
    esac
    timeout 80 env "${env[@]}" $N --steps=1 --reps=400 --batches=1 65535 65536 8192 \
      > $R/b1-$way-$round.jsonl 2>> $R/errors.log
    echo "b1 $way $round rc=$? $(times $R/b1-$way-$round.jsonl)"
  done
done
for way in pdl graphs; do
  [[ $way == graphs ]] && env=(NSA_SINGLE_LAUNCHES=0) || env=()
  timeout 80 env "${env[@]}" $A --steps=1 --reps=100 --batches=2,64 65536 \
    > $R/b64-$way.jsonl 2>> $R/errors.log
  echo "b2,64 $way rc=$? $(times $R/b64-$way.jsonl)"
done
timeout 80 python3 bench/sdpa.py --decode 65536 > $R/sdpa.jsonl 2>> $R/errors.log
echo "sdpa rc=$? $(tr '\n' ' ' < $R/sdpa.jsonl | cut -c1-300)"
for n in A T; do
  timeout 60 ncu --clock-control none --cache-control none \
    --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
    --metrics gpu__time_duration.sum ${!n} --steps=1 --reps=20 \
    --batches=1 65535 > $R/ncu-$n.log 2>&1
  echo "ncu $n rc=$? $(grep gpu__time_duration $R/ncu-$n.log | awk '{print $NF}' | tr '\n' ' ')"
done
tar -C /tmp -czf $OUT/results.tgz r
