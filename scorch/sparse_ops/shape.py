"""Shape ops on sparse tensors that move no data: ``permute``, ``transpose``/``swapaxes`` and
``t`` change only the mode order of the same level arrays."""
from __future__ import annotations

import torch

from .._dispatch import register
from ..tensor_type import SparseTensor, permute_view


@register(torch.permute, torch.Tensor.permute)
def _permute(t, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        dims = tuple(dims[0])
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = tuple(d % n if n else d for d in dims)
    if sorted(dims) != list(range(n)):
        raise RuntimeError(f"permute: dims {dims} are not a permutation of 0..{n - 1}")
    return permute_view(t, dims)


@register(torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes)
def _transpose(t, dim0, dim1):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = list(range(n))
    dims[dim0 % n], dims[dim1 % n] = dims[dim1 % n], dims[dim0 % n]
    return permute_view(t, dims)


@register(torch.t, torch.Tensor.t)
def _t(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if t.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
    return t if t.dim() < 2 else permute_view(t, (1, 0))
