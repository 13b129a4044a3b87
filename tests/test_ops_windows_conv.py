"""Convolution and pooling of a sparse input (``sparse_ops/windows.py``): ``unfold`` of each
spatial dim, then one einsum with the weight (convolution) or the window's mean / amax
(pooling). Against dense torch over ranks 1-3, batched or not, strides, zero padding,
dilation, groups and densities, with the fallback an error; gradients for the input's stored
values and the weight."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import dense_values, grad_matches

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("no_dense_fallback")
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _close(got, want):
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@st.composite
def _input(draw, n: int, channels: int):
    batched = draw(st.booleans())
    spatial = tuple(draw(st.integers(3, 6)) for _ in range(n))
    shape = ((draw(st.integers(1, 2)),) if batched else ()) + (channels,) + spatial
    x = draw(dense_values(shape, F64, density=draw(st.sampled_from([0.0, 0.2, 0.6, 1.0])))) + 0
    return x, scorch.sparse_tensor(x, format="coo")


@settings(max_examples=30, deadline=None)
@given(data=st.data(), n=st.integers(1, 2), groups=st.sampled_from([1, 2]), bias=st.booleans())
def test_convolution_is_one_einsum_over_the_unfolded_input(data, n, groups, bias):
    x, X = data.draw(_input(n, 2 * groups))
    k = tuple(data.draw(st.integers(1, 2)) for _ in range(n))
    out = 2 * groups
    w = torch.rand((out, 2) + k, dtype=F64)
    b = torch.rand(out, dtype=F64) if bias else None
    stride = data.draw(st.integers(1, 2))
    dilation = data.draw(st.integers(1, 2))
    padding = data.draw(st.sampled_from([0, 1, "valid", "same"]))
    if padding == "same":
        stride = 1
    got = CONV[n](X, w, b, stride, padding, dilation, groups)
    assert type(got) is torch.Tensor
    _close(got, CONV[n](x, w, b, stride, padding, dilation, groups))


TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), groups=st.sampled_from([1, 2]), bias=st.booleans())
def test_transposed_convolution_is_a_convolution_of_the_spread_input(data, n, groups, bias):
    """Stride, padding (past the kernel's reach too: a crop), output padding, dilation and
    groups against dense torch; a dense result."""
    x, X = data.draw(_input(n, 2 * groups))
    k = tuple(data.draw(st.integers(1, 3)) for _ in range(n))
    w = torch.rand((2 * groups, 3) + k, dtype=F64)
    b = torch.rand(3 * groups, dtype=F64) if bias else None
    stride, dilation = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    padding = data.draw(st.integers(0, 3))
    extra = data.draw(st.integers(0, max(stride, dilation) - 1))
    try:
        want = TRANSPOSED[n](x, w, b, stride, padding, extra, groups, dilation)
    except RuntimeError:          # an empty output: torch refuses, and so do we
        with pytest.raises(RuntimeError):
            TRANSPOSED[n](X, w, b, stride, padding, extra, groups, dilation)
        return
    got = TRANSPOSED[n](X, w, b, stride, padding, extra, groups, dilation)
    assert type(got) is torch.Tensor
    _close(got, want)


def test_transposed_convolution_gradients_and_module():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 4, 5, 4, generator=g, dtype=F64) * (torch.rand(2, 4, 5, 4, generator=g) < 0.3)
    w = torch.rand(4, 3, 3, 2, generator=g, dtype=F64)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    D, ws, wd = x.clone().requires_grad_(), w.clone().requires_grad_(), w.clone().requires_grad_()
    up = torch.rand(2, 6, 10, 7, generator=g, dtype=F64)
    (F.conv_transpose2d(X, ws, None, 2, 1, 1, 2) * up).sum().backward()
    (F.conv_transpose2d(D, wd, None, 2, 1, 1, 2) * up).sum().backward()
    grad_matches(X, D)
    torch.testing.assert_close(ws.grad, wd.grad)
    m = torch.nn.ConvTranspose2d(4, 2, 3, stride=2, dtype=F64)
    _close(m(scorch.sparse_tensor(x, format="coo")), m(x))
    with pytest.raises(RuntimeError, match="output padding must be smaller"):
        F.conv_transpose1d(scorch.sparse_tensor(x[0, :, :, 0], format="coo"), w[:, :, :, 0], None, 1, 0, 1)


def test_conv3d_and_gradients():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 2, 4, 4, 4, generator=g, dtype=F64) * (torch.rand(1, 2, 4, 4, 4, generator=g) < 0.3)
    w = torch.rand(3, 2, 2, 2, 2, generator=g, dtype=F64)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    D = x.clone().requires_grad_()
    ws, wd = w.clone().requires_grad_(), w.clone().requires_grad_()
    up = torch.rand(1, 3, 3, 3, 3, generator=g, dtype=F64)
    (F.conv3d(X, ws) * up).sum().backward()
    (F.conv3d(D, wd) * up).sum().backward()
    grad_matches(X, D)
    torch.testing.assert_close(ws.grad, wd.grad)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).double()          # the module calls F.conv2d
    x2 = x[0, :, 0]
    _close(conv(scorch.sparse_tensor(x2, format="coo")), conv(x2))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_pooling_keeps_a_sparse_result(data, n):
    x, X = data.draw(_input(n, 2))
    k = data.draw(st.integers(1, 3))
    stride = data.draw(st.one_of(st.none(), st.integers(1, 2)))
    pad = data.draw(st.integers(0, k // 2))
    got = AVG[n](X, k, stride, pad)
    assert isinstance(got, scorch.SparseTensor)
    _close(got, AVG[n](x, k, stride, pad))
    dilation = data.draw(st.integers(1, 2))
    if (k - 1) * dilation + 1 <= min(x.shape[-n:]):
        got = MAX[n](X, k, stride, 0, dilation)
        assert isinstance(got, scorch.SparseTensor)
        _close(got, MAX[n](x, k, stride, 0, dilation))
    sizes = tuple(s for s in x.shape[-n:])
    _close(getattr(F, f"adaptive_avg_pool{n}d")(X, sizes), getattr(F, f"adaptive_avg_pool{n}d")(x, sizes))
    _close(getattr(F, f"adaptive_max_pool{n}d")(X, 1), getattr(F, f"adaptive_max_pool{n}d")(x, 1))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), negative=st.booleans())
def test_pooling_with_padding_and_ceil_mode_counts_what_torch_counts(data, n, negative):
    """Max pooling's padding is no entry (a window of negative entries next to the padding
    keeps its negative max), average pooling divides by the positions torch counts
    (``count_include_pad``; ``ceil_mode``'s last window clipped), dilation for max."""
    x, X = data.draw(_input(n, 2))
    if negative:
        x = -x.abs()
        X = scorch.sparse_tensor(x, format="coo")
    k = data.draw(st.integers(1, 3))
    stride = data.draw(st.one_of(st.none(), st.integers(1, 3)))
    pad = data.draw(st.integers(0, k // 2))
    ceil, include = data.draw(st.booleans()), data.draw(st.booleans())
    dilation = data.draw(st.integers(1, 2))
    if (k - 1) * dilation + 1 <= min(x.shape[-n:]) + 2 * pad:
        _close(MAX[n](X, k, stride, pad, dilation, ceil_mode=ceil), MAX[n](x, k, stride, pad, dilation, ceil_mode=ceil))
    got = AVG[n](X, k, stride, pad, ceil_mode=ceil, count_include_pad=include)
    assert isinstance(got, scorch.SparseTensor)
    _close(got, AVG[n](x, k, stride, pad, ceil_mode=ceil, count_include_pad=include))


def test_padded_max_pooling_gradient_counts_only_real_ties():
    """The last window of the second row holds -1, -1 and the padding: its max is -1 (the
    padding is no zero), and the backward splits each window's gradient among its tied
    maxima (as amax does), never onto the padding."""
    x = torch.tensor([[[-1.0, 0.0, -2.0, -3.0, 0.0], [2.0, 2.0, 0.0, -1.0, -1.0]]], dtype=F64)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    got = F.max_pool1d(X, 3, 2, 1, ceil_mode=True)
    _close(got, F.max_pool1d(x, 3, 2, 1, ceil_mode=True))
    assert got[0, 1, 2] == -1.0
    up = torch.arange(1.0, 7.0, dtype=F64).reshape(1, 2, 3)
    (got.to_dense() * up).sum().backward()
    # row 0: every window's max is an implicit zero (no stored entry gets a share); row 1:
    # windows (pad, 2, 2) -> 4 split in two, (2, 0, -1) -> 5, (-1, -1, pad) -> 6 split in two
    want = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 7.0, 0.0, 3.0, 3.0]]], dtype=F64)
    torch.testing.assert_close(X.grad.to_dense(), want)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 3))
def test_adaptive_pooling_with_uneven_windows(data, n):
    """Output sizes that do not divide the input (torch's overlapping windows, larger than
    the input too): each entry in every window covering it, the mean over each window's
    size, the max over its stored entries and implicit zeros; gradients at the stored
    entries as dense torch's (continuous values: no ties)."""
    x, _ = data.draw(_input(n, 2))
    outs = tuple(data.draw(st.integers(1, 8)) for _ in range(n))
    avg, mx = getattr(F, f"adaptive_avg_pool{n}d"), getattr(F, f"adaptive_max_pool{n}d")
    up = torch.rand(avg(x, outs).shape, dtype=F64)
    for fn in (avg, mx):
        X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
        D = x.clone().requires_grad_()
        got = fn(X, outs)
        assert isinstance(got, scorch.SparseTensor)
        _close(got, fn(x, outs))
        if X.nnz:
            (got.to_dense() * up).sum().backward()
            (fn(D, outs) * up).sum().backward()
            grad_matches(X, D)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["linear", "bilinear", "bicubic", "trilinear", "nearest",
                                             "nearest-exact", "area"]),
       by_size=st.booleans(), align=st.booleans(), dtype=st.sampled_from([torch.float32, F64]))
def test_interpolation_is_one_product_per_axis(data, mode, by_size, align, dtype):
    """Every mode torch has (anti-aliased bilinear and bicubic too), by size or by any scale
    factor, larger or smaller: a sparse result equal to dense torch's, gradients at the
    stored entries."""
    n = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}.get(mode) or data.draw(st.integers(1, 3))
    x, _ = data.draw(_input(n, 2))
    x = (x if x.dim() == n + 2 else x[None]).to(dtype)
    kw = ({"size": tuple(data.draw(st.integers(1, 8)) for _ in range(n))} if by_size else
          {"scale_factor": tuple(data.draw(st.integers(2, 7)) / 2 for _ in range(n))})
    if mode in ("linear", "bilinear", "bicubic", "trilinear"):
        kw["align_corners"] = align
    if mode in ("bilinear", "bicubic") and data.draw(st.booleans()):
        kw["antialias"] = True
    want = F.interpolate(x, mode=mode, **kw)
    if kw.get("antialias") and 1 in want.shape[2:]:
        return      # torch's anti-aliased output 1 wide is not separable per axis: the fallback's
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    got = F.interpolate(X, mode=mode, **kw)
    assert isinstance(got, scorch.SparseTensor)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.to_dense(), want, rtol=tol, atol=tol)
    # (torch's anti-aliased backward by scale_factor is not its forward's transpose)
    if X.nnz and want.numel() and not (kw.get("antialias") and not by_size):
        D = x.clone().requires_grad_()
        up = torch.rand(want.shape, dtype=dtype)
        (got.to_dense() * up).sum().backward()
        (F.interpolate(D, mode=mode, **kw) * up).sum().backward()
        torch.testing.assert_close(X.grad.to_dense(), D.grad * (x != 0), rtol=tol, atol=tol)


@pytest.mark.parametrize("packet", ["_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"])
def test_aten_antialiased_upsampling_by_size_and_by_scales(packet):
    """aten's ops themselves (``.vec`` by scale factors decomposes to ``.default`` with the
    size and the scales): the same sparse interpolation as ``F.interpolate``."""
    op = getattr(torch.ops.aten, packet)
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2, 3, 10, 20, dtype=F64, generator=g) * (torch.rand(2, 3, 10, 20, generator=g) < 0.4)
    X = scorch.sparse_tensor(x, format="coo")
    for kw in ({"output_size": [3, 7], "align_corners": False, "scale_factors": None},
               {"output_size": None, "align_corners": True, "scale_factors": [1.7, 0.9]},
               {"output_size": [4, 5], "align_corners": False}):
        got = op(X, **kw)
        assert isinstance(got, scorch.SparseTensor)
        torch.testing.assert_close(got.to_dense(), op(x, **kw))


def test_antialiased_downscaling_past_the_probe_budget_takes_torchs_kernel():
    """Downscaling 8192 -> 8 probes ~2 x 1024 combs of the axis (past ``AA_PROBE_MAX``):
    torch's own kernel through the fallback, said so."""
    from scorch.sparse_ops import windows
    g = torch.Generator().manual_seed(6)
    x = torch.rand(1, 1, 4, 8192, dtype=F64, generator=g) * (torch.rand(1, 1, 4, 8192, generator=g) < 0.01)
    scorch._dispatch._warned.discard("_upsample_bilinear2d_aa")
    assert not windows._antialias_runs((4, 8192), (4, 8), None, "bilinear", False, None)
    with pytest.warns(UserWarning, match="no sparse kernel"):
        got = F.interpolate(scorch.sparse_tensor(x, format="coo"), size=(4, 8), mode="bilinear", antialias=True)
    torch.testing.assert_close(got, F.interpolate(x, size=(4, 8), mode="bilinear", antialias=True))
    assert windows._antialias_runs((4, 512), (4, 8), None, "bilinear", False, None)


def test_pooling_gradients_and_modules():
    x = torch.tensor([[[0.0, 2.0, -1.0, 0.0], [3.0, 0.0, 0.0, -4.0], [0.0, 0.0, 5.0, 1.0]]], dtype=F64)
    X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
    D = x.clone().requires_grad_()
    up = torch.arange(1.0, 13.0, dtype=F64).reshape(1, 3, 4)[..., :2]
    ((F.avg_pool1d(X, 2).to_dense() + F.max_pool1d(X, 2).to_dense()) * up).sum().backward()
    ((F.avg_pool1d(D, 2) + F.max_pool1d(D, 2)) * up).sum().backward()
    grad_matches(X, D)
    _close(torch.nn.MaxPool2d(2)(scorch.sparse_tensor(x, format="coo")), torch.nn.MaxPool2d(2)(x))
    _close(torch.nn.AvgPool2d(2, 1)(scorch.sparse_tensor(x, format="coo")), torch.nn.AvgPool2d(2, 1)(x))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), by_size=st.booleans())
def test_nearest_upsampling_by_whole_factors_repeats_entries(data, n, by_size):
    x, X = data.draw(_input(n, 2))
    if x.dim() == n + 1:
        x, X = x[None], X.unsqueeze(0)
    factors = tuple(data.draw(st.integers(1, 3)) for _ in range(n))
    kw = {"size": tuple(s * f for s, f in zip(x.shape[2:], factors))} if by_size else {"scale_factor": factors}
    got = F.interpolate(X, **kw)
    assert isinstance(got, scorch.SparseTensor) and got.nnz == X.nnz * 1 * torch.tensor(factors).prod()
    _close(got, F.interpolate(x, **kw))
