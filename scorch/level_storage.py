"""Level storage: the arrays behind a sparse tensor, one ``Level`` per stored dimension.

This is the contract between the tensor type, the conversion runtime and generated
kernels. Positions run level by level from a single root position 0:

* dense level of ``size`` n: child position = parent position * n + coordinate;
  ``count = parent_count * n``.
* compressed level: segment of parent position p is ``pos[p]:pos[p+1]``; ``crd[q]`` is the
  coordinate at position q; ``count = pos[parent_count]``.
* coordinate level heading a run of coordinate levels: like compressed (``pos`` and
  ``crd``) except that a coordinate may repeat inside a segment when the next level is a
  coordinate level too; the tuple of coordinates of the whole run is sorted and unique.
* coordinate level inside a run (its parent is a coordinate level): only ``crd``, with the
  same positions as its parent (``count = parent_count``).

``values`` has one entry per position of the last level. For a blocked format the levels
are the format's levels over the grid of blocks followed by one dense level per dimension
(in dimension order) over the inside of a block, so a stored block is a row-major array.

All ``pos``/``crd`` arrays are contiguous 1-d torch tensors of one index dtype: int32 when
every dimension and every level's position count fit, else int64.

Coordinates within a segment are sorted unless the level says otherwise (``ordered=False``:
only ``einsum(..., sorted=False)`` makes such a level, unique coordinates in any order, as
scipy's SpGEMM leaves them). Consumers that need order (co-iteration merges, binary-search
locate, conversion) read :meth:`Storage.with_sorted_coordinates` instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .formats import Format, LevelKind, dense

__all__ = ["Level", "Storage", "make_level", "index_dtype_for", "sorted_segment_keys", "INT32_MAX",
           "materialized"]

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Level:
    """One stored dimension: its kind, which tensor dimension it indexes, its extent, and
    the arrays the kind needs (``pos`` for compressed and run-heading coordinate levels,
    ``crd`` for compressed and coordinate levels)."""

    kind: LevelKind
    dim: int
    size: int
    pos: Optional[torch.Tensor] = None
    crd: Optional[torch.Tensor] = None
    block_inner: bool = False  # a dense level inside a block
    ordered: bool = True       # coordinates sorted within each segment (False: any order)

    @property
    def has_pos(self) -> bool:
        return self.pos is not None


_new_object = object.__new__


def materialized(t: torch.Tensor) -> torch.Tensor:
    """``t`` as its memory reads: torch's backward formulas hand out "efficient zero tensors"
    (``sgn``'s, ``heaviside``'s gradient) whose data pointer is null, which a kernel reading
    ``data_ptr()`` would dereference; and a view with torch's lazy negative or conjugate bit
    (``z.conj().imag``, ``z.conj()``) holds the other sign in memory."""
    if t._is_zerotensor():
        return torch.zeros(t.shape, dtype=t.dtype)
    if t.is_neg() or t.is_conj():
        return t.resolve_conj().resolve_neg()
    return t


def make_level(kind: LevelKind, dim: int, size: int, pos: Optional[torch.Tensor] = None,
               crd: Optional[torch.Tensor] = None, ordered: bool = True) -> Level:
    """``Level(kind, dim, size, pos, crd, ordered=ordered)`` without the frozen dataclass's
    ``object.__setattr__`` per field (~1.0 -> ~0.4 us): for output assembly on the warm path,
    where a small kernel's whole call is ~20 us."""
    lv = _new_object(Level)
    lv.__dict__.update(kind=kind, dim=dim, size=size, pos=pos, crd=crd, block_inner=False, ordered=ordered)
    return lv


def index_dtype_for(shape: Sequence[int], max_count: int) -> torch.dtype:
    """int32 when every extent and every position count fits, else int64."""
    biggest = max([int(max_count)] + [int(s) for s in shape])
    return torch.int32 if biggest <= INT32_MAX else torch.int64


def level_sizes(shape: Sequence[int], fmt: Format) -> Tuple[Tuple[int, int, bool], ...]:
    """(dim, size, block_inner) of every stored level of ``fmt`` for a tensor of ``shape``."""
    if fmt.block is None:
        return tuple((d, int(shape[d]), False) for d in fmt.mode_order)
    outer = tuple((d, int(shape[d]) // fmt.block[d], False) for d in fmt.mode_order)
    inner = tuple((d, fmt.block[d], True) for d in range(fmt.rank))
    return outer + inner


def level_kinds(fmt: Format) -> Tuple[LevelKind, ...]:
    """The kind of every stored level, inner block levels included."""
    if fmt.block is None:
        return fmt.levels
    return fmt.levels + (dense,) * fmt.rank


def run_heads(kinds: Sequence[LevelKind]) -> Tuple[bool, ...]:
    """For each level: does it carry ``pos`` (compressed, or coordinate heading a run)?"""
    return tuple(kind.has_pos(kinds[k - 1] if k else None) for k, kind in enumerate(kinds))


class Storage:
    """The arrays of one sparse tensor in one format. Immutable: conversions build a new
    Storage, views (permute, detach) share the arrays, and no field is ever reassigned, so
    the compiler caches per Storage what a warm call needs (``_sig``: a small int naming
    format, dtypes, size-1 dimensions and contiguity; ``_ptrs``: the arrays' addresses)."""

    __slots__ = ("format", "shape", "levels", "values", "index_dtype", "_sig", "_ptrs", "_sorted",
                 "_coords")

    def __init__(self, format: Format, shape: Sequence[int], levels: Sequence[Level],
                 values: torch.Tensor, index_dtype: Optional[torch.dtype] = None) -> None:
        self.format = format
        self.shape = tuple(int(s) for s in shape)
        self.levels = tuple(levels)
        self.values = values
        if index_dtype is None:
            index_dtype = next((a.dtype for lv in self.levels for a in (lv.pos, lv.crd)
                                if a is not None), torch.int32)
        self.index_dtype = index_dtype
        self._sig = None
        self._ptrs = None
        self._sorted = None
        self._coords = None

    def on_pattern(self, values: torch.Tensor) -> "Storage":
        """This storage's levels (shared) holding ``values`` (fresh, contiguous, of
        ``nnz`` entries): a kernel's pattern output. Built field by field (a warm SDDMM
        call's result, ~0.5 us against ~2.5 us through ``__init__``); the signature carries
        over where the values' dtype is this storage's (same pattern, same statistics)."""
        st = _bare_storage(self.format, self.shape, self.levels, values, self.index_dtype)
        mine = self.values
        st._sig = self._sig if values.dtype == mine.dtype and (
            mine.is_contiguous() or mine.stride() == (0,)) else None   # (0: a pattern_only)
        st._coords = self._coords      # the same levels: the same coordinates
        return st

    def pattern_only(self) -> "Storage":
        """This storage's levels and shape with values that hold no memory (one zero seen
        ``nnz`` times): what a backward keeps of a pattern. A graph kept alive after its
        backward (losses gathered in a list) then holds the index arrays, not a copy of
        every value array it saw (71 MiB over 20 steps of sparse attention on NotreDame)."""
        v = self.values
        key = (v.dtype, v.numel())
        zeros = _NO_VALUES.get(key)
        if zeros is None:           # one per dtype and count (read-only: never written)
            if len(_NO_VALUES) > 512:
                _NO_VALUES.clear()
            zeros = _NO_VALUES[key] = torch.zeros((), dtype=v.dtype).expand(v.numel())
        st = _bare_storage(self.format, self.shape, self.levels, zeros, self.index_dtype)
        st._sig = self._sig if v.is_contiguous() else None
        st._coords = self._coords
        return st

    # pickling and copies carry the arrays, never the caches (addresses are per process)
    def __getstate__(self):
        return (self.format, self.shape, self.levels, self.values, self.index_dtype)

    def __setstate__(self, state) -> None:
        self.format, self.shape, self.levels, self.values, self.index_dtype = state
        self._sig = None
        self._ptrs = None
        self._sorted = None
        self._coords = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def ordered(self) -> bool:
        """Whether every level's coordinates are sorted within each segment (the default;
        False only for an ``einsum(..., sorted=False)`` result)."""
        return all(lv.ordered for lv in self.levels)

    def with_sorted_coordinates(self) -> "Storage":
        """This storage with every segment's coordinates sorted (itself when already
        ordered). One vectorized sort over the stored entries, kept on the storage, so a
        consumer that needs order pays it once."""
        if self.ordered:
            return self
        if self._sorted is None:
            self._sorted = _sort_segments(self)
        return self._sorted

    @property
    def nnz(self) -> int:
        """Stored entries (explicit zeros and the insides of dense levels included)."""
        return self.values.numel()

    def arrays(self):
        """Every tensor the storage holds, for memory accounting and sharing checks."""
        out = []
        for lv in self.levels:
            out.extend(a for a in (lv.pos, lv.crd) if a is not None)
        out.append(self.values)
        return out

    def shares_pattern(self, other: "Storage") -> bool:
        """Whether ``other`` is over this storage's very index arrays (same format and shape;
        the same tensors, or views of the same memory). Identity only, never contents: a
        per-call check on hot paths, and equal patterns in other arrays are still computed
        right by a kernel."""
        if self is other:
            return True
        if self.shape != other.shape or not (self.format is other.format or self.format == other.format):
            return False
        if self.levels is other.levels:
            return True
        for la, lb in zip(self.levels, other.levels):
            for x, y in ((la.pos, lb.pos), (la.crd, lb.crd)):
                if x is y:
                    continue
                if x is None or y is None or x.data_ptr() != y.data_ptr() or x.shape != y.shape:
                    return False
        return True

    def same_pattern(self, other: "Storage") -> bool:
        """Whether ``other`` stores the same positions in the same order (same format and
        shape, equal index arrays, in any arrays): ``shares_pattern`` first, then a
        comparison of the contents, O(entries)."""
        if self.shares_pattern(other):
            return True
        if self.shape != other.shape or not (self.format is other.format or self.format == other.format):
            return False
        for la, lb in zip(self.levels, other.levels):
            for x, y in ((la.pos, lb.pos), (la.crd, lb.crd)):
                if (x is None) != (y is None):
                    return False
                if x is not None and (x.shape != y.shape or not torch.equal(x, y.to(x.dtype))):
                    return False
        return True

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.arrays())

    def permuted(self, dims: Sequence[int]) -> "Storage":
        """The same arrays seen as ``t.permute(dims)``: only dimension labels change."""
        if self.format.block is not None:
            # inner block levels must stay in dimension order: a permuted block is no longer
            # row-major, so blocked tensors are permuted by conversion instead.
            raise NotImplementedError("permute of a blocked tensor needs a conversion")
        inverse = [0] * self.ndim
        for new, old in enumerate(dims):
            inverse[old] = new
        # (unblocked levels, so make_level's fields are all there are: ~1 us less a level,
        # a third of ``A.t()``)
        levels = tuple(make_level(lv.kind, inverse[lv.dim], lv.size, lv.pos, lv.crd, lv.ordered)
                       for lv in self.levels)
        return _bare_storage(self.format.permuted(dims), tuple(self.shape[d] for d in dims), levels,
                             self.values, self.index_dtype)

    def __repr__(self) -> str:
        return (f"Storage(format={self.format}, shape={self.shape}, nnz={self.nnz}, "
                f"dtype={self.dtype}, index_dtype={self.index_dtype})")


#: (dtype, count) -> a zero seen ``count`` times (``Storage.pattern_only``'s values)
_NO_VALUES: dict = {}


def _bare_storage(fmt: Format, shape: tuple, levels: tuple, values: torch.Tensor,
                  index_dtype: torch.dtype) -> Storage:
    """A Storage built field by field from parts that are already checked (a view of
    another's arrays): ``__init__``'s normalising costs ~2 us on a warm path of a few."""
    st = _new_object(Storage)
    st.format, st.shape, st.levels = fmt, shape, levels
    st.values, st.index_dtype = values, index_dtype
    st._sig = st._ptrs = st._sorted = st._coords = None
    return st


def _sort_segments(st: Storage) -> Storage:
    """``st`` with the coordinates of its unordered levels sorted within each segment. Only
    a last level (a leaf: every position carries one value) is ever unordered, so its
    entries and values move together: one stable sort of (segment, coordinate) keys."""
    levels = list(st.levels)
    k = len(levels) - 1
    if any(not lv.ordered for lv in levels[:-1]) or levels[k].pos is None or levels[k].crd is None:
        raise NotImplementedError(
            f"sorting the coordinates of {st!r}: only a compressed last level may be unordered")
    lv = levels[k]
    _, order = sorted_segment_keys(lv.pos, lv.crd, lv.size)
    levels[k] = Level(lv.kind, lv.dim, lv.size, lv.pos, lv.crd[order].contiguous(),
                      lv.block_inner, True)
    return Storage(st.format, st.shape, levels, st.values[order].contiguous(), st.index_dtype)


def sorted_segment_keys(pos: torch.Tensor, crd: torch.Tensor,
                        size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The int64 keys ``segment * size + coordinate`` of a compressed level's entries, sorted
    (stable), and the order that sorts them: every segment's coordinates in order."""
    pos64 = pos.to(torch.int64)
    owner = torch.repeat_interleave(torch.arange(pos64.numel() - 1, dtype=torch.int64), pos64.diff())
    return torch.sort(owner * max(size, 1) + crd.to(torch.int64), stable=True)
