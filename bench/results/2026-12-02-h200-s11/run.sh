#!/usr/bin/env bash
# Eleventh session, final: every GPU test (the gradients twice each, bitwise),
# memcheck on the gradients, then cuDNN forward and forward + backward next
# to the layer's gradient (flash gradient kernels) in one run.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in gradient layer mma runtime; do timeout 240 $A/gpu/nsa-gpu-$t-tests > $OUT/$t-tests.log 2>&1; echo "$t rc=$?"; tail -1 $OUT/$t-tests.log; done
for t in GradientG1 GradientG4Chunked GradientPacked GradientPaperG16; do NSA_GPU_TEST_FILTER=$t timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests > $OUT/memcheck-$t.log 2>&1; echo "memcheck $t rc=$?"; tail -1 $OUT/memcheck-$t.log; done
python3 bench/sdpa.py 8192 65536 > $OUT/sdpa.jsonl 2>$OUT/sdpa.err; python3 bench/sdpa.py 8192 65536 --backward >> $OUT/sdpa.jsonl 2>>$OUT/sdpa.err; cat $OUT/sdpa.jsonl
timeout 60 $A/bin/nsa-bench 8192 --reps=5 --gradient --branches > $OUT/nsa-grad.jsonl 2>$OUT/nsa.err; echo "grad 8k rc=$?"
timeout 150 $A/bin/nsa-bench 65536 --reps=5 --gradient --branches >> $OUT/nsa-grad.jsonl 2>>$OUT/nsa.err; echo "grad 64k rc=$?"
grep -v "nsa kernel" $OUT/nsa-grad.jsonl | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
