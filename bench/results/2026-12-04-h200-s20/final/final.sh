#!/usr/bin/env bash
# Twentieth session, final call: the GPU suites on this session's runtime
# (graph replay, dependent launches), the decode bench with SDPA decode in
# the same run, the Tq = 4 and 16 variants, then an ncu source profile of
# a B = 1 step at 64k (direct launches) for the next session.
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R; cp $A/final.sh $R/
for S in runtime mma layer; do
/usr/bin/time -f "%e s" timeout 150 stdbuf -oL $A/gpu/nsa-gpu-$S-tests > $R/gpu-$S.log 2>&1; echo "gpu $S rc=$?"; grep -ciE "fail" $R/gpu-$S.log; tail -2 $R/gpu-$S.log
done
timeout 150 $A/bin/nsa-decode-bench --reps=300 --batches=1,64 8192 65536 > $R/nsa-decode.jsonl 2>>$R/errors.log; echo "decode rc=$?"; grep -v kernel $R/nsa-decode.jsonl | grep -v '"pass": true'; grep -c '"pass": true' $R/nsa-decode.jsonl
timeout 90 python3 $A/sdpa.py --decode 8192 65536 > $R/sdpa-decode.jsonl 2>>$R/errors.log; echo "sdpa rc=$?"; cat $R/sdpa-decode.jsonl
for V in q4 q16; do
timeout 60 $A/bin/nsa-decode-bench --variant=$V --steps=3 --reps=100 --batches=1,64 65536 > $R/nsa-decode-$V.jsonl 2>>$R/errors.log; echo "decode $V rc=$?"; grep -v kernel $R/nsa-decode-$V.jsonl | grep -v '"pass": true'
done
export NSA_GRAPHS=0 NSA_PDL=0
timeout 150 ncu --cache-control none --clock-control none --set full --import-source no --kernel-name regex:decode_step --launch-skip 10 --launch-count 5 -o $R/prof $A/bin/nsa-decode-bench --steps=1 --reps=1 --batches=1 65536 > $R/prof.log 2>&1; echo "ncu rc=$?"; tail -2 $R/prof.log
ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/sass.csv 2>&1; echo "src rc=$?"; wc -c $R/sass.csv
ncu -i $R/prof.ncu-rep --page details --csv > $R/details.csv 2>&1; echo "det rc=$?"
cat $R/errors.log
tar -C /tmp -cf $OUT/results.tar r
