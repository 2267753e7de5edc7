#!/usr/bin/env bash
# Twelfth session, the saved-indices check (pinned staging, per-sequence min/max): the
# gradient cases that exercise it (bad indices refused) and the paper
# layer's gradient at 64k through the checked and the unchecked entry.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
for t in GradientG4 GradientPackedLearnedPool GradientPackedChunked TrainingRejectsBadArguments; do NSA_GPU_TEST_FILTER=$t timeout 100 $A/gpu/nsa-gpu-gradient-tests >> $OUT/tests.log 2>&1; echo "$t rc=$?"; done; grep -E "PASS|FAIL|passed" $OUT/tests.log
timeout 240 $A/bin/nsa-bench 65536 --reps=5 --gradient > $OUT/nsa-grad.jsonl 2>$OUT/errors.log; echo "grad 64k rc=$?"; cat $OUT/errors.log
sed 's/"config": "paper (HQ64 H4 Dqk192 Dv128)",//' $OUT/nsa-grad.jsonl
