"""Before/after table of two ``report_kernels.py`` runs (their kernels.json): per matrix,
layout, K and thread count, scorch's median and its ratio to the best peer.

    python benchmarks/results/issue15/sddmm4/table.py BEFORE/kernels.json AFTER/kernels.json
"""
import json
import math
import sys


def _rows(path):
    return {(r["matrix"], r["kernel"], r["k"], r["threads"]): r for r in json.load(open(path))["rows"]}


def main(before_path, after_path):
    before, after = _rows(before_path), _rows(after_path)
    print("| matrix | C layout | K | threads | scorch before ms | ratio before | scorch after ms | best peer after ms | ratio after |")
    print("|---|---|---|---|---|---|---|---|---|")
    logs = {}
    for key in sorted(after, key=lambda k: (k[1], k[0], k[2], k[3])):
        a, b = after[key], before.get(key, {})
        layout = "K x n" if key[1] == "sddmm" else "n x K"
        fmt = lambda v, d=3: "n/a" if v is None else f"{v:.{d}f}"
        print(f"| {key[0]} | {layout} | {key[2]} | {key[3]} | {fmt(b.get('scorch_ms'))} | {fmt(b.get('ratio'), 2)} | "
              f"{fmt(a.get('scorch_ms'))} | {fmt(a.get('best_peer_ms'))} | {fmt(a.get('ratio'), 2)} |")
        for tag, r in (("before", b), ("after", a)):
            if r.get("ratio"):
                logs.setdefault((tag, layout, key[3]), []).append(math.log(r["ratio"]))
    print()
    for (tag, layout, t), v in sorted(logs.items()):
        print(f"- {tag}, C {layout}, {t} thread(s): geomean {math.exp(sum(v) / len(v)):.2f}x, "
              f"min {math.exp(min(v)):.2f}x over {len(v)} cases")


if __name__ == "__main__":
    main(*sys.argv[1:3])
