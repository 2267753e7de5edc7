#!/usr/bin/env bash
# Twenty-first session: the stream-ordered entry (nsaLayerDecodeAsync): GPU suites, the
# decode bench with torch SDPA decode in the same run, memcheck.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/async.sh $R/
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 150 $A/bin/nsa-decode-bench --reps=300 --batches=1,64 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
for V in c64 q4; do
timeout 60 $A/bin/nsa-decode-bench --variant=$V --steps=4 --reps=50 --batches=1 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl)"
done
NSA_GRAPHS=0 timeout 60 $A/bin/nsa-decode-bench --steps=4 --reps=50 --batches=1 65536 > $R/nsa-decode-nographs.jsonl 2>>$R/errors.log; echo "nographs rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-nographs.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-nographs.jsonl)"; grep '"variant"' $R/nsa-decode-nographs.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 90 python3 $A/sdpa.py --decode 8192 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --steps=3 --reps=1 --batches=2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
