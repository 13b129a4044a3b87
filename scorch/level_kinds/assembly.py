"""Building the levels of a format from sorted coordinates: every kind builds its own level
(``LevelKind.assemble``), top down. Used for kernel outputs (``tensor_compiler.assemble``)
and for conversions into kinds the Cython runtime does not build (``scorch.conversion``)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .base import LevelKind

__all__ = ["build_levels"]


def build_levels(kinds: Sequence[LevelKind], coords: torch.Tensor, values: torch.Tensor,
                 sizes: Sequence[int]) -> Tuple[List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]],
                                                torch.Tensor, int]:
    """``coords``: one row per entry, one column per level (int64), sorted and unique;
    ``sizes``: each level's extent. Returns each level's ``(pos, crd)`` (int64, None where
    the kind keeps none), the values (scattered into place when the last level is full) and
    the position count of the last level."""
    n = values.numel()
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
