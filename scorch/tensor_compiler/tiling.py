"""Per-input tiling: whether this call runs the innermost dense loop in panels, and how wide
(paper Algorithm 3 picks *which* loop at compile time: ``schedule._tiled``)."""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Sequence, Tuple

from .plans import PlanEntry

__all__ = ["PANEL_MIN_ROW", "choose_panel", "panel_for", "l1_cache_bytes", "l2_cache_bytes",
           "choose_cache_panel", "panel_chooser", "gathers_cleared", "relaid_panel_narrower", "block_class"]


PANEL_MIN_ROW = 3.5


def choose_panel(widths: Sequence[int], extent: int, nnz: int, rows: int) -> int:
    """Per-input tiling of the innermost dense loop (paper Algorithm 3 says *which* loop;
    this says whether and how wide). The kernel accumulates an output row of up to
    ``max(widths)`` values in vector registers and reads each dense row it needs once, as
    one contiguous stream. Wider rows (K = 256 float32) are cut into panels of that width,
    each run through the register kernel, when the rows hold at least ``PANEL_MIN_ROW``
    stored entries on average: every panel is another pass over the sparse operand's rows,
    which does not pay for power-law graphs with ~3 entries a row (NotreDame K = 256: whole
    rows 27 ms, 128-wide panels 44 ms) but does from ~4 (4elt 1.7 -> 1.3 ms, Groebner
    1.4 -> 1.1, random_uniform 76 -> 54, mdual 78 -> 69). Rows that fit the registers are
    never cut: cache-sized panels were slower on every matrix measured, uniform or
    power-law (K = 128: random_uniform 23 -> 26-60 ms, mdual 23 -> 31-40 ms).
    ``benchmarks/report_tiling.py`` -> ``benchmarks/results/tiling.md``. 0: whole rows."""
    if not widths:
        return 0
    w = max(widths)
    return w if extent > w and nnz >= PANEL_MIN_ROW * rows else 0


def _sysfs_cache_bytes(index: int, default: int) -> int:
    try:
        with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as fh:
            text = fh.read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return default


@functools.lru_cache(maxsize=1)
def l2_cache_bytes() -> int:
    """One core's L2 cache (sysfs; 1 MiB when unknown: Zen 4's, the smallest we target)."""
    return _sysfs_cache_bytes(2, 1 << 20)


@functools.lru_cache(maxsize=1)
def l1_cache_bytes() -> int:
    """One core's L1 data cache (sysfs index0; 32 KiB when unknown)."""
    return _sysfs_cache_bytes(0, 32 << 10)


def block_class(nbytes: int) -> int:
    """The coarse size class of a block a loop nest re-reads: 0 fits half of L1, 1 half
    of L2, 2 neither. Plans are made per class (``planner.block_key``): re-reading a
    class-0 block per stored entry costs nothing a transpose would save
    (``ij,jkl->ikl``, K x L = 8 x 64: 2 KB), a class-1 one does (64 x 128: 32 KB)."""
    if nbytes <= l1_cache_bytes() // 2:
        return 0
    return 1 if nbytes <= l2_cache_bytes() // 2 else 2


def choose_cache_panel(first: Sequence, extent: int, nnz: int, block: int) -> int:
    """Width of the register panels of a cache tile (``schedule.CacheTile``); ``first`` is
    ``(value size in bytes, register widths, the widths whose kernel is register-tiled,
    whether each pass gathers)``. Each panel is one more pass over the sparse rows, so:
    where a pass gathers (``CacheTile.gathers``, unless the call re-laid the gathered
    operands out to stride 1: :func:`gathers_cleared`), the widest register width (fewest
    passes); else the widest whose panel of the re-read block (``block`` rows x width
    values) fits half of one core's L2, preferring among those the register-tiled widths
    (one load feeds several rows: the MoE forward on AVX2, where a 64-float row leaves no
    registers for a tile, runs 32-float panels, 103 -> 60 ms on a Zen 3 core), else the
    narrowest, for rows wider than it (0: whole rows). The panel loop sits above the sparse
    loop, so unlike :func:`choose_panel` it adds no passes over the block: the MoE expert
    784 x 512 float32 runs in 128-wide panels (392 KB) on AVX-512. Same call shape as
    :func:`choose_panel` (``nnz`` unused), so the warm paths call either."""
    return _cache_width(first, extent, block)


def _cache_width(first: Sequence, extent: int, block: int) -> int:
    size, widths, tiled, gathers = first
    if block <= 0 or not widths:
        return 0
    if gathers:
        width = max(widths)
    else:
        budget = l2_cache_bytes() // 2
        fit = [W for W in widths if W * block * size <= budget]
        width = max([W for W in fit if W in tiled] or fit) if fit else min(widths)
    return width if width < extent else 0


def panel_chooser(entry: PlanEntry) -> Optional[Tuple[Callable, tuple, int, Tuple[str, ...]]]:
    """How a call picks its panel width, for the run paths (general, runner, C fastcall):
    ``(choose, first_argument, threshold, rows_vars)``: ``choose(first_argument, extent,
    nnz, product of rows_vars' sizes)`` runs when the innermost extent exceeds
    ``threshold``. None: the kernel has no panels."""
    s = entry.schedule
    L = s.loop_order[-1] if s.loop_order else None
    if entry.cache_panels:
        widths = tuple(entry.panels)
        first = (entry.value_dtype.itemsize, widths, tuple(entry.tiled_panels), s.cache_tile.gathers)
        return choose_cache_panel, first, min(widths), s.cache_tile.block
    if entry.panels:
        return choose_panel, tuple(entry.panels), max(entry.panels), tuple(v for v in s.output.vars if v != L)
    return None


def gathers_cleared(entry: PlanEntry) -> Optional[Tuple[Tuple[int, int], ...]]:
    """Where a cache tile's passes gather (``CacheTile.gathers``) only from operands that
    may be re-laid out for it (``PlanEntry.gather_relayout``): the (access, dimension) pairs
    that, all at stride 1, make each pass read neighbouring values of a few lines instead
    of a line per stored entry. Then the gathers no longer decide the panel width: the
    register-tiled widths come first, as elsewhere (the MoE expert gradient on a Zen 3
    core, ``x`` b-fastest: 32-wide panels, 2 rows a pass, 74 ms against 94 ms for 128-wide
    panels over row-major ``x``, 1 thread, under load). None: no such tile."""
    tile = entry.schedule.cache_tile
    if not entry.cache_panels or tile is None or not tile.gathers:
        return None
    if not set(tile.gathered) <= set(entry.gather_relayout):
        return None
    return tuple((a, entry.gather_relayout[a][0]) for a in tile.gathered)


def relaid_panel_narrower(entry: PlanEntry, sizes) -> bool:
    """Whether re-laying out a cache tile's gathered operands (:func:`gathers_cleared`)
    changes this call's panel width: only the narrower register-tiled panels gain from the
    copy. At the same width the relaid operand lost (expert gradient on a Zen 3 core, 1
    thread, under load, rows not jammed at these widths: 128-wide 94 -> 135 ms, 64-wide
    120 -> 172-271 ms), so AVX-512, whose gathering and tiled widths are both 128 there,
    keeps row-major ``x``. True where the kernel has no such tile."""
    cleared = gathers_cleared(entry)
    if cleared is None:
        return True
    _choose, first, threshold, block_vars = panel_chooser(entry)
    L = entry.schedule.loop_order[-1]
    if sizes[L] <= threshold:
        return True
    block = math.prod(sizes[v] for v in block_vars)
    wide = _cache_width(first, sizes[L], block) or sizes[L]
    return (_cache_width(first[:3] + (False,), sizes[L], block) or sizes[L]) < wide


def panel_for(entry: PlanEntry, data, sizes) -> int:
    rule = panel_chooser(entry)
    if rule is None:
        return 0
    choose, first, threshold, rows_vars = rule
    cleared = gathers_cleared(entry)
    if cleared is not None and all(data[a].stride(d) == 1 or data[a].shape[d] <= 1 for a, d in cleared):
        first = first[:3] + (False,)
    s = entry.schedule
    L = s.loop_order[-1]
    if sizes[L] <= threshold:
        return 0
    nnz = sum(data[ap.id].values.numel() for ap in s.accesses if ap.sparse)
    return choose(first, sizes[L], nnz, math.prod(sizes[v] for v in rows_vars))
