"""Which torch functions scorch runs sparsely, and what happens to the rest.

``register(torch_fn, ...)`` adds a handler that ``SparseTensor.__torch_function__`` calls
instead of torch. A handler may return ``NotImplemented`` to let torch take the call.

ATen ops that reach ``__torch_dispatch__`` run the handler registered with ``register_aten``
(the storage-level ones live in ``scorch.aten_ops``) or run on dense copies with a one-time
warning (correct, but not sparse-fast: the warning tells the user which op to expect a
slowdown from). Mutating ops without a handler raise, because their result could not stay
sparse. This module is only the registry: it imports no other scorch module.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict

import torch
from torch.utils._pytree import tree_map

_HANDLERS: Dict[Any, Callable] = {}
_ATEN_HANDLERS: Dict[Any, Callable] = {}
_warned: set = set()

aten = torch.ops.aten


def register(*torch_functions) -> Callable:
    """Decorator: run ``handler`` when any of ``torch_functions`` sees a SparseTensor."""
    def deco(handler: Callable) -> Callable:
        for fn in torch_functions:
            _HANDLERS[fn] = handler
        return handler
    return deco


def register_aten(*ops) -> Callable:
    def deco(handler: Callable) -> Callable:
        for op in ops:
            _ATEN_HANDLERS[op] = handler
        return handler
    return deco


def lookup(func) -> Callable | None:
    return _HANDLERS.get(func)


def _densify(x):
    # duck-typed (a SparseTensor carries ``_storage``), so the registry imports no tensor type
    return x.to_dense() if isinstance(x, torch.Tensor) and hasattr(x, "_storage") else x


def aten_fallback(cls, func, args, kwargs):
    handler = _ATEN_HANDLERS.get(func)
    if handler is not None:
        return handler(*args, **kwargs)
    name = func.overloadpacket.__name__
    if func._schema.is_mutable:
        raise RuntimeError(
            f"scorch: in-place '{name}' is not supported on a sparse tensor (its result could "
            f"not stay sparse); use the out-of-place form or .to_dense() first")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"scorch: '{name}' has no sparse kernel yet; it runs on a dense copy of the sparse "
            f"operand (correct, but memory and time follow the dense size)", stacklevel=4)
    return func(*tree_map(_densify, args), **tree_map(_densify, kwargs))
