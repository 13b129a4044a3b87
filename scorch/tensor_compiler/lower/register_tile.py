"""Register tiling over the loop above the innermost one (unroll-and-jam): ``R`` iterations
of that loop run together and their innermost loops are fused, so every vector the inner
loop loads from memory and does not depend on the outer loop feeds ``R`` independent
accumulator chains (a GEMM micro-kernel's shape: one load, several FMAs).

The MoE forward ``x(b,d) E(n,d,h) G(b,n)`` runs ``n, b, d, h``: for each input ``b``
routed to expert ``n`` a register row accumulates ``x[b,d] * E[n,d,:]`` over ``d``. Jammed
over two inputs, each ``E[n,d,panel]`` vector is loaded once for both rows. The expert
gradient ``dE(n,d,h) = sum_b dy(b,h) x(b,d) G(b,n)`` runs ``n, d, b, h``: jammed over two
``d``, each ``dy[b,:]`` vector feeds two rows of ``dE``.

Valid on the IR alone (strings for expressions): the inner loop's bounds do not depend on
the outer loop's iteration, its body only assigns locals (no stores, no branches), nothing
before it reads the output or anything the statements after it write, and the outer
loop's locals are not read outside it. The statements after the inner loop (stores into
the output, appended entries) run copy by copy, in the original order. Iterations that do
not fill a tile run the original loop.
"""
from __future__ import annotations

import re
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from ..loop_ir import AddTo, AppendEntry, Assign, Call, For, If, LevelCode, Stmt, While

__all__ = ["register_tile", "tile_factor", "has_tile", "MAX_TILE", "stmt_text", "names", "has_loop", "assigned_names"]

#: at most this many iterations per tile (4: the GEMM micro-kernels' row count)
MAX_TILE = 4

_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b")
_LINE_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)\s*\+?=\s*(.*)$")
_VECTOR_LOAD = re.compile(r"\(<\w+\*>\(([^()]*)\)\)\[0\]")


def names(code: str) -> Set[str]:
    return set(_NAME.findall(code))


def _rename(code: str, mapping: Dict[str, str]) -> str:
    return _NAME.sub(lambda m: mapping.get(m.group(1), m.group(1)), code)


def has_loop(stmts: Sequence[Stmt]) -> bool:
    for st in stmts:
        if isinstance(st, (For, While)):
            return True
        if isinstance(st, If) and (has_loop(st.then) or has_loop(st.orelse)):
            return True
    return False


def _assignments(st: Stmt) -> Optional[List[Tuple[str, str]]]:
    """``(target, expression)`` of each local ``st`` assigns; None when it also writes
    memory or does anything else the tile cannot reorder (pre-inner statements)."""
    if isinstance(st, (Assign, AddTo)):
        if not re.fullmatch(r"[A-Za-z_]\w*", st.target):
            return None
        return [(st.target, st.expr + (f" {st.target}" if isinstance(st, AddTo) else ""))]
    if isinstance(st, LevelCode):
        out = []
        for ln in st.lines:
            s = ln.strip()
            if s.startswith(("if ", "while ")) or s == "else:":
                cond = s.split(" ", 1)[1] if " " in s else ""
                out.append(("", cond))          # a condition: read, nothing assigned
                continue
            m = _LINE_ASSIGN.match(ln)
            if not m:
                return None
            out.append((m.group(1), m.group(2) + " " + m.group(1)))
        return out
    return None


def stmt_text(st: Stmt) -> str:
    """Every expression of a statement (for the names it reads)."""
    if isinstance(st, (Assign, AddTo)):
        return f"{st.target} {st.expr}"
    if isinstance(st, Call):
        return st.code
    if isinstance(st, LevelCode):
        return " ".join(st.lines)
    if isinstance(st, AppendEntry):
        return " ".join(st.coords) + f" {st.value} {st.row or ''}"
    if isinstance(st, If):
        return " ".join([st.cond] + [stmt_text(x) for x in st.then + st.orelse])
    if isinstance(st, For):
        return " ".join([st.var, st.lo or "", st.hi] + [stmt_text(x) for x in st.body])
    if isinstance(st, While):
        return " ".join([st.cond] + [stmt_text(x) for x in st.body])
    return "ok ob"       # RowEnd and anything else: the row counters


def _renamed(st: Stmt, m: Dict[str, str]) -> Stmt:
    if isinstance(st, Assign):
        return Assign(_rename(st.target, m), _rename(st.expr, m))
    if isinstance(st, AddTo):
        return AddTo(_rename(st.target, m), _rename(st.expr, m))
    if isinstance(st, Call):
        return Call(_rename(st.code, m))
    if isinstance(st, LevelCode):
        return LevelCode(tuple(_rename(x, m) for x in st.lines))
    if isinstance(st, AppendEntry):
        return AppendEntry(tuple(_rename(c, m) for c in st.coords), _rename(st.value, m),
                           None if st.row is None else _rename(st.row, m), st.local)
    if isinstance(st, If):
        return If(_rename(st.cond, m), tuple(_renamed(x, m) for x in st.then),
                  tuple(_renamed(x, m) for x in st.orelse))
    raise TypeError(f"register_tile: cannot rename {type(st).__name__}")


def _post_ok(stmts: Sequence[Stmt]) -> bool:
    """Statements after the inner loop a tile may repeat copy by copy: stores, adds,
    entries appended to growable buffers, branches over them (no loops, no row counters)."""
    for st in stmts:
        if isinstance(st, If):
            if not _post_ok(st.then) or not _post_ok(st.orelse):
                return False
        elif isinstance(st, AppendEntry):
            if st.local or st.row is not None:
                return False
        elif not isinstance(st, (Assign, AddTo)):
            return False
    return True


def assigned_names(stmts: Sequence[Stmt]) -> Set[str]:
    out: Set[str] = set()
    for st in stmts:
        if isinstance(st, (Assign, AddTo)):
            out |= names(st.target.split("[")[0]) if "[" not in st.target else set()
        elif isinstance(st, LevelCode):
            for ln in st.lines:
                m = _LINE_ASSIGN.match(ln)
                if m:
                    out.add(m.group(1))
        elif isinstance(st, If):
            out |= assigned_names(st.then) | assigned_names(st.orelse)
        elif isinstance(st, (For, While)):
            out |= assigned_names(st.body) | ({st.var} if isinstance(st, For) else set())
    return out


def _region(loop: For, flows: List[Tuple[str, str]], bounds: List[str]) -> bool:
    """Whether ``loop`` is a nest of ``For`` loops that only assign locals; collects the
    assignments (``flows``) and the loops' variables and bounds (``bounds``)."""
    bounds.append(f"{loop.var} {loop.lo or ''} {loop.hi}")
    for st in loop.body:
        if isinstance(st, For):
            if not _region(st, flows, bounds):
                return False
            continue
        if _hint(st):
            flows.append(("", stmt_text(st)))   # read, nothing assigned
            continue
        a = _assignments(st)
        if a is None or isinstance(st, LevelCode):
            return False
        flows += a
    return True


def _hint(st: Stmt) -> bool:
    """A guarded prefetch (``if q < pfe: scorch_prefetch(...)``, ``loops._dot_gather_rows``):
    it writes nothing, so a tile may keep it inside its nest (once where its address is
    shared by the copies, once a copy where it is not)."""
    return (isinstance(st, If) and bool(st.then)
            and all(isinstance(x, Call) for x in st.then + st.orelse))


def _depth(loop: For) -> int:
    return 1 + max((_depth(st) for st in loop.body if isinstance(st, For)), default=0)


class _Tile:
    """One outer loop ``pre + [inner] + post`` found tileable, with its variant locals."""

    def __init__(self, outer: For, pre: List[Stmt], inner: For, post: List[Stmt], variant: Set[str]):
        self.outer, self.pre, self.inner, self.post, self.variant = outer, pre, inner, post, variant


def _analyse(outer: For, elsewhere: str) -> Optional[_Tile]:
    body = list(outer.body)
    loops = [n for n, st in enumerate(body) if isinstance(st, (For, While))]
    if len(loops) != 1 or not isinstance(body[loops[0]], For):
        return None
    k = loops[0]
    pre, inner, post = body[:k], body[k], body[k + 1:]
    if has_loop(pre) or has_loop(post) or not _post_ok(post):
        return None
    flows: List[Tuple[str, str]] = []
    for st in pre:
        a = _assignments(st)
        if a is None:
            return None
        flows += a
    bounds: List[str] = []
    if not _region(inner, flows, bounds):
        return None
    for st in post:
        if isinstance(st, (Assign, AddTo)) and "[" not in st.target:
            flows.append((st.target, st.expr + " " + st.target))
    reads = " ".join(stmt_text(st) for st in pre + [inner])
    if "out_vals" in reads or "out_pos" in reads:
        return None
    variant = {outer.var}
    changed = True
    while changed:
        changed = False
        for target, expr in flows:
            if target and target not in variant and names(expr) & variant:
                variant.add(target)
                changed = True
    if names(" ".join(bounds)) & variant:
        return None      # the inner loops must run the same iterations in every copy
    # what the copies after the first write after the inner loop must not be read before it
    if assigned_names(post) & (names(reads) - {""}):
        return None
    if names(elsewhere) & (variant - {outer.var}):
        return None      # a local of the loop is read after it: the tile would hide its value
    return _Tile(outer, pre, inner, post, variant)


_SCALAR_LOAD = re.compile(r"a\.t\d+_vals\[([^\[\]]*)\]")


def _innermost(loop: For) -> For:
    inside = [st for st in loop.body if isinstance(st, For)]
    return _innermost(inside[0]) if inside else loop


def _shared_loads(t: _Tile) -> int:
    """Loads in the innermost loop whose address does not depend on the outer loop: vector
    loads, or (a run-time-width loop gcc vectorizes) loads indexed by that loop."""
    body = _innermost(t.inner)
    text = " ".join(stmt_text(st) for st in body.body if not isinstance(st, For))
    loads = {a.replace(" ", "") for a in _VECTOR_LOAD.findall(text) if not names(a) & t.variant}
    if not loads:
        streamed = {x for x, e in (_flat_assignments(body)) if body.var in names(e)} | {body.var}
        loads = {a.replace(" ", "") for a in _SCALAR_LOAD.findall(text)
                 if not names(a) & t.variant and names(a) & streamed}
    return len(loads)


def _flat_assignments(loop: For) -> List[Tuple[str, str]]:
    out: List[Tuple[str, str]] = []
    for st in loop.body:
        if not isinstance(st, For):
            out += _assignments(st) or []
    return out


def tile_factor(accumulators: int, shared_loads: int, registers: int) -> int:
    """Iterations per tile: the most (up to :data:`MAX_TILE`) whose accumulators, one
    broadcast per iteration and the shared load in flight fit the vector registers (1: no
    tile). A shared vector is loaded and consumed by the iterations' FMAs before the next
    one (or read as their memory operand), so one register holds them all: counting each
    as a register (sessions 8-10) gave AVX2's 32-float rows 2 iterations where 3 fit, and
    with the rows packed (``pack_rows``) the third paid on a Zen 3 core (expert gradient
    53-72 -> 36-52 ms, forward 47-55 -> 38-51, interleaved, load 5). AVX-512 (32
    registers): 128-float rows of 8 accumulators 3, 64 floats 4; AVX2 (16): 32 floats 3,
    64 floats (8 accumulators) and 128 floats 1."""
    for r in range(MAX_TILE, 1, -1):
        if r * accumulators + min(shared_loads, 1) + r <= registers:
            return r
    return 1


def _jam(t: _Tile, R: int, types: Dict[str, str], need) -> List[Stmt]:
    maps = [{}] + [{v: f"{v}_u{r}" for v in sorted(t.variant)} for r in range(1, R)]
    for m in maps[1:]:
        for v, nv in m.items():
            need(nv, types.get(v, "int64_t"))
    v = t.outer.var

    def copies(stmts: Sequence[Stmt]) -> List[Stmt]:
        out: List[Stmt] = []
        for st in stmts:
            if isinstance(st, For):
                out.append(For(st.var, st.lo, st.hi, tuple(copies(st.body)), st.role))
                continue
            targets = {x for x, _e in (_assignments(st) or [])} - {""}
            if targets & t.variant or (_hint(st) and names(stmt_text(st)) & t.variant):
                out += [_renamed(st, m) if m else st for m in maps]
            else:
                out.append(st)
        return out
    steps = [Assign(f"{v}_u{r}", f"{v} + {r}") for r in range(1, R)]
    jammed = copies([t.inner])[0]
    post: List[Stmt] = []
    for m in maps:
        post += [_renamed(st, m) if m else st for st in t.post]
    tile = While(f"{v} + {R - 1} < {t.outer.hi}",
                 tuple(steps + copies(t.pre) + [jammed] + post + [AddTo(v, str(R))]), "tile")
    start = [] if t.outer.lo == v else [Assign(v, t.outer.lo or "0")]
    rest = For(v, v, t.outer.hi, t.outer.body, t.outer.role)
    return start + [tile, rest]


def register_tile(body: Tuple[Stmt, ...], types: Dict[str, str], need, registers: int,
                  vector_types: FrozenSet[str], min_depth: int = 1) -> Tuple[Stmt, ...]:
    """``body`` with every tileable loop (a ``For`` whose one loop inside is a nest of at
    least ``min_depth`` loops assigning only locals) unrolled and jammed by
    :func:`tile_factor`; ``types``: the locals' C types, ``need``: declares a new local,
    ``vector_types``: the accumulators' types (vectors, or the value type where gcc
    vectorizes a run-time-width loop)."""
    whole = body

    def visit(stmts: Tuple[Stmt, ...]) -> Tuple[Stmt, ...]:
        out: List[Stmt] = []
        for st in stmts:
            if isinstance(st, For) and has_loop(st.body):
                inside = [x for x in st.body if isinstance(x, (For, While))]
                if len(inside) == 1 and isinstance(inside[0], For) and _depth(inside[0]) >= min_depth:
                    elsewhere = _text_outside(whole, st)
                    t = _analyse(st, elsewhere)
                    if t is not None:
                        acc = sum(1 for x in t.variant if types.get(x) in vector_types)
                        R = tile_factor(acc, _shared_loads(t), registers)
                        if R > 1 and _shared_loads(t):
                            out += _jam(t, R, types, need)
                            continue
                out.append(For(st.var, st.lo, st.hi, visit(st.body), st.role))
            elif isinstance(st, While):
                out.append(While(st.cond, visit(st.body), st.role))
            elif isinstance(st, If):
                out.append(If(st.cond, visit(st.then), visit(st.orelse)))
            else:
                out.append(st)
        return tuple(out)
    return visit(body)


def _text_outside(stmts: Sequence[Stmt], skip: Stmt) -> str:
    parts = []
    for st in stmts:
        if st is skip:
            continue
        if isinstance(st, For):
            parts.append(" ".join([st.var, st.lo or "", st.hi, _text_outside(st.body, skip)]))
        elif isinstance(st, While):
            parts.append(st.cond + " " + _text_outside(st.body, skip))
        elif isinstance(st, If):
            parts.append(st.cond + " " + _text_outside(st.then, skip) + " " + _text_outside(st.orelse, skip))
        else:
            parts.append(stmt_text(st))
    return " ".join(parts)


def has_tile(stmts: Sequence[Stmt]) -> bool:
    """Whether :func:`register_tile` jammed a loop among ``stmts`` (a ``While`` of role tile)."""
    for st in stmts:
        if isinstance(st, While) and (st.role == "tile" or has_tile(st.body)):
            return True
        if isinstance(st, For) and has_tile(st.body):
            return True
        if isinstance(st, If) and (has_tile(st.then) or has_tile(st.orelse)):
            return True
    return False
