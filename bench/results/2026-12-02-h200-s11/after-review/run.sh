#!/usr/bin/env bash
# Eleventh session, after the review: the gradient suite with T = 65536.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
/usr/bin/time -f "%e s" timeout 500 $A/gpu/nsa-gpu-gradient-tests > $OUT/gradient-tests.log 2>&1; echo "gradient rc=$?"; cat $OUT/gradient-tests.log | tail -30
