#!/usr/bin/env bash
# c64 check failures: repeat on new, nopush (pushed sums off), base (e4e6027).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/s24b.sh $R/
for i in 1 2; do
for V in new nopush np npr base; do
B=$A/bin/nsa-decode-bench; [ $V != new ] && B=$A/bin/nsa-decode-bench-$V
timeout 60 $B --variant=c64 --steps=4 --reps=5 --batches=1 65536 > $R/c64-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? pass=$(grep -c '"pass": true' $R/c64-$V-$i.jsonl) fail=$(grep -c '"pass": false' $R/c64-$V-$i.jsonl) $(grep -o '"kv_len": [0-9]*, "rel_l2": [0-9.e+-]*' $R/c64-$V-$i.jsonl | awk '{print $4}' | tr '\n' ' ')"
done; done
timeout 60 $A/bin/nsa-decode-bench-nopush --steps=4 --reps=5 --batches=1 65536 > $R/def-nopush.jsonl 2>>$R/errors.log; echo "def nopush pass=$(grep -c '"pass": true' $R/def-nopush.jsonl) fail=$(grep -c '"pass": false' $R/def-nopush.jsonl)"
N=$A/bin/nsa-decode-bench-np
timeout 60 $N --reps=100 --batches=1,64 128 65536 > $R/np-decode.jsonl 2>>$R/errors.log; echo "np decode pass=$(grep -c '"pass": true' $R/np-decode.jsonl) fail=$(grep -c '"pass": false' $R/np-decode.jsonl)"
for V in q4 q16 t264; do
timeout 60 $N --variant=$V --steps=4 --reps=5 --batches=1 65536 > $R/np-$V.jsonl 2>>$R/errors.log; echo "np $V pass=$(grep -c '"pass": true' $R/np-$V.jsonl) fail=$(grep -c '"pass": false' $R/np-$V.jsonl)"
done
timeout 120 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/np-long.jsonl 2>>$R/errors.log; echo "np long pass=$(grep -c '"pass": true' $R/np-long.jsonl) fail=$(grep -c '"pass": false' $R/np-long.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=3 --reps=1 --batches=1,2,64 4096 > $R/np-memcheck.log 2>&1; echo "np memcheck rc=$?"; tail -1 $R/np-memcheck.log
for i in 1 2; do for V in new np; do
B=$A/bin/nsa-decode-bench; [ $V != new ] && B=$A/bin/nsa-decode-bench-$V
timeout 60 $B --steps=2 --reps=500 --batches=1,64 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
head $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
