"""SpMM's register rows prefetch the dense rows they gather (``B[crd[q + D], :]``, every
cache line of the row width, ``facts.dot_prefetch_distance`` entries ahead, up to the last
stored entry, or ``dot_far_prefetch_distance`` where B spans ``DOT_FAR_PREFETCH_MIN_BYTES``),
as SDDMM's vector dot does: at K = 128 float32 the row loop is bound by gathering B's rows
from L3 or memory, not by its 16 FMAs. Oracle: dense torch, over K 1..200 (narrow
rows without prefetch, every register width, panels past the widest), formats, dtypes,
empty and full rows, 1 and 2 threads, on every target this CPU runs."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler_helpers import dense, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import target as T
from scorch.tensor_compiler.lower.facts import (DOT_FAR_PREFETCH_MIN_BYTES, dot_far_prefetch_distance,
                                                dot_prefetch_distance)

EQ = "ij,jk->ik"
RUNNABLE = ["native"] + [n for n in ("avx2", "sse") if T.runnable(T.target_named(n))
                         and not T.target_named(n).native]


@pytest.fixture(autouse=True)
def _restore():
    threads = torch.get_num_threads()
    yield
    T.set_target(None)
    torch.set_num_threads(threads)


def _function(src: str, name: str) -> str:
    start = src.index(f"cdef void {name}(")
    return src[start:src.index("\ncdef ", start + 1)]


def _source(target: str, dtype=torch.float32) -> str:
    a = torch.where(torch.rand(30, 20, generator=torch.Generator().manual_seed(0)) < 0.3,
                    torch.ones(()), torch.zeros(())).to(dtype)
    with T.use_target(target):
        return C.explain(EQ, sparse(a, "csr"), torch.randn(20, 8, dtype=dtype)).source


@pytest.mark.parametrize("target", ["avx512", "avx2", "sse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_variants_prefetch_the_gathered_rows(target, dtype):
    """Every row variant of a cache line or more prefetches each line of B's row the given
    distance ahead (K = 128 float32: 8 entries, 8 lines, or 32 entries where B spans 16 MB
    or more: chosen at run time, ``pfd``), none where B fits in L2 (``pfe`` = 0); narrower
    rows do not."""
    src = _source(target, dtype)
    size = dtype.itemsize
    vt = "float" if size == 4 else "double"
    assert "#define scorch_prefetch(p)" in src
    for W in T.target_named(target).row_widths(vt):
        body = _function(src, f"run_chunk_w{W}")
        near, far = dot_prefetch_distance(W, vt), dot_far_prefetch_distance(W, vt)
        D = str(near) if near == far else "pfd"
        lines = [f"scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + {D}] * a.t1_st_j"
                 + (f" + {c})" if c else ")") for c in range(0, W, 64 // size)]
        if W * size < 64:
            assert near == far == 0 and "scorch_prefetch" not in body
            continue
        if near != far:
            assert (f"pfd = {far} if (a.N_j * a.t1_st_j * sizeof({vt}) >= "
                    f"{DOT_FAR_PREFETCH_MIN_BYTES}) else {near}") in body
        assert (f"pfe = 0 if (a.N_j * a.t1_st_j * sizeof({vt}) <= scorch_l2_bytes()) "
                f"else <int64_t>a.t0_pos1[a.N_i] - {D}") in body
        assert "if q0_1 < pfe:" in body
        assert all(ln in body for ln in lines) and body.count("scorch_prefetch(") == len(lines)
    assert dot_prefetch_distance(128, "float") == 8 and dot_far_prefetch_distance(128, "float") == 32
    assert dot_prefetch_distance(32, "float") == dot_far_prefetch_distance(32, "float") == 32
    # the run-time-width loop (other K) is left as it was
    assert "scorch_prefetch" not in _function(src, "run_chunk")


@pytest.mark.parametrize("name", RUNNABLE)
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(K=st.sampled_from([1, 3, 8, 16, 31, 32, 64, 100, 128, 129, 200]),
       m=st.sampled_from([0, 1, 40, 300]), n=st.sampled_from([1, 9, 70]),
       density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt=st.sampled_from(["csr", "coo", "csc"]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 99))
def test_spmm_equals_dense(name, K, m, n, density, dtype, fmt, threads, seed):
    """Rows from empty to full, more stored entries than the prefetch distance (the
    prefetches stop at the last one), chunked at 2 threads (>= 1024 entries)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.where(torch.rand(m, n, generator=g) < density, torch.randn(m, n, generator=g),
                    torch.zeros(())).to(dtype)
    if m > 1:
        a[m // 2] = 0                                     # an empty row
        a[m // 3] = torch.randn(n, generator=g).to(dtype)   # a full one
    b = torch.randn(n, K, generator=g, dtype=dtype)
    torch.set_num_threads(threads)
    with T.use_target(name):
        S = sparse(a, fmt)
        for _ in range(2):       # the general path, then the warm runner
            got = dense(C.einsum(EQ, S, b))
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            torch.testing.assert_close(got, a @ b, rtol=tol, atol=tol * max(n, 1))


def test_l2_size_is_known():
    """The generated kernels ask the C library for the L2 size; the planner reads sysfs.
    Where both answer (Linux with cache information) they agree: the kernels skip their
    prefetch on the same operands the planner's cache rules see as L2-resident."""
    import os
    from pathlib import Path
    from scorch.tensor_compiler.tiling import l2_cache_bytes
    try:
        sc = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError):
        sc = 0
    if sc > 0 and Path("/sys/devices/system/cpu/cpu0/cache/index2/size").exists():
        assert sc == l2_cache_bytes()


@pytest.mark.parametrize("fmt", ["csr", "coo"])
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("span", ["near", "far"])
def test_prefetch_distances_past_the_thresholds(fmt, K, span):
    """A dense factor past any L2 (4 MB: the near distance) or of 16 MB or more (the far
    distance, 32 entries ahead) gives the same product as dense torch, with fewer stored
    entries than the distance and more, and the last rows' prefetches stopping at the last
    entry; SpMM and SDDMM. (The small operands of the other tests run without prefetch.)"""
    n = (DOT_FAR_PREFETCH_MIN_BYTES if span == "far" else 4 << 20) // (4 * K) + 7
    g = torch.Generator().manual_seed(K)
    for nnz in (5, 300):
        rows = torch.randint(0, 40, (nnz,), generator=g)
        cols = torch.randint(0, n, (nnz,), generator=g)
        a = torch.zeros(40, n)
        a[rows, cols] = torch.randn(nnz, generator=g)
        b = torch.randn(n, K, generator=g)
        S = sparse(a, fmt)
        for _ in range(2):
            torch.testing.assert_close(dense(C.einsum(EQ, S, b)), a @ b, rtol=1e-4, atol=1e-3)
        x = torch.randn(40, K, generator=g)
        want = a * (x @ b.t())
        for _ in range(2):
            got = dense(C.einsum("ij,ik,jk->ij", S, x, b))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
