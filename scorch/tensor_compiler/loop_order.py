"""Loop ordering: the paper's Algorithm 1 (section 4.1), step by step.

Every sparse access must be iterated in its mode order (a level is reachable only through
its parent), so a loop order is *concordant* with an access when the access's variables
appear in it in mode order; a discordant sparse operand is transposed (re-formatted into a
concordant mode order). Dense strided operands and dense outputs accept any order.

1. :func:`sort_by_sparsity`: index variables by descending sparsity level, the number of
   sparse levels intersected at the variable (a *filter*: two or more accesses bind it and
   the merge lattice needs no dense loop there). Ties: fewer forced transposes, output
   variables before reductions, first appearance. The sorted list is the initial order.
2. :func:`greedy_moves`: for each variable in sorted order and each other position, the
   net cost (:func:`cost_terms`, additive, :data:`WEIGHTS`) of moving it there; a move with
   a negative net cost is applied. Every considered move is recorded (:class:`Move`).
3. :func:`remove_mode_order_cycles`: the graph of ordering constraints (an edge between
   consecutive level variables of each sparse operand, and of a requested output format);
   the operands to transpose (whose edges are dropped) so that no cycle remains and the
   order agrees with the rest are chosen by least cost (transposes weigh stored entries
   when known), each candidate priced on its updated, re-refined loop order
   (:class:`CycleRemoval`).
4. Workspace insertion is done by ``schedule.schedule`` on the resulting order.

:func:`order_cost` (lexicographic) with :func:`exhaustive_order` (every permutation) is the
exact optimum the tests hold the greedy result against.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Set, Tuple

from ..formats import Format
from . import merge_lattice as ml
from .index_notation import Access, Assignment

__all__ = ["WEIGHTS", "Move", "CycleRemoval", "LoopOrder", "OrderProblem", "NoValidOrder",
           "sparsity_levels", "sort_by_sparsity", "greedy_moves", "mode_order_constraints",
           "find_cycles", "remove_mode_order_cycles", "cost_terms", "total_cost", "algorithm1",
           "order_cost", "exhaustive_order", "concordant_dims", "concordant_vars"]

#: Weights of the additive cost model. ``dense_loops`` is the asymptotic term (the nest
#: does about ``N ** dense_loops * s ** sparse_loops`` work) and dominates; a transpose
#: costs a pass over the operand, more than any cache effect; the three small terms only
#: break ties between orders of the same asymptotic work and the same transposes (their
#: sum stays below one transpose for any expression of up to ~8 variables).
WEIGHTS: Dict[str, int] = {
    "dense_loops": 1000,   # per loop that must iterate densely (no sparse level filters it)
    "transpose": 100,      # per sparse operand re-formatted, plus a final output conversion
    "late_filter": 4,      # per sparse filter level, per loop depth it sits at
    "workspace": 2,        # per dimension of the sparse output's workspace (2-D: 4, none: 0)
    "strided": 1,          # per dense access (or dense output) not stride-1 innermost
}
INFEASIBLE = 10 ** 9


class NoValidOrder(Exception):
    """No loop order is concordant with every access, even after transposes (only possible
    with fixed block-inner levels)."""


@dataclass(frozen=True)
class Move:
    """One considered greedy move: ``var`` from position ``src`` to ``dst``; ``net`` is the
    weighted cost difference (negative: applied), ``deltas`` the weighted change per term."""
    var: str
    src: int
    dst: int
    net: int
    deltas: Tuple[Tuple[str, int], ...]
    applied: bool
    order: Tuple[str, ...]            # the candidate order

    def __str__(self) -> str:
        d = ", ".join(f"{k} {v:+d}" for k, v in self.deltas if v)
        return (f"move {self.var} {self.src}->{self.dst} [{','.join(self.order)}]: net {self.net:+d}"
                f"{' (' + d + ')' if d else ''} {'applied' if self.applied else 'rejected'}")


@dataclass(frozen=True)
class CycleRemoval:
    """One candidate of the mode-order step: transposing ``transposed`` (dropping their
    edges, ``dropped``; ``drop_cost``: their stored-entry weights) leaves the constraint
    graph acyclic; ``order`` is the best order found under it, ``cost`` its total cost."""
    transposed: Tuple[Hashable, ...]
    dropped: Tuple[Tuple[str, str], ...]
    drop_cost: float
    order: Tuple[str, ...]
    cost: float
    chosen: bool = False

    def __str__(self) -> str:
        what = ", ".join(map(str, self.transposed)) or "nothing"
        return (f"transpose {what} (drop {', '.join(f'{u}->{v}' for u, v in self.dropped) or '-'}; "
                f"weight {self.drop_cost:g}): [{','.join(self.order)}] cost {self.cost:g}"
                f"{' chosen' if self.chosen else ''}")


@dataclass
class LoopOrder:
    """Result of :func:`algorithm1`."""
    order: List[str]
    sparsity_order: List[str]
    sparsity: Dict[str, int]
    moves: List[Move]
    cycles: List[Tuple[str, ...]]     # cycles of the mode-order constraint graph
    cycle_removals: List[CycleRemoval]
    transposed: List[Hashable]        # access ids (and "out") read in a new mode order
    terms: Dict[str, float]           # unweighted cost terms of ``order``


# ------------------------------------------------------------------------ concordance
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


# ------------------------------------------------------------------------ the problem
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
        self._memo: Dict[Tuple[str, ...], Optional[Dict[str, float]]] = {}


def cost_terms(order: Sequence[str], p: OrderProblem) -> Optional[Dict[str, float]]:
    """Unweighted cost terms of a loop order (None: no transpose makes it valid).

    ``dense_loops``: loops that iterate densely (no sparse level, or the lattice needs every
    coordinate); ``transpose``: discordant sparse operands plus a final output conversion;
    ``late_filter``: sum over filtering sparse levels of their loop depth; ``workspace``:
    dimensions of the sparse output's workspace (output variables below the first
    reduction loop, when that sits above an output loop); ``strided``: dense accesses whose
    last dimension is not their innermost loop."""
    key = tuple(order)
    if key in p._memo:
        return p._memo[key]
    rank = {v: n for n, v in enumerate(order)}
    sparse_at: Dict[str, List[int]] = {v: [] for v in order}
    transposes = 0
    for acc, i, fmt in p.sparse_accesses:
        lvars, tr = concordant_vars(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))
        if lvars is None:
            p._memo[key] = None
            return None
        if tr:
            transposes += p.transpose_weights.get(i, 1)
        for kind, v in zip(fmt.levels, lvars):
            if kind.is_sparse:
                sparse_at[v].append(i)
    dense_loops = late = 0
    for v in order:
        its = sparse_at[v]
        if not its or ml.dense_needed(p.f, its):
            dense_loops += 1
        else:
            late += rank[v] * len(its)
    ws = 0
    if p.out_sparse:
        first_red = next((n for n, v in enumerate(order) if v in p.reductions), None)
        if first_red is not None:
            ws = sum(1 for v in order[first_red:] if v not in p.reductions)
        if p.out_mode_vars is not None:
            q = [rank[v] for v in p.out_mode_vars]
            if any(a > b for a, b in zip(q, q[1:])):
                transposes += p.transpose_weights.get("out", 1)
    strided = 0
    for acc in p.dense_accesses:
        if max(rank[v] for v in acc.indices) != rank[acc.indices[-1]]:
            strided += 1
    if not p.out_sparse and p.asg.output:
        if max(rank[v] for v in p.asg.output) != rank[p.asg.output[-1]]:
            strided += 1
    terms = {"dense_loops": dense_loops, "transpose": transposes, "late_filter": late,
             "workspace": ws, "strided": strided}
    p._memo[key] = terms
    return terms


def total_cost(terms: Optional[Mapping[str, float]]) -> float:
    """Weighted sum of the cost terms (INFEASIBLE for an invalid order)."""
    if terms is None:
        return INFEASIBLE
    return sum(WEIGHTS[k] * v for k, v in terms.items())


# ------------------------------------------------------------------------ step 1
def sparsity_levels(p: OrderProblem) -> Dict[str, int]:
    """Sparsity level per variable: the number of sparse levels (in each operand's own
    format) intersected at it, 0 when fewer than two accesses bind it (nothing to filter)
    or when the merge lattice must visit every coordinate anyway (a union with a dense
    term)."""
    binders: Dict[str, Set[int]] = {v: set() for v in p.base}
    sparse: Dict[str, List[int]] = {v: [] for v in p.base}
    for acc, i in p.ids.items():
        fmt = p.formats[acc.tensor]
        for d, v in enumerate(acc.indices):
            binders[v].add(i)
            if fmt is not None and fmt.kind_of_dim(d).is_sparse and i not in sparse[v]:
                sparse[v].append(i)
    out = {}
    for v in p.base:
        its = sparse[v]
        out[v] = len(its) if (its and len(binders[v]) > 1 and not ml.dense_needed(p.f, its)) else 0
    return out


def sort_by_sparsity(p: OrderProblem) -> Tuple[List[str], Dict[str, int]]:
    """SORTBYSPARSITY: variables by descending sparsity level; ties go to the variable whose
    placement next forces fewer transposes (operands with a level variable that would come
    after a deeper level's), then to output variables before reductions, then to first
    appearance. Returns the order and the sparsity levels."""
    sp = sparsity_levels(p)
    rank = {v: n for n, v in enumerate(p.base)}
    rest = sorted(p.base, key=lambda v: (-sp[v], rank[v]))
    chains = [tuple(acc.indices[d] for d in fmt.mode_order) for acc, _i, fmt in p.sparse_accesses]
    if p.out_sparse and p.out_mode_vars is not None:
        chains.append(tuple(p.out_mode_vars))
    placed: List[str] = []

    def forced(prefix: Set[str]) -> int:
        # an operand is discordant whatever comes next once a placed variable has an
        # unplaced variable above it in the operand's mode order
        n = 0
        for ch in chains:
            seen_unplaced = False
            for v in ch:
                if v not in prefix:
                    seen_unplaced = True
                elif seen_unplaced:
                    n += 1
                    break
        return n
    while rest:
        top = sp[rest[0]]
        cands = [v for v in rest if sp[v] == top]
        if len(cands) == 1:
            pick = cands[0]
        else:
            done = set(placed)
            pick = min(cands, key=lambda v: (forced(done | {v}), rank[v]))
        placed.append(pick)
        rest.remove(pick)
    return placed, sp


def _mandatory_edges(p: OrderProblem) -> List[Tuple[str, str]]:
    """Constraints no transpose lifts: a blocked operand's block-inner levels come after all
    its grid levels, in their own order."""
    edges = []
    for acc, _i, fmt in p.sparse_accesses:
        t = p.fixed_tail.get(acc.tensor, 0)
        if not t:
            continue
        lv = [acc.indices[d] for d in fmt.mode_order]
        head, tail = lv[:-t], lv[-t:]
        edges += [(u, tail[0]) for u in head if u != tail[0]]
        edges += [(a, b) for a, b in zip(tail, tail[1:]) if a != b]
    return edges


def _stable_topological(order: Sequence[str], edges: Sequence[Tuple[str, str]]) -> List[str]:
    """UPDATELOOPORDER: the order closest to ``order`` (stable) satisfying ``edges``."""
    if not edges:
        return list(order)
    preds: Dict[str, Set[str]] = {v: set() for v in order}
    for u, v in edges:
        preds[v].add(u)
    out: List[str] = []
    rest = list(order)
    while rest:
        nxt = next((v for v in rest if preds[v] <= set(out)), None)
        if nxt is None:
            raise NoValidOrder("the blocked operands' fixed levels form a cycle")
        out.append(nxt)
        rest.remove(nxt)
    return out


# ------------------------------------------------------------------------ step 2
def greedy_moves(order: Sequence[str], sorted_vars: Sequence[str], p: OrderProblem,
                 record: bool = True, keep: Sequence[Tuple[str, str]] = ()
                 ) -> Tuple[List[str], List[Move]]:
    """The greedy loop of Algorithm 1: for each variable in ``sorted_vars`` and each other
    position, the net cost of moving it there; a move with a negative net cost is applied
    at once. The paper tries the positions after the current one; every position is tried
    here, so a variable with no intersection (the root of a lone sparse operand) can also
    move up. Passes repeat until one applies no move. ``keep``: edges ``(u, v)`` every
    order must respect (``u`` above ``v``). Returns the final order and the considered
    moves (``record``)."""
    order = list(order)
    cur = cost_terms(order, p)
    moves: List[Move] = []
    n = len(order)
    for _pass in range(max(n, 1)):
        changed = False
        for v in sorted_vars:
            for pos in range(n):
                src = order.index(v)
                if pos == src:
                    continue
                cand = order[:src] + order[src + 1:]
                cand.insert(pos, v)
                if keep and not _respects(cand, keep):
                    continue
                t = cost_terms(cand, p)
                if t is None:
                    if record:
                        moves.append(Move(v, src, pos, INFEASIBLE, (), False, tuple(cand)))
                    continue
                if cur is None:
                    deltas = tuple((k, WEIGHTS[k] * t[k]) for k in WEIGHTS)
                    net = total_cost(t) - INFEASIBLE
                else:
                    deltas = tuple((k, WEIGHTS[k] * (t[k] - cur[k])) for k in WEIGHTS)
                    net = sum(d for _k, d in deltas)
                applied = net < 0
                if record:
                    moves.append(Move(v, src, pos, net, deltas, applied, tuple(cand)))
                if applied:
                    order, cur, changed = cand, t, True
        if not changed:
            break
    return order, moves


def _respects(order: Sequence[str], edges: Sequence[Tuple[str, str]]) -> bool:
    rank = {v: n for n, v in enumerate(order)}
    return all(rank[u] < rank[v] for u, v in edges)


# ------------------------------------------------------------------------ step 3
def mode_order_constraints(p: OrderProblem) -> Dict[Hashable, Tuple[str, ...]]:
    """Each sparse operand's level variables in mode order (the levels a transpose may
    re-order), keyed by access id; ``"out"`` for a requested sparse output format."""
    cons: Dict[Hashable, Tuple[str, ...]] = {}
    for acc, i, fmt in p.sparse_accesses:
        t = p.fixed_tail.get(acc.tensor, 0)
        lv = tuple(acc.indices[d] for d in fmt.mode_order)
        cons[i] = lv[:len(lv) - t] if t else lv
    if p.out_sparse and p.out_mode_vars is not None:
        cons["out"] = tuple(p.out_mode_vars)
    return cons


def _edges(constraints: Mapping[Hashable, Sequence[str]], skip=()) -> List[Tuple[str, str]]:
    return [(u, v) for o, lv in constraints.items() if o not in skip
            for u, v in zip(lv, lv[1:]) if u != v]


def find_cycles(nodes: Sequence[str], edges: Sequence[Tuple[str, str]]) -> List[Tuple[str, ...]]:
    """The elementary cycles of a small directed graph (each once, from its first node in
    ``nodes`` order); what CONTAINSCYCLES looks at."""
    succ: Dict[str, List[str]] = {v: [] for v in nodes}
    for u, v in edges:
        if v not in succ[u]:
            succ[u].append(v)
    pos = {v: n for n, v in enumerate(nodes)}
    out: List[Tuple[str, ...]] = []
    for s in nodes:
        stack = [(s, [s])]
        while stack:
            u, path = stack.pop()
            for w in succ[u]:
                if w == s:
                    out.append(tuple(path))
                elif pos[w] > pos[s] and w not in path:
                    stack.append((w, path + [w]))
    return out


def remove_mode_order_cycles(p: OrderProblem, order: Sequence[str], sorted_vars: Sequence[str],
                             constraints: Optional[Mapping[Hashable, Sequence[str]]] = None,
                             ) -> Tuple[List[str], List[Tuple[str, ...]], List[CycleRemoval]]:
    """Mode-order cycles (Algorithm 1, lines 11-18). The graph has an edge between
    consecutive level variables of each sparse operand (and of a requested output format);
    a cycle, or an edge the loop order contradicts, means some operand must be transposed
    (its edges dropped). The cheapest removal is chosen among every set ``S`` of operands
    whose dropping leaves the graph acyclic: UPDATELOOPORDER makes the greedy order (also
    the sparsity order and the greedy order reversed, as starting points) agree with the
    remaining edges (stable topological sort), greedy moves that keep them refine it, and
    ``S`` costs the total cost of that order (transposes weigh the operands' stored
    entries when known, ``p.transpose_weights``). The greedy order itself wins ties.
    Returns the order, the cycles and the priced candidates (the chosen one marked)."""
    cons = dict(constraints if constraints is not None else mode_order_constraints(p))
    fixed = _mandatory_edges(p)
    owners = list(cons)
    cycles = find_cycles(list(order), _edges(cons) + fixed)
    cands: List[CycleRemoval] = []
    bases = [list(order), list(sorted_vars), list(reversed(order))]
    limit = len(owners) if len(owners) <= 6 else 2      # keep the search small
    for r in range(limit + 1):
        for S in itertools.combinations(owners, r):
            kept = _edges(cons, S) + fixed
            seen, here = set(), None
            for b in bases:
                try:
                    seed = _stable_topological(b, kept)
                except NoValidOrder:        # the remaining edges still have a cycle
                    break
                if tuple(seed) in seen:
                    continue
                seen.add(tuple(seed))
                o2, _ = greedy_moves(seed, sorted_vars, p, record=False, keep=kept)
                c2 = total_cost(cost_terms(o2, p))
                if here is None or c2 < here[1]:
                    here = (o2, c2)
            if here is None:
                continue
            dropped = tuple(_edges({o: cons[o] for o in S}))
            cands.append(CycleRemoval(S, dropped, sum(p.transpose_weights.get(o, 1) for o in S),
                                      tuple(here[0]), here[1]))
    best = min(range(len(cands)), key=lambda n: (cands[n].cost, cands[n].drop_cost, n),
               default=None)
    greedy_cost = total_cost(cost_terms(order, p))
    if best is None or greedy_cost <= cands[best].cost:
        final = list(order)
        best = next((n for n, c in enumerate(cands) if list(c.order) == final), None)
    else:
        final = list(cands[best].order)
    if best is not None:
        c = cands[best]
        cands[best] = CycleRemoval(c.transposed, c.dropped, c.drop_cost, c.order, c.cost, True)
    return final, cycles, cands


# ------------------------------------------------------------------------ Algorithm 1
def algorithm1(p: OrderProblem) -> LoopOrder:
    """Loop order by Algorithm 1: sort by sparsity, greedy cost moves, removal of mode-order
    cycles by the cheapest transposes. Raises :class:`NoValidOrder` when no order fits the
    blocked operands."""
    sorted_vars, sp = sort_by_sparsity(p)
    init = _stable_topological(sorted_vars, _mandatory_edges(p))
    order, moves = greedy_moves(init, sorted_vars, p)
    order, cycles, removals = remove_mode_order_cycles(p, order, sorted_vars)
    terms = cost_terms(order, p)
    if terms is None:
        raise NoValidOrder("no loop order is concordant with the blocked operands")
    transposed: List[Hashable] = []
    for acc, i, fmt in p.sparse_accesses:
        if concordant_dims(acc.indices, fmt, order, p.fixed_tail.get(acc.tensor, 0))[1]:
            transposed.append(i)
    if p.out_sparse and p.out_mode_vars is not None:
        rank = {v: n for n, v in enumerate(order)}
        q = [rank[v] for v in p.out_mode_vars]
        if any(a > b for a, b in zip(q, q[1:])):
            transposed.append("out")
    return LoopOrder(order, sorted_vars, sp, moves, cycles, removals, transposed, terms)


# ------------------------------------------------------------------------ the oracle
def order_cost(order: Sequence[str], asg: Assignment, ids: Dict[Access, int],
               formats: Sequence[Optional[Format]], f, out_sparse: bool,
               out_mode_vars: Optional[Tuple[str, ...]], fixed_tail=None) -> tuple:
    """Lexicographic cost tuple of a loop order (smaller is better): dense loops,
    transposes, sparse loops as high as possible (0/1 pattern per depth), workspace
    needed, strided accesses. The exact criterion :func:`exhaustive_order` minimizes."""
    fixed_tail = fixed_tail or {}
    sparse_at: Dict[str, List[int]] = {v: [] for v in order}
    transposes = 0
    for acc, i in ids.items():
        fmt = formats[acc.tensor]
        if fmt is None:
            continue
        lvars, tr = concordant_vars(acc.indices, fmt, order, fixed_tail.get(acc.tensor, 0))
        if lvars is None:
            return (INFEASIBLE,)
        transposes += tr
        for kind, v in zip(fmt.levels, lvars):
            if kind.is_sparse:
                sparse_at[v].append(i)
    pattern = []
    for v in order:
        its = sparse_at[v]
        dense = (not its) or ml.dense_needed(f, its)
        pattern.append(1 if dense else 0)
    ws = 0
    red = set(asg.reduction)
    rank = {v: n for n, v in enumerate(order)}
    if out_sparse:
        seen_red = False
        for v in order:
            if v in red:
                seen_red = True
            elif seen_red:
                ws = 1
                break
        if out_mode_vars is not None:
            q = [rank[v] for v in out_mode_vars]
            transposes += any(a > b for a, b in zip(q, q[1:]))
    contig = 0
    for acc in ids:
        if formats[acc.tensor] is None and acc.indices:
            last = acc.indices[-1]
            if max(rank[v] for v in acc.indices) != rank[last]:
                contig += 1
    if not out_sparse and asg.output:
        if max(rank[v] for v in asg.output) != rank[asg.output[-1]]:
            contig += 1
    return (sum(pattern), transposes, tuple(pattern), ws, contig)


def exhaustive_order(p: OrderProblem) -> List[str]:
    """Every permutation ranked by :func:`order_cost` (ties: canonical variable order); the
    oracle for the greedy result (factorial time: tests only)."""
    def cost(o):
        return order_cost(o, p.asg, p.ids, p.formats, p.f, p.out_sparse, p.out_mode_vars,
                          p.fixed_tail) + (tuple(p.base.index(v) for v in o),)
    best = min((list(q) for q in itertools.permutations(p.base)), key=cost)
    if cost(best)[0] >= INFEASIBLE:
        raise NoValidOrder("no loop order is concordant with the blocked operands")
    return best
