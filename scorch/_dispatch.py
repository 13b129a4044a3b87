"""Which torch functions scorch runs sparsely, and what happens to the rest.

``register(torch_fn, ...)`` adds a handler that ``SparseTensor.__torch_function__`` calls
instead of torch. A handler may return ``NotImplemented`` to let torch take the call.

ATen ops that reach ``__torch_dispatch__`` run the handler registered with ``register_aten``
(the storage-level ones live in ``scorch.aten_ops``) or fall back to dense copies of the
sparse operands. The fallback is bounded: it runs only while the dense copies together stay
within ``get_dense_fallback_limit()`` bytes (default 64 MiB; ``set_dense_fallback_limit`` or
the environment variable ``SCORCH_DENSE_FALLBACK_LIMIT``), with a one-time warning naming the
op; past the limit it raises ``DenseFallbackError`` naming the op and the shapes, so nothing
silently allocates gigabytes. Mutating ops without a handler raise, because their result
could not stay sparse. This module is only the registry: it imports no other scorch module.
"""
from __future__ import annotations

import inspect
import os
import warnings
from typing import Any, Callable, Dict, Optional

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


#: numpy's keyword names that torch's argument parser takes for its own (``A.sum(axis=0,
#: keepdims=True)``); ``__torch_function__`` passes them on as written
NUMPY_KEYWORDS = {"axis": "dim", "keepdims": "keepdim"}
_takes_aliases: Dict[Callable, bool] = {}


def torch_keywords(handler: Callable, kwargs: dict) -> dict:
    """``kwargs`` with numpy's ``axis`` / ``keepdims`` renamed to ``dim`` / ``keepdim`` for
    ``handler``: handlers are written with torch's names, and the aliases crashed them with
    an unexpected keyword. Asked only when an alias is present (``tensor_type._run_handler``),
    so a call without one pays nothing; a handler that names an alias itself takes it as is."""
    own = _takes_aliases.get(handler)
    if own is None:
        try:
            own = not NUMPY_KEYWORDS.keys().isdisjoint(inspect.signature(handler).parameters)
        except (TypeError, ValueError):
            own = True
        _takes_aliases[handler] = own
    if own:
        return kwargs
    out = dict(kwargs)
    for alias, name in NUMPY_KEYWORDS.items():
        if alias in out:
            if name in out:
                raise TypeError(f"got both '{name}' and its numpy alias '{alias}'")
            out[name] = out.pop(alias)
    return out


def mirror_method_forms() -> list:
    """Give ``Tensor.X`` the handler of ``torch.X`` (and ``torch.X`` that of ``Tensor.X``)
    where only one form was registered: both put the tensor first, and a form left out
    had taken the dense fallback (``A.kron(B)`` while ``torch.kron(A, B)`` ran sparse).
    Called once every handler module is imported; returns the forms it added."""
    added = []
    for fn, handler in list(_HANDLERS.items()):
        name = getattr(fn, "__name__", None)
        if not name or name.startswith("__"):
            continue
        if getattr(torch, name, None) is fn:
            other = getattr(torch.Tensor, name, None)
        elif getattr(torch.Tensor, name, None) is fn:
            other = getattr(torch, name, None)
        else:
            continue
        if callable(other) and other not in _HANDLERS:
            _HANDLERS[other] = handler
            added.append(other)
    return added


def refusal(error: type, message: str):
    """A handler that raises ``error(message)``: an op scorch refuses by name (fused optimizer
    kernels, unsupported collectives) rather than one that fails deep in torch."""
    def handler(*args, **kwargs):
        raise error(message)
    return handler


def register_aten(*ops) -> Callable:
    def deco(handler: Callable) -> Callable:
        for op in ops:
            # an in-place (or out=) op's handler marks what it wrote (``_mark_written``),
            # decided once here rather than per call
            _ATEN_HANDLERS[op] = _marking(op, handler) if op._schema.is_mutable else handler
        return handler
    return deco


def _marking(op, handler: Callable) -> Callable:
    def marked(*args, **kwargs):
        out = handler(*args, **kwargs)
        _mark_written(op, args, kwargs)
        return out
    marked.__name__ = getattr(handler, "__name__", "handler")
    return marked


DEFAULT_DENSE_FALLBACK_LIMIT = 64 * 2**20
_ENV_LIMIT = "SCORCH_DENSE_FALLBACK_LIMIT"
_limit: Optional[int] = None     # None: read the environment (or the default) on first use


class DenseFallbackError(RuntimeError):
    """An op with no sparse kernel would need a dense copy larger than the fallback limit."""


def _parse_limit(value, source: str) -> int:
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a number of bytes, got {value!r}") from None
    if limit < 0:
        raise ValueError(f"{source} must be >= 0 bytes, got {limit}")
    return limit


def set_dense_fallback_limit(nbytes: Optional[int]) -> None:
    """Largest dense copy (bytes, all sparse operands of one op together) that an op with no
    sparse kernel may make. 0 forbids the fallback; ``None`` restores the default (or the
    ``SCORCH_DENSE_FALLBACK_LIMIT`` environment variable)."""
    global _limit
    _limit = None if nbytes is None else _parse_limit(nbytes, "the dense fallback limit")


def get_dense_fallback_limit() -> int:
    global _limit
    if _limit is None:
        env = os.environ.get(_ENV_LIMIT)
        _limit = DEFAULT_DENSE_FALLBACK_LIMIT if env in (None, "") else _parse_limit(env, _ENV_LIMIT)
    return _limit


def lookup(func) -> Callable | None:
    return _HANDLERS.get(func)


def _is_scorch_sparse(x) -> bool:
    # duck-typed (a SparseTensor carries ``_storage``), so the registry imports no tensor type
    return isinstance(x, torch.Tensor) and hasattr(x, "_storage")


def _densify(x):
    return x.to_dense() if _is_scorch_sparse(x) else x


def _sparse_operands(args, kwargs) -> list:
    found = []
    tree_map(lambda x: found.append(x) if _is_scorch_sparse(x) else None, (args, kwargs))
    return found


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _check_fallback_size(name: str, args, kwargs) -> None:
    sparse = _sparse_operands(args, kwargs)
    need = 0
    for x in sparse:
        n = x.element_size()
        for s in x.shape:
            n *= int(s)
        need += n
    limit = get_dense_fallback_limit()
    if need > limit:
        shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in sparse)
        raise DenseFallbackError(
            f"scorch: '{name}' has no sparse kernel; running it on dense copies of the sparse "
            f"operands ({shapes}) would allocate {_fmt_bytes(need)}, above the dense "
            f"fallback limit of {_fmt_bytes(limit)}. Use ops with sparse kernels (see "
            f"docs/ops.md), call .to_dense() explicitly, or raise the limit with "
            f"scorch.set_dense_fallback_limit(bytes) / ${_ENV_LIMIT}")


def check_dense_size(name: str, shape, dtype) -> None:
    """A result that is dense by nature (``exp`` of a sparse tensor) is allocated only below
    the same limit as the dense fallback; past it, an error names the op and the size."""
    n = torch.empty((), dtype=dtype).element_size()
    for s in shape:
        n *= int(s)
    limit = get_dense_fallback_limit()
    if n > limit:
        raise DenseFallbackError(
            f"scorch: '{name}' of a sparse tensor of shape {tuple(shape)} is dense by nature: "
            f"a dense array of that shape (its result, or the operand's dense copy it runs "
            f"on) would take {_fmt_bytes(n)}, above the dense limit of "
            f"{_fmt_bytes(limit)}; raise it with scorch.set_dense_fallback_limit(bytes) / "
            f"${_ENV_LIMIT} if you mean it")


def aten_fallback(cls, func, args, kwargs):
    handler = _ATEN_HANDLERS.get(func)
    if handler is not None:
        return handler(*args, **kwargs)
    return dense_fallback(func, args, kwargs)


#: ATen op -> the (position, name) of the arguments its schema says it writes
_WRITTEN: Dict[Any, tuple] = {}


def _written(func, args, kwargs):
    """The tensors an in-place or ``out=`` op writes (its schema's written arguments)."""
    written = _WRITTEN.get(func)
    if written is None:
        written = _WRITTEN[func] = tuple(
            (k, a.name) for k, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write)
    for k, name in written:
        x = args[k] if k < len(args) else kwargs.get(name)
        yield from (x if isinstance(x, (list, tuple)) else (x,))


def _writes_sparse(func, args, kwargs) -> bool:
    """Whether the op writes a sparse tensor (``A.sigmoid_()``); writing a dense one with a
    sparse operand (``d.masked_fill_(A > 0, v)``, ``d[A > 0] = v``) can run densified."""
    return any(getattr(t, "_storage", None) is not None for t in _written(func, args, kwargs))


def _mark_written(func, args, kwargs) -> None:
    """Move the version counter of the value arrays an in-place handler wrote. The handler
    runs below autograd's ADInplaceOrView key, so writing ``values`` (``addcmul_``,
    ``lerp_``, the ``_foreach_`` forms an optimizer calls) moved no counter, and the
    conversions kept by version (``kept_conversions``) and tensors saved for backward would
    read the old values as current."""
    for t in _written(func, args, kwargs):
        storage = getattr(t, "_storage", None)
        if storage is not None:
            torch.autograd.graph.increment_version(storage.values)


def dense_fallback(func, args, kwargs):
    """ATen op ``func`` on dense copies of its sparse operands, warned once per op (or
    refused past the dense limit; an in-place op is refused). Also for an ATen handler whose
    arguments it does not serve: a torch function scorch has no handler for reaches ATen in
    pieces (``torch.cov`` -> ``sub`` of a sparse and a dense operand)."""
    name = func.overloadpacket.__name__
    if func._schema.is_mutable and _writes_sparse(func, args, kwargs):
        raise RuntimeError(
            f"scorch: in-place '{name}' has no sparse handler for these arguments (an in-place op "
            f"keeps the sparse tensor's pattern, and this one could write outside it); use the "
            f"out-of-place form or .to_dense() first")
    _check_fallback_size(name, args, kwargs)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"scorch: '{name}' has no sparse kernel yet; it runs on a dense copy of the sparse "
            f"operand (correct, but memory and time follow the dense size; allowed up to "
            f"{_fmt_bytes(get_dense_fallback_limit())}, see scorch.set_dense_fallback_limit)",
            stacklevel=4)
    return func(*tree_map(_densify, args), **tree_map(_densify, kwargs))
