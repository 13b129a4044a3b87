"""Lowering of the expression and of the output modes: what the leaf stores, and what a
loop does before and after itself when it wraps the output's accumulator or workspace.

Output modes (``OutputPlan.mode``): ``dense`` (add into the dense output, or a scalar
accumulator / register row stored once per element), ``direct`` (append each entry, or
write it into an operand's pattern), ``acc`` (a scalar accumulator per output entry) and
``ws`` (a workspace per fiber: dense arrays with flags, the runtime's dense scratch or
std::map, or a plain std::map; drained in key order into the output).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import merge_lattice as ml
from ..functions import function
from ..index_notation import Access, Add, Apply, Compare, Div, Expr, Mul, Neg, Scalar, Sub, Where
from ..loop_ir import AddTo, AppendEntry, Assign, Call, For, If, RowEnd, Stmt, While
from ..schedule import pattern_suffix
from .facts import UNPREDICTABLE, cvar, reduce_identity, reduce_into
from .nest import Cursor, Nest

__all__ = ["value", "presence", "leaf", "vector_leaf", "before_loop", "after_loop", "row_room",
           "product_split", "product_of"]


def _product_presence(n: Nest, e: Mul, st: Cursor) -> str:
    """Where the product ``e`` may be nonzero at the cursor, as a presence code ("1", "0" or
    a condition): the support of its zero analysis (``merge_lattice.zero_analysis``), so a
    factor that is 0 wherever a sparse access is absent counts as that access's presence
    (``log(A) * (A - A)``: A's, not only factors that are accesses)."""
    z, support = ml.zero_analysis(e, n.facts.ids)
    if z is ml.UNKNOWN or z != 0:
        return "1"
    return ml.to_code(support, lambda i: st.pres[i])


def value(n: Nest, e: Expr, st: Cursor, vec_at: Optional[int] = None,
          in_product: bool = False) -> str:
    """The C expression of ``e`` at the cursor; ``vec_at``: the vector leaf's row offset
    (accesses streamed by the innermost loop are read as vectors from there).

    A product with an absent sparse factor is 0 whatever its other factors hold (the
    merge lattice's meaning, and dense torch's with that entry masked out): ``0 *
    log(0)`` would be NaN, so a product whose sparse factors may be absent is selected
    as a whole (``in_product``: inside such a product already)."""
    f = n.facts
    if isinstance(e, Mul) and not in_product:
        cond = _product_presence(n, e, st)
        if cond == "0":
            return "0"
        if cond != "1" and vec_at is None:
            inner = value(n, e, st, vec_at, True)
            return f"({inner} if {cond} else 0)"
    if isinstance(e, Access):
        i = f.ids[e]
        ap = f.s.accesses[i]
        p = st.pos[i] if ap.sparse else st.off[i]
        code = f"a.t{i}_vals[{p}]"
        if vec_at is not None and not ap.sparse and f.s.loop_order[-1] in ap.indices:
            code = f"(<{f.vector(n.variant.width)[1]}*>(a.t{i}_vals + {p} + {vec_at}))[0]"
        pr = st.pres[i]
        if pr == "0":   # known absent (a merge point past its iterator): nothing is read
            return "0"
        if i in st.vals:   # loaded already (a select, not a branch, where it may be absent)
            return st.vals[i] if pr == "1" else f"({st.vals[i]} if {UNPREDICTABLE}({pr}, 1, 0.5) else 0)"
        return code if pr == "1" else f"({code} if {pr} else 0)"
    if isinstance(e, Scalar):
        return f"(<{f.vt}>{e.value!r})"
    if isinstance(e, Neg):
        return f"(-{value(n, e.a, st, vec_at, in_product)})"
    if isinstance(e, Apply):   # never in a vector leaf (facts: no fixed widths)
        fn = function(e.fn)
        arg, param = value(n, e.a, st, vec_at), f"(<{f.vt}>{fn.param(e.p)!r})"
        # in the value type: sign's C expression is an int, and softsign(sign(x)) would
        # divide integers
        return f"(<{f.vt}>(" + fn.c_expr.format(x=arg, p=param) + "))"
    if isinstance(e, Compare):  # 1 or 0 in the value type (the op layer stores it as bool)
        return f"(<{f.vt}>({value(n, e.a, st, vec_at)} {e.symbol} {value(n, e.b, st, vec_at)}))"
    if isinstance(e, Where):    # never in a vector leaf either
        return (f"({value(n, e.a, st, vec_at)} if {value(n, e.c, st, vec_at)} "
                f"else {value(n, e.b, st, vec_at)})")
    op = {Mul: "*", Add: "+", Sub: "-", Div: "/"}[type(e)]
    inside = in_product and isinstance(e, (Mul, Div))    # a denominator is not a factor
    left, right = value(n, e.a, st, vec_at, inside), value(n, e.b, st, vec_at, inside and isinstance(e, Mul))
    return f"({left} {op} {right})"


def presence(n: Nest, st: Cursor, flags: Optional[Dict[int, str]] = None) -> str:
    """The lattice's presence condition at the cursor as C code (``flags``: presence codes
    to use instead of the cursor's): ``"1"`` where it always holds, also where an enclosing
    merge point guarantees it (``Cursor.some``: the union ``A + B`` holds at every
    coordinate its merge visits), ``"0"`` where it never does."""
    f = n.facts.s.formula
    codes = flags if flags is not None else st.pres
    cond = ml.to_code(f, lambda i: codes[i])
    if cond not in ("0", "1") and any(ml.implied_by_any(f, codes, g) for g in st.some):
        return "1"
    return cond


def _guarded(n: Nest, st: Cursor, stmts: List[Stmt]) -> Tuple[Stmt, ...]:
    """``stmts`` under the lattice's presence condition at the cursor (if it can fail;
    nothing where it cannot hold)."""
    cond = presence(n, st)
    if cond == "0":
        return ()
    return (If(cond, tuple(stmts)),) if cond != "1" else tuple(stmts)


def _row_position(n: Nest) -> str:
    """The output row (the compressed level's parent position) of the current loops."""
    p = ""
    out = n.facts.s.output
    for v in out.level_vars[:n.facts.rows]:
        p = cvar(v) if not p else f"({p}) * a.N_{v} + {cvar(v)}"
    return p


def _append(n: Nest, val: str) -> AppendEntry:
    coords = tuple(cvar(v) for v in n.facts.s.output.level_vars)
    return AppendEntry(coords, val, _row_position(n) if n.facts.rows else None, n.facts.row_room)


def row_room(n: Nest, depth: int, bound: str) -> List[Stmt]:
    """At the loop over the output's last level (rows written straight into the room the
    bound pass made): the bound pass adds the loop's trip-count bound ``bound``; the
    chunk function notes where the row starts."""
    if not (n.facts.row_room and depth == n.facts.rows):
        return []
    if n.variant.bound_only:
        return [AddTo(n.decls.need("ok"), bound)]
    n.decls.need("ok")
    return [Assign(n.decls.need("ob"), "ok")]


def _ws_key(n: Nest) -> str:
    key = ""
    for v in n.facts.s.output.ws_vars:
        key = cvar(v) if not key else f"({key}) * a.N_{v} + {cvar(v)}"
    return key


def _decode_key(n: Nest) -> List[Stmt]:
    """The workspace's variables from ``wkey`` (the inverse of ``_ws_key``)."""
    out: List[Stmt] = []
    for v in reversed(n.facts.s.output.ws_vars):
        out += [Assign(cvar(v), f"wkey % a.N_{v}"), Assign("wkey", f"wkey // a.N_{v}")]
    return out


def pattern_slot(n: Nest, st: Cursor) -> str:
    """A pattern output's value index: the pattern operand's position, then the dense
    levels the output adds under it (``schedule.pattern_suffix``)."""
    slot = st.pos[n.facts.s.output.pattern]
    for v in pattern_suffix(n.facts.s):
        slot = f"({slot}) * a.N_{v} + {cvar(v)}"
    return slot


def leaf(n: Nest, st: Cursor) -> Tuple[Stmt, ...]:
    """The innermost statement: the right-hand side's value added, stored or appended."""
    f, d = n.facts, n.decls
    out = f.s.output
    inner = inner_sum(n)
    if inner is not None:
        body: List[Stmt] = [AddTo("pacc", value(n, inner[1], st))]
        if out.mode == "acc" and out.pattern < 0:
            body.append(Assign("hit", "1"))
        return _guarded(n, st, body)
    val = value(n, f.s.assignment.rhs, st)
    mode = out.mode
    reduce = f.s.assignment.reduce
    pre: List[Stmt] = []
    if reduce != "sum" and mode in ("dense", "acc"):
        # max/min: the value is read twice, so it is computed once into a local
        d.need("rv", f.vt)
        pre, val = [Assign("rv", val)], "rv"

    def into(target: str) -> Stmt:
        return AddTo(target, val) if reduce == "sum" else Assign(target, reduce_into(reduce, target, val))
    if mode == "dense" and out.acc_depth >= 0:
        body: List[Stmt] = pre + [into("acc")]
    elif mode == "dense":
        body = pre + [into(f"a.out_vals[{st.oo}]")]
    elif mode == "direct" and out.pattern >= 0:
        body = [Assign(f"a.out_vals[{pattern_slot(n, st)}]", val)]
    elif mode == "direct":
        body = [_append(n, val)]
    elif mode == "acc" and out.pattern >= 0:
        body = pre + [into("acc")]
    elif mode == "acc" or (mode == "ws" and out.acc_depth >= 0):
        body = pre + [into("acc"), Assign("hit", "1")]
    else:
        body = _workspace_add(n, val)
    return _guarded(n, st, body)


def _workspace_add(n: Nest, val: str) -> List[Stmt]:
    """``val`` added into the workspace at the output coordinates of the current loops."""
    f, d = n.facts, n.decls
    out = f.s.output
    if out.ws_dense:
        d.need("wkey")
        body = [Assign("wkey", _ws_key(n)), Assign("wsv[wkey]", f"wsv[wkey] + {val}"),
                Assign("wsf[wkey]", "1")]
    elif f.rt_ws:
        # the dense workspace lives in locals (values, marks, touched list, range), so
        # the add is a few register operations; the std::map one is the runtime's
        d.need("wkey")
        body = [Assign("wkey", _ws_key(n))]
        # branch-free: whether the coordinate is new is data-dependent (about one add in
        # two on a mesh), a branch on it mispredicts; the touched list is always written
        # and its end advances only for a new coordinate
        if n.variant.ws_map:
            body.append(Call(f"ws.add(wkey, {val})"))
        elif n.variant.ws_scan:
            # no list: the add only marks (no chain from one add's mark test to the next
            # add's list store), and ``wc`` says the fiber is not empty
            body += [Assign("wm[wkey]", "1"), Assign("wv[wkey]", f"wv[wkey] + {val}"), Assign("wc", "1")]
        else:
            d.need("wnew", "int")
            body += [Assign("wnew", "1 - wm[wkey]"), Assign("wm[wkey]", "1"),
                     Assign("wv[wkey]", f"wv[wkey] + {val}"), Assign("wl[wc]", "<int32_t>wkey"),
                     Assign("wc", "wc + wnew")]   # the range: at the drain (touched_range)
    else:
        d.need("wkey")
        d.need("wref", f.vt + "*")
        body = [Assign("wkey", _ws_key(n)), Assign("wref", "&ws[wkey]"),
                Assign("wref[0]", f"wref[0] + {val}")]
    return body


def vector_leaf(n: Nest, st: Cursor) -> Tuple[Stmt, ...]:
    """The innermost (row) loop of a compile-time width as whole vectors: accesses
    streamed by it are vector loads, the others scalars (GCC vector extensions
    broadcast them), one accumulator register per vector of the row (or, for a
    reduction, lane-wise partial sums added horizontally once)."""
    f = n.facts
    lanes, vtype = f.vector(n.variant.width)
    rhs, regs = f.s.assignment.rhs, range(n.variant.width // lanes)
    rhs = _scalars_first(n, rhs)
    if f.scatter:   # the row added into the output, vector by vector
        row = [f"(<{vtype}*>(a.out_vals + {st.oo} + {c * lanes}))[0]" for c in regs]
        return _guarded(n, st, [Assign(r, f"{r} + {value(n, rhs, st, c * lanes)}")
                                for c, r in zip(regs, row)])
    if f.row_depth < 0:   # vector dot product
        terms = " + ".join(value(n, rhs, st, c * lanes) for c in regs)
        if f"<{vtype}*>" not in terms:
            # where only terms the loop does not stream are present (a merge's tail of an
            # operand not indexed by it: ``sum_i (x(j) * A(i, j) + y(j))``), the value is a
            # scalar: broadcast, it is summed over the row's lanes as the loop would
            terms = f"({vtype}_zero() + ({terms}))"
        body: List[Stmt] = [Assign("acc", f"acc + {vtype}_hsum({terms})")]
        if f.s.output.mode in ("acc", "ws") and f.s.output.pattern < 0:
            body.append(Assign("hit", "1"))
        return _guarded(n, st, body)
    held = row_factors(n)
    if held is not None:   # the factors the row's loops do not change: applied at its store
        rhs = _scalars_first(n, held[1])
    return _guarded(n, st, [Assign(f"wv{c}", f"wv{c} + {value(n, rhs, st, c * lanes)}")
                            for c in regs])


def row_factors(n: Nest) -> Optional[Tuple[Expr, Expr]]:
    """``(held, rest)`` when the register row sums a product some of whose factors are
    fixed for the row's whole life (indexed only by loops outside it): ``sum_d g * x(d) *
    E(d, :)`` is ``g * sum_d x(d) * E(d, :)``, so ``g`` multiplies the row once at its store
    instead of every term (the MoE forward's gate ``G[b,n]``: per step one FMA a vector and
    a broadcast from memory, no scalar multiply on the FMA ports; 3 x 4 vector tile in a C
    harness ~1.1-1.4x). None otherwise."""
    f = n.facts
    if (n.variant.width is None or f.row_depth < 0 or f.s.assignment.reduce != "sum"
            or f.vt not in ("float", "double")):
        return None
    split = product_split(n, f.s.assignment.rhs)
    if split is None:
        return None
    outside = set(f.s.loop_order[:f.row_depth])
    held = [x for x in split[0] if isinstance(x, Access) and x.indices and set(x.indices) <= outside]
    if not held:
        return None
    rest = [x for x in split[0] if not any(x is h for h in held)] + split[1]
    return product_of(held), product_of(rest)


def _scalars_first(n: Nest, e: Expr) -> Expr:
    """A product of two or more scalar factors (not streamed by the innermost loop) and
    vectors, regrouped as (scalars) * (vectors): the scalars multiply once per iteration
    and each vector gets one FMA (the MoE forward's ``x[b,d] * G[b,n]`` times
    ``E[n,d,:]``: one FMA a vector instead of two multiplies and an add)."""
    split = product_split(n, e)
    if split is None or len(split[0]) < 2:
        return e
    return Mul(product_of(split[0]), product_of(split[1]))


def product_split(n: Nest, e: Expr) -> Optional[Tuple[List[Expr], List[Expr]]]:
    """A product's factors as (scalars, vectors): those the innermost loop does not index
    and those it does (None: not a product of accesses and constants, or no vector)."""
    factors: List[Expr] = []

    def flat(x: Expr) -> bool:
        if isinstance(x, Mul):
            return flat(x.a) and flat(x.b)
        if isinstance(x, (Access, Scalar)):
            factors.append(x)
            return True
        return False
    L = n.facts.s.loop_order[-1]
    if not flat(e):
        return None
    vec = [x for x in factors if isinstance(x, Access) and L in x.indices]
    sca = [x for x in factors if not (isinstance(x, Access) and L in x.indices)]
    return (sca, vec) if vec else None


def product_of(xs: List[Expr]) -> Expr:
    """The factors multiplied back into one expression, in order."""
    out = xs[0]
    for x in xs[1:]:
        out = Mul(out, x)
    return out


def inner_sum(n: Nest) -> Optional[Tuple[Expr, Expr]]:
    """``(scalars, vectors)`` when the run-time-width kernel sums the innermost loop into
    a partial sum of its own: the scalar accumulator wraps that loop and one above it, and
    the product has factors the innermost loop does not index. ``sum_h s * v(h)`` is then
    ``s * sum_h v(h)``: one FMA a vector instead of a multiply and an FMA (the MoE gate
    gradient's ``G[b,n] * x[b,d]`` over ``dy[b,h] * E[n,d,h]``, summed over ``d, h``;
    gcc hoists the scalars but cannot take them out of the sum)."""
    f = n.facts
    s, out = f.s, f.s.output
    last = len(s.loop_order) - 1
    if (n.variant.width is not None or s.assignment.reduce != "sum" or out.mode not in ("acc", "dense")
            or not 0 <= out.acc_depth < last or f.vt not in ("float", "double")):
        return None
    split = product_split(n, s.assignment.rhs)
    if split is None or not split[0]:
        return None
    return product_of(split[0]), product_of(split[1])


def _row_start(n: Nest, st: Cursor) -> List[Stmt]:
    """A register row starts: its vectors zeroed, or (run-time width, stored once) the
    output row itself zeroed."""
    f, d = n.facts, n.decls
    L = f.s.loop_order[-1]
    cv = d.need(cvar(L))
    if n.variant.width is not None:
        lanes, vtype = f.vector(n.variant.width)
        return [Assign(d.need(f"wv{c}", vtype), f"{vtype}_zero()")
                for c in range(n.variant.width // lanes)]
    if f.store_all:
        return [For(cv, None, f"a.N_{L}", (Assign(f"a.out_vals[{st.oo} + {cv}]", "0"),), "zero")]
    return []


def _row_end(n: Nest, st: Cursor) -> List[Stmt]:
    """A register row ends: its vectors stored (or added) into the output row."""
    f = n.facts
    if n.variant.width is None:
        return []
    out = []
    lanes, vtype = f.vector(n.variant.width)
    held = row_factors(n)
    scale = "" if held is None else f"{value(n, held[0], st)} * "
    for c in range(n.variant.width // lanes):
        p = f"(<{vtype}*>(a.out_vals + {st.oo} + {c * lanes}))[0]"
        out.append(Assign(p, f"{scale}wv{c}" if f.store_all else f"{p} + {scale}wv{c}"))
    return out


def before_loop(n: Nest, depth: int, st: Cursor) -> List[Stmt]:
    """What the loop at ``depth`` starts with when it wraps the output's workspace (a new
    fiber), accumulator or register row."""
    f, d = n.facts, n.decls
    out = f.s.output
    stmts: List[Stmt] = []
    if out.mode == "ws" and depth == out.ws_depth and not out.ws_dense and not f.rt_ws:
        stmts.append(Call("ws.clear()"))
    if out.mode == "ws" and depth == out.ws_depth and f.rt_ws and not n.variant.ws_map:
        # a new fiber: values and marks are already clear (the drain cleared them)
        stmts.append(Assign("wc", "0"))
    if out.mode in ("acc", "dense", "ws") and depth == out.acc_depth:
        d.need("acc", f.vt)
        stmts.append(Assign("acc", reduce_identity(f.s.assignment.reduce, f.vt)))
        if out.mode in ("acc", "ws") and out.pattern < 0:
            d.need("hit", "int")
            stmts.append(Assign("hit", "0"))
    if depth == f.row_depth:
        stmts += _row_start(n, st)
    if depth == len(f.s.loop_order) - 1 and inner_sum(n) is not None:
        stmts.append(Assign(d.need("pacc", f.vt), "0"))
    return stmts


def _drain_call(n: Nest, it: str, crd: str, vals: str) -> Call:
    """Sorted read-out of the workspace: the std::map's, or the local dense one's
    (``workspace.h``: dense_ws_drain)."""
    if n.variant.ws_map:
        return Call(f"ws.drain({crd}, {vals}, 0)")
    if n.facts.s.output.unsorted and n.facts.rows:
        # einsum(..., sorted=False), rows assembly: the fiber in insertion order, no sort
        return Call(f"dense_ws_drain_unsorted[int32_t, {it}, {n.facts.vt}](wl, wc, wv, wm, {crd}, {vals})")
    return Call(f"dense_ws_drain_list[{it}, {n.facts.vt}](wl, wc, wv, wm, {crd}, {vals}, wsp.sort_tmp)")


#: a chunk stops at the row after an output buffer of its call failed to grow
#: (``AppendBuffer.call_failed``: its own, or another chunk's): the call raises MemoryError,
#: and the rest of the product would only be computed into nothing
_STOP_AFTER_FAILURE = If("deref(oval).call_failed()", (Call("return"),))


def _tuple_coords(f) -> str:
    """The C type of the coordinate tuples' buffers (``KernelFacts.crd_buf``:
    ``AppendBuffer[T]``), the type the drain writes into them."""
    return f.crd_buf[len("AppendBuffer["):-1]


def _drain_runtime(n: Nest) -> List[Stmt]:
    """Drain the runtime workspace (sorted, leaves it empty) and append the entries."""
    f, d = n.facts, n.decls
    out = f.s.output
    d.need("wn")
    d.need("wi")
    if len(out.ws_vars) > 1:
        d.need("wkeys", "vector[int64_t]")
        d.need("wvals", f"vector[{f.vt}]")
    if f.rows and n.variant.ws_scan:
        # room for the whole extent, the marks scanned into it, the rest given back
        d.need("wb")
        body = [Assign("wb", "deref(oval).size()"), Call("deref(oval).grow(wsize)"),
                Call("deref(ocrd).grow(wsize)"),
                Assign("wn", f"dense_ws_drain_scan[{f.oit}, {f.vt}](wv, wm, 0, wsize, "
                             "deref(ocrd).data() + wb, deref(oval).data() + wb)"),
                Call("deref(oval).trim(wsize - wn)"), Call("deref(ocrd).trim(wsize - wn)"),
                AddTo(f"a.out_pos[{_row_position(n)} + 1]", "wn"), _STOP_AFTER_FAILURE]
    elif f.rows:
        # straight into room made in the chunk's buffers; the row's count into pos
        d.need("wb")
        body: List[Stmt] = [Assign("wb", "deref(oval).size()"), Call("deref(oval).grow(wn)"),
                            Call("deref(ocrd).grow(wn)"),
                            _drain_call(n, f.oit, "deref(ocrd).data() + wb", "deref(oval).data() + wb"),
                            AddTo(f"a.out_pos[{_row_position(n)} + 1]", "wn"), _STOP_AFTER_FAILURE]
    elif len(out.ws_vars) == 1:
        # the key is the last level's coordinate: drain straight into the output
        # buffers, and repeat the prefix coordinates wn times
        L = len(out.level_vars) - 1
        d.need("wb")
        body = [Assign("wb", "deref(oval).size()"), Call("deref(oval).grow(wn)"),
                Call(f"ocrd[{L}].grow(wn)"),
                _drain_call(n, _tuple_coords(f), f"ocrd[{L}].data() + wb", "deref(oval).data() + wb")]
        body += [For("wi", None, "wn", tuple(Call(f"ocrd[{l}].push_back({cvar(v)})")
                                             for l, v in enumerate(out.level_vars[:L])), "drain"),
                 _STOP_AFTER_FAILURE]
    else:
        body = [Call("wkeys.resize(wn)"), Call("wvals.resize(wn)"),
                _drain_call(n, "int64_t", "wkeys.data()", "wvals.data()"),
                For("wi", None, "wn", tuple([Assign("wkey", "wkeys[wi]")] + _decode_key(n)
                                            + [_append(n, "wvals[wi]")]), "drain")]
    return [Assign("wn", "ws.size()" if n.variant.ws_map else "wc"), If("wn", tuple(body))]


def after_loop(n: Nest, depth: int, st: Cursor) -> List[Stmt]:
    """What the loop at ``depth`` ends with: the register row stored, the workspace
    drained into the output, the accumulator stored or appended."""
    f, d = n.facts, n.decls
    out = f.s.output
    stmts: List[Stmt] = _row_end(n, st) if depth == f.row_depth else []
    inner = inner_sum(n) if depth == len(f.s.loop_order) - 1 else None
    if inner is not None:
        stmts.append(AddTo("acc", f"{value(n, inner[0], st)} * pacc"))
    if f.row_room and depth == f.rows and not n.variant.bound_only:
        stmts.append(RowEnd(_row_position(n)))
    if out.mode == "ws" and depth == out.ws_depth and out.ws_dense:
        d.need("wkey")
        fiber = ([Assign("wkey", "wi")] + _decode_key(n)
                 + [_append(n, "wsv[wi]"), Assign("wsv[wi]", "0"), Assign("wsf[wi]", "0")])
        stmts.append(For("wi", None, "wsize", (If("wsf[wi]", tuple(fiber)),), "drain"))
    elif out.mode == "ws" and depth == out.ws_depth and f.rt_ws:
        stmts += _drain_runtime(n)
    elif out.mode == "ws" and depth == out.ws_depth:
        d.need("wit", f"cmap[int64_t, {f.vt}].iterator")
        fiber = ([Assign("wkey", "deref(wit).first")] + _decode_key(n)
                 + [_append(n, "deref(wit).second"), Call("inc(wit)")])
        stmts += [Assign("wit", "ws.begin()"), While("wit != ws.end()", tuple(fiber), "drain")]
    if out.mode == "acc" and depth == out.acc_depth and out.pattern >= 0:
        # every stored entry of the pattern operand is one output entry (the caller runs
        # this kernel only when the reductions are non-empty)
        stmts.append(Assign(f"a.out_vals[{pattern_slot(n, st)}]", "acc"))
    elif out.mode == "acc" and depth == out.acc_depth:
        stmts.append(If("hit", (_append(n, "acc"),)))
    elif out.mode == "ws" and depth == out.acc_depth:
        stmts.append(If("hit", tuple(_workspace_add(n, "acc"))))
    if out.mode == "dense" and depth == out.acc_depth:
        target = f"a.out_vals[{st.oo}]"
        reduce = f.s.assignment.reduce
        if f.store_all:
            stmts.append(Assign(target, "acc"))
        elif reduce == "sum":
            stmts.append(AddTo(target, "acc"))
        else:
            stmts.append(Assign(target, reduce_into(reduce, target, "acc")))
    return stmts
