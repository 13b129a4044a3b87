"""The products torch names that are einsums (outer, dot, tensordot, kron, trace, diagonal) and
the ops composed of stored-value operations (clamp, nan_to_num, isnan/isinf, lerp,
count_nonzero, any/all, max/min, norm, tril/triu, narrow), on sparse operands against dense
torch, with gradients where torch has them. None of them may take the dense fallback: the
tests fail on its warning."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import DENSITIES, FLOATS, FORMATS, assert_matches, dense_of, dense_values, grad_matches

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _sparse(d, fmt, requires_grad=False):
    return scorch.sparse_tensor(d, format=fmt, requires_grad=requires_grad)


# --- products ------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(data=st.data(), m=st.integers(0, 6), n=st.integers(0, 6), fa=st.sampled_from(FORMATS[1]),
       fb=st.sampled_from(FORMATS[1] + ["dense"]))
def test_outer_and_dot_of_sparse_vectors(data, m, n, fa, fb):
    a = data.draw(dense_values((m,)))
    b = data.draw(dense_values((n,)))
    A = _sparse(a, fa)
    B = b if fb == "dense" else _sparse(b, fb)
    assert_matches(torch.outer(A, B), torch.outer(a, b))
    assert_matches(torch.ger(A, B), torch.outer(a, b))
    c = data.draw(dense_values((m,)))
    C = c if fb == "dense" else _sparse(c, fb)
    assert_matches(A.dot(C), torch.dot(a, c))
    assert_matches(torch.inner(A, C), torch.inner(a, c))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), shape_a=st.sampled_from([(2, 3), (0, 2), (3, 1), (1, 4)]),
       shape_b=st.sampled_from([(2, 2), (1, 3), (3,), (2, 1, 2)]), fmt=st.sampled_from(FORMATS[2]),
       b_sparse=st.booleans())
def test_kron_interleaves_the_index_pairs(data, shape_a, shape_b, fmt, b_sparse):
    a = data.draw(dense_values(shape_a))
    b = data.draw(dense_values(shape_b))
    B = _sparse(b, FORMATS[len(shape_b)][0]) if b_sparse else b
    assert_matches(torch.kron(_sparse(a, fmt), B), torch.kron(a, b))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), dims=st.sampled_from([1, 2, ([0], [1]), ([2, 1], [0, 1]), 0]),
       fmt=st.sampled_from(FORMATS[3]), dtype=st.sampled_from(FLOATS))
def test_tensordot_contracts_the_named_dimensions(data, dims, fmt, dtype):
    x = data.draw(dense_values((3, 4, 2), dtype))
    if dims == 1:
        y = torch.rand(2, 3, dtype=dtype)
    elif dims == 2:
        y = torch.rand(4, 2, 3, dtype=dtype)
    elif dims == 0:
        y = torch.rand(2, dtype=dtype)
    elif dims == ([0], [1]):
        y = torch.rand(2, 3, dtype=dtype)
    else:
        y = torch.rand(2, 4, 5, dtype=dtype)
    assert_matches(torch.tensordot(_sparse(x, fmt), y, dims=dims), torch.tensordot(x, y, dims=dims))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), m=st.integers(1, 6), n=st.integers(1, 6), fmt=st.sampled_from(FORMATS[2]))
def test_trace_and_diagonal(data, m, n, fmt):
    x = data.draw(dense_values((m, n)))
    X = _sparse(x, fmt)
    assert_matches(torch.trace(X), torch.trace(x))
    assert_matches(dense_of(torch.diagonal(X)), torch.diagonal(x))
    assert_matches(dense_of(X.diag()), x.diag())


def test_product_gradients_match_dense():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, dtype=F64, generator=g) * (torch.rand(5, generator=g) < 0.6)
    b = torch.rand(4, dtype=F64, generator=g)
    A, D = _sparse(a, "c", True), a.clone().requires_grad_()
    (torch.outer(A, b).to_dense() * torch.arange(20.).reshape(5, 4)).sum().backward()
    (torch.outer(D, b) * torch.arange(20.).reshape(5, 4)).sum().backward()
    grad_matches(A, D)
    m = torch.rand(3, 3, dtype=F64, generator=g) * (torch.rand(3, 3, generator=g) < 0.6)
    M, Dm = _sparse(m, "csr", True), m.clone().requires_grad_()
    (dense_of(torch.kron(M, torch.eye(2, dtype=F64))) * torch.arange(36.).reshape(6, 6)).sum().backward()
    (torch.kron(Dm, torch.eye(2, dtype=F64)) * torch.arange(36.).reshape(6, 6)).sum().backward()
    grad_matches(M, Dm)


# --- stored-value ops -----------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2)]),
       bounds=st.sampled_from([(-0.3, 0.4), (None, 0.2), (-0.1, None), (0.2, 0.5), (None, -0.2), (0, 0)]),
       dtype=st.sampled_from(FLOATS))
def test_clamp_keeps_the_pattern_only_where_it_keeps_zero(data, shape, bounds, dtype):
    x = data.draw(dense_values(shape, dtype))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    lo, hi = bounds
    keeps_zero = (lo is None or lo <= 0) and (hi is None or hi >= 0)
    assert_matches(torch.clamp(X, lo, hi), torch.clamp(x, lo, hi), sparse=keeps_zero)
    assert_matches(X.clip(lo, hi), x.clip(lo, hi), sparse=keeps_zero)


def test_clamp_nan_to_num_and_lerp_gradients():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 5, dtype=F64, generator=g) - 0.5) * (torch.rand(4, 5, generator=g) < 0.5)
    y = (torch.rand(4, 5, dtype=F64, generator=g) - 0.5) * (torch.rand(4, 5, generator=g) < 0.5)
    w = torch.rand(4, 5, dtype=F64, generator=g)
    for op in (lambda t: torch.clamp(t, -0.2, 0.3), lambda t: torch.clamp(t, min=0.1),
               lambda t: torch.nan_to_num(t), lambda t: torch.lerp(t, y, 0.3),
               lambda t: torch.lerp(t, _sparse(y, "csr"), 0.7),
               lambda t: torch.tril(t, 1), lambda t: torch.triu(t, -1)):
        X, D = _sparse(x, "csr", True), x.clone().requires_grad_()
        out, ref = dense_of(op(X)), op(D)
        torch.testing.assert_close(out, ref)
        (out * w).sum().backward()
        (ref * w).sum().backward()
        grad_matches(X, D)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), fmt=st.sampled_from(FORMATS[2]))
def test_nan_to_num_isnan_isinf_on_stored_specials(data, fmt):
    x = data.draw(dense_values((4, 5)))
    x[0, 0], x[1, 2], x[3, 4] = float("nan"), float("inf"), float("-inf")
    X = _sparse(x, fmt)
    assert_matches(torch.nan_to_num(X), torch.nan_to_num(x), sparse=True)
    assert_matches(torch.nan_to_num(X, posinf=9.0, neginf=-9.0), torch.nan_to_num(x, posinf=9.0, neginf=-9.0))
    for op in (torch.isnan, torch.isinf, torch.isposinf, torch.isneginf):
        assert_matches(op(X), op(x), sparse=True)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2), (1, 1)]),
       density=st.sampled_from(DENSITIES))
def test_reductions_over_every_element_count_the_implicit_zeros(data, shape, density):
    x = data.draw(dense_values(shape, F64, density))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    assert_matches(torch.count_nonzero(X), torch.count_nonzero(x))
    assert_matches(X.any(), x.any())
    assert_matches(X.all(), x.all())
    if x.numel():
        assert_matches(X.max(), x.max())
        assert_matches(torch.min(X), torch.min(x))
    else:
        with pytest.raises(RuntimeError, match="numel"):
            X.max()
    for ord in (2, 1, 3, math.inf, 0):
        if ord == math.inf and not x.numel():
            with pytest.raises(RuntimeError, match="empty"):
                torch.linalg.vector_norm(X, ord)
            continue
        assert_matches(torch.linalg.vector_norm(X, ord), torch.linalg.vector_norm(x, ord))
    assert_matches(X.norm(), x.norm())
    if len(shape) >= 2:
        assert_matches(torch.count_nonzero(X, dim=1), torch.count_nonzero(x, dim=1))
        for ord in (2, 1, 0.5, math.inf):
            if ord == math.inf and shape[1] == 0:
                continue
            assert_matches(torch.linalg.vector_norm(X, ord, dim=1), torch.linalg.vector_norm(x, ord, dim=1))
        assert_matches(torch.norm(X, dim=0, keepdim=True), torch.norm(x, dim=0, keepdim=True))
    # dtype= casts the input first (a float32 input's norm in float64)
    X32, x32 = X.to(torch.float32), x.to(torch.float32)
    assert_matches(torch.linalg.vector_norm(X32, 2, dtype=F64), torch.linalg.vector_norm(x32, 2, dtype=F64))
    assert_matches(torch.norm(X32, 1, dtype=F64), torch.norm(x32, 1, dtype=F64))


def test_norm_gradient_matches_dense():
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(4, 5, dtype=F64, generator=g) - 0.5) * (torch.rand(4, 5, generator=g) < 0.5)
    for op in (lambda t: t.norm(), lambda t: torch.linalg.vector_norm(t, 1),
               lambda t: torch.linalg.vector_norm(t, 2, dim=1)):
        X, D = _sparse(x, "csr", True), x.clone().requires_grad_()
        (dense_of(op(X)) * 1.5).sum().backward()
        (op(D) * 1.5).sum().backward()
        grad_matches(X, D)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (5, 3), (0, 2), (2, 3, 4)]),
       diagonal=st.integers(-3, 3))
def test_tril_triu_filter_the_stored_entries(data, shape, diagonal):
    x = data.draw(dense_values(shape))
    fmt = data.draw(st.sampled_from(FORMATS[len(shape)]))
    X = _sparse(x, fmt)
    for op in (torch.tril, torch.triu):
        r = op(X, diagonal)
        assert_matches(r, op(x, diagonal), sparse=True)
        assert r.format == X.format and r.nnz <= X.nnz     # the stored entries, filtered


@settings(max_examples=20, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4)]))
def test_narrow_is_a_slice(data, shape):
    x = data.draw(dense_values(shape))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    dim = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[dim]))
    length = data.draw(st.integers(0, shape[dim] - start))
    assert_matches(dense_of(X.narrow(dim, start, length)), x.narrow(dim, start, length))
    with pytest.raises(RuntimeError, match="exceeds"):
        X.narrow(dim, start, shape[dim] - start + 1)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3, 1), (2, 3, 2)]), p=st.sampled_from([2.0, 1.0, 3.0]),
       dtype=st.sampled_from(FLOATS))
def test_normalize_divides_by_the_norm_on_the_pattern(data, shape, p, dtype):
    x = data.draw(dense_values(shape, dtype))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    assert_matches(torch.nn.functional.normalize(X, p=p, dim=dim), torch.nn.functional.normalize(x, p=p, dim=dim),
                   sparse=True)
    assert_matches(torch.clamp_min(X, -0.3), torch.clamp_min(x, -0.3), sparse=True)
    assert_matches(X.clamp_max(0.3), x.clamp_max(0.3), sparse=True)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (0, 3)]), n=st.integers(1, 3))
def test_diff_subtracts_shifted_slices(data, shape, n):
    x = data.draw(dense_values(shape))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    assert_matches(dense_of(torch.diff(X, n=n, dim=dim)), torch.diff(x, n=n, dim=dim))


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")
@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (0, 3), (1, 1)]),
       correction=st.sampled_from([None, 0, 1, 2]), keepdim=st.booleans(), dtype=st.sampled_from(FLOATS))
def test_var_and_std_count_the_implicit_zeros(data, shape, correction, keepdim, dtype):
    x = data.draw(dense_values(shape, dtype))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    dim = data.draw(st.sampled_from([None] + list(range(len(shape))) + ([(0, -1)] if len(shape) > 1 else [])))
    kw = {} if correction is None else {"correction": correction}
    for op in (torch.var, torch.std):
        want = op(x, dim, keepdim=keepdim, **kw)
        got = op(X, dim, keepdim=keepdim, **kw)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-4 if dtype == torch.float32 else 1e-9,
                                   atol=1e-5 if dtype == torch.float32 else 1e-10)
    if x.numel() > 1:
        assert_matches(X.var(), x.var())
    torch.testing.assert_close(X.std(False), x.std(False), equal_nan=True)


def test_var_of_large_values_keeps_precision():
    """Two passes: a large mean does not cancel the spread away."""
    x = torch.full((3, 1000), 1e4, dtype=torch.float32)
    x[:, ::3] = 0
    x = x + torch.arange(1000, dtype=torch.float32) * 1e-2
    X = _sparse(x, "csr")
    torch.testing.assert_close(X.var(1), x.var(1), rtol=1e-4, atol=1e-2)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (0, 3)]))
def test_flip_roll_repeat_move_the_coordinates(data, shape):
    x = data.draw(dense_values(shape))
    fmt = data.draw(st.sampled_from(FORMATS[len(shape)]))
    X = _sparse(x, fmt)
    rank = len(shape)
    dims = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    shifts = data.draw(st.lists(st.integers(-7, 7), min_size=len(dims), max_size=len(dims)))
    reps = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank + 1))
    for got, want in ((X.flip(dims), x.flip(dims)), (torch.roll(X, shifts, dims), torch.roll(x, shifts, dims)),
                      (X.repeat(*reps), x.repeat(*reps))):
        assert isinstance(got, scorch.SparseTensor)
        assert got.dim() > rank or got.format.levels == X.format.levels   # new leading dims: COO
        assert_matches(dense_of(got), want)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), fmt=st.sampled_from(FORMATS[2]), other=st.sampled_from(["same", "scaled", "dense", "tiny"]))
def test_equal_and_allclose(data, fmt, other):
    x = data.draw(dense_values((4, 5)))
    X = _sparse(x, fmt)
    y = {"same": x, "scaled": x * 1.5, "dense": x, "tiny": x + 1e-12 * (x != 0)}[other]
    Y = y if other == "dense" else _sparse(y, "csr")
    assert torch.equal(X, Y) == torch.equal(x, y)
    assert torch.allclose(X, Y) == torch.allclose(x, y)
    assert X.allclose(Y, atol=0.0, rtol=0.0) == torch.allclose(x, y, atol=0.0, rtol=0.0)
    assert torch.equal(X, _sparse(torch.zeros(4, 6), "csr")) is False


# --- torch.sparse's API on scorch tensors ---------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(data=st.data(), m=st.integers(0, 6), n=st.integers(0, 6), k=st.integers(1, 4),
       beta=st.sampled_from([0.0, 1.0, 0.5]), alpha=st.sampled_from([1.0, -2.0]))
def test_sampled_addmm_is_an_sddmm_on_the_pattern(data, m, n, k, beta, alpha):
    s = data.draw(dense_values((m, n)))
    a, b = torch.rand(m, k, dtype=F64), torch.rand(k, n, dtype=F64)
    S = _sparse(s, "csr")
    r = torch.sparse.sampled_addmm(S, a, b, beta=beta, alpha=alpha)
    assert isinstance(r, scorch.SparseTensor) and r.nnz == S.nnz and r.format == S.format
    want = torch.where(s != 0, alpha * (a @ b) + beta * s, torch.zeros((), dtype=F64))
    torch.testing.assert_close(r.to_dense(), want)


def test_sampled_addmm_gradients_match_dense():
    g = torch.Generator().manual_seed(3)
    s = torch.rand(5, 6, dtype=F64, generator=g) * (torch.rand(5, 6, generator=g) < 0.5)
    mask = (s != 0).to(F64)
    a = torch.rand(5, 3, dtype=F64, generator=g, requires_grad=True)
    b = torch.rand(3, 6, dtype=F64, generator=g, requires_grad=True)
    S, D = _sparse(s, "csr", True), s.clone().requires_grad_()
    r = torch.sparse.sampled_addmm(S, a, b, beta=0.5, alpha=2.0).to_dense()
    w = torch.rand(5, 6, dtype=F64, generator=g)
    (r * w).sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    ((mask * (2.0 * (a @ b)) + 0.5 * D) * w).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)
    grad_matches(S, D)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), beta=st.sampled_from([0.0, 1.0, 2.0]), alpha=st.sampled_from([1.0, 3.0]))
def test_addmv_baddbmm_and_sparse_addmm(data, beta, alpha):
    s = data.draw(dense_values((4, 5)))
    S = _sparse(s, data.draw(st.sampled_from(FORMATS[2])))
    v, c, y = torch.rand(5, dtype=F64), torch.rand(4, dtype=F64), torch.rand(5, 2, dtype=F64)
    assert_matches(torch.addmv(c, S, v, beta=beta, alpha=alpha), torch.addmv(c, s, v, beta=beta, alpha=alpha))
    z = torch.rand(4, 2, dtype=F64)
    assert_matches(torch.sparse.addmm(z, S, y, beta=beta, alpha=alpha), torch.addmm(z, s, y, beta=beta, alpha=alpha))
    assert_matches(torch.baddbmm(z[None], S[None], y[None], beta=beta, alpha=alpha),
                   torch.baddbmm(z[None], s[None], y[None], beta=beta, alpha=alpha))


def test_layout_accessors_match_torch_and_name_the_format_otherwise():
    g = torch.Generator().manual_seed(4)
    s = torch.rand(5, 6, dtype=F64, generator=g) * (torch.rand(5, 6, generator=g) < 0.4)
    S = _sparse(s, "coo")
    csr, csc = S.to_sparse_csr(), S.to_sparse_csc()
    assert isinstance(csr, scorch.SparseTensor) and csr.format == scorch.Format("dc")
    assert torch.equal(csr.crow_indices().long(), s.to_sparse_csr().crow_indices())
    assert torch.equal(csr.col_indices().long(), s.to_sparse_csr().col_indices())
    assert torch.equal(csc.ccol_indices().long(), s.to_sparse_csc().ccol_indices())
    assert torch.equal(csc.row_indices().long(), s.to_sparse_csc().row_indices())
    assert csr.to_sparse().format == S.format and S.coalesce() is S and S.is_coalesced()
    with pytest.raises(RuntimeError, match="expected a CSR tensor.*to_format"):
        S.crow_indices()
    with pytest.raises(RuntimeError, match="expected a CSC tensor"):
        csr.ccol_indices()


def test_sparse_mask_gathers_the_dense_values_differentiably():
    g = torch.Generator().manual_seed(5)
    s = torch.rand(5, 6, dtype=F64, generator=g) * (torch.rand(5, 6, generator=g) < 0.4)
    S = _sparse(s, "csr")
    x = torch.rand(5, 6, dtype=F64, generator=g, requires_grad=True)
    m = x.sparse_mask(S)
    assert isinstance(m, scorch.SparseTensor) and m.nnz == S.nnz
    torch.testing.assert_close(m.to_dense(), x.detach() * (s != 0))
    m.to_dense().sum().backward()
    torch.testing.assert_close(x.grad, (s != 0).to(F64))


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from([(0, 3), (1, 4), (5, 6), (3,), (2, 3, 2)]),
       fmt=st.sampled_from(["csr", "csc", "coo", "dcsr"]), density=st.sampled_from([0.0, 0.4, 1.0]),
       xdtype=st.sampled_from([torch.float32, F64, torch.int32]), seed=st.integers(0, 99))
def test_sparse_mask_on_any_pattern_keeps_it(shape, fmt, density, xdtype, seed):
    # a kernel stored(mask) * x on the mask's arrays: its stored zeros stay stored, the
    # result takes x's dtype, as torch's
    g = torch.Generator().manual_seed(seed)
    s = (torch.rand(shape, generator=g) < density).to(F64)
    if len(shape) != 2:
        fmt = "coo"
    S = _sparse(s, fmt)
    if S.nnz:
        S._storage.values[0] = 0.0
    x = (torch.randn(shape, generator=g) * 10).to(xdtype)
    m = x.sparse_mask(S)
    assert m.dtype == xdtype and m.nnz == S.nnz
    if S.nnz and len(shape) == 2 and fmt != "coo":
        assert m._storage.shares_pattern(S._storage)
    torch.testing.assert_close(m.to_dense(), torch.where(s != 0, x, torch.zeros((), dtype=xdtype)))


# --- session 17: the ops that still took the fallback ----------------------------------------

@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2)]),
       other=st.sampled_from(["sparse", "dense"]), dtype=st.sampled_from(FLOATS + [torch.int32]),
       nans=st.booleans())
def test_fmax_fmin_let_a_number_win_over_nan(data, shape, other, dtype, nans):
    x = data.draw(dense_values(shape, dtype))
    y = data.draw(dense_values(shape, dtype))
    if nans and dtype.is_floating_point and x.numel():
        x.view(-1)[0] = float("nan")
        y.view(-1)[-1] = float("nan")
    fmt = data.draw(st.sampled_from(FORMATS[len(shape)]))
    X = _sparse(x, fmt)
    Y = _sparse(y, FORMATS[len(shape)][0]) if other == "sparse" else y
    for op in (torch.fmax, torch.fmin):
        got, want = op(X, Y), op(x, y)
        assert_matches(got, want, sparse=other == "sparse")
        assert_matches(op(Y, X), op(y, x), sparse=other == "sparse")


def test_fmax_gradient_goes_to_the_first_operand_at_ties():
    a = torch.tensor([[1.0, 0.0, 2.0], [3.0, float("nan"), 0.0]], dtype=F64)
    b = torch.tensor([[1.0, 5.0, 0.0], [2.0, 4.0, -1.0]], dtype=F64)
    A, B = _sparse(a, "csr", True), _sparse(b, "coo", True)
    Da, Db = a.clone().requires_grad_(), b.clone().requires_grad_()
    w = torch.arange(1.0, 7.0, dtype=F64).reshape(2, 3)
    (torch.fmax(A, B).to_dense() * w).sum().backward()
    (torch.fmax(Da, Db) * w).sum().backward()
    grad_matches(A, Da)
    grad_matches(B, Db)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2)]),
       dtype=st.sampled_from(FLOATS))
def test_signbit_sgn_heaviside_keep_the_pattern(data, shape, dtype):
    x = data.draw(dense_values(shape, dtype)) + 0.0      # no -0.0 (S stores no zero)
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    assert_matches(torch.signbit(X), torch.signbit(x), sparse=True)
    assert_matches(torch.sgn(X), torch.sgn(x), sparse=True)
    zero = torch.zeros((), dtype=dtype)
    assert_matches(torch.heaviside(X, zero), torch.heaviside(x, zero), sparse=True)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3, 2, 2), (6,)]), per_channel=st.booleans())
def test_prelu_matches_dense_with_its_weight_gradient(data, shape, per_channel):
    x = data.draw(dense_values(shape, F64))
    channels = shape[1] if per_channel and len(shape) > 1 else 1
    w = torch.rand(channels, dtype=F64) + 0.1
    X, D = _sparse(x, FORMATS[len(shape)][0], True), x.clone().requires_grad_()
    ws, wd = w.clone().requires_grad_(), w.clone().requires_grad_()
    got, want = F.prelu(X, ws), F.prelu(D, wd)
    assert_matches(got, want.detach(), sparse=True)
    weights = torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (got.to_dense() * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(ws.grad, wd.grad)
    if X.nnz:
        grad_matches(X, D)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), rows=st.integers(1, 6), dim=st.integers(1, 4),
       index_shape=st.sampled_from([(3,), (2, 2), (0,), (1, 3, 2)]), fmt=st.sampled_from(FORMATS[2]))
def test_embedding_with_a_sparse_table_selects_rows(data, rows, dim, index_shape, fmt):
    w = data.draw(dense_values((rows, dim), F64))
    idx = torch.randint(0, rows, index_shape, generator=torch.Generator().manual_seed(rows * dim))
    W, D = _sparse(w, fmt, True), w.clone().requires_grad_()
    got, want = F.embedding(idx, W), F.embedding(idx, D)
    assert_matches(got, want.detach(), sparse=True)
    if W.nnz and idx.numel():
        g = torch.rand(want.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
        (got.to_dense() * g).sum().backward()
        (want * g).sum().backward()
        grad_matches(W, D)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), m=st.integers(0, 6), k=st.integers(1, 5), n=st.integers(1, 4),
       fmt=st.sampled_from(FORMATS[2]), beta=st.sampled_from([0.0, 1.0, 0.5]),
       alpha=st.sampled_from([1.0, 2.0]))
def test_hspmm_smm_sspaddmm_are_sparse_products(data, m, k, n, fmt, beta, alpha):
    a = data.draw(dense_values((m, k), F64))
    c = data.draw(dense_values((m, n), F64))
    b = torch.rand(k, n, dtype=F64)
    A, C = _sparse(a, fmt), _sparse(c, FORMATS[2][0])
    for op in (torch.hspmm, torch.smm):
        r = op(A, b)
        assert_matches(r, a @ b, sparse=True)
        assert r.nnz == int((a != 0).any(1).sum()) * n     # the rows with stored entries, whole
    assert_matches(torch.sspaddmm(C, A, b, beta=beta, alpha=alpha), beta * c + alpha * (a @ b), sparse=True)


@pytest.mark.parametrize("exponent", [torch.tensor(2.0), torch.tensor(3), torch.tensor(0.5, dtype=F64)])
def test_pow_by_a_zero_dim_tensor_is_pow_by_its_number(exponent):
    x = torch.tensor([[0.0, 2.0, 0.0], [1.5, 0.0, 3.0]])
    X = _sparse(x, "csr")
    assert_matches(X ** exponent, x ** exponent, sparse=True)
    assert_matches(torch.pow(X, exponent), torch.pow(x, exponent), sparse=True)


def test_hardswish_and_threshold_keep_the_pattern():
    x = torch.tensor([[0.0, -4.0, -3.0, -1.0], [2.0, 3.0, 5.0, 0.0]], dtype=F64)
    X = _sparse(x, "csr")
    assert_matches(F.hardswish(X), F.hardswish(x), sparse=True)
    for th in (0.5, -0.5, 2.5):
        assert_matches(F.threshold(X, th, 0.0), F.threshold(x, th, 0.0), sparse=True)
        assert_matches(torch.threshold(X, th, 0), torch.threshold(x, th, 0), sparse=True)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2)]),
       dtype=st.sampled_from(FLOATS + [torch.int64]), divisor=st.sampled_from(["number", "negative", "dense", "row"]),
       density=st.sampled_from(DENSITIES))
def test_fmod_remainder_and_rounded_division_keep_the_pattern(data, shape, dtype, divisor, density):
    x = data.draw(dense_values(shape, dtype, density=density))
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    if divisor == "number":
        d = 3 if dtype == torch.int64 else 0.7
    elif divisor == "negative":
        d = -2
    else:
        dshape = shape if divisor == "dense" else shape[-1:]
        d = (torch.rand(dshape, dtype=torch.float64) + 0.5).to(dtype) * (1 if dtype != torch.int64 else 3)
        d = d.clamp_min(1) if dtype == torch.int64 else d
    for op in (torch.fmod, torch.remainder, torch.floor_divide,
               lambda a, b: torch.div(a, b, rounding_mode="floor"),
               lambda a, b: torch.div(a, b, rounding_mode="trunc")):
        assert_matches(op(X, d), op(x, d), sparse=True)
    assert_matches(X % d, x % d, sparse=True)
    assert_matches(X // d, x // d, sparse=True)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (0, 3), (3,), (2, 3, 2), (1, 1)]),
       density=st.sampled_from(DENSITIES))
def test_nonzero_lists_the_stored_nonzeros_in_row_major_order(data, shape, density):
    x = data.draw(dense_values(shape, F64, density=density))
    fmt = data.draw(st.sampled_from(FORMATS[len(shape)] + (["csc", "dcsr"] if len(shape) == 2 else [])))
    X = _sparse(x, fmt)
    assert torch.equal(torch.nonzero(X), torch.nonzero(x))
    assert torch.equal(torch.argwhere(X), torch.argwhere(x))
    for a, b in zip(torch.nonzero(X, as_tuple=True), torch.nonzero(x, as_tuple=True)):
        assert torch.equal(a, b)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(1, 4), (3, 1), (1,), (2, 1, 3)]),
       lead=st.sampled_from([(), (2,)]), grow=st.integers(1, 3))
def test_expand_stores_each_entry_once_per_position(data, shape, lead, grow):
    x = data.draw(dense_values(shape, F64))
    X = _sparse(x, FORMATS[len(shape)][0])
    target = lead + tuple(grow if n == 1 else n for n in shape)
    assert_matches(X.expand(*target), x.expand(*target), sparse=True)
    assert_matches(torch.broadcast_to(X, target), torch.broadcast_to(x, target), sparse=True)
    assert_matches(X.expand(*lead, *[-1] * len(shape)), x.expand(*lead, *[-1] * len(shape)), sparse=True)
    if any(n > 1 for n in shape):    # a size other than 1 cannot grow
        with pytest.raises(RuntimeError, match="expand"):
            X.expand(*[n + 1 for n in shape])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(0, 6), power=st.integers(0, 5), fmt=st.sampled_from(["csr", "coo", "csc"]))
def test_matrix_power_is_a_chain_of_sparse_products(data, n, power, fmt):
    a = data.draw(dense_values((n, n), F64))
    A = _sparse(a, fmt)
    assert_matches(torch.linalg.matrix_power(A, power), torch.linalg.matrix_power(a, power), sparse=True)
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.matrix_power(_sparse(torch.ones(2, 3, dtype=F64), fmt), 2)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (1, 1), (5, 1)]),
       dtype=st.sampled_from(FLOATS + [torch.int64]), density=st.sampled_from(DENSITIES),
       nans=st.booleans(), ties=st.booleans())
def test_argmax_argmin_take_the_first_extreme_counting_implicit_zeros(data, shape, dtype, density, nans, ties):
    x = data.draw(dense_values(shape, dtype, density=density))
    if ties:                              # repeated extremes: the first one wins
        x = x.clamp(-1, 1) if dtype.is_floating_point else x.clamp(-2, 2)
        x = (x * 2).round() / 2 if dtype.is_floating_point else x
    if nans and dtype.is_floating_point and x.numel() > 2:
        x.view(-1)[x.numel() // 2] = float("nan")
    x = x + 0                             # no -0.0 (S stores no zero)
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))
    for op in (torch.argmax, torch.argmin):
        assert torch.equal(op(X), op(x))
        for dim in range(-1, len(shape)):
            for keepdim in (False, True):
                assert torch.equal(op(X, dim, keepdim), op(x, dim, keepdim)), (op, dim, keepdim)
    assert torch.equal(X.argmax(dim=0), x.argmax(dim=0))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (1, 1), (3, 2), (0,), (3, 0), (0, 2)]),
       dtype=st.sampled_from(FLOATS + [torch.int64]), density=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
       special=st.booleans())
def test_prod_is_zero_unless_a_fiber_is_full(data, shape, dtype, density, special):
    x = data.draw(dense_values(shape, dtype, density=density))
    if special and dtype.is_floating_point and x.numel() > 1:
        x.view(-1)[0] = float("nan")
    x = x + 0                              # no -0.0 (S stores no zero)
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[len(shape)])))

    def same(got, want, sparse):
        assert isinstance(got, scorch.SparseTensor) == sparse and got.dtype == want.dtype
        torch.testing.assert_close(dense_of(got), want, equal_nan=True)
    same(torch.prod(X), torch.prod(x), False)
    for dim in range(-1, len(shape)):
        for keepdim in (False, True):
            # an empty dim: every product is 1 (dense by nature)
            same(torch.prod(X, dim, keepdim), torch.prod(x, dim, keepdim),
                 (len(shape) > 1 or keepdim) and shape[dim] > 0)


def test_prod_gradient_matches_dense_on_the_stored_entries():
    x = torch.tensor([[1.5, 2.0, -3.0], [0.0, 4.0, 5.0], [2.0, 0.5, 0.0], [1.0, 0.0, 2.0]], dtype=F64)
    X = _sparse(x, "csr", True)
    X._storage.values.data[3] = 0.0          # a stored zero in a full fiber: row 1 is fully stored
    D = X.to_dense().detach().clone().requires_grad_()
    w = torch.arange(1.0, 5.0, dtype=F64)
    (torch.prod(X, 1).to_dense() * w).sum().backward()
    (torch.prod(D, 1) * w).sum().backward()
    grad_matches(X, D)


def test_norm_of_an_empty_sparse_tensor_stays_in_the_graph():
    """Found by a random op chain: the norm of a tensor storing nothing returned a constant,
    so backward raised where dense torch gives a zero gradient."""
    for fmt in ("csr", "coo"):
        S = _sparse(torch.zeros(2, 3, dtype=F64), fmt, True)
        for r in (S.norm(), torch.linalg.vector_norm(S, 1), torch.linalg.vector_norm(S, float("inf"))):
            assert r.requires_grad and float(r.detach()) == 0.0
            r.backward()
            assert isinstance(S.grad, scorch.SparseTensor) and S.grad.nnz == 0
            S.grad = None


def test_std_and_norm_of_a_constant_fiber_have_torch_zero_gradient():
    """torch's std and norm backwards are 0 where the deviation / norm is 0; the root's own
    would give NaN (found by a random op chain)."""
    idx = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 2, 0, 2]])
    for vals in ([2.0, 2.0, 2.0, 1.0, 3.0], [0.0, 0.0, 0.0, 1.0, 3.0]):   # constant row; stored zeros
        S = scorch.sparse_tensor((idx, torch.tensor(vals, dtype=F64)), size=(2, 3), format="csr",
                                 requires_grad=True)
        D = S.to_dense().detach().clone().requires_grad_()
        for X in (S, D):
            (X.std(1).sum() + X[:1].std() + torch.linalg.vector_norm(X, 2, dim=1).sum()
             + torch.linalg.vector_norm(X, 3, dim=0).sum()).backward()
        assert S.grad.nnz == 5 and not torch.isnan(S.grad.to_dense()).any()
        want = D.grad[tuple(idx)]
        torch.testing.assert_close(S.grad.to_dense()[tuple(idx)], want)


def test_prod_and_matrix_power_follow_the_stored_entries():
    """On a 2,000,000 x 2,000,000 matrix storing 3 entries: no array as long as a dimension
    squared (the identity of matrix_power(A, 0) from its coordinates) and prod's fibers are
    the stored ones (a dense copy would take 16 TB; the dense limit would raise)."""
    n = 2_000_000
    A = scorch.sparse_tensor((torch.tensor([[0, 5, n - 1], [1, 5, 0]]), torch.tensor([2.0, 3.0, 4.0])),
                             size=(n, n), format="csr")
    eye = torch.linalg.matrix_power(A, 0)
    assert isinstance(eye, scorch.SparseTensor) and eye.nnz == n and eye.shape == A.shape
    assert torch.equal(eye.values(), torch.ones(n))
    p = torch.prod(A, 1)
    assert isinstance(p, scorch.SparseTensor) and p.nnz == 0 and p.shape == (n,)
    B = scorch.sparse_tensor((torch.tensor([[0, 1, 0], [0, 0, 1]]), torch.tensor([2.0, 3.0, 4.0])),
                             size=(n, 2), format="coo")
    p = torch.prod(B, 1)
    assert p.nnz == 1
    assert torch.equal(p.indices(), torch.tensor([[0]])) and float(p.values()[0]) == 8.0


def test_prod_over_an_empty_dim_is_one_and_stays_in_the_graph():
    X = scorch.sparse_tensor(torch.zeros(3, 0, dtype=F64), format="coo", requires_grad=True)
    out = torch.prod(X, 1)
    assert torch.equal(dense_of(out), torch.ones(3, dtype=F64)) and out.requires_grad
    dense_of(out).sum().backward()
    assert X.grad is not None and X.grad.nnz == 0


@settings(max_examples=60, deadline=None)
@given(data=st.data(), m=st.integers(1, 5), n=st.integers(1, 7),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]),
       fmt=st.sampled_from(["csr", "csc"]), keepdim=st.booleans())
def test_arg_extreme_along_stored_rows_with_explicit_zeros_and_nans(data, m, n, dtype, fmt, keepdim):
    """argmax / argmin / max / min of CSR / CSC along either dimension, the runtime's one
    pass over each row (after a transpose of the entry numbers across the stored rows):
    stored zeros, implicit zeros, ties, NaNs, full and empty rows all as torch's dense
    result; max's values and gradient from the entry found."""
    full = data.draw(st.lists(st.booleans(), min_size=m * n, max_size=m * n))
    picks = [i for i, f in enumerate(full) if f]
    choice = [-2, -1, 0, 0, 1, 2] + ([float("nan")] if dtype.is_floating_point else [])
    vals = torch.tensor(data.draw(st.lists(st.sampled_from(choice), min_size=len(picks), max_size=len(picks))),
                        dtype=torch.float64).to(dtype)
    idx = torch.tensor([[i // n for i in picks], [i % n for i in picks]], dtype=torch.int64).reshape(2, -1)
    S = scorch.sparse_tensor((idx, vals), size=(m, n), format=fmt)   # zeros stored explicitly
    x = S.to_dense()
    dim = data.draw(st.sampled_from([0, 1, -1]))         # along the stored rows, or across
    for op in (torch.argmax, torch.argmin):
        assert torch.equal(op(S, dim, keepdim), op(x, dim, keepdim)), (op, x)
    for op in (torch.max, torch.min):
        got, want = op(S, dim, keepdim), op(x, dim, keepdim)
        assert torch.equal(got.indices, want.indices)
        assert torch.allclose(got.values.double(), want.values.double(), equal_nan=True)
    if dtype == torch.float64:
        A = scorch.sparse_tensor((idx, vals), size=(m, n), format=fmt, requires_grad=True)
        torch.max(A, dim).values.sum().backward()
        g = torch.zeros(m, n, dtype=dtype)
        wi = torch.max(x, dim).indices
        d = dim % 2
        for k in range(x.shape[1 - d]):
            r, c = (k, int(wi[k])) if d == 1 else (int(wi[k]), k)
            if any(int(idx[0, j]) == r and int(idx[1, j]) == c for j in range(idx.shape[1])):
                g[r, c] = 1                          # the gradient goes to a stored entry only
        assert torch.equal(A.grad.to_dense(), g)
