#!/usr/bin/env bash
# Twenty-fifth session, call A: the appends folded into _cluster. Pull
# microbenchmark, GPU suites, checks (default, variants, long), memcheck,
# A/B against base (1dc28f1).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/s25a.sh $R/
N=$A/bin/nsa-decode-bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
timeout 60 $A/bin/decode_pull > $R/pull.md 2>&1; echo "pull rc=$?"; cat $R/pull.md
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 150 $N --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
for V in c64 q4 q16 t264; do
timeout 60 $N --variant=$V --steps=20 --reps=20 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl)"
done
timeout 100 $N --steps=20 --reps=20 --batches=2,4,8 4096 65536 > $R/nsa-decode-b248.jsonl 2>>$R/errors.log; echo "b248 rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-b248.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-b248.jsonl)"
timeout 120 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
for i in 1 2; do for V in new base; do
B=$N; [ $V != new ] && B=$A/bin/nsa-decode-bench-$V
timeout 60 $B --steps=2 --reps=500 --batches=1,64 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
head $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
