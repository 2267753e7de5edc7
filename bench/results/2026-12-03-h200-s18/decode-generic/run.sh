#!/usr/bin/env bash
# Eighteenth session: decoding (issue 12) on the generic mapping.
# Check (decode row = forward's last row, kv_lens refused), B = 1 and 64 at
# 8k..64k, dense SDPA decode, memcheck on the check.
set -u
A=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$A/lib NSA_LIBRARY_DIR=$A/lib
cp $A/run.sh $OUT/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 $A/bin/nsa-decode-bench --reps=10 8192 16384 32768 65536 > $OUT/nsa-decode.jsonl 2>$OUT/errors.log; echo "decode rc=$?"; cat $OUT/nsa-decode.jsonl; cat $OUT/errors.log
timeout 120 python3 $A/sdpa.py --decode 8192 16384 32768 65536 > $OUT/sdpa-decode.jsonl 2>>$OUT/errors.log; echo "sdpa rc=$?"; cat $OUT/sdpa-decode.jsonl
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $A/bin/nsa-decode-bench --reps=1 --batches=2 4096 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -4 $OUT/memcheck.log
