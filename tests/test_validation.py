"""Foreign storage is checked on the way in (scorch/_runtime/validate.pyx via interop):
malformed torch and scipy sparse tensors raise a ValueError naming the operand and the
problem, valid but unsorted ones (torch and scipy allow them) give the right answer, and the
verdict is kept per tensor."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import interop
from scorch._runtime import validate

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


def dense_of(r):
    return r.to_dense() if isinstance(r, scorch.SparseTensor) else r


def csr(crow, col, vals, shape, layout="csr"):
    ctor = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
    return ctor(torch.tensor(crow), torch.tensor(col), torch.tensor(vals, dtype=torch.float64),
                shape, check_invariants=False)


def coo(indices, vals, shape, coalesced=None):
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(vals, dtype=torch.float64),
                                   shape, check_invariants=False, is_coalesced=coalesced)


BAD_TORCH = [
    ("coo negative", lambda: coo([[0, -1], [0, 1]], [1., 2.], (3, 3)), "index -1 out of range"),
    ("coo too big", lambda: coo([[0, 1], [0, 3]], [1., 2.], (3, 3)), "index 3 out of range for size 3 in dimension 1"),
    ("coo flagged coalesced, too big", lambda: coo([[0, 9]], [1., 2.], (3,), True), "index 9 out of range"),
    ("csr column", lambda: csr([0, 1, 2], [0, 7], [1., 2.], (2, 5)),
     "column index 7 out of range for size 5"),
    ("csr negative column", lambda: csr([0, 1, 2], [0, -2], [1., 2.], (2, 5)),
     "column index -2 out of range"),
    ("csr crow beyond nnz", lambda: csr([0, 1, 9], [0, 1], [1., 2.], (2, 5)),
     "crow_indices[-1] is 9 but col_indices has 2 entries"),
    ("csr decreasing crow", lambda: csr([0, 2, 1, 2], [0, 1], [1., 2.], (3, 5)),
     "crow_indices decreases at entry 2"),
    ("csr crow not from 0", lambda: csr([1, 1, 2], [0, 1], [1., 2.], (2, 5)), "crow_indices[0] is 1"),
    ("csc row", lambda: csr([0, 1, 2], [0, 4], [1., 2.], (4, 2), "csc"),
     "row index 4 out of range for size 4"),
    ("bsr column", lambda: torch.sparse_bsr_tensor(torch.tensor([0, 1]), torch.tensor([3]),
                                                    torch.ones(1, 2, 2), (2, 4), check_invariants=False),
     "column index 3 out of range for size 2"),
]


@pytest.mark.parametrize("name,make,message", BAD_TORCH, ids=[c[0] for c in BAD_TORCH])
@pytest.mark.parametrize("entry", ["sparse_tensor", "einsum"])
def test_malformed_torch_sparse_is_refused(name, make, message, entry):
    t = make()
    with pytest.raises(ValueError, match="torch sparse_") as info:
        if entry == "sparse_tensor":
            scorch.sparse_tensor(t)
        else:
            scorch.einsum("ij,j->i" if t.dim() == 2 else "i,i->", t, torch.ones(t.shape[-1], dtype=t.dtype))
    assert message in str(info.value)


def test_meta_and_string_inputs():
    with pytest.raises(ValueError, match="CPU"):
        scorch.sparse_tensor(torch.empty(3, 3, device="meta"))
    with pytest.raises(ValueError, match="CPU"):
        scorch.sparse_tensor((torch.zeros(1, 2, dtype=torch.long, device="meta"), torch.ones(2)), size=(3,))
    with pytest.raises(TypeError, match="values must be numbers"):
        scorch.sparse_tensor((torch.tensor([[0, 1]]), ["a", "b"]), size=(3,))
    with pytest.raises(TypeError, match="data must hold numbers"):
        scorch.sparse_tensor(np.array([["a", "b"]]))
    with pytest.raises(TypeError, match=r"dtype must be a torch.dtype, got 'float32' \(use torch.float32\)"):
        scorch.sparse_tensor(torch.eye(3), dtype="float32")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        scorch.tensor([[1.0, 0.0]], dtype="float32", format="csr")


@st.composite
def shuffled_compressed(draw):
    """A valid torch CSR/CSC tensor whose segments are shuffled and may repeat a
    coordinate (an entry split in two), with the dense tensor it means."""
    m = draw(st.integers(0, 6))
    n = draw(st.integers(0, 6))
    density = draw(st.sampled_from([0.0, 0.3, 1.0]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    layout = draw(st.sampled_from(["csr", "csc"]))
    g = torch.Generator().manual_seed(seed)
    dense = (torch.randint(1, 5, (m, n), generator=g) * (torch.rand(m, n, generator=g) < density)).to(dtype)
    t = dense.to_sparse_csr() if layout == "csr" else dense.to_sparse_csc()
    pos = (t.crow_indices() if layout == "csr" else t.ccol_indices()).tolist()
    crd = (t.col_indices() if layout == "csr" else t.row_indices()).tolist()
    vals = t.values().tolist()
    new_pos, new_crd, new_vals = [0], [], []
    for p in range(len(pos) - 1):
        seg = list(range(pos[p], pos[p + 1]))
        order = torch.randperm(len(seg), generator=g).tolist()
        for q in order:
            c, v = crd[seg[q]], vals[seg[q]]
            if draw(st.booleans()):  # split into two entries of the same coordinate
                new_crd += [c, c]
                new_vals += [v - 1, 1]
            else:
                new_crd.append(c)
                new_vals.append(v)
        new_pos.append(len(new_crd))
    ctor = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
    bad = ctor(torch.tensor(new_pos), torch.tensor(new_crd, dtype=torch.int64),
               torch.tensor(new_vals, dtype=dtype), (m, n), check_invariants=False)
    return bad, dense


@settings(max_examples=40, deadline=None)
@given(shuffled_compressed())
def test_unsorted_torch_compressed_is_sorted_and_summed(case):
    t, dense = case
    s = scorch.sparse_tensor(t)
    assert torch.equal(s.to_dense(), dense)
    x = torch.arange(dense.shape[1], dtype=dense.dtype)
    torch.testing.assert_close(dense_of(scorch.einsum("ij,j->i", t, x)), dense @ x)


def test_unsorted_bsr_blocks():
    blocks = torch.arange(1., 13.).reshape(3, 2, 2)
    t = torch.sparse_bsr_tensor(torch.tensor([0, 3]), torch.tensor([2, 0, 2]), blocks, (2, 6),
                                check_invariants=False)
    expect = torch.zeros(2, 6)
    expect[:, 4:6] = blocks[0] + blocks[2]
    expect[:, 0:2] = blocks[1]
    assert torch.equal(scorch.sparse_tensor(t).to_dense(), expect)


def test_coo_flagged_coalesced_but_unsorted():
    t = coo([[2, 0, 2], [1, 1, 1]], [1., 2., 4.], (3, 3), coalesced=True)
    expect = torch.zeros(3, 3, dtype=torch.float64)
    expect[0, 1], expect[2, 1] = 2., 5.
    assert torch.equal(scorch.sparse_tensor(t).to_dense(), expect)
    torch.testing.assert_close(dense_of(scorch.einsum("ij,j->i", t, torch.ones(3, dtype=torch.float64))),
                               expect.sum(1))


def test_verdict_is_kept_per_tensor_and_renewed_after_a_change(monkeypatch):
    t = torch.eye(4).to_sparse_csr()
    calls = []
    real = validate.compressed
    monkeypatch.setattr(validate, "compressed", lambda *a, **k: calls.append(1) or real(*a, **k))
    interop.from_torch(t)
    interop.from_torch(t)
    scorch.einsum("ij,j->i", t, torch.ones(4))
    assert len(calls) == 1
    t.col_indices()[1] = 9  # bumps the version counter shared with the sparse tensor
    with pytest.raises(ValueError, match="column index 9 out of range for size 4"):
        interop.from_torch(t)
    assert len(calls) == 2


BAD_SCIPY = [
    ("csr column >= ncols", lambda: sp.csr_matrix((np.ones(2), np.array([0, 7]), np.array([0, 1, 2])), shape=(2, 5)),
     "column index 7 out of range for size 5"),
    ("csr negative column", lambda: sp.csr_matrix((np.ones(2), np.array([0, -1]), np.array([0, 1, 2])), shape=(2, 5)),
     "column index -1 out of range"),
    ("csc row >= nrows", lambda: sp.csc_array((np.ones(2), np.array([0, 2]), np.array([0, 1, 2])), shape=(2, 2)),
     "row index 2 out of range for size 2"),
    ("csr decreasing indptr", lambda: _scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 2, 1, 3])),
     "indptr decreases"),
    ("csr short indptr", lambda: _scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 1, 3])),
     "indptr has 3 entries, expected 4"),
    ("csr indptr beyond nnz", lambda: _scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 1, 2, 5])),
     "indptr[-1] is 5"),
    ("coo column >= ncols", lambda: _scipy_with(sp.coo_matrix(np.eye(2)), col=np.array([0, 5], dtype=np.int32)),
     "index 5 out of range for size 2 in dimension 1"),
    ("coo negative row", lambda: _scipy_with(sp.coo_array(np.eye(2)), row=np.array([-1, 1], dtype=np.int32)),
     "index -1 out of range for size 2 in dimension 0"),
]


def _scipy_with(m, **arrays):
    """scipy only checks at construction: assign broken arrays afterwards, as user code can."""
    for name, a in arrays.items():
        setattr(m, name, a)
    return m


@pytest.mark.parametrize("name,make,message", BAD_SCIPY, ids=[c[0] for c in BAD_SCIPY])
def test_malformed_scipy_is_refused(name, make, message):
    with pytest.raises(ValueError, match="scipy") as info:
        scorch.sparse_tensor(make())
    assert message in str(info.value)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**16), st.sampled_from(["csr", "csc"]))
def test_unsorted_scipy_is_canonicalised(m, n, seed, kind):
    rng = np.random.default_rng(seed)
    dense = rng.integers(0, 3, (m, n)) * (rng.random((m, n)) < 0.5)
    mat = sp.csr_matrix(dense.astype(np.float64)) if kind == "csr" else sp.csc_matrix(dense.astype(np.float64))
    for p in range(len(mat.indptr) - 1):  # reverse every segment
        lo, hi = mat.indptr[p], mat.indptr[p + 1]
        mat.indices[lo:hi] = mat.indices[lo:hi][::-1].copy()
        mat.data[lo:hi] = mat.data[lo:hi][::-1].copy()
    mat.has_sorted_indices = False
    assert torch.equal(scorch.sparse_tensor(mat).to_dense(), torch.from_numpy(dense.astype(np.float64)))


def test_validation_of_a_valid_tensor_costs_one_pass():
    """The check is O(nnz): a 2M-entry CSR validates in well under the time torch takes to
    build it from dense (the figure for the report: benchmarks, not asserted tightly)."""
    import time
    n = 2_000_000
    pos = torch.arange(0, n + 1, 2, dtype=torch.int64)
    crd = (torch.arange(n, dtype=torch.int64) % 2) + 2 * (torch.arange(n) % 1000 // 2)
    start = time.perf_counter()
    verdict = validate.compressed(pos, crd, n // 2, 1000, n, "bench")
    elapsed = time.perf_counter() - start
    assert verdict == validate.CANONICAL
    assert elapsed < 0.5


def test_uncoalesced_coo_is_coalesced_each_call_and_follows_in_place_changes():
    """The canonical copy is made again each call, as torch's ``coalesce`` is: the tensors
    given to the constructor alias the layout's arrays with version counters of their own,
    so a kept copy would miss a write through them (session 39, red-team finding R2.2)."""
    values = torch.tensor([1., 2., 3.])
    t = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [2, 0, 2]]), values, (2, 3))
    first = interop.from_torch(t)
    assert torch.equal(first.values, torch.tensor([2., 4.]))
    t._values().mul_(2)                                 # bumps the shared version counter
    assert torch.equal(scorch.sparse_tensor(t).to_dense(), torch.tensor([[4., 0., 0.], [0., 0., 8.]]))
    values.add_(1)                                      # moves only ``values``'s own counter
    assert torch.equal(scorch.sparse_tensor(t).to_dense(), torch.tensor([[5., 0., 0.], [0., 0., 10.]]))


def _reference_compressed(pos, crd, outer, inner):
    """Plain-Python statement of what validate.compressed accepts."""
    if len(pos) != outer + 1 or pos[0] != 0 or pos[-1] != len(crd):
        return "error"
    if any(b < a for a, b in zip(pos, pos[1:])):
        return "error"
    unsorted = False
    for p in range(outer):
        seg = crd[pos[p]:pos[p + 1]]
        if any(c < 0 or c >= inner for c in seg):
            return "error"
        unsorted |= any(b <= a for a, b in zip(seg, seg[1:]))
    return validate.UNSORTED if unsorted else validate.CANONICAL


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 4), st.integers(0, 5), st.lists(st.integers(-1, 6), max_size=6),
       st.lists(st.integers(-1, 6), max_size=8), st.sampled_from([torch.int32, torch.int64]),
       st.booleans())
def test_compressed_check_matches_its_reference(outer, inner, pos, crd, dtype, wellformed_pos):
    if wellformed_pos and crd:  # half the time: a valid pointer array over random coordinates
        cuts = sorted(min(abs(p), len(crd)) for p in pos[:outer])
        pos = [0] + cuts[:max(outer - 1, 0)] + [len(crd)] if outer else [0]
    want = _reference_compressed(pos, crd, outer, inner)
    args = (torch.tensor(pos, dtype=dtype), torch.tensor(crd, dtype=dtype), outer, inner, len(crd), "x")
    if want == "error":
        with pytest.raises(ValueError, match="operand x"):
            validate.compressed(*args)
    else:
        assert validate.compressed(*args) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 4), st.integers(-1, 4)), max_size=8),
       st.sampled_from([torch.int32, torch.int64]))
def test_coordinate_check_matches_its_reference(entries, dtype):
    shape = (4, 3)
    idx = torch.tensor(entries, dtype=dtype).reshape(-1, 2).t().contiguous()
    bad = any(not (0 <= r < 4 and 0 <= c < 3) for r, c in entries)
    if bad:
        with pytest.raises(ValueError, match="out of range"):
            validate.coordinates(idx, shape, "x")
        return
    ordered = all(a < b for a, b in zip(entries, entries[1:]))
    assert validate.coordinates(idx, shape, "x") == (validate.CANONICAL if ordered else validate.UNSORTED)


def test_mixed_index_dtypes_are_checked_in_the_wider_type():
    pos = torch.tensor([0, 1], dtype=torch.int32)
    crd = torch.tensor([2**32 + 1], dtype=torch.int64)   # 1 if it were cast to int32
    with pytest.raises(ValueError, match="out of range"):
        validate.compressed(pos, crd, 1, 5, 1, "x")
