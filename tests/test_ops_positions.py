"""The ops that read or write a sparse tensor at given positions (gather, take,
take_along_dim, masked_select, index_add, scatter_add, and the dense-by-nature scatter /
scatter_reduce) against dense torch, values and gradients, over ranks 1-3, empty shapes,
every dim, densities, dtypes and formats. None of them may take the dense fallback: the
tests fail on its warning."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import DENSITIES, FORMATS, assert_matches, dense_of, dense_values, grad_matches

F64 = torch.float64
DTYPES = [torch.float32, torch.float64, torch.int64]


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


@st.composite
def shapes(draw, lo: int = 0, hi: int = 4):
    rank = draw(st.integers(1, 3))
    return tuple(draw(st.integers(lo, hi)) for _ in range(rank))


@st.composite
def sparse_case(draw, shape=None, dtype=None):
    """A dense tensor and its sparse copy in a format of its rank."""
    shape = draw(shapes()) if shape is None else shape
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    d = draw(dense_values(shape, dtype, density=draw(st.sampled_from(DENSITIES))))
    return d, scorch.sparse_tensor(d, format=draw(st.sampled_from(FORMATS[len(shape)])))


def _generator(data) -> torch.Generator:
    return torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))


def _randint(data, high: int, shape, dim: int = 0) -> torch.Tensor:
    """int64 in [0, high) of ``shape``, repeats likely; none along ``dim`` where ``high``
    is 0 (nothing to point at)."""
    shape = list(shape)
    if high == 0:
        shape[dim] = 0
    return torch.randint(0, max(high, 1), tuple(shape), generator=_generator(data))


# --- reads -----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), case=sparse_case())
def test_gather_reads_the_stored_value_or_zero(data, case):
    d, S = case
    dim = data.draw(st.integers(-d.dim(), d.dim() - 1))
    k = dim % d.dim()
    shape = [data.draw(st.integers(0, n)) for n in d.shape]
    shape[k] = data.draw(st.integers(0, 4))
    index = _randint(data, d.shape[k], shape, k)
    assert_matches(torch.gather(S, dim, index), torch.gather(d, dim, index), sparse=False)
    assert_matches(S.gather(dim, index), d.gather(dim, index), sparse=False)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), case=sparse_case(), count=st.integers(0, 12))
def test_take_counts_negative_positions_from_the_end(data, case, count):
    d, S = case
    numel = d.numel()
    index = torch.randint(-numel, max(numel, 1), (count if numel else 0,), generator=_generator(data))
    index = index.reshape(-1, 2) if count % 2 == 0 and count else index
    assert_matches(torch.take(S, index), torch.take(d, index), sparse=False)
    assert_matches(S.take(index), d.take(index), sparse=False)
    flat = index.remainder(max(numel, 1)).reshape(-1)
    assert_matches(torch.take_along_dim(S, flat), torch.take_along_dim(d, flat), sparse=False)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), case=sparse_case())
def test_take_along_dim_broadcasts_both_operands(data, case):
    d, S = case
    dim = data.draw(st.integers(0, d.dim() - 1))
    # index: size 1 (broadcast over d) or d's size on the other dims; any size along dim
    shape = [data.draw(st.sampled_from([1, n])) for n in d.shape]
    shape[dim] = data.draw(st.integers(0, 3))
    index = _randint(data, d.shape[dim], shape, dim)
    if d.shape[dim]:
        index = index + d.shape[dim] * torch.randint(-2, 3, index.shape, generator=_generator(data))  # wrap
    assert_matches(torch.take_along_dim(S, index, dim), torch.take_along_dim(d, index, dim), sparse=False)
    assert_matches(S.take_along_dim(index, dim=dim), d.take_along_dim(index, dim=dim), sparse=False)
    # d broadcast: a size-1 sparse operand against a larger index
    one = d.narrow(0, 0, min(1, d.shape[0]))
    if one.shape[0] == 1 and dim != 0:
        big = list(index.shape)
        big[0] = 3
        wide = index[:1].expand(big)
        S1 = scorch.sparse_tensor(one, format=S.format)
        assert_matches(torch.take_along_dim(S1, wide, dim), torch.take_along_dim(one, wide, dim))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), case=sparse_case(), threshold=st.sampled_from([-1, 0, 0.5]),
       mask_kind=st.sampled_from(["sparse", "dense"]), x_kind=st.sampled_from(["sparse", "dense"]))
def test_masked_select_reads_the_true_positions_in_row_major_order(data, case, threshold, mask_kind, x_kind):
    d, S = case
    other, O = data.draw(sparse_case(shape=tuple(d.shape), dtype=d.dtype))
    if mask_kind == "sparse":
        threshold = max(threshold, 0)          # x > 0 of a sparse x is sparse, x > -1 dense
    mask = other > threshold
    M = O > threshold if mask_kind == "sparse" else mask
    X = S if x_kind == "sparse" or mask_kind == "dense" else d
    assert isinstance(M, scorch.SparseTensor) == (mask_kind == "sparse")
    assert_matches(torch.masked_select(X, M), torch.masked_select(d, mask), sparse=False)
    assert_matches(X.masked_select(M), d.masked_select(mask), sparse=False)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), case=sparse_case())
def test_masked_select_broadcasts_the_mask_and_the_input(data, case):
    d, S = case
    g = _generator(data)
    # a mask with some dims of size 1, and one leading dim more
    mshape = (2,) + tuple(data.draw(st.sampled_from([1, n])) for n in d.shape)
    mask = torch.rand(mshape, generator=g) < 0.5
    assert_matches(torch.masked_select(S, mask), torch.masked_select(d, mask), sparse=False)
    # a sparse mask broadcast: its stored True positions times the broadcast dims' ranges
    M = scorch.sparse_tensor(mask, format=data.draw(st.sampled_from(FORMATS.get(len(mshape), ["coo"]))))
    assert isinstance(M, scorch.SparseTensor)
    assert_matches(torch.masked_select(S, M), torch.masked_select(d, mask), sparse=False)
    assert_matches(torch.masked_select(d, M), torch.masked_select(d, mask), sparse=False)
    # the sparse input broadcast: its size-1 dims read coordinate 0
    one = d.narrow(-1, 0, min(1, d.shape[-1]))
    if one.shape[-1] == 1:
        wide = torch.rand(d.shape[:-1] + (3,), generator=g) < 0.5
        S1 = scorch.sparse_tensor(one, format=S.format)
        assert_matches(torch.masked_select(S1, wide), torch.masked_select(one, wide), sparse=False)


# --- writes ----------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), case=sparse_case(), self_kind=st.sampled_from(["sparse", "dense"]),
       source_kind=st.sampled_from(["sparse", "dense"]), alpha=st.sampled_from([1, 2, -3]))
def test_index_add_moves_the_stored_coordinates_and_sums_repeats(data, case, self_kind, source_kind, alpha):
    d, S = case
    dim = data.draw(st.integers(-d.dim(), d.dim() - 1))
    k = dim % d.dim()
    sshape = list(d.shape)
    sshape[k] = data.draw(st.integers(0, 5)) if d.shape[k] else 0
    src, Src = data.draw(sparse_case(shape=tuple(sshape), dtype=d.dtype))
    index = _randint(data, d.shape[k], (sshape[k],))       # index.numel() == sshape[k]
    if self_kind == "dense" and source_kind == "dense":
        source_kind = "sparse"
    X = S if self_kind == "sparse" else d
    Y = Src if source_kind == "sparse" else src
    want = torch.index_add(d, dim, index, src, alpha=alpha)
    assert_matches(torch.index_add(X, dim, index, Y, alpha=alpha), want, sparse=self_kind == "sparse")
    assert_matches(X.index_add(dim, index, Y, alpha=alpha), want, sparse=self_kind == "sparse")
    if self_kind == "dense":
        inplace = d.clone()
        assert inplace.index_add_(dim, index, Src, alpha=alpha) is inplace
        assert_matches(inplace, want)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), case=sparse_case(), self_kind=st.sampled_from(["sparse", "dense"]),
       src_kind=st.sampled_from(["sparse", "dense"]))
def test_scatter_add_counts_only_the_entries_inside_the_index(data, case, self_kind, src_kind):
    d, S = case
    dim = data.draw(st.integers(-d.dim(), d.dim() - 1))
    k = dim % d.dim()
    # src at least index's size; index no larger than self off dim
    ishape = [data.draw(st.integers(0, n)) for n in d.shape]
    ishape[k] = data.draw(st.integers(0, 4))
    index = _randint(data, d.shape[k], ishape, k)
    sshape = tuple(n + data.draw(st.integers(0, 2)) for n in index.shape)
    src, Src = data.draw(sparse_case(shape=sshape, dtype=d.dtype))
    if self_kind == "dense" and src_kind == "dense":
        src_kind = "sparse"
    X = S if self_kind == "sparse" else d
    Y = Src if src_kind == "sparse" else src
    want = torch.scatter_add(d, dim, index, src)
    assert_matches(torch.scatter_add(X, dim, index, Y), want, sparse=self_kind == "sparse")
    assert_matches(X.scatter_add(dim, index, Y), want, sparse=self_kind == "sparse")
    if self_kind == "dense":
        inplace = d.clone()
        assert inplace.scatter_add_(dim, index, Src) is inplace
        assert_matches(inplace, want)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), case=sparse_case(dtype=F64), reduce=st.sampled_from(["sum", "prod", "mean", "amax", "amin"]),
       include_self=st.booleans())
def test_scatter_and_scatter_reduce_are_dense_by_nature(data, case, reduce, include_self):
    d, S = case
    dim = data.draw(st.integers(0, d.dim() - 1))
    index = _randint(data, d.shape[dim], [data.draw(st.integers(0, n)) for n in d.shape], dim)
    assert_matches(torch.scatter(S, dim, index, S), torch.scatter(d, dim, index, d), sparse=False)
    assert_matches(S.scatter(dim, index, 2.5), d.scatter(dim, index, 2.5), sparse=False)
    got = torch.scatter_reduce(S, dim, index, S, reduce, include_self=include_self)
    assert_matches(got, torch.scatter_reduce(d, dim, index, d, reduce, include_self=include_self))
    assert_matches(d.scatter_reduce(dim, index, S, reduce), d.scatter_reduce(dim, index, d, reduce))


# --- gradients -------------------------------------------------------------------------------

def _pair(shape, seed, density=0.5, fmt="csr"):
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(shape, dtype=F64, generator=g) - 0.5) * (torch.rand(shape, generator=g) < density)
    return scorch.sparse_tensor(d, format=fmt, requires_grad=True), d.clone().requires_grad_()


def _backward(out, seed):
    w = torch.rand(out.shape, dtype=F64, generator=torch.Generator().manual_seed(seed))
    (dense_of(out) * w).sum().backward()


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr"])
def test_read_gradients_reach_the_stored_values(fmt):
    """gather / take / take_along_dim / masked_select: the gradient of a read position goes
    to its stored value (summed over repeats), none to the unstored ones."""
    index = torch.tensor([[0, 0, 3], [4, 4, 4], [1, 2, 0]])
    mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(3)) < 0.6
    calls = [lambda x: torch.gather(x, 1, index),
             lambda x: torch.take(x, torch.tensor([[0, -1], [7, 7]])),
             lambda x: torch.take_along_dim(x, torch.tensor([[0], [4], [1], [4]]), 1),
             lambda x: torch.take_along_dim(x, torch.tensor([3, 3, 19])),
             lambda x: torch.masked_select(x, mask),
             lambda x: torch.masked_select(x, x > 0)]
    for k, call in enumerate(calls):
        S, D = _pair((4, 5), k, fmt=fmt)
        out = call(S)
        assert out.requires_grad
        _backward(out, k)
        _backward(call(D), k)
        grad_matches(S, D)


def test_masked_select_gradient_reaches_a_dense_input_through_a_sparse_mask():
    S, _ = _pair((4, 5), 1)
    x = torch.rand(4, 5, dtype=F64, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    _backward(torch.masked_select(x, S > 0), 2)
    _backward(torch.masked_select(y, S.detach().to_dense() > 0), 2)
    torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("self_kind", ["sparse", "dense"])
def test_write_gradients_reach_self_and_the_moved_values(self_kind):
    """index_add / scatter_add: self's gradient is the result's, the moved values' is the
    result's at their new coordinates (every repeat)."""
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([2, 0, 2, 1, 2])
    sindex = torch.randint(0, 4, (3, 4), generator=g)
    # torch's scatter_add backward for a src larger than the index returns the index's shape
    # (an error): the dense oracle reads src's corner, the part scatter_add reads
    calls = [(lambda s, x: torch.index_add(s, 1, index, x, alpha=2.0),) * 2,
             (lambda s, x: s.scatter_add(0, sindex, x), lambda s, x: s.scatter_add(0, sindex, x[:3, :4]))]
    for k, (call, oracle) in enumerate(calls):
        X, Xd = _pair((4, 5), 10 + k, fmt="csr")
        if self_kind == "sparse":
            T, Td = _pair((4, 3) if k == 0 else (4, 5), 20 + k, fmt="coo")
        else:
            Td = torch.rand((4, 3) if k == 0 else (4, 5), dtype=F64, generator=g).requires_grad_()
            T = Td.detach().clone().requires_grad_()
        _backward(call(T, X), k)
        _backward(oracle(Td, Xd), k)
        grad_matches(X, Xd)
        if self_kind == "sparse":
            grad_matches(T, Td)
        else:
            torch.testing.assert_close(T.grad, Td.grad)


def test_in_place_writes_into_a_dense_self_are_recorded():
    X, Xd = _pair((4, 5), 4)
    base = torch.rand(4, 5, dtype=F64, requires_grad=True)
    index = torch.tensor([[3, 0, 0, 1, 1], [0, 0, 2, 2, 1], [1, 1, 1, 0, 3], [2, 3, 3, 3, 0]])
    out = (base * 1.0).scatter_add_(0, index, X).index_add_(0, torch.tensor([1, 1, 0, 2]), X)
    want_base = base.detach().clone().requires_grad_()
    want = (want_base * 1.0).scatter_add_(0, index, Xd).index_add_(0, torch.tensor([1, 1, 0, 2]), Xd)
    torch.testing.assert_close(out, want)
    _backward(out, 5)
    _backward(want, 5)
    torch.testing.assert_close(base.grad, want_base.grad)
    grad_matches(X, Xd)


# --- errors ----------------------------------------------------------------------------------

def test_bad_indices_raise_torchs_errors():
    d = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    S = scorch.sparse_tensor(d, format="csr")
    cases = [lambda x: torch.gather(x, 1, torch.tensor([[3]])),
             lambda x: torch.gather(x, 1, torch.tensor([[-1]])),
             lambda x: torch.gather(x, 0, torch.tensor([[0, 0, 0, 0]])),
             lambda x: torch.take(x, torch.tensor([6])),
             lambda x: torch.take_along_dim(x, torch.tensor([[1.0]]), 1),
             lambda x: torch.take_along_dim(x, torch.tensor([-1])),
             lambda x: torch.masked_select(x, torch.ones(2, 3, dtype=torch.uint8)),
             lambda x: torch.index_add(x, 0, torch.tensor([2]), torch.ones(1, 3)),
             lambda x: torch.index_add(x, 0, torch.tensor([0]), torch.ones(1, 3, dtype=F64)),
             lambda x: torch.index_add(x, 0, torch.tensor([0, 1]), torch.ones(1, 3)),
             lambda x: torch.scatter_add(x, 0, torch.tensor([[2]]), x),
             lambda x: torch.scatter_add(x, 0, torch.tensor([[0, 0, 0, 0]]), x)]
    for call in cases:
        with pytest.raises((RuntimeError, IndexError)) as dense_error:
            call(d)
        with pytest.raises(dense_error.type):
            call(S)


def test_in_place_writes_into_a_sparse_self_are_refused():
    S = scorch.sparse_tensor(torch.tensor([[0.0, 1.5], [2.0, 0.0]]), format="csr")
    with pytest.raises(RuntimeError, match="in-place"):
        S.index_add_(0, torch.tensor([1, 0]), S)
    with pytest.raises(RuntimeError, match="in-place"):
        S.scatter_add_(0, torch.tensor([[1, 0]]), S)


# --- scale -----------------------------------------------------------------------------------

def test_a_huge_sparse_matrix_is_read_and_written_by_its_stored_entries():
    """2e6 x 2e6 with 2e6 stored entries: its dense copy would be 32 TB, so every op here
    must run from the stored entries (and the index) alone."""
    n = 2_000_000
    g = torch.Generator().manual_seed(0)
    rows, cols = torch.randint(0, n, (2, n), generator=g)
    vals = torch.rand(n, dtype=F64, generator=g)
    A = scorch.sparse_tensor((torch.stack([rows, cols]), vals), size=(n, n), format="csr")
    stored = A.indices()
    value = dict(zip(zip(stored[0, :50].tolist(), stored[1, :50].tolist()), A.values()[:50].tolist()))
    (r0, c0), v0 = next(iter(value.items()))

    index = torch.randint(0, n, (n, 2), generator=g)
    index[r0, 0] = c0
    got = torch.gather(A, 1, index)
    assert got.shape == (n, 2) and got[r0, 0] == v0

    pos = torch.randint(-n * n, n * n, (1000,), generator=g)
    pos[0] = r0 * n + c0
    taken = torch.take(A, pos)
    assert taken.shape == (1000,) and taken[0] == v0

    big = torch.masked_select(A, A > 0.9)
    assert big.shape == (int((A.values() > 0.9).sum()),) and bool((big > 0.9).all())

    perm = torch.randperm(n, generator=g)
    B = A.index_add(0, perm, A)
    assert isinstance(B, scorch.SparseTensor) and B.shape == (n, n)
    assert torch.take(B, torch.tensor([int(perm[r0]) * n + c0]))[0] >= v0

    S = scorch.sparse_tensor((stored[:, :10], A.values()[:10]), size=(n, n), format="csr")
    C = S.scatter_add(0, index, A)
    assert isinstance(C, scorch.SparseTensor) and C.shape == (n, n)
    # A's entries in columns 0 and 1 moved to rows index[r, c]; nothing else added
    keep = stored[1] < 2
    assert C.nnz <= S.nnz + int(keep.sum())


def test_positions_past_int64_keys_are_refused_not_wrapped():
    """Up to 2**62 positions the row-major keys are exact; past that the op declines, and the
    fallback refuses the dense copy by its size: an error, never a wrong answer."""
    m = 2**31
    B = scorch.sparse_tensor((torch.tensor([[0, m - 1], [1, m - 1]]), torch.tensor([1.0, 2.0])),
                             size=(m, m), format="coo")
    assert torch.equal(torch.gather(B, 1, torch.tensor([[1], [m - 1]])), torch.tensor([[1.0], [0.0]]))
    assert torch.equal(torch.take(B, torch.tensor([-1, 1])), torch.tensor([2.0, 1.0]))
    A = scorch.sparse_tensor((torch.tensor([[0, m - 1], [1, 2**32 - 2]]), torch.tensor([1.0, 2.0])),
                             size=(m, 2**32 - 1), format="coo")
    with pytest.raises(scorch.DenseFallbackError, match="gather"):
        torch.gather(A, 1, torch.tensor([[1]]))
