"""What one op call costs, scorch against torch.sparse: a small matrix (the fixed cost of a
call: dispatch, planning, assembly), the same ops under autograd (forward and backward), and
selections and concatenation on a large matrix (whether the cost follows the entries moved).

    python benchmarks/report_op_calls.py                      # markdown table on stdout
    python benchmarks/report_op_calls.py --out DIR            # also DIR/op_calls.md

Method: one thread; each op is checked against dense torch, warmed up, then scorch and
torch.sparse are timed in interleaved rounds (``report_ops_overhead.interleaved``, median
over rounds; the large matrix's table takes the best round, see ``main``). torch.sparse runs CSR where it has the op, else COO; ``n/a`` where it has
neither. Ratio = torch.sparse / scorch (> 1: scorch is faster).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import warnings
from typing import Callable, List, Optional, Tuple

import torch

import scorch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_ops_overhead import interleaved  # noqa: E402

Case = Tuple[str, Callable, Optional[Callable], Callable]   # name, scorch, torch.sparse, dense


def _random(shape, density: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(shape, generator=g)
    return d * (torch.rand(shape, generator=g) < density)


def small_cases() -> List[Case]:
    d, d2 = _random((64, 64), 0.1, 0), _random((64, 64), 0.1, 1)
    s, s2 = scorch.sparse_tensor(d, format="csr"), scorch.sparse_tensor(d2, format="csr")
    c, c2, r, r2 = d.to_sparse(), d2.to_sparse(), d.to_sparse_csr(), d2.to_sparse_csr()
    x, v = _random((64, 16), 1.0, 2), _random((64,), 1.0, 3)
    F = torch.nn.functional
    return [
        ("relu", lambda: s.relu(), lambda: r.relu(), lambda: d.relu()),
        ("sqrt", lambda: s.sqrt(), lambda: r.sqrt(), lambda: d.sqrt()),
        ("sin", lambda: s.sin(), lambda: r.sin(), lambda: d.sin()),
        ("exp (dense result)", lambda: s.exp(), None, lambda: d.exp()),
        ("A * 2", lambda: s * 2, lambda: r * 2, lambda: d * 2),
        ("A + B", lambda: s + s2, lambda: r + r2, lambda: d + d2),
        ("A * B", lambda: s * s2, lambda: c * c2, lambda: d * d2),
        ("A * D (dense)", lambda: s * d2, lambda: c * d2, lambda: d * d2),
        ("A + D (dense)", lambda: s + d2, lambda: r + d2, lambda: d + d2),
        ("A > 0.5", lambda: s > 0.5, None, lambda: d > 0.5),
        ("A.sum()", lambda: s.sum(), lambda: r.sum(), lambda: d.sum()),
        ("A.sum(0)", lambda: s.sum(0), lambda: torch.sparse.sum(c, 0), lambda: d.sum(0)),
        ("A.amax(1)", lambda: s.amax(1), None, lambda: d.amax(1)),
        ("sparse.softmax", lambda: torch.sparse.softmax(s, 1), lambda: torch.sparse.softmax(c, 1),
         None),
        ("A @ X", lambda: s @ x, lambda: r @ x, lambda: d @ x),
        ("A @ v", lambda: s @ v, lambda: r @ v, lambda: d @ v),
        ("A @ B (SpGEMM)", lambda: s @ s2, lambda: r @ r2, lambda: d @ d2),
        ("A.t()", lambda: s.t(), lambda: c.t(), lambda: d.t()),
        ("A[3]", lambda: s[3], lambda: c[3], lambda: d[3]),
        ("A[2:10]", lambda: s[2:10], None, lambda: d[2:10]),
        ("A.select(1, 3)", lambda: s.select(1, 3), lambda: c.select(1, 3), lambda: d.select(1, 3)),
        ("cat([A, B])", lambda: torch.cat([s, s2]), lambda: torch.cat([c, c2]), lambda: torch.cat([d, d2])),
        ("A.to_dense()", lambda: s.to_dense(), lambda: r.to_dense(), lambda: d),
        ("dense -> CSR", lambda: scorch.sparse_tensor(d, format="csr"), lambda: d.to_sparse_csr(), lambda: d),
        ("A.clone()", lambda: s.clone(), lambda: r.clone(), lambda: d),
        ("F.dropout (eval)", lambda: F.dropout(s, 0.5, False), None, lambda: d),
    ]


def autograd_cases() -> List[Case]:
    d = _random((64, 64), 0.1, 0)
    s = scorch.sparse_tensor(d, format="csr").requires_grad_()
    c = d.to_sparse().requires_grad_()
    x = _random((64, 16), 1.0, 2)

    def both(f_s, f_t):
        def run_s():
            s.grad = None
            f_s().backward()
            return s.grad

        def run_t():
            c.grad = None
            f_t().backward()
            return c.grad
        return run_s, run_t
    cases = [("relu", lambda: s.relu().sum(), lambda: torch.sparse.sum(c.relu())),
             ("(A * 2).sum()", lambda: (s * 2).sum(), lambda: torch.sparse.sum(c * 2)),
             ("sparse.softmax", lambda: torch.sparse.softmax(s, 1).values().sum(),
              lambda: torch.sparse.sum(torch.sparse.softmax(c, 1))),
             ("(A @ X).sum()", lambda: (s @ x).sum(), lambda: torch.sparse.mm(c, x).sum()),
             ("A[2:10].sum()", lambda: s[2:10].sum(), None)]
    out = []
    for name, f_s, f_t in cases:
        run_s, run_t = both(f_s, f_t) if f_t is not None else (both(f_s, f_s)[0], None)
        out.append((name + " fwd+bwd", run_s, run_t, None))
    return out


def large_cases() -> List[Case]:
    n, nnz = 200_000, 2_000_000
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (2, nnz), generator=g)
    coo = torch.sparse_coo_tensor(idx, torch.rand(nnz, generator=g), (n, n)).coalesce()
    s = scorch.sparse_tensor(coo, format="csr")
    sc = scorch.sparse_tensor(coo, format="csc")
    rows = torch.randperm(n, generator=g)[:1000]     # a minibatch of rows, in any order
    return [
        ("A[i] (2M entries)", lambda: s[123], lambda: coo[123], None),
        ("A[:, j] of CSC", lambda: sc[:, 123], lambda: coo.select(1, 123), None),
        ("A[:, j] of CSR", lambda: s[:, 123], lambda: coo.select(1, 123), None),
        ("A[1000:2000]", lambda: s[1000:2000], lambda: coo.narrow_copy(0, 1000, 1000), None),
        ("A.index_select(0, 1000 rows)", lambda: s.index_select(0, rows),
         lambda: coo.index_select(0, rows), None),
        ("cat([A, A])", lambda: torch.cat([s, s]), lambda: torch.cat([coo, coo]), None),
        # side by side: torch's COO cat leaves the entries unsorted; coalesced, as scorch's
        ("cat([A, A], 1), sorted", lambda: torch.cat([s, s], 1),
         lambda: torch.cat([coo, coo], 1).coalesce(), None),
    ]


#: whole-matrix ops on the large matrix with scipy beside torch.sparse:
#: (name, scorch, torch.sparse or None, scipy or None)
PeerCase = Tuple[str, Callable, Optional[Callable], Optional[Callable]]


def whole_matrix_cases() -> List[PeerCase]:
    """Ops that read every stored entry of the 2M-entry matrix (reductions, filters,
    reorderings, elementwise ops), where scipy.sparse is the peer a user would compare."""
    import scipy.sparse as sp
    n, nnz = 200_000, 2_000_000
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (2, nnz), generator=g)
    coo = torch.sparse_coo_tensor(idx, torch.randn(nnz, generator=g), (n, n)).coalesce()
    idx2 = torch.randint(0, n, (2, nnz), generator=g)
    coo2 = torch.sparse_coo_tensor(idx2, torch.randn(nnz, generator=g), (n, n)).coalesce()
    s, s2 = scorch.sparse_tensor(coo, format="csr"), scorch.sparse_tensor(coo2, format="csr")
    r = coo.to_sparse_csr()
    S, S2 = sp.csr_array(s.to_scipy()), sp.csr_array(s2.to_scipy())
    cols = torch.tensor([7, 123, 4567])
    nodes = torch.randperm(n, generator=g)[:20_000]    # a sampled subgraph, in any order
    return [
        ("A.sum(1)", lambda: s.sum(1), lambda: torch.sparse.sum(coo, 1), lambda: S.sum(1)),
        ("A.sum(0)", lambda: s.sum(0), lambda: torch.sparse.sum(coo, 0), lambda: S.sum(0)),
        ("A.amax(1)", lambda: s.amax(1), None, lambda: S.max(axis=1)),
        ("A.max(1) (values, indices)", lambda: s.max(1), None,
         lambda: (S.max(axis=1), S.argmax(axis=1))),
        ("A.argmax(1)", lambda: s.argmax(1), None, lambda: S.argmax(axis=1)),
        ("A.argmax(0)", lambda: s.argmax(0), None, lambda: S.argmax(axis=0)),
        ("tril(A)", lambda: torch.tril(s), None, lambda: sp.tril(S, format="csr")),
        ("flip(A, [0])", lambda: torch.flip(s, [0]), None, lambda: S[::-1]),
        ("A > 0.5", lambda: s > 0.5, None, lambda: S > 0.5),
        ("A.abs()", lambda: s.abs(), lambda: r.abs(), lambda: abs(S)),
        ("A * A", lambda: s * s, lambda: r * r, lambda: S.multiply(S)),
        ("A * B", lambda: s * s2, lambda: coo * coo2, lambda: S.multiply(S2)),
        ("A + B", lambda: s + s2, lambda: coo + coo2, lambda: S + S2),
        ("A + A.t()", lambda: s + s.t(), lambda: (coo + coo.t()).coalesce(), lambda: S + S.T),
        ("A.t() as CSR", lambda: s.t().to_format("csr"), lambda: coo.t().to_sparse_csr(),
         lambda: S.T.tocsr()),
        ("A.reshape(n / 2, 2 n)", lambda: s.reshape(n // 2, 2 * n), None,
         lambda: S.reshape((n // 2, 2 * n))),
        ("A.index_select(1, 3 columns)", lambda: s.index_select(1, cols),
         lambda: coo.index_select(1, cols), lambda: S[:, cols.numpy()]),
        ("A[:, 1000:50000]", lambda: s[:, 1000:50000], None, lambda: S[:, 1000:50000]),
        ("A[nodes][:, nodes] (20k nodes)", lambda: s[nodes][:, nodes],
         lambda: coo.index_select(0, nodes).index_select(1, nodes),
         lambda: S[nodes.numpy()][:, nodes.numpy()]),
        ("where(A > 0.5, A, 0)", lambda: torch.where(s > 0.5, s, 0.0), None,
         lambda: S.multiply(S > 0.5)),
    ]


def _as_dense_vector(x) -> torch.Tensor:
    """A vector-shaped result (scipy's may be a 1-d or n x 1 sparse / dense array)."""
    import numpy as np
    if hasattr(x, "toarray"):
        x = x.toarray()
    return torch.from_numpy(np.asarray(x).reshape(-1).astype(np.float64))


def _as_entries(x) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row-major coordinates and values of a sparse result from any of the three libraries."""
    import scipy.sparse as sp
    if sp.issparse(x):
        c = sp.coo_array(x)
        c.sum_duplicates()
        return (torch.stack([torch.from_numpy(c.row.astype("int64")),
                             torch.from_numpy(c.col.astype("int64"))]),
                torch.from_numpy(c.data.astype("float64")))
    if isinstance(x, torch.Tensor) and x.layout not in (torch.strided, torch.sparse_coo) \
            and not isinstance(x, scorch.SparseTensor):
        x = x.to_sparse_coo()               # torch's CSR / CSC
    i, v = _entries(x)
    return i, v.to(torch.float64)


def check_peer(name: str, got, want) -> None:
    """scorch's result against a peer's, as entries where both are sparse matrices."""
    import scipy.sparse as sp
    if isinstance(got, tuple):           # max(dim): (values, indices)
        for a, b in zip(got, want):
            check_peer(name, a, b)
        return
    sparse_got = isinstance(got, scorch.SparseTensor) and got.dim() == 2
    sparse_want = (sp.issparse(want) and min(want.shape) > 1) or (
        isinstance(want, torch.Tensor) and want.layout != torch.strided and want.dim() == 2)
    if sparse_got and sparse_want:
        (ia, va), (ib, vb) = _as_entries(got), _as_entries(want)
        nz_a, nz_b = va != 0, vb != 0       # a library may keep explicit zeros
        ok = torch.equal(ia[:, nz_a], ib[:, nz_b]) and torch.allclose(va[nz_a], vb[nz_b], atol=1e-4)
    else:
        a = _dense(got) if isinstance(got, torch.Tensor) else got
        a = _as_dense_vector(a.values if hasattr(a, "values") and not isinstance(a, torch.Tensor)
                             else a)
        b = _as_dense_vector(_dense(want) if isinstance(want, torch.Tensor) else want)
        ok = a.shape == b.shape and torch.allclose(a, b, atol=1e-4)
    if not ok:
        raise AssertionError(f"{name}: scorch's result differs from a peer's")


def peer_table(title: str, cases: List[PeerCase], rounds: int, budget: float) -> List[str]:
    lines = [f"### {title}", "", "| op | scorch us | torch.sparse us | scipy us | best peer / scorch |",
             "|---|---:|---:|---:|---:|"]
    for name, f_s, f_t, f_p in cases:
        fns = {"scorch": f_s}
        for key, f in (("torch", f_t), ("scipy", f_p)):
            if f is None:
                continue
            try:
                check_peer(name, f_s(), f())
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            fns[key] = f
        t = interleaved(fns, rounds, budget=budget, stat="min")
        peers = [t[k] for k in ("torch", "scipy") if k in t]
        cells = [f"{t[k] * 1e6:.0f}" if k in t else "n/a" for k in ("scorch", "torch", "scipy")]
        ratio = f"{min(peers) / t['scorch']:.2f}x" if peers else "n/a"
        lines.append(f"| {name} | {' | '.join(cells)} | {ratio} |")
        print(lines[-1], flush=True)
    return lines + [""]


def _dense(t):
    if isinstance(t, scorch.SparseTensor):
        return t.to_dense()
    if isinstance(t, torch.Tensor) and t.layout != torch.strided:
        return t.to_dense()
    return t


def _entries(t) -> Tuple[torch.Tensor, torch.Tensor]:
    """A sparse result's coordinates and values in row-major order (no dense copy)."""
    if isinstance(t, scorch.SparseTensor):
        t = torch.sparse_coo_tensor(t.indices(), t.values(), tuple(t.shape))
    t = t.coalesce()
    return t.indices(), t.values()


def check(name: str, f_s: Callable, f_t: Optional[Callable], f_d: Optional[Callable]) -> None:
    if f_d is None and f_t is not None and isinstance(f_s(), scorch.SparseTensor):
        (ia, va), (ib, vb) = _entries(f_s()), _entries(f_t())
        if not (torch.equal(ia, ib) and torch.allclose(va, vb, atol=1e-5)):
            raise AssertionError(f"{name}: scorch's result differs from torch.sparse's")
        return
    got = _dense(f_s())
    want = _dense(f_d() if f_d is not None else (f_t() if f_t is not None else got))
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        if not torch.allclose(got.to(torch.float64), want.to(torch.float64), atol=1e-5, equal_nan=True):
            raise AssertionError(f"{name}: scorch's result differs from the reference")


def table(title: str, cases: List[Case], rounds: int, budget: float, stat: str = "median") -> List[str]:
    lines = [f"### {title}", "", "| op | scorch us | torch.sparse us | torch.sparse / scorch |",
             "|---|---:|---:|---:|"]
    for name, f_s, f_t, f_d in cases:
        check(name, f_s, f_t, f_d)
        fns = {"scorch": f_s}
        if f_t is not None:
            try:
                f_t()
                fns["torch"] = f_t
            except (RuntimeError, NotImplementedError, TypeError):
                pass
        t = interleaved(fns, rounds, budget=budget, stat=stat)
        peer = t.get("torch")
        ratio = f"{peer / t['scorch']:.2f}x" if peer else "n/a"
        lines.append(f"| {name} | {t['scorch'] * 1e6:.1f} | "
                     f"{peer * 1e6:.1f} | {ratio} |" if peer else
                     f"| {name} | {t['scorch'] * 1e6:.1f} | n/a | n/a |")
        print(lines[-1], flush=True)
    return lines + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--budget", type=float, default=0.3, help="seconds per op and library")
    p.add_argument("--out", default=None)
    p.add_argument("--only-whole", action="store_true", help="only the whole-matrix table")
    args = p.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        head = "?"
    lines = ["# One op call: scorch vs torch.sparse", "",
             f"Generated by `python benchmarks/report_op_calls.py` on "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC ({platform.machine()}, "
             f"torch {torch.__version__}, scorch at {head}, 1 thread). Median us per call; "
             f"torch.sparse runs CSR where it has the op, else COO.", ""]
    if not args.only_whole:
        lines += table("A 64 x 64 matrix, 10 % stored (the fixed cost of a call)", small_cases(),
                       args.rounds, args.budget)
        lines += table("The same under autograd: forward and backward", autograd_cases(),
                       args.rounds, args.budget)
        # best round: a call right after the peer's (which sweeps 40 MB) starts from cold caches
        # and may meet a garbage collection; the median of such rounds measured 16 us as 90-700
        lines += table("A 200k x 200k matrix with 2M entries (does the cost follow the entries "
                       "moved?), best of the rounds",
                       large_cases(), max(5, args.rounds // 3), args.budget * 3, stat="min")
    lines += peer_table("Whole-matrix ops on a 200k x 200k matrix with 2M entries, with scipy.sparse, "
                        "best of the rounds", whole_matrix_cases(), max(5, args.rounds // 3),
                        args.budget * 3)
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "op_calls.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
