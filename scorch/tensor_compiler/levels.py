"""How a kernel reads each stored level of an access: the lowering asks these plans (built
from the level kinds' capabilities, ``scorch.level_kinds``), never the format.

Reading (input levels, see ``scorch.level_storage`` for the position contract):

* a level that can *locate* (dense): child position = parent position * size + coordinate.
  It never filters, so it never drives a loop by itself.
* a level with ``pos`` (compressed, a coordinate level heading a run): *iterate* the segment
  ``pos[p] : pos[p+1]`` of the parent position ``p``.
* a level without ``pos`` shares its parent's positions: under a *grouped* parent it
  iterates the position range the parent handed down (the run of equal parent
  coordinates: COO's column level), else the one-entry segment ``[p, p+1)`` (singleton).
* a level whose coordinates may repeat (a coordinate level followed by another one) is
  *grouped*: one loop visit covers the run of equal coordinates ``[q, qe)`` and hands that
  range to its child level.

Writing (output levels): each kind builds its level from the sorted, unique coordinate
tuples the kernel appends (``scorch.level_kinds.assembly``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from ..level_kinds import LevelKind

__all__ = ["LevelPlan", "level_plans", "segment_setup", "group_end"]


class _Name:
    """A C name of a level plan, from its access and level number."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __get__(self, lv, owner=None) -> str:
        return self.pattern.format(access=lv.access, k=lv.k)


@dataclass(frozen=True)
class LevelPlan:
    """One stored level of one access, as the kernel reads it."""
    access: int        # access id
    k: int             # level number inside the access's storage
    kind: LevelKind
    var: str           # index variable the level's dimension is bound to
    has_pos: bool      # carries a pos array (compressed, or coordinate heading a run)
    grouped: bool      # coordinates may repeat (a coordinate level before another): group them
    from_range: bool = False   # no pos, under a grouped parent: iterates the range it hands down
    locates: bool = False      # O(1) child position from the coordinate (dense)
    iterates: bool = True      # visits its stored coordinates (every kind that filters)

    def segment_parent(self, pos: dict, seg: dict):
        """What ``segment_setup`` takes for this level: the parent position, or the range a
        grouped parent handed down (``pos``/``seg``: the lowering's per-access state)."""
        return seg[self.access] if self.from_range else pos[self.access]

    # names of the C fields / locals the level uses
    pos = _Name("a.t{access}_pos{k}")
    crd = _Name("a.t{access}_crd{k}")
    q = _Name("q{access}_{k}")       # current position
    hi = _Name("h{access}_{k}")      # end of the segment
    qe = _Name("e{access}_{k}")      # end of the run of equal coordinates
    found = _Name("f{access}_{k}")   # the level has the current coordinate
    p = _Name("p{access}_{k}")       # located position


def level_plans(access: int, kinds: Sequence[LevelKind], level_vars: Sequence[str]) -> List[LevelPlan]:
    out = []
    for k, (kind, v) in enumerate(zip(kinds, level_vars)):
        prev = kinds[k - 1] if k else None
        nxt = kinds[k + 1] if k + 1 < len(kinds) else None
        has_pos = kind.has_pos(prev)
        grouped = not kind.unique_before(nxt)
        from_range = not has_pos and not kind.full and bool(out) and out[-1].grouped
        out.append(LevelPlan(access, k, kind, v, has_pos, grouped, from_range, kind.locate,
                             kind.is_sparse))
    return out


def segment_setup(lv: LevelPlan, parent, present: str) -> List[str]:
    """Lines that set ``lv.q``/``lv.hi`` to the segment to iterate. ``parent`` is the parent
    position (a C expression), or the ``(lo, hi)`` range handed down by a grouped parent
    (``lv.segment_parent``); ``present`` is the access's presence code (``"1"`` if known)."""
    if lv.has_pos:
        lo, hi = f"{lv.pos}[{parent}]", f"{lv.pos}[{parent} + 1]"
    elif lv.from_range:
        lo, hi = parent
    else:   # one entry per parent position
        lo, hi = parent, f"{parent} + 1"
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
