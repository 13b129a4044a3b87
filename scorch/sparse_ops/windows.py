"""Windowed ops on a sparse input, through ``unfold``: each spatial dim becomes (window, offset
in the window) by moving coordinates (every stored entry lands in each window that covers it),
then the window's reduction is a sparse op:

- ``F.conv1d`` / ``conv2d`` / ``conv3d`` (stride, zero padding or ``"same"``/``"valid"``,
  dilation, groups, bias): ONE einsum of the unfolded input with the dense weight
  (``"bgcHWij,gocij->bgoHW"``): a gather-scatter convolution whose cost follows the stored
  entries times the kernel size, with a dense result (every output channel of a touched
  window);
- ``F.avg_pool1d/2d/3d`` and ``F.max_pool1d/2d/3d`` (padding, ``ceil_mode``, max pooling's
  dilation, indices): the window's mean / ``amax`` over the offset dims, the implicit
  zeros counted. Max pooling's padding is no entry of a window (torch pads with -inf): each
  window's positions in the input are counted from its coordinates, and the stored-max kernel
  adds the zero only where the window holds an implicit one. Average pooling divides by the
  positions torch counts (``count_include_pad``, ``ceil_mode``'s clipped last window).
  ``adaptive_*`` pools whose output divides the input are these pools, the others move each
  entry into every one of torch's overlapping windows covering it (``adaptive_windows``);
- ``F.conv_transpose1d/2d/3d``: the convolution of the input spread by the stride (its
  coordinates scaled), padded, with the weight's channels swapped and taps flipped;
- ``F.interpolate(mode="nearest")`` by whole factors: each spatial dim's entries repeated in
  place (``repeat_interleave``), a sparse result; every other mode and factor (not
  anti-aliased): one einsum per axis with its sparse weight matrix (``interpolate``).

Max pooling's indices are ``pool_indices``'; anti-aliased interpolation takes the dense fallback.
Everything is differentiable through ``unfold`` (values gathered) and the einsum."""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .._dispatch import dense_fallback, register, register_aten
from ..tensor_type import SparseTensor
from . import layout_ops, nonlinear
from . import shape as _shape
from ..gradients.values import from_values, grad_values, mark_gradient, values_of
from ..gradients.functions import needs_graph
from ..gradients.pattern import with_pattern_values
from .einsum import einsum
from .nonlinear import _sparse
from .pool_indices import adaptive_tables, linear_keys, max_indices, max_unpool, pool_tables

__all__ = ["convolution", "pool"]

_LETTERS = "HWDXYZ"
_OFFSETS = "ijklmn"


def _tuple(v, n: int, name: str) -> Tuple[int, ...]:
    if isinstance(v, numbers.Integral):
        return (int(v),) * n
    v = tuple(int(a) for a in v)
    if len(v) == 1:
        return v * n
    if len(v) != n:
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values, got {list(v)}")
    return v


def _windows(t: SparseTensor, first: int, kernel: Sequence[int], stride: Sequence[int],
             dilation: Sequence[int]) -> SparseTensor:
    """``t`` with spatial dims ``first, first+1, ...`` unfolded: each into (window position)
    and a trailing (offset in the window) dim, ``dilation`` apart."""
    for k, (size, step, dil) in enumerate(zip(kernel, stride, dilation)):
        span = (size - 1) * dil + 1
        t = layout_ops.unfold(t, first + k, span, step)
        if dil > 1:
            t = t[(slice(None),) * (t.dim() - 1) + (slice(None, None, dil),)]
    return t


def _padded(t: SparseTensor, padding: Sequence[Tuple[int, int]]) -> SparseTensor:
    pads: List[int] = []
    for before, after in reversed(padding):
        pads += [before, after]
    return layout_ops.pad_with_zeros(t, pads) if any(pads) else t


def _conv_setup(x: SparseTensor, weight: torch.Tensor, stride, dilation):
    """(spatial dims, whether ``x`` came batched, ``x`` batched, kernel, stride, dilation)."""
    n = weight.dim() - 2
    batched = x.dim() == n + 2
    return (n, batched, x if batched else x.unsqueeze(0), tuple(weight.shape[2:]),
            _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation"))


def convolution(x: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride, padding,
                dilation, groups: int) -> torch.Tensor:
    """``F.conv{n}d`` of a sparse input (batched or not) with a dense weight."""
    n, batched, x, kernel, stride, dilation = _conv_setup(x, weight, stride, dilation)
    if isinstance(padding, str):
        if padding == "valid":
            pad = [(0, 0)] * n
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pad = [(t // 2, t - t // 2) for t in total]
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}'")
    else:
        pad = [(p, p) for p in _tuple(padding, n, "padding")]
    b, c = x.shape[0], x.shape[1]
    o = weight.shape[0]
    if c != weight.shape[1] * groups or o % groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input"
                           f"{list(x.shape)} to have {weight.shape[1] * groups} channels, but got {c} channels instead")
    u = _windows(_padded(x, [(0, 0), (0, 0)] + pad), 2, kernel, stride, dilation)
    out_sizes = list(u.shape[2:2 + n])
    u = u.reshape(b, groups, c // groups, *u.shape[2:])
    w = weight.reshape(groups, o // groups, c // groups, *kernel)
    sp, off = _LETTERS[:n], _OFFSETS[:n]
    y = einsum(f"bgc{sp}{off},gpc{off}->bgp{sp}", u, w)
    y = y.to_dense() if isinstance(y, SparseTensor) else y
    y = y.reshape(b, o, *out_sizes)
    if bias is not None:
        y = y + bias.reshape(1, o, *([1] * n))
    return y if batched else y.squeeze(0)


def _torch_checks(fn, x: SparseTensor, *args, **kwargs) -> None:
    """Torch's own argument checks for ``fn(x, ...)`` (kernel sizes, strides, paddings,
    dilations, output sizes; its messages), run on a meta tensor of ``x``'s shape: nothing
    is computed or allocated."""
    try:
        fn(torch.empty(tuple(x.shape), dtype=x.dtype, device="meta"), *args, **kwargs)
    except NotImplementedError:
        pass        # no meta kernel: the op's own checks only


def _check_conv(stride, padding, dilation) -> None:
    """What torch's convolution checks (its meta kernel does not)."""
    def values(v):
        return [v] if isinstance(v, numbers.Integral) else list(v)
    if not isinstance(padding, str) and any(p < 0 for p in values(padding)):
        raise RuntimeError("negative padding is not supported")
    if any(s <= 0 for s in values(stride)):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in values(dilation)):
        raise RuntimeError(f"dilation should be greater than zero, but got {values(dilation)}")


def _conv(n: int):
    def handler(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        x = _sparse(input)
        if (x is None or isinstance(weight, SparseTensor) or isinstance(bias, SparseTensor)
                or weight.dim() != n + 2 or x.dim() not in (n + 1, n + 2) or not x.dtype.is_floating_point):
            return NotImplemented
        _check_conv(stride, padding, dilation)
        return convolution(x, weight, bias, stride, padding, dilation, int(groups))
    return handler


register(F.conv1d)(_conv(1))
register(F.conv2d)(_conv(2))
register(F.conv3d)(_conv(3))


def _dilated(x: SparseTensor, first: int, stride: Sequence[int]) -> SparseTensor:
    """``x`` with ``stride - 1`` zeros between neighbours along each spatial dim from
    ``first``: the stored coordinates scaled, nothing else moves."""
    if all(s == 1 for s in stride):
        return x
    coords = layout_ops._coords(x).clone()
    shape = list(x.shape)
    for k, step in enumerate(stride):
        coords[first + k] *= step
        shape[first + k] = max(0, (shape[first + k] - 1) * step + 1)
    return _shape._build(coords, values_of(x), shape)


def transposed_convolution(x: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride,
                           padding, output_padding, groups: int, dilation) -> torch.Tensor:
    """``F.conv_transpose{n}d`` of a sparse input: the convolution of the input with
    ``stride - 1`` zeros between its entries (coordinates scaled), padded by
    ``dilation * (k - 1) - padding`` (``output_padding`` more after), with the weight's in and
    out channels swapped per group and its taps flipped. Every step moves coordinates; the
    one einsum of ``convolution`` does the arithmetic."""
    n, batched, x, kernel, stride, dilation = _conv_setup(x, weight, stride, dilation)
    padding, extra = _tuple(padding, n, "padding"), _tuple(output_padding, n, "output_padding")
    c = x.shape[1]
    if c != weight.shape[0] or c % groups:
        raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input"
                           f"{list(x.shape)} to have {weight.shape[0]} channels, but got {c} channels instead")
    for e, s_, d in zip(extra, stride, dilation):
        if e >= max(s_, d):
            raise RuntimeError("output padding must be smaller than either stride or dilation, "
                               f"but got output_padding={list(extra)}, stride={list(stride)}, dilation={list(dilation)}")
    u = _dilated(x, 2, stride)
    pads = [(d * (k - 1) - p, d * (k - 1) - p + e) for k, p, e, d in zip(kernel, padding, extra, dilation)]
    u = _padded(u, [(0, 0), (0, 0)] + pads)
    g = int(groups)
    w = weight.reshape(g, c // g, weight.shape[1], *kernel).transpose(1, 2)
    w = w.reshape(g * weight.shape[1], c // g, *kernel).flip(tuple(range(2, 2 + n)))
    y = convolution(u, w, bias, 1, 0, dilation, g)
    return y if batched else y.squeeze(0)


def _conv_transpose(n: int):
    def handler(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        x = _sparse(input)
        if (x is None or isinstance(weight, SparseTensor) or isinstance(bias, SparseTensor)
                or weight.dim() != n + 2 or x.dim() not in (n + 1, n + 2) or not x.dtype.is_floating_point
                or isinstance(padding, str)):
            return NotImplemented
        return transposed_convolution(x, weight, bias, stride, padding, output_padding, int(groups), dilation)
    return handler


register(F.conv_transpose1d)(_conv_transpose(1))
register(F.conv_transpose2d)(_conv_transpose(2))
register(F.conv_transpose3d)(_conv_transpose(3))


def _out_size(size: int, k: int, step: int, pad: int, dil: int, ceil_mode: bool) -> int:
    """torch's pooling output size (``pooling_output_shape``: rounded toward -inf): the last
    window may hang past the end in ``ceil_mode`` but must start inside the input or its
    left padding."""
    num = size + 2 * pad - dil * (k - 1) - 1 + (step - 1 if ceil_mode else 0)
    out = num // step + 1
    if ceil_mode and (out - 1) * step >= size + pad:
        out -= 1
    if out <= 0:
        raise RuntimeError(f"Given input size {size} with padding {pad}, kernel size {k} and dilation "
                           f"{dil}: the computed output size {out} is too small")
    return out


def _window_counts(sizes, kernel, stride, padding, dilation, outs, margin: bool) -> List[torch.Tensor]:
    """How many positions of each window lie in the input (``margin``: or in its padding),
    one vector per spatial dim (a window's count is their product: never the grid)."""
    out_counts = []
    for size, k, step, pad, dil, out in zip(sizes, kernel, stride, padding, dilation, outs):
        start = torch.arange(out) * step - pad
        pos = start[:, None] + torch.arange(k) * dil
        lo, hi = (-pad, size + pad) if margin else (0, size)
        out_counts.append(((pos >= lo) & (pos < hi)).sum(1))
    return out_counts


def _divided(total, counts: Sequence[torch.Tensor], first: int):
    """``total`` (sparse over its windows) divided by each window's count, one broadcast
    vector per spatial dim from ``first``: only the stored windows are read."""
    n = len(counts)
    for k, c in enumerate(counts):
        total = total / c.reshape((1,) * (first + k) + (-1,) + (1,) * (n - k - 1)).to(total.dtype)
    return total


def _window_max(u: SparseTensor, n: int, real: Sequence[torch.Tensor]):
    """(the result's pattern, its values, each window's positions inside the input, its
    stored entries): see ``window_max``."""
    kept = u.dim() - n
    m = nonlinear._wrap(nonlinear._reduce_stored(u, tuple(range(kept, u.dim())), "max", dense=False))
    ones = nonlinear.with_values(u, torch.ones_like(u._storage.values, dtype=torch.int64))
    tc = nonlinear._tc()
    v = nonlinear._vars(u.dim())
    count = nonlinear._wrap(tc.compute(tc.Assignment(v[:kept], tc.Access(0, v)), ones))
    coords = layout_ops._coords(m)
    if not torch.equal(coords, layout_ops._coords(count)):
        raise RuntimeError("max pooling: the count of stored entries lost its windows' pattern")
    at = torch.ones(coords.shape[1], dtype=torch.int64)
    for k, c in enumerate(real):          # the window's positions inside the input
        at = at * c[coords[kept - n + k]]
    mv = m._storage.values
    return m._storage, torch.where(count._storage.values < at, mv.clamp(min=0), mv), at, count._storage.values


class _WindowMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: SparseTensor, n: int, real: Sequence[torch.Tensor], indices):
        P, out, at, counts = _window_max(u, n, real)
        ctx.save_for_backward(out)
        ctx.pattern, ctx.u, ctx.at, ctx.counts, ctx.kept = P, u._storage, at, counts, u.dim() - n
        result = SparseTensor(with_pattern_values(P, out))
        if indices is None:
            return result
        where = max_indices(u._storage, P, out, at, counts, n, *indices)
        ctx.mark_non_differentiable(where)
        return result, where

    @staticmethod
    def backward(ctx, g, *_):
        out, = ctx.saved_tensors
        P, U, kept = ctx.pattern, ctx.u, ctx.kept
        wanted = grad_values(P, g)
        shape = U.shape[:kept]
        ucoords = layout_ops._coords(SparseTensor(U))[:kept]
        fiber = torch.searchsorted(linear_keys(layout_ops._coords(SparseTensor(P)), shape), linear_keys(ucoords, shape))
        tie = U.values == out[fiber]
        ties = torch.zeros(out.numel(), dtype=out.dtype).index_add_(0, fiber, tie.to(out.dtype))
        implicit = torch.where(out == 0, (ctx.at - ctx.counts).to(out.dtype), torch.zeros((), dtype=out.dtype))
        share = (wanted.to(out.dtype) / (ties + implicit).clamp(min=1))[fiber]
        vals = torch.where(tie, share, torch.zeros((), dtype=share.dtype))
        return mark_gradient(from_values(U, vals.to(U.values.dtype))), None, None, None


def window_max(u: SparseTensor, n: int, real: Sequence[torch.Tensor], indices=None):
    """The max of each window of ``u`` (its last ``n`` dims the offsets in the window) as a
    sparse tensor over the windows that store an entry: the max of their stored entries,
    raised to 0 where the window also holds an implicit zero (fewer stored entries than
    ``real``, its positions inside the input: one vector per spatial dim, multiplied).
    Windows storing nothing are 0, not stored: the cost is the stored entries'. The
    backward splits a window's gradient among its stored entries equal to the max and,
    where the max is 0, its implicit zeros (as ``amax``). ``indices``: (position tables,
    input sizes) to also return torch's max indices (``pool_indices.max_indices``)."""
    if needs_graph((u,)):
        return _WindowMax.apply(u, n, real, indices)
    P, out, at, counts = _window_max(u, n, real)
    result = SparseTensor(with_pattern_values(P, out))
    if indices is None:
        return result
    return result, max_indices(u._storage, P, out, at, counts, n, *indices)


def pool(x: SparseTensor, n: int, kernel, stride, padding, dilation, reduce: str,
         divisor: Optional[int] = None, ceil_mode: bool = False, count_include_pad: bool = True,
         return_indices: bool = False):
    """Mean (``avg``) or ``amax`` (``max``) over each window of the last ``n`` dims, with
    torch's padding rules: max pooling's padding is no entry of a window (-inf), average
    pooling divides by the window's positions in the padded input (``count_include_pad``) or
    in the input, and ``ceil_mode``'s last window, hanging past the end, counts only what it
    covers of those. ``return_indices`` (max): also torch's indices of the maxima."""
    kernel = _tuple(kernel, n, "kernel_size")
    stride = _tuple(stride if stride not in (None, ()) else kernel, n, "stride")
    padding, dilation = _tuple(padding, n, "padding"), _tuple(dilation, n, "dilation")
    first = x.dim() - n
    sizes = tuple(x.shape[first:])
    outs = tuple(_out_size(*a, ceil_mode) for a in zip(sizes, kernel, stride, padding, dilation))
    # the right padding that makes unfold give ``outs`` windows (ceil_mode: past the padding)
    right = [max(p, (o - 1) * s + d * (k - 1) + 1 - (L + p))
             for L, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, outs)]
    x = _padded(x, [(0, 0)] * first + list(zip(padding, right)))
    u = _windows(x, first, kernel, stride, dilation)
    u = u[(slice(None),) * first + tuple(slice(0, o) for o in outs)]
    dims = tuple(range(u.dim() - n, u.dim()))
    uneven = ceil_mode or any(padding)
    if reduce == "max":
        tables = (pool_tables(sizes, kernel, stride, padding, dilation, outs), sizes) if return_indices else None
        return window_max(u, n, _window_counts(sizes, kernel, stride, padding, dilation, outs, margin=False), tables)
    total = torch.sum(u, dims)
    if divisor:
        return total / divisor
    if not uneven or (count_include_pad and not ceil_mode):
        size = 1
        for k in kernel:
            size *= k
        return total / size
    return _divided(total, _window_counts(sizes, kernel, stride, padding, dilation, outs, margin=count_include_pad),
                    first)


def _avg_pool(n: int):
    def handler(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        x = _sparse(input)
        if x is None or x.dim() not in (n + 1, n + 2) or not x.dtype.is_floating_point:
            return NotImplemented
        _torch_checks(_AVG[n], x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      *((divisor_override,) if n > 1 else ()))    # (avg_pool1d has none)
        return pool(x, n, kernel_size, stride, padding, 1, "avg", divisor_override, bool(ceil_mode),
                    bool(count_include_pad))
    return handler


def _max_pool(n: int):
    def handler(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
        x = _sparse(input)
        if x is None or x.dim() not in (n + 1, n + 2):
            return NotImplemented
        _torch_checks(_MAX[n], x, kernel_size, stride, padding, dilation, ceil_mode)
        return pool(x, n, kernel_size, stride, padding, dilation, "max", ceil_mode=bool(ceil_mode),
                    return_indices=bool(return_indices))
    return handler


_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


# ``F.max_pool2d`` (torch's boolean_dispatch on ``return_indices``) hands a subclass to
# ``__torch_function__`` under its own public name, ``F.max_pool2d_with_indices`` with them
for _n, (_avg, _max, _with) in {
        1: (F.avg_pool1d, F.max_pool1d, F.max_pool1d_with_indices),
        2: (F.avg_pool2d, F.max_pool2d, F.max_pool2d_with_indices),
        3: (F.avg_pool3d, F.max_pool3d, F.max_pool3d_with_indices)}.items():
    register(_avg)(_avg_pool(_n))
    register(_max)(_max_pool(_n))
    register(_with)(_max_pool(_n))


def _max_unpool(n: int):
    def handler(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        x = _sparse(input)
        if x is None or isinstance(indices, SparseTensor) or x.dim() not in (n + 1, n + 2):
            return NotImplemented
        kernel = _tuple(kernel_size, n, "kernel_size")
        step = kernel if stride is None else _tuple(stride, n, "stride")
        sizes = F._unpool_output_size(x, list(kernel), list(step), list(_tuple(padding, n, "padding")), output_size)
        return max_unpool(x, indices, tuple(int(s) for s in sizes))
    return handler


for _n, _fn in {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}.items():
    register(_fn)(_max_unpool(_n))


def _adaptive_bounds(size: int, out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch's adaptive windows: window ``o`` covers ``floor(o L / O) .. ceil((o + 1) L / O)``."""
    o = torch.arange(out)
    return torch.div(o * size, out, rounding_mode="floor"), -torch.div(-(o + 1) * size, out, rounding_mode="floor")


def adaptive_windows(t: SparseTensor, first: int, outs: Sequence[int]) -> Tuple[SparseTensor, List[torch.Tensor]]:
    """``t`` with each spatial dim from ``first`` split into torch's adaptive windows (the
    window number, and a trailing offset in the window as long as the widest window): each
    stored entry lands in each window covering it (``ceil(O / L) + 1`` at most, the
    coordinates moved in one vectorized pass per rank). Also the windows' sizes, one vector
    per dim."""
    coords, values = layout_ops._coords(t), values_of(t)
    shape = list(t.shape)
    widths = []
    for k, out in enumerate(outs):
        d = first + k
        start, end = _adaptive_bounds(shape[d], out)
        width = int((end - start).max()) if out else 0
        c = coords[d]
        size = max(shape[d], 1)
        # the windows covering c: o from floor(c O / L) to ceil((c + 1) O / L) - 1
        home = torch.div(c * out, size, rounding_mode="floor")
        last = -torch.div(-(c + 1) * out, size, rounding_mode="floor") - 1
        moved, picks = [], []
        for step in range(-(-out // size) + 1):
            w = home + step
            wc = w.clamp(0, max(out - 1, 0))
            pick = ((w <= last) & (w < out)).nonzero().squeeze(1)
            m = coords[:, pick].clone()
            m[d] = w[pick]
            moved.append(torch.cat([m, (c - start[wc])[pick][None]]))
            picks.append(pick)
        pick = torch.cat(picks)
        coords, values = torch.cat(moved, 1), values[pick]
        shape[d] = out
        shape.append(width)
        # the offset dims trail in order: move this one past the spatial dims not yet split
        order = list(range(len(shape) - 1))
        order.insert(t.dim() + k, len(shape) - 1)
        coords, shape = coords[order], [shape[i] for i in order]
        widths.append(end - start)
    u = _shape._build(coords, values, shape)
    return u, widths


def _adaptive(n: int, reduce: str):
    def handler(input, output_size, return_indices=False):
        x = _sparse(input)
        if x is None or x.dim() not in (n + 1, n + 2) or (return_indices and reduce != "max"):
            return NotImplemented
        spatial = x.shape[x.dim() - n:]
        wanted = (output_size,) * n if isinstance(output_size, numbers.Integral) or output_size is None \
            else tuple(output_size) * (n if len(tuple(output_size)) == 1 else 1)
        sizes = tuple(s if o is None else int(o) for o, s in zip(wanted, spatial))   # None: keep
        if any(o < 0 for o in sizes):
            return NotImplemented          # torch's error
        if any(o == 0 for o in sizes):     # an empty result, as torch's
            shape = tuple(x.shape[:x.dim() - n]) + sizes
            empty = _shape._build(torch.zeros((len(shape), 0), dtype=torch.int64),
                                  values_of(x)[:0], shape)
            if return_indices:
                return empty, torch.zeros(shape, dtype=torch.int64)
            return empty
        if all(o > 0 and s % o == 0 for o, s in zip(sizes, spatial)):
            kernel = tuple(s // o for o, s in zip(sizes, spatial))
            return pool(x, n, kernel, kernel, 0, 1, reduce, return_indices=bool(return_indices))
        u, widths = adaptive_windows(x, x.dim() - n, sizes)
        if reduce == "max":
            if any(s == 0 for s in spatial):
                return NotImplemented      # empty windows: torch's error
            tables = None
            if return_indices:
                starts = [_adaptive_bounds(s, o)[0] for s, o in zip(spatial, sizes)]
                tables = (adaptive_tables(starts, widths), tuple(spatial))
            return window_max(u, n, widths, tables)
        total = torch.sum(u, tuple(range(u.dim() - n, u.dim())))
        return _divided(total, widths, x.dim() - n)
    return handler


for _n, (_avg, _max, _with) in {
        1: (F.adaptive_avg_pool1d, F.adaptive_max_pool1d, F.adaptive_max_pool1d_with_indices),
        2: (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, F.adaptive_max_pool2d_with_indices),
        3: (F.adaptive_avg_pool3d, F.adaptive_max_pool3d, F.adaptive_max_pool3d_with_indices)}.items():
    register(_avg)(_adaptive(_n, "avg"))
    register(_max)(_adaptive(_n, "max"))
    register(_with)(_adaptive(_n, "max"))


#: the input rank each interpolation mode takes (None: any of 3-5)
_MODE_RANK = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5, "nearest": None,
              "nearest-exact": None, "area": None}


def _interpolated(rows: torch.Tensor, out: Optional[int], scale: Optional[float], mode: str, align_corners,
                  recompute, antialias: bool = False) -> torch.Tensor:
    """torch's ``F.interpolate`` of each row of ``rows`` along its length (a 1-high image for
    the linear and cubic modes: its height maps 1 -> 1 unchanged)."""
    b, size = rows.shape
    if mode in ("nearest", "nearest-exact", "area"):
        kw = dict(size=None if out is None else (out,), scale_factor=None if scale is None else (scale,))
        y = F.interpolate(rows.reshape(b, 1, size), mode=mode, recompute_scale_factor=recompute, **kw)
    else:
        kw = dict(size=None if out is None else (1, out), scale_factor=None if scale is None else (1.0, scale))
        y = F.interpolate(rows.reshape(b, 1, 1, size), mode="bicubic" if mode == "bicubic" else "bilinear",
                          align_corners=align_corners, recompute_scale_factor=recompute, antialias=antialias, **kw)
    return y.reshape(b, -1)


def _out_length(size: int, out: Optional[int], scale: Optional[float], mode: str, align_corners,
                recompute) -> int:
    """The length torch's interpolation gives one axis."""
    return _interpolated(torch.zeros(1, size, dtype=torch.float64), out, scale, mode, align_corners,
                         recompute).shape[1]


def _comb_count(size: int, n_out: int, scale: Optional[float], mode: str, align_corners, antialias: bool) -> int:
    """How many combs ``_axis_weights`` probes one axis with: past the widest support."""
    support = {"nearest": 1, "nearest-exact": 1, "bicubic": 4}.get(mode, 2)
    if antialias:       # torch's aa support: ceil(interp_size / 2 * scale) * 2 + 1 taps
        shrink = max(1.0, size / max(n_out, 1), 1.0 / scale if scale else 1.0,
                     (size - 1) / (n_out - 1) if align_corners and n_out > 1 else 1.0)
        support = math.ceil(support / 2 * shrink) * 2 + 3
    return min(size, support + 1)


#: anti-aliased downscaling by ``s`` probes ~2s combs of the axis: past this many probed
#: values (combs x length) the fallback runs torch's own kernel instead
AA_PROBE_MAX = 1 << 22


def _antialias_runs(spatial, sizes, scales, mode: str, align_corners, recompute) -> bool:
    """Whether the sparse anti-aliased interpolation takes these axes: no output 1 wide
    (torch's own kernels then give every row the first row's weights: not separable per
    axis) and every axis's probe within ``AA_PROBE_MAX``."""
    for k, size in enumerate(spatial):
        scale = None if scales is None else scales[k]
        n_out = _out_length(size, None if sizes is None else sizes[k], scale, mode, align_corners, recompute)
        if n_out == 1 or 2 * _comb_count(size, n_out, scale, mode, align_corners, True) * size > AA_PROBE_MAX:
            return False
    return True


def _axis_weights(size: int, out: Optional[int], scale: Optional[float], mode: str, align_corners,
                  recompute, antialias: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """torch's interpolation along one axis as (input index, output index, weight) triples:
    torch's own ``F.interpolate`` (every mode is separable: linear / bilinear / trilinear and
    bicubic are 1-D kernels per axis, area an adaptive mean, nearest a pick), so the
    weights are torch's (area, a mean over windows of any width, goes to adaptive pooling).
    Not of every unit vector (O(size x out)): of ``P`` combs, comb ``r``
    holding the inputs ``i = r mod P``, with ``P`` past the widest support, so each output
    meets at most one input of a comb; a second comb holding ``i + 1`` there names it.
    Anti-aliased (downscaling by ``s``), the kernel widens by ``s``: ~2s + 1 taps."""
    n_out = _out_length(size, out, scale, mode, align_corners, recompute)
    P = _comb_count(size, n_out, scale, mode, align_corners, antialias)
    i = torch.arange(size)
    combs = (i[None, :] % P == torch.arange(P)[:, None]).to(torch.float64)
    y = _interpolated(torch.cat([combs, combs * (i + 1)]), out, scale, mode, align_corners, recompute, antialias)
    w, named = y[:P], y[P:]
    r, o = (w != 0).nonzero(as_tuple=True)
    src = torch.round(named[r, o] / w[r, o]).to(torch.int64) - 1
    return src, o, w[r, o], n_out


def interpolate(x: SparseTensor, sizes, scales, mode: str, align_corners, recompute, antialias: bool = False):
    """``F.interpolate`` of a sparse input: one product per spatial axis with that axis's
    sparse weight matrix (``_axis_weights``: 1-2 entries a column for linear and nearest, 4
    for cubic), so each stored entry spreads to the outputs it weighs in and the cost
    follows the stored entries; a sparse result, differentiable through the products."""
    n = x.dim() - 2
    if mode == "area":          # torch's area is its adaptive mean: windows of any width
        outs = [_interpolated(torch.zeros(1, x.shape[2 + k], dtype=torch.float64), None if sizes is None else sizes[k],
                              None if scales is None else scales[k], mode, align_corners, recompute).shape[1]
                for k in range(n)]
        return getattr(F, f"adaptive_avg_pool{n}d")(x, outs)
    letters = "abcdefgh"[:x.dim()]
    y = x
    for k in range(n):
        d = 2 + k
        size = x.shape[d]
        src, o, w, n_out = _axis_weights(size, None if sizes is None else sizes[k],
                                         None if scales is None else scales[k], mode, align_corners, recompute,
                                         antialias)
        if n_out == size and torch.equal(src, o) and bool((w == 1).all()) and src.numel() == size:
            continue            # this axis keeps its size and positions
        W = _sparse_weights(src, o, w.to(x.dtype), (size, n_out))
        out = letters[:d] + "Z" + letters[d + 1:]
        y = einsum(f"{letters},{letters[d]}Z->{out}", y, W)
    return y if y is not x else x.clone()


def _sparse_weights(src: torch.Tensor, o: torch.Tensor, w: torch.Tensor, shape) -> SparseTensor:
    from ..constructors import sparse_tensor
    return sparse_tensor((torch.stack([src, o]), w), size=shape, format="csr")


def _aa_aten(op, mode: str):
    """aten's anti-aliased upsampling (``_upsample_bilinear2d_aa``, bicubic's; ``.vec``:
    size or scale factors, ``.default``: size, and scales read only beside it): the
    interpolation above; the rest (scales beside a size, an output 1 wide) through the
    dense fallback."""
    def handler(input, output_size, align_corners, scale_factors=None, scales_w=None):
        args = (input, output_size, align_corners, scale_factors) + ((scales_w,) if default else ())
        if default and (scale_factors is not None or scales_w is not None):
            # (output_size, align_corners, scales_h, scales_w), what ``.vec`` by scale factors
            # decomposes to: the scales where they give this size (floor(size x scale))
            x = _sparse(input)
            scales = (scale_factors, scales_w)
            if x is None or None in scales or any(
                    math.floor(x.shape[2 + k] * scales[k]) != int(output_size[k]) for k in range(2)):
                return dense_fallback(op, args, {})
            output_size, scale_factors = None, scales
        x = _sparse(input)
        sizes = None if output_size is None else tuple(int(v) for v in output_size)
        scales = None if scale_factors is None else tuple(float(f) for f in scale_factors)
        if (x is not None and x.dim() == 4 and x.dtype.is_floating_point and (sizes is None) != (scales is None)
                and 0 not in x.shape[2:] and _antialias_runs(x.shape[2:], sizes, scales, mode, align_corners, None)):
            return interpolate(x, sizes, scales, mode, align_corners, None, True)
        return dense_fallback(op, args, {})
    default = op._overloadname == "default"
    return handler


for _packet, _mode in ((torch.ops.aten._upsample_bilinear2d_aa, "bilinear"),
                       (torch.ops.aten._upsample_bicubic2d_aa, "bicubic")):
    for _op in (_packet.vec, _packet.default):
        register_aten(_op)(_aa_aten(_op, _mode))


@register(F.interpolate)
def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    """``mode="nearest"`` by whole factors (``size`` a multiple of the input's, or an integer
    ``scale_factor``): each spatial dim's entries repeated in place (``repeat_interleave``).
    Every other mode and factor: one product per axis with its weight matrix
    (:func:`interpolate`). Both give a sparse result. Inputs torch refuses (a mode's rank,
    both or neither of size and scale_factor) take the fallback, which raises torch's error."""
    x = _sparse(input)
    if x is None or x.dim() < 3 or x.dim() > 5 or mode not in _MODE_RANK:
        return NotImplemented
    if _MODE_RANK[mode] not in (None, x.dim()) or (size is None) == (scale_factor is None):
        return NotImplemented
    _torch_checks(F.interpolate, x, size, scale_factor, mode, align_corners, recompute_scale_factor,
                  antialias)
    if antialias and (mode not in ("bilinear", "bicubic") or x.dim() != 4):
        return NotImplemented      # torch's error
    n = x.dim() - 2
    spatial = x.shape[2:]
    sizes = _tuple(size, n, "size") if size is not None else None
    scales = None if scale_factor is None else (
        (float(scale_factor),) * n if isinstance(scale_factor, numbers.Real) else tuple(float(f) for f in scale_factor))
    if scales is not None and len(scales) != n:
        return NotImplemented
    if any(i == 0 for i in spatial) or (mode != "nearest" and not x.dtype.is_floating_point):
        return NotImplemented
    whole = mode == "nearest" and (
        all(s % i == 0 for s, i in zip(sizes, spatial)) if sizes is not None
        else all(f == int(f) and f >= 1 for f in scales))
    if not whole:
        if antialias and not _antialias_runs(spatial, sizes, scales, mode, align_corners, recompute_scale_factor):
            return NotImplemented       # torch's own, through the fallback
        return interpolate(x, sizes, scales, mode, align_corners, recompute_scale_factor, bool(antialias))
    factors = [s // i for s, i in zip(sizes, spatial)] if sizes is not None else [int(f) for f in scales]
    out = x
    for k, f in enumerate(factors):
        if f != 1:
            out = layout_ops.repeat_interleave(out, f, 2 + k)
    return out if out is not x else x.clone()
