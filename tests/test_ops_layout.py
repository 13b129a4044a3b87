"""Layout ops that move stored coordinates (``sparse_ops/layout_ops.py``, ``embedding_bag``):
select / unbind / split / chunk, tile, F.pad, block_diag, diag_embed / diagflat / diag /
diagonal, index_fill with 0, new_zeros, sparse_dim, against dense torch, sparse results,
no dense fallback, gradients on the stored values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, assert_matches, dense_of, dense_values

F64 = torch.float64
SHAPES = [(4, 5), (3,), (2, 3, 4), (0, 3), (1, 1)]


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _pair(data, shape, dtype=F64, density=None):
    x = data.draw(dense_values(shape, dtype, density=density)) + 0
    return x, scorch.sparse_tensor(x, format=data.draw(st.sampled_from(FORMATS[len(shape)])))


def _all_match(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_matches(g, w, sparse=w.dim() > 0)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), density=st.sampled_from([0.0, 0.4, 1.0]),
       dtype=st.sampled_from([F64, torch.int64]))
def test_slicing_ops_match_dense(data, shape, density, dtype):
    x, X = _pair(data, shape, dtype, density)
    for dim in range(-len(shape), len(shape)):
        n = shape[dim]
        if n:
            i = data.draw(st.integers(-n, n - 1))
            assert_matches(X.select(dim, i), x.select(dim, i), sparse=len(shape) > 1)
            assert_matches(torch.select(X, dim, i), x.select(dim, i), sparse=len(shape) > 1)
        _all_match(X.unbind(dim), x.unbind(dim))
        size = data.draw(st.integers(1, 4))
        _all_match(X.split(size, dim), x.split(size, dim))
        chunks = data.draw(st.integers(1, 5))
        _all_match(X.chunk(chunks, dim), x.chunk(chunks, dim))      # an empty dim too
        if n:
            cut = data.draw(st.integers(0, n))
            _all_match(torch.split(X, [cut, n - cut], dim), torch.split(x, [cut, n - cut], dim))
    reps = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=len(shape) + 1)))
    assert_matches(X.tile(reps), x.tile(reps), sparse=True)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), density=st.sampled_from([0.0, 0.4, 1.0]))
def test_pad_with_zeros_grows_and_crops_as_torch(data, shape, density):
    x, X = _pair(data, shape, F64, density)
    k = data.draw(st.integers(1, len(shape)))
    pads = []
    for d in range(k):
        n = shape[len(shape) - 1 - d]
        before = data.draw(st.integers(-min(n, 2), 2))
        after = data.draw(st.integers(-(n + min(before, 0)) if n + min(before, 0) > 0 else 0, 2))
        pads += [before, after]
    assert_matches(F.pad(X, pads), F.pad(x, pads), sparse=True)
    assert_matches(F.pad(X, pads, value=0.0), F.pad(x, pads), sparse=True)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["reflect", "replicate", "circular"]), k=st.integers(1, 3),
       batched=st.booleans(), density=st.sampled_from([0.0, 0.4, 1.0]))
def test_pad_by_mode_copies_entries_as_torch(data, mode, k, batched, density):
    """reflect / replicate / circular: each padded position copies one stored entry (a
    sparse result); the gradient sums over the copies, as dense torch's. reflect and
    replicate take negative pads too (a crop of what the other side's padding made)."""
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(k + 1 + batched))
    if len(shape) in FORMATS:
        x, X = _pair(data, shape, F64, density)
    else:
        x = data.draw(dense_values(shape, F64, density=density)) + 0
        X = scorch.sparse_tensor(x, format="coo")
    most = {"reflect": lambda n: n - 1, "replicate": lambda n: 3, "circular": lambda n: n}[mode]
    pads = []
    for d in range(k):
        n = shape[len(shape) - 1 - d]
        low = 0 if mode == "circular" else -n
        pads += [data.draw(st.integers(low, most(n))), data.draw(st.integers(low, most(n)))]
    try:
        want = F.pad(x, pads, mode)
    except RuntimeError:
        assume(False)            # pads torch refuses (a negative size)
    got = F.pad(X, pads, mode)
    assert_matches(got, want, sparse=True)
    if X.nnz and got.numel():       # (torch's backward of an empty pad leaves memory unwritten)
        S = scorch.sparse_tensor(x, format="coo", requires_grad=True)
        D = x.clone().requires_grad_()
        w = torch.rand(got.shape, dtype=F64)
        (F.pad(S, pads, mode).to_dense() * w).sum().backward()
        (F.pad(D, pads, mode) * w).sum().backward()
        torch.testing.assert_close(S.grad.to_dense(), D.grad * (x != 0))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]), offset=st.integers(-3, 3))
def test_diagonals_match_dense(data, density, offset):
    v, V = _pair(data, (4,), F64, density)
    assert_matches(torch.diag(V, offset), torch.diag(v, offset), sparse=True)
    assert_matches(torch.diagflat(V, offset), torch.diagflat(v, offset), sparse=True)
    assert_matches(torch.diag_embed(V, offset), torch.diag_embed(v, offset), sparse=True)
    m, M = _pair(data, (4, 5), F64, density)
    assert_matches(torch.diagflat(M, offset), torch.diagflat(m, offset), sparse=True)
    main = None if offset == 0 else True      # the main diagonal is an einsum ("ii->i"): any format
    assert_matches(torch.diag(M, offset), torch.diag(m, offset), sparse=main)
    assert_matches(M.diagonal(offset), m.diagonal(offset), sparse=main)
    t, T = _pair(data, (2, 3, 4), F64, density)
    assert_matches(T.diagonal(offset, 2, 0), t.diagonal(offset, 2, 0), sparse=True)
    assert_matches(torch.diag_embed(T, offset, 0, 2), torch.diag_embed(t, offset, 0, 2), sparse=True)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]), dense_block=st.booleans())
def test_block_diag_index_fill_and_new_zeros(data, density, dense_block):
    a, A = _pair(data, (2, 3), F64, density)
    b, B = _pair(data, (3,), F64, density)
    c = data.draw(dense_values((2, 2), F64))
    C = c if dense_block else scorch.sparse_tensor(c, format="coo")
    assert_matches(torch.block_diag(A, B, C), torch.block_diag(a, b, c), sparse=True)
    idx = torch.tensor(data.draw(st.lists(st.integers(0, 2), max_size=3)), dtype=torch.int64)
    assert_matches(A.index_fill(1, idx, 0.0), a.index_fill(1, idx, 0.0), sparse=True)
    z = A.new_zeros(3, 4)
    assert isinstance(z, scorch.SparseTensor) and z.nnz == 0 and z.shape == (3, 4) and z.format == A.format
    assert A.new_zeros((2, 2, 2), dtype=torch.float32).dtype == torch.float32
    assert A.sparse_dim() == 2 and A.dense_dim() == 0


@settings(max_examples=25, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]), mode=st.sampled_from(["sum", "mean"]),
       weighted=st.booleans(), padding=st.booleans(), offsets=st.booleans())
def test_embedding_bag_with_a_sparse_table_matches_dense(data, density, mode, weighted, padding, offsets):
    w, W = _pair(data, (6, 4), F64, density)
    index = torch.tensor(data.draw(st.lists(st.integers(0, 5), min_size=6, max_size=6)))
    kw = {"mode": mode, "padding_idx": 2 if padding else None}
    if weighted and mode == "sum":
        kw["per_sample_weights"] = torch.rand(6, dtype=F64, generator=torch.Generator().manual_seed(1))
    if offsets:
        args = (index, W, torch.tensor([0, 2, 2, 5]))
        dense = F.embedding_bag(index, w, torch.tensor([0, 2, 2, 5]), **kw)
    else:
        if "per_sample_weights" in kw:
            kw["per_sample_weights"] = kw["per_sample_weights"].reshape(3, 2)
        args = (index.reshape(3, 2), W)
        dense = F.embedding_bag(index.reshape(3, 2), w, **kw)
    torch.testing.assert_close(dense_of(F.embedding_bag(*args, **kw)), dense)


def test_layout_op_gradients_reach_the_stored_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, dtype=F64, generator=g) * (torch.rand(4, 5, generator=g) < 0.6)
    calls = [lambda a: torch.stack([p.sum(0) for p in a.unbind(1)]),
             lambda a: a.select(0, 2), lambda a: a.chunk(3, 1)[1], lambda a: a.tile(2, 1),
             lambda a: F.pad(a, (1, -1, 2, 0)), lambda a: torch.block_diag(a, a),
             lambda a: torch.diag_embed(a), lambda a: a.diagonal(1),
             lambda a: a.index_fill(0, torch.tensor([1]), 0.0),
             lambda a: F.embedding_bag(torch.tensor([[0, 3], [2, 2]]), a, mode="mean")]
    for call in calls:
        X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
        D = x.clone().requires_grad_()
        out = dense_of(call(X))
        w = torch.rand(out.shape, dtype=F64, generator=g)
        (out * w).sum().backward()
        (call(D) * w).sum().backward()
        torch.testing.assert_close(X.grad.to_dense(), torch.where(x != 0, D.grad, 0.0))


def test_unbind_and_split_are_one_pass_not_a_scan_per_slice(monkeypatch):
    """unbind and split sort the entries once and split them; indexing or narrowing one slice
    scans every entry, so slice by slice would cost pieces x entries."""
    from scorch.sparse_ops import shape as shape_ops

    def scan(*args, **kwargs):
        raise AssertionError("unbind indexed a slice")
    monkeypatch.setattr(shape_ops, "getitem", scan)
    n = 2_000
    idx = torch.randint(0, n, (2, 20_000), generator=torch.Generator().manual_seed(0))
    A = scorch.sparse_tensor((idx, torch.ones(20_000)), size=(n, n), format="csr")
    rows = A.unbind(0)
    assert len(rows) == n and sum(r.nnz for r in rows) == A.nnz
    assert torch.equal(torch.stack([r.to_dense() for r in rows[:5]]), A.to_dense()[:5])
    monkeypatch.setattr(torch, "narrow", scan)
    parts = torch.split(A, 3, 1) + A.chunk(700, 0)           # split and chunk: one pass too
    assert sum(p.nnz for p in parts) == 2 * A.nnz


def test_conversions_to_torch_layouts_stay_scorch_tensors():
    x = torch.tensor([[1.0, 0, 0, 2], [0, 0, 3, 0], [4, 0, 0, 0], [0, 5, 0, 6]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr")
    cases = [(X.to_sparse(), torch.sparse_coo), (X.to_sparse(2), torch.sparse_coo),
             (X.to_sparse(layout=torch.sparse_csc), torch.sparse_csc),
             (X.to_sparse_bsr((2, 2)), torch.sparse_bsr), (X.to_sparse_bsc((2, 1)), torch.sparse_bsc),
             (X.to_sparse(layout=torch.sparse_bsr, blocksize=(1, 2)), torch.sparse_bsr)]
    for got, layout in cases:
        assert isinstance(got, scorch.SparseTensor) and torch.equal(got.to_dense(), x)
        assert got.to_torch().layout == layout
        torch.testing.assert_close(got.to_torch().to_dense(), x)
    with pytest.raises(RuntimeError, match="blocksize"):
        X.to_sparse(layout=torch.sparse_bsr)


def test_new_tensors_like_a_sparse_one_take_only_its_dtype():
    X = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr")
    for got, want in ((X.new_ones(2, 3), torch.ones(2, 3, dtype=F64)),
                      (X.new_full((2,), 7.0), torch.full((2,), 7.0, dtype=F64)),
                      (X.new_tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=F64))):
        assert type(got) is torch.Tensor and torch.equal(got, want)
    e = torch.empty_like(X)
    assert isinstance(e, scorch.SparseTensor) and torch.equal(e.indices(), X.indices())
    assert isinstance(X._values(), torch.Tensor) and torch.equal(X._values(), X.values())
    d = torch.zeros(3, 3, dtype=F64)
    d.copy_(X)                                  # a dense tensor takes a sparse one's values
    assert torch.equal(d, torch.eye(3, dtype=F64))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (2, 3, 4), (3,)]), density=st.sampled_from([0.0, 0.4, 1.0]))
def test_sum_to_size_matches_dense(data, shape, density):
    x, X = _pair(data, shape, F64, density)
    size = [data.draw(st.sampled_from([1, n])) for n in shape][data.draw(st.integers(0, len(shape) - 1)):]
    torch.testing.assert_close(dense_of(X.sum_to_size(size)), x.sum_to_size(size))
