"""Lowering of the loop nest: one loop per index variable, its kind decided by the levels
it advances and the merge lattice (``facts.LoopLevels``):

* ``dense``: ``for c in range(N)``; levels that locate compute positions, sparse iterators
  the expression does not need are merged in (a found flag per iterator);
* ``segment``: ``for q in range(pos[p], pos[p+1])`` over one sparse level;
* ``group``: a ``while`` over runs of equal coordinates of a grouped coordinate level;
* ``merge``: TACO's merge lattice points, one loop each (largest first): a ``while`` over
  two or more iterators visiting the smallest current coordinate (selected without
  branches) and entering the body where the formula holds (intersection for products,
  union for sums), each iterator advanced by its found flag; a point of one iterator
  (``rest``) copies the rest of its segment after the others are exhausted. More than
  ``merge_lattice.MAX_POINT_ITERATORS`` iterators: one k-pointer ``while``. A sum of
  products (``A * B + C``) merges each product as one stream of matches instead
  (``_stream_merge``).

Levels over variables already bound (a diagonal, ``ii->i``) are *chased* in the loop body:
located by arithmetic, or searched for in their segment.

Two loops collapse where the rows are not needed one by one: a dense loop nothing below
reads, over one compressed level it positions (``A.sum(0)`` over CSR), is one loop over
that level's positions (``_flattened``); the bound pass of a rows output whose rows'
segments are indexed by the row adds ``pos[chi] - pos[clo]`` per operand
(``_telescoped_room``).
"""
from __future__ import annotations

from itertools import combinations
from typing import List, Sequence, Tuple

from .. import merge_lattice as ml
from ..levels import LevelPlan, group_end, segment_setup
from ..loop_ir import AddTo, Assign, Call, For, If, LevelCode, Stmt, While
from ..target import value_bytes
from .facts import (CACHE_LINE, DOT_ENTRIES, PREFETCH_DISTANCE, SEGMENT_PREFETCH_DISTANCE, UNPREDICTABLE,
                    LoopLevels, chased_segments, cvar, level_entries, dot_entries_type, dot_prefetch_distance,
                    dot_far_prefetch_distance, dot_prefetch_skips_in_l2, DOT_FAR_PREFETCH_MIN_BYTES,
                    dot_row_shared)
from .nest import Cursor, Nest
from .pack_rows import pack_rows
from .register_tile import register_tile
from .output import (after_loop, before_loop, leaf, presence, product_of, product_split, row_room,
                     value, vector_leaf)

__all__ = ["loop_nest"]

_BIG = "9223372036854775807"


def loop_nest(n: Nest, depth: int, st: Cursor) -> Tuple[Stmt, ...]:
    """The statements of the loop at ``depth`` and everything inside it (the leaf below
    the last loop)."""
    if depth == len(n.facts.s.loop_order):
        return leaf(n, st)
    nest = tuple(before_loop(n, depth, st) + _loop(n, n.facts.loops[depth], st)
                 + after_loop(n, depth, st))
    f = n.facts
    if depth == 0 and n.variant.width is not None:
        # unroll-and-jam: the vectors the innermost loop loads feed several register rows
        nest = register_tile(nest, dict(n.decls.items()), n.decls.need, f.target.vector_registers,
                             frozenset({f.vector(n.variant.width)[1]}))
        # a segment re-run per iteration of a loop above it reads its gathered rows packed
        nest = pack_rows(nest, n.decls.need, n.variant.width, f.vt)
    elif depth == 0 and f.dot and not n.variant.bound_only:
        # the run-time-width dot (gcc vectorizes it) when its entries share a matrix
        # block (the MoE gate gradient's E[n] over d, h): several entries per pass
        nest = register_tile(nest, dict(n.decls.items()), n.decls.need, f.target.vector_registers,
                             frozenset({f.vt}), min_depth=2)
    return nest


def _found(n: Nest, lv: LevelPlan, coord: str) -> List[Stmt]:
    """Whether iterator ``lv`` stands at ``coord``; if so, the end of its run."""
    fl = n.decls.need(lv.found, "int")
    return [Assign(fl, f"{lv.q} < {lv.hi} and {lv.crd}[{lv.q}] == {coord}"),
            If(fl, (LevelCode(tuple(group_end(lv, coord))),))]


def _advance_found(its) -> List[Stmt]:
    """After the body: iterators that stood at the coordinate move past its run."""
    return [If(lv.found, (Assign(lv.q, lv.qe),)) for lv in its]


def _chase(n: Nest, lp: LoopLevels, new: Cursor) -> List[Stmt]:
    """Levels whose variable is already bound (a repeated index: a diagonal) locate the
    bound coordinate: dense levels by arithmetic, sparse levels by a search."""
    d = n.decls
    body: List[Stmt] = []
    for lv in lp.chased:
        a, cu = lv.access, cvar(lv.var)
        if lv.locates:
            p = d.need(lv.p)
            body.append(Assign(p, f"{new.pos[a]} * a.N_{lv.var} + {cu}"))
            new.pos[a] = p
            continue
        d.need(lv.q)
        d.need(lv.hi)
        d.need(lv.qe)
        fl = d.need(lv.found, "int")
        parent = lv.segment_parent(new.pos, new.seg)
        body.append(LevelCode(tuple(segment_setup(lv, parent, new.pres[a]))))
        body.append(While(f"{lv.q} < {lv.hi} and {lv.crd}[{lv.q}] < {cu}", (AddTo(lv.q, "1"),),
                          "search"))
        body += [Assign(fl, f"{lv.q} < {lv.hi} and {lv.crd}[{lv.q}] == {cu}"),
                 If(fl, (LevelCode(tuple(group_end(lv, cu))),))]
        new.pres[a] = fl
        _bind(new, lv)
    return body


def _bind(new: Cursor, lv: LevelPlan) -> None:
    """The level's children read from its current entry (or run of entries)."""
    if lv.grouped:
        new.seg[lv.access] = (lv.q, lv.qe)
        new.pos[lv.access] = None
    else:
        new.pos[lv.access] = lv.q


def _bind_children(n: Nest, lp: LoopLevels, st: Cursor, new: Cursor) -> List[Stmt]:
    """Statements at the top of the loop body that give the loops below their positions:
    iterated levels' entries, located levels' positions, dense offsets, chased levels."""
    f, d = n.facts, n.decls
    v, cv, depth = lp.var, cvar(lp.var), lp.depth
    body: List[Stmt] = []
    for lv in lp.iters:
        _bind(new, lv)
    for lv in lp.locs:
        p = d.need(lv.p)
        par = st.pos[lv.access]
        body.append(Assign(p, cv if par == "0" else f"{par} * a.N_{v} + {cv}"))
        new.pos[lv.access] = p
    for ap in f.s.accesses:
        if ap.sparse or v not in ap.indices:
            continue
        o = d.need(f"o{ap.id}_{depth}")
        prev = st.off[ap.id]
        unit = ap.id in f.unit and v == f.s.loop_order[-1] and not n.variant.strided
        step = cv if unit else f"{cv} * a.t{ap.id}_st_{v}"
        body.append(Assign(o, step if prev == "0" else f"{prev} + {step}"))
        new.off[ap.id] = o
    if f.s.output.dense and v in f.s.output.vars:
        o = d.need(f"oo_{depth}")
        step = cv if f.out_unit == v else f"{cv} * a.out_st_{v}"
        body.append(Assign(o, step if st.oo == "0" else f"{st.oo} + {step}"))
        new.oo = o
    return body + _chase(n, lp, new)


def _prefetch(n: Nest, lp: LoopLevels, st: Cursor) -> List[Stmt]:
    """The prefetch variant's row loop asks for its gathers ``PREFETCH_DISTANCE`` stored
    entries ahead (up to the last entry: ``pfe``)."""
    f = n.facts
    if not n.variant.prefetch or lp.depth != len(f.s.loop_order) - 1:
        return []
    lv, v = lp.iters[0], lp.var
    ahead = f"{lv.crd}[{lv.q} + {PREFETCH_DISTANCE}]"
    calls = []
    for i in f.gathers:
        prev = st.off[i]
        step = ahead if i in f.unit else f"{ahead} * a.t{i}_st_{v}"
        calls.append(Call(f"scorch_prefetch(a.t{i}_vals + {step if prev == '0' else f'{prev} + {step}'})"))
    return [If(f"{lv.q} < pfe", tuple(calls))]


def _above_dot(n: Nest, lp: LoopLevels) -> bool:
    """The loop ``lp`` wraps a fixed-width vector dot (the variant's innermost loop)."""
    f = n.facts
    return n.variant.width is not None and f.dot and lp.depth == len(f.s.loop_order) - 2


def _above_vector(n: Nest, lp: LoopLevels) -> bool:
    """The loop ``lp`` wraps a fixed-width variant's vector loop (a dot or a register row)."""
    return (n.variant.width is not None and lp.depth == len(n.facts.s.loop_order) - 2
            and bool(n.facts.row_gathers))


def _dot_gather_rows(n: Nest, lp: LoopLevels, st: Cursor, entry: str) -> List[Stmt]:
    """Prefetches of every cache line of the rows the vector loop will gather for the
    stored entry at position ``entry`` (SDDMM's ``C[crd[entry], :]``, SpMM's ``B[...]``)."""
    f, W = n.facts, n.variant.width
    step = CACHE_LINE // value_bytes(f.vt)
    calls: List[Stmt] = []
    for i in f.row_gathers:
        prev = st.off[i]
        row = f"{lp.iters[0].crd}[{entry}] * a.t{i}_st_{lp.var}"
        base = row if prev == "0" else f"{prev} + {row}"
        calls += [Call(f"scorch_prefetch(a.t{i}_vals + {base}{f' + {c}' if c else ''})")
                  for c in range(0, W, step)]
    return calls


def _dot_prefetch(n: Nest, lp: LoopLevels, lv: LevelPlan, st: Cursor) -> Tuple[List[Stmt], List[Stmt]]:
    """The segment loop above a vector dot (SDDMM's loop over a row's stored ``j``) asks for
    the gathered rows (``C[j, :]``, every cache line of the dot's width) of the entry
    ``_dot_distance`` positions ahead, up to the level's last entry (``pfe``: a row's
    prefetches run into the next rows' entries; 0 where the gathered rows fit in L2). The
    distance and end are loop-invariant: set once in the chunk function's set-up
    (``Nest.setup``), not per row. Returns (before the loop, in its body); nothing outside
    the fixed-width dot variants."""
    f = n.facts
    if not _above_vector(n, lp) or lv.grouped:
        return [], []
    setup, D = _dot_distance(n, lp)
    if D == "0":
        return [], []
    pfe = n.decls.need("pfe")
    end = f"{level_entries(n.facts, lv)} - {D}"
    if f.row_gathers and dot_prefetch_skips_in_l2():
        # rows that all fit in L2 are not prefetched (pfe = 0: no entry is before it)
        fits = " and ".join(f"{b} <= scorch_l2_bytes()" for b in _gathered_bytes(n, lp))
        end = f"0 if ({fits}) else {end}"
    if not any(isinstance(x, Assign) and x.target == pfe for x in n.setup):
        n.setup.extend(setup + [Assign(pfe, end)])
    return [], [If(f"{lv.q} < pfe", tuple(_dot_gather_rows(n, lp, st, f"{lv.q} + {D}")))]


def _dot_distance(n: Nest, lp: LoopLevels) -> Tuple[List[Stmt], str]:
    """How far ahead (in stored entries) the vector dot's gathered rows are prefetched: the
    near distance while they fit in cache, the far one (``pfd``, set by the statements
    returned) where one of them spans ``DOT_FAR_PREFETCH_MIN_BYTES`` ("0": none)."""
    f = n.facts
    near = dot_prefetch_distance(n.variant.width, f.vt)
    far = dot_far_prefetch_distance(n.variant.width, f.vt)
    if far == near or not f.row_gathers:
        return [], str(near)
    span = " or ".join(f"{b} >= {DOT_FAR_PREFETCH_MIN_BYTES}" for b in _gathered_bytes(n, lp))
    pfd = n.decls.need("pfd")
    return [Assign(pfd, f"{far} if ({span}) else {near}")], pfd


def _gathered_bytes(n: Nest, lp: LoopLevels) -> List[str]:
    """The span in bytes of each operand whose rows the vector dot gathers (a C expression
    per operand: rows of the segment loop's variable times their stride)."""
    v, vt = lp.var, n.facts.vt
    return [f"a.N_{v} * a.t{i}_st_{v} * sizeof({vt})" for i in n.facts.row_gathers]


def _segment_prefetch(n: Nest, lp: LoopLevels, lv: LevelPlan) -> Tuple[List[Stmt], List[Stmt]]:
    """The segment loop whose coordinate locates the rows the loop below iterates (SpGEMM's
    ``B[j, :]``, ``facts.chased_segments``) asks for the row of the entry
    ``SEGMENT_PREFETCH_DISTANCE`` positions ahead (its first line of coordinates and, on
    the last level, of values) and for the ``pos`` entry of the one twice as far, up to
    the level's last entry (``pse``). Returns (before the loop, in its body)."""
    rows = chased_segments(n.facts.loops, lp.depth)
    if not rows or n.variant.bound_only:
        return [], []
    D = SEGMENT_PREFETCH_DISTANCE
    pse, sr = n.decls.need("pse"), n.decls.need("psr")
    calls: List[Stmt] = []
    for b in rows:
        calls += [Call(f"scorch_prefetch({b.pos} + {lv.crd}[{lv.q} + {2 * D}])"),
                  Assign(sr, f"{b.pos}[{lv.crd}[{lv.q} + {D}]]"), Call(f"scorch_prefetch({b.crd} + {sr})")]
        if b.k == len(n.facts.s.accesses[b.access].levels) - 1:
            calls.append(Call(f"scorch_prefetch(a.t{b.access}_vals + {sr})"))
    return [Assign(pse, f"{level_entries(n.facts, lv)} - {2 * D}")], [If(f"{lv.q} < {pse}", tuple(calls))]


def _dot_entries(n: Nest, lp: LoopLevels, lv: LevelPlan, st: Cursor, hi: str) -> List[Stmt]:
    """``DOT_ENTRIES`` stored entries per step of the segment loop above a vector dot whose
    results are the segment's stored values (SDDMM, see ``facts.dot_entries_type``): each
    entry's vector products summed lane-wise (``dv0``..), one transposing horizontal sum
    of the four, one vector store; the loop after it finishes the segment entry by entry.
    Empty where that does not apply."""
    f, d = n.facts, n.decls
    W = n.variant.width
    if (not _above_dot(n, lp) or lp.locs or lp.chased or len(lp.iters) != 1
            or lv.access != f.s.output.pattern):
        return []
    lanes, vtype = f.vector(W)
    quad = dot_entries_type(f.s, f.vt, lanes, f.target)
    if quad is None:
        return []
    U, q, D = DOT_ENTRIES, lv.q, _dot_distance(n, lp)[1]
    body: List[Stmt] = []
    if D != "0" and f.row_gathers:
        body.append(If(f"{q} < pfe - {U - 1}", tuple(
            c for u in range(U) for c in _dot_gather_rows(n, lp, st, _ahead(q, D, u)))))
    sums, cursors, offsets = [], [], []
    for u in range(U):
        at = f"{q} + {u}" if u else q
        cu = st.child()
        cu.pos[lv.access] = at
        offsets.append([])
        for ap in f.s.accesses:
            if ap.sparse or lp.var not in ap.indices:
                continue
            o = d.need(f"o{ap.id}_{lp.depth}_{u}")
            row = f"{lv.crd}[{at}] * a.t{ap.id}_st_{lp.var}"
            prev = st.off[ap.id]
            offsets[u].append(Assign(o, row if prev == "0" else f"{prev} + {row}"))
            cu.off[ap.id] = o
        cursors.append(cu)
        sums.append(d.need(f"dv{u}", vtype))
    body += _entry_dots(n, cursors, sums, offsets, W // lanes)
    body += [Assign(f"(<{quad}*>(a.out_vals + {q}))[0]", f"{vtype}_hsum4({', '.join(sums)})"),
             AddTo(q, str(U))]
    return [While(f"{q} + {U - 1} < {hi}", tuple(body), "dot entries")]


def _ahead(q: str, distance: str, u: int) -> str:
    """The position ``distance + u`` entries past ``q`` (distance: a number or a local)."""
    if distance.isdigit():
        return f"{q} + {int(distance) + u}"
    return f"{q} + {distance}" + (f" + {u}" if u else "")


def _entry_dots(n: Nest, cursors: List[Cursor], sums: List[str], offsets: List[List[Stmt]],
                nvec: int) -> List[Stmt]:
    """The vector dots of ``DOT_ENTRIES`` stored entries (one cursor, sum and list of
    row-offset statements each).
    Where the row they share does not stay in registers (``dot_row_shared``) they run
    vector by vector of the row, each shared vector loaded once for all entries, and the
    factors the dot does not stream (``S[i, j]``, ``product_split``) multiply each sum
    once; otherwise (or when the right-hand side is not such a product) one expression an
    entry."""
    f = n.facts
    lanes, vtype = f.vector(n.variant.width)
    rhs = f.s.assignment.rhs
    split = product_split(n, rhs)
    body: List[Stmt] = []
    if split is None or not dot_row_shared(nvec, len(sums), f.target.vector_registers):
        for dv, cu, offs in zip(sums, cursors, offsets):
            body += offs
            body.append(Assign(dv, " + ".join(value(n, rhs, cu, c * lanes) for c in range(nvec))))
        return body
    sca, vec = split
    body = [a for offs in offsets for a in offs]
    for c in range(nvec):
        for dv, cu in zip(sums, cursors):
            term = value(n, product_of(vec), cu, c * lanes)
            body.append(Assign(dv, term if c == 0 else f"{dv} + {term}"))
    if sca:
        body += [Assign(dv, f"{dv} * {value(n, product_of(sca), cu)}") for dv, cu in zip(sums, cursors)]
    return body


def _loop(n: Nest, lp: LoopLevels, st: Cursor) -> List[Stmt]:
    """The loop of one depth (its segment setup, then the loop of its kind)."""
    f, d = n.facts, n.decls
    depth, cv = lp.depth, d.need(cvar(lp.var))
    chunked = depth == 0 and f.chunk_kind is not None
    stmts: List[Stmt] = []
    for lv in lp.iters:
        d.need(lv.q)
        d.need(lv.hi)
        d.need(lv.qe)
        if chunked and f.chunk_kind == "sparse":
            continue     # the chunk's range is the segment
        parent = lv.segment_parent(st.pos, st.seg)
        stmts.append(LevelCode(tuple(segment_setup(lv, parent, st.pres[lv.access]))))
    new = st.child()
    if lp.kind == "dense":
        if n.variant.width is not None and depth == len(f.s.loop_order) - 1:
            return stmts + list(vector_leaf(n, st))
        lo, hi = ("clo", "chi") if chunked else ("0", f"a.N_{lp.var}")
        if n.variant.bound_only and chunked:
            whole = _telescoped_room(n, lp, st)
            if whole is not None:
                return whole
        flat = _flattened(n, lp, st, lo, hi)
        if flat is not None:
            return stmts + flat
        room = row_room(n, depth, f"a.N_{lp.var}")
        if n.variant.bound_only and room:
            return stmts + room
        body: List[Stmt] = []
        for lv in lp.iters:
            body += _found(n, lv, cv)
            new.pres[lv.access] = lv.found
        body += _bind_children(n, lp, st, new)
        body += loop_nest(n, depth + 1, new)
        body += _advance_found(lp.iters)
        return stmts + room + [For(cv, lo, hi, tuple(body), "dense")]
    # iterators known absent here (a merge point above left them behind) drop out
    live = [lv for lv in lp.iters if st.pres[lv.access] != "0"]
    room = row_room(n, depth, _room(n, lp, st, live))
    stmts += room
    if not live or (n.variant.bound_only and room):
        return stmts
    if lp.kind in ("segment", "group"):
        lo, hi = ("clo", "chi") if chunked and lp.kind == "segment" else (live[0].q, live[0].hi)
        return stmts + _single(n, lp, live[0], st, new, lo, hi)
    return stmts + _merge(n, lp, st, live)


def _streams(n: Nest, lp: LoopLevels, st: Cursor, live: List[LevelPlan]):
    """The merge's iterators grouped as a sum of products (``_stream_merge``), or None where
    the loop runs the lattice points of single iterators."""
    if lp.kind != "merge" or any(lv.grouped for lv in live):
        return None
    groups = ml.conjunct_groups(n.facts.s.formula, [lv.access for lv in live],
                                lambda i: st.pres[i] != "0")
    if groups is None or len(groups) > ml.MAX_POINT_ITERATORS:
        return None
    by_id = {lv.access: lv for lv in live}
    return [[by_id[i] for i in g] for g in groups]


def _room(n: Nest, lp: LoopLevels, st: Cursor, live: List[LevelPlan]) -> str:
    """A bound of the loop's trip count: the iterators' segment lengths added up; a sum of
    products adds each product's shortest segment (it has no more matches), so ``A * B + C``
    over three patterns asks for about C's entries, not all three operands' (a room less
    than half used is copied)."""
    streams = _streams(n, lp, st, live)
    if streams is None:
        return " + ".join(f"({lv.hi} - {lv.q})" for lv in live) or "0"
    return " + ".join(f"({s[0].hi} - {s[0].q})" if len(s) == 1 else
                      "min(" + ", ".join(f"{lv.hi} - {lv.q}" for lv in s) + ")" for s in streams)


def _telescoped_room(n: Nest, lp: LoopLevels, st: Cursor):
    """The bound pass of a chunk of rows at once, where each row's room is the sum of its
    segments' lengths and every segment's parent position is the row itself (``A + B``
    over CSR): the lengths telescope to ``pos[chi] - pos[clo]`` per operand, so the pass
    reads two entries per operand instead of walking the row pointers. None where the
    rows' segments are not indexed by the row (the general per-row pass then)."""
    f = n.facts
    if f.rows != 1 or lp.iters or lp.chased or len(f.loops) < 2:
        return None
    row = {lv.access for lv in lp.locs if st.pos[lv.access] == "0" and not lv.from_range}
    nl = f.loops[1]
    if nl.kind == "dense" or nl.chased or not nl.iters:
        return None
    for lv in nl.iters:
        if not lv.has_pos or lv.from_range or lv.access not in row or st.pres[lv.access] != "1":
            return None
    if _streams(n, nl, st, nl.iters) is not None:
        return None      # a product's bound is a per-row minimum (``_room``)
    ok = n.decls.need("ok")
    return [AddTo(ok, " + ".join(f"(<int64_t>{lv.pos}[chi] - {lv.pos}[clo])" for lv in nl.iters))]


def _flattened(n: Nest, lp: LoopLevels, st: Cursor, lo: str, hi: str):
    """A dense loop nothing below reads, over one compressed level positioned by it
    (``A.sum(0)`` over CSR: ``for i: for q in pos[i]..pos[i+1]``): one loop over the
    positions ``pos[lo] .. pos[hi]``, with no per-row exit to mispredict. None where the
    loop's variable is read (an output or another operand indexes it, the output keeps
    per-row state) or its child is not a plain segment of that one level."""
    f = n.facts
    d, v, out = lp.depth, lp.var, f.s.output
    if (lp.iters or lp.chased or len(lp.locs) != 1 or d + 1 >= len(f.loops) or n.variant.prefetch
            or n.variant.width is not None or out.mode != "dense" or v in out.vars
            or out.acc_depth in (d, d + 1) or f.row_depth in (d, d + 1) or f.rows):
        return None
    loc, nl = lp.locs[0], f.loops[d + 1]
    if (st.pos[loc.access] != "0" or st.pres[loc.access] != "1" or nl.kind != "segment"
            or nl.locs or nl.chased or len(nl.iters) != 1):
        return None
    lv = nl.iters[0]
    if lv.access != loc.access or not lv.has_pos or lv.grouped or lv.from_range:
        return None
    if any(v in ap.indices and (ap.id != loc.access or ap.indices.count(v) > 1) for ap in f.s.accesses):
        return None
    for x in (cvar(nl.var), lv.q, lv.hi, lv.qe):
        n.decls.need(x)
    mid = st.child()
    mid.pos[loc.access] = None     # no row position: the loop below runs over all of them
    return ([Assign(lv.q, f"{lv.pos}[{lo}]"), Assign(lv.hi, f"{lv.pos}[{hi}]")]
            + _single(n, nl, lv, mid, mid.child(), lv.q, lv.hi))


def _single(n: Nest, lp: LoopLevels, lv: LevelPlan, st: Cursor, new: Cursor, lo: str, hi: str,
            role: str = "") -> List[Stmt]:
    """The loop over one sparse level's entries ``lo .. hi`` (a segment), or over its runs
    of equal coordinates (a grouped level); ``role``: ``"rest"`` for a merge point's last
    iterator."""
    cv = cvar(lp.var)
    new.pres[lv.access] = "1"
    body: List[Stmt] = [Assign(cv, f"{lv.crd}[{lv.q}]")]
    if not lv.grouped:
        setup: List[Stmt] = []
        if not role:
            body += _prefetch(n, lp, st)
            setup, ahead = _dot_prefetch(n, lp, lv, st)
            body += ahead
            first, ahead = _segment_prefetch(n, lp, lv)
            setup, body = first + setup, body + ahead
            steps = _dot_entries(n, lp, lv, st, hi)
            if steps:     # the steps of DOT_ENTRIES, then the rest from where they stopped
                setup += ([] if lo == lv.q else [Assign(lv.q, lo)]) + steps
                lo = lv.q
        body += _bind_children(n, lp, st, new)
        body += _hoisted_value(n, lp, lv, new)
        body += loop_nest(n, lp.depth + 1, new)
        return setup + [For(lv.q, lo, hi, tuple(body), role or "segment")]
    body.append(LevelCode(tuple(group_end(lv, cv))))
    body += _bind_children(n, lp, st, new)
    body += loop_nest(n, lp.depth + 1, new)
    body.append(Assign(lv.q, lv.qe))
    return [While(f"{lv.q} < {hi}", tuple(body), role or "group")]


def _merge(n: Nest, lp: LoopLevels, st: Cursor, live: List[LevelPlan]) -> List[Stmt]:
    """The merge of several sparse iterators as TACO's lattice points
    (``merge_lattice.lattice_points``): one loop per point, largest first, each running
    while all its iterators are unexhausted and knowing the others exhausted; a point of
    one iterator copies the rest of its segment without comparisons. More than
    ``MAX_POINT_ITERATORS`` iterators: one k-pointer loop."""
    f = n.facts
    ids = [lv.access for lv in live]
    streams = _streams(n, lp, st, live)
    if streams is not None:
        return _stream_merge(n, lp, st, live, streams)
    if len(live) > ml.MAX_POINT_ITERATORS:
        return [_kpointer(n, lp, st, st.child())]
    points = ml.lattice_points(f.s.formula, ids, lambda i: st.pres[i] != "0")
    out: List[Stmt] = []
    for S in points:
        new = st.child()
        for lv in live:
            if lv.access not in S:
                new.pres[lv.access] = "0"
        sub = [lv for lv in live if lv.access in S]
        if len(sub) == 1:
            out += _single(n, lp, sub[0], st, new, sub[0].q, sub[0].hi, "rest")
        else:
            out.append(_point(n, lp, st, new, sub))
    return out


def _point(n: Nest, lp: LoopLevels, st: Cursor, new: Cursor, sub: List[LevelPlan]) -> While:
    """One merge point of two or more iterators: the smallest coordinate selected without
    branches, each iterator's found flag, the body where the formula holds, and each
    iterator advanced by its flag."""
    f, d = n.facts, n.decls
    cv = cvar(lp.var)
    body: List[Stmt] = []
    # each iterator's coordinate (and, at an access's last level, its value: always
    # readable here) in a local; the smallest coordinate by conditional moves (a branch on
    # it mispredicts wherever the operands interleave)
    for lv in sub:
        j = d.need("j" + lv.q[1:])
        body.append(Assign(j, f"{lv.crd}[{lv.q}]"))
        if not lv.grouped:
            body += _head_value(n, lv, new)
    body += _smallest(cv, ["j" + lv.q[1:] for lv in sub])
    # the iterators the formula needs at this point (the others outside it are absent)
    absent = {lv.access: False for lv in lp.iters if new.pres[lv.access] == "0"}
    nec = set(ml.necessary(ml.substitute(f.s.formula, absent), [lv.access for lv in sub]))
    for lv in sub:
        fl = d.need(lv.found, "int")
        body.append(Assign(fl, f"{'j' + lv.q[1:]} == {cv}"))
        if lv.grouped:
            body.append(If(fl, (LevelCode(tuple(group_end(lv, cv))),)))
        new.pres[lv.access] = fl
    # at least one iterator stands at the coordinate; the body runs where the formula holds
    new.some = st.some + (tuple(lv.found for lv in sub),)
    it_ids = {lv.access for lv in lp.iters}
    guard = presence(n, new, {i: (c if i in it_ids else "1") for i, c in new.pres.items()})
    for lv in sub:    # inside the guard, the iterators the formula needs are present
        if lv.access in nec:
            new.pres[lv.access] = "1"
    body += _bind_children(n, lp, st, new)
    inner = loop_nest(n, lp.depth + 1, new)
    if guard != "0":
        body += [If(guard, inner)] if guard != "1" else list(inner)
    for lv in sub:
        body.append(If(lv.found, (Assign(lv.q, lv.qe),)) if lv.grouped else AddTo(lv.q, lv.found))
    return While(" and ".join(f"{lv.q} < {lv.hi}" for lv in sub), tuple(body), "merge")


def _hoisted_value(n: Nest, lp: LoopLevels, lv: LevelPlan, new: Cursor) -> List[Stmt]:
    """A segment loop with loops below it reads its entry's value once, into a local, where
    a scalar kernel stores inside those loops (a scatter into a dense row or workspace):
    gcc cannot keep ``a.tK_vals[q]`` in a register across a store through another float
    pointer, so it reloads it every inner iteration (the SAE encoder's ``aj,oj->ao``: 10 %
    of the kernel; the fixed-width scatter likewise). Register-row and dot kernels keep the
    array read, which their passes match."""
    f = n.facts
    if ((n.variant.width is not None and not f.scatter) or f.dot
            or lp.depth >= len(f.s.loop_order) - 1 or lv.access in new.vals):
        return []
    return _head_value(n, lv, new)


def _head_value(n: Nest, lv: LevelPlan, new: Cursor) -> List[Stmt]:
    """At an access's last level, its value at the iterator's position in a local (always
    readable in a merge point), which the body reads (``new.vals``)."""
    f = n.facts
    if lv.k != len(f.s.accesses[lv.access].levels) - 1:
        return []
    x = n.decls.need("x" + lv.q[1:], f.vt)
    new.vals[lv.access] = x
    return [Assign(x, f"a.t{lv.access}_vals[{lv.q}]")]


def _smallest(cv: str, heads: Sequence[str]) -> List[Stmt]:
    """The smallest of a merge point's head coordinates into ``cv``, by conditional moves
    (a branch on it mispredicts wherever the operands interleave)."""
    return [Assign(cv, heads[0])] + [Assign(cv, f"{j} if {UNPREDICTABLE}({j} < {cv}, 1, 0.5) else {cv}")
                                     for j in heads[1:]]


def _stream_merge(n: Nest, lp: LoopLevels, st: Cursor, live: List[LevelPlan],
                  streams: List[List[LevelPlan]]) -> List[Stmt]:
    """A sum of products (``A * B + C``: ``merge_lattice.conjunct_groups``) as the eager
    form runs it, in one loop nest: each product's iterators are one *stream*, their
    intersection (moved from match to match by ``_seek``), and the streams are merged as a
    union, one lattice point per subset of streams (largest first). Cheaper than the
    lattice points over the single iterators: a product's operands never enter the union's
    comparisons apart, and the points are fewer (3 instead of 5 for ``A * B + C``)."""
    out: List[Stmt] = [_seek(n, s) for s in streams if len(s) > 1]
    for size in range(len(streams), 0, -1):
        for T in combinations(streams, size):
            new = st.child()
            inside = {lv.access for s in T for lv in s}
            for lv in live:
                if lv.access not in inside:
                    new.pres[lv.access] = "0"
            if size > 1:
                out.append(_stream_point(n, lp, st, new, list(T)))
            elif len(T[0]) > 1:
                out.append(_matches(n, lp, st, new, T[0]))
            else:
                lv = T[0][0]
                out += _single(n, lp, lv, st, new, lv.q, lv.hi, "rest")
    return out


def _alive(s: Sequence[LevelPlan]) -> str:
    return " and ".join(f"{lv.q} < {lv.hi}" for lv in s)


def _seek(n: Nest, s: List[LevelPlan]) -> While:
    """Move a product's iterators to their next common coordinate (or until one is
    exhausted): the iterators behind the largest current coordinate step forward."""
    j = [f"{lv.crd}[{lv.q}]" for lv in s]
    differ = " or ".join(f"{j[0]} != {x}" for x in j[1:])
    if len(s) == 2:
        body: Tuple[Stmt, ...] = (If(f"{j[0]} < {j[1]}", (AddTo(s[0].q, "1"),),
                                     (AddTo(s[1].q, "1"),)),)
    else:
        mx = n.decls.need("m" + s[0].q[1:])
        body = ((Assign(mx, j[0]),)
                + tuple(Assign(mx, f"{x} if {x} > {mx} else {mx}") for x in j[1:])
                + tuple(AddTo(lv.q, f"{x} < {mx}") for lv, x in zip(s, j)))
    return While(f"{_alive(s)} and ({differ})", body, "search")


def _step(n: Nest, s: List[LevelPlan]) -> Tuple[Stmt, ...]:
    """Past the stream's current coordinate: every iterator one entry on, then to the
    product's next match."""
    return tuple(AddTo(lv.q, "1") for lv in s) + ((_seek(n, s),) if len(s) > 1 else ())


def _matches(n: Nest, lp: LoopLevels, st: Cursor, new: Cursor, s: List[LevelPlan]) -> While:
    """A product's stream alone (the other streams exhausted): its matches, in order."""
    for lv in s:
        new.pres[lv.access] = "1"
    body: List[Stmt] = [Assign(cvar(lp.var), f"{s[0].crd}[{s[0].q}]")]
    body += _bind_children(n, lp, st, new)
    body += loop_nest(n, lp.depth + 1, new)
    body += _step(n, s)
    return While(_alive(s), tuple(body), "merge")


def _stream_point(n: Nest, lp: LoopLevels, st: Cursor, new: Cursor,
                  T: List[List[LevelPlan]]) -> While:
    """A merge point of several streams (each at a match, or a single iterator's entry):
    the smallest coordinate as in ``_point``, one found flag per stream (its iterators'
    presence), the body where the formula holds, each found stream stepped on."""
    d = n.decls
    cv = cvar(lp.var)
    body: List[Stmt] = []
    heads = []
    for s in T:
        j = d.need("j" + s[0].q[1:])
        heads.append(j)
        body.append(Assign(j, f"{s[0].crd}[{s[0].q}]"))
        for lv in s:
            body += _head_value(n, lv, new)
    body += _smallest(cv, heads)
    for s, j in zip(T, heads):
        fl = d.need(s[0].found, "int")
        body.append(Assign(fl, f"{j} == {cv}"))
        for lv in s:
            new.pres[lv.access] = fl
    new.some = st.some + (tuple(s[0].found for s in T),)
    it_ids = {lv.access for lv in lp.iters}
    guard = presence(n, new, {i: (c if i in it_ids else "1") for i, c in new.pres.items()})
    body += _bind_children(n, lp, st, new)
    inner = loop_nest(n, lp.depth + 1, new)
    if guard != "0":
        body += [If(guard, inner)] if guard != "1" else list(inner)
    for s in T:
        body.append(AddTo(s[0].q, s[0].found) if len(s) == 1 else If(s[0].found, _step(n, s)))
    return While(" and ".join(_alive(s) for s in T), tuple(body), "merge")


def _kpointer(n: Nest, lp: LoopLevels, st: Cursor, new: Cursor) -> While:
    """The k-pointer merge of several sparse iterators in one loop (the merge lattice at
    run time)."""
    f = n.facts
    cv, its = cvar(lp.var), lp.iters
    it_ids = [lv.access for lv in its]
    cond = ml.loop_condition(f.s.formula, it_ids, lambda i: next(
        f"{l.q} < {l.hi}" for l in its if l.access == i))
    body: List[Stmt] = [Assign(cv, _BIG)]
    body += [If(f"{lv.q} < {lv.hi} and {lv.crd}[{lv.q}] < {cv}", (Assign(cv, f"{lv.crd}[{lv.q}]"),))
             for lv in its]
    for lv in its:
        body += _found(n, lv, cv)
        new.pres[lv.access] = "1" if lv.access in lp.necessary else lv.found
    guard = ml.to_code(f.s.formula, lambda i: next((l.found for l in its if l.access == i), "1"))
    body += _bind_children(n, lp, st, new)
    inner = loop_nest(n, lp.depth + 1, new)
    body += [If(guard, inner)] if guard != "1" else list(inner)
    body += _advance_found(its)
    return While(cond, tuple(body), "merge")
