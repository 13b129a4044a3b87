"""How much memory a sparse result costs while it is built: the peak resident memory a call
adds above what the process held before it, over the result's own size, for scorch and
scipy side by side (each case in a fresh process).

    SCORCH_DATA_DIR=../shared/data python benchmarks/report_output_memory.py
    SCORCH_DATA_DIR=../shared/data python benchmarks/report_output_memory.py --matrices uniform18 --threads 1 2

Cases: ``A @ A^T`` (SpGEMM, A truncated to square as in ``kernels.py``) and ``A + B`` with B
A's rows in a random order (a union of two patterns) in CSR and COO. Each measured call is the
first one on its operands, as a user's is (the kernel itself is loaded beforehand on a small
problem, so the module's code is not counted); a thread samples the process's anonymous
resident memory (``RssAnon``) every 0.2 ms during the call. ``--pool-mb`` sets
``SCORCH_POOL_MB`` (default: scorch's own, 128): the pool keeps freed blocks for later calls,
which shows in a first call at several threads as memory held for the next one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

CASE = textwrap.dedent(r'''
    import json, sys, threading, time, warnings
    sys.path.insert(0, HERE)
    warnings.filterwarnings("ignore")
    import numpy as np, scipy.sparse as sp, torch, scorch
    import kernels as K
    impl, op, name, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(threads)
    A = sp.csr_matrix(K.load_matrix(name).astype(np.float32))
    if op == "spgemm":
        n = min(A.shape)
        A = sp.csr_matrix(A[:n, :n])
        B = sp.csr_matrix(A.T)
    else:
        B = sp.csr_matrix(A[np.random.default_rng(0).permutation(A.shape[0])])
    for M in (A, B):
        M.sort_indices()
        M.indptr, M.indices = M.indptr.astype(np.int32), M.indices.astype(np.int32)
    fmt = "coo" if op == "union_coo" else "csr"
    if impl == "scorch":
        a, b = scorch.from_scipy(A).to_format(fmt), scorch.from_scipy(B).to_format(fmt)
        small = scorch.from_scipy(sp.random(64, 64, 0.2, format="csr", dtype=np.float32, random_state=0))
        s2 = small.t().to_format("csr")
        if op == "spgemm":
            call, warm = (lambda: scorch.einsum("ij,jk->ik", a, b)), (lambda: scorch.einsum("ij,jk->ik", small, s2))
        else:
            small, s2 = small.to_format(fmt), s2.to_format(fmt)
            call, warm = (lambda: a + b), (lambda: small + s2)
        warm()
        size = lambda r: r._storage.nbytes()
    else:
        if fmt == "coo":
            A, B = A.tocoo(), B.tocoo()
        call = (lambda: A @ B) if op == "spgemm" else (lambda: A + B)
        size = lambda r: r.data.nbytes + sum(x.nbytes for x in (getattr(r, "indices", None), getattr(r, "indptr", None), getattr(r, "row", None), getattr(r, "col", None)) if x is not None)
    time.sleep(0.3)       # (scorch's load estimate: a whole window before a call may use threads)
    def anon():
        with open("/proc/self/status") as f:
            t = f.read()
        return int(t.split("RssAnon:")[1].split()[0]) * 1024
    peak, stop = [0], [False]
    def sample():
        while not stop[0]:
            peak[0] = max(peak[0], anon())
            time.sleep(0.0002)
    base = anon()
    th = threading.Thread(target=sample)
    th.start()
    r = call()
    stop[0] = True
    th.join()
    print(json.dumps({"held": max(peak[0], anon()) - base, "size": size(r)}))
''')


def measure(impl: str, op: str, matrix: str, threads: int, pool_mb: str | None) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore", SCORCH_ADAPTIVE_THREADS="0")
    if pool_mb is not None:
        env["SCORCH_POOL_MB"] = pool_mb
    p = subprocess.run([sys.executable, "-c", CASE.replace("HERE", repr(str(HERE))), impl, op, matrix,
                        str(threads)], capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{impl} {op} {matrix}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--matrices", nargs="+", default=["uniform16", "uniform18", "Groebner_id2003_aug"])
    ap.add_argument("--ops", nargs="+", default=["spgemm", "union_csr", "union_coo"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--pool-mb", default=None)
    args = ap.parse_args(argv)
    print("| op | matrix | threads | result MB | scorch peak / result | scipy peak / result |")
    print("|---|---|---:|---:|---:|---:|")
    for op in args.ops:
        for m in args.matrices:
            ref = measure("scipy", op, m, 1, None)
            for t in args.threads:
                got = measure("scorch", op, m, t, args.pool_mb)
                print(f"| {op} | {m} | {t} | {got['size'] / 2**20:.1f} | {got['held'] / got['size']:.2f} | "
                      f"{ref['held'] / ref['size']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
