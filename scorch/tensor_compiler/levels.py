"""What each level kind can do, as code: the lowering asks the level, never the format.

Reading (input levels, see ``scorch.level_storage`` for the position contract):

* ``DENSE``: *locate*: child position = parent position * size + coordinate. A dense level
  never filters, so it never drives a loop by itself.
* ``COMPRESSED`` and a ``COORDINATE`` level heading a run: *iterate* the segment
  ``pos[p] : pos[p+1]`` of the parent position ``p``.
* ``COORDINATE`` inside a run (no ``pos``): *iterate* the position range its parent level
  handed down (the group of equal parent coordinates).
* a ``COORDINATE`` level followed by another coordinate level may repeat a coordinate:
  it is *grouped*, i.e. one loop visit covers the run of equal coordinates ``[q, qe)``
  and hands that range to its child level.

Writing (output levels) is done by :func:`assemble_level` from the sorted, unique
coordinate tuples the kernel appends: a dense level multiplies positions out, a sparse
level (compressed or coordinate) records the unique coordinates per parent position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ..formats import LevelKind

__all__ = ["LevelPlan", "level_plans", "segment_setup", "group_end", "assemble_level"]


@dataclass(frozen=True)
class LevelPlan:
    """One stored level of one access, as the kernel reads it."""
    access: int        # access id
    k: int             # level number inside the access's storage
    kind: LevelKind
    var: str           # index variable the level's dimension is bound to
    has_pos: bool      # carries a pos array (compressed, or coordinate heading a run)
    grouped: bool      # coordinate level followed by a coordinate level: group equal coords

    @property
    def locates(self) -> bool:
        return self.kind.has_locate

    @property
    def iterates(self) -> bool:
        return self.kind.is_sparse

    # names of the C fields / locals the level uses
    @property
    def pos(self) -> str:
        return f"a.t{self.access}_pos{self.k}"

    @property
    def crd(self) -> str:
        return f"a.t{self.access}_crd{self.k}"

    @property
    def q(self) -> str:
        return f"q{self.access}_{self.k}"

    @property
    def hi(self) -> str:
        return f"h{self.access}_{self.k}"

    @property
    def qe(self) -> str:
        return f"e{self.access}_{self.k}"

    @property
    def found(self) -> str:
        return f"f{self.access}_{self.k}"

    @property
    def p(self) -> str:
        return f"p{self.access}_{self.k}"


def level_plans(access: int, kinds: Sequence[LevelKind], level_vars: Sequence[str]) -> List[LevelPlan]:
    out = []
    for k, (kind, v) in enumerate(zip(kinds, level_vars)):
        has_pos = kind is LevelKind.COMPRESSED or (
            kind is LevelKind.COORDINATE and (k == 0 or kinds[k - 1] is not LevelKind.COORDINATE))
        grouped = kind is LevelKind.COORDINATE and k + 1 < len(kinds) and kinds[k + 1] is LevelKind.COORDINATE
        out.append(LevelPlan(access, k, kind, v, has_pos, grouped))
    return out


def segment_setup(lv: LevelPlan, parent, present: str) -> List[str]:
    """Lines that set ``lv.q``/``lv.hi`` to the segment to iterate. ``parent`` is the parent
    position (a C expression) for levels with ``pos``, or the ``(lo, hi)`` range handed
    down by a grouped parent; ``present`` is the access's presence code (``"1"`` if known)."""
    if lv.has_pos:
        lo, hi = f"{lv.pos}[{parent}]", f"{lv.pos}[{parent} + 1]"
    else:
        lo, hi = parent
    if present == "1":
        return [f"{lv.q} = {lo}", f"{lv.hi} = {hi}"]
    return [f"if {present}:", f"    {lv.q} = {lo}", f"    {lv.hi} = {hi}",
            "else:", f"    {lv.q} = 0", f"    {lv.hi} = 0"]


def group_end(lv: LevelPlan, coord: str) -> List[str]:
    """Lines that set ``lv.qe`` past the run of entries equal to ``coord`` (grouped levels),
    or to ``q + 1``."""
    if not lv.grouped:
        return [f"{lv.qe} = {lv.q} + 1"]
    return [f"{lv.qe} = {lv.q} + 1",
            f"while {lv.qe} < {lv.hi} and {lv.crd}[{lv.qe}] == {coord}:",
            f"    {lv.qe} += 1"]


def assemble_level(kinds: Sequence[LevelKind], k: int, coords: torch.Tensor,
                   parent: torch.Tensor, parent_count: int, size: int):
    """Build output level ``k`` (and, for a coordinate run, the rest of the run) from entries
    sorted by (parent, coordinates) and unique.

    ``coords``: level-order coordinates, one column per level (n x L, int64); ``parent``:
    each entry's position at the level above (nondecreasing). Returns ``(arrays, parent,
    count, next_k)`` where ``arrays`` is a list of ``(pos, crd)`` for levels ``k..next_k-1``
    (None where the kind keeps no such array).
    """
    kind = kinds[k]
    n = coords.shape[0]
    if kind is LevelKind.DENSE:
        return [(None, None)], parent * size + coords[:, k], parent_count * size, k + 1
    end = k + 1
    if kind is LevelKind.COORDINATE:
        while end < len(kinds) and kinds[end] is LevelKind.COORDINATE:
            end += 1
    if end == len(kinds):
        # the last levels: tuples are unique, so every entry is new here (no search needed)
        counts = torch.bincount(parent, minlength=parent_count) if n else torch.zeros(parent_count, dtype=torch.int64)
        pos = torch.zeros(parent_count + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=pos[1:])
        arrays = [(pos if j == k else None, coords[:, j]) for j in range(k, end)]
        return arrays, None, n, end  # positions = entry order
    new = torch.ones(n, dtype=torch.bool)
    if n > 1:
        diff = parent[1:] != parent[:-1]
        for j in range(k, end):
            col = coords[:, j]
            diff |= col[1:] != col[:-1]
        new[1:] = diff
    uniq = torch.nonzero(new).flatten()
    if n:
        counts = torch.bincount(parent[uniq], minlength=parent_count)
    else:
        counts = torch.zeros(parent_count, dtype=torch.int64)
    pos = torch.zeros(parent_count + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=pos[1:])
    arrays = [(pos if j == k else None, coords[uniq, j].contiguous()) for j in range(k, end)]
    new_parent = torch.cumsum(new.to(torch.int64), 0) - 1
    return arrays, new_parent, int(uniq.numel()), end
