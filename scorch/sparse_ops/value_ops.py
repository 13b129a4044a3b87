"""Functions that keep 0 at 0, run as torch's own op on the stored values: the pattern
kept, the values exactly torch's, differentiable as torch's op is (``gradients.values``). For
one function on its own this is as fast as a generated kernel (one pass over the values);
the compiler's function table (``nonlinear``) is for functions that fuse into an einsum.

``erfinv``, ``rrelu``, ``xlogy`` / ``copysign`` (a number or dense second operand, as
``elementwise.on_stored_values``), ``float_power`` (positive exponent), ``nansum`` /
``nanmean`` (the NaNs made 0 first), ``hypot`` (``sqrt(x*x + y*y)``: sparse on the union
of two sparse operands) and ``F.glu`` (``a * sigmoid(b)`` at ``a``'s stored entries)."""
from __future__ import annotations

import numbers
from typing import Callable

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..gradients.values import from_values, values_of
from ..tensor_type import SparseTensor
from . import elementwise
from .dims import checked_dim
from .nonlinear import _sparse, on_stored_values

__all__ = ["on_values"]


def on_values(t: SparseTensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn`` (elementwise, ``fn(0) == 0``) of ``t``: sparse on ``t``'s pattern."""
    return from_values(t._storage, fn(values_of(t)))


def _unary(*torch_functions):
    """Register torch's elementwise ``torch_functions`` on the stored values where the call
    keeps 0 (checked per call, with its arguments: ``nonlinear.on_stored_values``)."""
    def register_one(fn):
        @register(fn)
        def handler(x, *args, **kwargs):
            t = _sparse(x)
            if t is None or kwargs.get("out") is not None or kwargs.get("inplace") or t.dtype.is_complex:
                return NotImplemented
            return on_stored_values(lambda v, **kw: fn(v, *args, **kw), t, kwargs)
    for f in torch_functions:
        register_one(f)


_unary(torch.erfinv, torch.Tensor.erfinv, torch.special.erfinv, F.rrelu)


def _binary(op):
    def handler(x, other, *, out=None):
        if not isinstance(x, torch.Tensor):
            return NotImplemented
        return elementwise.on_stored_values(op, x, other, out=out)
    return handler


# xlogy(0, y) = 0 and copysign(0, y) = +-0: torch's op on the stored values. As with ``mul``
# (and torch.sparse), an unstored 0 times a NaN of the other operand stays 0.
register(torch.xlogy, torch.Tensor.xlogy, torch.special.xlogy)(_binary(torch.xlogy))
register(torch.copysign, torch.Tensor.copysign)(_binary(torch.copysign))


@register(torch.float_power, torch.Tensor.float_power)
def _float_power(x, exponent, *, out=None):
    t = _sparse(x)
    if t is None or out is not None or t.dtype.is_complex:
        return NotImplemented
    if isinstance(exponent, torch.Tensor) and not isinstance(exponent, SparseTensor):
        return elementwise.on_stored_values(torch.float_power, t, exponent, strict_zero=True)
    if not isinstance(exponent, numbers.Real) or exponent <= 0:
        return NotImplemented
    return on_values(t, lambda v: torch.float_power(v, exponent))


def _nan_as_zero(t: SparseTensor) -> SparseTensor:
    v = values_of(t)
    if not v.dtype.is_floating_point:
        return t
    return from_values(t._storage, torch.where(v.isnan(), torch.zeros((), dtype=v.dtype), v))


@register(torch.nansum, torch.Tensor.nansum)
def _nansum(x, dim=None, keepdim=False, *, dtype=None, out=None):
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    return torch.sum(_nan_as_zero(t), dim, keepdim=keepdim, dtype=dtype) if dim is not None \
        else torch.sum(_nan_as_zero(t), dtype=dtype)


def _stored_nans(t: SparseTensor) -> torch.Tensor:
    """1 at each stored NaN of ``t`` and nothing elsewhere (a sparse tensor of ``t``'s
    shape): its sums along dims are sparse on the fibers that hold a NaN, and only there."""
    from .._runtime import convert
    from .shape import _build
    nan = t._storage.values.detach().isnan()
    coords = convert.coords(t._storage)[:, nan]
    return _build(coords, torch.ones(coords.shape[1], dtype=t.dtype), t.shape)


@register(torch.nanmean, torch.Tensor.nanmean)
def _nanmean(x, dim=None, keepdim=False, *, dtype=None, out=None):
    """The sum of the non-NaN values over their count: the count is the dense extent minus
    the stored NaNs (an unstored entry is a 0, never NaN)."""
    t = _sparse(x)
    if t is None or out is not None or not (dtype or t.dtype).is_floating_point:
        return NotImplemented
    if dtype is not None:
        t = t.to(dtype)
    if dim is None:
        nan_count = int(t._storage.values.isnan().sum())
        return _nan_as_zero(t).sum() / (t.numel() - nan_count)
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:                             # dim=[]: every dim, as torch (not none of them)
        dims = list(range(t.dim()))
    extent = 1
    for d in dims:
        extent *= t.shape[d]
    if extent == 0:                          # nothing to average: NaN, as torch (no element)
        return torch.nanmean(torch.zeros(t.shape, dtype=t.dtype), dims, keepdim=keepdim)
    total = torch.sum(_nan_as_zero(t), dims, keepdim=keepdim)
    nan_count = torch.sum(_stored_nans(t), dims, keepdim=keepdim)
    if isinstance(total, SparseTensor) and isinstance(nan_count, SparseTensor):
        # sparse sums: divide by the extent, then correct the fibers that hold NaNs. The
        # correction is stored only there (never a stored 0: total * 0 is NaN at a fiber
        # summing to +-inf); ``extent - nans`` itself would be dense by nature
        counts = nan_count._storage.values
        correction = from_values(nan_count._storage, 1 / (extent - counts) - 1 / extent)
        return total / extent + total * correction
    count = extent - nan_count
    count = count.to_dense() if isinstance(count, SparseTensor) else count
    return total / count


@register(torch.hypot, torch.Tensor.hypot)
def _hypot(x, y, *, out=None):
    """Two sparse operands: 0 wherever both are, so sparse on the union; with a dense one,
    dense by nature (``hypot(0, y) = |y|``): the fallback's dense path is not wanted, so
    through ``sqrt(x*x + y*y)`` too (the sum is dense there)."""
    if out is not None or not (isinstance(x, SparseTensor) or isinstance(y, SparseTensor)):
        return NotImplemented
    if not all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in (x, y)):
        return NotImplemented
    return torch.sqrt(x * x + y * y)


@register(F.glu)
def _glu(x, dim=-1):
    """``a * sigmoid(b)`` for the halves ``a``, ``b`` along ``dim``: 0 wherever ``a`` stores
    nothing, so ``b`` is read only at ``a``'s stored entries (``positions.values_at``; an
    unstored ``b`` is sigmoid(0) = 1/2), never a dense sigmoid."""
    t = _sparse(x)
    if t is None or not t.dtype.is_floating_point:
        return NotImplemented
    d = checked_dim(dim, t.dim(), "glu")
    n = t.shape[d]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    half = n // 2
    from .._runtime import convert
    from .positions import _row_major_keys, values_at
    coords, vals = convert.coords(t._storage), values_of(t)
    first = coords[d] < half
    a_coords = coords[:, first]
    b_coords = a_coords.clone()
    b_coords[d] += half
    b = values_at(t, _row_major_keys(b_coords, t.shape))
    shape = list(t.shape)
    shape[d] = half
    from .shape import _build
    return _build(a_coords, vals[first] * torch.sigmoid(b), shape)


def _positions_on_pattern(t: SparseTensor, find: Callable[[torch.Tensor], torch.Tensor]):
    """``find`` (``bucketize`` / ``searchsorted`` of the elements) of ``t``: on ``t``'s
    pattern where an unstored 0 finds position 0, else None (dense by nature: the
    fallback, under its dense limit). An index result: no gradient, as torch."""
    if int(find(torch.zeros((), dtype=t.dtype))) != 0:
        return None
    from ..tensor_type import with_values
    return with_values(t, find(t._storage.values.detach()))


@register(torch.bucketize)
def _bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    t = _sparse(input)
    if t is None or out is not None or isinstance(boundaries, SparseTensor):
        return NotImplemented
    r = _positions_on_pattern(t, lambda v: torch.bucketize(v, boundaries, out_int32=out_int32,
                                                            right=right))
    return NotImplemented if r is None else r


@register(torch.searchsorted)
def _searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                  out=None, sorter=None):
    t = _sparse(input)
    if t is None or out is not None or isinstance(sorted_sequence, SparseTensor) \
            or sorted_sequence.dim() != 1 or isinstance(input, numbers.Number):
        return NotImplemented                # an n-d sequence pairs rows with input rows
    r = _positions_on_pattern(t, lambda v: torch.searchsorted(
        sorted_sequence, v, out_int32=out_int32, right=right, side=side, sorter=sorter))
    return NotImplemented if r is None else r
