#!/usr/bin/env bash
# Twenty-second session: _cluster with 120 KB of shared memory a block (one
# block an SM) against HEAD (bin/nsa-decode-bench-regp).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/spread.sh $R/
N=$A/bin/nsa-decode-bench-spread
timeout 100 $N --steps=4 --reps=20 --batches=1 128 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"
for i in 1 2 3; do
for V in head spread; do
B=$A/bin/nsa-decode-bench-regp; [ $V = spread ] && B=$N
timeout 60 $B --steps=2 --reps=500 --batches=1 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
