"""Dropout on a sparse tensor: each stored entry is kept with probability ``1 - p`` and scaled
by ``1 / (1 - p)``; unstored entries are zero either way, so this is dense dropout's
distribution at a cost that follows the stored entries. The result keeps the pattern (a
dropped entry is a stored zero), so a layer's next product reuses the same index arrays, and
it is ``x * mask`` through the elementwise handler: differentiable like any product. The
mask comes from dense dropout's kernel (``scorch.nn.dropout.scaled_mask``), not torch's
single-threaded bernoulli."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..nn.dropout import scaled_mask
from ..tensor_type import SparseTensor, as_scorch, with_values

__all__ = ["dropout"]


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> torch.Tensor:
    """``F.dropout`` over the stored entries of a sparse ``input``."""
    x = as_scorch(input)
    if not isinstance(x, SparseTensor):
        return NotImplemented
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    values = x._storage.values
    if p == 1.0:
        keep = torch.zeros_like(values)
    else:
        keep = scaled_mask(values, p)
    if inplace:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("scorch: in-place dropout of a sparse tensor that requires "
                               "grad; use inplace=False")
        values.mul_(keep)
        return x
    return torch.mul(x, with_values(x, keep))


@register(F.dropout, torch.dropout, torch.nn.functional.dropout)
def _dropout(input, p=0.5, training=True, inplace=False):
    return dropout(input, p, training, inplace)
