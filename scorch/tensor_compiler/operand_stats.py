"""What the cost model knows about a sparse operand beyond its format: stored entries,
density per level, the spread of entries over segments (rows of CSR, nonempty rows of
DCSR: max/mean and coefficient of variation) and over the last level's coordinates
(distinct columns, the busiest column against the mean).

Computed once per pattern from the level arrays with vectorized torch ops (``O(segments)``
from ``pos``, plus one ``bincount`` over the last level's coordinates) and kept in a
:class:`~scorch.tensor_cache.TensorKeyedCache` on the level arrays, so storages sharing a
pattern (an SDDMM result, new values on the same pattern) share them.

Plans are cached per format, not per tensor; :func:`stats_class` is the coarse class of an
operand (stored entries to within a factor of 4, skewed or not) that the plan key carries,
so a skewed and a uniform matrix of one format get plans of their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..level_storage import Storage
from ..tensor_cache import TensorKeyedCache, counter

__all__ = ["LevelStats", "OperandStats", "operand_stats", "stats_class", "fits_dense_level",
           "SKEW_SPREAD", "STATS_MIN_NNZ", "DENSE_LEVEL_PER_ENTRY"]

#: a segment this many times longer than the mean one marks the operand skewed (power-law
#: graphs: NotreDame's longest row is ~700x its mean; finite-element meshes stay under 4)
SKEW_SPREAD = 16.0
#: below this many stored entries no statistics are computed: every plan is cheap to run
#: and a warm call should not pay for them (class ``(0, False)``)
STATS_MIN_NNZ = 4096

#: a dense level over a dimension of at most this many coordinates a stored entry (or
#: :data:`DENSE_LEVEL_FLOOR`) is affordable (``fits_dense_level``), as for COO operands of
#: a product read as CSR (``api._products_read_compressed``)
DENSE_LEVEL_PER_ENTRY = 8
DENSE_LEVEL_FLOOR = 1 << 16

_cache = TensorKeyedCache()


def fits_dense_level(shape: Tuple[int, ...], nnz: int) -> bool:
    """Whether an array over any one dimension of a tensor of ``shape`` storing ``nnz``
    entries costs no more than a few words a stored entry: a compressed top level the
    compiler reads dense (``work_estimate.dense_top_reads``), a DCSR result produced as
    CSR (``schedule``). False for a hypersparse operand (20M x 20M, 1,000 entries: an 80 MB
    ``pos`` for 8 KB of entries)."""
    return max(shape, default=0) <= max(DENSE_LEVEL_PER_ENTRY * nnz, DENSE_LEVEL_FLOOR)


@dataclass(frozen=True)
class LevelStats:
    """One stored level: ``count`` positions (stored coordinates), ``density`` = count /
    (parent positions x size); for a level with ``pos``, its segments' entry counts:
    ``seg_mean``, ``seg_max``, ``seg_cv`` (standard deviation / mean)."""
    dim: int
    kind: str
    size: int
    count: int
    density: float
    seg_mean: float = 0.0
    seg_max: int = 0
    seg_cv: float = 0.0

    @property
    def spread(self) -> float:
        """Longest segment over the mean one (1: all alike)."""
        return self.seg_max / self.seg_mean if self.seg_mean > 0 else 1.0


@dataclass(frozen=True)
class OperandStats:
    """Statistics of one sparse operand (see the module docstring)."""
    shape: Tuple[int, ...]
    nnz: int
    levels: Tuple[LevelStats, ...]
    distinct_last: int          # distinct coordinates of the last level (columns touched)
    last_spread: float          # the busiest last-level coordinate's entries / the mean

    @property
    def segments(self) -> Optional[LevelStats]:
        """The deepest level with segments (CSR's and DCSR's columns level: its segments
        are the rows; a CSF's last level: its fibers), or None."""
        return next((lv for lv in reversed(self.levels) if lv.seg_mean > 0), None)

    @property
    def row_spread(self) -> float:
        seg = self.segments
        return seg.spread if seg is not None else 1.0

    @property
    def skewed(self) -> bool:
        return self.row_spread >= SKEW_SPREAD

    def summary(self) -> str:
        seg = self.segments
        rows = (f", rows mean {seg.seg_mean:.1f} max {seg.seg_max} (max/mean {seg.spread:.1f}, "
                f"cv {seg.seg_cv:.2f})" if seg is not None else "")
        dens = "/".join(f"{lv.density:.3g}" for lv in self.levels)
        return (f"nnz {self.nnz}{rows}, distinct last-level coords {self.distinct_last} "
                f"(busiest/mean {self.last_spread:.1f}), density per level {dens}"
                f"{', skewed' if self.skewed else ''}")


def _stamp(st: Storage, anchor: torch.Tensor) -> tuple:
    """What the cached statistics of ``st`` are valid for (its pattern, unmodified). The
    anchor's version counter even over ``untracked`` memory (a scipy matrix's): statistics
    only price plans, so a write they miss costs speed, never a wrong result, and
    recomputing them each call cost a scipy-built operand O(rows) a call."""
    return (st.shape, st.nnz, st.format, counter(anchor))


def _anchor(st: Storage) -> torch.Tensor:
    for lv in reversed(st.levels):
        if lv.pos is not None:
            return lv.pos
    return st.values


def traced(t: torch.Tensor) -> bool:
    """Whether ``t`` is a fake tensor of torch.compile's tracing: shapes and dtypes, no data
    (reading it, even one element, abandons the whole graph). A plan made then prices its
    loop orders without statistics; the call that runs the graph plans with them."""
    return isinstance(t, FakeTensor)


def operand_stats(st: Storage) -> OperandStats:
    """The statistics of ``st`` (computed once per pattern, see the module docstring)."""
    anchor = _anchor(st)
    stamp = _stamp(st, anchor)
    hit = _cache.get(anchor, "stats", stamp)
    if hit is not None:
        return hit
    return _cache.put(anchor, _compute(st), "stats", stamp)


def _compute(st: Storage) -> OperandStats:
    levels = []
    parents = 1
    for lv in st.levels:
        if lv.pos is not None:
            pos = lv.pos.to(torch.int64)
            count = int(pos[-1]) if pos.numel() else 0
            seg = pos.diff().to(torch.float64)
            mean = count / max(seg.numel(), 1)
            smax = int(seg.max()) if seg.numel() else 0
            cv = float(seg.std(unbiased=False)) / mean if mean > 0 and seg.numel() > 1 else 0.0
            stats = LevelStats(lv.dim, lv.kind.letter, lv.size, count,
                               count / max(parents * lv.size, 1), mean, smax, cv)
        elif lv.crd is not None:            # a level sharing its parent's positions
            count = parents
            stats = LevelStats(lv.dim, lv.kind.letter, lv.size, count, 1.0 / max(lv.size, 1))
        else:                               # dense
            count = parents * lv.size
            stats = LevelStats(lv.dim, lv.kind.letter, lv.size, count, 1.0)
        levels.append(stats)
        parents = count
    distinct, spread = 0, 1.0
    last = st.levels[-1] if st.levels else None
    if last is not None and last.crd is not None and last.crd.numel():
        # (bincount reads int32 coordinates as they are: an int64 copy was 8 bytes a stored
        # entry held on a first call, 6.4 MB for 800k entries)
        hist = torch.bincount(last.crd, minlength=last.size) \
            if last.size <= 4 * last.crd.numel() + (1 << 16) else \
            torch.unique(last.crd, return_counts=True)[1]
        distinct = int((hist > 0).sum())
        spread = float(hist.max()) * distinct / last.crd.numel()
    elif last is not None and last.crd is None:
        distinct = last.size
    return OperandStats(tuple(st.shape), st.nnz, tuple(levels), distinct, spread)


def stats_class(st: Storage) -> tuple:
    """The coarse class a plan is made for: (stored entries' base-4 magnitude, skewed,
    hypersparse: a dimension too long for a dense level, ``fits_dense_level``; a plan that
    reads a DCSR operand as CSR is never reused for one). Small operands (<
    :data:`STATS_MIN_NNZ`) are class ``(0, False)`` with nothing computed (their plans are
    priced without statistics); the skew needs only the segments (``O(rows)``, no pass over
    the coordinates)."""
    n = st.nnz
    if n < STATS_MIN_NNZ:
        return (0, False)
    long = not fits_dense_level(st.shape, n)
    anchor = _anchor(st)
    if traced(anchor):
        return ((n.bit_length() + 1) // 2, False, long)   # no data to read (torch.compile's fakes)
    stamp = _stamp(st, anchor)
    skewed = _cache.get(anchor, "skewed", stamp)
    if skewed is None:
        full = _cache.get(anchor, "stats", stamp)
        if full is not None:
            skewed = full.skewed
        else:
            # the segments of the deepest level with pos (the one operand_stats reads)
            seg = anchor.diff() if anchor is not st.values and anchor.numel() > 1 else None
            skewed = bool(seg is not None and int(anchor[-1]) > 0 and
                          int(seg.max()) * seg.numel() >= SKEW_SPREAD * int(anchor[-1]))
        _cache.put(anchor, skewed, "skewed", stamp)
    return ((n.bit_length() + 1) // 2, skewed, long)
