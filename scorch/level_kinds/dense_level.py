"""Dense levels: no arrays; every coordinate of every parent position exists."""
from __future__ import annotations

from .base import LevelKind

__all__ = ["Dense"]


class Dense(LevelKind):
    letter, name, aliases = "d", "dense", ()
    full = True
    locate = True
    insert = True
    runtime = True

    def assemble(self, kinds, k, coords, parent, parent_count, size):
        return [(None, None)], parent * size + coords[:, k], parent_count * size, k + 1
