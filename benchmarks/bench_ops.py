"""pytest-benchmark: the torch op surface on sparse operands, scorch next to scipy.sparse and
torch.sparse, one thread.

    python -m pytest benchmarks/bench_ops.py --benchmark-columns=median,iqr,rounds
    SCORCH_BENCH_MATRICES=all python -m pytest benchmarks/bench_ops.py -k "A+C"

Cases (the benchmark group is op and matrix, so the three sit side by side): ``A @ X``
(K = 16), elementwise ``A + B`` / ``A * B`` (``B`` over ``A``'s index arrays, ``B = A * 2``),
``A + C`` / ``A - C`` / ``A * C`` (``C``: ``A``'s rows in a random order, another pattern),
``A * 2``, ``A / 3``, ``-A``, and the reductions ``A.sum()``, ``A.sum(0)``, ``A.sum(1)``; CSR
float32. Every result is checked against scipy before it is timed. torch.sparse runs what its
CSR layout supports; a case it refuses is skipped with its message. Matrices:
``SCORCH_BENCH_MATRICES`` (comma-separated names, or ``all``; default a large, a mid-size and
two small ones). For one table of ratios: ``python benchmarks/report_ops_overhead.py --scipy
--matrix all``.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # a source checkout, not installed
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

import scorch  # noqa: E402
from conftest import load_matrix  # noqa: E402
from scorch.datasets import MATRICES  # noqa: E402

IMPLS = ("scorch", "scipy", "torch")
OPS = ("A @ X", "A + B", "A * B", "A + C", "A - C", "A * C", "A * 2", "A / 3", "-A",
       "A.sum()", "A.sum(0)", "A.sum(1)")
_env = os.environ.get("SCORCH_BENCH_MATRICES", "NotreDame_www,copter2,bcspwr10,west0067")
NAMES = sorted(MATRICES) if _env == "all" else [n for n in _env.split(",") if n]


@functools.lru_cache(maxsize=2)
def operands(name: str) -> Dict[str, object]:
    """The matrix as scipy (``m``), its other-pattern twin (``mc``) and the dense ``X``."""
    m = load_matrix(name)
    rows = np.random.default_rng(0).permutation(m.shape[0])
    mc = m[rows].tocsr()
    mc.sort_indices()
    X = torch.rand(m.shape[1], 16, generator=torch.Generator().manual_seed(0))
    return {"m": m, "mb": m * 2.0, "mc": mc, "X": X}


def _torch_csr(m) -> torch.Tensor:
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                   torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data), m.shape)


def prepare(op: str, name: str, impl: str) -> Callable[[], object]:
    """A no-argument function doing only the op (operands built beforehand)."""
    o = operands(name)
    m, mb, mc, X = o["m"], o["mb"], o["mc"], o["X"]
    if impl == "scipy":
        Xn = X.numpy()
        return {"A @ X": lambda: m @ Xn, "A + B": lambda: m + mb, "A * B": lambda: m.multiply(mb),
                "A + C": lambda: m + mc, "A - C": lambda: m - mc, "A * C": lambda: m.multiply(mc),
                "A * 2": lambda: m * 2.0, "A / 3": lambda: m / 3.0, "-A": lambda: -m,
                "A.sum()": lambda: m.sum(), "A.sum(0)": lambda: m.sum(axis=0),
                "A.sum(1)": lambda: m.sum(axis=1)}[op]
    if impl == "scorch":
        A = scorch.from_scipy(m)
        B = A * 2.0
        C = scorch.from_scipy(mc)
    else:
        A, B, C = _torch_csr(m), _torch_csr(mb), _torch_csr(mc)
    fns = {"A @ X": lambda: A @ X, "A + B": lambda: A + B, "A * B": lambda: A * B,
           "A + C": lambda: A + C, "A - C": lambda: A - C, "A * C": lambda: A * C,
           "A * 2": lambda: A * 2.0, "A / 3": lambda: A / 3.0, "-A": lambda: -A,
           "A.sum()": lambda: A.sum(), "A.sum(0)": lambda: A.sum(0), "A.sum(1)": lambda: A.sum(1)}
    if impl == "torch":   # torch's CSR reduces along a dim only with keepdim
        fns["A.sum(0)"] = lambda: torch.sum(A, 0, keepdim=True)
        fns["A.sum(1)"] = lambda: torch.sum(A, 1, keepdim=True)
    return fns[op]


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, scorch.SparseTensor):
        return np.asarray(x.to_scipy().todense()) if x.dim() == 2 else x.to_dense().numpy()
    if isinstance(x, torch.Tensor):
        return (x.to_dense() if x.layout != torch.strided else x).numpy()
    return np.asarray(x.todense()) if hasattr(x, "todense") else np.asarray(x)


def check(op: str, name: str, result) -> None:
    """The result equals scipy's (dense comparison, so small matrices only; large ones are
    compared by their sums of absolute values)."""
    want = prepare(op, name, "scipy")()
    m = operands(name)["m"]
    if m.shape[0] * m.shape[1] <= 4_000_000:
        np.testing.assert_allclose(_as_numpy(result).reshape(-1), _as_numpy(want).reshape(-1),
                                   rtol=1e-4, atol=1e-4)
    else:
        g = _abs_sum(result)
        w = _abs_sum(want)
        assert abs(g - w) <= 1e-3 * max(1.0, w), (g, w)


def _abs_sum(x) -> float:
    if isinstance(x, scorch.SparseTensor):
        return float(x._storage.values.abs().sum())
    if hasattr(x, "tocsr"):
        return float(abs(x).sum())
    return float(np.abs(_as_numpy(x)).sum())


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("op", OPS)
def test_op(benchmark, op: str, name: str, impl: str) -> None:
    try:
        fn = prepare(op, name, impl)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    try:
        result = fn()
    except (RuntimeError, NotImplementedError, TypeError) as e:
        if impl != "torch":
            raise
        pytest.skip(f"torch.sparse refuses {op} on CSR: {str(e).splitlines()[0][:120]}")
    if impl != "torch" or op in ("A @ X", "A.sum()"):
        check(op, name, result)
    benchmark.group = f"{op} {name} T1"
    benchmark.extra_info.update(op=op, matrix=name, impl=impl)
    benchmark(fn)
