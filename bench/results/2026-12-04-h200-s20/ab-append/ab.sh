#!/usr/bin/env bash
# Twentieth session: A/B in one call, interleaved: old (bin/nsa-decode-bench-old)
# against new (bin/nsa-decode-bench), B = 1, three runs each; then memcheck of new.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/ab.sh $R/
for i in 1 2 3; do
for V in old new; do
B=$A/bin/nsa-decode-bench; [ $V = old ] && B=$A/bin/nsa-decode-bench-old
timeout 60 $B --steps=2 --reps=500 --batches=1,64 8192 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --steps=3 --reps=1 --batches=2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log; grep -c "\"pass\": true" $R/ab-new-1.jsonl
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
