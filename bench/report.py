"""Merges nsa-bench and sdpa.py JSON lines into results JSON + a table."""
import datetime
import json
import os
import sys


def main(out_dir, *inputs):
    rows = []
    for path in inputs:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    meta = {"date": datetime.date.today().isoformat(),
            "gpu": os.environ.get("NSA_GPU", "?"),
            "commit": os.environ.get("NSA_COMMIT", "?"),
            "dtype": "bf16", "batch": 1}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"{meta['date']}, {meta['gpu']}, commit {meta['commit']}, "
             "bf16, B=1, causal", "",
             "| config | T | implementation | ms | TF/s (useful) |",
             "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["config"], r["T"], r["impl"])):
        ms = r.get("ms", r.get("error", "-"))
        lines.append(f"| {r['config']} | {r['T']} | {r['impl']} | {ms} | "
                     f"{r.get('tflops', '-')} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main(*sys.argv[1:])
