"""Running a plan: the general path (operands prepared: split, transposed, cast, re-laid out;
the kernel for their index widths built or loaded; arguments bound; the output assembled)
and the warm runner it installs after the first call (``runner.py``, ``fastcall``)."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..formats import Format
from ..kept_conversions import converted_partner, reformatted, seen_again
from . import build, codegen
from .arguments import arg_table, arg_values
from .allocate import empty_output
from .assemble import assemble, pattern_ready, pattern_storage
from .canonical import depth_name
from .frontend import bind_sizes
from .operands import cast_storage, convert_storage, unblocked
from .plans import PlanEntry
from .relayout import gather_pays, in_dimension_order, out_of_order, relayout, relayout_pays
from .rewrite import inner_var, outer_var, split_operand
from .runner import make_runner
from .schedule import dimension_permutation, pattern_suffix
from .shared_pattern import run_values, values_plan
from . import threads
from .threads import work_of
from .tiling import panel_for, relaid_panel_narrower

__all__ = ["run", "run_general", "prepare_operands", "kernel_for", "short_kernel", "index_key"]


def prepare_operands(entry: PlanEntry, ops, sizes, orig=None):
    """Per access: the storage (transposed / unblocked / cast) or the dense tensor."""
    vt = entry.value_dtype
    data = {}
    for ap in entry.schedule.accesses:
        x = ops[ap.tensor]
        if ap.sparse:
            for v, s in zip(ap.indices, x.shape):
                if s != sizes[v]:
                    raise NotImplementedError(
                        f"einsum(): broadcasting size-1 dimension of sparse operand {ap.tensor} "
                        f"(subscript {v}) is not supported")
            st = x
            if st.format.block is not None:
                st = unblocked(st)
            if ap.transposed and orig is not None and orig[ap.tensor].format.block is not None:
                o = orig[ap.tensor]   # natively read blocked operand: re-order its block grid
                grid = ap.format.mode_order[:o.ndim]
                st = split_operand(entry.split, entry.orig_indices, ap.tensor, convert_storage(o, Format(o.format.levels, grid, o.format.block)))
            elif ap.transposed:
                # seen again (a fixed pattern: a training step's attention scores, an
                # adjacency), the transpose is a kept permutation and one gather; a
                # reuse plan runs only on a pattern seen again: kept at once
                st = reformatted(st, ap.format) if entry.kept_transposes else converted_partner(st, ap.format)
            data[ap.id] = cast_storage(st, vt)
        else:
            if x.dtype != vt:
                x = x.to(vt)
            rl = entry.relayout.get(ap.id)
            if rl is not None:
                full = tuple(sizes[v] for v in ap.indices)
                d = rl[0]
                if x.shape[d] != full[d]:
                    # broadcast along the streamed dimension: materialize that dimension only
                    # (other size-1 dimensions are read with stride 0; expanding them all
                    # would copy a column against a 2M x 2M matrix at full size)
                    x = x.expand(tuple(full[k] if k == d else s for k, s in enumerate(x.shape)))
                if x.stride(d) != 1 and full[d] > 1:
                    x = _broadcast_rows_once(x, d)
                if x.stride(d) != 1 and full[d] > 1 and _relayout_pays(entry, ops, x, full[d]):
                    x = relayout(x, rl[1], rl[2], threads.threads_for, ap.id)  # scratch: this call only
                elif ordered_relayout(entry, ops, ap, x):
                    x = relayout(x, rl[1], rl[2], threads.threads_for, ap.id)
            elif gathered_relayout(entry, ops, ap, x, sizes):
                rl = entry.gather_relayout[ap.id]
                x = relayout(x, rl[1], rl[2], threads.threads_for, ap.id)  # scratch: this call only
            data[ap.id] = x
    return data


def _broadcast_rows_once(x: torch.Tensor, d: int) -> torch.Tensor:
    """A streamed operand that is broadcast (stride 0) along other dimensions and not laid
    out at stride 1 along ``d``: one copy of its distinct values made stride 1 along ``d``
    and broadcast back (the kernel reads stride 0), instead of a relayout of the whole
    expanded tensor. ``(A @ X).sum().backward()`` hands ``A^T`` a gradient of ones
    expanded to N x K: copied whole, 8 MB a call at N = 15,606, K = 128. ``x`` itself
    where nothing is broadcast."""
    shape = x.shape
    spread = [k for k in range(x.dim()) if k != d and x.stride(k) == 0 and shape[k] > 1]
    if not spread:
        return x
    one = x
    for k in spread:
        one = one.narrow(k, 0, 1)
    return one.movedim(d, -1).contiguous().movedim(-1, d).expand(shape)


def strided_reads(entry: PlanEntry, ops, extent: int):
    """The entries the kernel reads of a streamed dense operand of that ``extent`` if it
    can read it with its stride (``codegen.reads_strided``: stored entries x the extent),
    else None (it is always copied to stride 1). One rule for the run and ``explain``."""
    if not codegen.reads_strided(entry.schedule):
        return None
    return extent * stored_entries(entry, ops)


def stored_entries(entry: PlanEntry, ops) -> int:
    return sum(ops[t].values.numel() for t in {ap.tensor for ap in entry.schedule.accesses if ap.sparse})


def ordered_relayout(entry: PlanEntry, ops, ap, x) -> bool:
    """Whether the streamed dense operand ``x`` (stride 1 where the innermost loop reads
    it) of access ``ap`` is copied to loop order for this call: it nests a dimension below
    a sparse loop outside one above (``codegen.order_relayouts``) and the copy pays. One
    rule for the run and ``explain``."""
    pairs = entry.order_relayout.get(ap.id)
    return (pairs is not None and entry.split is None and x.dim() == len(ap.indices)
            and out_of_order(x, pairs) and relayout_pays(x.numel(), stored_entries(entry, ops)))


def gathered_relayout(entry: PlanEntry, ops, ap, x, sizes) -> bool:
    """Whether the dense operand ``x`` of access ``ap``, gathered by a sparse loop
    (``codegen.gather_relayouts``), is copied to loop order for this call: it arrives with
    another stride along the gathered dimension, the copy pays (``gather_pays``) and, in a
    cache tile, lets the panels narrow (``relaid_panel_narrower``). One rule for the run
    and ``explain``."""
    rl = entry.gather_relayout.get(ap.id)
    if rl is None or entry.split is not None or x.dim() != len(ap.indices):
        return False
    d = rl[0]
    return (x.stride(d) != 1 and x.shape[d] > 1 and relaid_panel_narrower(entry, sizes)
            and gather_pays(x.numel(), stored_entries(entry, ops), x.shape[d]))


def _relayout_pays(entry: PlanEntry, ops, x, extent: int) -> bool:
    """Whether a streamed dense operand that arrived strided is copied to stride 1: always,
    unless the kernel can read it strided and the copy moves more than it would read."""
    reads = strided_reads(entry, ops, extent)
    return reads is None or relayout_pays(x.numel(), reads)


def index_key(entry: PlanEntry, data) -> tuple:
    return tuple(data[ap.id].index_dtype if ap.sparse else None for ap in entry.schedule.accesses)



def kernel_name(entry: PlanEntry, suffix: str = "") -> str:
    """A module name, part of the kernel's identity (``build.load_kernel``): its loop
    depths as the source names them (``canonical``), so equal kernels share one module
    whatever the caller's letters; the cache key does the identifying."""
    order = "_".join(depth_name(n) for n in range(len(entry.schedule.loop_order)))
    return ("k_" + order)[:40 - len(suffix)] + suffix


def short_kernel(entry: PlanEntry, data, sizes):
    """The short-rows variant's module when this input's rows are short (codegen.short_rows),
    else None."""
    sr = entry.short_rows
    if sr is None:
        return None
    acc_id, row_vars = sr
    rows = 1
    for v in row_vars:
        rows *= sizes[v]
    if data[acc_id].values.numel() > codegen.short_rows_limit(entry.value_dtype) * rows:
        return None
    ikey = index_key(entry, data)
    mod = entry.short.get(ikey)
    if mod is None:
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        src, _ = codegen.generate(entry.schedule, entry.value_dtype, idx, scalar_inner=True)
        mod = entry.short[ikey] = build.load_kernel(src, name_hint=kernel_name(entry, "_short"))
    return mod


def kernel_for(entry: PlanEntry, data, load: bool = True):
    ikey = index_key(entry, data)
    k = entry.kernels.get(ikey)
    if k is None:
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        src, args = codegen.generate(entry.schedule, entry.value_dtype, idx)
        mod = None
        if load:
                mod = build.load_kernel(src, name_hint=kernel_name(entry))
        k = (mod, args, src)
        if load:
            entry.kernels[ikey] = k
    return k


_deterministic = torch.are_deterministic_algorithms_enabled


def run(entry: PlanEntry, ops):
    """Run a plan: values only when its sparse operands share one pattern
    (``shared_pattern``), else its warm runner when it takes the call, else the general path;
    a result of one compressed level over dense ones is computed dense where that pays
    (``dense_route``), and a dense operand re-laid out for a sparse one's few columns is
    copied narrow (``narrowed_gather``). A plan with a reuse alternative (``planner.reuse_entry``) hands
    a call whose transposed operands were seen before to it."""
    alt = entry.reuse
    if alt is not None and not _deterministic() and all([seen_again(ops[n]) for n in alt.kept_transposes]):
        # (not under torch.use_deterministic_algorithms: the switch changes the order of
        # the sums, so the third call's bits differed from the first two)
        return run(alt, ops)
    route = entry.dense_route
    if route is not None and route.pays(ops):
        return route.run(ops, run)
    narrowed = entry.narrowed
    if narrowed is not None:
        r = narrowed.run(ops, run, entry)
        if r is not None:
            return r
    shared = entry.shared
    if shared is None:
        shared = entry.shared = values_plan(entry) or False
    if shared:
        r = run_values(shared, entry, ops)
        if r is not None:
            return r
    warm = entry.runner
    if warm is not None:
        r = warm(ops)
        if r is not None:
            return r
    return run_general(entry, ops)


def run_general(entry: PlanEntry, ops):
    """Every case the warm runner declines: splits, broadcasts, casts, transposes."""
    orig = None
    if entry.split is not None:
        orig = ops
        ops = [split_operand(entry.split, entry.orig_indices, n, x) for n, x in enumerate(ops)]
    sizes = bind_sizes(entry.operand_indices, [x.shape for x in ops])
    data = prepare_operands(entry, ops, sizes, orig)
    fresh = not entry.kernels
    mod, args, _ = kernel_for(entry, data)
    short = short_kernel(entry, data, sizes)
    if fresh and entry.runner is None and entry.dense_route is None:   # (routed calls: see run)
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        try:
            entry.runner = make_runner(entry, mod, args, idx, ops)
        except Exception:  # the general path always works
            entry.runner = None
        if entry.reuse is not None and entry.runner is not None:
            # no C warm call: every call goes through run(), which sees the reuse
            entry.runner = getattr(entry.runner, "fallback", entry.runner)
    out_plan = entry.schedule.output
    out = None
    if out_plan.pattern >= 0:
        if not pattern_ready(entry, sizes):
            return assemble(entry, (np.empty(0, dtype=np.int64),
                                     np.empty(0, dtype=codegen.NPTYPES[entry.value_dtype])), sizes)
        P = data[out_plan.pattern]
        out = empty_output((P.values.numel() * math.prod(sizes[v] for v in pattern_suffix(entry.schedule)),),
                           entry.value_dtype)
        mod.kernel(arg_values(arg_table(args, entry.schedule), data, sizes, out),
                   threads.threads_for(work_of(data)))
        return pattern_storage(entry, P, out, sizes)
    if out_plan.dense:   # (the kernel zeroes it)
        out = empty_output(tuple(sizes[v] for v in out_plan.memory_order), entry.value_dtype)
    res = (short or mod).kernel(arg_values(arg_table(args, entry.schedule), data, sizes, out),
                                threads.threads_for(work_of(data)), panel_for(entry, data, sizes))
    if out_plan.dense:
        if out_plan.layout:   # laid out in loop order (schedule.dense_layout)
            if entry.split is None:
                out = in_dimension_order(out, dimension_permutation(out_plan), threads.threads_for)
            else:
                out = out.permute(dimension_permutation(out_plan))
        if entry.split is not None:
            bs = entry.split
            out = out.reshape(tuple(sizes[outer_var(v)] * sizes[inner_var(v)] if v in bs else sizes[v]
                                    for v in entry.orig_output))
        return out
    return assemble(entry, res, sizes)
