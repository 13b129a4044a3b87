"""Scorch's generated kernels as registered PyTorch operators (``torch.ops.scorch.*``), so
that ``torch.compile`` keeps them inside its graphs.

A sparse operand crosses the operator boundary as its arrays (``pos``/``crd`` per level and
``values``: what ``SparseTensor.__tensor_flatten__`` names); everything static (equation,
formats, shapes, level sizes, the requested output format, what the plan decided) is one
string key: the repr of a tuple of literals, which any process decodes. The operators:

* ``scorch::einsum(key, arrays) -> Tensor``: an einsum whose result is dense.
* ``scorch::einsum_on_pattern(key, arrays) -> Tensor``: an einsum whose result is sparse
  with the pattern of one of its operands (SDDMM: the scores of sparse attention); it
  returns the result's values, in that operand's storage order, and the result reuses the
  operand's index arrays.
* ``scorch::einsum_backward(key, n, grad, arrays) -> Tensor``: the gradient of operand
  ``n`` (a sparse operand: of its values, one per stored entry), the backward of the other
  two: the eager gradient einsum (``gradients.einsum_grad``, with the operand transposes it
  keeps between steps), attached with ``register_autograd``.
* ``scorch::pattern_map(name, key, arrays) -> Tensor`` and ``pattern_map_backward``:
  ``softmax`` / ``log_softmax`` over the stored entries (the result keeps the pattern).
* ``scorch::to_dense(key, arrays)`` and ``to_dense_backward``.

The fake implementations promise: the dense result's shape (torch.einsum's rule on the
operand shapes, symbolic sizes included) and dtype (the operands' promoted dtype); a
pattern result's values have the operand's stored-entry count; a gradient has its operand's
shape and dtype (a sparse operand: its values'). No result's size depends on data, so
nothing needs an unbacked size. Einsums whose sparse result has a new pattern (SpGEMM, a
sum of two patterns) are not registered: under ``torch.compile`` they graph-break and run
eagerly.

While a graph is traced, ``SparseTensor``'s operators reach ``_route`` (installed as
``tensor_type._UNDER_COMPILE``), which calls these operators; a sparse operand that requires
grad passes its values through ``values()``, so its gradient comes back on its pattern.
"""
from __future__ import annotations

import ast
import hashlib
import operator
import weakref
from itertools import repeat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .compiler_access import compiler as _compiler
from .formats import Format, LevelKind
from .gradients import einsum_grad
from .level_storage import Level, Storage
from . import tensor_type as _tensor_type
from .tensor_type import SparseTensor

__all__ = ["einsum_under_compile", "flatten_operands", "operands_from_arrays"]

#: key -> (equation, out_format, metas, plan facts): what a key string stands for
_SPECS: Dict[str, Tuple[Any, ...]] = {}

_Meta = Optional[Tuple[Any, ...]]   # None: a dense operand


# --- operands <-> arrays --------------------------------------------------------------------

def flatten_operands(operands: Sequence) -> Tuple[Tuple[_Meta, ...], List[torch.Tensor]]:
    """The static description of every operand and the flat list of their tensors."""
    metas: List[_Meta] = []
    arrays: List[torch.Tensor] = []
    for x in operands:
        if isinstance(x, SparseTensor):
            st = x._storage
            levels = []
            for lv in st.levels:
                levels.append((lv.kind.letter, lv.dim, lv.size, lv.block_inner,
                               lv.pos is not None, lv.crd is not None))
                arrays.extend(a for a in (lv.pos, lv.crd) if a is not None)
            arrays.append(st.values)
            metas.append((st.format, st.shape, tuple(levels), st.index_dtype))
        elif isinstance(x, torch.Tensor):
            metas.append(None)
            arrays.append(x)
        else:
            raise TypeError(f"einsum: operand {len(metas)} is a {type(x).__name__}, not a tensor")
    return tuple(metas), arrays


def operands_from_arrays(metas: Sequence[_Meta], arrays: Sequence[torch.Tensor]) -> list:
    """The operands again (SparseTensors over the given arrays)."""
    out, k = [], 0
    for meta in metas:
        if meta is None:
            out.append(arrays[k])
            k += 1
            continue
        fmt, shape, level_meta, index_dtype = meta
        levels = []
        for letter, dim, size, inner, has_pos, has_crd in level_meta:
            pos = crd = None
            if has_pos:
                pos, k = arrays[k], k + 1
            if has_crd:
                crd, k = arrays[k], k + 1
            levels.append(Level(LevelKind(letter), dim, size, pos, crd, inner))
        out.append(SparseTensor(Storage(fmt, shape, levels, arrays[k], index_dtype)))
        k += 1
    return out


def _width(meta: _Meta) -> int:
    """How many arrays an operand has in the flat list (its level arrays and values)."""
    return 1 if meta is None else 1 + sum(p + c for *_, p, c in meta[2])


def _values_index(metas: Sequence[_Meta], n: int) -> int:
    """Position of operand ``n``'s values (its only array when dense) in the flat list."""
    k = 0
    for m, meta in enumerate(metas):
        width = _width(meta)
        if m == n:
            return k + width - 1
        k += width
    raise IndexError(n)


# --- keys -----------------------------------------------------------------------------------
# A key is the repr of a tuple of literals, so any process decodes it (a compiled graph can
# come from torch's on-disk caches, traced by another process).

def _format_literal(fmt):
    if fmt is None or isinstance(fmt, str):
        return fmt
    return ("Format",) + tuple(fmt.__reduce__()[1])


def _format_of(lit):
    if lit is None or isinstance(lit, str):
        return lit
    return Format(*lit[1:])


def _dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name.rpartition(".")[2], None)
    if not isinstance(dtype, torch.dtype):
        raise RuntimeError(f"scorch: {name!r} in an operator key is not a torch dtype")
    return dtype


def _key(equation: str, out_format, metas, operands) -> str:
    """The key of this call's static description; an einsum is planned on first sight (the
    plan reads formats, dtypes and shapes, never data, so fake operands do)."""
    metas_lit = tuple(None if m is None else
                      (_format_literal(m[0]), m[1], m[2], str(m[3])) for m in metas)
    static = (equation, _format_literal(out_format), metas_lit,
              tuple(str(x.dtype) for x in operands))
    facts = _FACTS.get(static)
    if facts is None and "->" in equation:
        facts = _FACTS[static] = _plan_facts(equation, operands, out_format)
    key = repr((equation, _format_literal(out_format), metas_lit, facts))
    if key not in _SPECS:
        _SPECS[key] = (equation, out_format, metas, facts)
    return key


#: (equation, output format, operands' formats and dtypes) -> what the plan decided
_FACTS: Dict[Tuple[Any, ...], Tuple[str, int]] = {}


def _plan_facts(equation: str, operands, out_format) -> Tuple[str, int]:
    """("dense", -1), ("pattern", operand whose pattern the result takes) or ("new", -1)."""
    _compiler()   # the compiler told which type is sparse (compiler_access)
    from .tensor_compiler.operands import as_operand
    from .tensor_compiler.planner import einsum_entry
    schedule = einsum_entry(equation, [as_operand(x) for x in operands], out_format).schedule
    out = schedule.output
    if out.dense:
        return ("dense", -1)
    if out.pattern >= 0 and out.final_format is None:
        access = next(ap for ap in schedule.accesses if ap.id == out.pattern)
        source = operands[access.tensor]
        if isinstance(source, SparseTensor) and not access.transposed and \
                out.format == source._storage.format:
            return ("pattern", access.tensor)
    return ("new", -1)


def _spec(key: str):
    """(equation, out_format, metas, plan facts) of a key."""
    spec = _SPECS.get(key)
    if spec is None:
        try:
            equation, out_lit, metas_lit, facts = ast.literal_eval(key)
            metas = tuple(None if m is None else
                          (_format_of(m[0]), m[1], m[2], _dtype_of(m[3])) for m in metas_lit)
        except (ValueError, SyntaxError, TypeError) as e:
            raise RuntimeError(f"scorch: {key!r} is not a scorch operator key") from e
        spec = _SPECS[key] = (equation, _format_of(out_lit), metas, facts)
    return spec


# --- the operators --------------------------------------------------------------------------

#: key -> (weak references to the arrays, the sparse operands) of the last call: a compiled
#: graph passes the same array tensors call after call, and operands over them keep the
#: compiler's per-Storage caches (format signature, addresses) warm, as an eager
#: SparseTensor does. Dense operands are not kept (a GCN's features: every shape's last
#: inputs stayed alive, 38 MB for 10 graph sizes), and only the latest
#: :data:`_LAST_KEYS` keys keep their sparse operands.
_LAST_OPERANDS: Dict[str, Tuple[tuple, list]] = {}
_LAST_KEYS = 16


def _operands(key: str, metas, arrays: Sequence[torch.Tensor]) -> list:
    """The operands over ``arrays``. A sparse operand whose arrays are last call's is last
    call's SparseTensor, whatever the dense operands are (a GCN's ``A @ H`` gets a new H
    every step; a backward gets a stand-in): rebuilding it would cost the kernel call's
    warm caches (on Cora's A_hat, about as much again as the product)."""
    last = _LAST_OPERANDS.pop(key, None)
    if last is not None and len(last[0]) == len(arrays):
        ops = _reused_sparse_operands(metas, arrays, *last)
        if all(r() is a for r, a in zip(last[0], arrays)):
            _LAST_OPERANDS[key] = last          # the same arrays: the entry as it is
            return ops
    else:
        ops = operands_from_arrays(metas, arrays)
    _LAST_OPERANDS[key] = (tuple(weakref.ref(a) for a in arrays),
                           [None if meta is None else op for meta, op in zip(metas, ops)])
    while len(_LAST_OPERANDS) > _LAST_KEYS:
        del _LAST_OPERANDS[next(iter(_LAST_OPERANDS))]
    return ops


def _reused_sparse_operands(metas, arrays, last_arrays, last_ops) -> list:
    """``operands_from_arrays``, taking each sparse operand from ``last_ops`` where its
    arrays are the same tensors as those ``last_arrays`` (weak references) name."""
    ops, k = [], 0
    for meta, last in zip(metas, last_ops):
        width = _width(meta)
        mine = arrays[k:k + width]
        if meta is None:
            ops.append(mine[0])
        elif all(r() is a for r, a in zip(last_arrays[k:k + width], mine)):
            ops.append(last)
        else:
            ops.extend(operands_from_arrays([meta], mine))
        k += width
    return ops


def _run(key: str, arrays: Sequence[torch.Tensor]):
    equation, out_format, metas, _ = _spec(key)
    ops = _operands(key, metas, arrays)
    result = _compiler().einsum(equation, *ops, out_format=out_format)
    return SparseTensor(result) if type(result) is Storage else result, ops


def _fresh(out: torch.Tensor, arrays: Sequence[torch.Tensor]) -> torch.Tensor:
    """An operator's result never aliases its inputs (torch.library's rule)."""
    if out._base is None and not any(map(operator.is_, arrays, repeat(out))):
        return out   # a tensor of its own (what a kernel allocates): checked without storages
    mine = out.untyped_storage().data_ptr()
    if any(a.untyped_storage().data_ptr() == mine for a in arrays if a.numel()):
        return out.clone()
    return out


@torch.library.custom_op("scorch::einsum", mutates_args=())
def einsum_op(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    """A scorch einsum with a dense result (sparse operands as their arrays)."""
    out, _ = _run(key, arrays)
    if isinstance(out, SparseTensor):
        out = out.to_dense()
    return _fresh(out.contiguous(), arrays)


def _result_dtype(metas, arrays) -> torch.dtype:
    dtype = None
    for n in range(len(metas)):
        d = arrays[_values_index(metas, n)].dtype
        dtype = d if dtype is None else torch.promote_types(dtype, d)
    return dtype


@einsum_op.register_fake
def _einsum_fake(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    equation, _, metas, _ = _spec(key)
    dtype = _result_dtype(metas, arrays)
    shaped = []
    for n, meta in enumerate(metas):
        x = arrays[_values_index(metas, n)]
        shaped.append(x.to(dtype) if meta is None else x.new_empty(meta[1], dtype=dtype))
    return torch.einsum(equation, *shaped).contiguous()


@torch.library.custom_op("scorch::einsum_on_pattern", mutates_args=())
def einsum_on_pattern_op(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    """A scorch einsum whose sparse result has operand ``p``'s pattern: its values, in
    ``p``'s storage order."""
    _, _, metas, (_, p) = _spec(key)
    out, ops = _run(key, arrays)
    P = ops[p]._storage
    if not isinstance(out, SparseTensor) or not out._storage.shares_pattern(P):
        raise RuntimeError("scorch::einsum_on_pattern: the kernel's result left the pattern of "
                           f"operand {p}; the plan changed since the graph was traced")
    return _fresh(out._storage.values, arrays)


@einsum_on_pattern_op.register_fake
def _einsum_on_pattern_fake(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    _, _, metas, (_, p) = _spec(key)
    values = arrays[_values_index(metas, p)]
    return values.new_empty(values.shape, dtype=_result_dtype(metas, arrays))


@torch.library.custom_op("scorch::einsum_backward", mutates_args=())
def einsum_backward_op(key: str, n: int, grad: torch.Tensor,
                       arrays: List[torch.Tensor]) -> torch.Tensor:
    """The gradient of operand ``n`` (a dense operand: the whole tensor; a sparse one: its
    values) for the gradient ``grad`` of the einsum's result (dense, or the values of a
    pattern result): the eager gradient einsum, with the operand transposes it keeps."""
    from .gradients.functions import _output_first
    equation, _, metas, (kind, p) = _spec(key)
    ops = _operands(key, metas, arrays)
    G = _gradient_operand(kind, p, grad, ops)
    sparse = metas[n] is not None
    plan = einsum_grad.gradient_plan(equation, _broadcast_shapes(ops), n, sparse)
    g = einsum_grad.operand_gradient(plan, _eager_einsum, G, ops, _output_first)
    values = g._storage.values if isinstance(g, SparseTensor) else g
    return _fresh(values.to(ops[n].dtype).contiguous(), arrays + [grad])


@einsum_backward_op.register_fake
def _einsum_backward_fake(key: str, n: int, grad: torch.Tensor,
                          arrays: List[torch.Tensor]) -> torch.Tensor:
    _, _, metas, _ = _spec(key)
    return torch.empty_like(arrays[_values_index(metas, n)], memory_format=torch.contiguous_format)


def _eager_einsum(equation: str, *operands, out_format=None):
    result = _compiler().einsum(equation, *operands, out_format=out_format)
    return SparseTensor(result) if type(result) is Storage else result


def _holding(P: Storage, values: torch.Tensor) -> SparseTensor:
    """``P``'s level arrays (shared) holding ``values``."""
    return SparseTensor(Storage(P.format, P.shape, P.levels, values, P.index_dtype))


def _gradient_operand(kind: str, p: int, grad: torch.Tensor, ops):
    """The result's gradient as an operand: dense, or on operand ``p``'s pattern."""
    if kind == "pattern":
        P = ops[p]._storage
        return _holding(P, grad.to(P.dtype))
    return grad


def _broadcast_shapes(ops) -> Tuple[Tuple[int, ...], ...]:
    """The shapes as a gradient plan reads them (which sizes are 1: broadcasting), hashable
    when sizes are symbolic (a size-1 test is what Dynamo guards on anyway)."""
    return tuple(tuple(1 if s == 1 else 2 for s in x.shape) for x in ops)


# --- autograd -------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output) -> None:
    key, arrays = inputs
    _, _, metas, _ = _spec(key)
    ctx.key = key
    ctx.wanted = [a.requires_grad for a in arrays]   # no gradient einsum nobody asked for
    wanted = {n for n in range(len(metas)) if ctx.wanted[_values_index(metas, n)]}
    # a dense operand that only its own gradient reads (a GCN's X @ W in A @ (X @ W)) is
    # not saved for the backward, which needs only its shape and dtype: the compiled
    # forward does not keep that activation alive
    ctx.stand_ins = {}
    for n, meta in enumerate(metas):
        if meta is None and wanted <= {n}:
            k = _values_index(metas, n)
            ctx.stand_ins[k] = (arrays[k].shape, arrays[k].dtype)
    ctx.save_for_backward(*(None if k in ctx.stand_ins else a for k, a in enumerate(arrays)))


def _saved_arrays(ctx, grad: torch.Tensor) -> List[torch.Tensor]:
    """The forward's arrays again, an unsaved dense operand as a stand-in of its shape and
    dtype (one element, expanded)."""
    arrays = list(ctx.saved_tensors)
    for k, (shape, dtype) in ctx.stand_ins.items():
        arrays[k] = grad.new_zeros((), dtype=dtype).expand(shape)
    return arrays


def _backward(ctx, grad):
    _, _, metas, _ = _spec(ctx.key)
    arrays = _saved_arrays(ctx, grad)
    grads: List[Optional[torch.Tensor]] = [None] * len(arrays)
    for n in range(len(metas)):
        k = _values_index(metas, n)
        if ctx.wanted[k]:
            grads[k] = einsum_backward_op(ctx.key, n, grad, arrays)
    return None, grads


einsum_op.register_autograd(_backward, setup_context=_setup_context)
einsum_on_pattern_op.register_autograd(_backward, setup_context=_setup_context)


# --- pattern-preserving maps of one sparse tensor (softmax over stored entries) -------------

def _pattern_map(name: str):
    """``softmax:D`` / ``log_softmax:D``: the eager scorch function of that name."""
    from .sparse_ops import nonlinear
    fn, dim = name.split(":")
    return lambda t: getattr(nonlinear, fn)(t, int(dim))


def _single_pattern(key: str, arrays: Sequence[torch.Tensor]) -> SparseTensor:
    _, _, metas, _ = _spec(key)
    t, = operands_from_arrays(metas, arrays)
    return t


@torch.library.custom_op("scorch::pattern_map", mutates_args=())
def pattern_map_op(name: str, key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    """A map of one sparse tensor that keeps its pattern (``name``: ``softmax:D`` or
    ``log_softmax:D``): the result's values in the tensor's storage order."""
    t = _single_pattern(key, arrays)
    out = _pattern_map(name)(t)
    if out._storage.format != t._storage.format or out._storage.nnz != t._storage.nnz:
        raise RuntimeError(f"scorch::pattern_map: {name} changed the pattern")
    return _fresh(out._storage.values, arrays)


@pattern_map_op.register_fake
def _pattern_map_fake(name: str, key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(arrays[-1])


@torch.library.custom_op("scorch::pattern_map_backward", mutates_args=())
def pattern_map_backward_op(name: str, key: str, arrays: List[torch.Tensor],
                            grad: torch.Tensor) -> torch.Tensor:
    """The gradient of ``pattern_map``'s input values (eager scorch autograd)."""
    from .gradients.values import from_values, values_of
    t = _single_pattern(key, arrays)
    x = t._storage.values.detach().requires_grad_(True)
    with torch.enable_grad():
        out = values_of(_pattern_map(name)(from_values(t._storage, x)))
        g, = torch.autograd.grad(out, x, grad)
    return g


@pattern_map_backward_op.register_fake
def _pattern_map_backward_fake(name: str, key: str, arrays: List[torch.Tensor],
                               grad: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(arrays[-1])


def _pattern_map_setup(ctx, inputs, output) -> None:
    ctx.name, ctx.key = inputs[0], inputs[1]
    ctx.save_for_backward(*inputs[2])


def _pattern_map_backward(ctx, grad):
    arrays = list(ctx.saved_tensors)
    grads: List[Optional[torch.Tensor]] = [None] * len(arrays)
    if ctx.needs_input_grad[2]:
        grads[-1] = pattern_map_backward_op(ctx.name, ctx.key, arrays, grad)
    return None, None, grads


pattern_map_op.register_autograd(_pattern_map_backward, setup_context=_pattern_map_setup)


def pattern_map_under_compile(name: str, t: SparseTensor) -> SparseTensor:
    """``name`` (see ``pattern_map_op``) of ``t`` through the registered operator."""
    metas, arrays = flatten_operands([t])
    if torch.is_grad_enabled() and t.requires_grad:
        arrays[-1] = _tensor_type._AUTOGRAD["values"](t)   # differentiably, flat (see einsum_under_compile)
    key = _key(name, None, metas, [t])
    return _on_pattern(t._storage, pattern_map_op(name, key, arrays))


# --- to_dense ---------------------------------------------------------------------------------

@torch.library.custom_op("scorch::to_dense", mutates_args=())
def to_dense_op(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    """A sparse tensor (as its arrays) as a dense tensor."""
    return _fresh(_single_pattern(key, arrays).to_dense().contiguous(), arrays)


@to_dense_op.register_fake
def _to_dense_fake(key: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    _, _, metas, _ = _spec(key)
    return arrays[-1].new_empty(metas[0][1])


@torch.library.custom_op("scorch::to_dense_backward", mutates_args=())
def to_dense_backward_op(key: str, arrays: List[torch.Tensor], grad: torch.Tensor) -> torch.Tensor:
    """The gradient of ``to_dense``'s input values: ``grad`` at the stored coordinates."""
    from .gradients.values import grad_values
    t = _single_pattern(key, arrays)
    return _fresh(grad_values(t._storage, grad).to(t.dtype).contiguous(), arrays + [grad])


@to_dense_backward_op.register_fake
def _to_dense_backward_fake(key: str, arrays: List[torch.Tensor],
                            grad: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(arrays[-1])


def _to_dense_setup(ctx, inputs, output) -> None:
    ctx.key = inputs[0]
    ctx.save_for_backward(*inputs[1])


def _to_dense_backward(ctx, grad):
    arrays = list(ctx.saved_tensors)
    grads: List[Optional[torch.Tensor]] = [None] * len(arrays)
    if ctx.needs_input_grad[1]:
        grads[-1] = to_dense_backward_op(ctx.key, arrays, grad)
    return None, grads


to_dense_op.register_autograd(_to_dense_backward, setup_context=_to_dense_setup)


def to_dense_under_compile(t: SparseTensor) -> torch.Tensor:
    """``t.to_dense()`` through the registered operator."""
    metas, arrays = flatten_operands([t])
    if torch.is_grad_enabled() and t.requires_grad:
        arrays[-1] = _tensor_type._AUTOGRAD["values"](t)   # differentiably, flat (see einsum_under_compile)
    return to_dense_op(_key("to_dense", None, metas, [t]), arrays)


class _OnPattern(torch.autograd.Function):
    """A SparseTensor on ``P``'s pattern holding ``values``, differentiable in them, in a
    form AOTAutograd can trace (no address reads): a compiled function that returns an
    SDDMM or a sparse softmax hands back a result that requires grad, as in eager mode."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, P: Storage) -> SparseTensor:
        return _holding(P, values)

    @staticmethod
    def backward(ctx, g):
        return (_tensor_type._AUTOGRAD["values"](g) if isinstance(g, SparseTensor) else g), None


def _on_pattern(P: Storage, values: torch.Tensor) -> SparseTensor:
    if torch.is_grad_enabled() and values.requires_grad:
        return _OnPattern.apply(values, P)
    return _holding(P, values)


# --- routing ----------------------------------------------------------------------------------

class NotRegistered(Exception):
    """This call has no registered operator (Dynamo: a graph break)."""


def einsum_under_compile(equation: str, *operands, out_format=None) -> torch.Tensor:
    """``scorch.einsum`` through the registered operators (what runs while a graph is
    traced); ``UnsupportedOperatorException`` (a graph break) where none applies."""
    metas, arrays = flatten_operands(operands)
    if torch.is_grad_enabled():
        for n, x in enumerate(operands):
            if isinstance(x, SparseTensor) and x.requires_grad:
                # its values, differentiably: the gradient goes back as a SparseTensor on
                # its pattern (what eager autograd gives it)
                arrays[_values_index(metas, n)] = _tensor_type._AUTOGRAD["values"](x)   # flat
    key = _key(equation, out_format, metas, operands)
    kind, p = _spec(key)[3]
    if kind == "dense":
        return einsum_op(key, arrays)
    if kind == "pattern":
        P = operands[p]._storage
        return _on_pattern(P, einsum_on_pattern_op(key, arrays))
    _unsupported(equation)


def _unsupported(what) -> None:
    raise torch._subclasses.fake_tensor.UnsupportedOperatorException(what)


# --- what SparseTensor's operators do while a graph is traced -----------------------------

def _matmul_equation(a, b) -> str:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise NotRegistered
    if a.dim() == 2 and b.dim() == 2:
        return "ij,jk->ik"
    if a.dim() == 2 and b.dim() == 1:
        return "ij,j->i"
    if a.dim() == 1 and b.dim() == 2:
        return "j,jk->k"
    raise NotRegistered


def _route(func, args, kwargs):
    """``tensor_type._UNDER_COMPILE``: a torch call on a SparseTensor while a compile runs."""
    try:
        if func in _MATMULS and not kwargs:
            a, b = args
            return einsum_under_compile(_matmul_equation(a, b), a, b)
        if func is torch.Tensor.__rmatmul__ and not kwargs:
            b, a = args
            return einsum_under_compile(_matmul_equation(a, b), a, b)
        if func in _LINEAR:
            return _linear(*args, **kwargs)
        if func in _SOFTMAX or func in _LOG_SOFTMAX:
            return _softmax(func in _LOG_SOFTMAX, *args, **kwargs)
        if func is SparseTensor.to_dense or func in _TO_DENSE:
            if isinstance(args[0], SparseTensor) and len(args) == 1 and not kwargs:
                return to_dense_under_compile(args[0])
        if func is torch.einsum:
            equation, operands = _einsum_args(args)
            return einsum_under_compile(equation, *operands, **kwargs)
    except NotRegistered:
        pass
    if func is torch.Tensor.untyped_storage:   # fake-tensor conversion reads it
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    _unsupported(func)


def _einsum_args(args):
    from .sparse_ops.einsum import _equation_and_operands
    return _equation_and_operands(args)


def _softmax(log: bool, x, dim=None, dtype=None, *rest, **kwargs):
    dtype = kwargs.pop("dtype", dtype)
    if not isinstance(x, SparseTensor) or not isinstance(dim, int) or rest or kwargs or \
            dtype not in (None, x.dtype) or not x.dtype.is_floating_point:
        raise NotRegistered
    dim = dim + x.dim() if dim < 0 else dim
    return pattern_map_under_compile(f"{'log_softmax' if log else 'softmax'}:{dim}", x)


def _linear(input, weight, bias=None):
    if not (isinstance(input, torch.Tensor) and isinstance(weight, torch.Tensor)) or \
            weight.dim() != 2 or input.dim() < 1:
        raise NotRegistered
    out = einsum_under_compile("...j,kj->...k", input, weight)
    return out if bias is None else out + bias


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
            torch.Tensor.mm}
_SOFTMAX = {torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax,
            torch.sparse.softmax, torch._softmax}
_LOG_SOFTMAX = {torch.log_softmax, torch.Tensor.log_softmax, torch.nn.functional.log_softmax,
                torch.sparse.log_softmax, torch._log_softmax}
_TO_DENSE = {torch.Tensor.to_dense}
_LINEAR = {torch.nn.functional.linear, torch._C._nn.linear}
_tensor_type._UNDER_COMPILE[0] = _route
_tensor_type._ON_PATTERN_UNDER_COMPILE[0] = _on_pattern
#: the modules whose code runs while a graph is traced (routing, the tensor type and its ATen
#: handlers): a change to any of them traces a different graph, so none may be replayed
_TRACED_SOURCES = ("library_ops.py", "tensor_type.py", "aten_ops.py", "_dispatch.py")
_tensor_type._CACHE_SALT[0] = hashlib.sha1(b"".join(
    (Path(__file__).parent / name).read_bytes() for name in _TRACED_SOURCES)).hexdigest()[:16]


def _traced_einsum(*args, out_format=None):
    """What Dynamo traces where user code calls ``scorch.einsum``: ``torch.einsum``, which it
    keeps in the graph and runs on fake tensors through ``_route``; an ``out_format`` keeps
    the eager call (a graph break)."""
    if out_format is not None:
        return _opaque_einsum(*args, out_format=out_format)
    return torch.einsum(*args)


def _install_traced_einsum() -> None:
    from . import dynamo_rules
    from .sparse_ops import einsum as _einsum_module
    global _opaque_einsum
    _opaque_einsum = _einsum_module.einsum
    dynamo_rules.trace_instead(_einsum_module.einsum, _traced_einsum)


_opaque_einsum = None
_install_traced_einsum()
