"""Summaries of a sparse tensor (``sparse_ops/summaries.py`` and ``value_ops``' NaN-aware
reductions): std_mean / var_mean, aminmax, linalg.norm, dist, cosine_similarity, histc,
bincount, unique, where(x), nansum / nanmean, against dense torch, with no dense fallback."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, dense_of, dense_values

F64 = torch.float64
SHAPES = [(4, 5), (3,), (2, 3, 4), (0, 3), (1, 1)]


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _close(got, want):
    if isinstance(want, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w)
        return
    got = dense_of(got)
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype, (got, want)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4, atol=1e-5)


#: these ops compile their reductions' kernels (~1 s each, cold): few formats, one dtype
#: (the reductions themselves are tested over every format in test_ops_reductions and
#: test_ops_composites; here it is how these functions combine them)
KERNEL_FORMATS = {1: ["coo"], 2: ["csr"], 3: ["coo"]}
KERNEL_SHAPES = [(4, 5), (3,), (0, 3)]


def _pair(data, shape, dtype=F64, density=None, formats=FORMATS):
    x = data.draw(dense_values(shape, dtype, density=density)) + 0
    return x, scorch.sparse_tensor(x, format=data.draw(st.sampled_from(formats[len(shape)])))


@settings(max_examples=12, deadline=None)
@given(data=st.data(), shape=st.sampled_from(KERNEL_SHAPES), density=st.sampled_from([0.0, 0.4, 1.0]))
def test_moments_extremes_and_norms_match_dense(data, shape, density):
    x, X = _pair(data, shape, F64, density, KERNEL_FORMATS)
    if x.numel():
        _close(torch.std_mean(X), torch.std_mean(x))
        _close(torch.var_mean(X, correction=0), torch.var_mean(x, correction=0))
        _close(torch.aminmax(X), torch.aminmax(x))
        _close(torch.linalg.norm(X), torch.linalg.norm(x))
        _close(torch.nansum(X), torch.nansum(x))
        _close(torch.nanmean(X), torch.nanmean(x))
    for dim in range(len(shape)):
        _close(torch.nansum(X, dim), torch.nansum(x, dim))
        _close(torch.nanmean(X, dim, keepdim=True), torch.nanmean(x, dim, keepdim=True))
        _close(torch.linalg.norm(X, 1, dim), torch.linalg.norm(x, 1, dim))
        if shape[dim]:
            _close(torch.std_mean(X, dim), torch.std_mean(x, dim))
            _close(torch.aminmax(X, dim=dim, keepdim=True), torch.aminmax(x, dim=dim, keepdim=True))
    if len(shape) == 2:
        _close(torch.linalg.norm(X, "fro"), torch.linalg.norm(x, "fro"))
        _close(torch.linalg.norm(X, dim=(0, 1)), torch.linalg.norm(x, dim=(0, 1)))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]))
def test_nan_aware_reductions_skip_stored_nans(data, density):
    x, _ = _pair(data, (4, 5), F64, density)
    x.view(-1)[3] = float("nan")
    X = scorch.sparse_tensor(x, format="csr")
    _close(torch.nansum(X), torch.nansum(x))
    _close(torch.nanmean(X, 1), torch.nanmean(x, 1))
    _close(X.nanmean(0, keepdim=True), x.nanmean(0, keepdim=True))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]), dense_partner=st.booleans())
def test_distances_match_dense(data, density, dense_partner):
    x, X = _pair(data, (4, 5), F64, density, KERNEL_FORMATS)
    y, Y = _pair(data, (4, 5), F64, 0.5, KERNEL_FORMATS)
    other = y if dense_partner else Y
    _close(torch.dist(X, other), torch.dist(x, y))
    _close(torch.dist(X, other, 1), torch.dist(x, y, 1))
    _close(F.cosine_similarity(X, other), F.cosine_similarity(x, y))
    _close(F.cosine_similarity(X, other, dim=0), F.cosine_similarity(x, y, dim=0))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), density=st.sampled_from([0.0, 0.4, 1.0]),
       bins=st.sampled_from([1, 5, 16]), bounds=st.sampled_from([(0, 0), (-1.0, 1.0), (0.2, 0.6)]))
def test_histograms_and_unique_count_the_implicit_zeros(data, shape, density, bins, bounds):
    x, X = _pair(data, shape, torch.float32, density)
    if x.numel():
        _close(torch.histc(X, bins, *bounds), torch.histc(x, bins, *bounds))
    _close(torch.unique(X), torch.unique(x))
    _close(torch.unique(X, return_counts=True), torch.unique(x, return_counts=True))
    k = (x * 4).round().abs().to(torch.int64).reshape(-1)
    K = scorch.sparse_tensor(k, format="c")
    _close(torch.bincount(K), torch.bincount(k))
    _close(torch.bincount(K, minlength=12), torch.bincount(k, minlength=12))
    for got, want in zip(torch.where(X), torch.where(x)):
        assert torch.equal(got, want)


def test_norm_and_cosine_gradients_reach_the_stored_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, dtype=F64, generator=g) * (torch.rand(4, 5, generator=g) < 0.6)
    y = torch.randn(4, 5, dtype=F64, generator=g)
    for call in (lambda a: torch.linalg.norm(a), lambda a: F.cosine_similarity(a, y).sum(),
                 lambda a: torch.dist(a, y), lambda a: torch.std_mean(a, 1)[0].sum(),
                 lambda a: torch.nanmean(a, 0).sum()):
        X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
        D = x.clone().requires_grad_()
        dense_of(call(X)).backward()
        call(D).backward()
        torch.testing.assert_close(X.grad.to_dense(), torch.where(x != 0, D.grad, 0.0))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), density=st.sampled_from([0.0, 0.4, 1.0]),
       ord=st.sampled_from(["fro", "nuc", 1, -1, 2, -2, float("inf"), float("-inf")]),
       keepdim=st.booleans(), dims=st.sampled_from([(0, 1), (1, 0), (-1, -2)]))
def test_matrix_norms_match_dense(data, density, ord, keepdim, dims):
    x, X = _pair(data, (4, 5), F64, density)
    _close(torch.linalg.norm(X, ord, keepdim=keepdim), torch.linalg.norm(x, ord, keepdim=keepdim))
    _close(torch.linalg.matrix_norm(X, ord, dims, keepdim), torch.linalg.matrix_norm(x, ord, dims, keepdim))
    t, T = _pair(data, (2, 3, 4), F64, density)
    if not isinstance(ord, str) and abs(ord) == 2:
        return
    _close(torch.linalg.norm(T, ord, dim=(2, 0)), torch.linalg.norm(t, ord, dim=(2, 0)))


def test_dense_factorizations_are_dense_by_nature_and_differentiable():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, dtype=F64, generator=g) * (torch.rand(4, 4, generator=g) < 0.5) + 3 * torch.eye(4, dtype=F64)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    D = x.clone().requires_grad_()
    for f in (torch.linalg.svdvals, torch.linalg.det, torch.linalg.inv, torch.linalg.eigvalsh,
              lambda a: torch.linalg.qr(a).R, lambda a: torch.linalg.solve(a, torch.ones(4, dtype=F64)),
              torch.logdet, lambda a: torch.linalg.slogdet(a).logabsdet):
        _close(f(X), f(x))
    (torch.linalg.inv(X).sum() + torch.linalg.det(X)).backward()
    (torch.linalg.inv(D).sum() + torch.linalg.det(D)).backward()
    torch.testing.assert_close(X.grad.to_dense(), torch.where(x != 0, D.grad, 0.0))


def test_bernoulli_of_sparse_probabilities_draws_only_where_stored():
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.5]], dtype=F64)
    P = scorch.sparse_tensor(p, format="csr")
    torch.manual_seed(0)
    draws = torch.stack([torch.bernoulli(P).to_dense() for _ in range(200)])
    assert isinstance(torch.bernoulli(P), scorch.SparseTensor)
    assert bool((draws[:, p == 0] == 0).all()) and bool((draws[:, p == 1] == 1).all())
    assert 0.35 < float(draws[:, 1, 2].mean()) < 0.65


@pytest.mark.parametrize("shape", [(3, 0), (0, 3), (0, 0), (2, 3, 0)])
@pytest.mark.parametrize("ord", [1, -1, float("inf"), float("-inf")])
def test_matrix_norm_of_an_empty_matrix_is_torchs(shape, ord):
    """Found by the op chains (session 23): the 1 / inf norms of a matrix with no columns
    (rows) raised where torch gives 0; the -1 / -inf ones raise as torch's do."""
    x = torch.zeros(shape, dtype=torch.float64)
    X = scorch.sparse_tensor(x, format="coo")
    try:
        want = torch.linalg.matrix_norm(x, ord)
    except (RuntimeError, IndexError):
        with pytest.raises((RuntimeError, IndexError)):
            torch.linalg.matrix_norm(X, ord)
        return
    got = torch.linalg.matrix_norm(X, ord)
    assert got.shape == want.shape and torch.equal(got, want)
