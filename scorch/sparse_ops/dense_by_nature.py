"""Ops whose result is dense whatever the operand's sparsity (JAX sparse's "densifying"
column): a running sum (``cumsum``), ``1 / x`` at the zeros (``reciprocal``), a loss over every
position (``mse_loss``, ``cross_entropy``), a normalisation over every element
(``layer_norm``), ``isclose(0, 0)``. Their cost is the dense result's, so they run torch's own
op on the sparse operand's dense copy; unlike the generic fallback they are differentiable
(through ``to_dense``: the gradient comes back on the stored entries) and say nothing, as an
op that is meant to be dense. The dense-size limit still holds (``check_dense_size``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .._dispatch import check_dense_size, register
from ..tensor_type import SparseTensor

__all__ = ["DENSE_BY_NATURE"]

#: torch functions whose result is dense by nature (every position of the result depends on
#: every implicit zero of the operand, or maps 0 elsewhere)
DENSE_BY_NATURE = (
    torch.cumsum, torch.Tensor.cumsum, torch.cumprod, torch.Tensor.cumprod,
    torch.logcumsumexp, torch.Tensor.logcumsumexp, torch.logsumexp, torch.Tensor.logsumexp,
    torch.reciprocal, torch.Tensor.reciprocal, torch.rsqrt, torch.Tensor.rsqrt,
    torch.cosh, torch.Tensor.cosh, torch.acos, torch.Tensor.acos, torch.exp2, torch.Tensor.exp2,
    torch.erfc, torch.Tensor.erfc, torch.isclose, torch.Tensor.isclose, torch.isfinite,
    torch.Tensor.isfinite, torch.matrix_exp,
    torch.linalg.matrix_exp, torch.ones_like,
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.cross_entropy, F.nll_loss,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.kl_div, F.layer_norm,
)


def _densified(name: str):
    def dense(x):
        if isinstance(x, SparseTensor):
            check_dense_size(name, x.shape, x.dtype)
            return x.to_dense()          # differentiable: the gradient returns to the pattern
        return x
    return dense


def _handler(fn):
    name = getattr(fn, "__name__", str(fn))

    def handler(*args, **kwargs):
        found = []
        tree_map(lambda x: found.append(x) if isinstance(x, SparseTensor) else None, (args, kwargs))
        if not found:
            return NotImplemented
        args, kwargs = tree_map(_densified(name), (args, kwargs))
        return fn(*args, **kwargs)
    return handler


for _fn in DENSE_BY_NATURE:
    register(_fn)(_handler(_fn))
