"""Inside a torch optimizer's ``step()`` (autograd off), a sparse parameter's state lives on
its pattern: an op of a sparse tensor with a scalar that does not keep 0 at 0
(``square_avg.add(eps)``, ``full_like(grad, lr)``, ``sign.eq(0)``, ``clamp_(1e-6, 50)``,
``sign[sign.eq(0)] = 1``) acts on the stored values only, as torch's ``SparseAdam`` reads
``grad._values()``. That gives the same parameters as dense training restricted to the
pattern, because every torch optimizer's update is elementwise and 0 where the gradient is 0
(the gradient of a sparse parameter is 0 off its pattern): what the state holds there is
never read into the parameter. So Adadelta and Rprop keep a sparse parameter sparse, at a
cost that follows its stored entries.

Outside a step, or with autograd on (a closure computing the loss inside ``step``), the same
ops keep their dense meaning, and so do the user's step hooks (run by the same wrapper
as the step, but not inside it). The step is found by global optimizer step hooks; one that
raised (its post hook never ran) is noticed because its frame is no longer on the stack.
The hooks run for every optimizer of the process (``import scorch`` in a dense program
too), so a step of an optimizer without a sparse parameter costs them ~1 us: it is told
apart at ~10 ns a parameter, in C, and its gradients are not walked."""
from __future__ import annotations

import sys
import threading
from typing import List

import torch
from torch._C import _has_torch_function, _is_torch_function_enabled as _torch_function_enabled
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from ..conversion import dense_on_pattern
from ..tensor_type import SparseTensor
from .pattern import same_pattern, values_on_pattern
from .values import mark_gradient

__all__ = ["values_level"]

_state = threading.local()
#: how far below the step's frame an op may run (step -> functional optimizer -> tensor
#: method -> __torch_function__ -> handler -> here, ~10 frames; room for deep custom steps)
_MAX_DEPTH = 200
_UNREAD = object()   # a step entry's step code, before values_level reads it


def _frames() -> List[list]:
    """This thread's open steps: [id of the wrapper's frame, its code, the step's code]."""
    frames = getattr(_state, "frames", None)
    if frames is None:
        frames = _state.frames = []
    return frames


def _gradients_on_pattern(optimizer) -> None:
    """A sparse parameter whose ``.grad`` is not on its pattern: a dense ``.grad`` assigned by
    hand, or a sparse one of another pattern (kept through ``zero_grad(set_to_none=False)``
    across a pruning, ``p.data = ...``: autograd adds the new gradient into it as their
    union). Zero off the parameter's pattern, it becomes the gradient on that pattern it
    is; a non-zero off the pattern could not be applied to the parameter in place, so the
    step refuses it, naming the parameter (the update's first op used to fail with a
    message about ``lerp_`` or ``add_``)."""
    states = optimizer.state
    for g, group in enumerate(optimizer.param_groups):
        for k, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None or not isinstance(p, SparseTensor):
                continue
            state = states.get(p)
            if state:
                _state_in_format(state, p._storage.format)
            if isinstance(grad, SparseTensor):
                if same_pattern(p._storage, grad._storage):
                    # a gradient of the stored values already, though maybe built by hand
                    # (``p.grad = scorch.sparse_tensor(...)``): flagged as one, or torch's
                    # optimizers take it for a torch sparse gradient and refuse it
                    mark_gradient(grad)
                    continue
                values = values_on_pattern(p._storage, grad._storage) \
                    if tuple(grad.shape) == tuple(p.shape) else None
                if values is not None and int(torch.count_nonzero(values)) != \
                        int(torch.count_nonzero(grad._storage.values)):
                    values = None
                kind = "a sparse tensor of another pattern"
            else:
                values = dense_on_pattern(p._storage, grad) if tuple(grad.shape) == tuple(p.shape) else None
                kind = "a dense tensor"
            if values is None:
                raise RuntimeError(
                    f"{type(optimizer).__name__}.step(): parameter {k} of group {g} is sparse "
                    f"(shape {tuple(p.shape)}, {p._storage.nnz} stored) but its .grad is {kind} "
                    f"of shape {tuple(grad.shape)} with non-zeros outside the parameter's "
                    f"pattern; a sparse parameter's gradient lives on its pattern (assign a sparse "
                    f"gradient on it, or mask the gradient to the pattern)")
            p.grad = mark_gradient(SparseTensor(p._storage.on_pattern(values.to(p.dtype).contiguous())))


def _state_in_format(state: dict, fmt) -> None:
    """A sparse parameter's optimizer state in another format than the parameter's (a
    checkpoint saved from a CSR model, loaded into the same model built as COO or CSC:
    ``load_state_dict`` casts dtype and device, not format) is converted once, here; each
    update's first op raised that the pattern differed, though only the format did."""
    for key, v in state.items():
        if type(v) is SparseTensor and v._storage.format is not fmt and v._storage.format != fmt:
            state[key] = v.to_format(fmt)


def _holds_sparse(optimizer) -> bool:
    """Whether the optimizer has a sparse parameter, asked at every step of every optimizer.
    A walk over the parameters in Python cost a dense step 16-22 % (200 ns a parameter);
    torch's C check for ``__torch_function__`` overrides is False for plain tensors and
    ``nn.Parameter`` (torch's disabled override) at ~10 ns a parameter. It is not cached:
    ``param_groups`` can change in place between steps. A True (a SparseTensor, another
    tensor subclass, a TorchFunctionMode on) or overrides switched off: the exact walk."""
    exact = not _torch_function_enabled()
    for group in optimizer.param_groups:
        params = group["params"]
        if (exact or _has_torch_function(params)) and \
                any(isinstance(p, SparseTensor) for p in params):
            return True
    return False


def _enter(optimizer, args, kwargs) -> None:
    if _holds_sparse(optimizer):
        _gradients_on_pattern(optimizer)
    # the frame of torch's wrapper (``Optimizer.profile_hook_step``), which runs the hooks
    # and then the step itself, ``func``: only code under ``func`` is inside the step
    # Kept by id and code, not the frame object: a step that raises never runs the post
    # hook, and a kept frame would hold the optimizer and the model for good. Entries of
    # such steps (not on the stack now) go here. ``func`` is read from the wrapper's locals
    # by the first ``values_level`` of the step: ``f_locals`` costs every dense step ~1 us.
    wrapper = sys._getframe(1)
    frames = _frames()
    if frames:
        active, f = set(), wrapper
        while f is not None:
            active.add(id(f))
            f = f.f_back
        frames[:] = [e for e in frames if e[0] in active]
    frames.append([id(wrapper), wrapper.f_code, _UNREAD])


def _leave(optimizer, args, kwargs) -> None:
    """Drop this step's entry, and those of steps nested in it that raised."""
    frames = getattr(_state, "frames", None)
    if frames:
        wrapper = id(sys._getframe(1))
        if frames[-1][0] == wrapper:
            frames.pop()
            return
        for i in range(len(frames) - 2, -1, -1):
            if frames[i][0] == wrapper:
                del frames[i:]
                return


def values_level() -> bool:
    """True while an optimizer step runs on this thread with autograd off."""
    frames = getattr(_state, "frames", None)
    if not frames or torch.is_grad_enabled():
        return False
    entry = frames[-1]
    wrapper, wrapper_code, step_code = entry
    f, below = sys._getframe(1), None
    for _ in range(_MAX_DEPTH):
        if f is None:
            break
        if id(f) == wrapper and f.f_code is wrapper_code:   # under the step, not a hook
            if step_code is _UNREAD:
                step_code = entry[2] = getattr(f.f_locals.get("func"), "__code__", None)
            return below is not None and (step_code is None or below.f_code is step_code)
        f, below = f.f_back, f
    frames.clear()                          # left behind by a step that raised
    return False


register_optimizer_step_pre_hook(_enter)
register_optimizer_step_post_hook(_leave)
