#!/usr/bin/env python3
"""Tabulates the phase stamps of a `_cluster` decoding step.

nsa-decode-bench --variant=trace prints, for every launch of the one-launch
step, a line a block of the first row tile's cluster:
    NSA_TRACE rank s0 s1 ... s11
(%globaltimer in ns, 0 where the block did not pass; the stamps are named in
lib/Conversion/NSAToGPU/FlashDecodeBuilder.h, DecodeBuilder::Stamp). This
script takes the last complete launch (one line a rank) of each input and
prints the stamps in microseconds from the earliest block's start.

    bench/trace.py trace-65536.log
"""
import sys

NAMES = ["start", "compressed", "barrier", "lse", "sums", "chosen", "issued",
         "attended", "pushed", "own_cmp", "received", "stored"]


def last_launch(lines):
    """The last run of lines with ranks 0..n-1 each once."""
    rows = [l.split()[1:] for l in lines if l.startswith("NSA_TRACE")]
    rows = [[int(x) for x in r] for r in rows]
    if not rows:
        return []
    n = max(r[0] for r in rows) + 1
    for end in range(len(rows), n - 1, -1):
        group = rows[end - n:end]
        if sorted(r[0] for r in group) == list(range(n)):
            return sorted(group)
    return []


def main():
    for path in sys.argv[1:]:
        with open(path) as f:
            group = last_launch(f.read().splitlines())
        if not group:
            print(f"{path}: no complete launch")
            continue
        t0 = min(r[1] for r in group if r[1])
        print(f"{path}: us from the first block's start")
        print("rank " + " ".join(f"{n:>10}" for n in NAMES))
        for r in group:
            cells = [f"{(t - t0) / 1000:10.2f}" if t else f"{'-':>10}"
                     for t in r[1:]]
            print(f"{r[0]:4d} " + " ".join(cells))


if __name__ == "__main__":
    main()
