"""Singleton levels (TACO's singleton): exactly one stored coordinate per parent position, so
the level keeps ``crd`` only and shares its parent's positions. ``Format("ds")`` stores a
matrix with one entry per row (a one-hot gate, a permutation, an argmax) in one int array;
``Format("cs")`` stores one entry per stored row (a compressed row level holds each row
once; for several entries a row, COO's non-unique ``"qs"`` parent is needed, and scorch's
builds keep a parent's coordinates unique, so a matrix with two entries in one row is
refused in either, with a message naming the row).

Everything the compiler and the conversions need comes from the capabilities below: a
kernel iterates the one-entry segment ``[p, p + 1)`` of parent position ``p`` (or the range a
grouped parent hands down), and a level is built by checking that each parent position has
exactly one entry."""
from __future__ import annotations

import torch

from .base import LevelKind, segments

__all__ = ["Singleton"]


class Singleton(LevelKind):
    letter, name, aliases = "s", "singleton", ()

    def output_kind(self):
        return LevelKind.COMPRESSED   # a computed level may hold 0 or several entries a row

    def assemble(self, kinds, k, coords, parent, parent_count, size):
        counts = segments(parent, parent_count).diff()
        if parent_count and not bool((counts == 1).all()):
            bad = int(torch.nonzero(counts != 1).flatten()[0])
            raise ValueError(
                f"a singleton level stores exactly one entry per parent position, but parent "
                f"position {bad} has {int(counts[bad])} (level {k} of a format with levels "
                f"{''.join(x.letter for x in kinds)})")
        return [(None, coords[:, k])], parent, parent_count, k + 1
