#!/usr/bin/env bash
# Source-level profile of the selected kernel (one step, B = 1, 128 tokens).
set -u
A=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; rm -rf $R; mkdir -p $R; cp $A/prof128.sh $R/
export NSA_GRAPHS=0 NSA_PDL=0
timeout 300 ncu --cache-control none --clock-control none --set full --import-source no --kernel-name regex:selected_pdl --launch-skip 2 --launch-count 1 -o $R/prof $A/bin/nsa-decode-bench --steps=1 --reps=1 --batches=1 128 > $R/prof.log 2>&1; echo "ncu rc=$?"; tail -2 $R/prof.log
ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/sass.csv 2>&1; echo "src rc=$?"; wc -c $R/sass.csv
ncu -i $R/prof.ncu-rep --page details --csv > $R/details.csv 2>&1; echo "det rc=$?"
gzip $R/sass.csv; rm -f $R/prof.ncu-rep
[ -n "${NOTAR:-}" ] || tar -C /tmp -cf $OUT/results.tar r
