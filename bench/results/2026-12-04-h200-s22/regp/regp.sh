#!/usr/bin/env bash
# Twenty-second session: the softmax on 8 consecutive keys a thread (16-byte
# shared accesses) and the Eq. 9 partials from its registers
# (bin/nsa-decode-bench-regp) against HEAD (bin/nsa-decode-bench-lse).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/regp.sh $R/
N=$A/bin/nsa-decode-bench-regp
timeout 150 $N --reps=100 --batches=1,64 128 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode.jsonl)"; grep '"pass": false' $R/nsa-decode.jsonl | head -3; grep '"variant"' $R/nsa-decode.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' '; echo
for V in c64 q4; do
timeout 60 $N --variant=$V --steps=4 --reps=20 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "$V rc=$? pass=$(grep -c '"pass": true' $R/nsa-decode-$V.jsonl) fail=$(grep -c '"pass": false' $R/nsa-decode-$V.jsonl)"
done
timeout 100 $N --long-check --steps=4 --reps=5 --batches=1 128 > $R/long.jsonl 2>>$R/errors.log; echo "long rc=$? pass=$(grep -c '"pass": true' $R/long.jsonl) fail=$(grep -c '"pass": false' $R/long.jsonl)"
for i in 1 2 3; do
for V in cur regp; do
B=$A/bin/nsa-decode-bench-lse; [ $V = regp ] && B=$N
timeout 60 $B --steps=2 --reps=300 --batches=1,64 65536 > $R/ab-$V-$i.jsonl 2>>$R/errors.log; echo "$V $i rc=$? $(grep '"variant"' $R/ab-$V-$i.jsonl | grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' | tr '\n' ' ')"
done; done
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $N --steps=2 --reps=1 --batches=1,2 4096 > $R/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -1 $R/memcheck.log
cat $R/errors.log | head
tar -C /tmp -cf $OUT/results.tar r
