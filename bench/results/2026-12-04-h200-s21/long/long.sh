#!/usr/bin/env bash
# Twenty-first session: the multi-pass selection (70001 tokens) checked
# against the forward, for the radix select (bin/nsa-decode-bench) only.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/long.sh $R/
timeout 150 $A/bin/nsa-decode-bench --long-check --steps=4 --reps=5 --batches=1 128 > $R/nsa-decode-long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-long.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-long.jsonl)"; grep 70001 $R/nsa-decode-long.jsonl | head -3; grep '"pass": false' $R/nsa-decode-long.jsonl | head
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
