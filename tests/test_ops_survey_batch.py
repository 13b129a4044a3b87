"""The ops the OpInfo survey (``benchmarks/report_opinfo.py``) found on the dense fallback or
raising, now on sparse paths (session 19): special functions (``special_functions``), other
names of sparse ops (``variants``), region writes (``slice_writes``), statistics
(``summaries``), ``rms_norm`` / ``repeat_interleave`` / ``combinations``, ``isin``, ``fill``,
constant pads, dense exponents, negative-order norms. Against dense torch over shapes (empty
too), densities, dtypes and formats, with the fallback an error; a result is sparse exactly
where the op keeps 0 at 0."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, dense_values

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("no_dense_fallback")
SHAPES = [(4, 5), (6,), (2, 3, 4), (0, 3), (1, 1)]
_S = torch.special


def _pair(data, shape, dtype=F64, density=None):
    x = data.draw(dense_values(shape, dtype, density=density)) + 0      # no -0.0: torch.sparse has none
    return x, scorch.sparse_tensor(x, format=data.draw(st.sampled_from(FORMATS.get(len(shape), ["coo"]))))


def _close(got, want):
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-9)


# --- special functions: sparse where f(0) == 0, dense by nature elsewhere -----------------------

UNARY = [torch.angle, _S.i1, _S.i1e, _S.bessel_j1, _S.modified_bessel_i1, _S.entr, _S.round, _S.expit,
         _S.bessel_j0, _S.i0e, _S.ndtr, _S.log_ndtr, _S.erfcx, _S.spherical_bessel_j0, _S.sinc, torch.lgamma,
         torch.digamma, torch.acosh, _S.ndtri, _S.airy_ai, _S.modified_bessel_k0, _S.bessel_y1]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), fn=st.sampled_from(UNARY))
def test_special_functions_keep_the_pattern_exactly_where_they_keep_zero(data, shape, fn):
    x, X = _pair(data, shape)
    got, want = fn(X), fn(x)
    keeps_zero = bool(fn(torch.zeros(1, dtype=F64)) == 0)
    assert isinstance(got, scorch.SparseTensor) == keeps_zero
    _close(got, want)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3, 1), (2, 3, 4)]),
       fn=st.sampled_from([_S.xlog1py, torch.ldexp, torch.nextafter, torch.igamma, _S.chebyshev_polynomial_t,
                           _S.hermite_polynomial_h, _S.legendre_polynomial_p, torch.heaviside, torch.pow,
                           torch.float_power, torch.fmod, torch.copysign, torch.xlogy]),
       grow=st.booleans(), zeros_in_other=st.booleans())
def test_binary_functions_on_stored_values_or_dense_by_nature(data, shape, fn, grow, zeros_in_other):
    """The second operand dense, broadcasting the sparse one to a larger shape or not; the
    result is sparse when ``fn(0, other)`` is 0 at every position of ``other``."""
    x, X = _pair(data, shape)
    other_shape = (3,) + shape if grow else shape[1:]
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    other = torch.rand(other_shape, generator=g, dtype=F64) * 2 + 0.5
    if fn in (torch.ldexp, _S.chebyshev_polynomial_t, _S.hermite_polynomial_h, _S.legendre_polynomial_p):
        other = other.round()
    if zeros_in_other:
        other = other * (torch.rand(other_shape, generator=g) < 0.5)
    got, want = fn(X, other), fn(x, other)
    assert isinstance(got, scorch.SparseTensor) == bool((fn(torch.zeros((), dtype=F64), other) == 0).all()) \
        or fn in (torch.fmod, torch.xlogy)          # fmod / xlogy: torch.sparse's convention (0 stays 0)
    if fn not in (torch.fmod, torch.xlogy) or not zeros_in_other:
        _close(got, want)


def test_frexp_and_polygamma():
    x = torch.tensor([[0.0, 3.0, -0.25], [8.0, 0.0, 0.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr")
    m, e = torch.frexp(X)
    assert isinstance(m, scorch.SparseTensor) and isinstance(e, scorch.SparseTensor) and e.dtype == torch.int32
    _close(m, torch.frexp(x).mantissa)
    _close(e, torch.frexp(x).exponent)
    _close(torch.polygamma(1, X), torch.polygamma(1, x))
    _close(X.polygamma(2), x.polygamma(2))


# --- other names of sparse ops ---------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 6), (2, 3, 4), (0, 4), (1, 1)]))
def test_copy_forms_and_flips_match_their_views(data, shape):
    x, X = _pair(data, shape)
    r = len(shape)
    checks = [
        (torch.permute_copy(X, tuple(reversed(range(r)))), torch.permute_copy(x, tuple(reversed(range(r))))),
        (torch.transpose_copy(X, 0, -1), torch.transpose_copy(x, 0, -1)),
        (torch.unsqueeze_copy(X, 1), torch.unsqueeze_copy(x, 1)),
        (torch.view_copy(X, (-1,)), torch.view_copy(x, (-1,))),
        (torch.narrow_copy(X, 0, 0, shape[0]), torch.narrow_copy(x, 0, 0, shape[0])),
        (torch.fliplr(X), torch.fliplr(x)), (torch.flipud(X), torch.flipud(x)),
        (torch.rot90(X, 1, (0, 1)), torch.rot90(x, 1, (0, 1))), (torch.rot90(X, -1), torch.rot90(x, -1)),
        (torch.fft.fftshift(X), torch.fft.fftshift(x)), (torch.fft.ifftshift(X, 0), torch.fft.ifftshift(x, 0)),
    ]
    for got, want in checks:
        assert isinstance(got, scorch.SparseTensor)
        _close(got, want)
    _close(torch.linalg.diagonal(X), torch.linalg.diagonal(x))      # as torch.diagonal (an einsum)
    for got, want in zip(torch.unsafe_chunk(X, 2), torch.unsafe_chunk(x, 2)):
        _close(got, want)
    copy = torch.alias_copy(X)
    assert copy._storage.values.data_ptr() != X._storage.values.data_ptr() or X.nnz == 0


@settings(max_examples=20, deadline=None)
@given(data=st.data(), r=st.integers(1, 3), batch=st.integers(1, 2))
def test_shuffles_move_coordinates(data, r, batch):
    x, X = _pair(data, (batch, 2 * r * r, 3 * r, 2 * r))
    _close(F.pixel_shuffle(X, r), F.pixel_shuffle(x, r))
    _close(F.pixel_unshuffle(X, r), F.pixel_unshuffle(x, r))
    _close(F.channel_shuffle(X, 2), F.channel_shuffle(x, 2))
    assert isinstance(F.pixel_shuffle(X, r), scorch.SparseTensor)


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_product_forms_are_einsums(data):
    x, X = _pair(data, (4, 5))
    y = data.draw(dense_values((4, 5), F64, density=1.0))
    _close(torch.linalg.vecdot(X, y), torch.linalg.vecdot(x, y))
    _close(torch.addr(y, X[:, 0], X[0], beta=0.5, alpha=2.0)[:, :5], torch.addr(y, x[:, 0], x[0], beta=0.5, alpha=2.0)[:, :5])
    b1, b2 = X.reshape(2, 2, 5), y.reshape(2, 5, 2)
    _close(torch.addbmm(y[:2, :2], b1, b2), torch.addbmm(y[:2, :2], x.reshape(2, 2, 5), b2))
    w = y[:3].reshape(3, 5, 1).expand(3, 5, 5)
    _close(F.bilinear(X, y, w), F.bilinear(x, y, w))
    assert X[1:2, 2:3].item() == x[1, 2].item()


# --- region writes ----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3, 4, 2), (1, 3)]), sparse_src=st.booleans())
def test_region_writes_replace_only_their_region(data, shape, sparse_src):
    x, X = _pair(data, shape)

    def src(s):
        v = data.draw(dense_values(s, F64)) + 0
        return (scorch.sparse_tensor(v, format="coo") if sparse_src and v.dim() else v), v

    d = data.draw(st.integers(0, len(shape) - 1))
    i = data.draw(st.integers(0, shape[d] - 1))
    S, s = src(shape[:d] + shape[d + 1:])
    _close(torch.select_scatter(X, S, d, i), torch.select_scatter(x, s, d, i))
    start, step = data.draw(st.integers(0, shape[d] - 1)), data.draw(st.integers(1, 2))
    n = len(range(start, shape[d], step))
    S, s = src(shape[:d] + (n,) + shape[d + 1:])
    _close(torch.slice_scatter(X, S, d, start, None, step), torch.slice_scatter(x, s, d, start, None, step))
    if len(shape) >= 2:
        length = min(shape[0], shape[1])
        S, s = src(shape[2:] + (length,))
        _close(torch.diagonal_scatter(X, S), torch.diagonal_scatter(x, s))
    idx = torch.tensor(sorted(set(data.draw(st.lists(st.integers(0, shape[d] - 1), min_size=1, max_size=3)))))
    S, s = src(shape[:d] + (idx.numel(),) + shape[d + 1:])
    _close(torch.index_copy(X, d, idx, S), torch.index_copy(x, d, idx, s))
    value = data.draw(st.sampled_from([0.0, 1.5]))
    got = X.index_fill(d, idx, value)
    assert isinstance(got, scorch.SparseTensor)
    _close(got, x.index_fill(d, idx, value))
    flat = torch.tensor(data.draw(st.lists(st.integers(-x.numel(), x.numel() - 1), min_size=1, max_size=4)))
    vals = torch.arange(1.0, flat.numel() + 1, dtype=F64)
    _close(X.put(flat, vals, accumulate=True), x.put(flat, vals, accumulate=True))
    if flat.unique().numel() == flat.numel() and (flat % x.numel()).unique().numel() == flat.numel():
        _close(torch.put(X, flat, vals), torch.put(x, flat, vals))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (6,), (3, 4, 2), (1, 3)]),
       reduce=st.sampled_from(["prod", "mean", "amax", "amin"]), include_self=st.booleans(),
       sparse_src=st.booleans())
def test_index_reduce_reduces_only_the_indexed_slices(data, shape, reduce, include_self, sparse_src):
    """Repeated and unsorted indices; the input's other slices keep their stored entries (a
    sparse result); gradients for the stored entries and the source as dense torch's."""
    x, _ = _pair(data, shape)
    d = data.draw(st.integers(0, len(shape) - 1))
    idx = torch.tensor(data.draw(st.lists(st.integers(0, shape[d] - 1), max_size=5)), dtype=torch.int64)
    s = data.draw(dense_values(shape[:d] + (idx.numel(),) + shape[d + 1:], F64)) + 0
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    S = (scorch.sparse_tensor(s, format="coo") if sparse_src and s.dim() else s.clone()).requires_grad_()
    D, Sd = x.clone().requires_grad_(), s.clone().requires_grad_()
    got, want = X.index_reduce(d, idx, S, reduce, include_self=include_self), \
        D.index_reduce(d, idx, Sd, reduce, include_self=include_self)
    assert isinstance(got, scorch.SparseTensor)
    _close(got, want.detach())
    up = torch.rand(shape, dtype=F64)
    (got.to_dense() * up).sum().backward()
    (want * up).sum().backward()
    if X.nnz:
        _close(X.grad, D.grad * (x != 0))
    grad_s = S.grad.to_dense() if isinstance(S.grad, scorch.SparseTensor) else S.grad
    _close(grad_s, Sd.grad * (s != 0) if isinstance(S, scorch.SparseTensor) else Sd.grad)


def test_index_reduce_refuses_what_torch_refuses():
    X = scorch.sparse_tensor(torch.eye(3), format="coo")
    with pytest.raises(IndexError, match="out of range"):
        X.index_reduce(0, torch.tensor([3]), torch.ones(1, 3), "prod")
    with pytest.raises(IndexError, match="out of range"):
        X.index_reduce(0, torch.tensor([-1]), torch.ones(1, 3), "prod")
    with pytest.raises(RuntimeError, match="reduce"):
        X.index_reduce(0, torch.tensor([1]), torch.ones(1, 3), "sum")
    with pytest.raises(RuntimeError, match="shape"):
        X.index_reduce(0, torch.tensor([1]), torch.ones(1, 2), "amax")


# --- statistics, normalisation, repeats -------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(3, 6), (6,), (1, 4), (2, 1)]), weighted=st.booleans(),
       correction=st.sampled_from([0, 1, 2]))
def test_cov_and_corrcoef_match_dense(data, shape, weighted, correction):
    x, X = _pair(data, shape, density=data.draw(st.sampled_from([0.3, 0.7, 1.0])))
    n = shape[-1]
    fw = torch.arange(1, n + 1) if weighted else None
    aw = torch.linspace(0.5, 1.5, n, dtype=F64) if weighted else None
    _close(torch.cov(X, correction=correction, fweights=fw, aweights=aw),
           torch.cov(x, correction=correction, fweights=fw, aweights=aw))
    _close(torch.corrcoef(X), torch.corrcoef(x))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (6,), (2, 3, 4), (3, 0)]))
def test_trapezoid_weights_the_stored_entries(data, shape):
    x, X = _pair(data, shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[dim]
    _close(torch.trapezoid(X, dim=dim), torch.trapezoid(x, dim=dim))
    _close(torch.trapz(X, dx=0.25, dim=dim), torch.trapz(x, dx=0.25, dim=dim))
    if n:
        pts = torch.cumsum(torch.rand(n, dtype=F64) + 0.1, 0)
        _close(torch.trapezoid(X, pts, dim=dim), torch.trapezoid(x, pts, dim=dim))
        full = torch.cumsum(torch.rand(shape, dtype=F64) + 0.1, dim)
        _close(torch.trapz(X, full, dim=dim), torch.trapz(x, full, dim=dim))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (2, 3, 4), (0, 3)]), weighted=st.booleans(),
       eps=st.sampled_from([None, 1e-3]))
def test_rms_norm_keeps_the_pattern(data, shape, weighted, eps):
    x, X = _pair(data, shape)
    k = data.draw(st.integers(1, len(shape)))
    norm_shape = shape[len(shape) - k:]
    w = torch.rand(norm_shape, dtype=F64) + 0.5 if weighted else None
    got = F.rms_norm(X, norm_shape, w, eps)
    assert isinstance(got, scorch.SparseTensor) and got.nnz == X.nnz
    _close(got, F.rms_norm(x, norm_shape, w, eps))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (6,), (2, 3, 2), (0, 3)]))
def test_repeat_interleave_and_combinations(data, shape):
    x, X = _pair(data, shape)
    dim = data.draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    n = x.numel() if dim is None else shape[dim]
    reps = data.draw(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=n, max_size=n).map(
        lambda v: torch.tensor(v, dtype=torch.int64))))
    got = torch.repeat_interleave(X, reps, dim)
    assert isinstance(got, scorch.SparseTensor)
    _close(got, torch.repeat_interleave(x, reps, dim))
    if len(shape) == 1 and shape[0] <= 6:
        for r in (1, 2, 3):
            for rep in (False, True):
                _close(torch.combinations(X, r, rep), torch.combinations(x, r, rep))


# --- isin, fill, pads, norms ------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), with_zero=st.booleans(), invert=st.booleans(),
       sparse_test=st.booleans())
def test_isin_is_sparse_unless_zero_is_in(data, shape, with_zero, invert, sparse_test):
    x, X = _pair(data, shape, torch.int64)
    test = torch.tensor([1, -2, 3] + ([0] if with_zero else []))
    T = scorch.sparse_tensor(test, format="coo") if sparse_test else test
    got = torch.isin(X, T, invert=invert)
    assert isinstance(got, scorch.SparseTensor) == (with_zero == invert)
    _close(got, torch.isin(x, test, invert=invert))
    if sparse_test:
        _close(torch.isin(x, T), torch.isin(x, test))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), value=st.sampled_from([0.0, 2.5]))
def test_fill_and_constant_pad(data, shape, value):
    x, X = _pair(data, shape)
    got = torch.fill(X, value)
    assert isinstance(got, scorch.SparseTensor) == (value == 0)
    _close(got, torch.fill(x, value))
    pad = (1, 2)
    got = F.pad(X, pad, value=value)
    assert isinstance(got, scorch.SparseTensor) == (value == 0)
    _close(got, F.pad(x, pad, value=value))
    _close(torch.constant_pad_nd(X, pad, value), torch.constant_pad_nd(x, pad, value))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (6,), (2, 3, 4)]),
       ord=st.sampled_from([-1.0, -2.5, -math.inf, 0.5]))
def test_negative_order_norms_are_zero_over_a_zero(data, shape, ord):
    x, X = _pair(data, shape, density=data.draw(st.sampled_from([0.5, 1.0])))
    _close(torch.linalg.vector_norm(X, ord), torch.linalg.vector_norm(x, ord))
    dim = data.draw(st.integers(0, len(shape) - 1))
    _close(torch.linalg.vector_norm(X, ord, dim), torch.linalg.vector_norm(x, ord, dim))
    _close(torch.norm(X, ord, dim, keepdim=True), torch.norm(x, ord, dim, keepdim=True))
    _close(F.normalize(X, ord, dim), F.normalize(x, ord, dim))
    if len(shape) == 2:
        _close(torch.norm(X, "nuc"), torch.norm(x, "nuc"))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3, 2, 4), (5,)]), accumulate=st.booleans(),
       mask=st.booleans())
def test_index_put_with_leading_indices_writes_whole_slices(data, shape, accumulate, mask):
    """``x.index_put((rows,), v)``: fewer indices than dims write every position of the
    trailing dims; a bool mask over the leading dims stands for its positions."""
    x, X = _pair(data, shape)
    if mask:
        m = torch.tensor(data.draw(st.lists(st.booleans(), min_size=shape[0], max_size=shape[0])))
        index = (m,)
        count = int(m.sum())
    else:
        rows = data.draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=1, max_size=3))
        if not accumulate:
            rows = list({r % shape[0]: r for r in rows}.values())     # repeats: torch leaves the order open
        index = (torch.tensor(rows),)
        count = len(rows)
    values = data.draw(dense_values((count,) + shape[1:], F64, density=0.7)) + 0
    for v in (values, values[:1] if count else values, torch.tensor(2.5, dtype=F64)):
        got = X.index_put(index, v, accumulate=accumulate)
        assert isinstance(got, scorch.SparseTensor)
        _close(got, x.index_put(index, v, accumulate=accumulate))
