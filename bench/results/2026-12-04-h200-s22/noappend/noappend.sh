#!/usr/bin/env bash
# Twenty-second session: what the append launch costs a step at B = 1 (its
# body removed in bin/nsa-decode-bench-noappend: timing only, its checks fail).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/noappend.sh $R/
for i in 1 2 3; do
for V in new noappend; do
B=$A/bin/nsa-decode-bench; [ $V = noappend ] && B=$A/bin/nsa-decode-bench-noappend
timeout 60 $B --steps=2 --reps=500 --batches=1 128 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
tar -C /tmp -cf $OUT/results.tar r
