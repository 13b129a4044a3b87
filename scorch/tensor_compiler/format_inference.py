"""Format inference of the output, one output dimension at a time (paper, Algorithm 4).

``infer_kind(rhs, v, kind_of)`` is DENSE or SPARSE for output index variable ``v``:

* a product is sparse when any factor is sparse at ``v`` (the result is at least as sparse
  as that factor); a factor that does not index ``v`` is neutral;
* a sum or difference is dense when any term is dense at ``v`` or does not index ``v``
  (a broadcast term is nonzero along all of ``v``); sparse + sparse stays sparse
  (conservative, as the paper argues);
* a scalar is dense.

A sparse output level is ``coordinate`` when every sparse level feeding it is a coordinate
level and ``compressed`` otherwise. The output's mode order is not decided here: the
scheduler makes it concordant with the loop order so the kernel can append in order.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

from ..formats import Format, LevelKind
from .index_notation import Access, Add, Expr, Mul, Neg, Scalar, Sub

__all__ = ["infer_kind", "infer_output_kinds"]

# Results: None (does not index v), "d" dense, or a set-like string of sparse letters.


def _infer(e: Expr, v: str, kind_of: Callable[[Access, str], LevelKind]):
    if isinstance(e, Access):
        if v not in e.indices:
            return None
        k = kind_of(e, v)
        return "d" if k is LevelKind.DENSE else k.letter
    if isinstance(e, Scalar):
        return "d"
    if isinstance(e, Neg):
        return _infer(e.a, v, kind_of)
    a, b = _infer(e.a, v, kind_of), _infer(e.b, v, kind_of)
    if isinstance(e, Mul):
        if a is None:
            return b
        if b is None:
            return a
        sa = "".join(sorted(set((a if a != "d" else "") + (b if b != "d" else ""))))
        return sa or "d"
    if isinstance(e, (Add, Sub)):
        if a is None and b is None:
            return None
        if a is None or b is None or a == "d" or b == "d":
            return "d"
        return "".join(sorted(set(a + b)))
    raise TypeError(f"unknown expression node {e!r}")


def infer_kind(rhs: Expr, v: str, kind_of: Callable[[Access, str], LevelKind]) -> LevelKind:
    r = _infer(rhs, v, kind_of)
    if r is None or r == "d":
        return LevelKind.DENSE
    return LevelKind.COORDINATE if r == "q" else LevelKind.COMPRESSED


def infer_output_kinds(rhs: Expr, output: Sequence[str],
                       kind_of: Callable[[Access, str], LevelKind]) -> Dict[str, LevelKind]:
    """Level kind of every output index variable."""
    return {v: infer_kind(rhs, v, kind_of) for v in output}
