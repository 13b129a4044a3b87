"""Values kept per live tensor: the one mechanism behind scorch's per-array caches (a
pattern's ones, its converted forms, a level's distinct coordinates, a checked torch
layout). An entry is keyed by the tensor's identity (plus an optional ``extra`` key), holds
a weak reference so it goes when the tensor is freed, and a ``stamp`` (a version counter,
a size, array ids) that must still match for a hit: an in-place change misses.

A version counter sees only writes through torch tensors that share it. Memory that others
can write unseen (numpy / scipy arrays shared by ``from_scipy`` and ``to_scipy``, a torch
sparse layout's arrays, which the tensors given to its constructor alias with counters of
their own) is marked :func:`untracked`: :func:`version` then never repeats for it, so every
cache stamped with it misses, and what is worth keeping for such memory is kept against a
copy of the contents instead (``kept_conversions``: a transpose's pattern)."""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Dict, Hashable, Optional, Set

__all__ = ["TensorKeyedCache", "version", "counter", "untracked", "is_untracked"]

#: stamps for tensors that track no version (inference tensors), each used once
_UNVERSIONED = itertools.count(-2, -1)


def version(t) -> int:
    """``t._version``; for a tensor made under ``torch.inference_mode()`` (which tracks no
    version counter, and reading it raises) or over :func:`untracked` memory a number never
    returned before, so a cache stamped with it never hits: nothing kept is trusted for
    memory that may have changed unseen."""
    try:
        v = t._version
    except RuntimeError:
        return next(_UNVERSIONED)
    if _UNTRACKED and is_untracked(t):
        return next(_UNVERSIONED)
    return v


def counter(t) -> int:
    """``t``'s version counter even over :func:`untracked` memory (fresh for an inference
    tensor): for a cache whose staleness costs only speed, never a wrong result (operand
    statistics that price plans), which :func:`version` would recompute every call."""
    try:
        return t._version
    except RuntimeError:
        return next(_UNVERSIONED)


#: ids of the untracked storages (a storage is the same Python object while its memory
#: lives: torch preserves it; the id goes when the memory is freed)
_UNTRACKED: Set[int] = set()


def _storage(t):
    try:
        return t.untyped_storage()
    except (RuntimeError, TypeError, NotImplementedError):   # sparse layouts, scorch's tensors
        return None


def is_untracked(t) -> bool:
    """Whether ``t``'s memory is :func:`untracked` (by any view of it)."""
    s = _storage(t)
    return s is not None and id(s) in _UNTRACKED


def untracked(t) -> None:
    """Mark ``t``'s memory (every view of it) as written where no version counter sees it,
    for as long as the memory lives: arrays shared with numpy (``from_scipy``, ``to_scipy``)
    or with a torch sparse tensor (its constructor's arguments; ``to_torch``'s result,
    whose ``values()`` moves only its own counter). Not undone when the other side goes: a
    write made meanwhile left this side's counters where they were, so what was kept
    before would hit again."""
    s = _storage(t)
    if s is None or id(s) in _UNTRACKED:
        return
    _UNTRACKED.add(id(s))
    weakref.finalize(s, _UNTRACKED.discard, id(s))


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
