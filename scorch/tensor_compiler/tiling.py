"""Per-input tiling: whether this call runs the innermost dense loop in panels, and how wide
(paper Algorithm 3 picks *which* loop at compile time: ``schedule._tiled``)."""
from __future__ import annotations

from typing import Sequence

from .plans import PlanEntry

__all__ = ["PANEL_MIN_ROW", "choose_panel", "panel_for"]


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


def panel_for(entry: PlanEntry, data, sizes) -> int:
    if not entry.panels:
        return 0
    s = entry.schedule
    L = s.loop_order[-1]
    rows = 1
    for v in s.output.vars:
        if v != L:
            rows *= sizes[v]
    nnz = sum(data[ap.id].values.numel() for ap in s.accesses if ap.sparse)
    return choose_panel(entry.panels, sizes[L], nnz, rows)
