#!/usr/bin/env bash
# Twenty-eighth session, call B: the merge by reduce-scatter (new) against
# 7801875 (base): checks, memcheck, A/B at 64k (three rounds) and 128 / 8k,
# ncu in-kernel time of _cluster, SDPA decode in the same call.
set -u
A=artifacts; R=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
N=$A/nsa-decode-bench
timeout 100 $N --reps=20 --batches=1,2,64 4097 65536 > $R/check.jsonl 2>>$R/errors.log; echo "check rc=$? pass=$(grep -c '"pass": true' $R/check.jsonl) fail=$(grep -c '"pass": false' $R/check.jsonl)"
timeout 60 $N --variant=q4 --reps=20 --batches=1,2 65536 > $R/check-q4.jsonl 2>>$R/errors.log; echo "q4 rc=$? pass=$(grep -c '"pass": true' $R/check-q4.jsonl) fail=$(grep -c '"pass": false' $R/check-q4.jsonl)"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$? $(tail -1 $R/memcheck.log)"
for i in 1 2 3; do for V in base new; do
B=$N; [ $V = base ] && B=$A/nsa-decode-bench-base
timeout 40 $B --steps=1 --reps=300 --batches=1,64 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
for V in base new; do
B=$N; [ $V = base ] && B=$A/nsa-decode-bench-base
timeout 40 $B --steps=1 --reps=300 --batches=1 128 8192 > $R/short-$V.jsonl 2>>$R/errors.log; echo "$V short $(grep '"variant"' $R/short-$V.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
for L in 128 65536; do
timeout 60 ncu --clock-control none --cache-control none --kernel-name regex:_cluster --launch-skip 20 --launch-count 8 --metrics gpu__time_duration.sum $B --steps=1 --reps=30 --batches=1 $L > $R/ncu-$V-$L.log 2>&1; echo "ncu $V $L $(grep gpu__time_duration $R/ncu-$V-$L.log | awk '{print $NF}' | tr '\n' ' ')"
done; done
timeout 60 python3 bench/sdpa.py --decode 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$? $(grep paper $R/sdpa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
head -5 $R/errors.log
