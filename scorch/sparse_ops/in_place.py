"""In-place elementwise functions that keep 0 at 0 (``x.relu_()``, ``x.abs_()``,
``x.clamp_(-1, 1)``, ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``, ...): torch's own
in-place op on the stored values, so the pattern and every view of it stay, and the values
come out exactly as the dense op's. One that moves 0 (``sigmoid_``, ``clamp_(min=1)``) could
not keep the tensor sparse and raises, naming the op.

Under autograd the tensor's history is rebased as torch's in-place ops do (``mark_dirty``):
the backward is the out-of-place op's derivative at the values before the change (kept for
it), and a tensor that an earlier op saved for its backward raises torch's "modified by an
inplace operation" error when that backward runs (the values' version counter moved)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..gradients.values import from_values, grad_values, mark_gradient
from ..tensor_type import SparseTensor

__all__ = ["run_in_place"]

Op = Callable[[torch.Tensor], torch.Tensor]


class _InPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: SparseTensor, mutate: Op, op: Op) -> SparseTensor:
        before = s._storage.values.clone()
        ctx.save_for_backward(before)
        ctx.op, ctx.pattern = op, s._storage
        mutate(s._storage.values)
        ctx.mark_dirty(s)
        return s

    @staticmethod
    def backward(ctx, g):
        before, = ctx.saved_tensors
        wanted = grad_values(ctx.pattern, g)
        with torch.enable_grad():
            v = before.detach().requires_grad_()
            out = ctx.op(v)
            grad, = torch.autograd.grad(out, v, wanted.to(out.dtype), allow_unused=True)
        if grad is None:                  # a piecewise-constant op (floor_, sign_): no gradient
            grad = torch.zeros_like(before)
        return mark_gradient(from_values(ctx.pattern, grad)), None, None


def run_in_place(name: str, s: SparseTensor, mutate: Op, op: Op) -> SparseTensor:
    """``mutate`` (torch's in-place op) on ``s``'s stored values when ``op`` (its
    out-of-place form) keeps 0 at 0; ``s`` itself is returned, as torch's in-place ops do."""
    values = s._storage.values
    zero = op(torch.zeros(1, dtype=values.dtype))
    if not bool((zero == 0).all()):
        raise RuntimeError(
            f"scorch: in-place '{name}' maps 0 to {zero.item()}, so its result could not stay "
            f"sparse; use the out-of-place form (a dense result) or .to_dense() first")
    if torch.is_grad_enabled() and s.requires_grad:
        return _InPlace.apply(s, mutate, op)
    mutate(values)
    return s


def _method(name: str):
    """``Tensor.<name>_(*args)`` (and ``torch.<name>_`` where torch has it)."""
    in_place, pure = getattr(torch.Tensor, name + "_"), getattr(torch.Tensor, name)

    def handler(x, *args, **kwargs):
        if not isinstance(x, SparseTensor) or x._storage.format.block is not None:
            return NotImplemented
        return run_in_place(name + "_", x, lambda v: in_place(v, *args, **kwargs),
                            lambda v: pure(v, *args, **kwargs))
    fns = [in_place] + ([getattr(torch, name + "_")] if hasattr(torch, name + "_") else [])
    register(*fns)(handler)
    return fns


#: Tensor methods whose in-place form runs on the stored values (the zero check decides per
#: call: ``clamp_(-1, 1)`` runs, ``clamp_(1)`` raises)
METHODS = ("relu", "abs", "absolute", "sqrt", "sin", "tanh", "sign", "sgn", "square", "expm1",
           "log1p", "erf", "erfinv", "atan", "arctan", "floor", "ceil", "trunc", "fix", "frac",
           "asin", "arcsin", "asinh", "arcsinh", "atanh", "arctanh", "sinh", "tan", "deg2rad",
           "rad2deg", "round", "neg", "negative", "clamp", "clip", "clamp_min", "clamp_max",
           "nan_to_num", "pow", "sigmoid", "exp", "cos", "log")
REGISTERED = [fn for name in METHODS for fn in _method(name)]


def _functional(name: str):
    """``F.<name>_(x, ...)``: F.<name>(x, ..., inplace=True)."""
    pure = getattr(F, name)

    def handler(x, *args, **kwargs):
        if not isinstance(x, SparseTensor):
            return NotImplemented
        return in_place_functional(name, pure, x, args, kwargs)
    register(getattr(F, name + "_"))(handler)
    return getattr(F, name + "_")


def in_place_functional(name: str, pure, x: SparseTensor, args, kwargs) -> SparseTensor:
    """``pure(x, *args, inplace=True, **kwargs)`` of torch.nn.functional on a sparse ``x``."""
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    return run_in_place(name + "_", x, lambda v: pure(v, *args, inplace=True, **kwargs),
                        lambda v: pure(v, *args, **kwargs))


# (not rrelu: its training slopes are random, so the backward could not recompute them)
REGISTERED += [_functional(n) for n in ("relu", "leaky_relu", "elu", "hardtanh", "threshold",
                                        "celu", "selu")]
