#!/usr/bin/env bash
# Twenty-second session: _cluster with the merge's loads first. Bench, A/B
# against v7 and the first cluster build, a globaltimer trace.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/clu2.sh $R/
N=$A/bin/nsa-decode-bench
timeout 150 $N --reps=300 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"pass": false' $R/nsa-decode.jsonl | head -5; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*.*hbm_fraction": [0-9.]*'
for i in 1 2 3; do
for V in v7 new; do
B=$N; [ $V = v7 ] && B=$A/bin/nsa-decode-bench-v7
timeout 60 $B --steps=2 --reps=500 --batches=1 128 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
for L in 128 65536; do
timeout 60 $A/bin/nsa-decode-bench-trace --steps=2 --reps=3 --batches=1 $L > $R/trace-$L.log 2>&1; echo "trace $L rc=$?"
done
cat $R/errors.log | head -20
tar -C /tmp -cf $OUT/results.tar r
