"""pytest-benchmark: format conversions, scorch's runtime next to torch and scipy.

    python -m pytest benchmarks/bench_conversions.py --benchmark-columns=median,iqr,rounds

Cases: dense -> CSR (10,000 x 10,000 float32 at 1 % density; a dense NotreDame would be
400 GB), COO -> CSR and CSR -> CSC (NotreDame_www, and a random float32 100,000 x 100,000
matrix with 1e6 nonzeros), CSR -> dense (the 10,000 x 10,000 matrix: a 400 MB result, written
into zeroed huge-page memory, ``scorch.conversion.to_dense``), and COO -> CSR from a scorch COO with int64 index arrays (as
imported from torch; "coo64->csr", random matrix; the peers are the same as for coo->csr). Peers: torch (``dense.to_sparse_csr()``, coalesced
``coo.to_sparse_csr()``, ``csr.to_sparse_csc()``) and scipy (``csr_array(dense)``,
``coo.tocsr()``, ``csr.tocsc()``). The benchmark group is the case, so peers sit side by side;
every result is checked against scipy's canonical arrays before it is timed. Threads:
SCORCH_BENCH_THREADS (default 2). For one table with ratios, run report_conversions.py.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Tuple

import numpy as np
import pytest
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # a source checkout, not installed
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")

from conftest import load_matrix  # noqa: E402
from scorch.formats import Format  # noqa: E402
from scorch.level_storage import Level, Storage  # noqa: E402
from scorch._runtime import convert as C  # noqa: E402

CSR, CSC, COO = Format("dc"), Format("dc", (1, 0)), Format("qq")
RANDOM = "random"
IMPLS = ("scorch", "torch", "scipy")


@dataclass(frozen=True)
class Case:
    conversion: str  # "dense->csr", "coo->csr", "coo64->csr", "csr->csc", "csr->dense"
    matrix: str      # a matrix name, or "random"

    @property
    def id(self) -> str:
        return f"{self.conversion} {self.matrix}"


CASES = [Case("dense->csr", RANDOM),
         Case("coo->csr", "NotreDame_www"), Case("coo->csr", RANDOM), Case("coo64->csr", RANDOM),
         Case("csr->csc", "NotreDame_www"), Case("csr->csc", RANDOM), Case("csr->dense", RANDOM)]


@functools.lru_cache(maxsize=2)
def matrix(name: str, dense_case: bool = False) -> sp.csr_array:
    """The case's matrix as canonical scipy CSR (float32, sorted, no duplicates)."""
    if name != RANDOM:
        return load_matrix(name)
    rng = np.random.default_rng(0)
    shape, nnz = ((10_000, 10_000), 1_000_000) if dense_case else ((100_000, 100_000), 1_000_000)
    m = sp.random_array(shape, density=nnz / (shape[0] * shape[1]), format="csr",
                        dtype=np.float32, rng=rng)
    m.sum_duplicates()
    m.sort_indices()
    return m


def _arrays(result, impl: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pointer, indices, values) of a compressed result of any implementation."""
    if impl == "scorch":
        lv = result.levels[1]
        return lv.pos.numpy(), lv.crd.numpy(), result.values.numpy()
    if impl == "torch":
        if result.layout == torch.sparse_csc:
            return result.ccol_indices().numpy(), result.row_indices().numpy(), result.values().numpy()
        return result.crow_indices().numpy(), result.col_indices().numpy(), result.values().numpy()
    result.sort_indices()  # scipy may leave indices unsorted; canonical order for the check
    return result.indptr, result.indices, result.data


def _dense_case(case: Case) -> bool:
    return case.conversion in ("dense->csr", "csr->dense")


def check(case: Case, impl: str, result) -> None:
    m = matrix(case.matrix, _dense_case(case))
    if case.conversion == "csr->dense":
        got = result.numpy() if isinstance(result, torch.Tensor) else np.asarray(result)
        assert np.array_equal(got, m.toarray()), f"{case.id} {impl}: dense result differs"
        return
    want = m.tocsc() if case.conversion == "csr->csc" else m
    if case.conversion == "csr->csc":
        want.sort_indices()
    ptr, idx, val = _arrays(result, impl)
    assert np.array_equal(ptr, want.indptr), f"{case.id} {impl}: pointer array differs"
    assert np.array_equal(idx, want.indices), f"{case.id} {impl}: indices differ"
    assert np.array_equal(val, want.data), f"{case.id} {impl}: values differ"


def prepare(case: Case, impl: str) -> Callable[[], object]:
    """A no-argument function doing only the conversion (inputs built beforehand)."""
    m = matrix(case.matrix, _dense_case(case))
    if case.conversion == "csr->dense":
        if impl == "scorch":
            from scorch.conversion import to_dense
            st = _scorch_csr(m)
            return lambda: to_dense(st)
        if impl == "torch":
            t = _torch_csr(m)
            return lambda: t.to_dense()
        return lambda: m.toarray()
    if case.conversion == "dense->csr":
        dense = _dense(case.matrix)
        if impl == "scorch":
            return lambda: C.from_dense(dense, CSR)
        if impl == "torch":
            return lambda: dense.to_sparse_csr()
        dn = dense.numpy()
        return lambda: sp.csr_array(dn)
    coo = m.tocoo()  # canonical (sorted, no duplicates): has_canonical_format is set
    if case.conversion in ("coo->csr", "coo64->csr"):
        if impl == "scorch":
            st = C.from_coords(np.stack([coo.row, coo.col]), torch.from_numpy(coo.data), m.shape, COO)
            if case.conversion == "coo64->csr":
                st = Storage(st.format, st.shape, [Level(lv.kind, lv.dim, lv.size,
                                                         None if lv.pos is None else lv.pos.long(),
                                                         lv.crd.long(), lv.block_inner)
                                                   for lv in st.levels], st.values, torch.int64)
            return lambda: C.convert(st, CSR)
        if impl == "torch":
            t = torch.sparse_coo_tensor(np.stack([coo.row, coo.col]).astype(np.int64),
                                        torch.from_numpy(coo.data), m.shape).coalesce()
            return lambda: t.to_sparse_csr()
        assert coo.has_canonical_format
        return lambda: coo.tocsr()
    # csr -> csc
    if impl == "scorch":
        st = _scorch_csr(m)
        return lambda: C.convert(st, CSC)
    if impl == "torch":
        t = _torch_csr(m)
        return lambda: t.to_sparse_csc()
    return lambda: m.tocsc()


def _scorch_csr(m: sp.csr_array) -> Storage:
    coo = m.tocoo()
    return C.convert(C.from_coords(np.stack([coo.row, coo.col]), torch.from_numpy(coo.data),
                                   m.shape, COO), CSR)


def _torch_csr(m: sp.csr_array) -> torch.Tensor:
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                   torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data), m.shape)


@functools.lru_cache(maxsize=1)
def _dense(name: str) -> torch.Tensor:
    return torch.from_numpy(matrix(name, True).toarray())


THREADS = int(os.environ.get("SCORCH_BENCH_THREADS", "2"))


@pytest.fixture(autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=[c.id.replace(" ", "-") for c in CASES])
def test_conversion(benchmark, case: Case, impl: str) -> None:
    try:
        fn = prepare(case, impl)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    check(case, impl, fn())
    benchmark.group = f"{case.id} T{THREADS}"
    benchmark.extra_info.update(conversion=case.conversion, matrix=case.matrix, impl=impl)
    if case.conversion == "dense->csr":  # 400 MB scans: a few rounds are plenty
        benchmark.pedantic(fn, rounds=5, warmup_rounds=1)
    else:
        benchmark(fn)
