#!/usr/bin/env bash
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R
cp $A/run.sh $R/
timeout 200 $A/bin/nsa-decode-bench --reps=200 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>&1; echo "decode rc=$?"; grep -v kernel $R/nsa-decode.jsonl | grep -v '"pass": true' ; grep -c '"pass": true' $R/nsa-decode.jsonl
NSA_PDL=0 timeout 200 $A/bin/nsa-decode-bench --steps=3 --reps=200 --batches=1,64 128 65536 > $R/nsa-decode-nopdl.jsonl 2>&1; echo "nopdl rc=$?"; grep -v kernel $R/nsa-decode-nopdl.jsonl | grep -v '"pass": true'
NSA_GRAPHS=0 timeout 200 $A/bin/nsa-decode-bench --steps=3 --reps=200 --batches=1,64 128 65536 > $R/nsa-decode-direct.jsonl 2>&1; echo "direct rc=$?"; grep -v kernel $R/nsa-decode-direct.jsonl | grep -v '"pass": true'
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --steps=3 --reps=1 --batches=2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
tar -C /tmp -cf $OUT/results.tar r
