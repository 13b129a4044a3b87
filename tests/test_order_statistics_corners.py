"""Corners of the order statistics and NaN-aware / norm reductions of sparse tensors, against
dense torch (session 37's red-team): ``quantile`` / ``nanquantile`` (values and gradients on
the stored entries, from the stored entries alone), ``nanmean`` over fibers summing to +-inf,
``dim=[]`` (every dim, as torch) for ``nanmean`` / ``count_nonzero``, the gradient of
``vector_norm`` at stored zeros (``0 < p < 1`` and negative orders), negative orders over
NaN, ``diff`` of bool tensors, and ``renorm_`` in place. None may take the dense fallback."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import scorch
from ops_helpers import FORMATS

F64 = torch.float64
nan, inf = float("nan"), float("inf")

pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _same(got, want):
    got = _dense(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    torch.testing.assert_close(got, want, equal_nan=True)


def _stored_grad(x: torch.Tensor, fn, fmt: str = "csr") -> tuple:
    """The gradient of ``fn`` (weighted sum) on ``x``'s nonzeros: sparse and dense torch's."""
    d = x.clone().requires_grad_()
    out_d = fn(d)
    w = torch.rand(out_d.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    gd, = torch.autograd.grad((out_d * w).nansum(), d)
    s = scorch.sparse_tensor(x, format=fmt, requires_grad=True)
    gs, = torch.autograd.grad((_dense(fn(s)) * w).nansum(), s)
    return gs.to_dense(), torch.where(x != 0, gd, torch.zeros((), dtype=x.dtype))


# --- quantile / nanquantile -----------------------------------------------------------------

_Q_INPUTS = {
    "plain": torch.tensor([[0., -1., 2., 0., 0.5], [3., 0., 0., -4., 0.], [0., 0., 0., 0., 0.],
                           [1., 2., 3., 4., 5.]], dtype=F64),
    "nan": torch.tensor([[0., nan, 2., 0., 0.5], [3., 0., 0., -4., 0.], [nan, nan, nan, nan, nan],
                         [1., 2., nan, 4., -5.]], dtype=F64),
    "ties": torch.tensor([[1., 1., 0., 1., 0.], [0., -2., -2., 0., 0.], [0.5, 0.5, 0.5, 0.5, 0.5],
                          [0., 0., 0., 0., 1.]], dtype=torch.float32),
}
_QS = [0.3, 0.0, 1.0, 0.5, torch.tensor(0.25), torch.tensor([0.1, 0.5, 0.9, 1.0])]
_INTERPOLATIONS = ["linear", "lower", "higher", "midpoint", "nearest"]


@pytest.mark.parametrize("fmt", FORMATS[2])
@pytest.mark.parametrize("name", sorted(_Q_INPUTS))
@pytest.mark.parametrize("fn", [torch.quantile, torch.nanquantile], ids=["quantile", "nanquantile"])
def test_quantile_matches_dense(fn, name, fmt):
    x = _Q_INPUTS[name]
    s = scorch.sparse_tensor(x, format=fmt)
    for q, dim, keepdim, interpolation in itertools.product(_QS, [None, 0, 1, -1], [False, True],
                                                           _INTERPOLATIONS):
        q = q.to(x.dtype) if isinstance(q, torch.Tensor) else q
        got = fn(s, q, dim, keepdim, interpolation=interpolation)
        assert type(got) is torch.Tensor
        _same(got, fn(x, q, dim, keepdim, interpolation=interpolation))


@pytest.mark.parametrize("shape", [(6,), (2, 3, 4), (1, 1), (5, 1)])
def test_quantile_other_ranks(shape):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, dtype=F64, generator=g) * (torch.rand(shape, generator=g) < 0.5)
    for fmt in FORMATS[len(shape)]:
        s = scorch.sparse_tensor(x, format=fmt)
        for dim in [None, *range(len(shape))]:
            for q in (0.7, torch.tensor([0.0, 0.4, 1.0], dtype=F64)):
                _same(torch.quantile(s, q, dim), torch.quantile(x, q, dim))
                _same(s.nanquantile(q, dim, keepdim=True), x.nanquantile(q, dim, keepdim=True))


@pytest.mark.parametrize("interpolation", ["linear", "midpoint", "nearest"])
@pytest.mark.parametrize("dim", [None, 0, 1])
@pytest.mark.parametrize("fn", [torch.quantile, torch.nanquantile], ids=["quantile", "nanquantile"])
def test_quantile_gradient_on_the_stored_entries(fn, dim, interpolation):
    """The gradient splits between the two neighbouring order statistics, as torch's (distinct
    values: the tie order of torch's sort is not specified)."""
    x = torch.tensor([[0., -1., 2., 0., 0.5], [3., 0., 0., -4., 0.], [0.25, 1.5, -0.7, 4., -5.]], dtype=F64)
    for q in (0.3, torch.tensor([0.2, 0.77], dtype=F64)):
        got, want = _stored_grad(x, lambda t: fn(t, q, dim, interpolation=interpolation))
        torch.testing.assert_close(got, want)


def test_quantile_gradient_reaches_q():
    x = torch.tensor([[0., -1., 2., 0.], [3., 0., 0., -4.]], dtype=F64)
    s = scorch.sparse_tensor(x)
    for q in (torch.tensor(0.3, dtype=F64), torch.tensor([0.3, 0.8], dtype=F64)):
        qd, qs = q.clone().requires_grad_(), q.clone().requires_grad_()
        want, = torch.autograd.grad(torch.quantile(x, qd, dim=1).sum(), qd)
        got, = torch.autograd.grad(torch.quantile(s, qs, dim=1).sum(), qs)
        torch.testing.assert_close(got, want)


def test_quantile_errors_are_torch_s():
    x = torch.tensor([[0., -1., 2., 0.], [3., 0., 0., -4.]])
    s = scorch.sparse_tensor(x)
    for args, kwargs in [((1.5,), {}), ((torch.tensor([0.5], dtype=F64),), {}),
                         ((0.5,), {"interpolation": "foo"}), ((torch.full((2, 2), 0.5),), {}),
                         ((0.5, 2), {})]:
        with pytest.raises((RuntimeError, IndexError)) as want:
            torch.quantile(x, *args, **kwargs)
        with pytest.raises(type(want.value), match=r"quantile|[Dd]imension"):
            torch.quantile(s, *args, **kwargs)
    with pytest.raises(RuntimeError, match="quantile.*non-empty"):
        torch.quantile(scorch.sparse_tensor(torch.zeros(3, 0)), 0.5, dim=0)
    with pytest.raises(RuntimeError, match="quantile.*must be either float or double"):
        torch.quantile(scorch.sparse_tensor(torch.tensor([[0, 2], [1, 0]])), 0.5)
    # torch's limit on a fiber's length (a dense tensor this long raises the same), and no
    # dense copy tried on the way
    big = scorch.sparse_tensor((torch.tensor([[0, 5]]), torch.tensor([1., 2.])), size=(10 ** 9,))
    with pytest.raises(RuntimeError, match=r"quantile\(\) input tensor is too large"):
        torch.quantile(big, 0.5)


def test_quantile_of_a_long_hypersparse_fiber():
    """2**24 positions, 3 stored: the implicit zeros counted, no dense copy."""
    n = 2 ** 24
    s = scorch.sparse_tensor((torch.tensor([[0, 7, n - 1]]), torch.tensor([-3., 5., 2.], dtype=F64)),
                             size=(n,))
    assert float(torch.quantile(s, 0.0)) == -3.0 and float(torch.quantile(s, 1.0)) == 5.0
    assert float(torch.quantile(s, 0.5)) == 0.0
    torch.testing.assert_close(torch.quantile(s, (n - 2) / (n - 1)), torch.tensor(2.0, dtype=F64))


# --- nanmean / count_nonzero -----------------------------------------------------------------

def test_nanmean_of_fibers_summing_to_infinity():
    x = torch.tensor([[0., -1., -inf, 2.], [1., 0., 0., nan], [inf, 0., 3., 0.], [nan, nan, nan, nan],
                      [inf, 0., -inf, 0.]])
    for fmt in FORMATS[2]:
        s = scorch.sparse_tensor(x, format=fmt)
        for dim in (0, 1, -1, (0, 1), [1, 0]):
            for keepdim in (False, True):
                _same(torch.nanmean(s, dim, keepdim), torch.nanmean(x, dim, keepdim))
        _same(s.nanmean(), x.nanmean())


def test_nanmean_three_dims():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, generator=g) * (torch.rand(2, 3, 4, generator=g) < 0.5)
    x[0, 1, 2], x[1, 0, 0], x[1, 2, 3], x[0, 0, 1] = inf, nan, -inf, nan
    for fmt in FORMATS[3]:
        s = scorch.sparse_tensor(x, format=fmt)
        for k in (1, 2, 3):
            for dims in itertools.combinations(range(3), k):
                _same(torch.nanmean(s, dims), torch.nanmean(x, dims))


def test_empty_dim_list_reduces_every_dim():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 6, generator=g)
    x[torch.rand(4, 6, generator=g) < 0.6] = 0
    x[1, 1] = nan
    for fmt in FORMATS[2]:
        s = scorch.sparse_tensor(x, format=fmt)
        for dims in ([], ()):
            _same(torch.nanmean(s, dims), torch.nanmean(x, dims))
            _same(torch.nanmean(s, dims, keepdim=True), torch.nanmean(x, dims, keepdim=True))
            got = torch.count_nonzero(s, dim=dims)
            assert type(got) is torch.Tensor
            _same(got, torch.count_nonzero(x, dim=dims))


# --- vector_norm ---------------------------------------------------------------------------------

_WITH_STORED_ZEROS = (torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2, 1, 2]]),
                      torch.tensor([2., 0., 3., 1., 5., -2., 0., 4.], dtype=F64))


@pytest.mark.parametrize("p", [0.5, 0.3, 1.5, -1, -0.5, -2, -inf])
@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)])
def test_norm_gradient_at_stored_zeros(p, dim):
    """torch's norm backward gives 0 at a zero; the power's own derivative there is
    ``inf * 0`` (NaN) for ``p < 1``."""
    idx, vals = _WITH_STORED_ZEROS
    dense = torch.zeros(3, 3, dtype=F64).index_put_(tuple(idx), vals)
    for fn in (lambda t: torch.linalg.vector_norm(t, p, dim=dim), lambda t: torch.norm(t, p, dim=dim)):
        d = dense.clone().requires_grad_()
        want, = torch.autograd.grad(fn(d).sum(), d)
        v = vals.clone().requires_grad_()
        s = scorch.sparse_tensor((idx, v), size=(3, 3), format="csr")
        out = fn(s)
        _same(out, fn(dense))
        got, = torch.autograd.grad(_dense(out).sum(), v)
        torch.testing.assert_close(got, want[tuple(idx)])


def test_negative_order_norm_propagates_nan():
    x = torch.tensor([[1., nan, 0., 2.], [0., 3., 0., 0.], [nan, 1., 2., 4.], [1., 2., 3., 4.]])
    for fmt in FORMATS[2]:
        s = scorch.sparse_tensor(x, format=fmt)
        for p in (-1, -2, -0.5, -inf):
            for dim in (0, 1, None):
                _same(torch.linalg.vector_norm(s, p, dim=dim), torch.linalg.vector_norm(x, p, dim=dim))
                _same(torch.linalg.vector_norm(s, p, dim=dim, keepdim=True),
                      torch.linalg.vector_norm(x, p, dim=dim, keepdim=True))


# --- diff of bool ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 5), (6,), (2, 3, 4), (0, 3), (3, 0), (1, 1), (0,), (1,)])
def test_diff_of_bool_is_xor_of_neighbours(shape):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(2)) < 0.4
    for fmt in FORMATS[len(shape)]:
        s = scorch.sparse_tensor(x, format=fmt)
        for dim in range(-len(shape), len(shape)):
            for n in (0, 1, 2, 5):
                got = torch.diff(s, n=n, dim=dim)
                assert got.dtype == torch.bool
                _same(got, torch.diff(x, n=n, dim=dim))


# --- renorm_ --------------------------------------------------------------------------------------

_RENORM_X = torch.tensor([[0., -1., 2., 0.], [3., 0., 0., -4.], [0., 0., 0.5, 0.]], dtype=F64)


@pytest.mark.parametrize("fmt", FORMATS[2])
def test_renorm_in_place_writes_the_stored_values(fmt):
    for p, dim, maxnorm in [(2, 0, 1.0), (1, 1, 0.7), (3, -1, 2.0), (inf, 0, 1.0), (0.5, 1, 1.0)]:
        s = scorch.sparse_tensor(_RENORM_X, format=fmt)
        values, nnz = s._storage.values, s.nnz
        assert s.renorm_(p, dim, maxnorm) is s
        assert s.nnz == nnz and s._storage.values.data_ptr() == values.data_ptr()
        _same(s, _RENORM_X.clone().renorm_(p, dim, maxnorm))


def test_renorm_in_place_gradient_and_errors():
    w = torch.arange(12, dtype=F64).reshape(3, 4)

    def call(t):
        y = t * 2
        y.renorm_(2, 0, 1.0)
        return y * w
    got, want = _stored_grad(_RENORM_X, call)
    torch.testing.assert_close(got, want)
    s = scorch.sparse_tensor(_RENORM_X, requires_grad=True)
    d = _RENORM_X.clone().requires_grad_()
    _dense(call(s)).sum().backward()                   # through .backward() as well
    call(d).sum().backward()
    torch.testing.assert_close(s.grad.to_dense(), torch.where(_RENORM_X != 0, d.grad, 0.0))
    with pytest.raises(RuntimeError, match="leaf Variable"):
        scorch.sparse_tensor(_RENORM_X, requires_grad=True).renorm_(2, 0, 1.0)
    for args in [(-1, 0, 1.0), (2, 5, 1.0), (2, 0, -1.0)]:
        s = scorch.sparse_tensor(_RENORM_X)
        with pytest.raises((RuntimeError, IndexError)) as want_err:
            _RENORM_X.clone().renorm_(*args)
        with pytest.raises(type(want_err.value), match=str(want_err.value).split("(")[0][:20]):
            s.renorm_(*args)
        _same(s, _RENORM_X)                            # nothing written


def test_large_fiber_count_not_densified():
    """nanmean along a dim of a hypersparse matrix stays sparse (no dense count array)."""
    n = 2_000_000
    idx = torch.tensor([[0, 5, 5, n - 1], [3, 0, 9, n - 2]])
    s = scorch.sparse_tensor((idx, torch.tensor([1., nan, inf, 2.], dtype=F64)), size=(n, n),
                             format="csr")
    got = torch.nanmean(s, 0)
    assert isinstance(got, scorch.SparseTensor)
    col = got.to_dense()
    assert float(col[3]) == 1 / n and math.isinf(float(col[9])) and float(col[0]) == 0.0
    assert float(col[n - 2]) == 2 / n
