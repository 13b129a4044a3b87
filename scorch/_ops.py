"""Torch functions with sparse support, registered with the dispatcher.

Every op here lowers to the compiler (``scorch.tensor_compiler``); with only dense operands each
function is torch's own, unchanged.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._dispatch import register
from .formats import FormatLike
from .level_storage import Storage
from .tensor import SparseTensor, as_scorch, permute_view

__all__ = ["einsum", "explain", "cache_info", "cache_clear"]

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _equation_and_operands(args):
    """torch.einsum's call forms: (eq, *ops), (eq, [ops]) and the sublist form."""
    if args and isinstance(args[0], str):
        eq, ops = args[0], args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = tuple(ops[0])
        return eq, ops
    # sublist form: op1, [0, 1], op2, [1, 2], ..., [output]
    ops, subs = list(args[0::2]), list(args[1::2])
    out = None
    if len(args) % 2 == 1:
        out = args[-1]
        ops = ops[:-1]

    def letters(sub):
        return "".join("..." if s is Ellipsis else _LETTERS[s] for s in sub)
    eq = ",".join(letters(s) for s in subs) + ("" if out is None else "->" + letters(out))
    return eq, tuple(ops)


_compiler_module = None


def _compiler():
    # imported on first use (it brings in Cython only when a kernel is built) and kept:
    # an import statement on every call was ~2.5 us of a warm call
    global _compiler_module
    if _compiler_module is None:
        from . import tensor_compiler
        _compiler_module = tensor_compiler
    return _compiler_module


def einsum(*args: Any, out_format: Optional[FormatLike] = None) -> torch.Tensor:
    """torch.einsum over any mix of dense and sparse operands, compiled into one kernel.

    With only dense operands (and no ``out_format``) this is ``torch.einsum``."""
    if args and type(args[0]) is str and not (len(args) == 2 and isinstance(args[1], (list, tuple))):
        equation, operands = args[0], args[1:]
    else:
        equation, operands = _equation_and_operands(args)
    compiler = _compiler_module or _compiler()
    if out_format is None:
        # a warm call, whole, in C (tensor_compiler.fastcall): NotImplemented where it declines
        dispatch = compiler._DISPATCH[0]
        if dispatch is not None:
            result = dispatch(compiler._fast, equation, operands)
            if result is not NotImplemented:
                return result
    # the compiler reads torch's sparse layouts itself and hands dense-only calls to
    # torch.einsum, so a call goes straight there (each extra check cost ~1 us)
    result = compiler.einsum_declined(equation, tuple(operands), out_format)
    return SparseTensor(result) if type(result) is Storage else result


def explain(*args: Any, out_format: Optional[FormatLike] = None):
    """The compiler's plan for this einsum and these operands; nothing runs."""
    equation, operands = _equation_and_operands(args)
    compiler = _compiler()
    operands = tuple(as_scorch(x) for x in operands)
    return compiler.explain(equation, *operands, out_format=out_format)


def cache_info() -> dict:
    """Kernel cache: directory, kernels on disk and in memory, hits and misses."""
    build = _compiler().build
    return build.cache_info()


def cache_clear() -> None:
    build = _compiler().build
    build.cache_clear()


@register(torch.einsum)
def _torch_einsum(*args, **kwargs):
    return einsum(*args, **kwargs)


@register(torch.permute, torch.Tensor.permute)
def _permute(t, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        dims = tuple(dims[0])
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = tuple(d % n if n else d for d in dims)
    if sorted(dims) != list(range(n)):
        raise RuntimeError(f"permute: dims {dims} are not a permutation of 0..{n - 1}")
    return permute_view(t, dims)


@register(torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes)
def _transpose(t, dim0, dim1):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    n = t.dim()
    dims = list(range(n))
    dims[dim0 % n], dims[dim1 % n] = dims[dim1 % n], dims[dim0 % n]
    return permute_view(t, dims)


@register(torch.t, torch.Tensor.t)
def _t(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if t.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
    return t if t.dim() < 2 else permute_view(t, (1, 0))


@register(torch.Tensor.values)
def _values(t):
    return t.values() if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.indices, torch.Tensor._indices)
def _indices(t):
    return t.indices() if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.to_dense)
def _to_dense(t, dtype=None, *, masked_grad=None):
    return t.to_dense(dtype) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor._nnz)
def _nnz(t):
    return t.nnz if isinstance(t, SparseTensor) else NotImplemented
