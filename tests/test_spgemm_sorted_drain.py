"""SpGEMM output rows come out sorted and deduplicated whichever way the dense workspace is
read out (``workspace.h``: dense_ws_drain): on AVX2 without AVX-512 the sorting network
(rows of up to kNetSortMax = 128 entries: one, two, four, eight or sixteen registers of
keys), the marks scan of the whole extent without a touched list (``run_chunk_scan``:
fibers dense in the extent on average), the bitmap of a narrow range (rows whose span has
no more 64-bit words than entries: meshes, banded matrices), the
marker scan (rows dense in their span), the rank sort (short spread-out rows, up to
kRankSortMax = 128 entries) and the radix sort (longer spread-out rows). Oracle: dense torch; the sorted promise is checked on the stored
coordinates, and the result feeds another kernel and the conversions."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch

FORMATS = ["csr", "dcsr", "coo", "csc", "dcsc"]


def random_matrix(rng, m: int, n: int, density: float, dtype: torch.dtype) -> torch.Tensor:
    keep = torch.from_numpy(rng.random((m, n)) < density)
    vals = torch.from_numpy(rng.standard_normal((m, n))).to(dtype)
    return torch.where(keep, vals, torch.zeros((), dtype=dtype))


def assert_rows_sorted_unique(s) -> None:
    """Stored CSR coordinates strictly increase inside every row (the default's promise)."""
    m = s.to_scipy().tocsr()
    indptr, indices = m.indptr, m.indices
    assert m.has_canonical_format or m.nnz == 0
    inner = np.ones(len(indices), dtype=bool)
    inner[indptr[:-1][indptr[:-1] < len(indices)]] = False   # a row's first entry
    assert (np.diff(indices.astype(np.int64), prepend=-1)[inner] > 0).all()


def check_product(a: torch.Tensor, b: torch.Tensor, fmt_a: str, fmt_b: str) -> None:
    A = scorch.sparse_tensor(a, format=fmt_a)
    B = scorch.sparse_tensor(b, format=fmt_b)
    C = scorch.einsum("ij,jk->ik", A, B, out_format="csr")
    expect = a @ b
    tol = 1e-4 if a.dtype == torch.float32 else 1e-10
    torch.testing.assert_close(C.to_dense(), expect, rtol=tol, atol=tol)
    assert_rows_sorted_unique(C)
    # the sorted output is a valid operand: co-iteration in a further kernel, conversions
    torch.testing.assert_close(scorch.einsum("ik,ik->ik", C, C).to_dense(), expect * expect,
                               rtol=tol, atol=tol)
    torch.testing.assert_close(torch.from_numpy(C.to_scipy().toarray()), expect, rtol=tol, atol=tol)
    torch.testing.assert_close(C.to_torch().to_dense(), expect, rtol=tol, atol=tol)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 6), inner=st.integers(0, 40), n=st.sampled_from([0, 1, 7, 300, 5000]),
       density_a=st.sampled_from([0.0, 0.1, 0.5, 1.0]), density_b=st.sampled_from([0.0, 0.01, 0.05, 0.2, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt_a=st.sampled_from(FORMATS), fmt_b=st.sampled_from(FORMATS), seed=st.integers(0, 2**16))
def test_spgemm_matches_dense_and_rows_are_sorted(m, inner, n, density_a, density_b, dtype,
                                                  fmt_a, fmt_b, seed):
    rng = np.random.default_rng(seed)
    check_product(random_matrix(rng, m, inner, density_a, dtype),
                  random_matrix(rng, inner, n, density_b, dtype), fmt_a, fmt_b)


@pytest.mark.parametrize("row_nnz", [1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100,
                                     127, 128, 129, 200, 700])
@pytest.mark.parametrize("spread", [True, False])
def test_every_drain_path(row_nnz, spread):
    """Rows of exactly ``row_nnz`` entries (each side of the network's register counts, 8,
    16, 32 and 64, and of the rank sort's 128), spread over a wide extent (rank sort up to
    128, radix sort above; 700 spread entries are dense enough for the marker scan) or
    packed into a narrow span (marker scan). ``[A, A] @ [P; P]`` = 2 A P with P a random
    permutation: the workspace is touched in shuffled order and every output entry gets two
    contributions that it must merge into one."""
    rng = np.random.default_rng(row_nnz)
    extent = 60_000 if spread else row_nnz + 3
    rows = 4
    cols = np.concatenate([rng.choice(extent, row_nnz, replace=False) for _ in range(rows)])
    a = sp.csr_array((rng.standard_normal(len(cols)), (np.repeat(np.arange(rows), row_nnz), cols)),
                     shape=(rows, extent))
    perm = sp.csr_array((np.ones(extent), (np.arange(extent), rng.permutation(extent))),
                        shape=(extent, extent))
    C = scorch.einsum("ij,jk->ik", scorch.from_scipy(sp.hstack([a, a], format="csr")),
                      scorch.from_scipy(sp.vstack([perm, perm], format="csr")))
    assert C.nnz == a.nnz
    torch.testing.assert_close(C.to_dense(), torch.from_numpy(2 * (a @ perm).toarray()))
    assert_rows_sorted_unique(C)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 5), inner=st.integers(0, 30), n=st.sampled_from([0, 1, 9, 70, 3000]),
       density_a=st.sampled_from([0.0, 0.2, 1.0]), density_b=st.sampled_from([0.0, 0.02, 0.3, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       index=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 2**16))
def test_spgemm_index_types(m, inner, n, density_a, density_b, dtype, index, seed):
    """CSR operands with int32 or int64 index arrays (shared from scipy as they are): the
    same sorted, deduplicated rows as dense torch's product."""
    rng = np.random.default_rng(seed)
    a = random_matrix(rng, m, inner, density_a, dtype)
    b = random_matrix(rng, inner, n, density_b, dtype)

    def csr(t):
        x = sp.csr_array(t.numpy())
        x.indptr, x.indices = x.indptr.astype(index), x.indices.astype(index)
        return scorch.from_scipy(x)
    A, B = csr(a), csr(b)
    assert A.index_dtype == (torch.int32 if index is np.int32 else torch.int64) or A.nnz == 0
    C = scorch.einsum("ij,jk->ik", A, B)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(C.to_dense(), a @ b, rtol=tol, atol=tol)
    assert_rows_sorted_unique(C)


def test_output_buffers_reused_across_calls():
    """A kernel's output buffers start from the largest block the last calls gave back
    (``workspace.h``: BlockPool::take_largest): products of very different sizes and value
    types, one after another, each equal to scipy's, whatever room was reused."""
    rng = np.random.default_rng(5)
    for n, density, dtype in [(3000, 0.003, np.float32), (40, 0.1, np.float64), (7, 0.0, np.float32),
                              (2000, 0.01, np.float64), (3, 1.0, np.float32), (3000, 0.003, np.float64)]:
        a = sp.random_array((n, n), density=density, format="csr", dtype=dtype, rng=rng)
        b = sp.random_array((n, n), density=density, format="csr", dtype=dtype, rng=rng)
        C = scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(b))
        torch.testing.assert_close(C.to_dense(), torch.from_numpy((a @ b).toarray()))
        assert_rows_sorted_unique(C)


def _one_thread(fn):
    """Run ``fn`` at one thread: one chunk, whose buffers become the output (no copy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.tuples(st.sampled_from([0, 1, 40, 700, 3000]), st.sampled_from([0.0, 0.002, 0.05, 1.0])),
                      min_size=2, max_size=5),
       dtype=st.sampled_from([np.float32, np.float64]), index=st.sampled_from([np.int32, np.int64]),
       seed=st.integers(0, 2**16))
def test_outputs_that_took_the_buffers_outlive_later_calls(sizes, dtype, index, seed):
    """A one-chunk product's output arrays are the kernel's own buffer blocks
    (``AppendBuffer::release``): they stay intact while later products (other sizes, the
    same kernel) run and take blocks from the pool, and each equals scipy's product."""
    rng = np.random.default_rng(seed)
    held = []

    def run():
        for n, density in sizes:
            n = min(n, 700) if density == 1.0 else n
            a = sp.random_array((n, n), density=density, format="csr", dtype=dtype, rng=rng)
            a.indptr, a.indices = a.indptr.astype(index), a.indices.astype(index)
            held.append((scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(a)), a @ a))
    _one_thread(run)
    for C, expect in held:
        torch.testing.assert_close(C.to_dense(), torch.from_numpy(expect.toarray()))
        assert_rows_sorted_unique(C)


def test_released_buffers_return_to_the_pool():
    """When an output that took a kernel's buffer blocks dies, the blocks go back to that
    kernel module's pool: the next call writes into the same memory (no fresh pages). The
    coordinates and the float32 values need blocks of one size, so which of the two blocks
    each takes may swap between calls: the set of blocks is what stays."""
    rng = np.random.default_rng(3)
    a = sp.random_array((3000, 3000), density=0.003, format="csr", dtype=np.float32, rng=rng)
    A = scorch.from_scipy(a)

    def crd_address():
        C = scorch.einsum("ij,jk->ik", A, A)
        return sorted((C._storage.levels[-1].crd.data_ptr(), C._storage.values.data_ptr()))
    _one_thread(crd_address)   # compiled, the pool holds the blocks
    first = _one_thread(crd_address)
    assert _one_thread(crd_address) == first


@pytest.mark.parametrize("b_row", [1, 2, 5, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_marks_scan_either_side_of_its_threshold(b_row, dtype):
    """A kernel whose fibers mark one column in eight of the extent or more on average
    (``nnz(A) / N_i * nnz(B) / N_j * 8 >= N_k``) adds without a touched list and reads each
    row out by scanning the marks (``run_chunk_scan``); below that, the list. Here N_k = 64
    and A's rows hold 0 to 10 entries (mean 16/6): ``b_row`` = 1 or 2 entries per row of B
    stays below (21 and 43 < 64), 5 and 64 (every column: full output rows) are above.
    Rows that share columns of B merge their contributions; empty rows stay empty; the
    scan's rows are sorted for ``sorted=False`` too. A has more than 16 entries: the rows
    of B are also prefetched ahead."""
    rng = np.random.default_rng(b_row)
    inner, n = 10, 64
    a = torch.zeros(6, inner, dtype=dtype)
    for i, k in enumerate([0, 1, 3, 10, 0, 2]):
        a[i, rng.choice(inner, k, replace=False)] = torch.from_numpy(rng.standard_normal(k)).to(dtype)
    b = torch.zeros(inner, n, dtype=dtype)
    for j in range(inner):
        b[j, rng.choice(n, b_row, replace=False)] = torch.from_numpy(rng.standard_normal(b_row)).to(dtype)
    check_product(a, b, "csr", "csr")
    if dtype == torch.float32:
        C = scorch.einsum("ij,jk->ik", scorch.sparse_tensor(a, format="csr"),
                          scorch.sparse_tensor(b, format="csr"), sorted=False)
        torch.testing.assert_close(C.to_dense(), a @ b, rtol=1e-4, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 40), inner=st.integers(0, 60), n=st.sampled_from([0, 1, 8, 64, 2000]),
       density_a=st.sampled_from([0.0, 0.05, 0.3, 1.0]), density_b=st.sampled_from([0.0, 0.01, 0.2, 1.0]),
       empty_rows=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]),
       index=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 2**16))
def test_row_prefetch_and_scan_over_many_rows(m, inner, n, density_a, density_b, empty_rows, dtype,
                                               index, seed):
    """Enough stored entries in A that the rows of B are prefetched ahead (16 entries and
    more), up to the last entry, with the touched list or the marks scan (dense B), int32
    or int64 index arrays, every other row of A emptied or not: dense torch's product, rows
    sorted and unique."""
    rng = np.random.default_rng(seed)
    a = random_matrix(rng, m, inner, density_a, dtype)
    if empty_rows:
        a[::2] = 0
    b = random_matrix(rng, inner, n, density_b, dtype)

    def csr(t):
        x = sp.csr_array(t.numpy())
        x.indptr, x.indices = x.indptr.astype(index), x.indices.astype(index)
        return scorch.from_scipy(x)
    C = scorch.einsum("ij,jk->ik", csr(a), csr(b))
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(C.to_dense(), a @ b, rtol=tol, atol=tol)
    assert_rows_sorted_unique(C)


@pytest.mark.parametrize("band", [1, 3, 40, 200])
def test_banded_rows_read_out_through_the_bitmap_and_past_it(band):
    """A banded A @ A^T over 6000 columns: each row's columns span ~2 x band (a few 64-bit
    words against ~2 x band entries: the bitmap read-out), plus rows with one far entry
    (a span past the bitmap's limit: the other read-outs), against dense torch."""
    rng = np.random.default_rng(band)
    n = 6000
    rows = np.repeat(np.arange(n), 2 * band + 1)
    cols = np.clip(rows + np.tile(np.arange(-band, band + 1), n), 0, n - 1)
    far = rng.choice(n, 60, replace=False)
    rows = np.concatenate([rows, far])
    cols = np.concatenate([cols, (far + n // 2) % n])
    a = sp.coo_array((rng.standard_normal(rows.size), (rows, cols)), shape=(n, n)).tocsr()
    a.sum_duplicates()
    A = scorch.from_scipy(a)
    At = scorch.from_scipy(a.T.tocsr())
    C = scorch.einsum("ij,jk->ik", A, At)
    want = (a @ a.T).tocsr()
    want.sort_indices()
    got = C.to_scipy().tocsr()
    assert_rows_sorted_unique(C)
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.data, want.data, rtol=1e-10, atol=1e-10)
