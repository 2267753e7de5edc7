#!/usr/bin/env bash
# Twenty-second session: the one-launch cluster step (_cluster) at small B.
# Checks, variants, long check, memcheck, A/B against v7, ncu kernel times.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/clu.sh $R/
N=$A/bin/nsa-decode-bench

timeout 150 $N --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"pass": false' $R/nsa-decode.jsonl | head -5; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*.*hbm_fraction": [0-9.]*'
for V in c64 q4 q16 t264; do
timeout 60 $N --variant=$V --steps=5 --reps=50 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl) $(grep '"variant"' $R/nsa-decode-$V.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done
for i in 1 2 3; do
for V in v7 new; do
B=$N; [ $V = v7 ] && B=$A/bin/nsa-decode-bench-v7
timeout 60 $B --steps=2 --reps=500 --batches=1 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=3 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
NSA_GRAPHS=0 NSA_PDL=0 timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:decode_step --launch-skip 4 --launch-count 4 --metrics gpu__time_duration.sum --csv $N --steps=1 --reps=1 --batches=1 65536 > $R/ncu-time.csv 2>&1; echo "ncu rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $R/ncu-time.csv | awk -F'","' '{print $1, $NF}'
timeout 120 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
cat $R/errors.log | head -20
tar -C /tmp -cf $OUT/results.tar r
