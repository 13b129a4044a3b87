"""Format inference of the output, one output dimension at a time (paper, Algorithm 4).

``infer_kind(rhs, v, kind_of)`` is DENSE or SPARSE for output index variable ``v``:

* a product is sparse when any factor is sparse at ``v`` (the result is at least as sparse
  as that factor); a factor that does not index ``v`` is neutral;
* a sum or difference is dense when any term is dense at ``v`` or does not index ``v``
  (a broadcast term is nonzero along all of ``v``); sparse + sparse stays sparse
  (conservative, as the paper argues);
* a scalar is dense;
* a quotient is like its numerator (the denominator is dense);
* a function keeps its argument's kind when it maps 0 to 0 (``functions.py``), else dense.

A sparse output level takes the kind its feeding sparse levels agree on (``output_kind``:
coordinate levels give coordinate, compressed and singleton levels compressed), else
compressed. The output's mode order is not decided here: the
scheduler makes it concordant with the loop order so the kernel can append in order.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

from ..formats import LevelKind
from .functions import function
from .index_notation import Access, Add, Apply, Div, Expr, Mul, Neg, Scalar, Sub

__all__ = ["infer_kind", "infer_output_kinds"]

# Results: None (does not index v), DENSE, or the frozenset of sparse kinds feeding v.
DENSE = "d"


def _infer(e: Expr, v: str, kind_of: Callable[[Access, str], LevelKind]):
    if isinstance(e, Access):
        if v not in e.indices:
            return None
        k = kind_of(e, v)
        return DENSE if k.full else frozenset((k,))
    if isinstance(e, Scalar):
        return DENSE
    if isinstance(e, Neg):
        return _infer(e.a, v, kind_of)
    if isinstance(e, Apply):   # functions.py: only a zero-preserving function keeps sparsity
        a = _infer(e.a, v, kind_of)
        return a if a is None or function(e.fn).preserves_zero(e.p) else DENSE
    a, b = _infer(e.a, v, kind_of), _infer(e.b, v, kind_of)
    if isinstance(e, Div):     # like the numerator; a numerator broadcast along v is dense
        return (DENSE if b is not None else None) if a is None else a
    if isinstance(e, Mul):
        if a is None or a == DENSE:
            return b if b is not None else a
        if b is None or b == DENSE:
            return a
        return a | b
    if isinstance(e, (Add, Sub)):
        if a is None and b is None:
            return None
        if a is None or b is None or a == DENSE or b == DENSE:
            return DENSE
        return a | b
    raise TypeError(f"unknown expression node {e!r}")


def infer_kind(rhs: Expr, v: str, kind_of: Callable[[Access, str], LevelKind]) -> LevelKind:
    r = _infer(rhs, v, kind_of)
    if r is None or r == DENSE:
        return LevelKind.DENSE
    kinds = {k.output_kind() for k in r}
    return kinds.pop() if len(kinds) == 1 else LevelKind.COMPRESSED


def infer_output_kinds(rhs: Expr, output: Sequence[str],
                       kind_of: Callable[[Access, str], LevelKind]) -> Dict[str, LevelKind]:
    """Level kind of every output index variable."""
    return {v: infer_kind(rhs, v, kind_of) for v in output}
