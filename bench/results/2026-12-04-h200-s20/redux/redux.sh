#!/usr/bin/env bash
# Twentieth session: the selected kernel's list merge by redux.sync.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/redux.sh $R/
timeout 150 $A/bin/nsa-decode-bench --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$?"; grep -v kernel $R/nsa-decode.jsonl | grep -v '"pass": true'; grep -c '"pass": true' $R/nsa-decode.jsonl
for V in c64 q4 q16; do
timeout 60 $A/bin/nsa-decode-bench --variant=$V --steps=5 --reps=50 --batches=1 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "decode $V rc=$?"; grep -v kernel $R/nsa-decode-$V.jsonl | grep -v '"pass": true'; grep -c '"pass": true' $R/nsa-decode-$V.jsonl
done
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --steps=3 --reps=1 --batches=2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
NSA_GRAPHS=0 NSA_PDL=0 timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:decode_step --launch-skip 10 --launch-count 5 --metrics gpu__time_duration.sum --csv $A/bin/nsa-decode-bench --steps=1 --reps=1 --batches=1 65536 > $R/ncu-time.csv 2>&1; echo "ncu rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $R/ncu-time.csv | awk -F'","' '{print $1, $NF}'
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
