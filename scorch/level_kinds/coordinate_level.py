"""Coordinate levels: a run of coordinate levels stores one coordinate tuple per position
(COO). The first level of a run keeps ``pos`` (one segment per parent position); the
following levels share its positions (TACO's singleton). Tuples are sorted and unique in a
segment; a level of the run followed by another may repeat a coordinate (COO's row level)."""
from __future__ import annotations

from .base import LevelKind
from .compressed_level import assemble_segments

__all__ = ["Coordinate"]


class Coordinate(LevelKind):
    letter, name, aliases = "q", "coordinate", ("coo",)
    runtime = True

    def has_pos(self, prev):
        return prev is not self

    def unique_before(self, nxt):
        return nxt is not self

    def assemble(self, kinds, k, coords, parent, parent_count, size):
        end = k + 1
        while end < len(kinds) and kinds[end] is self:
            end += 1
        return assemble_segments(kinds, k, end, coords, parent, parent_count)
