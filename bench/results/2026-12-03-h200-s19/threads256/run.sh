#!/usr/bin/env bash
# Nineteenth session: decoding (issue 12) by the split-K flash kernels.
set -u
A=$(cd "$(dirname "$0")" && pwd)
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --reps=1 --batches=2 4096 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck.log
timeout 200 $A/bin/nsa-decode-bench --reps=50 128 8192 16384 32768 65536 > $OUT/nsa-decode.jsonl 2>>$OUT/errors.log; echo "decode rc=$?"; grep -v kernel $OUT/nsa-decode.jsonl
cat $OUT/errors.log
for B in 1 64; do
timeout 120 ncu --cache-control none --clock-control none --kernel-name regex:decode_step --metrics gpu__time_duration.sum --csv $A/bin/nsa-decode-bench --reps=1 --batches=$B 65536 > $OUT/ncu-b$B.csv 2>&1; echo "ncu rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $OUT/ncu-b$B.csv | tail -5 | awk -F'","' '{print $1, $NF}'
done
