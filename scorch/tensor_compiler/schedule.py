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

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..formats import Format, LevelKind, compressed, dense
from . import merge_lattice as ml
from .format_inference import infer_output_kinds
from .index_notation import Access, Assignment, Div, accesses
from .levels import LevelPlan, level_plans
from .cost_model import OrderProblem, concordant_dims, cost_terms, loop_order_layout, measure, order_cost
from .loop_order import CycleRemoval, LoopOrder, Move, NoValidOrder, PricedOrder, algorithm1
from .operand_stats import fits_dense_level
from .work_estimate import dense_top_reads

__all__ = ["AccessPlan", "CacheTile", "OutputPlan", "Schedule", "schedule", "NoValidOrder", "pattern_suffix",
           "dense_layout", "dimension_permutation", "sparse_loop_ranks"]


@dataclass
class AccessPlan:
    id: int
    tensor: int
    indices: Tuple[str, ...]            # variable per dimension
    sparse: bool
    source_format: Optional[Format]     # operand's format (None: dense strided)
    format: Optional[Format] = None     # format the kernel reads (after a transpose)
    # read re-formatted, converted once per call (``execute.prepare_operands``): in another
    # mode order (a transpose), or with its compressed top level read dense (``dense_top``)
    transposed: bool = False
    levels: List[LevelPlan] = field(default_factory=list)
    dense_top: bool = False             # its compressed top level read dense (DCSR as CSR)

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
    layout: Tuple[str, ...] = ()              # dense: the kernel's memory order, if not ``vars``

    @property
    def memory_order(self) -> Tuple[str, ...]:
        """The variables in the order the kernel lays a dense output out (outermost first):
        ``vars`` unless :func:`dense_layout` chose the loop order."""
        return self.layout or self.vars


@dataclass(frozen=True)
class CacheTile:
    """Cache blocking (paper Algorithm 3 generalised): the innermost dense loop ``var`` is cut
    into panels whose loop runs above everything, above the sparse loop ``above``, so the
    panel of the block (``access``'s dims ``var`` x ``block``; -1: the output) that every
    iteration of ``above`` re-reads stays in cache. The panel width is chosen per call
    (``tiling.choose_cache_panel``: the panel of the block fits half the L2 cache).
    ``gathers``: every panel's pass gathers a dense operand one value per stored entry from
    a different row (:func:`gathered_accesses`), so the fewest passes win over an L2-sized panel."""
    var: str
    above: str
    block: Tuple[str, ...]
    access: int
    gathers: bool = False
    gathered: Tuple[int, ...] = ()     # the dense accesses so read (:func:`gathered_accesses`)

    def __str__(self) -> str:
        who = "the output" if self.access < 0 else f"access {self.access}"
        return (f"{self.var} in panels above {self.above} ({who}'s "
                f"{' x '.join(self.block + (self.var + ' panel',))} stays in cache"
                + ("; each pass gathers: fewest passes)" if self.gathers else ")"))


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
    cache_tile: Optional[CacheTile] = None
    # with the operands' statistics: the candidate orders priced by work_estimate (the
    # chosen one first), and the statistics themselves
    estimates: List[PricedOrder] = field(default_factory=list)
    statistics: object = None



def _concordant_dims(indices: Sequence[str], fmt: Format, order: Sequence[str],
                     tail: int = 0) -> Tuple[Optional[Tuple[int, ...]], bool]:
    return concordant_dims(indices, fmt, order, tail)


def _choose_order(asg, ids, formats, f, out_sparse, out_mode_vars, fixed_tail=None,
                  statistics=None, small_blocks=frozenset()):
    """Algorithm 1 on this expression (see :mod:`.loop_order`): the order and its problem.
    ``statistics`` (``work_estimate.Statistics``): the operands' statistics, when known;
    ``small_blocks``: dense operands whose re-read block fits in L1 (``planner.block_key``)."""
    extra = statistics.problem_fields(ids) if statistics is not None else {}
    p = OrderProblem(asg, ids, formats, f, out_sparse, out_mode_vars, fixed_tail or {},
                     small_blocks=frozenset(small_blocks), **extra)
    return _row_major_on_tie(algorithm1(p, statistics.threads if statistics is not None else 1), p), p


def _row_major_on_tie(lo: LoopOrder, p: OrderProblem) -> LoopOrder:
    """``lo`` with its order replaced by a candidate priced exactly the same (estimate and
    additive cost) that nests the sparse result's variables in its dimension order, where
    the chosen one does not: of two mirror-image plans the result is then row-major, as
    over CSR (DCSR's ``A.t() @ A``, its left operand transposed and its right one's top
    level read dense, or the other way round: DCSR, as before, not DCSC), rather than
    whichever the candidates listed first. A requested output mode order stays."""
    if not p.out_sparse or p.out_mode_vars is not None or not lo.estimates:
        return lo
    chosen, out = lo.estimates[0], list(p.asg.output)

    def row_major(order) -> bool:
        return [v for v in order if v in out] == out
    if row_major(chosen.order):
        return lo
    for c in lo.estimates[1:]:
        if c.cost == chosen.cost and row_major(c.order) and \
                math.isclose(c.estimate.total, chosen.estimate.total, rel_tol=1e-9):
            rest = [e for e in lo.estimates[1:] if e is not c]
            return dataclasses.replace(
                lo, order=list(c.order), terms=cost_terms(c.order, p),
                transposed=list(measure(c.order, p).transposed),
                estimates=[dataclasses.replace(c, chosen=True),
                           dataclasses.replace(chosen, chosen=False)] + rest)
    return lo


def _pattern_access(asg: Assignment, plans: List[AccessPlan], out: OutputPlan,
                    order: Sequence[str]) -> int:
    """The access whose stored pattern *is* the output's (SDDMM's S, ``A * D``), or -1.

    Holds when a sparse access ``P`` is one the presence formula needs (no entry
    outside its pattern), is over exactly the output variables, is read in the output's produced format
    (same level kinds in the same variable order; COO's grouped coordinate levels too: a
    run of equal row coordinates is one visit of the row loop, its entries one each), and the
    output loops come first: then every stored entry of ``P`` is visited exactly once and
    gives exactly one output entry (given non-empty reductions, checked at run time), so
    the kernel writes ``out_vals[q]`` at ``P``'s position and the output shares ``P``'s
    ``pos``/``crd`` arrays: no coordinate buffers, no assembly pass."""
    if out.dense or out.mode not in ("acc", "direct") or out.final_format is not None:
        return -1
    if asg.reduce != "sum" and asg.reduction:
        # a max/min whose reduction finds no stored entry has no value (a sparse result
        # stores no such fiber); on P's pattern it would store the reduction's identity
        # (found by tests/test_fuzz.py: ``min_i (... + T0(i,j)) * T1(j)`` with T0 empty)
        return -1
    for P in (ap for ap in plans if ap.sparse):
        if _is_output_pattern(asg, plans, P, out, order):
            return P.id
    return -1


def pattern_suffix(s: "Schedule") -> Tuple[str, ...]:
    """The output's variables after the pattern operand's: dense levels the output adds
    under each of its entries (a broadcast SDDMM ``ij,bhid,bhjd->bhij`` stored as the
    pattern's levels over dense heads), each entry's values one block of them."""
    out = s.output
    return tuple(out.level_vars[len(s.accesses[out.pattern].levels):])


def _is_output_pattern(asg: Assignment, plans: List[AccessPlan], P: AccessPlan,
                       out: OutputPlan, order: Sequence[str]) -> bool:
    """``_pattern_access`` for one candidate ``P``. The output may add dense levels under
    P's (``pattern_suffix``). Other sparse accesses may take part (the
    weight gradient of a sparse batch through a sparse weight, ``oj,ao,aj->oj``) when their
    levels on output variables only locate (dense levels): then no output loop is filtered
    by them, every entry of ``P`` is still visited once, and one whose reduction finds
    nothing stores 0."""
    k = len(P.levels)
    if (P.level_vars != out.level_vars[:k] or len(set(P.indices)) != len(P.indices)
            or tuple(P.format.levels) != tuple(out.format.levels[:k])
            or any(kind != LevelKind.DENSE for kind in out.format.levels[k:])
            or tuple(order[:len(out.level_vars)]) != tuple(out.level_vars)):
        return False
    outputs = set(out.level_vars)
    for ap in plans:
        if ap.sparse and ap is not P and any(lv.var in outputs and (lv.iterates or not lv.locates)
                                             for lv in ap.levels):
            return False
    # no entry outside P's pattern: the presence formula cannot hold without P (a product,
    # a zero-preserving function, a comparison that keeps 0, where(P > 0, P, 0), ...)
    return not ml.dense_needed(ml.formula(asg.rhs, ml.access_ids(asg.rhs)), [P.id])


def schedule(asg: Assignment, formats: Sequence[Optional[Format]],
             out_format: Optional[Format] = None, fixed_tail=None, statistics=None,
             small_blocks=frozenset()) -> Schedule:
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
        out_mode_vars = None if out_dense else _operand_mode_vars(asg, ids, formats)
    lo, problem = _choose_order(asg, ids, formats, f, not out_dense, out_mode_vars, fixed_tail,
                                statistics, small_blocks)
    order = lo.order
    if out_format is None and len(sparse_ids) != 1:
        # (A result over one sparse operand keeps the kinds inferred from its format:
        # reading that operand in another mode order is this compiler's choice
        # (``cost_model.restreamed_blocks``: the MoE gate read expert-major), not another
        # result.)
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
                                        statistics, small_blocks)
            order = lo.order
    cost = order_cost(order, problem)
    loop_rank = {v: n for n, v in enumerate(order)}

    # ---- accesses ----
    # a compressed top level located below another loop is read dense where the estimate
    # says so (DCSR as CSR: its row found, not merged for again under every row above)
    dense_tops = dense_top_reads(order, problem, statistics.threads) if statistics is not None else ()
    plans: List[AccessPlan] = []
    for acc, i in ids.items():
        fmt = formats[acc.tensor]
        if fmt is None:
            plans.append(AccessPlan(i, acc.tensor, acc.indices, False, None))
            continue
        dims, tr = _concordant_dims(acc.indices, fmt, order, fixed_tail.get(acc.tensor, 0))
        lvars = tuple(acc.indices[d] for d in dims)
        read_fmt = fmt.transposed_copy(dims) if tr else fmt
        top = i in dense_tops
        if top:
            read_fmt = Format((dense,) + tuple(read_fmt.levels[1:]), read_fmt.mode_order)
        plans.append(AccessPlan(i, acc.tensor, acc.indices, True, fmt, read_fmt, tr or top,
                                level_plans(i, read_fmt.levels, lvars), top))

    # ---- output ----
    out = OutputPlan(dense=out_dense, vars=tuple(asg.output))
    workspaces: List[str] = []
    if out_dense and asg.output:
        # reductions below every output loop accumulate in a register, stored once
        last_out = max(loop_rank[v] for v in asg.output)
        if last_out + 1 < len(order):
            out.acc_depth = last_out + 1
        out.layout = dense_layout(order, plans, out.vars)
    if not out_dense:
        level_vars = tuple(sorted(asg.output, key=lambda v: loop_rank[v]))
        mode_order = tuple(asg.output.index(v) for v in level_vars)
        if out_format is not None:
            produced = Format(out_format.levels, mode_order)
            final = out_format if (out_format.block is not None or out_format.mode_order != mode_order) else None
        else:
            produced = Format([out_kinds[v] for v in level_vars], mode_order)
            final = None
            if out_mode_vars is not None and tuple(out_mode_vars) != level_vars:
                # the one sparse operand was read in another mode order
                # (cost_model.restreamed_blocks): the result keeps the operand's
                final = Format([out_kinds[v] for v in out_mode_vars],
                               tuple(asg.output.index(v) for v in out_mode_vars))
        out.format, out.final_format, out.level_vars = produced, final, level_vars
        red = set(asg.reduction)
        first_red = next((n for n, v in enumerate(order) if v in red), None)
        last_out = max(loop_rank[v] for v in asg.output)
        if first_red is not None and first_red < last_out:
            out.mode = "ws"
            out.ws_depth = first_red
            out.ws_vars = tuple(v for v in order[first_red:] if v not in red)
            if last_out + 1 < len(order):
                # reductions below every output loop sum in a register, added to the
                # workspace once (``ij,ik,jk->i`` over CSC, loops j, i, k: a load-add-store
                # chain through the workspace per k was 2.5 ms, a vector dot 0.2 ms)
                out.acc_depth = last_out + 1
            # the workspace is dense when the output stores those levels densely anyway
            out.ws_dense = all(produced.levels[level_vars.index(v)].full
                               for v in out.ws_vars)
            kind = ("dense workspace (touched flags)" if out.ws_dense else
                    "sparse workspace (appended pairs, sorted when read; per-thread dense "
                    "values, marks and a touched list when its extent is at most 4M entries)")
            workspaces.append(f"{','.join(out.ws_vars)}: {kind}")
        elif last_out + 1 < len(order):
            out.mode = "acc"
            out.acc_depth = last_out + 1
        else:
            out.mode = "direct"
        if _dense_top_output(out, ids, formats, statistics):
            # produced with a dense top level (rows written in place, one pass to compress
            # them after: ``kept_conversions.switched_top_level``), returned as inferred
            out.final_format = out.format
            out.format = Format((dense,) + tuple(out.format.levels[1:]), out.format.mode_order)
        out.pattern = _pattern_access(asg, plans, out, order)
        if asg.reduce != "sum" and out.mode == "ws" and out_format is None:
            # workspaces only sum: a max/min whose reduction loop sits above an output loop
            # (CSC reduced over its columns) writes a dense output instead
            return schedule(asg, formats, Format("d" * rank), fixed_tail, statistics, small_blocks)
        if asg.reduce != "sum" and out.mode == "ws":
            raise NotImplementedError(
                f"a {asg.reduce} reduction over {', '.join(asg.reduction)} above output loops "
                f"needs a workspace, which only sums (loop order {', '.join(order)}); read "
                f"the operand in a format whose mode order puts the output dimensions first")
    tiled = _tiled(order, plans)
    return Schedule(asg, order, plans, out, f, workspaces, tiled, cost,
                    list(lo.sparsity_order), list(lo.moves), list(lo.cycles),
                    list(lo.cycle_removals), dict(lo.terms), _cache_tile(order, plans, out, tiled),
                    list(lo.estimates or ()), statistics)


def _dense_top_output(out: OutputPlan, ids, formats, statistics) -> bool:
    """Whether a sparse result whose format has a compressed top level over a compressed
    one (DCSR, DCSC) is produced with that level dense instead, and compressed at the end
    (``final_format``): a workspace drained row by row writes CSR's rows in place, where a
    compressed top level has the kernel append a coordinate tuple per entry and assemble
    the levels after (4elt's ``A @ A``, 289k entries, 1 thread: 2-2.5x the CSR kernel).
    Only where the statistics are known and an operand indexing the top level's variable
    has no dimension too long for a dense level (``operand_stats.fits_dense_level``; the
    plan key's statistics class carries it): a hypersparse result keeps its compressed
    levels and no array of its extent."""
    fmt = out.format
    if (statistics is None or out.mode != "ws" or out.final_format is not None
            or fmt.block is not None or len(fmt.levels) < 2
            or fmt.levels[0] is not compressed or fmt.levels[1] is not compressed):
        return False
    top = out.level_vars[0]
    if top in out.ws_vars:
        return False
    for acc in ids:
        st = statistics.operands.get(acc.tensor)
        if formats[acc.tensor] is not None and top in acc.indices and st is not None \
                and fits_dense_level(st.shape, st.nnz):
            return True
    return False


def sparse_loop_ranks(order: Sequence[str], plans: List[AccessPlan]) -> Tuple[int, ...]:
    """The depths of the loops over compressed levels."""
    rank = {v: n for n, v in enumerate(order)}
    return tuple(sorted({rank[lv.var] for ap in plans if ap.sparse for lv in ap.levels
                         if lv.kind.is_sparse}))


def dense_layout(order: Sequence[str], plans: List[AccessPlan], out_vars: Tuple[str, ...]) -> Tuple[str, ...]:
    """The loop order of a dense output's variables where the kernel should write it so,
    else ``()`` (dimension order): where a sparse loop sits between two output variables
    that the dimension order nests the other way, or is the outer of the two
    (``cost_model.loop_order_layout``, by which the cost model prices orders too).
    BigBird's ``probs @ v`` at batch 8 (loops ``i, j, b, h, d``, output ``b, h, i, d``)
    adds every stored entry into 32 head rows 256 KB apart; written in ``i, b, h, d`` order
    they are one 4 KB block (1 thread: 74 -> 25 ms, plus 3 ms to copy the result to
    dimension order). A reduction over the pattern's
    columns (``amax`` of the scores over ``j``: loops ``i, j, b, h``, output ``b, h, i``) so
    becomes a vector loop over ``b, h``. The copy to dimension order is one pass over the
    output, which the kernel writes at least once; with no sparse loop in between (SpMM
    over a batch ``b, i, j, k`` into ``i, b, k``; a transpose into a dense result) each row
    is finished before the next, and dimension order stays."""
    return loop_order_layout(order, sparse_loop_ranks(order, plans), out_vars)


def dimension_permutation(out: OutputPlan) -> Tuple[int, ...]:
    """The ``permute`` that views an output allocated in ``out.memory_order`` in dimension
    order."""
    mem = out.memory_order
    return tuple(mem.index(v) for v in out.vars)


def _operand_mode_vars(asg: Assignment, ids, formats) -> Optional[Tuple[str, ...]]:
    """The mode order (as variables) of the one sparse operand when it spans exactly the
    output's variables: a sparse result inferred from it keeps that mode order even when
    the loop order reads it transposed (the MoE gate gradient ``bn,bh,bd,ndh->bn``, read
    expert-major, is still CSR like the gate). None otherwise."""
    sparse = [acc for acc in ids if formats[acc.tensor] is not None]
    if len(sparse) != 1:
        return None
    acc, fmt = sparse[0], formats[sparse[0].tensor]
    if sorted(acc.indices) != sorted(asg.output):
        return None
    return tuple(acc.indices[d] for d in fmt.mode_order)


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


def _cache_tile(order: Sequence[str], plans: List[AccessPlan], out: OutputPlan,
                tiled: Sequence[str]) -> Optional[CacheTile]:
    """Where tiling the innermost loop above the sparse loops keeps a re-read block in cache
    (:class:`CacheTile`), else None. Valid when that loop ``L`` is tiled (Algorithm 3: no
    sparse loop at or below it, so no loop bound depends on it) and a variable of the dense
    output (each panel writes its own columns: every reduction stays whole within a
    panel). It pays where a block indexed by ``L`` is re-read by every iteration of a loop
    ``v`` it does not depend on, and spans more than ``L`` below ``v``: ``v`` the innermost
    sparse loop (the MoE forward read expert-major, ``n, b, d, h``: ``E[n]`` for every input
    ``b`` of expert ``n``), or a dense loop above it that no sparse level depends on (the
    expert gradient ``n, d, b, h``: the rows ``dy[b, :]`` of expert ``n``'s inputs for
    every ``d``). SpMM ``i, j, k`` has none: ``B[j, :]`` depends on the sparse ``j``, whose
    rows depend on ``i``."""
    if not order or not out.dense or order[-1] not in tiled or order[-1] not in out.vars:
        return None
    L = order[-1]
    sparse_vars = {lv.var for ap in plans if ap.sparse for lv in ap.levels if lv.kind.is_sparse}
    level_vars = {v for ap in plans if ap.sparse for v in ap.level_vars}
    inner = [n for n, v in enumerate(order) if v in sparse_vars]
    if not inner:
        return None
    s = inner[-1]
    loops = [s] + [n for n in range(s) if order[n] not in level_vars]
    blocks = [(ap.id, ap.indices) for ap in plans if not ap.sparse] + [(-1, out.vars)]
    for n in loops:
        for acc, idx in blocks:
            if L in idx and order[n] not in idx:
                block = tuple(v for v in order[n + 1:-1] if v in idx)
                if block:
                    g = gathered_accesses(order, plans, s)
                    return CacheTile(L, order[n], block, acc, bool(g), g)
    return None


def gathered_accesses(order: Sequence[str], plans: List[AccessPlan], s: int) -> Tuple[int, ...]:
    """The dense accesses a pass of the loop nest reads at the sparse loop ``order[s]``'s
    coordinate with an index of a loop above it and not the innermost loop: one value per
    stored entry, each from another row (a cache line apiece, unless the operand arrives, or
    is re-laid out, with stride 1 along that loop: ``lower.facts.gather_relayouts``), and
    again in every panel's pass. The MoE expert gradient ``n, d, b, h`` reads ``x[b, d]`` so
    (one pass over the gate costs ~9 ms at 1 thread on a Zen 3 core, 1024 x 784 inputs: 16
    panels of 32 columns 177 ms, 4 of 128 89 ms); the forward ``n, b, d, h`` reads
    ``x[b, :]`` as rows."""
    v, above, L = order[s], set(order[:s]), order[-1]
    return tuple(ap.id for ap in plans
                 if not ap.sparse and v in ap.indices and L not in ap.indices and above & set(ap.indices))
