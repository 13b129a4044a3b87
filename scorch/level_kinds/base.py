"""What a level of a format can do, as objects (after TACO's mode formats, Chou et al.,
"Format abstraction for sparse tensor algebra compilers", 2018).

A level stores one dimension of a tensor below its parent level. A *level kind* says which
arrays the level keeps and which operations a kernel may use on it; the planner, the code
generator, output assembly and conversions ask these capabilities and never compare kinds:

* ``full``: every coordinate ``0..size-1`` of every parent position is stored (dense).
* ``locate``: the child position of a coordinate is computed in O(1) (``p * size + c``).
* ``iterate``: the stored coordinates of a parent position can be visited in order.
* ``ordered`` / ``unique``: coordinates under one parent position are sorted / distinct
  (``unique_before(next)``: a coordinate level followed by another one may repeat a
  coordinate; the tuple of the run is unique).
* ``append``: an output level can be built by appending entries in order (every sparse kind);
  ``insert``: written at any position (dense).
* ``has_pos(prev)``: the level keeps a ``pos`` array (one segment per parent position);
  without it the level shares its parent's positions (a coordinate level inside a run, a
  singleton level).
* ``runtime``: the Cython conversion runtime builds this kind itself; others are built by
  their own ``assemble`` (``scorch.conversion``).

A kind is registered once (``register``) under a letter (``"d"``, ``"c"``, ``"q"``, ...) and
aliases; ``LevelKind("c")`` returns the registered object, so kinds pickle by letter.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["LevelKind", "register", "parse_level", "registered"]

_REGISTRY: Dict[str, "LevelKind"] = {}
_KINDS: List["LevelKind"] = []


class LevelKind:
    """Base class of level kinds; one instance per kind (see the module docstring)."""

    letter: str = "?"
    name: str = "?"
    aliases: Tuple[str, ...] = ()
    full = False
    locate = False
    iterate = True
    ordered = True
    append = True
    insert = False
    runtime = False

    def __new__(cls, key=None):
        if cls is LevelKind:   # LevelKind("c"): the registered kind (also how kinds unpickle)
            return parse_level(key)
        return super().__new__(cls)

    def __reduce__(self):
        return (LevelKind, (self.letter,))

    # --- capabilities that depend on the neighbouring levels ------------------------
    @property
    def is_sparse(self) -> bool:
        """Not every coordinate is stored: the level filters the loop over its variable."""
        return not self.full

    @property
    def has_locate(self) -> bool:
        return self.locate

    def has_pos(self, prev: Optional["LevelKind"]) -> bool:
        """Whether the level keeps ``pos`` when the level above it is ``prev`` (None: root)."""
        return False

    def unique_before(self, nxt: Optional["LevelKind"]) -> bool:
        """Coordinates under one parent position are distinct when the next level is ``nxt``."""
        return True

    def output_kind(self) -> "LevelKind":
        """The kind format inference gives an output level fed only by levels of this kind."""
        return self

    # --- building a level of an output or a conversion ------------------------------
    def assemble(self, kinds: Sequence["LevelKind"], k: int, coords: torch.Tensor,
                 parent: torch.Tensor, parent_count: int, size: int):
        """Build level ``k`` (and levels it must build with it) from entries sorted by
        (parent, coordinates) and unique. ``coords``: level-order coordinates (n x L,
        int64); ``parent``: each entry's position at the level above (nondecreasing).
        Returns ``(arrays, parent, count, next_k)``: ``(pos, crd)`` per built level (None
        where the kind keeps no such array), each entry's position at the last built level
        (None: the entry order), the position count there, and the next level to build."""
        raise NotImplementedError(f"level kind {self.name} cannot be built")

    def __repr__(self) -> str:
        return f"scorch.{self.name}"

    __str__ = __repr__


def register(kind: LevelKind) -> LevelKind:
    """Make ``kind`` known to formats (its letter and aliases) and to ``LevelKind(letter)``."""
    for key in (kind.letter, kind.name) + tuple(kind.aliases):
        other = _REGISTRY.get(key)
        if other is not None and other is not kind:
            raise ValueError(f"level kind name {key!r} is taken by {other}")
        _REGISTRY[key] = kind
    setattr(LevelKind, kind.name.upper(), kind)
    if kind not in _KINDS:
        _KINDS.append(kind)
    return kind


def registered() -> Tuple[LevelKind, ...]:
    return tuple(_KINDS)


def parse_level(x) -> LevelKind:
    if isinstance(x, LevelKind):
        return x
    if isinstance(x, str) and x.lower() in _REGISTRY:
        return _REGISTRY[x.lower()]
    letters = ", ".join(f"'{k.letter}' ({k.name})" for k in _KINDS)
    names = ", ".join(f"scorch.{k.name}" for k in _KINDS)
    raise ValueError(f"unknown level kind {x!r}: expected {names} or one of the letters {letters}")


def unique_parents_new(parent: torch.Tensor, coords: torch.Tensor, k: int, end: int) -> torch.Tensor:
    """Entries that start a new (parent, coords[k:end]) group (entries are sorted)."""
    n = coords.shape[0]
    new = torch.ones(n, dtype=torch.bool)
    if n > 1:
        diff = parent[1:] != parent[:-1]
        for j in range(k, end):
            col = coords[:, j]
            diff |= col[1:] != col[:-1]
        new[1:] = diff
    return new


def segments(parent: torch.Tensor, parent_count: int) -> torch.Tensor:
    """``pos`` of a level whose entries have these (sorted) parent positions."""
    counts = (torch.bincount(parent, minlength=parent_count) if parent.numel()
              else torch.zeros(parent_count, dtype=torch.int64))
    pos = torch.zeros(parent_count + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=pos[1:])
    return pos


def segment_positions(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The inverse of ``segments``' question: the positions ``starts[k] .. starts[k] +
    lengths[k] - 1`` of every segment k, one after the other (int64). What a selection of
    segments gathers (rows of CSR picked by an index) and where a segment lands when the
    segments of several levels interleave (CSR matrices side by side)."""
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    first = torch.cumsum(lengths, 0) - lengths          # where each segment starts in the output
    shift = torch.repeat_interleave(starts - first, lengths)
    return torch.arange(total, dtype=torch.int64) + shift
