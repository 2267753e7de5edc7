#!/usr/bin/env bash
# Twenty-fourth session, first call: checks of the tree to commit (bulk
# copies in the split-K launches, pushed sums in _cluster, radix early exit)
# and what a step at B = 1 takes without the append launch (timing only).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/s24a.sh $R/
N=$A/bin/nsa-decode-bench
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 150 $N --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 90 python3 $A/sdpa.py --decode 128 8192 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 100 $N --steps=6 --reps=20 --batches=2,4,8 4096 65536 > $R/nsa-decode-b248.jsonl 2>>$R/errors.log; echo "b248 rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-b248.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-b248.jsonl)"
for V in c64 q4 q16 t264; do
timeout 60 $N --variant=$V --steps=4 --reps=30 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl)"
done
timeout 120 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=3 --reps=1 --batches=1,2,64 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
for i in 1 2 3; do
for V in new skip; do
B=$N; E=""; [ $V = skip ] && { B=$A/bin/nsa-decode-bench-skip; E=compress_append; }
NSA_X_SKIP=$E timeout 60 $B --steps=2 --reps=500 --batches=1 128 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
head $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
