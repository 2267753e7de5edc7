#!/usr/bin/env bash
# Nineteenth session, last call: launches aiming at 528 blocks (t528)
# against the default at B = 64, and the gradient suite on the committed
# runtime (stream pool, shared-memory opt-in once per kernel).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/run.sh $R/
for V in default t528; do
timeout 60 $A/bin/nsa-decode-bench --variant=$V --reps=30 8192 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "decode $V rc=$?"; grep -v kernel $R/nsa-decode-$V.jsonl | grep -v check
done
/usr/bin/time -f "%e s" timeout 250 stdbuf -oL $A/gpu/nsa-gpu-gradient-tests > $R/gpu-gradient.log 2>&1; echo "gpu gradient rc=$?"; grep -E "PASS|FAIL|passed" $R/gpu-gradient.log | tail -14
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
