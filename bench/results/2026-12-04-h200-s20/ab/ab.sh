#!/usr/bin/env bash
# Twentieth session: A/B of the selected kernel's list merge (old: xor
# shuffles, new: redux.sync), interleaved in one call.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/ab.sh $R/
for i in 1 2 3; do
for V in old new; do
B=$A/bin/nsa-decode-bench; [ $V = old ] && B=$A/bin/nsa-decode-bench-old
timeout 60 $B --steps=1 --reps=500 --batches=1 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep -v check $R/ab-$V-$i.jsonl | grep -o '"L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
