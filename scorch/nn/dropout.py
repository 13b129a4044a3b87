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
or 1, dtypes other than float32/float64, non-contiguous or non-CPU tensors, small tensors
(:data:`MIN_NUMEL`, below), tensor subclasses (a scorch ``SparseTensor`` then dispatches to
``scorch.sparse_ops.dropout``), in-place dropout of a tensor that autograd records, and every
program transform: ``torch.compile`` (Dynamo traces torch's dropout in its place, so compiled
masks are torch's, not this module's), ``torch.func`` transforms (per-sample seeds under
``vmap(randomness=...)``, a ``grad`` level), forward-mode AD, ``torch.fx`` and ``torch.jit``
tracing and TorchScript.

``Dropout`` is a subclass of ``torch.nn.Dropout`` that behaves as torch's class towards torch's
tools: ``torch.fx`` records it as one ``call_module`` leaf (its ``training`` flag is read when the
graph runs, so ``gm.eval()`` stops dropping), TorchScript compiles torch's dropout for it, and
``torch.save(model)`` pickles it as ``torch.nn.Dropout``, so a saved model loads where scorch
is not imported (loaded, it is torch's module, with torch's masks).
"""
from __future__ import annotations

import copy
import copyreg

import torch
import torch.nn.functional as _F
import torch.fx._symbolic_trace as _fx_trace
from torch.autograd.graph import increment_version

from .._runtime.dropout import keep_threshold, mask_scale
from ..dynamo_rules import trace_instead
from ..tensor_compiler.threads import threads_for

__all__ = ["dropout", "Dropout", "scaled_mask"]

_DOUBLE = {torch.float32: False, torch.float64: True}
_is_compiling = torch.compiler.is_compiling
_tf_mode_on = torch._C._is_torch_function_mode_enabled
_jit_tracing = torch._C._get_tracing_state
_functorch_stack = torch._C._functorch.peek_interpreter_stack
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
_FWAD = torch.autograd.forward_ad

#: the fewest elements the fast mask takes, for an input autograd records (forward and
#: backward) and for one it does not (forward only). Below them the Python autograd node and
#: the seed draw cost more than ``bernoulli_`` does: float32, 1 thread, CPU time on a shared
#: 2-core VM, scorch / torch, fwd + bwd of ``y.sum()``: 128 elements 76 / 46 us, 4096: 77 / 81,
#: 8192: 80 / 103, 65536: 143 / 516; forward alone: 1024: 13 / 13, 2048: 13 / 20
MIN_NUMEL_GRAD = 4096
MIN_NUMEL = 1024
# (an empty input still takes the fast path: its result is a new empty tensor, where torch's
# dropout returns the input itself; tests/test_nn_dropout.py asserts a new tensor)


def _covered(input, p, training) -> bool:
    """The fast mask applies: a dense float CPU tensor in training, big enough to gain, and
    nothing around the call that must see torch's own op: a compile, ``torch.jit.trace`` (the
    seed drawn here would be recorded as a constant: one mask for every call), a function mode
    (``make_fx``, a ``torch.device("meta")`` default, where the seed tensor would land), a
    ``torch.func`` transform (``vmap`` draws per-sample masks, ``grad``/``jvp`` need a function
    they can transform), an open forward-AD level (no ``jvp`` here), ``torch.fx`` tracing."""
    return (type(input) is torch.Tensor and training and 0.0 < p < 1.0
            and input.dtype in _DOUBLE and input.layout is torch.strided
            and input.is_cpu and input.is_contiguous() and _jit_tracing() is None
            and not 0 < input.numel() < (MIN_NUMEL_GRAD if input.requires_grad else MIN_NUMEL)
            and not _is_compiling() and not _tf_mode_on() and _functorch_stack() is None
            and _FWAD._current_level < 0 and not _fx_trace._is_fx_tracing_flag)


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


def _mask_of(seed: int, like: torch.Tensor, p: float) -> torch.Tensor:
    """The mask of ``seed`` (``1 / (1 - p)`` where kept, 0 where dropped) shaped like ``like``."""
    ones = torch.ones(like.shape, dtype=like.dtype)
    return _mask_scale(ones, ones, seed, p)


def scaled_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """A tensor shaped like ``like`` holding ``1 / (1 - p)`` where kept and 0 where dropped
    (``0 < p < 1``): scorch's sparse dropout multiplies the stored values by it."""
    if like.dtype in _DOUBLE and like.device.type == "cpu" and not _is_compiling():
        return _mask_of(_draw_seed(), like, p)
    return torch.empty_like(like).bernoulli_(1.0 - p).div_(1.0 - p)


class _DropoutFunction(torch.autograd.Function):
    """``x * mask / (1 - p)`` with the mask a function of ``seed``; backward: the same on the
    gradient."""

    @staticmethod
    def forward(ctx, x, seed, p):
        ctx.seed, ctx.p = seed, p
        return _mask_scale(x, torch.empty_like(x), seed, p)

    @staticmethod
    def backward(ctx, grad):
        if (torch.is_grad_enabled() or type(grad) is not torch.Tensor
                or _functorch_wrapped(grad) or _legacy_batched(grad)):
            # a double backward, or a gradient batched by torch (``is_grads_batched``, a
            # vectorized jacobian): the mask as a tensor, times the gradient by torch's mul
            return grad * _mask_of(ctx.seed, grad, ctx.p), None, None
        grad = grad.contiguous()
        return _mask_scale(grad, torch.empty_like(grad), ctx.seed, ctx.p), None, None


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> torch.Tensor:
    """``torch.nn.functional.dropout``, with the fast mask for dense float CPU tensors."""
    if torch.jit.is_scripting():   # TorchScript compiles torch's op, never the Python below
        return _F.dropout(input, p, training, inplace)
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
    """``torch.nn.Dropout`` through :func:`dropout` (an instance is a ``torch.nn.Dropout``), seen
    by torch's tools as torch's class (the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return _F.dropout(input, self.p, self.training, self.inplace)
        if isinstance(input, torch.fx.Proxy):
            # fx traces into modules outside ``torch.nn``: record this one as torch.nn.Dropout
            # is recorded, a leaf whose ``training`` is read when the graph runs
            tracer = input.tracer
            return tracer.create_proxy("call_module", tracer.path_of_module(self), (input,), {})
        return dropout(input, self.p, self.training, self.inplace)

    def __reduce_ex__(self, protocol):
        # pickled as torch.nn.Dropout with the same state (copyreg's rebuilder, as protocols 0
        # and 1 pickle any object): torch.save(model) then loads without scorch. A user's
        # subclass keeps its own class
        if type(self) is not Dropout:
            return super().__reduce_ex__(protocol)
        return copyreg._reconstructor, (torch.nn.Dropout, object, None), self.__getstate__()

    # copies keep the class (the default copy goes through __reduce_ex__)
    def __copy__(self):
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        return new

    def __deepcopy__(self, memo):
        new = memo[id(self)] = type(self).__new__(type(self))
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return new


# torch.compile traces torch's dropout in their place (scorch's code is opaque to Dynamo:
# scorch.dynamo_rules), so a compiled model keeps its dropout in the graph
def _traced_dropout(input, p=0.5, training=True, inplace=False):
    return _F.dropout(input, p, training, inplace)


def _traced_forward(self, input):
    return _F.dropout(input, self.p, self.training, self.inplace)


trace_instead(dropout, _traced_dropout)
trace_instead(Dropout.forward, _traced_forward)
