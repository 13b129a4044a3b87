"""``F.grid_sample`` of a sparse input (``bilinear`` / ``nearest``, every padding mode,
``align_corners``; 4-D and 5-D inputs): one sparse product.

Each output position reads at most ``2**n`` input positions (the corners around its source
point), with weights that depend on the grid only. Those weights, computed from the grid
with torch's formulas (``GridSampler.h``: unnormalize, clip or reflect, floor, the corner
products) in one pass by the runtime (``_runtime/sampling.pyx``), are a sparse sampling
matrix ``M[n, p, q]`` (output position ``p``, input position ``q``, each as its spatial
dims), and the result is ``einsum("npq,ncq->ncp", M, X)``: its cost follows the grid
(dense, given) and the stored entries each corner meets; the result is sparse and
differentiable in the input's stored values. A grid that requires grad (a spatial
transformer learning it) runs torch's own sampling on a dense copy, said once; bicubic
sampling takes the dense fallback."""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from .._dispatch import register
from .. import _dispatch, conversion
from .._runtime import sampling
from ..formats import Format
from ..level_storage import Storage
from ..tensor_type import SparseTensor
from . import shape as _shape
from .einsum import einsum
from ..gradients.values import values_of
from .nonlinear import _sparse

__all__ = ["grid_sample"]

_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}


def _sampling_matrix(grid: torch.Tensor, sizes, mode: int, padding: int, align_corners: bool,
                     dtype: torch.dtype) -> Storage:
    """The sampling matrix ``M[n, p, q]`` (``p`` and ``q`` as the output's and the input's
    spatial dims) as a Storage stored input-position major (levels n and q's dims dense,
    p's dims compressed): per output position its corners inside the input (``nearest``:
    the one rounded to, halves to even). The corners come out in (n, p, corner) order, so
    a stable counting sort by (n, q) (``O(entries)``, no comparison sort) leaves each q's
    output positions sorted."""
    n = len(sizes)                               # sizes: (D,) H, W; grid's last dim: x, y(, z)
    batch = grid.shape[0]
    plane = math.prod(sizes)
    # every corner inside the input, in (n, p, corner) order, computed in one pass over the
    # grid by the runtime (torch's formulas; ~30 torch passes before: 58 -> 6 ms for a
    # 4 x 256 x 256 bilinear grid)
    key, out_pos, w = sampling.sampling_corners(grid, sizes, mode, padding, align_corners)
    count = key.numel()
    # the input position's dims as dense levels (n, then the input's dims), the output
    # position's dims compressed below them: the product reads the input in its own shape
    # and writes the output in its own (no reshape on either side). The counting sort's
    # bucket starts are the dense levels' entry offsets; the runtime's level builder makes
    # the compressed levels from the output coordinates (sorted within each bucket).
    out = tuple(grid.shape[1:-1])
    k = len(out)
    shape = (batch,) + out + tuple(sizes)
    fmt = Format("d" * (n + 1) + "c" * k, (0,) + tuple(range(1 + k, 1 + k + n)) + tuple(range(1, 1 + k)))
    wdt = conversion._work_dtype(shape, fmt, count)
    dest, starts = conversion._k_counting_sort(key.to(wdt), batch * plane)
    flat = conversion._k_scatter(dest, out_pos.to(wdt))
    vals = conversion._k_scatter(dest, w.to(dtype).contiguous())
    keys = [None] * (n + 1)
    for size in reversed(out):
        keys.insert(n + 1, (flat % size).to(wdt).contiguous())
        flat = torch.div(flat, size, rounding_mode="floor")
    return conversion._build(shape, fmt, keys, vals, count, unique=True, start=n + 1,
                             eoff=starts, parents=batch * plane)


def grid_sample(x: SparseTensor, grid: torch.Tensor, mode: int, padding: int, align_corners: bool):
    """torch's grid sampling (enum modes, as ``torch.grid_sampler``) of a sparse input."""
    n = x.dim() - 2
    sizes = tuple(x.shape[2:])
    # input-position major: the product walks the input's stored entries and, for each, the
    # output positions it weighs in (a scatter into the output's row), never the output
    # positions against the input's rows
    if grid.numel() == 0:      # an empty output
        shape = (x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1])
        return _shape._build(torch.zeros((len(shape), 0), dtype=torch.int64), values_of(x)[:0], shape)
    M = SparseTensor(_sampling_matrix(grid, sizes, mode, padding, align_corners, x.dtype))
    ins, outs = "ijk"[:n], "xyz"[:n]
    out = einsum(f"n{outs}{ins},nc{ins}->nc{outs}", M, x)
    if mode == 0 and padding == 0:
        # torch's bilinear sampling with zero padding gives NaN at a non-finite coordinate
        # (its weights are NaN); the sampling matrix has no corners there
        lost = ~torch.isfinite(grid).all(-1)
        if bool(lost.any()):
            at = lost.nonzero().t()                                  # (1 + n) x k
            C, k = x.shape[1], at.shape[1]
            chans = torch.arange(C).repeat(k)
            at = at.repeat_interleave(C, dim=1)
            coords = torch.cat([at[:1], chans[None], at[1:]])
            nan = torch.full((coords.shape[1],), float("nan"), dtype=out.dtype)
            out = out + _shape._build(coords, nan, tuple(out.shape))
    return out


def _handler(input, grid, interpolation_mode, padding_mode, align_corners):
    x = _sparse(input)
    if (x is None or isinstance(grid, SparseTensor) or x.dim() not in (4, 5) or grid.dim() != x.dim()
            or grid.shape[-1] != x.dim() - 2 or grid.shape[0] != x.shape[0] or interpolation_mode not in (0, 1)
            or padding_mode not in (0, 1, 2) or grid.dtype != x.dtype or not x.dtype.is_floating_point
            or any(s == 0 for s in x.shape[2:])):
        return NotImplemented        # torch's checks and errors, bicubic: the fallback
    if grid.requires_grad and torch.is_grad_enabled():
        # a grid that learns (a spatial transformer): torch's own sampling of the dense
        # input, differentiable in the stored values and in the grid, under the dense
        # limit and said once
        _dispatch.check_dense_size("grid_sample", x.shape, x.dtype)
        if "grid_sample" not in _dispatch._warned:
            _dispatch._warned.add("grid_sample")
            warnings.warn("scorch: grid_sample with a grid that requires grad runs torch's own on a "
                          "dense copy of the sparse input (correct, but memory and time follow the "
                          "dense size)", stacklevel=3)
        return torch.grid_sampler(x.to_dense(), grid, interpolation_mode, padding_mode, align_corners)
    return grid_sample(x, grid, int(interpolation_mode), int(padding_mode), bool(align_corners))


@register(torch.grid_sampler, torch.grid_sampler_2d, torch.grid_sampler_3d)
def _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _handler(input, grid, interpolation_mode, padding_mode, align_corners)


@register(F.grid_sample)
def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    if mode not in _MODES or padding_mode not in _PADDINGS:
        return NotImplemented
    return _handler(input, grid, _MODES[mode], _PADDINGS[padding_mode], bool(align_corners))
