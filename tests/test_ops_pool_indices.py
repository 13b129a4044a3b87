"""Max pooling's indices, unpooling and aten's max-pooling backward on sparse inputs
(``sparse_ops/pool_indices.py``), against dense torch: the indices must be torch's own (the
first position holding a window's max in scan order, the last NaN, an implicit zero where
the max is 0), over ranks 1-3, batched or not, padding, ``ceil_mode``, dilation, ties and
densities from empty to full; the fallback is an error."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import dense_values, grad_matches

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("no_dense_fallback")
MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
ADAPTIVE = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
UNPOOL = {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}


@st.composite
def _input(draw, n: int):
    batched = draw(st.booleans())
    spatial = tuple(draw(st.integers(2, 6)) for _ in range(n))
    shape = ((draw(st.integers(1, 2)),) if batched else ()) + (2,) + spatial
    x = draw(dense_values(shape, F64, density=draw(st.sampled_from([0.0, 0.2, 0.6, 1.0])))) + 0
    kind = draw(st.sampled_from(["any", "negative", "ties"]))
    if kind == "negative":      # a window's max is its implicit zero, or a negative next to padding
        x = -x.abs()
    elif kind == "ties":        # equal stored values, stored zeros beside implicit ones
        x = x.round()
    return x


def _pair(got, want):
    (gv, gi), (wv, wi) = got, want
    assert isinstance(gv, scorch.SparseTensor) and type(gi) is torch.Tensor
    torch.testing.assert_close(gv.to_dense(), wv, rtol=0, atol=0)
    assert gi.dtype == torch.int64 and torch.equal(gi, wi)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_max_pooling_indices_are_torchs(data, n):
    x = data.draw(_input(n))
    k = data.draw(st.integers(1, 3))
    stride = data.draw(st.one_of(st.none(), st.integers(1, 3)))
    pad = data.draw(st.integers(0, k // 2))
    dilation, ceil = data.draw(st.integers(1, 2)), data.draw(st.booleans())
    if (k - 1) * dilation + 1 > min(x.shape[-n:]) + 2 * pad:
        return
    X = scorch.sparse_tensor(x, format="coo")
    _pair(MAX[n](X, k, stride, pad, dilation, ceil, return_indices=True),
          MAX[n](x, k, stride, pad, dilation, ceil, return_indices=True))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_adaptive_max_pooling_indices_are_torchs(data, n):
    x = data.draw(_input(n))
    outs = tuple(data.draw(st.integers(1, 7)) for _ in range(n))
    _pair(ADAPTIVE[n](scorch.sparse_tensor(x, format="coo"), outs, return_indices=True),
          ADAPTIVE[n](x, outs, return_indices=True))


def test_nan_and_implicit_zero_picks():
    """Windows of 4: (NaN, 1, _, NaN) -> the last NaN; (_, -1, 0, _) with a stored zero after
    an implicit one -> the implicit one; (0, -2, _, _) stored zero first -> it; (_, -2, _, 5)
    -> 5's position (``_``: not stored)."""
    nan = float("nan")
    coords = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 0, 0],
                           [0, 0, 0, 1, 1, 2, 2, 3, 3],
                           [0, 1, 3, 1, 2, 0, 1, 1, 3]])
    values = torch.tensor([nan, 1.0, nan, -1.0, 0.0, 0.0, -2.0, -2.0, 5.0], dtype=F64)
    X = scorch.sparse_tensor((coords, values), size=(1, 4, 4), format="coo")
    assert X.nnz == 9
    _, got = F.max_pool1d(X, 4, return_indices=True)
    _, want = F.max_pool1d(X.to_dense(), 4, return_indices=True)
    assert got.flatten().tolist() == want.flatten().tolist() == [3, 0, 0, 3]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_unpooling_writes_entries_at_their_indices(data, n):
    """Any indices, repeated ones too: torch writes every position in order, so a later zero
    overwrites an earlier stored entry at the same index."""
    x = data.draw(_input(n))
    k = data.draw(st.integers(1, 3))
    sizes = tuple(s * k for s in x.shape[-n:])
    plane = 1
    for s in sizes:
        plane *= s
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    idx = torch.randint(0, data.draw(st.sampled_from([4, plane])), x.shape, generator=g).clamp(max=plane - 1)
    X = scorch.sparse_tensor(x, format="coo")
    got = UNPOOL[n](X, idx, k, output_size=sizes)
    assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got.to_dense(), UNPOOL[n](x, idx, k, output_size=sizes), rtol=0, atol=0)


def test_pool_then_unpool_modules_and_gradients():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 7, dtype=F64, generator=g) * (torch.rand(2, 6, 7, generator=g) < 0.4)
    pool, unpool = torch.nn.MaxPool2d(2, return_indices=True), torch.nn.MaxUnpool2d(2)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    D = x.clone().requires_grad_()
    got, want = unpool(*pool(X), output_size=x.shape[-2:]), unpool(*pool(D), output_size=x.shape[-2:])
    assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got.to_dense(), want)
    up = torch.rand(want.shape, dtype=F64, generator=g)
    (got.to_dense() * up).sum().backward()
    (want * up).sum().backward()
    grad_matches(X, D)


def test_an_overwritten_entry_still_gets_the_gradient_at_its_index():
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], dtype=F64)
    idx = torch.tensor([[[0, 0, 1, 1]]])           # 1 overwrites 0 there; 4 overwrites 3
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    D = x.clone().requires_grad_()
    up = torch.tensor([[[5.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]], dtype=F64)
    (F.max_unpool1d(X, idx, 2).to_dense() * up).sum().backward()
    (F.max_unpool1d(D, idx, 2) * up).sum().backward()
    assert X.grad.to_dense().flatten().tolist() == D.grad.flatten().tolist() == [5.0, 5.0, 7.0, 7.0]


def test_unpooling_refuses_what_torch_refuses():
    x = torch.tensor([[[1.0, 0.0, 2.0]]])
    X = scorch.sparse_tensor(x, format="coo")
    with pytest.raises(RuntimeError, match="invalid max index: 9"):
        F.max_unpool1d(X, torch.tensor([[[0, 9, 1]]]), 2)      # an index past the output (6)
    with pytest.raises(RuntimeError, match="shape of indices"):
        F.max_unpool1d(X, torch.tensor([[[0, 1]]]), 2)
    with pytest.raises(RuntimeError, match="int64"):
        F.max_unpool1d(X, torch.tensor([[[0, 1, 2]]], dtype=torch.int32), 2)


@pytest.mark.parametrize("sparse_grad", [True, False])
def test_aten_max_pool_backward_adds_the_gradient_at_the_indices(sparse_grad):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 5, 6, dtype=F64, generator=g) * (torch.rand(1, 2, 5, 6, generator=g) < 0.5)
    _, idx = F.max_pool2d(x, 3, 1, 1, return_indices=True)       # overlapping windows: repeats
    grad = torch.randn(idx.shape, dtype=F64, generator=g) * (torch.rand(idx.shape, generator=g) < 0.6)
    op = torch.ops.aten.max_pool2d_with_indices_backward.default
    want = op(grad, x, [3, 3], [1, 1], [1, 1], [1, 1], False, idx)
    G = scorch.sparse_tensor(grad, format="coo") if sparse_grad else grad
    got = op(G, scorch.sparse_tensor(x, format="coo"), [3, 3], [1, 1], [1, 1], [1, 1], False, idx)
    assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got.to_dense(), want)
