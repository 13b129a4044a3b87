"""Merge lattices, in the form the lowering uses them: a presence formula per expression.

Whether the right-hand side *may be nonzero* at a point is a monotone boolean formula of
which accesses have a stored entry there: a product needs all its factors (intersection),
a sum or difference needs any term (union), a scalar is always "present". At a loop over
index variable ``v`` the sparse levels that index ``v`` are the lattice's iterators:

* if the formula can hold with every iterator exhausted (a dense term or a broadcast term
  of a sum), the loop must visit every coordinate of ``v`` (``dense_needed``) and the
  iterators are merged into that dense loop;
* otherwise the loop runs while the formula of "iterator not exhausted" holds, visits the
  smallest current coordinate, and enters the body only where the formula of "iterator
  has this coordinate" holds: intersection for products, union for sums (the lattice
  points of TACO's merge lattice, evaluated at run time instead of being unrolled);
* an iterator is ``necessary`` when the formula cannot hold without it: inside the body it
  is known present, so its checks vanish from the generated code.

``Formula`` values are small tuples: ``True``, ``("var", id)``, ``("and", a, b)``,
``("or", a, b)``.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence

from .functions import function
from .index_notation import Access, Add, Apply, Div, Expr, Mul, Neg, Scalar, Sub

__all__ = ["access_ids", "formula", "evaluate", "to_code", "dense_needed", "necessary",
           "loop_condition"]


def access_ids(rhs: Expr) -> Dict[Access, int]:
    """Distinct accesses of ``rhs`` numbered left to right (equal accesses share a number)."""
    from .index_notation import accesses
    ids: Dict[Access, int] = {}
    for a in accesses(rhs):
        if a not in ids:
            ids[a] = len(ids)
    return ids


def formula(e: Expr, ids: Dict[Access, int]):
    if isinstance(e, Access):
        return ("var", ids[e])
    if isinstance(e, Mul):
        return _and(formula(e.a, ids), formula(e.b, ids))
    if isinstance(e, (Add, Sub)):
        return _or(formula(e.a, ids), formula(e.b, ids))
    if isinstance(e, Neg):
        return formula(e.a, ids)
    if isinstance(e, Div):   # the denominator is dense (schedule checks): the numerator's
        return formula(e.a, ids)
    if isinstance(e, Apply):  # a function that maps 0 elsewhere is nonzero everywhere
        return formula(e.a, ids) if function(e.fn).preserves_zero(e.p) else True
    if isinstance(e, Scalar):
        return True
    raise TypeError(f"unknown expression node {e!r}")


def _and(a, b):
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    return ("and", a, b)


def _or(a, b):
    if a is True or b is True:
        return True
    if a is False:
        return b
    if b is False:
        return a
    return ("or", a, b)


def evaluate(f, value: Callable[[int], bool]) -> bool:
    if f is True or f is False:
        return f
    if f[0] == "var":
        return bool(value(f[1]))
    if f[0] == "and":
        return evaluate(f[1], value) and evaluate(f[2], value)
    return evaluate(f[1], value) or evaluate(f[2], value)


def substitute(f, known: Dict[int, object]):
    """Replace ``("var", id)`` by ``known[id]`` (True, False, or a C expression string)."""
    if f is True or f is False:
        return f
    if f[0] == "var":
        return known.get(f[1], f)
    a, b = substitute(f[1], known), substitute(f[2], known)
    return _and(a, b) if f[0] == "and" else _or(a, b)


def to_code(f, flag: Callable[[int], str]) -> str:
    """C (Cython) boolean expression; ``flag(id)`` gives each access's presence code
    (``"1"`` when known present). Returns ``"1"`` when the formula always holds."""
    def rec(g):
        if g is True:
            return "1"
        if g is False:
            return "0"
        if isinstance(g, str):
            return g
        if g[0] == "var":
            return flag(g[1])
        a, b = rec(g[1]), rec(g[2])
        if g[0] == "and":
            if a == "1":
                return b
            if b == "1":
                return a
            return f"({a} and {b})"
        if a == "1" or b == "1":
            return "1"
        return f"({a} or {b})"
    return rec(f)


def dense_needed(f, iterators: Iterable[int]) -> bool:
    """Can the formula hold where every iterator of this loop is absent (others present)?"""
    its = set(iterators)
    return evaluate(f, lambda i: i not in its)


def necessary(f, iterators: Sequence[int]) -> List[int]:
    """Iterators without which the formula cannot hold (everything else present)."""
    return [t for t in iterators if not evaluate(f, lambda i, t=t: i != t)]


def loop_condition(f, iterators: Sequence[int], not_exhausted: Callable[[int], str]) -> str:
    """While-condition of a merge loop: the formula over "iterator not exhausted", every
    access that is not an iterator of this loop counted present."""
    its = set(iterators)
    return to_code(f, lambda i: not_exhausted(i) if i in its else "1")
