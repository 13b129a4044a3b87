"""Merge lattices, in the form the lowering uses them: a presence formula per expression.

Whether the right-hand side *may be nonzero* at a point is a monotone boolean formula of
which accesses have a stored entry there: a product needs all its factors (intersection),
a sum or difference needs any term (union), a scalar is always "present"; comparisons and
``where`` follow from the value each sub-expression takes where nothing is stored
(``zero_analysis``). At a loop over
index variable ``v`` the sparse levels that index ``v`` are the lattice's iterators:

* if the formula can hold with every iterator exhausted (a dense term or a broadcast term
  of a sum), the loop must visit every coordinate of ``v`` (``dense_needed``) and the
  iterators are merged into that dense loop;
* otherwise the loop runs while the formula of "iterator not exhausted" holds, visits the
  smallest current coordinate, and enters the body only where the formula of "iterator
  has this coordinate" holds: intersection for products, union for sums (the lattice
  points of TACO's merge lattice, evaluated at run time instead of being unrolled);
* an iterator is ``necessary`` when the formula cannot hold without it: inside the body it
  is known present, so its checks vanish from the generated code;
* a formula that is a sum of disjoint products over the iterators (``A * B + C``:
  ``conjunct_groups``) is merged product by product: each product one stream of matches.

``Formula`` values are small tuples: ``True``, ``("var", id)``, ``("and", a, b)``,
``("or", a, b)``.
"""
from __future__ import annotations

from itertools import combinations
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

from .functions import function
from .index_notation import Access, Add, Apply, Compare, Div, Expr, Mul, Neg, Scalar, Sub, Where

__all__ = ["access_ids", "zero_analysis", "UNKNOWN", "formula", "evaluate", "to_code",
           "dense_needed", "necessary", "loop_condition", "lattice_points", "MAX_POINT_ITERATORS",
           "implied_by_any", "conjunct_groups"]


def access_ids(rhs: Expr) -> Dict[Access, int]:
    """Distinct accesses of ``rhs`` numbered left to right (equal accesses share a number)."""
    from .index_notation import accesses
    ids: Dict[Access, int] = {}
    for a in accesses(rhs):
        if a not in ids:
            ids[a] = len(ids)
    return ids


#: the value of an expression where it is constant but the table does not say which constant
UNKNOWN = object()


def zero_analysis(e: Expr, ids: Dict[Access, int]) -> Tuple[object, object]:
    """``(z, support)``: outside the formula ``support`` the expression equals the constant
    ``z`` (a number, or ``UNKNOWN``); every access is 0 where it stores nothing. This is how
    the zero-preserving table reaches comparisons and ``where``: ``A > s`` is ``0 > s``
    outside ``A``, so it keeps zeros iff ``not (0 > s)``; ``where(A > 0, A, 0)`` is 0 outside
    ``A``."""
    if isinstance(e, Access):
        return 0, ("var", ids[e])
    if isinstance(e, Scalar):
        return e.value, False
    if isinstance(e, Neg):
        z, s = zero_analysis(e.a, ids)
        return (UNKNOWN if z is UNKNOWN else -z), s
    if isinstance(e, Apply):  # functions.py: only a zero-preserving function keeps 0 at 0
        z, s = zero_analysis(e.a, ids)
        return (0 if z == 0 and function(e.fn).preserves_zero(e.p) else UNKNOWN), s
    if isinstance(e, Where):
        zc, sc = zero_analysis(e.c, ids)
        (za, sa), (zb, sb) = zero_analysis(e.a, ids), zero_analysis(e.b, ids)
        # two bounds, both valid (so is their intersection): where neither branch is stored
        # and both give the same constant the condition does not matter; where the
        # condition is not stored it picks one branch
        same = za is not UNKNOWN and zb is not UNKNOWN and za == zb
        if zc is UNKNOWN:
            return (za if same else UNKNOWN), (_or(sa, sb) if same else _or(sc, _or(sa, sb)))
        z, picked = (za, _or(sc, sa)) if zc else (zb, _or(sc, sb))
        return z, (_and(picked, _or(sa, sb)) if same else picked)
    (za, sa), (zb, sb) = zero_analysis(e.a, ids), zero_analysis(e.b, ids)
    known = za is not UNKNOWN and zb is not UNKNOWN
    if isinstance(e, Mul):   # a factor at 0 makes the product 0 (0 * inf counts as 0)
        if za == 0 and zb == 0:
            return 0, _and(sa, sb)
        if za == 0 or zb == 0:
            return 0, sa if za == 0 else sb
        return (za * zb if known else UNKNOWN), _or(sa, sb)
    if isinstance(e, Div):   # computed where the numerator may be nonzero (0 / 0 stays 0)
        if za == 0:
            return 0, sa
        return (za / zb if known and zb != 0 else UNKNOWN), _or(sa, sb)
    if isinstance(e, (Add, Sub)):
        z = (za + zb if isinstance(e, Add) else za - zb) if known else UNKNOWN
        return z, _or(sa, sb)
    if isinstance(e, Compare):
        return (float(e.holds(za, zb)) if known else UNKNOWN), _or(sa, sb)
    raise TypeError(f"unknown expression node {e!r}")


def formula(e: Expr, ids: Dict[Access, int]):
    """Where ``e`` may be nonzero: its support when it is 0 elsewhere, else everywhere.
    An expression that is 0 everywhere (``A * 0``) is computed where its accesses are
    stored (it stores zeros; the loops still need iterators)."""
    z, s = zero_analysis(e, ids)
    if z is UNKNOWN or z != 0:
        return True
    if s is False:
        for i in sorted(set(ids.values())):
            s = _or(s, ("var", i))
    return s


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
    (``"1"`` when known present, ``"0"`` when known absent). Returns ``"1"`` when the
    formula always holds and ``"0"`` when it never does."""
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
            if a == "0" or b == "0":
                return "0"
            if a == "1":
                return b
            if b == "1":
                return a
            return f"({a} and {b})"
        if a == "1" or b == "1":
            return "1"
        if a == "0":
            return b
        if b == "0":
            return a
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


#: a merge of at most this many iterators is lowered as TACO's lattice points (one loop per
#: point); more run as one k-pointer loop (2^k - 1 points would copy the body too often)
MAX_POINT_ITERATORS = 3


def lattice_points(f, iterators: Sequence[int], present: Callable[[int], bool]) -> List[Tuple[int, ...]]:
    """TACO's merge lattice points of a loop over ``iterators``: every subset ``S`` of them
    (largest first) where the formula can hold with only ``S``'s iterators left
    (``present(i)`` for the accesses that are not iterators here). Run in this order, each
    point's loop runs while all of ``S`` are unexhausted, so when it starts the iterators
    outside ``S`` are exhausted: the union ``A + B`` gives ``(A, B), (A,), (B,)`` (after
    the two-way merge, the rest of one operand is copied without comparisons), the
    intersection ``A * B`` only ``(A, B)``."""
    its = list(iterators)
    out: List[Tuple[int, ...]] = []
    for size in range(len(its), 0, -1):
        for S in combinations(its, size):
            if evaluate(f, lambda i, S=S: i in S if i in its else present(i)):
                out.append(S)
    return out


def implied_by_any(f, flags: Dict[int, str], group: Sequence[str]) -> bool:
    """Whether the formula holds wherever at least one presence code of ``group`` is true
    (a merge point: the smallest coordinate is present in at least one of its iterators).
    ``flags``: each access's presence code; a code outside ``group`` counts as absent
    unless it is ``"1"``. For the union ``A + B`` with ``group = (f0, f1)``: yes."""
    return all(evaluate(f, lambda i, g=g: flags[i] == "1" or flags[i] == g) for g in group)


def conjunct_groups(f, iterators: Sequence[int], present: Callable[[int], bool]):
    """The iterators as a sum of products, where the formula has that form: disjoint groups,
    the formula holding exactly where every iterator of some group is present (``A * B + C``:
    ``[(A, B), (C,)]``). A group of two or more is an intersection the loop can run as one
    stream of matches merged with the other groups (the eager order, in one kernel). None
    where the formula is not such a sum (``A * (B + C)``: its products share ``A``), where
    an iterator is in no product, or where no group has two iterators or only one group
    exists (a plain union or intersection). The groups are the formula's minimal true
    sets (a monotone formula is the union of them)."""
    its = list(iterators)

    def holds(S) -> bool:
        return evaluate(f, lambda i: i in S if i in its else present(i))

    minimal: List[Tuple[int, ...]] = []
    for size in range(1, len(its) + 1):
        for S in combinations(its, size):
            if holds(S) and not any(set(m) <= set(S) for m in minimal):
                minimal.append(S)
    covered = [i for m in minimal for i in m]
    if (len(minimal) < 2 or max(len(m) for m in minimal) < 2
            or len(covered) != len(set(covered)) or sorted(covered) != sorted(its)):
        return None
    # every product of the expression must lie within one group: a stream finds an
    # iterator only where its whole group matches, so ``A * B + A * C + B`` (groups (B,)
    # and (A, C): presence absorbs A * B into B) would read A as absent where B and A
    # hold and C does not, and lose A * B (found by tests/test_fuzz.py, session 24)
    for term in _products(f):
        if all(i in its or present(i) for i in term) and \
                not any({i for i in term if i in its} <= set(m) for m in minimal):
            return None
    return minimal


def _products(f) -> List[frozenset]:
    """The formula as written, multiplied out into its products (no absorption): the sets
    of accesses whose values one term of the expression reads together."""
    if f is True:
        return [frozenset()]
    if f is False:
        return []
    if f[0] == "var":
        return [frozenset((f[1],))]
    if f[0] == "or":
        return _products(f[1]) + _products(f[2])
    return [a | b for a in _products(f[1]) for b in _products(f[2])]
