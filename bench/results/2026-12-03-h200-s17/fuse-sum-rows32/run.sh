#!/usr/bin/env bash
# Seventeenth session, first call: the branches' dq summed in the last dq
# kernel's epilogue (variant nosum: the generic kernel), selected dq in
# 32-row blocks (variant slcdq16: 16 rows).
# Gradient grid, nsa-bench --gradient --branches at 64k, cuDNN fwd+bwd, memcheck.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
/usr/bin/time -f "%e s" timeout 300 $A/gpu/nsa-gpu-gradient-tests > $OUT/gradient-tests.log 2>&1; echo "gradient rc=$?"; grep -E "OK|FAIL|PASS|passed|failed" $OUT/gradient-tests.log | tail -30
timeout 100 $A/bin/nsa-bench 65536 --reps=5 --gradient --branches > $OUT/nsa-grad.jsonl 2>>$OUT/errors.log; echo "grad 64k rc=$?"; cat $OUT/errors.log
grep -v "nsa kernel" $OUT/nsa-grad.jsonl | grep -v "nsa branch" | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
grep "layer_grad_saved_.*_grad_flash" $OUT/nsa-grad.jsonl | sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//'
python3 $A/sdpa.py 65536 --backward > $OUT/sdpa.jsonl 2>>$OUT/errors.log; cat $OUT/sdpa.jsonl
for t in GradientPaperG16 GradientG4AnyOrder; do echo "== $t" >> $OUT/memcheck.log; NSA_GPU_TEST_FILTER=$t timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests >> $OUT/memcheck.log 2>&1; echo "memcheck $t rc=$?"; tail -1 $OUT/memcheck.log; done
