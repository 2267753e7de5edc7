#!/usr/bin/env bash
# Twenty-second session: the lse loads before the staging copies in _cluster
# (bin/nsa-decode-bench-lse); the GPU suites of HEAD first.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/lse.sh $R/
N=$A/bin/nsa-decode-bench-lse
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 150 $N --reps=100 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"pass": false' $R/nsa-decode.jsonl | head -3; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '; echo
timeout 100 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
for i in 1 2 3; do
for V in cur lse; do
B=$A/bin/nsa-decode-bench; [ $V = lse ] && B=$N
timeout 60 $B --steps=2 --reps=500 --batches=1 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=2 --reps=1 --batches=1 128 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
