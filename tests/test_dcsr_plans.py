"""SpGEMM over doubly-compressed operands (DCSR / DCSC): the planner must not pick a
plan whose kernel merges each row of one operand with the whole stored-row list of the
other, restarted per row (O(rows x n): ``work_estimate.RESTARTED_MERGE_VISITS``), at any
thread count: the outer product, or (session 39) the row-wise order with that operand's
top level read dense (``work_estimate.dense_top_reads``), priced like CSR's plan; results
equal dense torch."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch as real_torch

import scorch
from scorch.tensor_compiler.work_estimate import DENSE_TOP_VISITS

EQS = {"A @ A": "ij,jk->ik", "A.t() @ A": "ji,jk->ik", "A @ A.t()": "ij,kj->ik"}


def _mesh(n, seed, per_row=4):
    r = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    m = sp.csr_matrix((r.standard_normal(per_row * n).astype(np.float32),
                       (rows, r.integers(0, n, per_row * n))), shape=(n, n))
    m.sum_duplicates()
    m.sort_indices()
    return m


def _restarted_merge(plan):
    """Whether the plan reads a sparse operand's compressed top level below the outermost
    loop (so merges it again for every iteration above): the plan of bug 4. An operand read
    with that level dense (DCSR as CSR) is located there instead."""
    order = plan.loop_order
    return any(ap.sparse and ap.levels[0].kind.letter == "c" and ap.levels[0].var != order[0]
               for ap in plan.schedule.accesses)


def _explain(name, A, threads):
    old = scorch.get_num_threads()
    scorch.set_num_threads(threads)
    try:
        return scorch.explain(EQS[name], A, A)
    finally:
        scorch.set_num_threads(old)


@pytest.mark.parametrize("fmt", ["dcsr", "dcsc"])
@pytest.mark.parametrize("name", list(EQS))
@pytest.mark.parametrize("threads", [1, 2])
def test_plan_is_not_restarted_merge(fmt, name, threads):
    m = _mesh(1 << 13, seed=threads)
    k = _explain(name, scorch.sparse_tensor(m, format=fmt), threads)
    assert not _restarted_merge(k), (fmt, name, k.loop_order)
    # CSR's loop nest, plus the top levels built dense (a restarted merge: ~100x)
    plain = _explain(name, scorch.sparse_tensor(m, format="csr" if fmt == "dcsr" else "csc"), threads)
    e, p = k.schedule.estimates[0].estimate, plain.schedule.estimates[0].estimate
    assert e.total - e.conversions <= 1.01 * p.total
    assert e.conversions <= DENSE_TOP_VISITS * m.shape[0] * len(e.dense_tops)


@pytest.mark.parametrize("fmt", ["dcsr", "dcsc"])
def test_values_equal_dense(fmt):
    m = _mesh(300, seed=7)
    A = scorch.sparse_tensor(m, format=fmt)
    D = real_torch.tensor(m.toarray())
    for got, want in ((A @ A, D @ D), (A.t() @ A, D.t() @ D), (A @ A.t(), D @ D.t())):
        np.testing.assert_allclose(got.to_dense().numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


# --- the top level read dense, and a DCSR result produced as CSR, against dense torch -------

from hypothesis import given, settings, strategies as st  # noqa: E402

FORMATS = ["dcsr", "dcsc", "csr", "csc", "coo"]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 2100), density=st.sampled_from([0.0, 0.002, 0.05, 1.0]),
       fa=st.sampled_from(FORMATS), fb=st.sampled_from(FORMATS), eq=st.sampled_from(list(EQS.values())),
       dtype=st.sampled_from([real_torch.float32, real_torch.float64]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2 ** 16))
def test_doubly_compressed_products_equal_dense(n, density, fa, fb, eq, dtype, threads, seed):
    """Square-ish products over any mix of (doubly) compressed formats, empty to fully
    dense: the plans that read a DCSR operand's top level dense (past ``STATS_MIN_NNZ``
    entries, where statistics are taken) and produce a DCSR result as CSR equal dense torch."""
    n = min(n, 300) if density == 1.0 else n
    g = real_torch.Generator().manual_seed(seed)
    Da = (real_torch.rand(n, n, generator=g) < density).to(dtype) * real_torch.randn(n, n, generator=g, dtype=dtype)
    Db = (real_torch.rand(n, n, generator=g) < density).to(dtype) * real_torch.randn(n, n, generator=g, dtype=dtype)
    A, B = scorch.sparse_tensor(Da, format=fa), scorch.sparse_tensor(Db, format=fb)
    old = scorch.get_num_threads()
    scorch.set_num_threads(threads)
    try:
        got = scorch.einsum(eq, A, B)
    finally:
        scorch.set_num_threads(old)
    want = real_torch.einsum(eq, Da, Db)
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    tol = 1e-4 if dtype == real_torch.float32 else 1e-10
    real_torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(1, n))


def test_hypersparse_dcsr_product_builds_no_array_of_its_extent():
    """A 20M x 20M DCSR with 1,000 entries: no level is read dense (an 80 MB ``pos``), the
    result stays DCSR, and it equals the product of its stored entries."""
    n, nnz = 20_000_000, 1000
    g = real_torch.Generator().manual_seed(3)
    idx = real_torch.randint(0, 2000, (2, nnz), generator=g) * 10_000
    vals = real_torch.rand(nnz, generator=g)
    H = scorch.sparse_tensor((idx, vals), size=(n, n), format="dcsr")
    k = scorch.explain("ij,jk->ik", H, H)
    assert not any(ap.dense_top for ap in k.schedule.accesses)
    assert k.schedule.output.final_format is None and k.output_format.name == "dcsr"
    C = H @ H
    assert C.format.name == "dcsr"
    # the product of the compact (2000 x 2000 grid) matrix, placed back
    small = real_torch.zeros(2000, 2000, dtype=vals.dtype)
    small.index_put_((idx[0] // 10_000, idx[1] // 10_000), vals, accumulate=True)
    want = small @ small
    r, c = C.indices()
    real_torch.testing.assert_close(C.values(), want[r // 10_000, c // 10_000], rtol=1e-5, atol=1e-5)
    assert C.values().numel() == int((want != 0).sum())
