#!/usr/bin/env bash
# Nineteenth session: decoding (issue 12) by the split-K flash kernels.
set -u
A=$(cd "$(dirname "$0")" && pwd)
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --reps=1 --batches=2 4096 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -12 $OUT/memcheck.log
timeout 240 $A/bin/nsa-decode-bench --reps=20 8192 16384 32768 65536 > $OUT/nsa-decode.jsonl 2>$OUT/errors.log; echo "decode rc=$?"; cat $OUT/nsa-decode.jsonl; cat $OUT/errors.log
