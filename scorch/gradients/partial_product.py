"""A sparse operand's gradient from a product the forward keeps, instead of recomputed.

For ``C = einsum(eq, S, D1, D2, ...)`` with one sparse ``S`` that needs a gradient, ``dS``
is ``sum grad_C * D1 * D2 ...`` on ``S``'s pattern. Where the dense operands share a
variable that neither ``S`` nor ``C`` has (the MoE layer ``bd,ndh,bn->bh``: ``d``), that
gradient contracts it all over again: the gate gradient ``bh,bd,ndh->bn`` costs as much as
the forward (784 x 512 multiply-adds a stored gate value). Split the forward instead::

    P = einsum("bn,bd,ndh->bnh", pattern(S), D1, D2)    # the forward's work, rows kept
    C = einsum("bnh,bn->bh", P, S)                       # a sum over n: nnz(S) x 512
    dS = einsum("bn,bh,bnh->bn", pattern(S), grad_C, P)  # on the pattern: nnz(S) x 512

``P`` holds one row per stored entry of ``S`` over ``C``'s other variables, kept dense
(the rows of unstored entries stay 0): the split pays when that array is small against the
product's work (``PARTIAL_WORK_SHARE``), mostly rows that are used (``PARTIAL_MAX_FILL``)
and fits ``PARTIAL_MAX_BYTES``. The dense operands'
gradients are unchanged (their einsums read ``S``). MoE layer, 1024 x 784 -> 512, 8 experts,
top-2, 1 thread, Zen 3: forward 31 -> 34 ms (P 33 ms, the sum 0.7), gate gradient 50 -> 1 ms.

Double backward reads the gradient through the original einsum (``P`` is a constant of the
forward, not differentiable in ``D1, D2``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Tuple

import torch

__all__ = ["PartialPlan", "partial_plan", "pays", "PARTIAL_MAX_BYTES", "PARTIAL_WORK_SHARE", "PARTIAL_MAX_FILL"]

#: the largest kept product (bytes): past it the gradient recontracts, as before
PARTIAL_MAX_BYTES = 1 << 28
#: the kept product's entries (zero-filled, written, read back) at most this share of the
#: forward's multiply-adds
PARTIAL_WORK_SHARE = 1 / 16
#: and at most this many times the rows it holds (``nnz(S)`` times the output's other
#: extents): ``P`` is dense over ``S``'s whole box, so a gate of 2 experts in 64 would zero
#: and keep 32 rows per row used (8 in 8 experts, top-2: 4)
PARTIAL_MAX_FILL = 8


@dataclass(frozen=True)
class PartialPlan:
    """The split of one einsum at its sparse operand ``s`` (subscript strings)."""
    s: int
    s_term: str
    p_term: str            # S's variables, then the output's others (in output order)
    p_equation: str        # pattern(S), the other operands -> P
    out_equation: str      # P, S -> C
    others: Tuple[int, ...]
    hidden: str            # the variables only the dense operands have


@lru_cache(maxsize=1024)
def partial_plan(equation: str, s: int, n_operands: int) -> Optional[PartialPlan]:
    """The split of ``equation`` at operand ``s`` (module docstring), or None where it does
    not apply: an ellipsis, a repeated subscript, no variable hidden from ``S`` and ``C``."""
    if "..." in equation or "->" not in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != n_operands or not 0 <= s < len(terms):
        return None
    if any(len(set(t)) != len(t) for t in terms + [out]) or not all(t.isalpha() for t in terms):
        return None
    s_term = terms[s]
    others = tuple(m for m in range(len(terms)) if m != s)
    in_others = set("".join(terms[m] for m in others))
    hidden = "".join(sorted(in_others - set(s_term) - set(out)))
    if not hidden or not set(out) <= set(s_term) | in_others:
        return None
    p_term = s_term + "".join(v for v in out if v not in s_term)
    return PartialPlan(s, s_term, p_term,
                       ",".join([s_term] + [terms[m] for m in others]) + "->" + p_term,
                       f"{p_term},{s_term}->{out}", others, hidden)


def _extents(equation: str, shapes: Sequence[Tuple[int, ...]]) -> Optional[dict]:
    """Each subscript's extent, or None where the operands disagree (broadcasting)."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    ext: dict = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            return None
        for v, n in zip(term, shape):
            if ext.setdefault(v, n) != n:      # broadcasting: left to the general path
                return None
    return ext


def pays(plan: PartialPlan, equation: str, shapes: Sequence[Tuple[int, ...]], nnz: int,
         itemsize: int) -> bool:
    """Whether keeping ``P`` (dense over ``plan.p_term``) is small against the forward's
    work, ``nnz(S)`` times the extents of the variables ``S`` lacks."""
    ext = _extents(equation, shapes)
    if ext is None:
        return False
    entries = math.prod(ext[v] for v in plan.p_term)
    work = nnz * math.prod(ext[v] for v in ext if v not in plan.s_term)
    rows = nnz * math.prod(ext[v] for v in plan.p_term if v not in plan.s_term)
    return (0 < entries * itemsize <= PARTIAL_MAX_BYTES and entries <= PARTIAL_WORK_SHARE * work
            and entries <= PARTIAL_MAX_FILL * rows)


def dense_format(plan: PartialPlan) -> str:
    """``P``'s format: every level dense."""
    return "d" * len(plan.p_term)


def needs(ctx_needs: Sequence[bool], operands: Sequence, sparse_type) -> Optional[int]:
    """The one sparse operand whose gradient is wanted, where every other operand is a
    dense tensor; else None."""
    sparse = [n for n, x in enumerate(operands) if isinstance(x, sparse_type)]
    if len(sparse) != 1 or not ctx_needs[sparse[0]]:
        return None
    for n, x in enumerate(operands):
        if n != sparse[0] and not (isinstance(x, torch.Tensor) and x.layout == torch.strided):
            return None
    return sparse[0]
