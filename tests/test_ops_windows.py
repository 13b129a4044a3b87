"""The last ops that took the dense fallback (session 19): ``unfold``, ``cartesian_prod``
(``layout_ops``), ``renorm`` and ``cross`` / ``linalg.cross`` (``slice_ops``),
``masked_scatter`` (``positions``), ``mode`` (``order_statistics``) and
``F.embedding_bag(mode="max")`` (``shape``): against dense torch over shapes (empty dims
too), densities, dtypes and formats, with the fallback an error; sparse results where torch's
result keeps the zeros; gradients on the stored values."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, assert_matches, dense_values, grad_matches

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _pair(data, shape, dtype=F64, density=None):
    x = data.draw(dense_values(shape, dtype, density=density)) + 0
    return x, scorch.sparse_tensor(x, format=data.draw(st.sampled_from(FORMATS[len(shape)])))


def _leaf(x, fmt):
    return scorch.sparse_tensor(x, format=fmt, requires_grad=True), x.clone().requires_grad_()


# --- unfold and cartesian_prod: coordinates moved --------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(7,), (4, 6), (2, 5, 3), (0, 4), (3, 1)]),
       dtype=st.sampled_from([F64, torch.int64]))
def test_unfold_puts_each_entry_in_every_window_covering_it(data, shape, dtype):
    x, X = _pair(data, shape, dtype)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[dim]
    size = data.draw(st.integers(0, n))
    step = data.draw(st.integers(1, 4))
    got = X.unfold(dim, size, step)
    assert_matches(got, x.unfold(dim, size, step), sparse=True)
    assert got.nnz <= X.nnz * -(-max(size, 1) // step)       # no entry beyond its windows


def test_unfold_refuses_what_torch_refuses():
    X = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(RuntimeError, match="maximum size for tensor at dimension 1 is 3 but size is 4"):
        X.unfold(1, 4, 1)
    with pytest.raises(RuntimeError, match="step is 0 but must be > 0"):
        X.unfold(0, 2, 0)


def test_unfold_gradient_sums_over_the_windows():
    x = torch.tensor([[0.0, 1.5, 0.0, -2.0, 3.0], [4.0, 0.0, 0.0, 1.0, 0.0]], dtype=F64)
    for fmt in ("csr", "coo", "csc"):
        S, D = _leaf(x, fmt)
        up = torch.arange(16, dtype=F64).reshape(2, 2, 4)        # two windows of 4, overlapping by 3
        (S.unfold(1, 4, 1).to_dense() * up).sum().backward()
        (D.unfold(1, 4, 1) * up).sum().backward()
        grad_matches(S, D)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       sparse_at=st.lists(st.booleans(), min_size=3, max_size=3))
def test_cartesian_prod_stores_each_entry_once_per_combination(data, sizes, sparse_at):
    if not any(sparse_at[:len(sizes)]):
        sparse_at = [True] + sparse_at[1:]
    dense = [data.draw(dense_values((n,), F64)) + 0 for n in sizes]
    given_ = [scorch.sparse_tensor(v, format="coo") if s else v for v, s in zip(dense, sparse_at)]
    got = torch.cartesian_prod(*given_)
    want = torch.cartesian_prod(*dense)
    assert_matches(got, want, sparse=len(sizes) > 1 or sparse_at[0])
    if len(sizes) > 1:
        stored = sum((v != 0).sum().item() * math.prod(sizes) // max(n, 1) if isinstance(g, scorch.SparseTensor)
                     else math.prod(sizes) for v, g, n in zip(dense, given_, sizes))
        assert got.nnz == stored


def test_cartesian_prod_gradient_and_dtype_check():
    a = torch.tensor([0.0, 2.0, -1.0], dtype=F64)
    b = torch.tensor([3.0, 0.0], dtype=F64)
    S, D = _leaf(a, "coo")
    (torch.cartesian_prod(S, b).to_dense() * torch.arange(12.0, dtype=F64).reshape(6, 2)).sum().backward()
    (torch.cartesian_prod(D, b) * torch.arange(12.0, dtype=F64).reshape(6, 2)).sum().backward()
    grad_matches(S, D)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.cartesian_prod(S, b.float())


# --- renorm and cross: per-slice ops from sparse ops ------------------------------------------

@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (2, 3, 4), (0, 3), (3, 1)]),
       p=st.sampled_from([1.0, 2.0, 3.0, math.inf]), maxnorm=st.sampled_from([0.0, 0.3, 1.0, 10.0]),
       dtype=st.sampled_from([F64, torch.float32]))
def test_renorm_scales_slices_over_the_limit(data, shape, p, maxnorm, dtype):
    x, X = _pair(data, shape, dtype)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    try:
        want = torch.renorm(x, p, dim, maxnorm)
    except RuntimeError as e:                # torch's inf norm over empty slices
        with pytest.raises(RuntimeError, match=str(e)[:30]):
            torch.renorm(X, p, dim, maxnorm)
        return
    got = torch.renorm(X, p, dim, maxnorm)
    assert_matches(got, want, sparse=True)
    assert got.nnz == X.nnz                                   # the pattern kept
    assert_matches(X.renorm(p, dim, maxnorm), x.renorm(p, dim, maxnorm), sparse=True)


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_renorm_gradient_goes_through_the_norm(fmt):
    x = torch.tensor([[0.0, 3.0, 4.0], [0.1, 0.0, 0.0], [2.0, 0.0, -2.0]], dtype=F64)
    S, D = _leaf(x, fmt)
    up = torch.arange(9.0, dtype=F64).reshape(3, 3)
    (torch.renorm(S, 2, 0, 1.0).to_dense() * up).sum().backward()
    (torch.renorm(D, 2, 0, 1.0) * up).sum().backward()
    grad_matches(S, D)
    with pytest.raises(RuntimeError, match="non-positive-norm"):
        torch.renorm(S, 0, 0, 1.0)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 3), (3, 5), (2, 3, 4), (0, 3), (2, 2, 3)]),
       kinds=st.sampled_from(["ss", "sd", "ds"]))
def test_cross_matches_dense_on_any_mix(data, shape, kinds):
    dims = [k for k, n in enumerate(shape) if n == 3]
    dim = data.draw(st.sampled_from(dims))
    x, X = _pair(data, shape)
    y, Y = _pair(data, shape)
    a = X if kinds[0] == "s" else x
    b = Y if kinds[1] == "s" else y
    want = torch.linalg.cross(x, y, dim=dim)
    assert_matches(torch.linalg.cross(a, b, dim=dim), want, sparse=True)
    assert_matches(torch.cross(a, b, dim=dim), want, sparse=True)
    assert_matches(a.cross(b, dim), want, sparse=True)


def test_cross_default_dims_broadcast_and_gradient():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, generator=g, dtype=F64) * (torch.rand(4, 3, generator=g) < 0.5)
    y = torch.randn(1, 3, generator=g, dtype=F64)
    S, D = _leaf(x, "csr")
    assert_matches(torch.linalg.cross(S, y), torch.linalg.cross(x, y), sparse=True)  # dim -1, broadcast
    assert_matches(torch.cross(S, y.expand(4, 3), dim=1), torch.cross(x, y.expand(4, 3), dim=1), sparse=True)
    up = torch.randn(4, 3, generator=g, dtype=F64)
    (torch.linalg.cross(S, y).to_dense() * up).sum().backward()
    (torch.linalg.cross(D, y) * up).sum().backward()
    grad_matches(S, D)
    with pytest.raises(RuntimeError, match="must have length 3"):
        torch.linalg.cross(S, torch.zeros(4, 2, dtype=F64))


# --- masked_scatter ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (3,), (2, 3, 4), (0, 3)]),
       mask_kind=st.sampled_from(["dense", "sparse", "broadcast"]), source_sparse=st.booleans())
def test_masked_scatter_writes_the_masked_positions_in_order(data, shape, mask_kind, source_sparse):
    x, X = _pair(data, shape)
    mask_shape = shape[1:] if mask_kind == "broadcast" and len(shape) > 1 else shape
    m = data.draw(dense_values(mask_shape, F64)) != 0
    mask = scorch.sparse_tensor(m, format="coo") if mask_kind == "sparse" else m
    source = data.draw(dense_values((max(1, math.prod(shape)) + 2,), F64))
    src = scorch.sparse_tensor(source, format="coo") if source_sparse else source
    want = x.masked_scatter(m, source)
    assert_matches(X.masked_scatter(mask, src), want, sparse=True)
    assert_matches(torch.masked_scatter(X, mask, src), want, sparse=True)
    if mask_kind == "sparse" or source_sparse:                    # dense x: dense result
        assert_matches(x.masked_scatter(mask, src), want, sparse=False)


def test_masked_scatter_gradient_and_errors():
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]], dtype=F64)
    m = torch.tensor([[True, True, False], [False, False, True]])
    src = torch.tensor([5.0, 6.0, 7.0, 8.0], dtype=F64)
    S, D = _leaf(x, "csr")
    s1, s2 = src.clone().requires_grad_(), src.clone().requires_grad_()
    up = torch.arange(6.0, dtype=F64).reshape(2, 3)
    (S.masked_scatter(m, s1).to_dense() * up).sum().backward()
    (D.masked_scatter(m, s2) * up).sum().backward()
    grad_matches(S, D)
    torch.testing.assert_close(s1.grad, s2.grad)
    with pytest.raises(RuntimeError, match="source < number of ones in mask"):
        S.masked_scatter(m, src[:2])
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        S.masked_scatter(m.to(F64), src)
    with pytest.raises(RuntimeError, match="same dtypes"):
        S.masked_scatter(m, src.float())


# --- mode -------------------------------------------------------------------------------------

@st.composite
def _with_stored_zeros(draw, shape, dtype):
    """A few-valued tensor (ties are the point) as a sparse tensor that may also store explicit
    zeros; returns (dense, sparse)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = (torch.randint(-2, 3, shape, generator=g) * (torch.rand(shape, generator=g) < 0.6)).to(dtype)
    stored = (x != 0) | (torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.3])))
    idx = stored.nonzero().t()
    fmt = draw(st.sampled_from(FORMATS[len(shape)]))
    return x, scorch.sparse_tensor((idx, x[tuple(idx)]), size=shape, format=fmt)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(6,), (4, 5), (2, 3, 4), (3, 1), (0, 4)]),
       dtype=st.sampled_from([F64, torch.float32, torch.int64]), keepdim=st.booleans())
def test_mode_is_torchs_most_frequent_value_and_its_last_index(data, shape, dtype, keepdim):
    x, X = data.draw(_with_stored_zeros(shape, dtype))
    for dim in range(-len(shape), len(shape)):
        if shape[dim] == 0:
            with pytest.raises(IndexError, match="non-zero size"):
                torch.mode(X, dim)
            continue
        got, want = torch.mode(X, dim, keepdim), torch.mode(x, dim, keepdim)
        assert_matches(got.values, want.values, sparse=False)
        assert torch.equal(got.indices, want.indices)
        assert torch.equal(X.mode(dim).indices, x.mode(dim).indices)


def test_mode_gradient_reaches_the_picked_stored_entry():
    x = torch.tensor([[0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 5.0]], dtype=F64)
    S, D = _leaf(x, "csr")
    torch.mode(S, 1).values.sum().backward()
    torch.mode(D, 1).values.sum().backward()
    grad_matches(S, D)                           # row 0: an unstored zero wins, no gradient


# --- embedding_bag max ------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(data=st.data(), rows=st.integers(1, 8), width=st.integers(1, 5), lookups=st.integers(0, 12),
       bags=st.integers(1, 4), fmt=st.sampled_from(["csr", "coo", "csc"]), padding=st.booleans())
def test_embedding_bag_max_takes_each_bags_largest_entry(data, rows, width, lookups, bags, fmt, padding):
    w = data.draw(dense_values((rows, width), F64))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    idx = torch.randint(0, rows, (lookups,), generator=g)
    offsets = torch.sort(torch.randint(0, lookups + 1, (bags,), generator=g)).values
    offsets[0] = 0
    pad = data.draw(st.integers(0, rows - 1)) if padding else None
    S, D = _leaf(w, fmt)
    got = F.embedding_bag(idx, S, offsets, mode="max", padding_idx=pad)
    want = F.embedding_bag(idx, D, offsets, mode="max", padding_idx=pad)
    assert_matches(got, want.detach(), sparse=False)
    up = torch.randn(want.shape, generator=g, dtype=F64)
    (got * up).sum().backward()
    (want * up).sum().backward()
    grad_matches(S, D)
    if lookups and lookups % bags == 0:           # 2-D input: fixed-size bags
        two_d = idx.reshape(bags, -1)
        assert_matches(F.embedding_bag(two_d, S.detach(), mode="max"), F.embedding_bag(two_d, w, mode="max"))
