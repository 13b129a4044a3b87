"""Dropout on dense tensors, for ``scorch.nn.functional.dropout`` and ``scorch.nn.Dropout``.

torch's CPU dropout draws its mask with ``bernoulli_`` (one thread, ~25 ns an element) and
keeps it for the backward; at a Cora-scale GCN step that is 18 of 45 ms. Here the mask comes
from a counter-based RNG in one vectorized, multithreaded pass (``scorch._runtime.dropout``):
each call draws a 64-bit seed from torch's default generator (so ``torch.manual_seed`` makes
runs repeat), and the backward regenerates the same mask from that seed (dropout is its own
adjoint: the backward is the forward applied to the gradient). The distribution is torch's:
each element kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``; the masks
themselves differ from torch's for the same seed.

What this does not cover goes to torch's ``F.dropout`` unchanged: evaluation mode, ``p`` of 0
or 1, dtypes other than float32/float64, non-contiguous or non-CPU tensors, tensor
subclasses (a scorch ``SparseTensor`` then dispatches to ``scorch.sparse_ops.dropout``),
in-place dropout of a tensor that autograd records, and ``torch.compile`` tracing (Dynamo
traces torch's dropout in its place, so compiled masks are torch's, not this module's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as _F
from torch.autograd.graph import increment_version

from .._runtime.dropout import keep_threshold, mask_scale
from ..dynamo_rules import trace_instead
from ..tensor_compiler.threads import threads_for

__all__ = ["dropout", "Dropout", "scaled_mask"]

_DOUBLE = {torch.float32: False, torch.float64: True}
_is_compiling = torch.compiler.is_compiling


_tf_mode_on = torch._C._is_torch_function_mode_enabled
_jit_tracing = torch._C._get_tracing_state


def _covered(input, p, training) -> bool:
    """The fast mask applies: a dense float CPU tensor in training, and nothing around the
    call that must see torch's own op: a compile, ``torch.jit.trace`` (the seed drawn here
    would be recorded as a constant: one mask for every call), a function mode (``make_fx``,
    a ``torch.device("meta")`` default, where the seed tensor would land)."""
    return (type(input) is torch.Tensor and training and 0.0 < p < 1.0
            and input.dtype in _DOUBLE and input.layout is torch.strided
            and input.device.type == "cpu" and input.is_contiguous() and not _is_compiling()
            and not _tf_mode_on() and _jit_tracing() is None)


def _draw_seed() -> int:
    """A 64-bit seed from torch's default generator."""
    return int(torch.empty((), dtype=torch.int64).random_())


def _mask_scale(x: torch.Tensor, out: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    if x._is_zerotensor():     # a gradient of zeros with no memory (sgn's): zeros out
        return torch.zeros(x.shape, dtype=x.dtype) if out._is_zerotensor() or out is x else out.zero_()
    n = x.numel()
    mask_scale(x.data_ptr(), out.data_ptr(), n, _DOUBLE[x.dtype], seed, keep_threshold(1.0 - p),
               1.0 / (1.0 - p), threads_for(n))
    return out


def scaled_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """A tensor shaped like ``like`` holding ``1 / (1 - p)`` where kept and 0 where dropped
    (``0 < p < 1``): scorch's sparse dropout multiplies the stored values by it."""
    if like.dtype in _DOUBLE and like.device.type == "cpu" and not _is_compiling():
        ones = torch.ones(like.shape, dtype=like.dtype)
        return _mask_scale(ones, ones, _draw_seed(), p)
    return torch.empty_like(like).bernoulli_(1.0 - p).div_(1.0 - p)


class _DropoutFunction(torch.autograd.Function):
    """``x * mask / (1 - p)`` with the mask a function of ``seed``; backward: the same on the
    gradient (so double backward works too)."""

    @staticmethod
    def forward(ctx, x, seed, p):
        ctx.seed, ctx.p = seed, p
        return _mask_scale(x, torch.empty_like(x), seed, p)

    @staticmethod
    def backward(ctx, grad):
        return _DropoutFunction.apply(grad.contiguous(), ctx.seed, ctx.p), None, None


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> torch.Tensor:
    """``torch.nn.functional.dropout``, with the fast mask for dense float CPU tensors."""
    if not _covered(input, p, training) or (inplace and input.requires_grad
                                            and torch.is_grad_enabled()):
        return _F.dropout(input, p, training, inplace)
    seed = _draw_seed()
    if inplace:   # bump the version as torch's in-place ops do: a saved copy then fails loudly
        _mask_scale(input, input, seed, p)
        increment_version(input)
        return input
    return _DropoutFunction.apply(input, seed, p)


class Dropout(torch.nn.Dropout):
    """``torch.nn.Dropout`` through :func:`dropout` (an instance is a ``torch.nn.Dropout``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return dropout(input, self.p, self.training, self.inplace)


# torch.compile traces torch's dropout in their place (scorch's code is opaque to Dynamo:
# scorch.dynamo_rules), so a compiled model keeps its dropout in the graph
def _traced_dropout(input, p=0.5, training=True, inplace=False):
    return _F.dropout(input, p, training, inplace)


def _traced_forward(self, input):
    return _F.dropout(input, self.p, self.training, self.inplace)


trace_instead(dropout, _traced_dropout)
trace_instead(Dropout.forward, _traced_forward)
