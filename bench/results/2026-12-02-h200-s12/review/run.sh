#!/usr/bin/env bash
# Twelfth session, after the review commit: the checked entries (layer
# forward against the direct call, the gradient cases with the training
# path) and the Python package's GPU tests.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
NSA_GPU_TEST_FILTER=LayerForward timeout 100 $A/gpu/nsa-gpu-layer-tests 2>&1 | grep -E "PASS|FAIL|passed"
for t in GradientG4 GradientPackedLearnedPool TrainingRejectsBadArguments; do NSA_GPU_TEST_FILTER=$t timeout 100 $A/gpu/nsa-gpu-gradient-tests 2>&1 | grep -E "PASS|FAIL|passed"; done
(cd test/Python && NSA_GPU_TESTS_QUICK=1 NSA_PYTHON_DIR=$A/python timeout 200 python3 test_gpu.py 2>&1 | grep -E "^  |Ran|OK|FAIL|Error" | tail -25)
