"""scipy / scorch cells of report_ops_overhead.py (``scipy_cases``) for two trees side by side:
one worker process per tree (its checkout first on sys.path, its own SCORCH_CACHE_DIR), asked
in turn, round after round (alternating which goes first), to time scorch's op and scipy's
(thread CPU time, min over the round); the table gives the min over rounds. Matrices run in
the order given, in one process per tree, as ``--matrix all`` does (plan caches carry over).

    SCORCH_DATA_DIR=/work/shared/data ROUNDS=7 python ab_trees.py OLD_TREE NEW_TREE \
        arrow_spqr_46500,mdual "A + C,A - C"
"""
import json, subprocess, sys, os
W = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import report_ops_overhead as R
from scorch.datasets import load_matrix
import torch; torch.set_num_threads(1)
R._CLOCK[0] = time.thread_time
cache = {}
for line in sys.stdin:
    name, case, what = json.loads(line)
    if name not in cache:
        cache.clear(); cache[name] = {c[0]: c for c in R.scipy_cases(load_matrix(name))}
    _, ours, ref = cache[name][case]
    t = R.interleaved({"scorch": ours, "scipy": ref}, 3, budget=0.15, stat="min")
    print(json.dumps(t), flush=True)
'''
trees = sys.argv[1:3]
names = sys.argv[3].split(",")
cases = sys.argv[4].split(",") if len(sys.argv) > 4 else ["A + C", "A - C"]
rounds = int(os.environ.get("ROUNDS", 7))
env = dict(os.environ); env.pop("PYTHONPATH", None)
ws = [subprocess.Popen([sys.executable, "-c", W, t], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(env, SCORCH_CACHE_DIR=f"/tmp/scorch-cache-merge5-ab{k}"), cwd=t) for k, t in enumerate(trees)]
def ask(w, req):
    w.stdin.write(json.dumps(req) + "\n"); w.stdin.flush(); return json.loads(w.stdout.readline())
print(f"{'matrix':20s} {'case':6s} {'base us':>9s} {'new us':>9s} {'new/base speed':>14s} {'scipy/base':>10s} {'scipy/new':>10s}")
for name in names:
    for case in cases:
        res = [[], []]
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for k in order:
                res[k].append(ask(ws[k], [name, case, "op"]))
        b = min(x["scorch"] for x in res[0]); n = min(x["scorch"] for x in res[1])
        sb = min(x["scipy"] for x in res[0]); sn = min(x["scipy"] for x in res[1])
        print(f"{name:20s} {case:6s} {b*1e6:9.1f} {n*1e6:9.1f} {b/n:14.3f} {sb/b:10.3f} {sn/n:10.3f}", flush=True)
for w in ws: w.stdin.close()
