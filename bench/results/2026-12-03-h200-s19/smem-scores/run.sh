#!/usr/bin/env bash
# Nineteenth session: decoding (issue 12) by the split-K flash kernels.
set -u
A=$(cd "$(dirname "$0")" && pwd)
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --reps=1 --batches=2 4096 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck.log
for V in default c64; do
timeout 200 $A/bin/nsa-decode-bench --variant=$V --reps=50 8192 16384 32768 65536 > $OUT/nsa-decode-$V.jsonl 2>>$OUT/errors.log; echo "decode $V rc=$?"; grep -v kernel $OUT/nsa-decode-$V.jsonl
done
cat $OUT/errors.log
for B in 1 64; do
timeout 120 ncu --kernel-name regex:decode_step --metrics gpu__time_duration.sum --csv $A/bin/nsa-decode-bench --reps=1 --batches=$B 65536 > $OUT/ncu-b$B.csv 2>&1; echo "ncu rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $OUT/ncu-b$B.csv | tail -6 | awk -F'","' '{print $1, $NF}'
done
