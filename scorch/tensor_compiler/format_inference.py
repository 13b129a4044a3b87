"""Format inference of the output, one output dimension at a time (paper, Algorithm 4).

``infer_kind(rhs, v, kind_of)`` is DENSE or SPARSE for output index variable ``v``:

* a product is sparse when any factor is sparse at ``v`` (the result is at least as sparse
  as that factor); a factor that does not index ``v`` is neutral;
* a sum or difference is dense when any term is dense at ``v`` or does not index ``v``
  (a broadcast term is nonzero along all of ``v``); sparse + sparse stays sparse
  (conservative, as the paper argues);
* a scalar is dense;
* a quotient is like its numerator (the denominator is dense);
* a function keeps its argument's kind when it maps 0 to 0 (``functions.py``), else dense;
* a comparison or ``where`` is sparse where it keeps 0 where its sparse operands store
  nothing (``A > s`` iff ``not (0 > s)``, ``A != 0``, ``where(A > 0, A, 0)``), else dense.

A sparse output level takes the kind its feeding sparse levels agree on (``output_kind``:
coordinate levels give coordinate, compressed and singleton levels compressed), else
compressed. The output's mode order is not decided here: the
scheduler makes it concordant with the loop order so the kernel can append in order.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

from ..formats import LevelKind
from . import merge_lattice as ml
from .index_notation import Access, Expr

__all__ = ["infer_kind", "infer_output_kinds"]


def infer_kind(rhs: Expr, v: str, kind_of: Callable[[Access, str], LevelKind]) -> LevelKind:
    """Sparse at ``v`` when the presence formula (``merge_lattice``) cannot hold with every
    access that is sparse at ``v`` absent (the others, dense at ``v`` or broadcast along it,
    present): the rules above, read off one formula, so comparisons and ``where`` follow."""
    ids = ml.access_ids(rhs)
    sparse = {ids[a]: kind_of(a, v) for a in ids if v in a.indices}
    sparse = {i: k for i, k in sparse.items() if not k.full}
    if not sparse or ml.dense_needed(ml.formula(rhs, ids), sparse):
        return LevelKind.DENSE
    kinds = {k.output_kind() for k in sparse.values()}
    return kinds.pop() if len(kinds) == 1 else LevelKind.COMPRESSED


def infer_output_kinds(rhs: Expr, output: Sequence[str],
                       kind_of: Callable[[Access, str], LevelKind]) -> Dict[str, LevelKind]:
    """Level kind of every output index variable."""
    return {v: infer_kind(rhs, v, kind_of) for v in output}
