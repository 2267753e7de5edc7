#!/usr/bin/env bash
# Eleventh session: the gradient suite with the packed, chunked case, and
# memcheck on that case.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
timeout 300 $A/gpu/nsa-gpu-gradient-tests > $OUT/gradient-tests.log 2>&1; echo "gradient rc=$?"; grep -E "PASS|FAIL|packed|passed" $OUT/gradient-tests.log
NSA_GPU_TEST_FILTER=GradientPackedChunked timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gpu/nsa-gpu-gradient-tests > $OUT/memcheck-GradientPackedChunked.log 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck-GradientPackedChunked.log
