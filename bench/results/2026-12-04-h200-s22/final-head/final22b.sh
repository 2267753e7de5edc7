#!/usr/bin/env bash
# Twenty-second session, last call on the submitted code (HEAD: _cluster,
# blank ties, lse first, register partials): GPU suites, the decode bench with torch SDPA decode in the same run,
# checks at B = 2 and 4, variants, NSA_GRAPHS=0, the long check, memcheck,
# A/B against v7, ncu kernel times at 128 and 64k tokens.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/final22b.sh $R/
N=$A/bin/nsa-decode-bench
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 150 $N --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 90 python3 $A/sdpa.py --decode 128 8192 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
timeout 100 $N --steps=6 --reps=20 --batches=2,4,8 4096 65536 > $R/nsa-decode-b248.jsonl 2>>$R/errors.log; echo "b248 rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-b248.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-b248.jsonl) $(grep '"variant"' $R/nsa-decode-b248.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
for V in c64 q4 q16 t264; do
timeout 60 $N --variant=$V --steps=4 --reps=50 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl) $(grep '"variant"' $R/nsa-decode-$V.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done
NSA_GRAPHS=0 timeout 60 $N --steps=4 --reps=50 --batches=1 65536 > $R/nsa-decode-nographs.jsonl 2>>$R/errors.log; echo "nographs rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-nographs.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-nographs.jsonl)"
timeout 120 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=3 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
for i in 1 2; do
for V in v7 new; do
B=$N; [ $V = v7 ] && B=$A/bin/nsa-decode-bench-v7
timeout 60 $B --steps=2 --reps=500 --batches=1 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
for L in 128 65536; do
NSA_GRAPHS=0 NSA_PDL=0 timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:decode_step --launch-skip 4 --launch-count 4 --metrics gpu__time_duration.sum --csv $N --steps=1 --reps=1 --batches=1 $L > $R/ncu-time-$L.csv 2>&1; echo "ncu $L rc=$?"
grep -o '"[a-z_0-9]*decode_step[a-z_0-9]*".*' $R/ncu-time-$L.csv | awk -F'","' '{print $1, $NF}'
done
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
