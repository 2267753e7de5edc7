#!/usr/bin/env bash
# Eighteenth session, second call: decoding kernels profiled (issue 12).
# Check (decode row = forward's last row, kv_lens refused), B = 1 and 64 at
# 8k..64k, dense SDPA decode, memcheck on the check.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 $A/bin/nsa-decode-bench --reps=10 8192 65536 > $OUT/nsa-decode.jsonl 2>$OUT/errors.log; echo "decode rc=$?"; cat $OUT/nsa-decode.jsonl; cat $OUT/errors.log

# (memcheck: run in the first call of this session, 0 errors)
