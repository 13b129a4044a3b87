"""The SDDMM kernel's fast shape (``einsum("ij,ik,kj->ij", S, B, C)``): the fixed-width dot
variants prefetch the gathered rows of C ahead and run 4 stored entries per step with one
transposing horizontal sum (``<type>_hsum4``); a K x n C is copied to n x K only when the
copy costs less than reading it strided (``relayout.relayout_pays``), else the
``run_chunk_strided`` variant reads it in place. Oracle: dense torch, under the native
target and the narrower ISA targets (AVX2: 8-lane vectors, SSE: 4-lane)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch
import scorch.tensor_compiler as C
from scorch.tensor_compiler import relayout as R
from scorch.tensor_compiler.target import runnable, target_named, use_target

EQ = "ij,ik,kj->ij"


def _operands(m, n, K, density, dtype, layout, seed, row_lengths=None):
    g = torch.Generator().manual_seed(seed)
    if row_lengths is not None:   # row i holds its first row_lengths[i % len] columns
        lens = torch.tensor([row_lengths[i % len(row_lengths)] for i in range(m)])
        mask = torch.arange(n)[None, :] < lens[:, None]
    else:
        mask = torch.rand(m, n, generator=g) < density
    s = torch.where(mask, torch.randn(m, n, generator=g), torch.zeros(())).to(dtype)
    B = torch.randn(m, K, generator=g, dtype=dtype)
    Cf = torch.randn(K, n, generator=g, dtype=dtype) if layout == "kn" else \
        torch.randn(n, K, generator=g, dtype=dtype).t()
    return s, B, Cf


def _check(s, B, Cf, fmt):
    S = scorch.sparse_tensor(s, format=fmt)
    for _ in range(2):     # the general path, then the warm runner
        out = scorch.einsum(EQ, S, B, Cf)
        tol = 1e-4 if s.dtype == torch.float32 else 1e-10
        torch.testing.assert_close(out.to_dense(), s * (B @ Cf), rtol=tol,
                                   atol=tol * max(B.shape[1], 1))


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([0, 1, 7, 60]), n=st.sampled_from([0, 1, 9, 200]),
       K=st.sampled_from([1, 3, 4, 16, 17, 32, 64, 128]),
       density=st.sampled_from([0.0, 0.03, 0.3, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt=st.sampled_from(["csr", "coo", "dcsr"]), layout=st.sampled_from(["kn", "nk"]),
       seed=st.integers(0, 2**16))
def test_sddmm_equals_dense(m, n, K, density, dtype, fmt, layout, seed):
    _check(*_operands(m, n, K, density, dtype, layout, seed), fmt)


@pytest.mark.parametrize("K", [4, 8, 32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_row_length_around_the_4_entry_steps(K, dtype):
    """Rows of 0..9 entries (4-entry steps, then the rest entry by entry; empty rows), over
    more entries than the prefetch distance (the prefetches stop at the last entry)."""
    s, B, Cf = _operands(300, 40, K, 0, dtype, "nk", K, row_lengths=list(range(10)))
    _check(s, B, Cf, "csr")


@pytest.mark.parametrize("target", ["avx2", "sse"])
def test_narrower_targets_equal_dense(target):
    """The transposing horizontal sum of 8-lane (AVX2) and 4-lane (SSE) vectors, and the
    4-lane store, on the same data as the native build."""
    if not runnable(target_named(target)):
        pytest.skip(f"this CPU cannot run {target} kernels")
    with use_target(target):
        for K, dtype, layout in [(32, torch.float32, "kn"), (128, torch.float32, "nk"),
                                 (32, torch.float64, "nk")]:
            s, B, Cf = _operands(90, 70, K, 0.3, dtype, layout, K, row_lengths=None)
            _check(s, B, Cf, "csr")


def _source(target: str, dtype=torch.float32) -> str:
    g = torch.Generator().manual_seed(0)
    S = scorch.sparse_tensor(torch.where(torch.rand(30, 20, generator=g) < 0.3, torch.ones(()),
                                         torch.zeros(())).to(dtype), format="csr")
    with use_target(target):
        return C.explain(EQ, S, torch.randn(30, 32, dtype=dtype), torch.randn(20, 32, dtype=dtype).t()).source


def _function(src: str, name: str) -> str:
    start = src.index(f"cdef void {name}(")
    return src[start:src.index("\ncdef ", start + 1)]


@pytest.mark.parametrize("target,lanes", [("avx512", 16), ("avx2", 8)])
def test_dot_code_shape(target, lanes):
    """K = 32 float32: 4 entries per step, each one lane-wise sum of 32 / lanes vector
    products, one hsum4 into a 4-lane vector stored at once; the rows 32 entries ahead
    prefetched (2 cache lines each), up to the last stored entry."""
    w32 = _function(_source(target), "run_chunk_w32")
    vtype = "scorch_vf"            # one whole register on either target
    assert "while q0_1 + 3 < h0_1:" in w32
    assert f"(<scorch_vf16*>(a.out_vals + q0_1))[0] = {vtype}_hsum4(dv0, dv1, dv2, dv3)" in w32
    assert w32.count(f"(<{vtype}*>(a.t2_vals + o2_1_3 + ") == 32 // lanes
    assert ("pfe = 0 if (a.N_j * a.t2_st_j * sizeof(float) <= scorch_l2_bytes()) "
            "else <int64_t>a.t0_pos1[a.N_i] - 32") in w32
    assert "scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + 35] * a.t2_st_j + 16)" in w32
    assert "for q0_1 in range(q0_1, h0_1):" in w32          # the rest of the row
    # the strided variant is chosen last, whenever a streamed stride is not 1
    src = _source(target)
    assert "    if a.t1_st_k != 1 or a.t2_st_k != 1:\n        fn = run_chunk_strided" in src
    assert "o2_2 = o2_1 + c_k * a.t2_st_k" in _function(src, "run_chunk_strided")


def test_double_dot_on_avx2_sums_4_lane_vectors():
    """float64 on AVX2: 4 doubles a register, the 4 results one register (scorch_vd)."""
    w32 = _function(_source("avx2", torch.float64), "run_chunk_w32")
    assert "(<scorch_vd*>(a.out_vals + q0_1))[0] = scorch_vd_hsum4(dv0, dv1, dv2, dv3)" in w32
    # 256-byte rows: 16 entries ahead (32 where C spans 16 MB), 4 cache lines each
    assert "pfd = 32 if (a.N_j * a.t2_st_j * sizeof(double) >= 16777216) else 16" in w32
    assert "scorch_prefetch(a.t2_vals + a.t0_crd1[q0_1 + pfd + 3] * a.t2_st_j + 24)" in w32


def test_no_4_entry_steps_where_the_output_is_not_the_pattern():
    """A dot summed over j too (``ij,ik,kj->i``) is not stored per entry: no hsum4."""
    g = torch.Generator().manual_seed(0)
    S = scorch.sparse_tensor(torch.where(torch.rand(30, 20, generator=g) < 0.3, torch.ones(()),
                                         torch.zeros(())), format="csr")
    B, Cf = torch.randn(30, 32), torch.randn(20, 32).t()
    assert "_hsum4(" not in C.explain("ij,ik,kj->i", S, B, Cf).source
    out = scorch.einsum("ij,ik,kj->i", S, B, Cf)
    torch.testing.assert_close(out, (S.to_dense() * (B @ Cf)).sum(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_few_entries_per_column_read_C_strided(fmt):
    """A K x n C against a pattern of few entries per column is read with its stride (the
    copy would move more than 12x the entries the kernel reads), on both paths; explain says
    so. The same einsum with many entries copies C."""
    g = torch.Generator().manual_seed(3)
    m, n, K = 40, 5000, 32
    s = torch.zeros(m, n)
    s[torch.randint(0, m, (60,), generator=g), torch.randint(0, n, (60,), generator=g)] = 1.5
    B, Cf = torch.randn(m, K, generator=g), torch.randn(K, n, generator=g)
    S = scorch.sparse_tensor(s, format=fmt)
    assert not R.relayout_pays(Cf.numel(), S._nnz() * K)
    plan = str(scorch.explain(EQ, S, B, Cf))
    assert f"operand 2 (stride {n} along k, the innermost loop): read with its stride" in plan
    _check(s, B, Cf, fmt)
    dense = torch.where(torch.rand(m, n, generator=g) < 0.5, 1.0, 0.0)
    assert "copied to stride 1 once per call" in str(scorch.explain(EQ, scorch.sparse_tensor(dense, format=fmt), B, Cf))


def test_relayout_pays_counts_the_copy():
    assert R.relayout_pays(1000, 1000)
    assert R.relayout_pays(R.COPY_PER_READ * 1000, 1000)
    assert not R.relayout_pays(R.COPY_PER_READ * 1000 + 1, 1000)
    assert not R.relayout_pays(10, 0)
