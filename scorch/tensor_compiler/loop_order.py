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
   net cost (``cost_model.cost_terms``, additive, ``WEIGHTS``) of moving it there; a move with
   a negative net cost is applied. Every considered move is recorded (:class:`Move`).
3. :func:`remove_mode_order_cycles`: the graph of ordering constraints (an edge between
   consecutive level variables of each sparse operand, and of a requested output format);
   the operands to transpose (whose edges are dropped) so that no cycle remains and the
   order agrees with the rest are chosen by least cost (transposes weigh stored entries
   when known), each candidate priced on its updated, re-refined loop order
   (:class:`CycleRemoval`).
4. :func:`choose_by_estimate`: with the operands' statistics (``OrderProblem.stats``), the
   candidate orders of steps 2-3 that do the same asymptotic work are priced by
   ``work_estimate.estimate`` (entry visits, transposes, the parallel outer loop's reach
   given the heaviest row), and one clearly cheaper (by :data:`ESTIMATE_MARGIN`) than the
   additive model's choice replaces it; every priced candidate is kept for ``explain``.
5. Workspace insertion is done by ``schedule.schedule`` on the resulting order.

``cost_model.order_cost`` (the same measurement, lexicographic) with :func:`exhaustive_order`
(every permutation) is the exact optimum the tests hold the greedy result against.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Set, Tuple

from . import merge_lattice as ml
from .cost_model import (INFEASIBLE, WEIGHTS, OrderProblem, cost_terms,
                         measure, order_cost, total_cost)
from .work_estimate import Estimate, estimate

__all__ = ["Move", "CycleRemoval", "PricedOrder", "LoopOrder", "NoValidOrder", "sparsity_levels",
           "sort_by_sparsity", "greedy_moves", "mode_order_constraints", "find_cycles",
           "remove_mode_order_cycles", "choose_by_estimate", "algorithm1", "exhaustive_order",
           "output_major_order", "reductions_inside",
           "ESTIMATE_MARGIN", "ESTIMATE_TIE"]

#: an order the statistics price at most this fraction of the additive model's choice
#: replaces it (estimates are rough: a near tie keeps the structural choice)
ESTIMATE_MARGIN = 0.8
#: estimates this close (relative) to the lowest tie: the lowest additive cost wins
ESTIMATE_TIE = 0.05

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
    net: float                        # int without statistics (transposes weigh 1 each)
    deltas: Tuple[Tuple[str, float], ...]
    applied: bool
    order: Tuple[str, ...]            # the candidate order

    def __str__(self) -> str:
        d = ", ".join(f"{k} {v:+g}" for k, v in self.deltas if v)
        return (f"move {self.var} {self.src}->{self.dst} [{','.join(self.order)}]: net {self.net:+g}"
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


@dataclass(frozen=True)
class PricedOrder:
    """A candidate order priced with the operands' statistics (:func:`choose_by_estimate`):
    its additive cost and its estimate."""
    order: Tuple[str, ...]
    cost: float
    estimate: Estimate
    chosen: bool = False

    def __str__(self) -> str:
        return (f"[{','.join(self.order)}] additive {self.cost:g}, estimate {self.estimate}"
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
    estimates: List[PricedOrder] = None   # candidates priced by statistics (chosen first)


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


# ------------------------------------------------------------------------ step 4
def choose_by_estimate(p: OrderProblem, order: Sequence[str], candidates: Sequence[Sequence[str]],
                       threads: int) -> Tuple[List[str], List[PricedOrder]]:
    """Among ``order`` (the additive model's choice) and ``candidates``, the order the
    statistics price lowest, if it does the same asymptotic work (no more dense loops)
    and costs at most :data:`ESTIMATE_MARGIN` of ``order``'s estimate; else ``order``.
    Returns the order and every priced candidate (the chosen one first). Without
    statistics: ``order`` and nothing priced."""
    base = estimate(order, p, threads)
    if base is None:
        return list(order), []
    dense = sum(measure(order, p).dense_pattern)
    priced: Dict[Tuple[str, ...], PricedOrder] = {}
    for o in [order, *candidates]:
        key = tuple(o)
        if key in priced:
            continue
        m = measure(o, p)
        if m is None or sum(m.dense_pattern) > dense:
            continue
        e = estimate(o, p, threads)
        priced[key] = PricedOrder(key, total_cost(cost_terms(o, p)), e)
    low = min(c.estimate.total for c in priced.values())
    # near ties (ESTIMATE_TIE) go to the additive model: the estimate counts visits, not
    # where the operands stream from (``ij,bjk->ikb`` over CSC read as CSR: ``b, i, j, k``
    # re-reads A per batch, ``i, b, j, k`` once, 0.3 % apart in visits; the additive
    # model's ``restreamed`` tells them apart)
    best = min((c for c in priced.values() if c.estimate.total <= low * (1 + ESTIMATE_TIE)),
               key=lambda c: (c.cost, c.estimate.total))
    pick = best.order if best.estimate.total <= ESTIMATE_MARGIN * base.total else tuple(order)
    out = [PricedOrder(pick, priced[pick].cost, priced[pick].estimate, True)]
    out += sorted((c for k, c in priced.items() if k != pick), key=lambda c: c.estimate.total)
    return list(pick), out


# ------------------------------------------------------------------------ Algorithm 1
def output_major_order(p: OrderProblem) -> Optional[List[str]]:
    """Algorithm 1's greedy order with every sparse operand read output-major (its output
    variables first, in the output's order): a candidate for the estimate, which prices the
    transposes it takes. Algorithm 1 keeps an operand's own mode order unless a cycle forces
    a transpose, so it never proposes, for CSC ``A`` times a batch ``ij,bjk->bik``, the rows
    of ``A`` accumulated in registers (``i, b, j, k`` over ``A`` as CSR) against scattering
    them in CSC's ``j, i, b, k``. None when every operand already is output-major (or is
    blocked, or read twice)."""
    out_rank = {v: n for n, v in enumerate(p.asg.output)}
    formats = list(p.formats)
    seen, changed = set(), False
    for acc, _i, fmt in p.sparse_accesses:
        if acc.tensor in seen or p.fixed_tail.get(acc.tensor) or fmt.block is not None:
            return None
        seen.add(acc.tensor)
        dims = tuple(sorted(fmt.mode_order, key=lambda d: (acc.indices[d] not in out_rank,
                                                           out_rank.get(acc.indices[d], 0),
                                                           fmt.mode_order.index(d))))
        if dims != tuple(fmt.mode_order):
            formats[acc.tensor] = fmt.transposed_copy(dims)
            changed = True
    if not changed:
        return None
    q = OrderProblem(p.asg, p.ids, formats, p.f, p.out_sparse, p.out_mode_vars, p.fixed_tail,
                     small_blocks=p.small_blocks)
    sorted_vars, _sp = sort_by_sparsity(q)
    order, _moves = greedy_moves(_stable_topological(sorted_vars, _mandatory_edges(q)), sorted_vars,
                                 q, record=False)
    return order


def reductions_inside(order: Optional[Sequence[str]], p: OrderProblem) -> List[List[str]]:
    """Candidates for the estimate with the reductions of ``order`` (in its order) just
    above one of its output loops, innermost, the other output loops above them as
    ``order`` nests them: the result's row along the innermost loop is then summed in
    registers over every reduction and written once (the estimate's ``updates``).
    Algorithm 1's greedy moves leave a reduction above other output loops where the
    additive terms tie (CSC ``A`` read as CSR times a batch, ``ij,bjk->bik``: ``i, j, b,
    k`` adds each entry into ``b`` rows in memory, ``i, b, j, k`` sums ``k`` in a
    register), and the output-major order nests the output's loops in its dimension order
    (``->ikb``: ``i, k, j, b``, where ``i, b, j, k`` writes the result in loop order,
    stride 1). The outer output loops keep their order: a sparse result's format follows
    the loop order (Algorithm 4), and ``b, i, j, k`` would make it ``dcd``."""
    if not order:
        return []
    outs = [v for v in order if v not in p.reductions]
    reds = [v for v in order if v in p.reductions]
    if not reds or not outs:
        return []
    out = []
    for inner in outs:
        o = [v for v in outs if v != inner] + reds + [inner]
        if o != list(order):
            out.append(o)
    return out


def algorithm1(p: OrderProblem, threads: int = 1) -> LoopOrder:
    """Loop order by Algorithm 1: sort by sparsity, greedy cost moves, removal of mode-order
    cycles by the cheapest transposes. Raises :class:`NoValidOrder` when no order fits the
    blocked operands."""
    sorted_vars, sp = sort_by_sparsity(p)
    init = _stable_topological(sorted_vars, _mandatory_edges(p))
    order, moves = greedy_moves(init, sorted_vars, p)
    greedy = list(order)
    order, cycles, removals = remove_mode_order_cycles(p, order, sorted_vars)
    candidates = [greedy, init] + [c.order for c in removals]
    if p.stats:
        om = output_major_order(p)
        candidates += ([om] if om is not None else []) + reductions_inside(om or order, p)
    order, priced = choose_by_estimate(p, order, candidates, threads)
    terms = cost_terms(order, p)
    if terms is None:
        raise NoValidOrder("no loop order is concordant with the blocked operands")
    transposed: List[Hashable] = list(measure(order, p).transposed)
    return LoopOrder(order, sorted_vars, sp, moves, cycles, removals, transposed, terms, priced)


def exhaustive_order(p: OrderProblem) -> List[str]:
    """Every permutation ranked by :func:`order_cost` (ties: canonical variable order); the
    oracle for the greedy result (factorial time: tests only)."""
    def cost(o):
        return order_cost(o, p) + (tuple(p.base.index(v) for v in o),)
    best = min((list(q) for q in itertools.permutations(p.base)), key=cost)
    if cost(best)[0] >= INFEASIBLE:
        raise NoValidOrder("no loop order is concordant with the blocked operands")
    return best
