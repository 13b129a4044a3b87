"""Which torch functions scorch runs sparsely, and what happens to the rest.

``register(torch_fn, ...)`` adds a handler that ``SparseTensor.__torch_function__`` calls
instead of torch. A handler may return ``NotImplemented`` to let torch take the call.

ATen ops that reach ``__torch_dispatch__`` are either storage-level ops done on the level
arrays (detach, alias, clone, casts, copy_) or run on dense copies with a one-time warning
(correct, but not sparse-fast: the warning tells the user which op to expect a slowdown
from). Mutating ops other than copy_ raise, because their result could not stay sparse.
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
    from .tensor import SparseTensor
    return x.to_dense() if isinstance(x, SparseTensor) else x


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


# --- storage-level ATen ops --------------------------------------------------------------

@register_aten(aten.detach.default, aten.alias.default)
def _detach(t):
    from .tensor import SparseTensor
    return SparseTensor(t._storage)


@register_aten(aten.clone.default)
def _clone(t, memory_format=None):
    from .tensor import _clone as clone
    return clone(t)


@register_aten(aten._to_copy.default)
def _to_copy(t, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    from .tensor import SparseTensor, with_values
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError(f"scorch: sparse tensors live on the CPU; cannot move to {device}")
    if layout is not None and layout is torch.strided:
        out = t.to_dense()
        return out if dtype is None else out.to(dtype)
    values = t._storage.values
    if dtype is not None and dtype != values.dtype:
        values = values.to(dtype)
    else:
        values = values.clone()
    return with_values(t, values)


@register_aten(aten.copy_.default)
def _copy_(self, src, non_blocking=False):
    """In-place copy (load_state_dict, optimizer updates): self takes src's values, in
    self's format and dtype."""
    from .tensor import SparseTensor, with_values
    from . import constructors
    if tuple(src.shape) != tuple(self.shape):
        raise RuntimeError(f"copy_: shape {tuple(src.shape)} does not match the sparse "
                           f"tensor's shape {tuple(self.shape)}")
    new = constructors.sparse_tensor(src, format=self._storage.format)
    st = new._storage
    if st.dtype != self.dtype:
        st = with_values(new, st.values.to(self.dtype))._storage
    self._storage = st
    return self


@register_aten(aten._to_dense.default, aten.to_dense.default)
def _to_dense(t, dtype=None, masked_grad=None):
    return t.to_dense(dtype)


@register_aten(aten._nnz.default)
def _nnz(t):
    return t._storage.nnz


@register_aten(aten.is_same_size.default)
def _is_same_size(a, b):
    return tuple(a.shape) == tuple(b.shape)
