#!/usr/bin/env bash
# Twenty-fifth session, call B: candidates on top of the fold (new):
# rel1 (_cluster releases its successor after its first barrier), rel0
# (at its start), dsm (rel1 + the merge through distributed shared
# memory); base = 1dc28f1. Checks of dsm, then A/B three times.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/s25b.sh $R/
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt; cat $R/gpu.txt
N=$A/bin/nsa-decode-bench-${CAND:-dsm}
timeout 120 $N --reps=20 --batches=1,2,64 65536 > $R/check.jsonl 2>>$R/errors.log; echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"; grep '"variant"' $R/check.jsonl | grep -o '"impl": "[a-z ,-]*".*"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
for V in q16; do
timeout 60 $N --variant=$V --steps=20 --reps=5 --batches=1 65536 > $R/$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/$V.jsonl) fail=$(grep -c '"pass": false' $R/$V.jsonl)"; grep -v '"near_ties": 0' $R/$V.jsonl | grep near_ties
done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
for i in 1 2; do for V in dsm rel1 "" base; do
B=$A/bin/nsa-decode-bench${V:+-$V}
timeout 60 $B --steps=1 --reps=300 --batches=1,64 65536 > $R/ab-${V:-new}-$i.jsonl 2>>$R/errors.log; echo "${V:-new} $i $(grep '"variant"' $R/ab-${V:-new}-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
head $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
