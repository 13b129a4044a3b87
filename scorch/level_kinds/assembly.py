"""Building the levels of a format from sorted coordinates: every kind builds its own level
(``LevelKind.assemble``), top down. Used for kernel outputs (``tensor_compiler.assemble``)
and for conversions into kinds the Cython runtime does not build (``scorch.conversion``)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .base import LevelKind

__all__ = ["build_levels", "segment_chain"]


def build_levels(kinds: Sequence[LevelKind], coords: torch.Tensor, values: torch.Tensor,
                 sizes: Sequence[int]) -> Tuple[List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]],
                                                torch.Tensor, int]:
    """``coords``: one row per entry, one column per level (int32 or int64), sorted and unique;
    ``sizes``: each level's extent. Returns each level's ``(pos, crd)`` (int64, None where
    the kind keeps none), the values (scattered into place when the last level is full) and
    the position count of the last level."""
    n = values.numel()
    chain = _segment_chain(kinds, coords)
    if chain is not None:
        return chain, values, n
    parent = torch.zeros(n, dtype=torch.int64)
    count = 1
    built: list = []
    k = 0
    while k < len(kinds):
        arrays, parent, count, k = kinds[k].assemble(kinds, k, coords, parent, count, sizes[k])
        built.extend(arrays)
    if kinds[-1].full:
        full = torch.zeros(count, dtype=values.dtype)
        if n:
            full[parent] = values
        values = full
    return built, values, count


def segment_chain(kinds: Sequence[LevelKind]) -> Optional[str]:
    """``"run"``: every level is one coordinate run from the root (COO), whose arrays are
    the coordinates themselves; ``"chain"``: one level keeping ``pos`` at the root, or
    levels of one kind that keeps ``pos`` under itself and unique coordinates (DCSR, CSF),
    built from where the sorted tuples' prefixes change (here, or in the kernel:
    ``codegen._tuples_epilogue``); None otherwise."""
    k0 = kinds[0]
    if k0.full or not k0.has_pos(None) or any(k is not k0 for k in kinds):
        return None
    if len(kinds) == 1:
        return "chain"
    if not k0.has_pos(k0):
        return None if k0.unique_before(k0) else "run"
    return "chain" if k0.unique_before(k0) else None


def _segment_chain(kinds: Sequence[LevelKind], coords: torch.Tensor):
    """The levels of a ``segment_chain`` format from sorted unique tuples, with no
    per-entry parent position (an int64 array per level: a union's DCSR output peaked at
    4.5x its size); None for other formats (the general path)."""
    how = segment_chain(kinds)
    if how is None:
        return None
    n, R = coords.shape[0], len(kinds)
    if how == "run":
        pos = torch.tensor([0, n], dtype=torch.int64)
        return [(pos if j == 0 else None, coords[:, j]) for j in range(R)]
    built = []
    starts = torch.zeros(1, dtype=torch.int64)   # each parent position's first entry
    new = torch.zeros(n, dtype=torch.bool)       # entries that start a new prefix
    new[:1] = True
    for k in range(R - 1):
        col = coords[:, k]
        if n > 1:
            new[1:] |= col[1:] != col[:-1]
        first = torch.nonzero(new).flatten()
        pos = torch.empty(starts.numel() + 1, dtype=torch.int64)
        pos[:-1] = torch.searchsorted(first, starts)
        pos[-1] = first.numel()
        built.append((pos, col[first]))
        starts = first
    del new
    last = coords[:, R - 1]
    # the last level's crd outlives the coordinates: a copy of its own (not a view that
    # keeps every level's coordinates alive), unless it is the only level
    built.append((torch.cat([starts, torch.tensor([n])]), last if R == 1 else last.clone()))
    return built
