"""Plans and the plan cache: what the compiler decided for one expression and these operand
formats (``PlanEntry``: schedule, kernels per index width, warm runner), the user-facing
``Plan`` that ``explain`` returns, and the keys a warm call looks plans up by.

The cache is keyed by the equation, each operand's format, rank, value dtype and index dtype,
the requested output format and the build target; shapes are run-time arguments. ``_fast`` is its front, keyed
by per-Storage signatures (small ints cached on each Storage), so a warm call hashes ints."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..formats import Format
from ..level_storage import Storage
from . import codegen
from .index_notation import Assignment
from .locks import fork_safe_lock
from .loop_ir import Kernel, outline
from .operand_stats import stats_class
from .schedule import Schedule
from .target import current as current_target, on_change as on_target_change

__all__ = ["Plan", "PlanEntry", "COMPILER_VERSION", "cached_entry", "fmt_key", "storage_signature",
           "storage_pointers", "UNORDERED_SIGNATURES"]

COMPILER_VERSION = f"scorch-compiler-1.{codegen.CODEGEN_VERSION}"


@dataclass
class Plan:
    """What the compiler will do for one expression and these operand formats.

    ``loop_order`` (index variables, outermost first), ``workspaces`` (descriptions),
    ``tiled`` (tiled variables), ``output_format`` (the result's format; all-dense for a
    dense result), ``transposes`` (operands re-formatted, as ``(operand, from, to)``),
    ``source`` (Cython); the stages' own forms: ``assignment`` (index notation),
    ``schedule`` (with Algorithm 1's trace: ``sparsity_order``, greedy ``moves`` with net
    costs, ``cycle_removals``) and ``loop_ir`` (the lowered kernel, ``source`` is its print),
    all of which ``str(plan)`` shows."""
    loop_order: List[str]
    workspaces: List[str]
    tiled: List[str]
    output_format: Format
    source: str
    transposes: List[Tuple[int, Format, Format]]
    assignment: Assignment
    schedule: Schedule = field(repr=False, default=None)
    loop_ir: Kernel = field(repr=False, default=None)
    relayouts: List[str] = field(default_factory=list)   # dense operands copied per call
    # the plan calls switch to once their sparse operands' patterns are reused
    # (``planner.reuse_entry``: transposes kept across calls), where it differs
    reused: Optional["Plan"] = field(repr=False, default=None)

    def __str__(self) -> str:
        out = self.schedule.output if self.schedule is not None else None
        laid = (f" (written in loop order {', '.join(out.layout)}, returned in dimension order)"
                if out is not None and out.layout else "")
        lines = [f"expression:   {self.assignment}",
                 f"loop order:   {', '.join(self.loop_order)}",
                 f"output:       {self.output_format}{laid}",
                 f"workspaces:   {', '.join(self.workspaces) or 'none'}",
                 f"tiled:        {', '.join(self.tiled) or 'none'}"]
        for n, a, b in self.transposes:
            lines.append(_conversion_line("", n, a, b))
        lines.extend(f"relayout:     {r}" for r in self.relayouts)
        s = self.schedule
        if s is not None and s.sparsity_order:
            # Algorithm 1, as it ran: the order by sparsity, each greedy move with its net
            # cost, and the mode-order (transpose) decision
            lines.append(f"by sparsity:  {', '.join(s.sparsity_order)}")
            lines.extend(f"  {m}" for m in s.moves)
            lines.extend(f"  {c}" for c in s.cycle_removals)
        if s is not None and s.estimates:
            # the operands' statistics and the candidate orders priced with them
            for n, st in sorted(s.statistics.operands.items()):
                lines.append(f"statistics:   operand {n}: {st.summary()}")
            lines.append(f"estimate:     {s.estimates[0]}")
            lines.extend(f"  runner-up:  {c}" for c in s.estimates[1:])
        if self.reused is not None:
            r = self.reused
            lines.append(f"on reuse:     loop order {', '.join(r.loop_order)} from the call that "
                         f"sees the pattern again (kept_conversions.REUSED_AFTER), transposes kept: "
                         f"{r.schedule.estimates[0] if r.schedule.estimates else ''}")
            lines.extend(_conversion_line("  ", n, a, b) for n, a, b in r.transposes)
        if self.loop_ir is not None:
            lines.append("loop IR:")
            lines.extend("  " + ln for ln in outline(self.loop_ir).splitlines())
        return "\n".join(lines)



def _conversion_line(indent: str, n: int, a: Format, b: Format) -> str:
    """``explain``'s line for an operand the kernel reads re-formatted: a transpose, or
    (the same mode order) its compressed top level read dense, a ``pos`` over the extent
    (``work_estimate.dense_top_reads``; ``kept_conversions.switched_top_level``)."""
    if a.mode_order == b.mode_order:
        return (f"{indent}read dense:".ljust(14) + f"operand {n}: {a} -> {b} (its compressed top "
                f"level read dense: located, not merged; built once, kept while its arrays live)")
    return f"{indent}transpose:".ljust(14) + f"operand {n}: {a} -> {b}"


@dataclass
class PlanEntry:
    assignment: Assignment
    operand_indices: List[Tuple[str, ...]]
    schedule: Schedule
    value_dtype: torch.dtype
    out_rank: int
    kernels: Dict[tuple, tuple] = field(default_factory=dict)  # index dtypes -> (module, args, source)
    short: Dict[tuple, Any] = field(default_factory=dict)      # index dtypes -> short-rows module
    panels: Tuple[int, ...] = ()                               # panel widths (choose_panel)
    cache_panels: bool = False                                 # cache tile (choose_cache_panel)
    tiled_panels: Tuple[int, ...] = ()                         # its register-tiled widths
    short_rows: Any = None                                     # codegen.short_rows of the schedule
    relayout: Dict[int, tuple] = field(default_factory=dict)   # dense access -> (dim, perm, inverse)
    gather_relayout: Dict[int, tuple] = field(default_factory=dict)  # the same, gathered operands
    order_relayout: Dict[int, tuple] = field(default_factory=dict)   # relayout's, by order: dim pairs
    split: Optional[Dict[str, int]] = None   # blocked operands read natively: var -> block size
    runner: Any = None            # warm-call fast path (runner.py), once a kernel is loaded
    shared: Any = None            # shared_pattern.values_plan, decided on the first run (False: none)
    formats: Tuple[Any, ...] = ()  # operand format objects, for the identity-checked fast key
    orig_output: Tuple[str, ...] = ()
    orig_indices: List[Tuple[str, ...]] = field(default_factory=list)
    dense_route: Any = None       # dense_route.DenseRoute: a 'cd...d' result computed dense
    narrowed: Any = None          # narrowed_gather.NarrowedGather: a re-laid-out operand copied narrow
    reuse: Any = None             # the PlanEntry for operands seen again (planner.reuse_entry)
    kept_transposes: Tuple[int, ...] = ()  # a reuse plan: the operands it reads transposed, kept



_plans: Dict[tuple, PlanEntry] = {}
_fast: Dict[tuple, "PlanEntry"] = {}   # front cache of _plans keyed by signatures (see einsum)
_lock = fork_safe_lock(globals(), "_lock")
_stats = {"plan_hits": 0, "plan_misses": 0}
# the warm-call front table is keyed without the target: a new target empties it
on_target_change(_fast.clear)


def fmt_key(x) -> tuple:
    if isinstance(x, Storage):
        return ("s", x.format, x.ndim, x.values.dtype, x.index_dtype)
    return ("d", x.dim(), x.dtype)



def cached_entry(key, make):
    """The plan under ``key`` for the current build target (``target.py``: the vector
    width shapes the kernel and its panel widths), made by ``make()`` on a miss."""
    key = (*key, current_target().key)
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



_SIGNATURES: Dict[tuple, int] = {}
#: signatures of storages with unordered coordinates (einsum(..., sorted=False) results):
#: a kernel reads their sorted form, so no plan is ever keyed by one of these
UNORDERED_SIGNATURES: set = set()


def storage_signature(st: Storage) -> int:
    """A small int naming what a plan and its warm path depend on (format, value and index
    dtypes, size-1 dimensions, contiguous values, ordered coordinates, the statistics class
    ``operand_stats.stats_class``), cached on the Storage (never reassigned):
    a warm call's plan key is then a tuple of ints and dtypes, hashed without touching the
    Format. The table keeps every named Format alive, so numbers are never reused."""
    sig = st._sig
    if sig is None:
        v = st.values
        ordered = st.ordered
        t = (st.format, v.dtype, st.index_dtype,
             1 in st.shape and tuple(n == 1 for n in st.shape), v.is_contiguous(), ordered,
             stats_class(st))
        sig = _SIGNATURES.get(t)
        if sig is None:
            with _lock:
                sig = _SIGNATURES.setdefault(t, len(_SIGNATURES))
                if not ordered:
                    UNORDERED_SIGNATURES.add(sig)
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
