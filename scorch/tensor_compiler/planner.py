"""Planning an expression for these operands: the schedule (loop order, workspaces, tiling,
format inference: ``schedule.py``) and the per-kernel decisions that follow from it (which
dense operands must be re-laid out, panel widths, the short-rows variant), kept in a
``PlanEntry`` of the plan cache."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional

import torch

from ..formats import Format, as_format
from ..level_storage import Storage
from . import codegen
from .dense_route import dense_route
from .narrowed_gather import narrowed_gather
from .index_notation import Assignment, parse_einsum
from .plans import COMPILER_VERSION, PlanEntry, cached_entry, fmt_key
from .rewrite import block_split, rename_broadcast
from .operand_stats import STATS_MIN_NNZ, operand_stats, stats_class, traced
from .schedule import NoValidOrder, schedule
from .tiling import block_class
from .work_estimate import KEPT_TRANSPOSE_PASSES, TRANSPOSE_PASSES, Statistics

__all__ = ["value_dtype", "kernel_formats", "make_entry", "resolve_out_format", "einsum_entry",
           "broadcast_key", "operand_statistics", "stats_key", "block_key", "small_blocks",
           "reuse_entry"]


class UnsupportedDtypeError(RuntimeError, ValueError):
    """No kernel computes in the operands' promoted dtype (float16, bfloat16, complex,
    bool): a RuntimeError, as torch's "not implemented for 'Half'", and a ValueError, as
    API.md promises for unsupported dtypes (``scorch.UnsupportedDtypeError``). Never a
    TypeError, which torch's operators (``==``, ``!=``, ``+``) turn into NotImplemented:
    ``s16 != 0`` then silently became an identity test, ``True``."""


def value_dtype(ops) -> torch.dtype:
    """The dtype the kernel computes in: the operands' promoted type."""
    dt = None
    dtypes = []
    for x in ops:
        d = x.values.dtype if isinstance(x, Storage) else x.dtype
        dtypes.append(d)
        dt = d if dt is None else torch.promote_types(dt, d)
    if dt == torch.bool or dt not in codegen.CTYPES:
        # reached from any op (a sum, a product, an elementwise op), so the message names the
        # operands (by position, as the kernel's einsum takes them), their types and the way
        # out rather than the op
        name = lambda t: str(t).replace("torch.", "")  # noqa: E731
        kinds = ", ".join(name(t) for t in codegen.CTYPES)
        bad = [n for n, d in enumerate(dtypes) if d == torch.bool or d not in codegen.CTYPES]
        which = ", ".join(f"operand {n} is {name(dtypes[n])}" for n in (bad or range(len(dtypes))))
        raise UnsupportedDtypeError(
            f"scorch: sparse kernels compute in {kinds}; {which}, so the kernel would compute "
            f"in {name(dt)}, which they do not support: convert the operand first (.float() "
            f"for float16 / bfloat16, .to(torch.uint8) or .float() for bool; complex values "
            f"have no kernels)")
    return dt


def kernel_formats(ops) -> List[Optional[Format]]:
    """The format each operand is read in (None: dense strided); blocked operands that are
    not read natively are converted to their unblocked format first."""
    out = []
    for x in ops:
        if isinstance(x, Storage):
            f = x.format
            out.append(Format(f.levels, f.mode_order) if f.block is not None else f)
        else:
            out.append(None)
    return out


def operand_statistics(operand_indices, ops) -> Optional[Statistics]:
    """The statistics the cost model prices loop orders with (``work_estimate``): each
    sparse operand's (``operand_stats``, computed once per pattern), the extents, the
    threads; None when every sparse operand is small (nothing worth estimating)."""
    sparse = {n: x for n, x in enumerate(ops) if isinstance(x, Storage)}
    if not sparse or all(x.nnz < STATS_MIN_NNZ for x in sparse.values()) or \
            any(traced(x.values) for x in sparse.values()):
        return None
    extents = {}
    for idx, x in zip(operand_indices, ops):
        for v, size in zip(idx, x.shape):
            extents.setdefault(v, int(size))
    return Statistics({n: operand_stats(x) for n, x in sparse.items()}, extents,
                      torch.get_num_threads())


def stats_key(ops) -> tuple:
    """The operands' statistics classes (``operand_stats.stats_class``): part of the plan
    key, so a plan priced for a skewed operand is not reused for a uniform one."""
    return tuple(stats_class(x) for x in ops if isinstance(x, Storage))


def unit_mask(x) -> int:
    """Which dimensions of a dense operand have extent 1 (bit ``d``): part of every plan key
    (and warm key: the rank's bits 8 and up), since loop orders are priced with the
    extents. A plan made for a 1-column operand (``k`` outermost costs nothing at K = 1)
    ran a later 64-column one 10-60x slower (``A.t() @ X``, a sparse weight's gradient)."""
    mask = 0
    for d, n in enumerate(x.shape):
        if n == 1:
            mask |= 1 << d
    return mask


def block_key(equation: str, ops) -> tuple:
    """The size class (``tiling.block_class``) of each dense operand's block of three or
    more dimensions that a sparse loop re-reads: its dimensions no sparse operand indexes
    (``E(n,d,h)`` under a gate ``G(b,n)``: ``d x h``). Part of the plan key (and of the
    warm key, so the C warm call, whose key has no such item, leaves these calls to the
    Python path) where a dense operand has three or more dimensions; () otherwise."""
    if not any(not isinstance(x, Storage) and x.dim() >= 3 for x in ops):
        return ()
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    if "." in equation or len(lhs) != len(ops):
        return ("?",)
    indexed = {v for idx, x in zip(lhs, ops) if isinstance(x, Storage) for v in idx}
    sizes = {v: int(n) for idx, x in zip(lhs, ops) for v, n in zip(idx, x.shape)}
    item = max(x.element_size() if not isinstance(x, Storage) else x.values.element_size() for x in ops)

    def cls(idx):
        return block_class(item * math.prod(sizes.get(v, 1) for v in idx if v not in indexed))
    return tuple(-1 if isinstance(x, Storage) or x.dim() < 3 else cls(idx) for idx, x in zip(lhs, ops))


def small_blocks(key: tuple) -> frozenset:
    """The operands ``block_key`` puts in class 0 (their block fits in L1), by number."""
    return frozenset(n for n, c in enumerate(key) if c == 0)


def make_entry(asg: Assignment, operand_indices, ops, out_format: Optional[Format],
               formats=None, fixed_tail=None, ordered: bool = True,
               statistics: Optional[Statistics] = None, small=frozenset()) -> PlanEntry:
    vt = value_dtype(ops)
    sched = schedule(asg, formats if formats is not None else kernel_formats(ops), out_format,
                     fixed_tail, statistics, small)
    out = sched.output
    if not ordered and not out.dense and out.mode == "ws" and out.final_format is None:
        # sorted=False: the workspace drains each fiber as it was touched (no sort)
        out.unsorted = True
    entry = PlanEntry(asg, list(operand_indices), sched, vt, len(asg.output))
    # a dense operand streamed by the innermost loop is read with stride 1 (the kernel is
    # specialized for it): when its layout does not give that, the kernel reads a copy laid
    # out in loop order (e.g. SDDMM's C, read along k)
    entry.relayout.update(codegen.relayouts(sched))
    # ... and in loop order above it too where a sparse loop separates its variables
    # (relayout.out_of_order: per call, from its strides)
    entry.order_relayout.update(codegen.order_relayouts(sched))
    # a dense operand a sparse loop gathers below a loop over its other indices is read
    # with its strides; copied to loop order per call where that pays (relayout.gather_pays)
    entry.gather_relayout.update(codegen.gather_relayouts(sched))
    entry.panels = codegen.panel_widths(sched, vt)
    entry.cache_panels = codegen.cache_panels(sched, vt)
    entry.tiled_panels = codegen.tiled_widths(sched, vt) if entry.cache_panels else ()
    entry.short_rows = codegen.short_rows(sched)
    return entry


def resolve_out_format(out_format, rank: int) -> Optional[Format]:
    if out_format is None:
        return None
    if rank == 0:
        raise ValueError(f"einsum(): out_format={out_format!r} was given but the result is a "
                         f"0-d (scalar) tensor, which has no sparse format")
    return as_format(out_format, rank)


def broadcast_key(equation: str, ops) -> tuple:
    """Which size-1 dimensions of the sparse operands broadcast in this call: part of the
    plan key whenever a sparse operand has a size-1 dimension (a plan made where it does not
    broadcast cannot run a call where it does, and the reverse)."""
    if not any(isinstance(x, Storage) and 1 in x.shape for x in ops):
        return ()
    spec = parse_einsum(equation, [tuple(x.shape) for x in ops])
    return tuple(spec.broadcast[n] if isinstance(x, Storage) else () for n, x in enumerate(ops))


def einsum_entry(equation: str, ops, out_format, ordered: bool = True) -> PlanEntry:
    """The cached plan of ``einsum(equation, *ops)`` (``ordered=False``: of
    ``einsum(..., sorted=False)``)."""
    # size-1 dimensions of sparse operands that broadcast are part of the plan (they are
    # read through a variable of their own); dense operands broadcast through stride 0
    blocks = block_key(equation, ops)
    key = (COMPILER_VERSION, equation, tuple(fmt_key(x) for x in ops),
           broadcast_key(equation, ops), out_format, stats_key(ops), blocks,
           tuple(unit_mask(x) for x in ops if not isinstance(x, Storage))) + \
        (() if ordered else ("unsorted",))

    def make():
        spec = parse_einsum(equation, [tuple(x.shape) for x in ops])
        asg, op_idx = spec.assignment, list(spec.operand_indices)
        if any(spec.broadcast[n] for n, x in enumerate(ops) if isinstance(x, Storage)):
            asg, op_idx = rename_broadcast(spec, ops)
        fmt = resolve_out_format(out_format, len(asg.output))
        split = block_split(asg, op_idx, ops, fmt)
        if split is not None:
            try:
                entry = make_entry(split.assignment, split.operand_indices, ops,
                                   None if fmt is None else Format("d" * len(split.assignment.output)),
                                   split.formats, split.fixed_tail)
            except NoValidOrder:
                entry = None
            if entry is not None and entry.schedule.output.dense:
                entry.split = split.blocks
                entry.orig_output = tuple(asg.output)
                entry.orig_indices = [tuple(i) for i in op_idx]
                return entry
        stats, small = operand_statistics(op_idx, ops), small_blocks(blocks)

        def planned(st: Optional[Statistics], fmt: Optional[Format] = fmt) -> PlanEntry:
            e = make_entry(asg, op_idx, ops, fmt, ordered=ordered, statistics=st, small=small)
            e.dense_route = dense_route(e, lambda: narrowing(make_entry(
                asg, op_idx, ops, Format("d" * len(asg.output)), statistics=st, small=small)))
            return narrowing(e)
        entry = planned(stats)
        entry.reuse = reuse_entry(entry, stats, lambda st, f: planned(st, fmt if fmt is not None else f))
        return entry
    return cached_entry(key, make)


#: the least saving (estimated visits, ~0.15 ns each) a reuse plan must promise: its calls
#: take the Python warm runner (the kept conversion looked up per call), not the C warm
#: call of a plan without transposes; with no minimum, small operands lost (70 x 70 CSC,
#: fully stored, 2 threads: ``einsum`` into a sparse result 31 -> 54 us)
REUSE_MIN_SAVING = 100_000


def _kept_transposes_may_pay(priced) -> bool:
    """Whether a priced order that transposes costs less than the chosen one once its
    transposes are priced as kept (an upper bound of the saving: the output's own
    conversion, not kept, is priced so too): else planning again cannot change the order."""
    if not priced:
        return False
    cut = 1.0 - KEPT_TRANSPOSE_PASSES / TRANSPOSE_PASSES
    chosen = priced[0].estimate.total - cut * priced[0].estimate.transposes
    return any(c.estimate.transposes > 0 and c.estimate.total - cut * c.estimate.transposes < chosen
               for c in priced[1:])


def _route_order(entry: PlanEntry):
    route = entry.dense_route
    return None if route is None else tuple(route.dense_entry.schedule.loop_order)


def narrowing(entry: PlanEntry) -> PlanEntry:
    """``entry`` with its narrowed gather (``narrowed_gather``), where it has one."""
    entry.narrowed = narrowed_gather(entry)
    return entry


def reuse_entry(entry: PlanEntry, stats: Optional[Statistics],
                planned: Callable[[Statistics, Optional[Format]], PlanEntry]) -> Optional[PlanEntry]:
    """The plan a call switches to once its sparse operands' patterns are seen again
    (``execute.run``), where it differs: priced with their transposes kept across calls
    (``work_estimate.KEPT_TRANSPOSE_PASSES``), a transposed order can pay over many calls
    where one call's conversion would not (CSC ``A @ X``, 3000^2, 0.5 %, K = 32: 0.090 ->
    0.052 ms at 1 thread, 0.093 -> 0.032 at 2; converting and keeping the transpose costs
    ~0.7 ms, once, on the call ``kept_conversions.REUSED_AFTER`` says reuses the pattern). None
    where no priced order transposes, the order stays, or the saving is below
    :data:`REUSE_MIN_SAVING`. ``planned(statistics, out_format)`` plans the expression."""
    priced = entry.schedule.estimates
    route_may_change = entry.dense_route is not None and bool(priced) and priced[0].estimate.transposes > 0
    if stats is None or not (_kept_transposes_may_pay(priced) or route_may_change):
        return None
    kept = dataclasses.replace(stats, kept=frozenset(stats.operands))
    # the result's format is the first plan's (inferred from its loop order, Algorithm 4):
    # a call's result does not change format with how often its operands were seen
    out = entry.schedule.output
    same = (Format("d" * len(out.vars)) if out.vars else None) if out.dense else (out.final_format or out.format)
    alt = planned(kept, same)
    transposed = tuple(sorted({ap.tensor for ap in alt.schedule.accesses if ap.sparse and ap.transposed}))
    # the same order is still worth switching to where it transposes: its dense route (a
    # dense output's plan) is priced with the transposes kept too (CSC ``ij,bjk->ikb``:
    # the route's ``j, i, b, k`` scatter 1.46 ms -> ``i, b, j, k`` 0.18 ms)
    if not transposed or not alt.schedule.estimates or (
            alt.schedule.loop_order == entry.schedule.loop_order
            and _route_order(alt) == _route_order(entry)):
        return None
    if entry.schedule.estimates[0].estimate.total - alt.schedule.estimates[0].estimate.total < REUSE_MIN_SAVING:
        return None
    alt.kept_transposes = transposed
    return alt
