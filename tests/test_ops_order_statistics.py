"""Order statistics of sparse tensors (topk, kthvalue, median/nanmedian, max/min with a dim)
against dense torch: equal values (NaN included), indices that point at those values, torch's
errors, gradients on the stored entries, and a 2,000,000 x 2,000,000 matrix that a dense copy
could not hold. None of them may take the dense fallback: the tests fail on its warning."""
from __future__ import annotations

import time
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, dense_values

F64 = torch.float64
SHAPES = [(4, 5), (6,), (2, 3, 4), (0, 3), (3, 0), (1, 1), (0,), (5, 1)]
DTYPES = [torch.float32, F64, torch.int64]


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


@st.composite
def operands(draw):
    """A dense tensor (ties, NaN, empty and full fibers) and its sparse copy."""
    shape = draw(st.sampled_from(SHAPES))
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(dense_values(shape, dtype, density=draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))))
    if draw(st.booleans()):               # ties: a few distinct values
        x = (x.clamp(-1, 1) * 2).round() / 2 if dtype.is_floating_point else x.clamp(-2, 2)
    if dtype.is_floating_point and x.numel() > 1 and draw(st.booleans()):
        flat = x.view(-1)
        flat[draw(st.integers(0, x.numel() - 1))] = float("nan")
        flat[draw(st.integers(0, x.numel() - 1))] = float("nan")
    x = x + 0                             # no -0.0 (the sparse copy stores no zero)
    return x, scorch.sparse_tensor(x, format=draw(st.sampled_from(FORMATS[len(shape)])))


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert type(got) is torch.Tensor and got.dtype == want.dtype, (type(got), got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(0), want.nan_to_num(0)), \
        (got, want)


def _check_pair(got, want, x: torch.Tensor, dim: int, keepdim: bool = True, distinct: bool = False):
    """Same return type and values as torch; the indices gather those values from ``x``."""
    assert type(got) is type(want), (type(got), type(want))
    _same(got.values, want.values)
    assert got.indices.dtype == torch.int64 and got.indices.shape == want.indices.shape
    idx = got.indices if keepdim else got.indices.unsqueeze(dim)
    vals = got.values if keepdim else got.values.unsqueeze(dim)
    if idx.numel():
        assert bool(((idx >= 0) & (idx < x.shape[dim])).all()), idx
        _same(x.gather(dim, idx), vals)
    if distinct and idx.numel():
        ordered = idx.sort(dim).values
        assert bool((ordered.diff(dim=dim) > 0).all()), idx


def _same_error(sparse_call, dense_call) -> bool:
    """True (nothing more to check) where dense torch raises; then the sparse call raises the
    same kind of error."""
    try:
        dense_call()
    except (RuntimeError, IndexError) as e:
        with pytest.raises(type(e)):
            sparse_call()
        return True
    return False


@settings(max_examples=40, deadline=None)
@given(operand=operands())
def test_topk_matches_dense_and_its_indices_are_distinct_and_point_at_the_values(operand):
    x, S = operand
    for dim in range(-1, x.dim()):
        n = x.shape[dim]
        for k in range(0, n + 2):
            for largest in (True, False):
                if _same_error(lambda: torch.topk(S, k, dim, largest), lambda: torch.topk(x, k, dim, largest)):
                    continue
                want = torch.topk(x, k, dim, largest)
                _check_pair(torch.topk(S, k, dim, largest), want, x, dim, distinct=True)
                _check_pair(S.topk(k, dim=dim, largest=largest, sorted=False), want, x, dim, distinct=True)
    if x.shape[-1] > 0:
        _check_pair(S.topk(1), x.topk(1), x, -1)


@settings(max_examples=30, deadline=None)
@given(operand=operands())
def test_kthvalue_matches_dense_for_every_k(operand):
    x, S = operand
    for dim in range(-1, x.dim()):
        for k in range(0, x.shape[dim] + 2):
            for keepdim in (False, True):
                if _same_error(lambda: torch.kthvalue(S, k, dim, keepdim), lambda: torch.kthvalue(x, k, dim, keepdim)):
                    continue
                _check_pair(torch.kthvalue(S, k, dim, keepdim), torch.kthvalue(x, k, dim, keepdim), x, dim % x.dim(),
                            keepdim)
    if x.shape[-1] > 0:
        _check_pair(S.kthvalue(1), x.kthvalue(1), x, x.dim() - 1, False)


@settings(max_examples=40, deadline=None)
@given(operand=operands())
def test_median_and_nanmedian_match_dense_over_all_elements_and_along_each_dim(operand):
    x, S = operand
    if x.numel() or x.dtype.is_floating_point:      # torch's empty integer median is undefined
        _same(torch.median(S), torch.median(x))
        _same(S.nanmedian(), x.nanmedian())
    for dim in range(-1, x.dim()):
        for keepdim in (False, True):
            for op in (torch.median, torch.nanmedian):
                if _same_error(lambda: op(S, dim, keepdim), lambda: op(x, dim, keepdim)):
                    continue
                got, want = op(S, dim, keepdim), op(x, dim, keepdim)
                _check_pair(got, want, x, dim % x.dim(), keepdim)
                if op is torch.median:            # torch's index of a NaN fiber: its first NaN
                    nan = want.values.isnan()
                    assert torch.equal(got.indices[nan], want.indices[nan])
    if x.shape[-1] > 0:
        _check_pair(S.median(dim=-1), x.median(dim=-1), x, x.dim() - 1, False)


@settings(max_examples=40, deadline=None)
@given(operand=operands())
def test_max_min_with_a_dim_take_the_first_extreme_as_torch(operand):
    x, S = operand
    for dim in range(-1, x.dim()):
        for keepdim in (False, True):
            for op in (torch.max, torch.min):
                if _same_error(lambda: op(S, dim, keepdim), lambda: op(x, dim, keepdim)):
                    continue
                got, want = op(S, dim, keepdim), op(x, dim, keepdim)
                assert type(got) is type(want)
                _same(got.values, want.values)
                assert torch.equal(got.indices, want.indices), (op, dim, keepdim, got, want)
    if x.dim() > 1 and x.shape[1] > 0:
        _same(S.max(dim=1).values, x.max(dim=1).values)
        assert torch.equal(S.min(1, keepdim=True).indices, x.min(1, keepdim=True).indices)
        assert torch.equal(torch.max(S, dim=1, keepdim=True).indices, torch.max(x, dim=1, keepdim=True).indices)


def test_max_min_of_two_tensors_are_maximum_minimum():
    x = torch.tensor([[0.0, 2.0, -1.0], [3.0, 0.0, 0.5]], dtype=F64)
    y = torch.tensor([[1.0, 0.0, -2.0], [0.0, -4.0, 0.5]], dtype=F64)
    S, T = (scorch.sparse_tensor(a, format="csr") for a in (x, y))
    for got in (torch.max(S, T), S.max(T), torch.max(S, y), torch.max(x, T), torch.max(S, other=T)):
        assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, torch.max(x, y))
    assert torch.equal(torch.min(S, T).to_dense(), torch.min(x, y))
    assert torch.equal(S.max(), x.max()) and torch.equal(S.min(), x.min())


# --- gradients: on the stored entries, as dense torch's ------------------------------------

def _grad_pair(fmt: str, shape=(4, 6), seed: int = 0, density: float = 0.6):
    """A sparse leaf with distinct stored values (no ties outside the zeros) and its dense
    copy, both requiring grad."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randperm(24, generator=g).reshape(shape).to(F64) - 11.5) / 4
    x = x * (torch.rand(shape, generator=g) < density)
    S = scorch.sparse_tensor(x, format=fmt, requires_grad=True)
    return S, x.clone().requires_grad_()


def _grad_matches(S, D) -> None:
    assert isinstance(S.grad, scorch.SparseTensor) and S.grad.nnz == S.nnz
    stored = torch.zeros(S.shape, dtype=torch.bool)
    stored[tuple(S.indices())] = True
    want = torch.where(stored, D.grad, torch.zeros((), dtype=F64))
    torch.testing.assert_close(S.grad.to_dense(), want, rtol=1e-12, atol=1e-12)


def _backward_both(S, D, fn) -> None:
    for X in (S, D):
        out = fn(X)
        w = torch.linspace(0.5, 2.0, out.numel(), dtype=F64).reshape(out.shape)
        (out * w).sum().backward()
    _grad_matches(S, D)


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_topk_gradient_goes_to_the_picked_stored_entries(fmt):
    S, D = _grad_pair(fmt)
    _backward_both(S, D, lambda X: torch.topk(X, 3, 1).values + X.topk(2, 0, largest=False).values.sum())


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_kthvalue_gradient_goes_to_the_picked_stored_entries(fmt):
    S, D = _grad_pair(fmt, seed=1)
    _backward_both(S, D, lambda X: torch.kthvalue(X, 4, 1).values + X.kthvalue(2, 0).values.sum())


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_median_gradient_along_a_dim_goes_to_the_median_entry(fmt):
    S, D = _grad_pair(fmt, seed=2)
    _backward_both(S, D, lambda X: torch.median(X, 1).values + X.nanmedian(0).values.sum())


def test_median_of_all_elements_shares_its_gradient_among_the_ties():
    """torch's ``median()`` backward splits the gradient evenly among the elements equal to
    the median; implicit zeros count (their share goes nowhere)."""
    for x in (torch.tensor([[1.0, 2.0, 2.0], [0.0, 3.0, 2.0]], dtype=F64),     # three tied 2s
              torch.tensor([[0.0, 0.0, 5.0], [-1.0, 0.0, 2.0]], dtype=F64),    # a zero median
              torch.tensor([[1.0, float("nan"), 2.0], [0.0, float("nan"), 2.0]], dtype=F64)):
        S = scorch.sparse_tensor(x, format="csr", requires_grad=True)
        D = x.clone().requires_grad_()
        for X in (S, D):
            (torch.median(X) * 3 + X.nanmedian()).backward()
        _grad_matches(S, D)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_max_min_with_a_dim_gradient_goes_to_the_first_extreme(fmt):
    S, D = _grad_pair(fmt, seed=3)
    _backward_both(S, D, lambda X: torch.max(X, 1).values + X.min(0, keepdim=True).values.sum())


# --- scale: no dense copy ------------------------------------------------------------------

def test_order_statistics_of_a_huge_sparse_matrix_follow_the_stored_entries():
    """2,000,000 x 2,000,000 with 2,000,000 entries (a dense copy would take 32 TB)."""
    n = 2_000_000
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, n, (n,), generator=g)
    cols = torch.randint(0, n, (n,), generator=g)
    key = torch.unique(rows * n + cols)
    rows, cols = key // n, key % n
    vals = torch.randn(key.numel(), generator=g, dtype=F64)
    A = scorch.sparse_tensor((torch.stack([rows, cols]), vals), size=(n, n), format="csr")
    # a direct computation: each row's largest stored value and its count
    count = torch.bincount(rows, minlength=n)
    largest = torch.full((n,), float("-inf"), dtype=F64).scatter_reduce(0, rows, vals, "amax")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        top = torch.topk(A, 2, dim=1)
        kth = torch.kthvalue(A, n, dim=1)                     # the largest of each row
        med = torch.median(A, dim=1)
        mx = A.max(dim=1)
    assert time.perf_counter() - start < 30
    assert top.values.shape == top.indices.shape == (n, 2)
    assert kth.values.shape == med.values.shape == mx.values.shape == mx.indices.shape == (n,)
    want_max = torch.where(count == 0, 0.0, largest.clamp_min(0))    # every row has unstored zeros
    assert torch.equal(mx.values, want_max) and torch.equal(top.values[:, 0], want_max)
    assert torch.equal(kth.values, want_max)
    assert torch.equal(med.values, torch.zeros(n, dtype=F64))        # mostly zeros
    some = torch.arange(0, n, 9973)
    sampled = rows % 9973 == 0
    stored_at = dict(zip(key[sampled].tolist(), vals[sampled].tolist()))
    for i in some.tolist():                                           # indices hold the values
        for j, v in zip(top.indices[i].tolist(), top.values[i].tolist()):
            assert stored_at.get(i * n + j, 0.0) == v
        assert stored_at.get(i * n + int(mx.indices[i]), 0.0) == float(mx.values[i])
        assert stored_at.get(i * n + int(med.indices[i]), 0.0) == 0.0
