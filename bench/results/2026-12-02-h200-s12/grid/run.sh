#!/usr/bin/env bash
# Twelfth session, the correctness grid of issue 10: every gradient case (G
# 1, 4, 16; T 1 to 65536; packed; the dk, dv chunks in turn and in any
# order; the training path through the checked entries).
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
/usr/bin/time -f "%e s" timeout 560 $A/gpu/nsa-gpu-gradient-tests > $OUT/gradient-tests.log 2>&1; echo "gradient rc=$?"; cat $OUT/gradient-tests.log
