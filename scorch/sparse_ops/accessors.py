"""torch's sparse accessors on a SparseTensor: ``values``, ``indices``, ``to_dense``, ``_nnz``;
and dtype casts (``to``, ``double``, ``float``, ...) of a sparse tensor that requires grad,
whose gradient is the cast back of the stored values' gradient, on the same pattern."""
from __future__ import annotations

from typing import Optional

import torch

from .._dispatch import register
from ..gradients.values import from_values, values_of
from ..tensor_type import SparseTensor


@register(torch.Tensor.values)
def _values(t):
    return t.values() if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.indices, torch.Tensor._indices)
def _indices(t):
    return t.indices() if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.to_dense)
def _to_dense(t, dtype=None, *, masked_grad=None):
    return t.to_dense(dtype) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor._nnz)
def _nnz(t):
    return t.nnz if isinstance(t, SparseTensor) else NotImplemented


# --- casts that autograd records ---------------------------------------------------------
# Below __torch_function__ a cast is ATen's _to_copy, whose recorded backward casts the
# gradient with the input's tensor options: a SparseTensor's layout reads as strided, so the
# gradient would come back dense. Casting the stored values instead keeps it on the pattern.

def _tracked(t) -> bool:
    return isinstance(t, SparseTensor) and torch.is_grad_enabled() and t.requires_grad


def _cast(t: SparseTensor, dtype: Optional[torch.dtype], copy: bool):
    if dtype is None or dtype == t.dtype:
        if not copy:
            return t                       # torch returns the tensor itself
        dtype = t.dtype
    return from_values(t._storage, values_of(t).to(dtype, copy=copy))


def _parse_to(args, kwargs):
    """(device, dtype, copy) of a ``Tensor.to`` call, or None for a form not read here."""
    kwargs = dict(kwargs)
    copy = bool(kwargs.pop("copy", False))
    if len(args) >= 2 and isinstance(args[-1], bool) and isinstance(args[-2], bool):
        copy, args = args[-1], args[:-1]   # to(dtype, non_blocking, copy)
    try:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    except (TypeError, RuntimeError):
        return None
    return device, dtype, copy


@register(torch.Tensor.to)
def _to(t, *args, **kwargs):
    if not _tracked(t):
        return NotImplemented
    parsed = _parse_to(args, kwargs)
    if parsed is None or (parsed[0] is not None and parsed[0].type != "cpu"):
        return NotImplemented              # torch's (or scorch's CPU-only) error
    return _cast(t, parsed[1], parsed[2])


def _fixed_cast(method, dtype: torch.dtype):
    @register(method)
    def handler(t, memory_format=None):
        return _cast(t, dtype, False) if _tracked(t) else NotImplemented
    return handler


for _method, _dtype in ((torch.Tensor.double, torch.float64), (torch.Tensor.float, torch.float32),
                        (torch.Tensor.half, torch.float16), (torch.Tensor.bfloat16, torch.bfloat16)):
    _fixed_cast(_method, _dtype)


@register(torch.Tensor.type_as)
def _type_as(t, other):
    return _cast(t, other.dtype, False) if _tracked(t) else NotImplemented
