#!/usr/bin/env bash
# Twentieth session, last call (commit 879f9b2): GPU suites, the bench with
# SDPA decode in the same run, and the NSA_PDL=0 / NSA_GRAPHS=0 switches.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/last.sh $R/
for S in runtime mma layer; do
timeout 120 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$? $(tail -1 $R/gpu-$S.log)"
done
timeout 100 $A/bin/nsa-decode-bench --reps=300 --batches=1,64 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*.*hbm_fraction": [0-9.]*'
timeout 60 python3 $A/sdpa.py --decode 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
NSA_PDL=0 NSA_GRAPHS=0 timeout 60 $A/bin/nsa-decode-bench --steps=3 --reps=200 --batches=1 65536 > $R/nsa-decode-off.jsonl 2>>$R/errors.log; echo "off rc=$?"; grep '"variant"' $R/nsa-decode-off.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*'
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
