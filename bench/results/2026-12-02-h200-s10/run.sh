#!/usr/bin/env bash
# Tenth session, after the gpu.memcpy fix and the review: every GPU test,
# memcheck on the gradients, then cuDNN forward and forward + backward next
# to the layer's gradient in one run.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
for t in layer mma runtime gradient; do timeout 200 $A/gpu/nsa-gpu-$t-tests > $OUT/$t-tests.log 2>&1; echo "$t rc=$?"; tail -1 $OUT/$t-tests.log; done
grep -E "FAIL|grad_" $OUT/gradient-tests.log
for t in GradientPacked GradientPaperG16; do NSA_GPU_TEST_FILTER=$t timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests > $OUT/memcheck-$t.log 2>&1; echo "memcheck $t rc=$?"; tail -1 $OUT/memcheck-$t.log; done
python3 bench/sdpa.py 8192 65536 > $OUT/sdpa.jsonl 2>$OUT/sdpa.err; python3 bench/sdpa.py 8192 65536 --backward >> $OUT/sdpa.jsonl 2>>$OUT/sdpa.err; cat $OUT/sdpa.jsonl
timeout 60 $A/bin/nsa-bench 8192 --reps=3 --gradient > $OUT/nsa-grad.jsonl 2>$OUT/nsa.err; echo "grad 8k rc=$?"
timeout 150 $A/bin/nsa-bench 65536 --reps=1 --gradient >> $OUT/nsa-grad.jsonl 2>>$OUT/nsa.err; echo "grad 64k rc=$?"
cat $OUT/nsa-grad.jsonl
