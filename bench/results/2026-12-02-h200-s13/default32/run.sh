#!/usr/bin/env bash
# Thirteenth session, second call: the default 32-key dq tiles. Gradient
# grid, memcheck, nsa-bench --gradient at 64k.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
/usr/bin/time -f "%e s" timeout 330 $A/gpu/nsa-gpu-gradient-tests > $OUT/gradient-tests.log 2>&1; echo "gradient rc=$?"; grep -E "PASS|FAIL|passed" $OUT/gradient-tests.log | tail -14
NSA_GPU_TEST_FILTER=GradientPaperG16 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck.log
timeout 150 $A/bin/nsa-bench 65536 --reps=5 --gradient --branches > $OUT/nsa-grad.jsonl 2>>$OUT/errors.log; echo "grad 64k rc=$?"; cat $OUT/errors.log
grep -v "nsa kernel" $OUT/nsa-grad.jsonl | grep -v branch | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
grep "layer_grad_saved_.*_grad_flash" $OUT/nsa-grad.jsonl | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
