"""Ops on each slice along a dim, built from the stored entries: ``renorm`` (each slice scaled
down to a maximum norm: the stored values times their slice's factor, the pattern kept),
``F.rms_norm`` (each row scaled by its root mean square, the pattern kept) and
``cross`` / ``linalg.cross`` (3-vectors along a dim: the three components are products and
differences of the operands' slices, each a sparse op, so the result stores entries only
where an operand does). Both are differentiable as torch's ops, through the sparse ops they
are made of (renorm's factor included: torch's backward also differentiates the norm)."""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..gradients import fiber_ops
from ..gradients.values import from_values, values_of
from ..tensor_type import SparseTensor
from .nonlinear import _sparse
from .shape import _coords
from ..broadcasting import broadcast_shapes

__all__ = ["renorm", "cross", "rms_norm"]


def renorm(t: SparseTensor, p: float, dim: int, maxnorm: float) -> SparseTensor:
    """``torch.renorm``: each slice ``t.select(dim, i)`` whose ``p``-norm exceeds
    ``maxnorm`` is scaled by ``maxnorm / (norm + 1e-7)`` (torch's formula). The norms are one
    sparse reduction over the other dims (a dense vector as long as ``dim``); the stored values
    are multiplied by their slice's factor."""
    torch.renorm(torch.zeros((1,) * t.dim(), dtype=t.dtype), p, dim, maxnorm)   # torch's checks
    d = dim % t.dim()
    if math.prod(t.shape) == 0:          # nothing to scale; torch's checks of empty slices
        torch.renorm(torch.zeros(t.shape, dtype=t.dtype), p, dim, maxnorm)
        return from_values(t._storage, values_of(t))
    vals = values_of(t)
    norm = _entry_slice_norms(t, vals, p, d)
    scale = torch.where(norm > maxnorm, maxnorm / (norm + 1e-7), torch.ones((), dtype=norm.dtype))
    return from_values(t._storage, vals * scale.to(t.dtype))


def _entry_slice_norms(t: SparseTensor, vals: torch.Tensor, p: float, d: int) -> torch.Tensor:
    """Each stored entry's slice ``p``-norm (the slice ``t.select(d, i)`` it lies in)."""
    others = [k for k in range(t.dim()) if k != d]
    if others and fiber_ops.wide_groups(t._storage, [d]) and p > 0 and math.isfinite(p):
        # one slot per stored slice, not a dense vector as long as ``dim``
        key, slots = fiber_ops.entry_groups(t._storage, [d])
        sums = torch.zeros(slots, dtype=vals.dtype).index_add(0, key, vals.abs() ** p)
        return (sums ** (1.0 / p))[key]
    if others:
        norm = torch.linalg.vector_norm(t, p, dim=others)
        return (norm.to_dense() if isinstance(norm, SparseTensor) else norm).reshape(-1)[_coords(t)[d]]
    return vals.abs()           # 1-D: each slice is one element, its own norm


@register(torch.renorm, torch.Tensor.renorm)
def _renorm(x, p, dim, maxnorm, *, out=None):
    t = _sparse(x)
    if t is None or out is not None or not t.dtype.is_floating_point:
        return NotImplemented
    return renorm(t, float(p), int(dim), float(maxnorm))


def cross(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """``a x b`` along ``dim`` (size 3), broadcast: ``c_k = a_{k+1} b_{k+2} - a_{k+2} b_{k+1}``,
    each slice a sparse product (the intersection of the operands' patterns, or a sparse
    operand's pattern against a dense one) and a sparse difference (their union)."""
    if a.dim() != b.dim():   # torch's check (the stand-ins below share one rank)
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    rank = a.dim()
    torch.linalg.cross(_stand_in(a, rank, dim), _stand_in(b, rank, dim), dim=dim)
    d = dim % rank
    shape = broadcast_shapes(a.shape, b.shape)
    a, b = a.expand(shape), b.expand(shape)
    ai, bi = torch.unbind(a, d), torch.unbind(b, d)
    parts = [ai[(k + 1) % 3] * bi[(k + 2) % 3] - ai[(k + 2) % 3] * bi[(k + 1) % 3] for k in range(3)]
    return torch.stack(parts, d)


def _stand_in(x: torch.Tensor, rank: int, dim: int) -> torch.Tensor:
    """A zero of ``x``'s dtype and rank (left-padded to ``rank``) with every size 1 but
    ``dim``'s: torch's checks on it (dim in range, size 3) match the real call's."""
    shape = (1,) * (rank - x.dim()) + tuple(x.shape)
    d = dim % rank if -rank <= dim < rank else None
    return torch.zeros(tuple(n if k == d else 1 for k, n in enumerate(shape)), dtype=x.dtype)


def _cross_dim(a: torch.Tensor, b: torch.Tensor, dim: Optional[int]) -> int:
    """torch.cross's default dim: the first dim of size 3 of the broadcast shape."""
    if dim is not None:
        return int(dim)
    shape = broadcast_shapes(a.shape, b.shape)
    for k, n in enumerate(shape):
        if n == 3:
            return k
    raise RuntimeError("no dimension of size 3 in input")


def _cross_handler(default: Optional[int]):
    def handler(input, other, dim=default, *, out=None):
        if out is not None or not (isinstance(input, SparseTensor) or isinstance(other, SparseTensor)):
            return NotImplemented
        if not isinstance(input, torch.Tensor) or not isinstance(other, torch.Tensor):
            return NotImplemented
        if isinstance(dim, numbers.Integral) or dim is None:
            return cross(input, other, _cross_dim(input, other, dim))
        return NotImplemented
    return handler


register(torch.cross, torch.Tensor.cross)(_cross_handler(None))
register(torch.linalg.cross)(_cross_handler(-1))


def rms_norm(t: SparseTensor, normalized_shape, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> SparseTensor:
    """``F.rms_norm``: ``x / sqrt(mean(x^2 over the last dims) + eps) * weight``, which keeps 0
    at 0: the mean square per leading position from the stored values (a sparse sum), then each
    stored value times its row's factor and its weight. The pattern is kept."""
    k = len(normalized_shape)
    if tuple(t.shape[t.dim() - k:]) != tuple(normalized_shape):
        raise RuntimeError(f"rms_norm: normalized_shape {list(normalized_shape)} does not match the "
                           f"input's last dims {list(t.shape)}")
    if weight is not None and tuple(weight.shape) != tuple(normalized_shape):
        raise RuntimeError(f"rms_norm: expected weight to be of same shape as normalized_shape, "
                           f"but got weight of shape {list(weight.shape)} and normalized_shape = "
                           f"{list(normalized_shape)}")
    lead, trail = t.shape[:t.dim() - k], t.shape[t.dim() - k:]
    coords, vals = _coords(t), values_of(t)
    if fiber_ops.wide_groups(t._storage, range(len(lead))):   # one slot per stored row
        lead_key, slots = fiber_ops.entry_groups(t._storage, range(len(lead)))
    else:
        lead_key = fiber_ops.fiber_numbers(coords, t.shape, range(len(lead)))
        slots = math.prod(lead)
    # float16 / bfloat16 squared and summed in float32, as torch's (40000^2 overflows float16)
    wide = vals.to(torch.float32) if vals.dtype in (torch.float16, torch.bfloat16) else vals
    # the default eps is that of the type it computes in, as ATen's (bfloat16's 7.8e-3 moved
    # small rows' results by a third)
    eps = torch.finfo(wide.dtype).eps if eps is None else eps
    squares = torch.zeros(slots, dtype=wide.dtype).index_add(0, lead_key, wide * wide)
    factor = torch.rsqrt(squares / max(math.prod(trail), 1) + eps)
    out = (wide * factor[lead_key]).to(vals.dtype)
    if weight is not None:
        trail_key = torch.zeros(coords.shape[1], dtype=torch.int64)
        for d, n in enumerate(trail):
            trail_key = trail_key * n + coords[len(lead) + d]
        out = out * weight.reshape(-1).to(out.dtype)[trail_key]
    return from_values(t._storage, out)


@register(torch.norm_except_dim)
def _norm_except_dim(v, pow=2, dim=0):
    """``weight_norm``'s ``g`` at set-up: dense (one norm a slice)."""
    t = _sparse(v)
    if t is None or pow != 2 or not t.dtype.is_floating_point:
        return NotImplemented
    if dim == -1:
        return torch.linalg.vector_norm(values_of(t)).reshape([1] * t.dim())
    d = dim % t.dim()
    others = [k for k in range(t.dim()) if k != d]
    if not others:              # 1-D: each element its own norm (dense: one per slice)
        return values_of(t).abs().new_zeros(t.shape).index_put((_coords(t)[0],), values_of(t).abs())
    norm = torch.linalg.vector_norm(t, 2, dim=others, keepdim=True)
    return norm.to_dense() if isinstance(norm, SparseTensor) else norm


@register(torch._weight_norm)
def _weight_norm(v, g, dim=0):
    """``weight_norm``'s weight ``v * g / ||v||`` (norm over all dims but ``dim``): the
    stored values scaled by their slice's factor, the pattern kept, differentiable in ``v``
    and ``g`` through torch's ops on the values."""
    t = _sparse(v)
    if t is None or isinstance(g, SparseTensor) or not t.dtype.is_floating_point:
        return NotImplemented
    vals = values_of(t)
    if dim == -1:
        return from_values(t._storage, vals * (g.reshape(()).to(vals.dtype) / torch.linalg.vector_norm(vals)))
    d = dim % t.dim()
    factor = g.reshape(-1).to(vals.dtype)[_coords(t)[d]] / _entry_slice_norms(t, vals, 2.0, d)
    return from_values(t._storage, vals * factor)


@register(F.rms_norm)
def _rms_norm(input, normalized_shape, weight=None, eps=None):
    t = _sparse(input)
    if t is None or isinstance(weight, SparseTensor) or not t.dtype.is_floating_point:
        return NotImplemented
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    return rms_norm(t, shape, weight, eps)
