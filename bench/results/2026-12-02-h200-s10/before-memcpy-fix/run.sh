#!/usr/bin/env bash
# Tenth session, final build: every GPU test, the gradient tests with
# memcheck, the paper layer's forward (unchanged kernels expected).
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
for t in layer mma runtime gradient; do timeout 200 $A/gpu/nsa-gpu-$t-tests > $OUT/$t-tests.log 2>&1; echo "$t rc=$?"; tail -1 $OUT/$t-tests.log; done
grep -E "FAIL|grad_" $OUT/gradient-tests.log
for t in GradientG1 GradientG4; do NSA_GPU_TEST_FILTER=$t timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests > $OUT/memcheck-$t.log 2>&1; echo "memcheck $t rc=$?"; tail -1 $OUT/memcheck-$t.log; done
timeout 100 $A/bin/nsa-bench 8192 65536 --reps=5 --configs="paper (HQ64" > $OUT/nsa.jsonl 2>$OUT/nsa.err; python3 -c "
import json
for l in open('$OUT/nsa.jsonl'):
  r=json.loads(l); print(r['config'][:26].ljust(26), r['T'], r['impl'][:34].ljust(34), r['ms'])
"
