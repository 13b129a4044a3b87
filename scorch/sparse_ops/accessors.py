"""torch's sparse accessors on a SparseTensor: ``values``, ``indices``, ``to_dense``, ``_nnz``."""
from __future__ import annotations

import torch

from .._dispatch import register
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
