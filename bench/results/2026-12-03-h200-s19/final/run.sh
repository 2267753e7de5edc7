#!/usr/bin/env bash
# Nineteenth session, last call: the committed decode kernels. Checks
# (Tq 1, 4, 16 against the forward's last rows), memcheck, B = 1 and 64 at
# 128..64k (default; c64 at 8k and 64k), dense SDPA decode in the same run,
# ncu per kernel at 64k, and the GPU test suites (runtime, mma, layer,
# gradient) for the runtime changes.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R
cp $A/run.sh $R/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --reps=1 --batches=2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
timeout 200 $A/bin/nsa-decode-bench --reps=50 128 8192 16384 32768 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$?"; grep -v kernel $R/nsa-decode.jsonl
for V in c64 q4 q16; do
timeout 150 $A/bin/nsa-decode-bench --variant=$V --reps=20 8192 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "decode $V rc=$?"; grep -v kernel $R/nsa-decode-$V.jsonl
done
timeout 120 python3 $A/sdpa.py --decode 8192 16384 32768 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; cat $R/sdpa-decode.jsonl
for B in 1 64; do
timeout 120 ncu --cache-control none --clock-control none --kernel-name regex:decode_step --metrics gpu__time_duration.sum --csv $A/bin/nsa-decode-bench --reps=1 --batches=$B 65536 > $R/ncu-b$B.csv 2>&1; echo "ncu rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $R/ncu-b$B.csv | tail -5 | awk -F'","' '{print $1, $NF}'
done
for t in runtime mma layer gradient; do
/usr/bin/time -f "%e s" timeout 200 $A/gpu/nsa-gpu-$t-tests > $R/gpu-$t.log 2>&1; echo "gpu $t rc=$?"; tail -2 $R/gpu-$t.log
done
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
