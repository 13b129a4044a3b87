"""SDDMM's fixed-width vector dots, four stored entries at a time: where the row they share
(``B[i, :]``) does not stay in registers (``facts.dot_row_shared``: AVX2 K = 128 float32,
K >= 32 float64) the dots run vector by vector of that row and the stored value multiplies
each sum once. Built for AVX2 (runs on AVX-512 machines too), oracle dense torch: both
layouts of C and the ``jk`` form, K around and at the fixed widths, empty and full
patterns, CSR/COO/CSC, float32/64, 1 and 2 threads."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch
import scorch.tensor_compiler as C
from scorch.tensor_compiler import threads as thread_policy
from scorch.tensor_compiler.lower.facts import dot_row_shared
from scorch.tensor_compiler.target import current, use_target


def _avx2():
    """The AVX2 build: the native one where that is AVX2 (kernels shared with the other
    SDDMM tests), else ``SCORCH_TARGET=avx2``'s; skipped on a CPU without AVX2."""
    if current().name == "avx2":
        return contextlib.nullcontext()
    try:
        return use_target("avx2")
    except Exception as e:    # a CPU without AVX2 refuses the target
        pytest.skip(f"no AVX2 target here: {e}")


def test_row_shared_rule():
    # AVX2 (16 ymm): K = 128 float32 is 16 vectors, K = 32 is 4 (kept in registers)
    assert dot_row_shared(16, 4, 16) and dot_row_shared(8, 4, 16) and not dot_row_shared(4, 4, 16)
    # AVX-512 (32 zmm): up to K = 128 float32 (8 vectors) the row stays in registers
    assert not dot_row_shared(8, 4, 32) and dot_row_shared(16, 4, 32)


def _sources(dtype):
    g = torch.Generator().manual_seed(1)
    s = torch.where(torch.rand(9, 8, generator=g) < 0.6, torch.rand(9, 8, generator=g),
                    torch.zeros(())).to(dtype)
    ops = (scorch.sparse_tensor(s, format="csr"), torch.rand(9, 5, dtype=dtype),
           torch.rand(5, 8, dtype=dtype))
    return C.explain("ij,ik,kj->ij", *ops).source


def _chunk(src, name):
    body = src.split(f"cdef void {name}(")[1]
    return body.split("cdef void ")[0]


def test_avx2_source_shares_the_row_only_where_it_does_not_fit():
    with _avx2():
        src = _sources(torch.float32)
    w128, w32 = _chunk(src, "run_chunk_w128"), _chunk(src, "run_chunk_w32")
    # vector by vector: each entry's sum grows by one product per statement, then S scales it
    assert "dv0 = dv0 + ((<scorch_vf*>(a.t1_vals + o1_0 + 120))[0]" in w128
    assert "dv3 = dv3 * a.t0_vals[q0_1 + 3]" in w128
    assert "dv0 = dv0 +" not in w32 and "dv0 = ((a.t0_vals[q0_1] *" in w32
    with use_target("avx512"):
        src = _sources(torch.float32)
    assert "dv0 = dv0 +" not in _chunk(src, "run_chunk_w128")


@pytest.fixture(scope="module")
def parallel_small():
    """Small problems split into chunks too (several threads' boundaries exercised)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thread_policy, "PARALLEL_MIN_WORK", 0)
        C.plan_cache_clear()
        yield
    C.plan_cache_clear()    # no runner keeps the patched threshold


@settings(max_examples=20, deadline=None)
@given(m=st.sampled_from([0, 1, 9, 40]), n=st.sampled_from([0, 1, 7, 300]),
       K=st.sampled_from([1, 7, 32, 64, 128]), density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]), fmt=st.sampled_from(["csr", "coo", "csc"]),
       form=st.sampled_from(["kn", "nk", "jk"]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_sddmm_entry_dots_equal_dense(parallel_small, m, n, K, density, dtype, fmt, form, threads, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.where(torch.rand(m, n, generator=g) < density,
                    torch.randn(m, n, generator=g), torch.zeros(())).to(dtype)
    B = torch.randn(m, K, generator=g, dtype=dtype)
    Cnk = torch.randn(n, K, generator=g, dtype=dtype)
    if form == "jk":   # C as n x K by its equation: one more kernel per format, CSR's only
        eq, c, fmt = "ij,ik,jk->ij", Cnk, "csr"
    else:              # the ij,ik,kj kernels are test_sddmm_layout's (same cache)
        eq, c = "ij,ik,kj->ij", Cnk.t().contiguous() if form == "kn" else Cnk.t()
    S = scorch.sparse_tensor(s, format=fmt)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _avx2():
            out = scorch.einsum(eq, S, B, c)
    finally:
        torch.set_num_threads(old)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out.to_dense(), s * (B @ Cnk.t()), rtol=tol, atol=tol * K)
