"""The cost model of loop orders: one measurement of an order, read two ways.

:func:`measure` counts, for a loop order, what makes it expensive: which loops iterate
densely (no sparse level filters them), the sparse operands (and the output) it forces into
another mode order, how deep the filtering sparse levels sit, the dimensions of the sparse
output's workspace, and the dense accesses not read with stride 1 innermost.

* :func:`cost_terms` / :func:`total_cost`: the additive model Algorithm 1's greedy moves and
  the cycle removal price orders with (:data:`WEIGHTS`; transposes weigh stored entries);
* :func:`order_cost`: the same measurement as a lexicographic key (dense loops, transposes,
  the dense/sparse pattern per depth, workspace, strides), the exact criterion the tests'
  exhaustive oracle minimizes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Hashable, List, Mapping, Optional, Sequence, Tuple

from ..formats import Format
from . import merge_lattice as ml
from .index_notation import Access, Assignment

__all__ = ["WEIGHTS", "INFEASIBLE", "OrderProblem", "OrderMeasure", "measure", "cost_terms",
           "total_cost", "order_cost", "concordant_dims", "concordant_vars", "restreamed_blocks",
           "separated", "loop_order_layout"]

#: Weights of the additive cost model. ``dense_loops`` is the asymptotic term (the nest
#: does about ``N ** dense_loops * s ** sparse_loops`` work) and dominates; a transpose
#: costs a pass over the operand, more than any cache effect; the three small terms only
#: break ties between orders of the same asymptotic work and the same transposes (their
#: sum stays below one transpose for any expression of up to ~8 variables).
WEIGHTS: Dict[str, int] = {
    "dense_loops": 1000,   # per loop that must iterate densely (no sparse level filters it)
    "restreamed": 500,     # per dense matrix re-read for each entry of the innermost sparse loop
    "transpose": 100,      # per sparse operand re-formatted, plus a final output conversion
    "late_filter": 4,      # per sparse filter level, per loop depth it sits at
    "workspace": 2,        # per dimension of the sparse output's workspace (2-D: 4, none: 0)
    "strided": 1,          # per dense access (or dense output) not stride-1 innermost
}
INFEASIBLE = 10 ** 9



def concordant_dims(indices: Sequence[str], fmt: Format, order: Sequence[str],
                    tail: int = 0) -> Tuple[Optional[Tuple[int, ...]], bool]:
    """Mode order an access is read in under loop ``order``: its own if concordant (loop
    positions of its level variables nondecreasing; a repeated variable, a diagonal, sits
    on consecutive-or-later levels), else its dimensions sorted by loop position (a
    transpose). The last ``tail`` levels are fixed (the insides of blocks): only the levels
    above them may be re-ordered, and ``None`` says no transpose makes the access
    concordant."""
    rank = {v: n for n, v in enumerate(order)}

    def ok(dims):
        pos = [rank[indices[d]] for d in dims]
        return all(a <= b for a, b in zip(pos, pos[1:]))
    if ok(fmt.mode_order):
        return tuple(fmt.mode_order), False
    if not tail:
        return tuple(sorted(range(len(indices)), key=lambda d: (rank[indices[d]], d))), True
    head, fixed = fmt.mode_order[:-tail], fmt.mode_order[-tail:]
    dims = tuple(sorted(head, key=lambda d: (rank[indices[d]], d))) + tuple(fixed)
    return (dims if ok(dims) else None), True


def concordant_vars(indices: Sequence[str], fmt: Format, order: Sequence[str],
                    tail: int = 0) -> Tuple[Optional[Tuple[str, ...]], bool]:
    dims, tr = concordant_dims(indices, fmt, order, tail)
    return (None if dims is None else tuple(indices[d] for d in dims)), tr


@dataclass
class OrderProblem:
    """Everything the ordering looks at, precomputed once per schedule."""
    asg: Assignment
    ids: Dict[Access, int]
    formats: Sequence[Optional[Format]]
    f: object                                    # presence formula (merge lattice)
    out_sparse: bool
    out_mode_vars: Optional[Tuple[str, ...]] = None   # requested output mode order
    fixed_tail: Mapping[int, int] = field(default_factory=dict)
    # relative cost of transposing each access (stored entries / their mean; default 1)
    transpose_weights: Mapping[Hashable, float] = field(default_factory=dict)
    # accesses whose transposes are kept from earlier calls (work_estimate prices them as
    # a gather of the values; the additive model, which has no statistics, as any other)
    kept_transposes: FrozenSet[Hashable] = frozenset()
    # the operands' statistics (sparse access id -> operand_stats.OperandStats) and the
    # extent of every index variable, when the planner has them: work_estimate prices
    # the candidate orders with them
    stats: Mapping[int, object] = field(default_factory=dict)
    extents: Mapping[str, int] = field(default_factory=dict)
    # dense operands (by operand number) whose re-read block fits in L1 (the planner's
    # block_key): re-read per stored entry, it stays in cache, so it is not restreamed
    # (the dense result's block keeps its tenth: ij,jkl->ikl then runs i, k, j, l)
    small_blocks: FrozenSet[int] = frozenset()
    base: List[str] = field(init=False)          # outputs first, then reductions

    def __post_init__(self):
        self.fixed_tail = dict(self.fixed_tail or {})
        vars_ = list(self.asg.all_vars)
        self.base = list(self.asg.output) + [v for v in vars_ if v not in self.asg.output]
        self.sparse_accesses = [(acc, i, self.formats[acc.tensor]) for acc, i in self.ids.items()
                                if self.formats[acc.tensor] is not None]
        self.dense_accesses = [acc for acc in self.ids
                               if self.formats[acc.tensor] is None and acc.indices]
        self.reductions = set(self.asg.reduction)
        self._memo: Dict[Tuple[str, ...], Optional[OrderMeasure]] = {}


@dataclass(frozen=True)
class OrderMeasure:
    """What :func:`measure` counts for one loop order."""
    dense_pattern: Tuple[int, ...]   # per loop depth: 1 when the loop iterates densely
    transposed: Tuple[Hashable, ...]  # discordant sparse access ids, then "out" (a conversion)
    weighted_transposes: float       # the same, each weighted by its stored entries
    late_filter: int                 # sum over filtering sparse levels of their loop depth
    workspace: int                   # dimensions of the sparse output's workspace
    strided: int                     # dense accesses (and a dense output) not stride-1 innermost

    @property
    def transposes(self) -> int:
        return len(self.transposed)


def measure(order: Sequence[str], p: OrderProblem) -> Optional[OrderMeasure]:
    """The measurement of ``order`` (None: no transpose makes it valid), memoized per problem."""
    key = tuple(order)
    if key in p._memo:
        return p._memo[key]
    rank = {v: n for n, v in enumerate(order)}
    sparse_at: Dict[str, List[int]] = {v: [] for v in order}
    stored_at: Dict[str, List[int]] = {v: [] for v in order}
    transposed, weighted = [], 0
    for acc, i, fmt in p.sparse_accesses:
        lvars, tr = concordant_vars(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))
        if lvars is None:
            p._memo[key] = None
            return None
        if tr:
            transposed.append(i)
            weighted += p.transpose_weights.get(i, 1)
        below_sparse = False
        for kind, v in zip(fmt.levels, lvars):
            if kind.is_sparse:
                sparse_at[v].append(i)
                below_sparse = True
            elif below_sparse and not tr:
                stored_at[v].append(i)
    pattern, late = [], 0
    for v in order:
        its = sparse_at[v]
        # a dense level under a sparse level of the same operand, read in place, walks
        # stored positions (the block of each stored parent), not the dense extent
        # (BigBird's (i, j, b, h) scores: b and h under the compressed j)
        bound = its + stored_at[v]
        dense = not bound or ml.dense_needed(p.f, bound)
        pattern.append(1 if dense else 0)
        if not dense:
            late += rank[v] * len(its)
    ws = 0
    if p.out_sparse:
        first_red = next((n for n, v in enumerate(order) if v in p.reductions), None)
        if first_red is not None:
            ws = sum(1 for v in order[first_red:] if v not in p.reductions)
        if p.out_mode_vars is not None:
            q = [rank[v] for v in p.out_mode_vars]
            if any(a > b for a, b in zip(q, q[1:])):
                transposed.append("out")
                weighted += p.transpose_weights.get("out", 1)
    strided = sum(1 for acc in p.dense_accesses
                  if max(rank[v] for v in acc.indices) != rank[acc.indices[-1]])
    if not p.out_sparse and p.asg.output:
        sparse_ranks = [rank[v] for v in order if sparse_at[v]]
        if max(rank[v] for v in p.asg.output) != rank[p.asg.output[-1]] \
                and not loop_order_layout(order, sparse_ranks, p.asg.output):
            strided += 1
    m = OrderMeasure(tuple(pattern), tuple(transposed), weighted, late, ws, strided)
    p._memo[key] = m
    return m


def separated(above: int, below: int, sparse: Sequence[int], inclusive: bool = False) -> bool:
    """Whether a sparse loop lies between the loops at depths ``above`` < ``below`` (or is
    ``above`` itself, ``inclusive``): below it, a dense array whose layout nests ``below``'s
    variable outside ``above``'s is touched at rows that far apart for every stored entry
    (32 attention heads 256 KB apart: one L1 set, 4 KB aliasing), where laid out in loop
    order they are one block."""
    return above < below and any(above < n < below or (inclusive and n == above) for n in sparse)


def loop_order_layout(order: Sequence[str], sparse_ranks: Sequence[int],
                      out_vars: Sequence[str]) -> Tuple[str, ...]:
    """The loop order of a dense output's variables where the kernel writes it so, else
    ``()`` (dimension order): where a sparse loop (at a depth in ``sparse_ranks``) sits
    between two output variables that the dimension order nests the other way, or is the
    outer one of them (:func:`separated`, inclusive; ``schedule.dense_layout`` says why):
    ``ij,ik->kj`` in loops ``i, j, k`` adds each stored entry's row of ``k`` at the sparse
    ``j``, 32 writes 12 KB apart in dimension order (0.80 -> 0.27 ms at 3000^2, 0.5 %, K =
    32). The cost model prices orders by it: so laid out, the innermost loop writes the
    output at stride 1 whatever its dimension order (``ij,bjk->ikb`` as ``i, b, j, k`` adds
    each stored entry into ``b`` rows of ``k``: 0.1 ms at 2000^2, 1 %, 3 x 16, where ``i,
    k, j, b`` walks each row once per ``k``: 2.2 ms)."""
    rank = {v: n for n, v in enumerate(order)}
    if len(out_vars) < 2 or len(set(out_vars)) != len(out_vars) or any(v not in rank for v in out_vars):
        return ()
    by_loop = tuple(sorted(out_vars, key=rank.get))
    if by_loop == tuple(out_vars):
        return ()
    if any(separated(rank[inner], rank[outer], sparse_ranks, inclusive=True)
           for d, outer in enumerate(out_vars) for inner in out_vars[d + 1:]):
        return by_loop
    return ()


#: the weight of the dense output's re-written block against a re-read operand (restreamed)
OUTPUT_BLOCK_SHARE = 0.1


def restreamed_blocks(order: Sequence[str], p: OrderProblem) -> float:
    """For a dense result: the dense operands, and the output, that the loop order makes
    re-read a matrix per stored entry (GEMV-shaped work no tiling keeps in cache). An
    operand counts when it spans two or more dense loops and is indexed by a sparse loop
    sitting under a loop it does not depend on: every iteration of that outer loop streams
    it again. The MoE forward ``x(b,d) E(n,d,h) G(b,n)`` over a CSR gate, ``b, n, d, h``,
    reads the whole expert ``E[n]`` for every input; read expert-major (``n, b, d, h``, the
    gate transposed) one expert serves all its inputs, and tiling ``h`` above the sparse
    loop (``schedule.CacheTile``) keeps its panel in cache. The output counts when its
    block below a sparse loop spans two dense loops: read and written per entry (the
    expert gradient ``dE(n,d,h)`` over ``n, b, d, h``; over ``n, d, b, h`` a row
    accumulates in registers). Weighed above a transpose: the block is O(block) work per
    stored entry, the transpose O(1). Of sparse results only those over exactly one sparse
    operand's variables (written in its pattern, no workspace: the MoE gate gradient
    ``bn,bh,bd,ndh->bn``) count their operands; the others are left to the workspace and
    transpose terms (0)."""
    m = measure(order, p)
    if m is None:
        return 0
    if p.out_sparse and not any(sorted(acc.indices) == sorted(p.asg.output)
                                for acc, _i, _f in p.sparse_accesses):
        return 0
    sparse = [n for n, dense in enumerate(m.dense_pattern) if not dense]
    dense_vars = {v for v, dense in zip(order, m.dense_pattern) if dense}
    count = 0
    for acc in p.dense_accesses:
        idx = acc.indices
        if len(dense_vars.intersection(idx)) < 2 or acc.tensor in p.small_blocks:
            continue
        if any(order[s] in idx and any(v not in idx for v in order[:s]) for s in sparse):
            count += 1
    if p.out_sparse:
        return count
    # the dense output's block below a sparse loop that does not index it, read and
    # written again by every entry, counts a tenth: it decides between orders of the same
    # operand traffic (over n, d, b, h the expert gradient's row accumulates in
    # registers), never a transpose
    out = set(p.asg.output)
    if any(order[s] not in out and len(dense_vars.intersection(order[s + 1:]) & out) >= 2
           for s in sparse):
        count += OUTPUT_BLOCK_SHARE
    # a dense loop above every level of a sparse operand it does not index walks all of
    # the operand's entries once per iteration, and re-reads every block they touch
    # (``ij,jkl->ikl`` as k, j, i, l over a transposed A: 2.3 -> 5.3 ms at 2000^2, 1 %)
    # Not when that top level is dense and its loop is sparse: another operand's stored
    # entries drive the loop and this operand is only located there (the SAE's forward
    # ``aj,jo->ao``, X CSR over a weight stored input-major: each input row reads only the
    # weight rows its pixels select, the product's own work, with no transpose needed).
    rank = {v: n for n, v in enumerate(order)}
    for acc, _i, fmt in p.sparse_accesses:
        first = min(rank[v] for v in acc.indices)
        if not any(v in dense_vars and v not in acc.indices for v in order[:first]):
            continue
        lvars, _tr = concordant_vars(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))
        if lvars and order[first] not in dense_vars and not fmt.levels[0].is_sparse \
                and lvars[0] == order[first]:
            continue
        count += 1
    return count


def cost_terms(order: Sequence[str], p: OrderProblem) -> Optional[Dict[str, float]]:
    """Unweighted terms of the additive model (None: no transpose makes the order valid):
    ``dense_loops``, ``transpose`` (weighted by stored entries), ``late_filter``,
    ``workspace``, ``strided`` (see :class:`OrderMeasure`)."""
    m = measure(order, p)
    if m is None:
        return None
    return {"dense_loops": sum(m.dense_pattern), "restreamed": restreamed_blocks(order, p),
            "transpose": m.weighted_transposes,
            "late_filter": m.late_filter, "workspace": m.workspace, "strided": m.strided}


def total_cost(terms: Optional[Mapping[str, float]]) -> float:
    """Weighted sum of the cost terms (INFEASIBLE for an invalid order)."""
    if terms is None:
        return INFEASIBLE
    return sum(WEIGHTS[k] * v for k, v in terms.items())


def order_cost(order: Sequence[str], p: OrderProblem) -> tuple:
    """Lexicographic cost of a loop order (smaller is better): dense loops, transposes, sparse
    loops as high as possible (the 0/1 pattern per depth), a workspace needed, strided
    accesses. The exact criterion of the exhaustive oracle."""
    m = measure(order, p)
    if m is None:
        return (INFEASIBLE,)
    return (sum(m.dense_pattern), restreamed_blocks(order, p), m.transposes, m.dense_pattern,
            1 if m.workspace else 0, m.strided)
