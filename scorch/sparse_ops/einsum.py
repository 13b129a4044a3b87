"""``einsum`` and ``explain``: the compiler's entry for users (``torch.einsum`` with a sparse
operand lands here too). With only dense operands ``einsum`` is torch's own, unchanged."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.backends.opt_einsum  # noqa: F401  (read as torch.einsum reads it)

from .._dispatch import register
from ..dynamo_rules import script_as_builtin
from ..compiler_access import compiler
from ..formats import FormatLike
from ..level_storage import Storage
from .. import tensor_type as _tensor_type
from ..tensor_type import SparseTensor, is_sparse_operand

__all__ = ["einsum", "explain"]

_NO_OPERANDS = ("einsum(): must specify the equation string and at least one operand, "
                "or at least one operand and its subscripts list")   # torch's words


def _subscript(n) -> str:
    """A subscript of the sublist form as torch reads it: 0-25 are 'A'-'Z', 26-51 'a'-'z'
    (with the letters swapped, implicit-output mode ordered a mix of both the other way: a
    transposed result), ``...`` an ellipsis; anything else is torch's ValueError."""
    if n == Ellipsis:
        return "..."
    if 0 <= n < 26:
        return chr(ord("A") + n)
    if 26 <= n < 52:
        return chr(ord("a") + n - 26)
    raise ValueError("einsum(): subscript in subscript list is not within the valid range [0, 52)")


def _equation_and_operands(args):
    """torch.einsum's call forms, read as torch reads them and with its errors: (eq, *ops),
    (eq, [ops]) and the sublist form op1, [0, 1], op2, [1, 2], ..., [output]."""
    if len(args) < 2:
        raise ValueError(_NO_OPERANDS)
    if not isinstance(args[0], torch.Tensor):
        if not isinstance(args[0], str):
            raise TypeError(f"einsum(): argument 'equation' (position 1) must be str, not "
                            f"{type(args[0]).__name__}")
        eq, ops = args[0], args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = tuple(ops[0])
            if not ops:
                raise ValueError(_NO_OPERANDS)
        return eq, ops
    eq = ",".join("".join(map(_subscript, sub)) for sub in args[1::2])
    if len(args) % 2 == 1:    # the output's subscripts close the list
        return eq + "->" + "".join(map(_subscript, args[-1])), args[:-1:2]
    return eq, args[::2]


_compiler_module = None
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _compiler():
    global _compiler_module
    if _compiler_module is None:
        _compiler_module = compiler()
    return _compiler_module


_PROFILER = torch.autograd.profiler   # a profiler runs: the kernel's range (tensor_compiler.api)
_TENSOR, _STRIDED, _BOOL = torch.Tensor, torch.strided, torch.bool
_has_torch_function = torch._C._has_torch_function
_VF_EINSUM = torch._VF.einsum   # what torch.einsum calls (torch.functional.einsum)
_OPT_EINSUM = torch.backends.opt_einsum


def _dense_only(operands) -> bool:
    """Whether every operand is a dense torch tensor (strided, and not a SparseTensor)."""
    for x in operands:
        if isinstance(x, SparseTensor) or not isinstance(x, _TENSOR) or x.layout is not _STRIDED:
            return False
    return True


def einsum(*args: Any, out_format: Optional[FormatLike] = None, sorted: bool = True) -> torch.Tensor:
    """torch.einsum over any mix of dense and sparse operands, compiled into one kernel.

    With only dense operands (and no ``out_format``) this is ``torch.einsum``. In grad mode,
    with an operand that requires grad, the result is differentiable in every operand
    (``scorch.gradients``); a sparse operand's gradient lives on its pattern.

    A sparse result's coordinates are sorted and unique within every row (fiber) by default.
    ``sorted=False`` only promises unique: a result built through a workspace (SpGEMM
    ``"ij,jk->ik"``) may keep each row's columns in the order they were produced, as scipy's
    ``A @ B`` does, and skips the sort; every scorch operation that needs order sorts such
    a tensor first (once)."""
    if len(args) > 1 and type(args[0]) is str and not (
            len(args) == 2 and isinstance(args[1], (list, tuple))):
        equation, operands = args[0], args[1:]
    else:
        equation, operands = _equation_and_operands(args)
    if out_format is None and _dense_only(operands):
        # torch's einsum, first and as torch.einsum runs it (its C entry where opt_einsum
        # plans no path; torch.einsum where it does, or where a mode or subclass takes the
        # call), so a dense call costs what torch's does (the path below added ~4 us),
        # forward-mode AD and torch.jit.trace see torch's op, and nothing below reads the
        # operands
        if not _has_torch_function(operands) and (
                len(operands) <= 2 or not _OPT_EINSUM.enabled):
            return _VF_EINSUM(equation, operands)
        return torch.einsum(equation, *operands)
    if _tensor_type._FWAD._current_level >= 0:
        _tensor_type._refuse_dual(einsum, operands, {})
    operands, as_bool = _kernel_operands(equation, operands)
    if as_bool:
        return einsum(equation, *operands, out_format=out_format, sorted=sorted).to(torch.bool)
    if _grad_enabled() and _any_requires_grad(*operands):
        # the graph goes through the Function (a SparseTensor's .requires_grad is a Python
        # __torch_function__ call, ~3 us; this C check reads every operand's flag in ~0.3 us)
        from ..gradients.functions import einsum as differentiable_einsum
        return differentiable_einsum(equation, *operands, out_format=out_format)
    compiler = _compiler_module or _compiler()
    if out_format is None and sorted and not _PROFILER._is_profiler_enabled:
        # a warm call, whole, in C (tensor_compiler.fastcall): NotImplemented where it declines
        dispatch = compiler._DISPATCH[0]
        if dispatch is not None:
            result = dispatch(compiler._fast, equation, operands)
            if result is not NotImplemented:
                return SparseTensor(result) if type(result) is Storage else result
    # the compiler reads torch's sparse layouts itself and hands dense-only calls to
    # torch.einsum, so a call goes straight there (each extra check cost ~1 us)
    result = compiler.einsum_declined(equation, tuple(operands), out_format, sorted)
    return SparseTensor(result) if type(result) is Storage else result


script_as_builtin(einsum, "aten::einsum")   # torch.jit.script: torch's einsum


def _kernel_operands(equation: str, operands) -> tuple:
    """The operands as the kernels take them (``einsum`` and ``explain`` both, so the plan
    explained is the one that runs), and whether the result goes back to bool: a sum of one
    integer operand in int64 (``_sums_integers``); bool operands (the kernels have no bool
    type) as 0/1 bytes for products, int32 for a contraction (an OR of ANDs, as torch's
    bool einsum where it has one)."""
    if len(operands) == 1 and _sums_integers(equation, operands[0]):
        return (operands[0].to(torch.int64),), False
    if operands and _all_bool(operands) and any(is_sparse_operand(x) for x in operands):
        lhs, arrow, rhs = equation.replace(" ", "").partition("->")
        letters = lhs.replace("...", "").replace(",", "")
        kept = set(rhs.replace("...", "")) if arrow else {c for c in letters if letters.count(c) == 1}
        wide = torch.int32 if any(c not in kept for c in letters) else torch.uint8
        return tuple(x.to(wide) for x in operands), True
    return operands, False


def _all_bool(operands) -> bool:
    """Whether every operand is bool, reading a plain tensor's dtype first: a SparseTensor's
    ``.dtype`` is a property that turns torch functions off (~0.3 us), and this check ran on
    every warm call (1.08 -> ~0.15 us of a 3.7 us SpMV call on a small matrix)."""
    for x in operands:
        if type(x) is _TENSOR and x.dtype is not _BOOL:
            return False
    for x in operands:
        dtype = x._storage.values.dtype if type(x) is SparseTensor else getattr(x, "dtype", None)
        if dtype is not _BOOL:
            return False
    return True


def _sums_integers(equation: str, x) -> bool:
    """One sparse integer or bool operand summed over an index: torch.einsum sums it as
    ``sum`` does, in int64 (``"ij->j"`` of int8 counts past 127; a diagonal or transpose
    keeps the dtype)."""
    if not is_sparse_operand(x) or x.dtype.is_floating_point or x.dtype.is_complex:
        return False
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    letters = lhs.replace("...", "")
    kept = set(rhs.replace("...", "")) if arrow else {c for c in letters if letters.count(c) == 1}
    return any(c not in kept for c in letters)


def explain(*args: Any, out_format: Optional[FormatLike] = None, sorted: bool = True):
    """The compiler's plan for ``einsum(*args, out_format=..., sorted=...)``; nothing runs.

    The operands are prepared as ``einsum`` prepares them (the same casts: an integer sum
    in int64, bool operands as uint8 / int32 with the result cast back to bool; the same
    errors), so ``source`` is the kernel that runs. With only dense operands and no
    ``out_format``, ``einsum`` is torch.einsum: the plan then has no loops, a dense
    ``output_format`` and a ``source`` that says torch.einsum computes it."""
    equation, operands = _equation_and_operands(args)
    operands, _ = _kernel_operands(equation, operands)
    return _compiler().explain(equation, *operands, out_format=out_format, sorted=sorted)


_any_autocast = torch._C._is_any_autocast_enabled
_HALF = (torch.float16, torch.bfloat16)


def computed_in_float32(fn, args, kwargs, dtype: torch.dtype):
    """``fn(*args, **kwargs)`` inside a CPU autocast block, for a product whose dense result
    there has ``dtype``: autocast casts below scorch's handlers, where it cannot reach them,
    and the kernels have no half-precision path, so float16 / bfloat16 operands go in as
    float32, autocast is off while ``fn`` runs, and a float32 result leaves as ``dtype``."""
    def up(x):
        return x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype in _HALF else x
    with torch.autocast("cpu", enabled=False):
        out = fn(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()})
    if isinstance(out, torch.Tensor) and out.dtype == torch.float32 and dtype != torch.float32:
        return out.to(dtype)
    return out


def autocast_product(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` for a product on CPU autocast's list (``mm``, ``bmm``,
    ``matmul``, ...): inside an autocast block, in float32 and returned in autocast's dtype
    (``computed_in_float32``); outside one, one C call (~0.1 us)."""
    if _any_autocast() and torch.is_autocast_enabled("cpu"):
        return computed_in_float32(fn, args, kwargs, torch.get_autocast_dtype("cpu"))
    return fn(*args, **kwargs)


def autocast_like(torch_fn, fn, args: tuple):
    """``fn(*args)``, scorch's form of ``torch_fn`` (``einsum``, ``tensordot``, ``inner``:
    composites whose dense result is in autocast's dtype where they reach ``mm`` / ``bmm``,
    else in the operands'): inside a CPU autocast block, in the dtype ``torch_fn`` gives."""
    if not (_any_autocast() and torch.is_autocast_enabled("cpu")):
        return fn(*args)
    return computed_in_float32(fn, args, {}, _dense_autocast_dtype(torch_fn, args))


#: (torch function, its arguments' dtypes and ranks, autocast dtype) -> its result's dtype
_AUTOCAST_DTYPES: dict = {}


def _dense_autocast_dtype(torch_fn, args: tuple) -> torch.dtype:
    """The dtype dense ``torch_fn(*args)`` has in the current CPU autocast block: read off
    torch's own call on small dense stand-ins (size 2 along every dim: torch contracts left
    to right whatever the sizes, unless opt_einsum is installed and orders three or more
    operands by their sizes), once per arguments' dtypes and ranks.
    (``"ij,jk->ik"`` reaches ``bmm``: autocast's dtype; ``"ij->j"`` sums and ``"ij,ij->ij"``
    multiplies: the operands'; so does ``tensordot`` down to a scalar.)"""
    key = (torch_fn, tuple((x.dtype, x.dim()) if isinstance(x, torch.Tensor) else repr(x)
                           for x in args), torch.get_autocast_dtype("cpu"))
    dtype = _AUTOCAST_DTYPES.get(key)
    if dtype is None:
        stand_ins = [torch.ones((2,) * x.dim(), dtype=x.dtype) if isinstance(x, torch.Tensor)
                     else x for x in args]
        dtype = _AUTOCAST_DTYPES[key] = torch_fn(*stand_ins).dtype
    return dtype


@register(torch.einsum)
def _torch_einsum(*args):
    """``torch.einsum`` (it takes no keywords); inside a CPU autocast block, in the dtype
    torch's own gives there (``autocast_like``)."""
    if _any_autocast():
        equation, operands = _equation_and_operands(args)
        return autocast_like(torch.einsum, einsum, (equation, *operands))
    return einsum(*args)
