"""Scheduling: loop order, transposes of discordant operands, output format and workspaces.

The result is a :class:`Schedule`, the data structure lowering consumes.

Loop order: the paper's Algorithm 1, in :mod:`.loop_order` (sort the index variables by
sparsity, greedy moves priced by an additive cost model, removal of mode-order cycles by
the cheapest transposes); its trace is kept on the schedule (``sparsity_order``,
``moves``, ``cycle_removals``). Every sparse access is iterated in its mode order, a
discordant one is transposed; dense strided operands and dense outputs accept any order.

Workspace insertion (Algorithm 1's last step) is done here on the chosen order: sparse
outputs are written in a mode order concordant with the loop order, so they can be
appended in order; when a reduction variable sits above some output variable the scatter
goes through a workspace, one per thread, drained in sorted order into the output: a
``std::map`` keyed by the remaining output coordinates, or a dense array with touched flags
when the output stores those levels densely anyway. Tiling (Algorithm 3): :func:`_tiled`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..formats import Format, LevelKind
from . import merge_lattice as ml
from .format_inference import infer_output_kinds
from .index_notation import Access, Assignment, Div, accesses
from .levels import LevelPlan, level_plans
from .cost_model import OrderProblem, concordant_dims, order_cost
from .loop_order import CycleRemoval, Move, NoValidOrder, PricedOrder, algorithm1

__all__ = ["AccessPlan", "OutputPlan", "Schedule", "schedule", "NoValidOrder"]


@dataclass
class AccessPlan:
    id: int
    tensor: int
    indices: Tuple[str, ...]            # variable per dimension
    sparse: bool
    source_format: Optional[Format]     # operand's format (None: dense strided)
    format: Optional[Format] = None     # format the kernel reads (after a transpose)
    transposed: bool = False
    levels: List[LevelPlan] = field(default_factory=list)

    @property
    def level_vars(self) -> Tuple[str, ...]:
        return tuple(lv.var for lv in self.levels)


@dataclass
class OutputPlan:
    dense: bool
    vars: Tuple[str, ...]                     # output variables, dimension order
    format: Optional[Format] = None           # produced format (sparse; concordant)
    final_format: Optional[Format] = None     # requested format, converted to at the end
    level_vars: Tuple[str, ...] = ()          # produced levels' variables
    mode: str = "dense"                       # dense | direct | acc | ws
    ws_depth: int = -1                        # loop depth whose loop the workspace wraps
    ws_vars: Tuple[str, ...] = ()
    ws_dense: bool = False                    # dense array + touched flags, else std::map
    acc_depth: int = -1                       # loop depth whose loop the accumulator wraps
    pattern: int = -1                         # access whose pattern the output reuses (-1: none)
    unsorted: bool = False                    # einsum(sorted=False): a fiber may drain unsorted


@dataclass
class Schedule:
    assignment: Assignment
    loop_order: List[str]
    accesses: List[AccessPlan]
    output: OutputPlan
    formula: object
    workspaces: List[str]
    tiled: List[str]
    cost: tuple                       # order_cost of the chosen order (lexicographic)
    # Algorithm 1's trace: variables by descending sparsity (the initial order), every
    # considered greedy move with its net cost and weighted term deltas, the cycles of the
    # mode-order graph and the transpose choices priced to remove them, and the chosen
    # order's unweighted cost terms
    sparsity_order: List[str] = field(default_factory=list)
    moves: List[Move] = field(default_factory=list)
    mode_order_cycles: List[Tuple[str, ...]] = field(default_factory=list)
    cycle_removals: List[CycleRemoval] = field(default_factory=list)
    cost_terms: Dict[str, float] = field(default_factory=dict)
    # with the operands' statistics: the candidate orders priced by work_estimate (the
    # chosen one first), and the statistics themselves
    estimates: List[PricedOrder] = field(default_factory=list)
    statistics: object = None



def _concordant_dims(indices: Sequence[str], fmt: Format, order: Sequence[str],
                     tail: int = 0) -> Tuple[Optional[Tuple[int, ...]], bool]:
    return concordant_dims(indices, fmt, order, tail)


def _choose_order(asg, ids, formats, f, out_sparse, out_mode_vars, fixed_tail=None,
                  statistics=None):
    """Algorithm 1 on this expression (see :mod:`.loop_order`): the order and its problem.
    ``statistics`` (``work_estimate.Statistics``): the operands' statistics, when known."""
    extra = statistics.problem_fields(ids) if statistics is not None else {}
    p = OrderProblem(asg, ids, formats, f, out_sparse, out_mode_vars, fixed_tail or {}, **extra)
    return algorithm1(p, statistics.threads if statistics is not None else 1), p


def _pattern_access(asg: Assignment, plans: List[AccessPlan], out: OutputPlan,
                    order: Sequence[str]) -> int:
    """The access whose stored pattern *is* the output's (SDDMM's S, ``A * D``), or -1.

    Holds when the only sparse access ``P`` is one the presence formula needs (no entry
    outside its pattern), is over exactly the output variables, is read in the output's produced format
    (same level kinds in the same variable order, no run grouping of duplicates), and the
    output loops come first: then every stored entry of ``P`` is visited exactly once and
    gives exactly one output entry (given non-empty reductions, checked at run time), so
    the kernel writes ``out_vals[q]`` at ``P``'s position and the output shares ``P``'s
    ``pos``/``crd`` arrays: no coordinate buffers, no assembly pass."""
    if out.dense or out.mode not in ("acc", "direct") or out.final_format is not None:
        return -1
    sparse = [ap for ap in plans if ap.sparse]
    if len(sparse) != 1:
        return -1
    # no entry outside P's pattern: the presence formula cannot hold without P (a product,
    # a zero-preserving function, a comparison that keeps 0, where(P > 0, P, 0), ...)
    if ml.dense_needed(ml.formula(asg.rhs, ml.access_ids(asg.rhs)), [sparse[0].id]):
        return -1
    P = sparse[0]
    if (P.level_vars != out.level_vars or len(set(P.indices)) != len(P.indices)
            or tuple(P.format.levels) != tuple(out.format.levels)
            or any(lv.grouped for lv in P.levels)
            or tuple(order[:len(out.level_vars)]) != tuple(out.level_vars)):
        return -1
    return P.id


def schedule(asg: Assignment, formats: Sequence[Optional[Format]],
             out_format: Optional[Format] = None, fixed_tail=None, statistics=None) -> Schedule:
    """Choose the loop order, transposes, output format and workspaces.

    ``formats[n]`` is operand ``n``'s format, or None for a dense strided tensor (dense
    torch tensors are read through strides, so they never need a transpose).
    ``out_format`` overrides the inferred output format (``Format('d'*r)`` for dense).
    ``fixed_tail[n]``: operand ``n``'s last levels that cannot be re-ordered (a blocked
    operand read natively: its block-inner dense levels). ``statistics``
    (``work_estimate.Statistics``): the operands' statistics, which price the candidate
    orders (``loop_order.choose_by_estimate``) and weigh transposes by stored entries.
    """
    fixed_tail = fixed_tail or {}
    ids = ml.access_ids(asg.rhs)
    f = ml.formula(asg.rhs, ids)
    sparse_ids = {i for a, i in ids.items() if formats[a.tensor] is not None}
    if not ml.evaluate(f, lambda i: i not in sparse_ids):
        # unless computed everywhere (where a quotient reads x / 0 if nothing is stored)
        _check_denominators(asg.rhs, formats)
    for acc in ids:
        fmt = formats[acc.tensor]
        if fmt is not None:
            if fmt.block is not None:
                raise NotImplementedError("blocked operands are converted before scheduling")
    def kind_of(acc: Access, v: str) -> LevelKind:
        fmt = formats[acc.tensor]
        if fmt is None:
            return LevelKind.DENSE
        return fmt.kind_of_dim(acc.indices.index(v))

    # ---- output format (Algorithm 4 unless overridden) ----
    rank = len(asg.output)
    if out_format is not None:
        out_dense = rank == 0 or out_format.is_dense
        out_kinds = None
        out_mode_vars = (None if out_dense else tuple(asg.output[d] for d in out_format.mode_order))
    else:
        kinds = infer_output_kinds(asg.rhs, asg.output, kind_of)
        out_dense = rank == 0 or all(k.full for k in kinds.values())
        out_kinds = kinds
        out_mode_vars = None
    lo, problem = _choose_order(asg, ids, formats, f, not out_dense, out_mode_vars, fixed_tail,
                                    statistics)
    order = lo.order
    if out_format is None:
        # Infer again on the formats the kernel reads: a transposed operand's levels apply
        # to its dimensions in the new order (CSR x CSC reads B as CSR, so the product is
        # CSR, not dense because CSC stores columns densely). Repeat while that changes
        # the order (at most a few rounds; the kinds only move toward what is read).
        for _ in range(3):
            def kind_read(acc: Access, v: str, order=order) -> LevelKind:
                fmt = formats[acc.tensor]
                if fmt is None:
                    return LevelKind.DENSE
                dims, _tr = _concordant_dims(acc.indices, fmt, order)
                return fmt.levels[dims.index(acc.indices.index(v))]
            kinds = infer_output_kinds(asg.rhs, asg.output, kind_read)
            dense_now = rank == 0 or all(k.full for k in kinds.values())
            if kinds == out_kinds and dense_now == out_dense:
                break
            out_kinds, out_dense = kinds, dense_now
            lo, problem = _choose_order(asg, ids, formats, f, not out_dense, out_mode_vars, fixed_tail,
                                    statistics)
            order = lo.order
    cost = order_cost(order, problem)
    loop_rank = {v: n for n, v in enumerate(order)}

    # ---- accesses ----
    plans: List[AccessPlan] = []
    for acc, i in ids.items():
        fmt = formats[acc.tensor]
        if fmt is None:
            plans.append(AccessPlan(i, acc.tensor, acc.indices, False, None))
            continue
        dims, tr = _concordant_dims(acc.indices, fmt, order, fixed_tail.get(acc.tensor, 0))
        lvars = tuple(acc.indices[d] for d in dims)
        read_fmt = fmt.transposed_copy(dims) if tr else fmt
        plans.append(AccessPlan(i, acc.tensor, acc.indices, True, fmt, read_fmt, tr,
                                level_plans(i, read_fmt.levels, lvars)))

    # ---- output ----
    out = OutputPlan(dense=out_dense, vars=tuple(asg.output))
    workspaces: List[str] = []
    if out_dense and asg.output:
        # reductions below every output loop accumulate in a register, stored once
        last_out = max(loop_rank[v] for v in asg.output)
        if last_out + 1 < len(order):
            out.acc_depth = last_out + 1
    if not out_dense:
        level_vars = tuple(sorted(asg.output, key=lambda v: loop_rank[v]))
        mode_order = tuple(asg.output.index(v) for v in level_vars)
        if out_format is not None:
            produced = Format(out_format.levels, mode_order)
            final = out_format if (out_format.block is not None or out_format.mode_order != mode_order) else None
        else:
            produced = Format([out_kinds[v] for v in level_vars], mode_order)
            final = None
        out.format, out.final_format, out.level_vars = produced, final, level_vars
        red = set(asg.reduction)
        first_red = next((n for n, v in enumerate(order) if v in red), None)
        last_out = max(loop_rank[v] for v in asg.output)
        if first_red is not None and first_red < last_out:
            out.mode = "ws"
            out.ws_depth = first_red
            out.ws_vars = tuple(v for v in order[first_red:] if v not in red)
            # the workspace is dense when the output stores those levels densely anyway
            out.ws_dense = all(produced.levels[level_vars.index(v)].full
                               for v in out.ws_vars)
            kind = ("dense workspace (touched flags)" if out.ws_dense else
                    "sparse workspace (std::map; per-thread dense values, marks and a touched "
                    "list when its extent is at most 4M entries)")
            workspaces.append(f"{','.join(out.ws_vars)}: {kind}")
        elif last_out + 1 < len(order):
            out.mode = "acc"
            out.acc_depth = last_out + 1
        else:
            out.mode = "direct"
        out.pattern = _pattern_access(asg, plans, out, order)
        if asg.reduce != "sum" and out.mode == "ws" and out_format is None:
            # workspaces only sum: a max/min whose reduction loop sits above an output loop
            # (CSC reduced over its columns) writes a dense output instead
            return schedule(asg, formats, Format("d" * rank), fixed_tail, statistics)
        if asg.reduce != "sum" and out.mode == "ws":
            raise NotImplementedError(
                f"a {asg.reduce} reduction over {', '.join(asg.reduction)} above output loops "
                f"needs a workspace, which only sums (loop order {', '.join(order)}); read "
                f"the operand in a format whose mode order puts the output dimensions first")
    return Schedule(asg, order, plans, out, f, workspaces, _tiled(order, plans), cost,
                    list(lo.sparsity_order), list(lo.moves), list(lo.cycles),
                    list(lo.cycle_removals), dict(lo.terms), list(lo.estimates or ()), statistics)


def _check_denominators(e, formats) -> None:
    """A quotient is computed where its numerator may be nonzero, so its denominator must be
    dense: dividing by a sparse operand is x / 0 wherever it stores nothing (dense by
    nature). (An expression computed at every position, ``where(1, A / B, 1)``, may divide
    by a sparse operand: there an absent entry reads as 0.)"""
    if isinstance(e, Div):
        sparse = sorted({a.tensor for a in accesses(e.b) if formats[a.tensor] is not None})
        if sparse:
            raise ValueError(f"division by sparse operand {sparse[0]}: the quotient is x / 0 "
                             f"wherever it stores nothing (dense by nature); divide by its "
                             f"dense form")
    for child in e.children():
        _check_denominators(child, formats)


def _tiled(order: Sequence[str], plans: List[AccessPlan]) -> List[str]:
    """Paper Algorithm 3: only dense loops are tiled, never a sparse loop nor a parent of
    one (a loop with a sparse loop anywhere below it). SpMM CSR x dense: ``k``, never ``j``
    (sparse) or ``i`` (parent of ``j``); SpMV and SpGEMM: none. The kernel strip-mines the
    innermost such loop into 512-bit vector panels (``codegen``: compile-time row widths,
    else gcc's vectorizer)."""
    sparse_vars = {lv.var for ap in plans if ap.sparse for lv in ap.levels if lv.kind.is_sparse}
    return [v for n, v in enumerate(order) if not any(u in sparse_vars for u in order[n:])]
