"""The work a loop order does on these operands, estimated from their statistics
(``operand_stats``): the quantitative side of the cost model, which the additive model
(``cost_model``: dense loops, transposes, depths, counted per order) cannot see.

For each loop, outermost first, the number of times its body runs: a dense loop multiplies
by its extent (the innermost one by its extent in vectors, :data:`VECTOR_VISITS`), a sparse
one by the mean entries per parent of the levels it iterates (a co-iteration visits the
entries of all of them and keeps the fewest). Transposes cost a
few passes over the operand's stored entries. The outermost loop runs in parallel when its
chunks write disjoint output; the chunks are balanced by stored entries, so what limits the
threads is the heaviest single row: a row holding a fraction ``s`` of the entries caps the
speedup at ``1 / s`` (a power-law graph's hub row, where a uniform matrix of the same size
scales to every thread).

Two costs follow from where the loops sit, not from how often they run: the output's
accumulator (a register across the reductions below the output's loops, else the output in
memory, read and written by every leaf: :data:`UPDATE_VISITS`), and a transpose the
compiler keeps across calls (``kept_conversions``: once the operand's pattern is seen
again, a gather of its values at most, :data:`KEPT_TRANSPOSE_PASSES`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence

from . import merge_lattice as ml
from .cost_model import OrderProblem, concordant_dims, measure
from .operand_stats import fits_dense_level

__all__ = ["Statistics", "Estimate", "estimate", "dense_top_reads", "TRANSPOSE_PASSES",
           "KEPT_TRANSPOSE_PASSES", "VECTOR_VISITS", "UPDATE_VISITS", "WIDE_WORKSPACE_VISITS",
           "MAP_WORKSPACE_VISITS", "ROW_WORKSPACE_VISITS", "RESTARTED_MERGE_VISITS",
           "DENSE_TOP_VISITS"]

#: entry visits a transpose costs on a call that converts (count, prefix sum, scatter of
#: coordinates and values, fresh arrays): CSC -> CSR of 45k entries takes 70 us warm and
#: 250 us into fresh memory, where a visit of a nest takes ~0.15 ns (``i, j, k`` SpMM,
#: 3000^2, 0.5 %, K = 32: 409k visits, 62 us; 1 thread, Zen 5)
TRANSPOSE_PASSES = 10.0

#: entry passes of a transpose kept across calls (``kept_conversions``): the operand seen
#: again, its converted pattern and permutation are kept and the values gathered once
#: while they stay the same (an optimizer step changes them: one gather per step)
KEPT_TRANSPOSE_PASSES = 1.0

#: body visits per vector of the output read and written in memory (a leaf below a
#: reduction loop that is not held in registers). ``A^T @ G`` into a dense array over CSR
#: (4elt, 92k entries, 1 thread, Zen 4): ``i, j, k`` adds each stored entry's row of G into
#: ``out[j]`` (the fixed-width scatter, ``lower.facts._scattered_rows``), ``j, i, k`` over
#: the kept transpose sums each row in registers: K = 8 0.095 / 0.069 ms, K = 32 0.25 /
#: 0.15, K = 128 1.17 / 0.63 (copter2, 704k entries: 1.9 / 1.2 ms at K = 32), about one
#: visit more per vector. At 0.5 (calibrated on the run-time-width scatter) the kept
#: transpose did not look worth a reuse plan at K = 32.
UPDATE_VISITS = 1.0

#: body visits of a dense innermost loop per estimated visit: the kernel runs it in vector
#: registers (4: a float64 vector on AVX2, the fewest lanes of any target and value type,
#: so no machine's own width is assumed). Without it, ``A^T X`` at 2 threads (``ij,ik->jk``
#: over CSR) ran ``k, i, j``, its dense ``k`` split over the threads and each thread
#: adding every stored entry into a workspace one value at a time: 0.89 ms, where ``i, j,
#: k`` on one thread adds 32-value rows (0.21 ms at 3000^2, 0.5 %, K = 32).
VECTOR_VISITS = 4.0


#: body visits per update of a workspace of two or more dimensions (CSC x CSR in the outer
#: product order ``j, i, k``: the whole output accumulates there): through a dense scratch
#: and a sort of its touched list while its extent is at most ``DENSE_WS_LIMIT`` (~57 ns an
#: update), else through the runtime's ``SparseWorkspace`` (appended pairs sorted when read:
#: ~59 ns; the std::map it replaced in session 32 took ~570), where Gustavson's
#: one-dimensional workspace (``i, j, k`` after a transpose) takes ~9 ns an update with its
#: row's work (N = 2000 and 20,000, 10 entries a row, 1 thread, Zen 5: 9.5 / 118 ms against
#: 1.1 / 17 ms, the transpose 0.07 / 0.6 ms; session 30's map: 11.5 / 1138 ms). Unpriced,
#: the model chose the outer product: 30-90x scipy.
WIDE_WORKSPACE_VISITS = 380.0
MAP_WORKSPACE_VISITS = 400.0

#: body visits per entry drained from a one-dimensional workspace (its touched coordinates
#: sorted and written out per row, a new pattern assembled), where an order without one
#: writes the output where an operand stores it. A sparse weight's gradient at batch 1
#: (``oj,oa,ja->oj``, 1024^2 at 10 %, 1 thread): ``o, a, j`` through the workspace 1.9 ms,
#: ``o, j, a`` on the weight's pattern 0.40 ms (~14 ns an entry, ~90 visits). Unpriced, the
#: model chose the workspace (its ``a`` loop of extent 1 looked free).
ROW_WORKSPACE_VISITS = 60.0

#: body visits per entry of a merge against an operand's whole top (compressed) level
#: that restarts for every iteration of an enclosing loop: a DCSR right operand of ``A @
#: A`` in ``i, j, k`` cannot locate row ``j``, so each row of A is merged (two pointers,
#: a branch per step) with the whole list of B's stored rows. Measured ~0.7 ns a visit
#: (4elt, DCSR: 2.4e8 visits, 169 ms; random n = 5000, 4 a row: 2.5e7, 17 ms; 1 thread),
#: ~4.5x a nest visit. Priced at 1, the model kept that plan over the outer product
#: (25 ms) and, at 2 threads, chose it again as soon as it parallelized.
RESTARTED_MERGE_VISITS = 4.0

#: body visits per coordinate of a compressed top level the kernel reads dense instead
#: (:func:`dense_top_reads`): the level below gets a ``pos`` over the whole extent,
#: scattered and prefix-summed once per call (``kept_conversions.switched_top_level``:
#: 15,606 rows ~0.05 ms, 1M rows ~2.5 ms at 1 thread, ~2.5 ns a row). Then the row is
#: located, where the merge restarted per row cost 4elt's ``A @ A`` 20-35 ms (CSR: 3 ms).
DENSE_TOP_VISITS = 16.0

#: the extent above which a workspace is the runtime's (``lower.facts.DENSE_WS_LIMIT``)
_DENSE_WS_LIMIT = 1 << 22


@dataclass(frozen=True)
class Statistics:
    """What the planner hands the scheduler to estimate with: each sparse operand's
    ``OperandStats`` (by operand number), every index variable's extent, the threads."""
    operands: Dict[int, object] = field(default_factory=dict)
    extents: Dict[str, int] = field(default_factory=dict)
    threads: int = 1
    #: operands (by number) whose transposes are kept from earlier calls (the plan calls
    #: on a pattern seen again switch to: ``planner.reuse_entry``)
    kept: FrozenSet[int] = frozenset()

    def problem_fields(self, ids) -> dict:
        """``OrderProblem`` keyword arguments for these accesses: the statistics per access
        id, the extents, and transposes weighted by stored entries (relative to the mean)."""
        stats = {i: self.operands[a.tensor] for a, i in ids.items() if a.tensor in self.operands}
        mean = sum(s.nnz for s in stats.values()) / max(len(stats), 1)
        weights = {i: max(s.nnz / mean, 0.01) for i, s in stats.items()} if mean > 0 else {}
        kept = frozenset(i for a, i in ids.items() if a.tensor in self.kept)
        return {"stats": stats, "extents": dict(self.extents), "transpose_weights": weights,
                "kept_transposes": kept}


@dataclass(frozen=True)
class Estimate:
    """``work``: loop-body visits of the nest; ``updates``: output vectors read and written
    in memory (times :data:`UPDATE_VISITS` in the total); ``transposes``: entries moved
    re-formatting discordant operands (times :data:`TRANSPOSE_PASSES`, or
    :data:`KEPT_TRANSPOSE_PASSES` where kept); ``threads``: the speedup the parallel outer
    loop can reach (1: one chunk); ``conversions``: coordinates of the compressed top
    levels read dense (times :data:`DENSE_TOP_VISITS`), those of the accesses
    ``dense_tops``; ``total`` = (work + updates) / threads + transposes + conversions."""
    work: float
    transposes: float
    threads: float
    total: float
    updates: float = 0.0
    conversions: float = 0.0
    dense_tops: FrozenSet[int] = frozenset()

    def __str__(self) -> str:
        tops = (f", top level read dense: access {', '.join(map(str, sorted(self.dense_tops)))} "
                f"(conversion {self.conversions:.4g})" if self.dense_tops else "")
        return (f"{self.total:.4g} (work {self.work:.4g}, updates {self.updates:.4g} on "
                f"{self.threads:.3g} threads, transposes {self.transposes:.4g}{tops})")


def _fanout(p: OrderProblem, acc, i: int, fmt, var: str, order: Sequence[str],
            dense_top: bool = False) -> Optional[float]:
    """Mean entries per parent of ``acc``'s sparse level on ``var`` as ``order`` reads it
    (None: no such level, or no statistics). A concordant access has measured level
    counts; a transposed one is read with the same level kinds in another mode order,
    whose counts are estimated: a dense level multiplies by its extent, a sparse one too,
    capped by the stored entries. ``dense_top``: its top level is read dense
    (:func:`dense_top_reads`), a level of the whole extent."""
    st = p.stats.get(i)
    if st is None:
        return None
    dims, tr = concordant_dims(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))
    if dims is None:
        return None
    counts, n = [], 1.0
    for k, d in enumerate(dims):
        if dense_top and k == 0:
            n = float(st.shape[d])
        elif not tr:
            n = float(st.levels[k].count)
        else:
            n = n * st.shape[d] if not fmt.levels[k].is_sparse else min(n * st.shape[d], float(st.nnz))
        counts.append(n)
    for k, d in enumerate(dims):
        if acc.indices[d] == var and fmt.levels[k].is_sparse and not (dense_top and k == 0):
            return counts[k] / max(counts[k - 1] if k else 1.0, 1.0)
    return None


def _top_level(acc, fmt, var: str, order: Sequence[str], p: OrderProblem) -> bool:
    """Whether ``var`` is the variable of ``acc``'s first level as ``order`` reads it, a
    compressed one (a merge there walks the whole level: :data:`RESTARTED_MERGE_VISITS`)."""
    dims, _tr = concordant_dims(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))
    return bool(dims) and acc.indices[dims[0]] == var and fmt.levels[0].is_sparse


def _may_read_dense_top(p: OrderProblem, acc, i: int, fmt, var: str, order: Sequence[str]) -> bool:
    """Whether ``acc``'s compressed top level on ``var`` (below an enclosing loop) can be
    read dense instead: a compressed level (its ``pos`` rebuilt over the extent,
    ``kept_conversions.switched_top_level``) over a compressed one, of an operand no
    dimension of which is far longer than its stored entries
    (``operand_stats.fits_dense_level``: a 20M x 20M DCSR with 1,000 entries never gets an
    80 MB ``pos``; the plan key's statistics class carries it), and other accesses still
    drive the loop once this one only locates (an intersection: a union must iterate
    every operand)."""
    st = p.stats.get(i)
    if (st is None or fmt.block is not None or p.fixed_tail.get(acc.tensor)
            or len(fmt.levels) < 2 or fmt.levels[0].letter != "c" or fmt.levels[1].letter != "c"
            or not fits_dense_level(st.shape, st.nnz)):
        return False
    others = []
    for acc2, i2, fmt2 in p.sparse_accesses:
        if i2 == i:
            continue
        dims, _tr = concordant_dims(acc2.indices, fmt2, order, p.fixed_tail.get(acc2.tensor, 0))
        if dims is not None and any(acc2.indices[d] == var and fmt2.levels[k].is_sparse
                                    for k, d in enumerate(dims)):
            others.append(i2)
    return bool(others) and not ml.dense_needed(p.f, others)


def _heaviest_row_share(p: OrderProblem, outer: str) -> float:
    """The largest fraction of one operand's entries under one coordinate of ``outer``
    (its rows when ``outer`` is its first level's variable)."""
    share = 0.0
    for acc, i, fmt in p.sparse_accesses:
        st = p.stats.get(i)
        seg = None if st is None else st.segments
        if seg is None or st.nnz == 0 or acc.indices[fmt.mode_order[0]] != outer:
            continue
        if len(st.levels) < 2 or st.levels[1] is not seg:
            continue
        share = max(share, seg.seg_max / st.nnz)
    return share


def estimate(order: Sequence[str], p: OrderProblem, threads: int = 1) -> Optional[Estimate]:
    """The estimate of ``order`` (None: infeasible, or no statistics to estimate with)."""
    if not p.stats or not p.extents:
        return None
    m = measure(order, p)
    if m is None:
        return None
    iters, work, converted = 1.0, 0.0, 0.0
    dense_tops = set()                 # accesses whose top level is read dense
    entered: List[float] = []          # iterations reaching each depth
    for depth, v in enumerate(order):
        entered.append(iters)
        if m.dense_pattern[depth]:
            fans = [float(p.extents.get(v, 1))]
            if depth == len(order) - 1:
                fans = [max(1.0, fans[0] / VECTOR_VISITS)]
        else:
            # a co-iteration visits every level's entries; one that merges a whole top
            # level under an enclosing loop pays each visit as a branchy merge step, unless
            # that level is read dense (built once per call) and located instead
            fans, visits = [], 0.0
            for acc, i, fmt in p.sparse_accesses:
                f = _fanout(p, acc, i, fmt, v, order, i in dense_tops)
                if f is not None:
                    top = depth and _top_level(acc, fmt, v, order, p)
                    if top and _may_read_dense_top(p, acc, i, fmt, v, order):
                        build = DENSE_TOP_VISITS * float(p.extents.get(v, 1))
                        if build < iters * f * RESTARTED_MERGE_VISITS:
                            dense_tops.add(i)
                            converted += build
                            continue
                    fans.append(f)
                    visits += f * (RESTARTED_MERGE_VISITS if top else 1.0)
            if len(fans) < 2:
                visits = sum(fans)
            if not fans:
                fans = [float(p.extents.get(v, 1))]
                visits = fans[0]
            work += iters * visits
            iters *= min(fans)
            continue
        work += iters * sum(fans)
        iters *= min(fans)
    moved = 0.0
    for i in m.transposed:   # an operand's stored entries; the output's: the nest's leaves
        st = p.stats.get(i)
        passes = KEPT_TRANSPOSE_PASSES if i in p.kept_transposes else TRANSPOSE_PASSES
        moved += passes * (st.nnz if st is not None else iters)
    updates = UPDATE_VISITS * _memory_updates(order, m, p, entered, iters)
    if m.workspace >= 2:
        updates = iters * _wide_workspace_visits(order, p)
    elif m.workspace == 1:
        updates += ROW_WORKSPACE_VISITS * _drained(order, m, p, entered, iters)
    par = 1.0
    if order and order[0] in p.asg.output and threads > 1:   # chunked outer loop
        share = _heaviest_row_share(p, order[0])
        par = float(threads) if share <= 0 else max(1.0, min(float(threads), 1.0 / share))
    return Estimate(work, moved, par, (work + updates) / par + moved + converted, updates,
                    converted, frozenset(dense_tops))


def dense_top_reads(order: Sequence[str], p: OrderProblem, threads: int = 1) -> FrozenSet[int]:
    """The accesses whose compressed top level ``order`` reads dense (built once per call,
    then located: CSR's row lookup for a DCSR operand), where their estimate says that pays
    over merging the whole level again under every iteration of the loops above
    (:data:`RESTARTED_MERGE_VISITS`). Empty without statistics. ``schedule`` reads the
    accesses so; the estimate prices them so (:data:`DENSE_TOP_VISITS`)."""
    e = estimate(order, p, threads)
    return e.dense_tops if e is not None else frozenset()


def _drained(order: Sequence[str], m, p: OrderProblem, entered: Sequence[float],
             leaves: float) -> float:
    """Entries drained from a one-dimensional workspace (its touched coordinates sorted and
    written out, a new pattern assembled: :data:`ROW_WORKSPACE_VISITS` each).

    Priced where a dense reduction loop made it needed (an order over sparse reductions only,
    SpGEMM's, needs one in every order: left out). Over a dense loop's variable (a row with
    touched flags): the leaves less those reductions (a sparse weight's gradient
    ``oj,oa,ja->oj`` as ``o, a, j``). Over a sparse loop's variable, coordinates arrive
    scattered: at most one entry per leaf, less the repeats of dense reductions no sparse
    operand indexes (each revisits the same coordinates; a dense level's rows of a CSR
    operand do not), and per fill (the iterations above the first reduction) at most the
    variable's extent. Where another order needs no workspace it decides:
    ``einsum("ij,ik->jk", S, D)`` over CSR at K = 8 took ``k, i, j`` (a sorted workspace of
    ``j`` per column ``k``: 0.72 ms on 4elt) over ``j, i, k`` (rows written in place, the
    dense route: ~0.1 ms), 0.4 % apart with the drain divided by the dense ``i``, and its
    plan then ran K = 128 in 14 ms (0.6 ms)."""
    dense_sums = [float(p.extents.get(v, 1)) for depth, v in enumerate(order)
                  if v in p.reductions and m.dense_pattern[depth]]
    if not dense_sums:
        return 0.0
    first = next(n for n, v in enumerate(order) if v in p.reductions)
    below = [n for n in range(first, len(order)) if order[n] not in p.reductions]
    if len(below) != 1 or m.dense_pattern[below[0]]:
        return leaves / max(1.0, math.prod(dense_sums))
    indexed = {v for acc, _i, _f in p.sparse_accesses for v in acc.indices}
    repeats = math.prod(float(p.extents.get(v, 1)) for depth, v in enumerate(order)
                        if v in p.reductions and m.dense_pattern[depth] and v not in indexed)
    extent = float(p.extents.get(order[below[0]], 1))
    return min(leaves / max(1.0, repeats), entered[first] * extent)


def _wide_workspace_visits(order: Sequence[str], p: OrderProblem) -> float:
    """Visits per update of the workspace under the first reduction loop (see
    :data:`WIDE_WORKSPACE_VISITS`)."""
    first = next((n for n, v in enumerate(order) if v in p.reductions), len(order))
    extent = 1
    for v in order[first:]:
        if v not in p.reductions:
            extent *= int(p.extents.get(v, 1))
    return MAP_WORKSPACE_VISITS if extent > _DENSE_WS_LIMIT else WIDE_WORKSPACE_VISITS


def _memory_updates(order: Sequence[str], m, p: OrderProblem, entered: Sequence[float],
                    leaves: float) -> float:
    """Output values (vectors, along a row) read and written in memory. The deepest output
    loop's body updates the output once per iteration, summing the reductions below it
    in registers; so does the loop above an innermost dense output loop, whose row the
    kernel holds in vector registers across the reductions between them (``i, j, k``
    SpMM). A reduction above that loop makes every one of its iterations read and write
    the output again (``j, i, k`` over CSC adds each entry's row into ``out[i]``);
    without one, each result is written once. No reduction: every order writes each
    result once (0)."""
    if not any(v in p.reductions for v in order):
        return 0.0
    last = len(order) - 1
    outs = [d for d, v in enumerate(order) if v not in p.reductions]
    row = 1.0
    if outs and outs[-1] == last and m.dense_pattern[last]:
        row = max(1.0, float(p.extents.get(order[last], 1)) / VECTOR_VISITS)
        outs = outs[:-1]
    eff = outs[-1] if outs else -1
    return (entered[eff + 1] if eff + 1 <= last else leaves) * row
