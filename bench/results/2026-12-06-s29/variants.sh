#!/usr/bin/env bash
# Twenty-ninth session: the merge by pushes (default) against the merge
# after a second cluster barrier (nopush), one binary
# (artifacts/nsa-decode-bench). Checks of CHECKS, memcheck of MEMCHECKS, A/B at 64k
# (B = 1, 64), 128 tokens and 8k, ncu kernel times (NCU_FLAGS), the trace
# (TRACE=1); everything tarred into one file.
set -u
B=${B:-artifacts/nsa-decode-bench}
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cat $R/gpu.txt
for v in ${CHECKS:-default q4}; do
  timeout 150 $B --variant=$v --reps=20 --batches=1,2,64 4097 65536 \
    > $R/check-$v.jsonl 2>> $R/errors.log
  echo "check $v rc=$? pass=$(grep -c '"pass": true' $R/check-$v.jsonl) fail=$(grep -c '"pass": false' $R/check-$v.jsonl)"
done
for v in ${MEMCHECKS:-default q4}; do
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    $B --variant=$v --steps=20 --reps=1 --batches=1,2 4096 \
    > $R/memcheck-$v.log 2>&1
  echo "memcheck $v rc=$? $(tail -1 $R/memcheck-$v.log)"
done
times() {
  grep '"variant"' "$1" | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' |
    tr '\n' ' '
}
for round in 1 2 3; do
  for v in nopush default; do
    timeout 90 $B --variant=$v --steps=1 --reps=300 --batches=1,64 65536 \
      > $R/ab-$v-$round.jsonl 2>> $R/errors.log
    echo "ab $v $round rc=$? $(times $R/ab-$v-$round.jsonl)"
  done
done
for v in nopush default; do
  timeout 90 $B --variant=$v --steps=1 --reps=300 --batches=1 128 8192 \
    > $R/short-$v.jsonl 2>> $R/errors.log
  echo "short $v rc=$? $(times $R/short-$v.jsonl)"
done
for L in 65536 128; do
  for v in nopush default; do
    timeout 120 ncu ${NCU_FLAGS-} --kernel-name regex:_cluster --launch-skip 20 \
      --launch-count 5 --metrics gpu__time_duration.sum $B \
      --variant=$v --steps=1 --reps=20 --batches=1 $L > $R/ncu-$v-$L.log 2>&1
    echo "ncu $v $L rc=$? $(grep gpu__time_duration $R/ncu-$v-$L.log | awk '{print $NF}' | tr '\n' ' ')"
  done
done
for L in $([ "${TRACE:-0}" = 1 ] && echo 128 65536); do
  timeout 60 $B --variant=trace --steps=1 --reps=5 --batches=1 $L > $R/trace-$L.log 2>&1
  python3 bench/trace.py $R/trace-$L.log > $R/trace-$L.txt
done
tar -C /tmp -czf $OUT/results.tgz r
