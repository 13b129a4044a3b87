"""Values kept per live tensor: the one mechanism behind scorch's per-array caches (a
pattern's ones, its converted forms, a level's distinct coordinates, a checked torch
layout). An entry is keyed by the tensor's identity (plus an optional ``extra`` key), holds
a weak reference so it goes when the tensor is freed, and a ``stamp`` (a version counter,
a size, array ids) that must still match for a hit: an in-place change misses."""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Dict, Hashable, Optional

__all__ = ["TensorKeyedCache", "version"]

#: stamps for tensors that track no version (inference tensors), each used once
_UNVERSIONED = itertools.count(-2, -1)


def version(t) -> int:
    """``t._version``; for a tensor made under ``torch.inference_mode()`` (which tracks no
    version counter, and reading it raises) a number never returned before, so a cache
    stamped with it never hits: nothing kept is trusted for memory that may have changed
    unseen."""
    try:
        return t._version
    except RuntimeError:
        return next(_UNVERSIONED)


class TensorKeyedCache:
    def __init__(self) -> None:
        self._table: Dict[tuple, tuple] = {}

    def get(self, anchor, extra: Hashable = None, stamp: Any = None) -> Optional[Any]:
        """The value kept for ``anchor`` (and ``extra``) under an equal ``stamp``, else None."""
        hit = self._table.get((id(anchor), extra))
        if hit is not None and hit[0]() is anchor and hit[1] == stamp:
            return hit[2]
        return None

    def put(self, anchor, value: Any, extra: Hashable = None, stamp: Any = None) -> Any:
        """Keep ``value`` for ``anchor`` while it lives; returns ``value``."""
        key, table = (id(anchor), extra), self._table
        table[key] = (weakref.ref(anchor, lambda _, key=key: table.pop(key, None)), stamp, value)
        return value

    def __len__(self) -> int:
        return len(self._table)
