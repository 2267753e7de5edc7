#!/usr/bin/env bash
# Twenty-second session: a globaltimer trace of the _cluster kernel (printf
# from thread 0 of the first KV head's cluster), one step a call.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/trace.sh $R/
for L in 128 65536; do
timeout 60 $A/bin/nsa-decode-bench-trace --steps=2 --reps=3 --batches=1 $L > $R/trace-$L.log 2>&1; echo "trace $L rc=$? pass=$(grep -c "\"pass\": true" $R/trace-$L.log) fail=$(grep -c "\"pass\": false" $R/trace-$L.log)"
done
tar -C /tmp -cf $OUT/results.tar r
