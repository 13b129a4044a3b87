"""Compressed levels: ``pos`` (one segment per parent position) and ``crd``, sorted and
unique inside a segment (CSR's column level)."""
from __future__ import annotations

import torch

from .base import LevelKind, segments, unique_parents_new

__all__ = ["Compressed"]


class Compressed(LevelKind):
    letter, name, aliases = "c", "compressed", ("sparse",)
    runtime = True

    def has_pos(self, prev):
        return True

    def assemble(self, kinds, k, coords, parent, parent_count, size):
        return assemble_segments(kinds, k, k + 1, coords, parent, parent_count)


def assemble_segments(kinds, k, end, coords, parent, parent_count):
    """Levels ``k..end-1`` sharing one ``pos`` at level ``k``: the distinct coordinate tuples
    of each parent position (shared by compressed levels and coordinate runs)."""
    n = coords.shape[0]
    if end == len(kinds):
        # the last levels: tuples are unique, so every entry is new here (no search needed)
        pos = segments(parent, parent_count)
        arrays = [(pos if j == k else None, coords[:, j]) for j in range(k, end)]
        return arrays, None, n, end  # positions = entry order
    new = unique_parents_new(parent, coords, k, end)
    uniq = torch.nonzero(new).flatten()
    pos = segments(parent[uniq], parent_count)
    arrays = [(pos if j == k else None, coords[uniq, j].contiguous()) for j in range(k, end)]
    new_parent = torch.cumsum(new.to(torch.int64), 0) - 1
    return arrays, new_parent, int(uniq.numel()), end
