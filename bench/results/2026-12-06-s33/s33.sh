#!/usr/bin/env bash
# Thirty-third session: the head (de5d905: the graph cache's policy in
# CallCache.h) on whichever card comes, for an H200. Checks (--long-check;
# calls dropped at once), memcheck, B = 1 stream-ordered over 8k to 64k
# (three rounds), over 64 layers' caches, B = 64, SDPA, ncu of `_cluster`.
set -u
R=/tmp/r; rm -rf $R; mkdir -p $R
source bench/decode-device.sh
gpu
check long -- --long-check
check drop NSA_GRAPH_CALLS=2 NSA_GRAPH_MEMORY=1
memcheck default
for round in 1 2 3; do
  steps b1-$round 1 0 400 65535 65536 8192 16384 32768
done
steps layers64 1 64 640 65535 65536
steps b64 64 0 100 65536
sdpa 8192 65536
kernel_time 65535
tar -C /tmp -czf $OUT/results.tgz r
