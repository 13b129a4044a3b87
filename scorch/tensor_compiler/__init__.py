"""The Scorch compiler: any einsum (or index expression) over any mix of formats becomes one
fused, cached Cython kernel.

Pipeline (paper, Algorithm 2): ``index_notation`` (parse) -> ``format_inference``
(Algorithm 4) -> ``schedule`` (loop order, transposes, workspaces) -> ``concrete``
(concrete index notation, for explain) -> ``codegen`` (Cython source, using ``levels`` and
``merge_lattice``) -> ``build.load_kernel`` (compile and cache) -> run -> assemble the
output (``levels.assemble_level``).

Entry points: :func:`einsum`, :func:`explain`, :func:`compute` (an
:class:`~scorch.tensor_compiler.index_notation.Assignment` such as ``A - 0.5 * B``).

Caching: a plan cache in memory keyed by the equation, each operand's format, rank, value
dtype and index dtype, and the requested output format (shapes are run-time arguments), so
a warm call does one dict lookup plus argument marshalling; kernels themselves are cached
in memory and on disk by ``build.load_kernel`` (keyed by the source text, which embeds
everything the key needs, plus compiler flags and version).

Outputs: dense results are torch tensors; sparse results are ``Storage`` objects. Sparse
outputs keep computed zeros (entries where the operands are stored but the arithmetic
gives 0) and never hold duplicate coordinates.
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple  # noqa: F401

import numpy as np
import torch

from ..formats import Format, LevelKind, as_format
from ..level_storage import Level, Storage, index_dtype_for
from . import codegen as _codegen
from . import concrete as _concrete
from .index_notation import Access, Assignment, parse_einsum
from .levels import assemble_level
from .relayout import relayout as _relayout
from .schedule import Schedule, schedule as _schedule

from .index_notation import Access, Assignment  # noqa: E402

__all__ = ["einsum", "explain", "compute", "Access", "Assignment", "Plan", "plan_cache_clear", "plan_cache_info",
           "COMPILER_VERSION"]

COMPILER_VERSION = f"scorch-compiler-1.{_codegen.CODEGEN_VERSION}"


# ------------------------------------------------------------------------------------
# operands
# ------------------------------------------------------------------------------------

def _as_operand(x: Any):
    """A dense strided torch tensor, or a Storage."""
    if isinstance(x, Storage):
        return x
    st = getattr(x, "_storage", None)
    if isinstance(st, Storage):
        return st
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            return _torch_sparse_storage(x)
        return x.detach() if x.requires_grad else x
    if isinstance(x, (int, float)):
        return torch.tensor(x)
    raise TypeError(f"einsum(): operand of type {type(x).__name__} is not a tensor")


#: id of a torch sparse tensor -> (weak reference to it, its version counter, the Storage
#: over its arrays); keyed by id because tensors compare elementwise
_TORCH_SPARSE: Dict[int, tuple] = {}


def _unlinked(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The same memory as ``t`` through a tensor that refers to the memory only, not to
    ``t`` (views of a sparse tensor's arrays keep the sparse tensor alive)."""
    if t is None:
        return None
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.size(),
                                              t.stride())


def _torch_sparse_storage(x: torch.Tensor) -> Storage:
    """The Storage over one of torch's sparse layouts (its arrays, not copied). Wrapping costs
    ~20 us of Python, so the wrap is kept for the tensor's lifetime while it shares the
    tensor's value array (in-place changes of the values then show through) and the tensor's
    version counter is unchanged (an in-place op on the tensor may have replaced its arrays).
    The kept Storage refers to the arrays' memory only, so the tensor can still be freed."""
    hit = _TORCH_SPARSE.get(id(x))
    if hit is not None and hit[0]() is x and hit[1] == x._version:
        return hit[2]
    from ..interop import from_torch
    st = from_torch(x)
    try:
        shared = st.values.data_ptr() == x.values().data_ptr()
    except RuntimeError:   # layouts without values() (uncoalesced COO): not kept
        shared = False
    if shared:
        st = Storage(st.format, st.shape,
                     [Level(lv.kind, lv.dim, lv.size, _unlinked(lv.pos), _unlinked(lv.crd),
                            lv.block_inner) for lv in st.levels],
                     _unlinked(st.values), st.index_dtype)
        key = id(x)
        _TORCH_SPARSE[key] = (weakref.ref(x, lambda _, key=key: _TORCH_SPARSE.pop(key, None)),
                              x._version, st)
    return st


def convert_storage(st: Storage, fmt: Format) -> Storage:
    """Re-format a storage (transposes, unblocking, requested output formats) through the
    runtime's ``convert``."""
    from .._runtime import convert as _conv  # lazy: built separately
    return _conv.convert(st, fmt)


def _unblocked(st: Storage) -> Storage:
    return convert_storage(st, Format(st.format.levels, st.format.mode_order))


def _cast_storage(st: Storage, dtype: torch.dtype) -> Storage:
    v = st.values
    if v.dtype == dtype and v.is_contiguous() and not v.requires_grad:
        return st
    return Storage(st.format, st.shape, st.levels, v.detach().to(dtype).contiguous(), st.index_dtype)


# ------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What the compiler will do for one expression and these operand formats.

    ``loop_order`` (index variables, outermost first), ``workspaces`` (descriptions),
    ``tiled`` (tiled variables), ``output_format`` (the result's format; all-dense for a
    dense result), ``transposes`` (operands re-formatted, as ``(operand, from, to)``),
    ``source`` (Cython), ``cin`` (concrete index notation); ``schedule`` keeps the loop
    ordering's trace (``sparsity_order``, greedy ``moves`` with net costs,
    ``cycle_removals``), which ``str(plan)`` prints."""
    loop_order: List[str]
    workspaces: List[str]
    tiled: List[str]
    output_format: Format
    source: str
    cin: str
    transposes: List[Tuple[int, Format, Format]]
    assignment: Assignment
    schedule: Schedule = field(repr=False, default=None)

    def __str__(self) -> str:
        lines = [f"expression:   {self.assignment}",
                 f"loop order:   {', '.join(self.loop_order)}",
                 f"output:       {self.output_format}",
                 f"workspaces:   {', '.join(self.workspaces) or 'none'}",
                 f"tiled:        {', '.join(self.tiled) or 'none'}"]
        for n, a, b in self.transposes:
            lines.append(f"transpose:    operand {n}: {a} -> {b}")
        s = self.schedule
        if s is not None and s.sparsity_order:
            # Algorithm 1, as it ran: the order by sparsity, each greedy move with its net
            # cost, and the mode-order (transpose) decision
            lines.append(f"by sparsity:  {', '.join(s.sparsity_order)}")
            lines.extend(f"  {m}" for m in s.moves)
            lines.extend(f"  {c}" for c in s.cycle_removals)
        lines.append("concrete index notation:")
        lines.extend("  " + ln for ln in self.cin.splitlines())
        return "\n".join(lines)


@dataclass
class _Entry:
    assignment: Assignment
    operand_indices: List[Tuple[str, ...]]
    schedule: Schedule
    value_dtype: torch.dtype
    out_rank: int
    kernels: Dict[tuple, tuple] = field(default_factory=dict)  # index dtypes -> (module, args, source)
    short: Dict[tuple, Any] = field(default_factory=dict)      # index dtypes -> short-rows module
    panels: Tuple[int, ...] = ()                               # panel widths (choose_panel)
    short_rows: Any = None                                     # codegen.short_rows of the schedule
    relayout: Dict[int, tuple] = field(default_factory=dict)   # dense access -> (dim, perm, inverse)
    split: Optional[Dict[str, int]] = None   # blocked operands read natively: var -> block size
    runner: Any = None            # warm-call fast path (runner.py), once a kernel is loaded
    formats: Tuple[Any, ...] = ()  # operand format objects, for the identity-checked fast key
    orig_output: Tuple[str, ...] = ()
    orig_indices: List[Tuple[str, ...]] = field(default_factory=list)


_plans: Dict[tuple, _Entry] = {}
_fast: Dict[tuple, "_Entry"] = {}   # front cache of _plans keyed by signatures (see einsum)
_lock = threading.Lock()
_stats = {"plan_hits": 0, "plan_misses": 0}


def plan_cache_info() -> dict:
    info = {"plans": len(_plans), **_stats}
    if _DISPATCH[0] is not None:   # warm calls served in C (fastcall.dispatch)
        info["plan_hits"] += _DISPATCH[1].hits()
    return info


def plan_cache_clear() -> None:
    _plans.clear()
    _fast.clear()


def _fmt_key(x) -> tuple:
    if isinstance(x, Storage):
        return ("s", x.format, x.ndim, x.values.dtype, x.index_dtype)
    return ("d", x.dim(), x.dtype)


def _value_dtype(ops) -> torch.dtype:
    dt = None
    for x in ops:
        d = x.values.dtype if isinstance(x, Storage) else x.dtype
        dt = d if dt is None else torch.promote_types(dt, d)
    if dt == torch.bool:
        raise TypeError("einsum(): bool operands are not supported; convert them to a number type")
    if dt not in _codegen.CTYPES:
        raise TypeError(f"einsum(): unsupported dtype {dt}")
    return dt


def _formats_for(ops) -> List[Optional[Format]]:
    out = []
    for x in ops:
        if isinstance(x, Storage):
            f = x.format
            out.append(Format(f.levels, f.mode_order) if f.block is not None else f)
        else:
            out.append(None)
    return out


def _make_entry(asg: Assignment, operand_indices, ops, out_format: Optional[Format],
                formats=None, fixed_tail=None) -> _Entry:
    vt = _value_dtype(ops)
    sched = _schedule(asg, formats if formats is not None else _formats_for(ops), out_format, fixed_tail)
    entry = _Entry(asg, list(operand_indices), sched, vt, len(asg.output))
    # a dense operand streamed by the innermost loop is read with stride 1 (the kernel is
    # specialized for it): when its layout does not give that, the kernel reads a copy laid
    # out in loop order (e.g. SDDMM's C, read along k)
    entry.relayout.update(_codegen.relayouts(sched))
    entry.panels = _codegen.panel_widths(sched, vt)
    entry.short_rows = _codegen.short_rows(sched)
    return entry


def _resolve_out_format(out_format, rank: int) -> Optional[Format]:
    if out_format is None:
        return None
    if rank == 0:
        return None
    return as_format(out_format, rank)


# ------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------

def _sizes(entry: _Entry, ops) -> Dict[str, int]:
    sizes: Dict[str, int] = {}
    seen: Dict[str, int] = {}
    for n, (idx, x) in enumerate(zip(entry.operand_indices, ops)):
        shape = x.shape
        for v, s in zip(idx, shape):
            old = sizes.get(v)
            if old is None or old == 1:
                sizes[v] = s
                seen.setdefault(v, n)
            elif s != old and s != 1:
                name = v if not v.startswith("_") else f"... dimension {v[1:]}"
                raise ValueError(
                    f"einsum(): subscript {name} has size {s} for operand {n} which does not "
                    f"broadcast with previously seen size {old} (operand {seen[v]})")
    return sizes


def _prepare(entry: _Entry, ops, sizes, orig=None):
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
                st = _unblocked(st)
            if ap.transposed and orig is not None and orig[ap.tensor].format.block is not None:
                o = orig[ap.tensor]   # natively read blocked operand: re-order its block grid
                grid = ap.format.mode_order[:o.ndim]
                st = _split_operand(entry, ap.tensor, convert_storage(o, Format(o.format.levels, grid, o.format.block)))
            elif ap.transposed:
                st = convert_storage(st, ap.format)
            data[ap.id] = _cast_storage(st, vt)
        else:
            if x.dtype != vt:
                x = x.to(vt)
            rl = entry.relayout.get(ap.id)
            if rl is not None:
                full = tuple(sizes[v] for v in ap.indices)
                if tuple(x.shape) != full:      # size-1 broadcast: materialize
                    x = x.expand(full)
                if x.stride(rl[0]) != 1 and full[rl[0]] > 1:
                    x = _relayout(x, rl[1], rl[2], _threads_for, ap.id)  # scratch: this call only
            data[ap.id] = x
    return data


def _index_key(entry: _Entry, data) -> tuple:
    return tuple(data[ap.id].index_dtype if ap.sparse else None for ap in entry.schedule.accesses)


#: panels pay only when output rows gather at least this many stored entries on average
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


def _panel(entry: _Entry, data, sizes) -> int:
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


def _kernel_name(entry: _Entry, suffix: str = "") -> str:
    """A readable module name: the loop order (the cache key does the identifying)."""
    order = "".join(ch for ch in "_".join(entry.schedule.loop_order) if ch.isalnum() or ch == "_")
    return ("k_" + order)[:40 - len(suffix)] + suffix


def _short_kernel(entry: _Entry, data, sizes):
    """The short-rows variant's module when this input's rows are short (codegen.short_rows),
    else None."""
    sr = entry.short_rows
    if sr is None:
        return None
    acc_id, row_vars = sr
    rows = 1
    for v in row_vars:
        rows *= sizes[v]
    if data[acc_id].values.numel() > _codegen.short_rows_limit(entry.value_dtype) * rows:
        return None
    ikey = _index_key(entry, data)
    mod = entry.short.get(ikey)
    if mod is None:
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        src, _ = _codegen.generate(entry.schedule, entry.value_dtype, idx, scalar_inner=True)
        from .build import load_kernel
        mod = entry.short[ikey] = load_kernel(src, name_hint=_kernel_name(entry, "_short"))
    return mod


def _kernel_for(entry: _Entry, data, load: bool = True):
    ikey = _index_key(entry, data)
    k = entry.kernels.get(ikey)
    if k is None:
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        src, args = _codegen.generate(entry.schedule, entry.value_dtype, idx)
        mod = None
        if load:
            from .build import load_kernel
            mod = load_kernel(src, name_hint=_kernel_name(entry))
        k = (mod, args, src)
        if load:
            entry.kernels[ikey] = k
    return k


def _arg_values(args, entry: _Entry, data, sizes, out: Optional[torch.Tensor]) -> list:
    vals = []
    for _, _, what in args:
        tag = what[0]
        if tag == "size":
            vals.append(sizes[what[1]])
        elif tag == "pos":
            vals.append(data[what[1]].levels[what[2]].pos.data_ptr())
        elif tag == "crd":
            vals.append(data[what[1]].levels[what[2]].crd.data_ptr())
        elif tag == "vals":
            x = data[what[1]]
            vals.append(x.values.data_ptr() if isinstance(x, Storage) else x.data_ptr())
        elif tag == "stride":
            ap = entry.schedule.accesses[what[1]]
            x = data[what[1]]
            st = 0
            for d, v in enumerate(ap.indices):
                if v == what[2] and x.shape[d] != 1:
                    st += x.stride(d)
            vals.append(st)
        elif tag == "out":
            vals.append(out.data_ptr())
        elif tag == "ostride":
            vals.append(out.stride(entry.assignment.output.index(what[1])))
    return vals


def _assemble(entry: _Entry, res, sizes) -> Storage:
    """The sparse output from what the kernel returned: ``(pos, crd, vals)`` of a CSR-like
    output (``codegen`` rows assembly), or level-major coordinate tuples and values."""
    if len(res) == 3:
        return _rows_storage(entry, res, sizes)
    crd, vals = res
    out = entry.schedule.output
    fmt = out.format
    r = len(out.level_vars)
    coords = torch.from_numpy(crd).view(r, -1).t()  # kernels return level-major coordinates
    values = torch.from_numpy(vals)
    n = values.numel()
    shape = tuple(sizes[v] for v in out.vars)
    kinds = fmt.levels
    parent = torch.zeros(n, dtype=torch.int64)
    count = 1
    built = []
    k = 0
    while k < len(kinds):
        arrays, parent, count, k2 = assemble_level(kinds, k, coords, parent, count, sizes[out.level_vars[k]])
        built.extend(arrays)
        k = k2
    if kinds[-1] is LevelKind.DENSE:
        full = torch.zeros(count, dtype=values.dtype)
        if n:
            full[parent] = values
        values = full
    idt = index_dtype_for(shape, max(count, n))
    levels = []
    for kind, v, (pos, c) in zip(kinds, out.level_vars, built):
        levels.append(Level(kind, out.vars.index(v), sizes[v],
                            None if pos is None else pos.to(idt),
                            None if c is None else c.to(idt)))
    st = Storage(fmt, shape, levels, values, idt)
    if out.final_format is not None:
        st = convert_storage(st, out.final_format)
    return st


def _rows_storage(entry: _Entry, res, sizes) -> Storage:
    out = entry.schedule.output
    pos, crd, vals = (torch.from_numpy(x) for x in res)
    shape = tuple(sizes[v] for v in out.vars)
    levels = [Level(kind, out.vars.index(v), sizes[v]) for kind, v in zip(out.format.levels[:-1], out.level_vars)]
    last = out.level_vars[-1]
    levels.append(Level(LevelKind.COMPRESSED, out.vars.index(last), sizes[last], pos, crd))
    st = Storage(out.format, shape, levels, vals, crd.dtype)
    if out.final_format is not None:
        st = convert_storage(st, out.final_format)
    return st


#: outputs of at least this many elements are allocated through numpy (see _empty)
EMPTY_NUMPY_MIN = 1 << 18

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
              torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
              torch.uint8: np.uint8}


def _empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized output. Big ones come from numpy's allocator, which asks the kernel
    for transparent huge pages (``madvise``): first-touch page faults of a fresh 167 MB
    ``torch.empty`` cost ~80 ms on the dev box (THP in ``madvise`` mode), ~17 ms this way,
    more than an SpMM over that output."""
    n = 1
    for d in shape:
        n *= d
    npt = _NP_DTYPES.get(dtype)
    if npt is None or n < EMPTY_NUMPY_MIN:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(np.empty(shape, dtype=npt))


def _pattern_ready(entry: _Entry, sizes) -> bool:
    """A pattern-output kernel (``OutputPlan.pattern``) runs only when every reduction is
    non-empty (an empty reduction stores nothing; that case goes through the general path)."""
    return all(sizes[v] > 0 for v in entry.assignment.reduction)


def _pattern_storage(entry: _Entry, P: Storage, values: torch.Tensor, sizes) -> Storage:
    """The output of a pattern kernel: ``P``'s level arrays (shared, as views share them)
    with the kernel's values, levels re-numbered to the output's dimensions."""
    s = entry.schedule
    out = s.output
    ap = s.accesses[out.pattern]
    levels = [Level(lv.kind, out.vars.index(ap.indices[lv.dim]), lv.size, lv.pos, lv.crd)
              for lv in P.levels]
    return Storage(out.format, tuple(sizes[v] for v in out.vars), levels, values, P.index_dtype)


#: operands' stored entries + dense elements below which a kernel runs on one thread
PARALLEL_MIN_WORK = int(os.environ.get("SCORCH_PARALLEL_MIN_WORK", 10_000))
_free_cores = None


def _threads_for(work: int) -> int:
    """``torch.get_num_threads()``, except: small problems run on one thread (waking a
    second costs more than it saves), and an oversubscribed machine gets only its free
    cores (every parallel region ends in a barrier, and a worker waiting for a core costs a
    scheduler time slice, far more than a small kernel). The load estimate is the
    runtime's (``convert.free_cores``), which does not count this process's own spinning
    OpenMP workers as load."""
    global _free_cores
    T = torch.get_num_threads()
    if T == 1 or work < PARALLEL_MIN_WORK:
        return 1
    if _free_cores is None:
        from .._runtime.convert import free_cores
        _free_cores = free_cores
    return _free_cores(T)


def _work(data) -> int:
    w = 0
    for x in data.values():
        w += x.values.numel() if isinstance(x, Storage) else x.numel()
    return w


def _run(entry: _Entry, ops):
    run = entry.runner
    if run is not None:
        r = run(ops)
        if r is not None:
            return r
    return _run_general(entry, ops)


def _run_general(entry: _Entry, ops):
    """Every case the warm runner declines: splits, broadcasts, casts, transposes."""
    orig = None
    if entry.split is not None:
        orig = ops
        ops = [_split_operand(entry, n, x) for n, x in enumerate(ops)]
    sizes = _sizes(entry, ops)
    data = _prepare(entry, ops, sizes, orig)
    fresh = not entry.kernels
    mod, args, _ = _kernel_for(entry, data)
    short = _short_kernel(entry, data, sizes)
    if fresh and entry.runner is None:
        from .runner import make_runner
        idx = {ap.id: data[ap.id].index_dtype for ap in entry.schedule.accesses if ap.sparse}
        try:
            entry.runner = make_runner(entry, mod, args, idx, ops, _threads_for, _assemble,
                                       _pattern_storage, _empty)
        except Exception:  # the general path always works
            entry.runner = None
    out_plan = entry.schedule.output
    out = None
    if out_plan.pattern >= 0:
        if not _pattern_ready(entry, sizes):
            return _assemble(entry, (np.empty(0, dtype=np.int64),
                                     np.empty(0, dtype=_codegen.NPTYPES[entry.value_dtype])), sizes)
        P = data[out_plan.pattern]
        out = _empty((P.values.numel(),), entry.value_dtype)
        mod.kernel(_arg_values(args, entry, data, sizes, out), _threads_for(_work(data)))
        return _pattern_storage(entry, P, out, sizes)
    if out_plan.dense:
        out = _empty(tuple(sizes[v] for v in out_plan.vars), entry.value_dtype)  # kernel zeroes it
    res = (short or mod).kernel(_arg_values(args, entry, data, sizes, out), _threads_for(_work(data)),
                                _panel(entry, data, sizes))
    if out_plan.dense:
        if entry.split is not None:
            bs = entry.split
            out = out.reshape(tuple(sizes[_bo(v)] * sizes[_bi(v)] if v in bs else sizes[v]
                                    for v in entry.orig_output))
        return out
    return _assemble(entry, res, sizes)


def _entry(key, make):
    e = _plans.get(key)
    if e is not None:
        _stats["plan_hits"] += 1
        return e
    with _lock:
        e = _plans.get(key)
        if e is None:
            _stats["plan_misses"] += 1
            e = make()
            _plans[key] = e
    return e


def _einsum_entry(equation: str, ops, out_format):
    # size-1 dimensions of sparse operands that broadcast are part of the plan (they are
    # read through a variable of their own); dense operands broadcast through stride 0
    bmask = tuple(tuple(s == 1 for s in x.shape) if isinstance(x, Storage) else None for x in ops)
    key = (COMPILER_VERSION, equation, tuple(_fmt_key(x) for x in ops), bmask, out_format)

    def make():
        spec = parse_einsum(equation, [tuple(x.shape) for x in ops])
        asg, op_idx = spec.assignment, list(spec.operand_indices)
        if any(spec.broadcast[n] for n, x in enumerate(ops) if isinstance(x, Storage)):
            asg, op_idx = _rename_broadcast(spec, ops)
        fmt = _resolve_out_format(out_format, len(asg.output))
        native = _blocked_entry(asg, op_idx, ops, fmt)
        return native if native is not None else _make_entry(asg, op_idx, ops, fmt)
    return _entry(key, make)


def _bo(v: str) -> str:
    return v + "_o"


def _bi(v: str) -> str:
    return v + "_i"


def _blocked_entry(asg: Assignment, op_idx, ops, out_fmt: Optional[Format]) -> Optional[_Entry]:
    """Read blocked operands natively: each blocked index variable ``v`` (block ``b``) is
    split into ``v_o`` (over the grid of blocks) and ``v_i`` (inside a block), so a blocked
    operand is a tensor of twice the rank whose last levels are the dense block insides,
    dense operands and the dense output are read through ``v = v_o * b + v_i`` strides, and
    the kernel co-iterates the block grid and runs dense loops inside blocks. Used when the
    split is consistent (every sparse operand on a split variable is blocked with the same
    block size on it) and the output is dense; otherwise (None) blocked operands are
    converted to their unblocked format first."""
    blocked = [n for n, x in enumerate(ops) if isinstance(x, Storage) and x.format.block is not None]
    if not blocked or (out_fmt is not None and not out_fmt.is_dense):
        return None
    bs: Dict[str, int] = {}
    for n in blocked:
        idx = op_idx[n]
        if len(set(idx)) != len(idx) or len(idx) != ops[n].ndim:
            return None
        for d, v in enumerate(idx):
            if bs.setdefault(v, ops[n].format.block[d]) != ops[n].format.block[d]:
                return None
    for n, x in enumerate(ops):
        if n in blocked:
            continue
        if isinstance(x, Storage) and any(v in bs for v in op_idx[n]):
            return None
        if any(op_idx[n].count(v) > 1 for v in bs):
            return None
    from .index_notation import Mul

    def expand(idx):
        out = []
        for v in idx:
            out.extend((_bo(v), _bi(v)) if v in bs else (v,))
        return tuple(out)
    new_idx, formats, tail = [], [], {}
    for n, (idx, x) in enumerate(zip(op_idx, ops)):
        if n in blocked:
            r = len(idx)
            new_idx.append(tuple(_bo(v) for v in idx) + tuple(_bi(v) for v in idx))
            f = x.format
            formats.append(Format(f.levels + (LevelKind.DENSE,) * r, f.mode_order + tuple(range(r, 2 * r))))
            tail[n] = r
        else:
            new_idx.append(expand(idx))
            formats.append(Format(x.format.levels, x.format.mode_order) if isinstance(x, Storage) else None)
    rhs = None
    for n, idx in enumerate(new_idx):
        a = Access(n, idx)
        rhs = a if rhs is None else Mul(rhs, a)
    new_asg = Assignment(expand(asg.output), rhs)
    from .schedule import NoValidOrder
    try:
        entry = _make_entry(new_asg, new_idx, ops, None if out_fmt is None else Format("d" * len(new_asg.output)),
                            formats, tail)
    except NoValidOrder:
        return None
    if not entry.schedule.output.dense:
        return None
    entry.split = bs
    entry.orig_output = tuple(asg.output)
    entry.orig_indices = [tuple(i) for i in op_idx]
    return entry


def _split_operand(entry: _Entry, n: int, x):
    """Operand ``n`` as the split plan reads it (blocked storages: twice the rank)."""
    bs = entry.split
    if isinstance(x, Storage):
        if x.format.block is None:
            return x
        r = x.ndim
        levels = []
        for lv in x.levels:
            levels.append(Level(lv.kind, lv.dim + r if lv.block_inner else lv.dim, lv.size, lv.pos, lv.crd))
        f = x.format
        fmt = Format(f.levels + (LevelKind.DENSE,) * r, f.mode_order + tuple(range(r, 2 * r)))
        shape = tuple(s // b for s, b in zip(x.shape, f.block)) + tuple(f.block)
        return Storage(fmt, shape, levels, x.values, x.index_dtype)
    idx = entry.orig_indices[n]
    for d in reversed(range(len(idx))):
        b = bs.get(idx[d])
        if b is not None:
            if x.shape[d] % b:
                raise ValueError(f"einsum(): size {x.shape[d]} of operand {n} (subscript {idx[d]}) "
                                 f"is not a multiple of the block size {b}")
            x = x.unflatten(d, (x.shape[d] // b, b))
    return x


def _rename_broadcast(spec, ops):
    """Give each broadcast size-1 dimension of a sparse operand its own variable of size 1:
    summing over one coordinate is the identity, and the operand no longer depends on the
    broadcast variable."""
    from .index_notation import Mul
    op_idx = []
    for n, idx in enumerate(spec.operand_indices):
        if isinstance(ops[n], Storage) and spec.broadcast[n]:
            idx = tuple(f"_b{n}_{d}" if d in spec.broadcast[n] else v for d, v in enumerate(idx))
        op_idx.append(tuple(idx))
    rhs = None
    for n, idx in enumerate(op_idx):
        a = Access(n, idx)
        rhs = a if rhs is None else Mul(rhs, a)
    return Assignment(spec.assignment.output, rhs), op_idx


_SIGNATURES: Dict[tuple, int] = {}
_STRIDED = torch.strided
_SPARSE_TENSOR: list = [None]   # the user-facing tensor type (set_sparse_tensor_type)


def set_sparse_tensor_type(cls) -> None:
    """The tensor type whose instances carry a ``_storage`` (``scorch.SparseTensor``): the warm
    path recognizes it by identity. Set by the layer above; the compiler imports no tensor
    type."""
    _SPARSE_TENSOR[0] = cls


def storage_signature(st: Storage) -> int:
    """A small int naming what a plan and its warm path depend on (format, value and index
    dtypes, size-1 dimensions, contiguous values), cached on the Storage (never reassigned):
    a warm call's plan key is then a tuple of ints and dtypes, hashed without touching the
    Format. The table keeps every named Format alive, so numbers are never reused."""
    sig = st._sig
    if sig is None:
        v = st.values
        t = (st.format, v.dtype, st.index_dtype,
             1 in st.shape and tuple(n == 1 for n in st.shape), v.is_contiguous())
        sig = _SIGNATURES.get(t)
        if sig is None:
            with _lock:
                sig = _SIGNATURES.setdefault(t, len(_SIGNATURES))
        st._sig = sig
    return sig


def storage_pointers(st: Storage) -> tuple:
    """Addresses of a Storage's arrays, cached on it: ``(pos, crd)`` per level (0 where the
    level keeps none), then the values' address and their count."""
    ptrs = st._ptrs
    if ptrs is None:
        out = []
        for lv in st.levels:
            out.append(0 if lv.pos is None else lv.pos.data_ptr())
            out.append(0 if lv.crd is None else lv.crd.data_ptr())
        out.append(st.values.data_ptr())
        out.append(st.values.numel())
        ptrs = st._ptrs = tuple(out)
    return ptrs


_DISPATCH: list = [None, None]   # fastcall.dispatch and its module, once loaded (see einsum)


def _load_dispatch() -> None:
    """Point ``einsum``'s first step at the C warm-call lookup (``fastcall.dispatch``), or at
    a stand-in that always declines where the C module is unavailable."""
    from .fastcall import load
    fc = load()
    if fc is None:
        _DISPATCH[:] = [lambda table, equation, operands: NotImplemented, None]
        return
    fc.configure(Storage, _SPARSE_TENSOR[0])
    _DISPATCH[:] = [fc.dispatch, fc]


def einsum(equation: str, *operands, out_format=None):
    """``torch.einsum`` over dense tensors, Storages and SparseTensors (anything with a
    ``._storage``) in any format. Dense operands only and no ``out_format``: exactly
    ``torch.einsum``. Returns a dense tensor or a Storage (sparse result)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if out_format is None and _DISPATCH[0] is not None:
        # the warm call in C: plan lookup, checks, output and kernel in one step
        r = _DISPATCH[0](_fast, equation, operands)
        if r is not NotImplemented:
            return r
    return einsum_declined(equation, operands, out_format)


def einsum_declined(equation: str, operands: tuple, out_format=None):
    """``einsum`` after the C warm call declined (or was not tried): the Python path.
    ``scorch.einsum`` tries the C call itself and continues here."""
    # the warm path: one pass builds the operands and the plan key (ints for storages,
    # dtype and rank for dense tensors; the two kinds never compare equal)
    ops = []
    key = [equation, out_format]
    sparse = False
    for x in operands:
        tx = type(x)
        if tx is Storage:
            st = x
        elif tx is _SPARSE_TENSOR[0]:
            st = x._storage
        elif tx is torch.Tensor and x.layout is _STRIDED and not x.requires_grad:
            st = x
        else:
            st = _as_operand(x)
        if type(st) is Storage:
            sparse = True
            ops.append(st)
            sig = st._sig
            key.append(sig if sig is not None else storage_signature(st))
        else:
            ops.append(st)
            key.append(st.dtype)
            key.append(st.dim())
    if out_format is None and not sparse:
        return torch.einsum(equation, *operands)   # the caller's tensors: autograd intact
    if _DISPATCH[0] is None:
        _load_dispatch()
    key = tuple(key)
    entry = _fast.get(key)
    if entry is None:
        entry = _einsum_entry(equation, ops, out_format)
        if len(_fast) > 4096:
            _fast.clear()
        _fast[key] = entry
    else:
        _stats["plan_hits"] += 1
    return _run(entry, ops)


def compute(assignment: Assignment, *operands, out_format=None):
    """Evaluate an index-notation assignment (e.g. ``Assignment("ij", A - 0.5 * B)``) over
    these operands through the same compiler path as einsum."""
    ops = [_as_operand(x) for x in operands]
    accs: Dict[int, Tuple[str, ...]] = {}
    from .index_notation import accesses
    for a in accesses(assignment.rhs):
        if a.tensor >= len(ops):
            raise ValueError(f"expression uses operand {a.tensor} but {len(ops)} were given")
        if len(a.indices) != len(ops[a.tensor].shape):
            raise ValueError(
                f"operand {a.tensor} has {len(ops[a.tensor].shape)} dimensions but is indexed by {a.indices}")
        accs.setdefault(a.tensor, a.indices)
    seen: Dict[str, Tuple[int, int]] = {}
    for a in accesses(assignment.rhs):
        x = ops[a.tensor]
        for v, sz in zip(a.indices, x.shape):
            if sz == 1 and not isinstance(x, Storage):
                continue  # a dense operand broadcasts a size-1 dimension
            old = seen.setdefault(v, (sz, a.tensor))
            if old[0] != sz:
                raise ValueError(f"index {v} has size {sz} for operand {a.tensor} but size {old[0]} "
                                 f"for operand {old[1]}")
    operand_indices = [accs.get(n, ()) for n in range(len(ops))]
    key = (COMPILER_VERSION, "expr", str(assignment), assignment,
           tuple(_fmt_key(x) for x in ops), out_format)

    def make():
        fmt = _resolve_out_format(out_format, len(assignment.output))
        return _make_entry(assignment, operand_indices, ops, fmt)
    entry = _entry(key, make)
    return _run(entry, ops)


def explain(equation: str, *operands, out_format=None) -> Plan:
    """The plan for ``einsum(equation, *operands)``; nothing is compiled or run."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ops = [_as_operand(x) for x in operands]
    entry = _einsum_entry(equation, ops, out_format)
    s = entry.schedule
    idx = {}
    for ap in s.accesses:
        if ap.sparse:
            idx[ap.id] = ops[ap.tensor].index_dtype
    src, _ = _codegen.generate(s, entry.value_dtype, idx)
    out = s.output
    if out.dense:
        ofmt = Format("d" * max(1, len(out.vars))) if out.vars else Format("d")
    else:
        ofmt = out.final_format or out.format
    transposes = [(ap.tensor, ap.source_format, ap.format) for ap in s.accesses if ap.transposed]
    return Plan(list(s.loop_order), list(s.workspaces), list(s.tiled), ofmt, src,
                str(_concrete.from_schedule(s)), transposes, s.assignment, s)
