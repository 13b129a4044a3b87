"""Dropout on a sparse tensor: each stored entry is kept with probability ``1 - p`` and scaled
by ``1 / (1 - p)``; unstored entries are zero either way, so this is dense dropout's
distribution at a cost that follows the stored entries. The result keeps the pattern (a
dropped entry is a stored zero), so a layer's next product reuses the same index arrays, and
it is ``x * mask`` through the elementwise handler: differentiable like any product. The
mask comes from dense dropout's kernel (``scorch.nn.dropout.scaled_mask``), not torch's
single-threaded bernoulli."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from .._dispatch import check_dense_size, register
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


def _channel_dropout(name: str, spatial: int):
    """``F.dropout1d/2d/3d``: whole channels zeroed, each kept with probability ``1 - p``
    and scaled by ``1 / (1 - p)``, as torch's: ``x`` times a dense mask of one value per
    (batch, channel), broadcast over the ``spatial`` trailing dims; the result keeps ``x``'s
    pattern (a product)."""
    def handler(input, p=0.5, training=True, inplace=False):
        x = as_scorch(input)
        if not isinstance(x, SparseTensor) or inplace:
            return NotImplemented
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if x.dim() not in (spatial + 1, spatial + 2):
            raise RuntimeError(f"{name}: Expected {spatial + 1}D or {spatial + 2}D input, but "
                               f"received a {x.dim()}D input")
        if not training or p == 0.0:
            return x
        per = spatial
        if name == "dropout2d" and x.dim() == 3:      # torch reads it as (N, C, L), and says so
            warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise "
                          "1D dropout behavior is desired - input is interpreted as shape (N, C, L), "
                          "where C is the channel dim.", stacklevel=3)
            per = 1
        shape = tuple(x.shape[:x.dim() - per]) + (1,) * per
        keep = torch.empty(shape, dtype=x.dtype).bernoulli_(1 - p).div_(1 - p) if p < 1 \
            else torch.zeros(shape, dtype=x.dtype)
        return x * keep
    return handler


register(F.dropout1d)(_channel_dropout("dropout1d", 1))
register(F.dropout2d)(_channel_dropout("dropout2d", 2))
register(F.dropout3d)(_channel_dropout("dropout3d", 3))


def _alpha_dropout(fn):
    """Alpha dropout sets dropped entries to a non-zero value: dense by nature in training
    (the dense-size limit holds); in evaluation it is the identity."""
    def handler(input, p=0.5, training=False, inplace=False):
        x = as_scorch(input)
        if not isinstance(x, SparseTensor):
            return NotImplemented
        if not training or p == 0.0:
            return x
        check_dense_size(fn.__name__, x.shape, x.dtype)
        return fn(x.to_dense(), p, training, inplace)
    return handler


register(F.alpha_dropout)(_alpha_dropout(F.alpha_dropout))
register(F.feature_alpha_dropout)(_alpha_dropout(F.feature_alpha_dropout))
