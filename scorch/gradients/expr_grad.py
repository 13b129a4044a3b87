"""Gradients of index-notation assignments (``compute``): ``out(o) = sum rhs`` where rhs is
built from accesses with ``Mul``/``Add``/``Sub``/``Neg``/``Scalar``.

The derivative of rhs with respect to one access occurrence follows the sum, product and
quotient rules, the chain rule through elementwise functions (``Apply``, with the table of
``derivatives``) and ``where`` (each branch gets the gradient where it was taken;
comparisons are piecewise constant) (``derivative``); the gradient of operand ``n`` sums, over its occurrences ``a``,
``compute(Assignment(idx_a, grad(o) * d rhs / d a))`` - for a sparse operand with its
pattern as one more factor, so the expression is evaluated only at stored entries.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..tensor_compiler.index_notation import (Access, Add, Apply, Assignment, Compare, Div, Expr,
                                              Mul, Neg, Scalar, Sub, Where, accesses)
from ..tensor_type import SparseTensor
from . import pattern as _pattern
from .derivatives import derivative_of
from .einsum_grad import full_gradient
from .values import from_values, grad_values, values_of

__all__ = ["derivative", "operand_gradient"]


def _mul(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if a is None or b is None:
        return None
    if isinstance(a, Scalar) and a.value == 1:
        return b
    if isinstance(b, Scalar) and b.value == 1:
        return a
    return Mul(a, b)


def derivative(e: Expr, k: int) -> Optional[Expr]:
    """d e / d (the k-th access of ``e``, left to right); None where it is zero."""
    counter = [0]

    def d(x: Expr) -> Optional[Expr]:
        if isinstance(x, Access):
            here = counter[0]
            counter[0] += 1
            return Scalar(1.0) if here == k else None
        if isinstance(x, Scalar):
            return None
        if isinstance(x, Neg):
            da = d(x.a)
            return None if da is None else Neg(da)
        if isinstance(x, (Add, Sub)):
            da, db = d(x.a), d(x.b)
            if db is not None and isinstance(x, Sub):
                db = Neg(db)
            if da is None:
                return db
            return da if db is None else Add(da, db)
        if isinstance(x, Mul):
            da, db = d(x.a), d(x.b)
            left, right = _mul(da, x.b), _mul(x.a, db)
            if left is None:
                return right
            return left if right is None else Add(left, right)
        if isinstance(x, Div):
            # (a / b)' = a' / b - a * b' / b^2 (b is dense: a quotient's denominator always is)
            da, db = d(x.a), d(x.b)
            left = None if da is None else Div(da, x.b)
            right = None if db is None else Div(_mul(x.a, db), Apply("square", x.b))
            if right is None:
                return left
            return Neg(right) if left is None else Sub(left, right)
        if isinstance(x, Apply):
            da = d(x.a)
            return None if da is None else _mul(derivative_of(x), da)
        if isinstance(x, Compare):   # piecewise constant (and a bool result): no gradient
            d(x.a), d(x.b)           # (their accesses still count)
            return None
        if isinstance(x, Where):
            # where(c, a, b)' = where(c, a', 0) + where(c, 0, b'): the gradient goes to the
            # branch each entry took; the condition is piecewise constant
            d(x.c)
            da, db = d(x.a), d(x.b)
            left = None if da is None else Where(x.c, da, Scalar(0.0))
            right = None if db is None else Where(x.c, Scalar(0.0), db)
            if left is None:
                return right
            return left if right is None else Add(left, right)
        raise TypeError(f"no derivative rule for {type(x).__name__}")
    return d(e)


def _times(g: Expr, D: Expr) -> Expr:
    """``g * D`` with ``g`` carried into the branches of a ``where`` (and the terms of a sum
    of them): torch's where backward selects the incoming gradient, so a NaN or inf arriving
    for the branch an entry did not take stays out (``0 * NaN`` would not)."""
    if isinstance(D, Scalar) and D.value == 1:
        return g
    if isinstance(D, Scalar) and D.value == 0:
        return D
    if isinstance(D, Where):
        return Where(D.c, _times(g, D.a), _times(g, D.b))
    if isinstance(D, Add) and (isinstance(D.a, Where) or isinstance(D.b, Where)):
        return Add(_times(g, D.a), _times(g, D.b))
    return Mul(g, D)


def _expr_vars(e: Optional[Expr]) -> List[str]:
    return [] if e is None else e.vars()


def _sizes(asg: Assignment, operands, grad) -> Dict[str, int]:
    sizes: Dict[str, int] = {}
    for a in accesses(asg.rhs):
        for v, s in zip(a.indices, operands[a.tensor].shape):
            if sizes.get(v, 1) == 1:
                sizes[v] = int(s)
    for v, s in zip(asg.output, grad.shape):
        if sizes.get(v, 1) == 1:
            sizes[v] = int(s)
    return sizes


def _sum(terms: List[Expr]) -> Expr:
    """``terms[0] + terms[1] + ...``."""
    total = terms[0]
    for t in terms[1:]:
        total = Add(total, t)
    return total


def _occurrence(asg: Assignment, a: Access, Ds: List[Expr], grad, operands: Sequence, compute: Callable):
    """The contribution of access ``a`` with derivatives ``Ds`` (one per occurrence of that
    access, summed in one expression): dense tensor (dense operand) or values on the
    operand's pattern (sparse operand)."""
    x = operands[a.tensor]
    gid = len(operands)
    ops = list(operands) + [grad]
    scale, D = None, _sum(Ds)
    if asg.output:              # g carried into each term (``_times``), then the terms summed
        rhs = _sum([_times(Access(gid, asg.output), d) for d in Ds])
    else:                       # a 0-d result: its gradient is one number, applied at the end
        rhs, scale = D, grad
    sizes = _sizes(asg, operands, grad)
    if isinstance(x, SparseTensor):
        if len(set(a.indices)) != len(a.indices):
            return _diagonal_occurrence(a, rhs, scale, x, ops, compute, gid)
        P = x._storage
        merged = (asg.output == a.indices and isinstance(grad, SparseTensor)
                  and _pattern.shares_arrays(P, grad._storage) and scale is None)
        Q, perm = P, None
        if not merged:
            dtype = torch.promote_types(x.dtype, grad.dtype)
            Q, perm = _pattern.pattern_factor(P, dtype)
            ops.append(SparseTensor(Q))
            pat = Access(gid + 1, a.indices)
            rhs = pat if isinstance(rhs, Scalar) and rhs.value == 1 else Mul(pat, rhs)
        R = compute(Assignment(a.indices, rhs), *ops)
        if isinstance(R, SparseTensor):
            vals = values_of(R) if _pattern.shares_arrays(P, R._storage) else \
                _pattern.values_from_factor(P, Q, perm, R._storage, values_of(R))
        else:
            vals = R[tuple(_pattern._convert().coords(P))]
        return vals if scale is None else vals * scale
    present = set(asg.output) | set(_expr_vars(D))
    dims, result = [], []
    for d, v in enumerate(a.indices):
        if x.shape[d] == 1 and sizes.get(v, 1) > 1:
            dims.append(None)
        elif v not in present:
            dims.append(("expand", v))
        else:
            dims.append(("var", v))
            if v not in result:
                result.append(v)
    if isinstance(rhs, Scalar):     # nothing left to evaluate: the gradient is the scale itself
        R = torch.full([sizes[v] for v in result], float(rhs.value), dtype=x.dtype)
    elif not result:
        R = compute(Assignment((), rhs), *ops) if rhs.vars() else None
    else:
        R = compute(Assignment(result, rhs), *ops)
    if scale is not None:
        R = R * scale
    return full_gradient(R, dims, result, sizes, tuple(x.shape), x.dtype)


def _diagonal_occurrence(a: Access, rhs: Expr, scale, x: SparseTensor, ops: list,
                         compute: Callable, gid: int) -> torch.Tensor:
    """A sparse access that repeats an index (``T(i,i)``): the gradient expression runs on
    the pattern's diagonal entries (``pattern.diagonal``); other entries get 0."""
    P = x._storage
    dtype = torch.promote_types(x.dtype, ops[gid].dtype)
    Q, entries, which = _pattern.diagonal(P, a.indices, dtype)
    distinct = tuple(dict.fromkeys(a.indices))
    pat = Access(gid + 1, distinct)
    rhs = pat if isinstance(rhs, Scalar) and rhs.value == 1 else Mul(pat, rhs)
    R = compute(Assignment(distinct, rhs), *ops, SparseTensor(Q))
    vals = _pattern.from_diagonal(P, entries, which, grad_values(Q, R))
    return vals if scale is None else vals * scale


def operand_gradient(asg: Assignment, n: int, grad, operands: Sequence, compute: Callable):
    """The gradient of operand ``n`` of ``compute(asg, *operands)`` given ``grad``."""
    x = operands[n]
    # the occurrences' derivatives, per access: a sparse operand's occurrences with the same
    # indices are summed into ONE expression, so one kernel and one placement on its pattern
    # per operand (one per occurrence ran 7 kernels and 7 pattern searches for
    # torch.maximum: 2.4 s backward for a 0.1 s forward at 2M entries). A dense operand's
    # occurrences stay apart (each broadcasts on its own in ``full_gradient``)
    groups: Dict[object, tuple] = {}
    for k, a in enumerate(accesses(asg.rhs)):
        if a.tensor != n:
            continue
        D = derivative(asg.rhs, k)
        if D is None:
            continue
        key = a.indices if isinstance(x, SparseTensor) else k
        groups.setdefault(key, (a, []))[1].append(D)
    total = None
    for a, Ds in groups.values():
        g = _occurrence(asg, a, Ds, grad, operands, compute)
        total = g if total is None else total + g
    if isinstance(x, SparseTensor):
        if total is None:
            total = torch.zeros(x._storage.nnz, dtype=x.dtype)
        return from_values(x._storage, total.to(x.dtype))
    if total is None:
        return torch.zeros_like(x)
    return total
