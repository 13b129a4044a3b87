"""Output assembly: the sparse result a caller gets from what a kernel wrote, a Storage from
the kernel's appended entries (CSR-like rows, or level-major coordinate tuples) or, for
pattern kernels, the pattern operand's level arrays with the kernel's values."""
from __future__ import annotations

import torch

from ..kept_conversions import switched_top_level
from ..level_storage import Level, Storage, index_dtype_for, make_level
from ..level_kinds.assembly import build_levels, segment_chain
from .operands import convert_storage
from .plans import PlanEntry

__all__ = ["assemble", "pattern_ready", "pattern_storage"]


def assemble(entry: PlanEntry, res, sizes) -> Storage:
    """The sparse output from what the kernel returned: ``(pos, crd, vals)`` of a CSR-like
    output (``codegen`` rows assembly), or level-major coordinate tuples and values."""
    out = entry.schedule.output
    if len(res) == 3 and len(out.format.levels) > 1 and segment_chain(out.format.levels) == "chain":
        # a chain of compressed levels (never rows assembly: those levels do not locate)
        levels, values, idt = _chain_levels(out, res, sizes)
    elif len(res) == 3:
        levels, values, idt = _rows_levels(out, res, sizes)
    else:
        levels, values, idt = _tuple_levels(out, res, sizes)
    st = Storage(out.format, tuple(sizes[v] for v in out.vars), levels, values, idt)
    if out.final_format is not None:
        # a DCSR result produced as CSR (``schedule._dense_top_output``) is compressed by its
        # top level alone; any other requested format goes through the runtime's conversion
        switched = switched_top_level(st, out.final_format)
        st = switched if switched is not None else convert_storage(st, out.final_format)
    return st


def _rows_levels(out, res, sizes):
    """Rows assembly: the kernel built the last level's ``pos``/``crd`` itself."""
    pos, crd, vals = res
    pos, crd, vals = torch.from_numpy(pos), torch.from_numpy(crd), torch.from_numpy(vals)
    levels = [make_level(kind, out.vars.index(v), sizes[v])
              for kind, v in zip(out.format.levels[:-1], out.level_vars)]
    last = out.level_vars[-1]
    # sorted=False (OutputPlan.unsorted): the kernel drained each row unsorted
    levels.append(make_level(out.format.levels[-1], out.vars.index(last), sizes[last], pos, crd,
                             ordered=not out.unsorted))
    return levels, vals, crd.dtype


def _tuple_levels(out, res, sizes):
    """Sorted, unique coordinate tuples (level-major) -> each level's arrays, top down."""
    crd, vals = res
    kinds = out.format.levels
    if len(kinds) == 1 and not kinds[0].full and kinds[0].has_pos(None):
        # a sparse vector (a reduction such as CSR.sum(0)): one segment over the sorted,
        # unique coordinates, with no per-level passes
        n = vals.shape[0]
        idt = index_dtype_for(tuple(sizes[v] for v in out.vars), n)
        pos = torch.tensor([0, n], dtype=idt)
        c = torch.from_numpy(crd)
        v = out.level_vars[0]
        return [Level(kinds[0], 0, sizes[v], pos, c if c.dtype == idt else c.to(idt))], \
            torch.from_numpy(vals), idt
    # the kernel's coordinates are in the index type already (int64 only where an extent
    # or the count needs it)
    coords = torch.from_numpy(crd).view(len(out.level_vars), -1).t()
    built, values, count = build_levels(out.format.levels, coords, torch.from_numpy(vals),
                                        [sizes[v] for v in out.level_vars])
    idt = index_dtype_for(tuple(sizes[v] for v in out.vars), max(count, coords.shape[0]))
    levels = [Level(kind, out.vars.index(v), sizes[v],
                    None if pos is None else pos.to(idt), None if c is None else c.to(idt))
              for kind, v, (pos, c) in zip(out.format.levels, out.level_vars, built)]
    return levels, values, idt


def _chain_levels(out, res, sizes):
    """A chain of compressed levels the kernel built (``codegen._tuples_epilogue``): the last
    level's coordinates, the values, and the other levels packed in one array (their
    counts ``m_0 .. m_{R-2}``, then each level's crd and the next level's pos): every level
    array is a view of those, with no assembly pass."""
    last, vals, up = (torch.from_numpy(x) for x in res)
    n, U = vals.shape[0], len(out.level_vars) - 1
    m = up[:U].tolist()
    idt = index_dtype_for(tuple(sizes[v] for v in out.vars), n)
    pos, at, arrays = torch.tensor([0, m[0]], dtype=up.dtype), U, []
    for k in range(U):
        arrays.append((pos, up[at:at + m[k]]))
        pos = up[at + m[k]:at + 2 * m[k] + 1]
        at += 2 * m[k] + 1
    arrays.append((pos, last))
    levels = [Level(kind, out.vars.index(v), sizes[v], p if p.dtype == idt else p.to(idt),
                    c if c.dtype == idt else c.to(idt))
              for kind, v, (p, c) in zip(out.format.levels, out.level_vars, arrays)]
    return levels, vals, idt


def pattern_ready(entry: PlanEntry, sizes) -> bool:
    """A pattern-output kernel (``OutputPlan.pattern``) runs only when every reduction is
    non-empty (an empty reduction stores nothing; that case goes through the general path)."""
    return all(sizes[v] > 0 for v in entry.assignment.reduction)


def pattern_storage(entry: PlanEntry, P: Storage, values: torch.Tensor, sizes) -> Storage:
    """The output of a pattern kernel: ``P``'s level arrays (shared, as views share them)
    with the kernel's values, levels re-numbered to the output's dimensions."""
    s = entry.schedule
    out = s.output
    ap = s.accesses[out.pattern]
    if tuple(out.vars) == tuple(ap.indices) and out.format == P.format:
        return P.on_pattern(values)      # the same dims in the same order (SDDMM)
    levels = [Level(lv.kind, out.vars.index(ap.indices[lv.dim]), lv.size, lv.pos, lv.crd,
                    ordered=lv.ordered)
              for lv in P.levels]
    levels += [Level(kind, out.vars.index(v), sizes[v], None, None)   # pattern_suffix's
               for kind, v in zip(out.format.levels[len(levels):], out.level_vars[len(levels):])]
    return Storage(out.format, tuple(sizes[v] for v in out.vars), levels, values, P.index_dtype)
