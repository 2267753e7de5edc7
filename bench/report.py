"""Merges the rows bench/run.sh's steps wrote into results.json and a table.

    python3 bench/report.py ROWS OUT

reads ROWS/<step>.jsonl (one JSON object a line: nsa-bench,
nsa-decode-bench, sdpa.py, torch_op.py), and writes OUT/results.json (every
row, tagged with its step, and the card, commit, date and command from
bench/run.sh's environment) and OUT/table.md: per step a table of timings (ms and TF/s of
useful FLOPs, or us a decoding step and its share of HBM bandwidth) and a
count of the checks that passed and failed. Exits 1 where a check failed.
"""
import datetime
import glob
import json
import os
import sys

STEPS = ["forward", "branches", "variants", "gradient", "decode", "torch"]


def read_rows(out_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "*.jsonl"))):
        step = os.path.basename(path)[:-len(".jsonl")]
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(dict(json.loads(line), step=step))
    return rows


def cell(row, *keys):
    for key in keys:
        if key in row:
            return str(row[key])
    return "-"


def timing_table(rows):
    if any("us" in r for r in rows):
        head = ["config", "impl", "B", "L", "us", "TB/s", "HBM fraction"]
        keys = [("config",), ("impl",), ("B",), ("L",), ("us", "error"),
                ("tbps",), ("hbm_fraction",)]
        order = lambda r: (r.get("config", ""), r.get("B", 0), r.get("L", 0),
                           r.get("impl", ""))
    else:
        head = ["config", "T", "impl", "ms", "TF/s (useful)"]
        keys = [("config",), ("T",), ("impl", "branch", "kernel"),
                ("ms", "error"), ("tflops",)]
        order = lambda r: (r.get("config", ""), r.get("T", 0),
                           r.get("impl", ""))
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in sorted(rows, key=order):
        lines.append("| " + " | ".join(cell(r, *k) for k in keys) + " |")
    return lines


def main(rows_dir, out_dir):
    rows = read_rows(rows_dir)
    meta = {"date": datetime.date.today().isoformat(),
            "gpu": os.environ.get("NSA_GPU", "?"),
            "card": os.environ.get("NSA_CARD", "?"),
            "commit": os.environ.get("NSA_COMMIT", "?"),
            "command": os.environ.get("NSA_COMMAND", "?"),
            "dtype": "bf16"}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"{meta['gpu']}, commit {meta['commit']}, {meta['date']}, "
             f"bf16, causal; `{meta['command']}`"]
    failed = 0
    steps = sorted({r["step"] for r in rows},
                   key=lambda s: STEPS.index(s) if s in STEPS else 99)
    for step in steps:
        mine = [r for r in rows if r["step"] == step]
        checks = [r for r in mine if "check" in r]
        timed = [r for r in mine if "check" not in r and
                 any(k in r for k in ("ms", "us", "error"))]
        lines += ["", f"## {step}", ""]
        if checks:
            bad = [r for r in checks if not r.get("pass")]
            failed += len(bad)
            worst = max((r["rel_l2"] for r in checks if "rel_l2" in r),
                        default=None)
            lines.append(f"checks: {len(checks) - len(bad)} passed, "
                         f"{len(bad)} failed" +
                         (f"; largest rel. L2 {worst:.2e}" if worst else ""))
            lines += [f"- FAILED: {json.dumps(r)}" for r in bad]
            lines.append("")
        if timed:
            lines += timing_table(timed)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: report.py ROWS OUT")
    sys.exit(main(sys.argv[1], sys.argv[2]))
