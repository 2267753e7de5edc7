#!/usr/bin/env bash
# Twelfth session: every GPU test (the training path: saved state, checked
# entries), memcheck on two gradient cases, the Python package's GPU tests
# (autograd), then cuDNN forward and forward + backward next to the layer's
# gradient (recomputing and from the saved state) in one run.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in gradient layer runtime; do echo "== $t" >> $OUT/tests.log; /usr/bin/time -f "%e s" timeout 300 $A/gpu/nsa-gpu-$t-tests >> $OUT/tests.log 2>&1; echo "$t rc=$?"; tail -2 $OUT/tests.log; done
for t in GradientPackedLearnedPool GradientPaperG16; do echo "== $t" >> $OUT/memcheck.log; NSA_GPU_TEST_FILTER=$t timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests >> $OUT/memcheck.log 2>&1; echo "memcheck $t rc=$?"; tail -1 $OUT/memcheck.log; done
(cd test/Python && NSA_GPU_TESTS_QUICK=1 NSA_PYTHON_DIR=$A/python timeout 200 python3 test_gpu.py > $OUT/python-gpu.log 2>&1; echo "python-gpu rc=$?"; grep -E "^  |Ran|OK|FAIL|Error" $OUT/python-gpu.log | tail -30)
python3 bench/sdpa.py 8192 65536 > $OUT/sdpa.jsonl 2>>$OUT/errors.log; python3 bench/sdpa.py 8192 65536 --backward >> $OUT/sdpa.jsonl 2>>$OUT/errors.log; cat $OUT/sdpa.jsonl
timeout 60 $A/bin/nsa-bench 8192 --reps=5 --gradient --branches > $OUT/nsa-grad.jsonl 2>>$OUT/errors.log; echo "grad 8k rc=$?"
timeout 200 $A/bin/nsa-bench 65536 --reps=5 --gradient --branches >> $OUT/nsa-grad.jsonl 2>>$OUT/errors.log; echo "grad 64k rc=$?"; cat $OUT/errors.log
grep -v "nsa kernel" $OUT/nsa-grad.jsonl | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
