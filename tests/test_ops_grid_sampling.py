"""``F.grid_sample`` of a sparse input (``sparse_ops/grid_sampling.py``): one sparse product
with the grid's sampling matrix, against dense torch over 4-D and 5-D inputs, bilinear and
nearest, every padding mode, ``align_corners``, grids reaching past the input, densities
from empty to full; gradients at the stored entries; the fallback is an error except where
it is the documented path (bicubic, a grid that requires grad)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import dense_values

F64 = torch.float64


@pytest.mark.usefixtures("no_dense_fallback")
@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(2, 3), mode=st.sampled_from(["bilinear", "nearest"]),
       padding=st.sampled_from(["zeros", "border", "reflection"]), align=st.booleans(),
       density=st.sampled_from([0.0, 0.3, 1.0]))
def test_grid_sample_is_one_product_with_the_sampling_matrix(data, n, mode, padding, align, density):
    shape = (data.draw(st.integers(1, 2)), 2) + tuple(data.draw(st.integers(1, 5)) for _ in range(n))
    x = data.draw(dense_values(shape, F64, density=density)) + 0
    out = tuple(data.draw(st.integers(1, 4)) for _ in range(n))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    grid = torch.rand((shape[0],) + out + (n,), dtype=F64, generator=g) * 2.8 - 1.4
    if data.draw(st.booleans()):
        grid = grid.round(decimals=1)          # points on the input's grid lines and halves
    want = F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    got = F.grid_sample(X, grid, mode=mode, padding_mode=padding, align_corners=align)
    assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got.to_dense(), want, rtol=1e-9, atol=1e-12)
    if X.nnz:
        D = x.clone().requires_grad_()
        up = torch.rand(want.shape, dtype=F64, generator=g)
        (got.to_dense() * up).sum().backward()
        (F.grid_sample(D, grid, mode=mode, padding_mode=padding, align_corners=align) * up).sum().backward()
        torch.testing.assert_close(X.grad.to_dense(), D.grad * (x != 0))


def test_grid_sampler_aten_names_and_the_fallback_cases():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 2, 4, 5, dtype=F64, generator=g) * (torch.rand(1, 2, 4, 5, generator=g) < 0.5)
    grid = torch.rand(1, 3, 3, 2, dtype=F64, generator=g) * 2 - 1
    X = scorch.sparse_tensor(x, format="coo")
    for fn in (torch.grid_sampler, torch.grid_sampler_2d):
        got = fn(X, grid, 0, 2, True)
        assert isinstance(got, scorch.SparseTensor)
        torch.testing.assert_close(got.to_dense(), fn(x, grid, 0, 2, True))
    empty = torch.zeros(1, 0, 3, 2, dtype=F64)                # an empty output
    got = F.grid_sample(X, empty, align_corners=False)
    assert isinstance(got, scorch.SparseTensor) and got.shape == (1, 2, 0, 3)
    scorch._dispatch._warned.discard("grid_sampler_2d")
    with pytest.warns(UserWarning, match="no sparse kernel"):     # bicubic: the dense fallback
        got = F.grid_sample(X, grid, mode="bicubic", align_corners=False)
    torch.testing.assert_close(got, F.grid_sample(x, grid, mode="bicubic", align_corners=False))
    scorch._dispatch._warned.discard("grid_sample")
    # a learned grid (a spatial transformer): both gradients, as dense torch's
    S = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    learned, D, xd = grid.clone().requires_grad_(), grid.clone().requires_grad_(), x.clone().requires_grad_()
    with pytest.warns(UserWarning, match="dense copy"):
        (F.grid_sample(S, learned, align_corners=False) ** 2).sum().backward()
    (F.grid_sample(xd, D, align_corners=False) ** 2).sum().backward()
    torch.testing.assert_close(learned.grad, D.grad)
    torch.testing.assert_close(S.grad.to_dense(), xd.grad * (x != 0))
