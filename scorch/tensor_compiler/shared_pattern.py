"""Expressions whose sparse operands all share one pattern: ``A * 2``, ``-A``, ``relu(A)``,
``A + B`` where ``B`` has ``A``'s index arrays. Every stored entry of the result is a stored
entry of each operand at the same position, so the coordinates do not matter: the result
keeps the operands' ``pos``/``crd`` arrays (shared, never written: a result's in-place op
replaces values or the whole Storage) and only its values are computed, by torch's vectorized
ops over the value arrays. A generated kernel walking the levels costs 10-20x more here (its
loop follows the rows; on a power-law graph they hold 3 entries each).

``values_plan`` decides once per plan whether its shape allows this (elementwise, no
reduction, each sparse access reads its operand in the output's format and index order,
every dense operand 0-d); ``run_values`` checks per call that the sparse operands are over
the same level arrays (identical tensors: results of ``with_values``-style ops, views) and
returns None when they are not: the kernel runs then."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..level_storage import Storage
from .allocate import empty_output
from .functions import FUNCTIONS
from .index_notation import Access, Add, Apply, Div, Expr, Mul, Neg, Scalar, Sub
from .plans import PlanEntry
from ..broadcasting import broadcast_shapes

__all__ = ["ValuesPlan", "values_plan", "run_values"]

_BINARY = {Add: torch.add, Sub: torch.sub, Mul: torch.mul, Div: torch.div}


@dataclass(frozen=True)
class ValuesPlan:
    """``operands``: the sparse operands (the first one's arrays are the result's)."""
    operands: Tuple[int, ...]


def _supported(e: Expr, floating: bool) -> bool:
    if isinstance(e, (Access, Scalar)):
        return True
    if isinstance(e, Neg):
        return _supported(e.a, floating)
    if isinstance(e, Apply):   # torch computes these in floating point only, as the kernel
        return floating and e.fn in FUNCTIONS and FUNCTIONS[e.fn].torch_op is not None \
            and _supported(e.a, floating)
    if type(e) in _BINARY:     # integer Div truncates in C, torch divides truly
        return (floating or type(e) is not Div) and _supported(e.a, floating) \
            and _supported(e.b, floating)
    return False               # a node this module does not know (comparisons, where, ...)


def values_plan(entry: PlanEntry) -> Optional[ValuesPlan]:
    """The plan's shared-pattern form, or None where its result depends on coordinates."""
    s = entry.schedule
    out = s.output
    if (entry.split is not None or out.dense or out.final_format is not None
            or entry.assignment.reduction or out.format.block is not None):
        return None
    vt = entry.value_dtype
    if vt == torch.bool or not _supported(entry.assignment.rhs, vt.is_floating_point):
        return None
    sparse = []
    for ap in s.accesses:
        if ap.sparse:
            if ap.transposed or tuple(ap.indices) != tuple(out.vars) or ap.format != out.format:
                return None
            if ap.tensor not in sparse:
                sparse.append(ap.tensor)
        elif ap.indices:      # a dense operand indexed by coordinates: the kernel's job
            return None
    return ValuesPlan(tuple(sparse)) if sparse else None


def _values(e: Expr, ops, vt: torch.dtype) -> torch.Tensor:
    return _evaluate(e, ops, vt)[0]


def _evaluate(e: Expr, ops, vt: torch.dtype) -> Tuple[torch.Tensor, bool]:
    """(the values of ``e``, whether they are a temporary of this evaluation): an operator
    writes into a temporary operand of its shape, else into a fresh array from
    ``empty_output`` (a big one from numpy: torch's fresh 37 MB array costs ~9 ms of page
    faults on first touch here, more than the arithmetic; BigBird's softmax backward at
    batch 8, ``y * g - ys`` over 9.2M values: 36 -> 6.8 ms)."""
    if isinstance(e, Access):
        x = ops[e.tensor]
        v = x.values if type(x) is Storage else x
        return (v, False) if v.dtype == vt else (v.to(vt), True)
    if isinstance(e, Scalar):   # the kernel casts a constant to the value type first
        return torch.tensor(e.value, dtype=vt), True
    if isinstance(e, Neg):
        x, temp = _evaluate(e.a, ops, vt)
        return torch.neg(x, out=x if temp else empty_output(tuple(x.shape), vt)), True
    if isinstance(e, Apply):
        x, temp = _evaluate(e.a, ops, vt)
        f = FUNCTIONS[e.fn]
        r = f.torch_op(x, f.param(e.p)) if f.parameter else f.torch_op(x)
        # (a torch op may hand back its argument: an operand's values are never a temporary)
        return r, temp or (r is not x and r.data_ptr() != x.data_ptr())
    (a, a_temp), (b, b_temp) = _evaluate(e.a, ops, vt), _evaluate(e.b, ops, vt)
    shape = broadcast_shapes(a.shape, b.shape)
    out = a if a_temp and a.shape == shape else b if b_temp and b.shape == shape else empty_output(tuple(shape), vt)
    return _BINARY[type(e)](a, b, out=out), True


def run_values(plan: ValuesPlan, entry: PlanEntry, ops) -> Optional[Storage]:
    """The result over the first sparse operand's arrays, or None when the sparse operands'
    patterns differ (or the pattern operand is not in the output's format)."""
    P = ops[plan.operands[0]]
    out = entry.schedule.output
    if P.format is not out.format and P.format != out.format:
        return None
    for n in plan.operands[1:]:
        if not P.shares_pattern(ops[n]):
            return None
    vt = entry.value_dtype
    values = _values(entry.assignment.rhs, ops, vt)
    if any(values is ops[n].values for n in plan.operands):
        values = values.clone()   # the result owns its values (in-place ops on it)
    if values.dim() != 1 or values.numel() != P.values.numel():
        values = values.expand(P.values.shape).contiguous()
    return Storage(P.format, P.shape, P.levels, values, P.index_dtype)
