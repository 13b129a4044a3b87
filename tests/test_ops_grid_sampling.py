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


def _reference_corners(grid, sizes, mode, padding, align):
    """The corners as torch ops with GridSampler.h's formulas, in the grid's dtype: (key,
    point, weight) of the corners inside the input, in (batch, point, corner) order."""
    n = len(sizes)
    batch, points = grid.shape[0], grid[0, ..., 0].numel()
    g = grid.reshape(batch, points, n)
    src = []
    for d in range(n):
        size, c = sizes[d], g[..., n - 1 - d]
        x = (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2
        if padding == 2:
            lo2, hi2 = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
            if lo2 == hi2:
                x = torch.zeros_like(x)
            else:
                low, span = lo2 / 2, (hi2 - lo2) / 2
                x = (x - low).abs()
                extra, flips = torch.fmod(x, span), torch.floor(x / span)
                x = torch.where(flips % 2 == 0, extra + low, span - extra + low)
        if padding in (1, 2):
            # a NaN source (a NaN coordinate, or an infinite one reflected) reads index 0,
            # as torch's CPU kernel does
            x = torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf")).clamp(0, size - 1)
        src.append(x)
    picks = 2 ** n if mode == 0 else 1
    q = torch.zeros((batch, points, picks), dtype=torch.int64)
    w = torch.ones((batch, points, picks), dtype=grid.dtype)
    inside = torch.ones((batch, points, picks), dtype=torch.bool)
    for d in range(n):
        s = src[d]
        lo = torch.floor(s) if mode == 0 else torch.round(s)
        upper = [(k >> (n - 1 - d)) & 1 if mode == 0 else 0 for k in range(picks)]
        at = torch.stack([lo + 1 if u else lo for u in upper], -1)
        wt = torch.stack([(s - lo) if u else (lo + 1 - s) for u in upper], -1) if mode == 0 \
            else torch.ones_like(at)
        inside &= (at >= 0) & (at <= sizes[d] - 1)
        q = q * sizes[d] + torch.nan_to_num(at, nan=-1.0).clamp(-1, sizes[d]).to(torch.int64)
        w = w * wt
    keep = inside.reshape(-1)
    point = torch.arange(points).repeat_interleave(picks).repeat(batch)
    key = torch.arange(batch).repeat_interleave(points * picks) * int(torch.tensor(sizes).prod()) + q.reshape(-1)
    return key[keep], point[keep], w.reshape(-1)[keep]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("n", [2, 3])
def test_runtime_corners_are_torch_formulas_bit_for_bit(dtype, n):
    """The runtime's one-pass corners (``_runtime.sampling``) equal the formulas written as
    torch ops, bit for bit, in float32 too (no double rounding in between): grids past the
    input, NaN, exact halves and corners, every mode, padding and ``align_corners``."""
    from scorch._runtime import sampling
    sizes = (5, 7) if n == 2 else (3, 4, 5)
    gen = torch.Generator().manual_seed(n)
    for trial in range(6):
        grid = torch.rand((2,) + (6, 5, 3)[:n] + (n,), dtype=dtype, generator=gen) * 3 - 1.5
        if trial % 3 == 0:
            grid.view(-1)[::7] = float("nan")
        if trial % 3 == 1:
            grid = torch.round(grid * 4) / 4
        for mode in (0, 1):
            for padding in (0, 1, 2):
                for align in (False, True):
                    got = sampling.sampling_corners(grid, sizes, mode, padding, align)
                    want = _reference_corners(grid, sizes, mode, padding, align)
                    for a, b in zip(got, want):
                        assert torch.equal(a, b), (trial, mode, padding, align)
