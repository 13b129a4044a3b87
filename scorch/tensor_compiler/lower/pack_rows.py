"""Rows a fixed-width kernel re-reads at a stride, copied once into one contiguous buffer
(a GEMM's packed panel). Rows 2 KB apart (hidden 512 floats) map a narrow panel of each
onto the same few L1 sets, so every pass reloads them from L2; packed, a pass reads one
buffer in order. Two forms:

* *A segment's gathered rows*: a loop re-runs the same sparse segment for each of its
  iterations and the segment reads a dense row per stored entry. The MoE expert gradient
  ``dE(n,d,h) = sum_b dy(b,h) x(b,d) G(b,n)`` runs ``n, d, b, h``: for each of the 784
  rows ``d`` the segment of expert ``n`` (~256 inputs) reads ``dy[b, panel]``; the
  segment's panel is copied before the ``d`` loop. Hand-written harness, Zen 3, 1 thread,
  under load: 61-66 -> 35-38 ms (blocking the segment so its rows stay in L1, without the
  copy, gained nothing).
* *A block's panel*: a sparse loop runs a dense loop per entry that reads one row of a
  block at ``base + c * stride`` (``base`` set outside the sparse loop). The MoE forward
  ``n, b, d, h`` reads ``E[n, d, panel]`` for every input of expert ``n``; the panel is
  copied before the sparse loop where the rows are not contiguous already (a run-time
  test of the stride): harness 53-55 -> 39-42 ms.

A copy costs one read of the rows, against one read per iteration of the loop that re-reads
them. Where every term that reads a gathered row also multiplies it by the sparse operand's
value at the same position (the expert gradient's ``G(b,n)``, fixed for the row's whole
life in the tile), the copy scales the row by it instead (``_segment_factor``): the tile then
multiplies one value per term, not two, which took a scalar multiply and a register
broadcast per term off the FMA ports. The factor is folded only where the copy runs; a
segment too large to copy runs the loop as written. On the IR: the segment is set up by ``q = pos[p]``, ``h = pos[p + 1]`` from names set
outside the loop, its body has no loops, and the packed access ``a.tK_vals`` is read only
at the row offset (``o = c * a.tK_st_v`` of the coordinate ``c = crd[q]``, or
``o = base + c_d * a.tK_st_v``). Consecutive loops over one segment or block (a register
tile and its rest) share one copy.
"""
from __future__ import annotations

import ast
import re
from typing import Callable, List, Optional, Sequence, Tuple

from ..loop_ir import AddTo, Assign, Call, For, If, LevelCode, Stmt, While
from ..target import value_bytes
from .register_tile import assigned_names, has_loop, names, stmt_text

__all__ = ["pack_rows", "PACK_MAX_BYTES"]

#: rows are copied only up to this many bytes a copy (one buffer per thread): past it the
#: kernel reads them where they are, as before (memory stays bounded on huge segments)
PACK_MAX_BYTES = 4 << 20

_LINE = re.compile(r"^([A-Za-z_]\w*) = (.+)$")
_OFFSET = re.compile(r"^([A-Za-z_]\w*) \* (a\.t(\d+)_st_\w+)$")
_CRD = re.compile(r"^(a\.t\d+_crd\d+)\[([A-Za-z_]\w*)\]$")


class _Pack:
    """What one segment loop gathers: the setup lines, the segment loop's variable and end,
    the coordinate array, the gathered access's field and row stride, its offset local."""

    def __init__(self, setup: Tuple[str, ...], q: str, crd: str, vals: str, stride: str, off: str,
                 factor: Optional[str] = None):
        self.setup, self.q, self.crd, self.vals, self.stride, self.off = setup, q, crd, vals, stride, off
        self.factor = factor     # the value folded into the copy (``_segment_factor``), or None

    def key(self):
        return (self.setup, self.crd, self.vals, self.stride, self.factor)


def _prefetch_of(st: Stmt, vals: str) -> bool:
    """A guarded prefetch of the gathered rows (``loops._dot_gather_rows``): reads nothing
    once the rows are packed."""
    return (isinstance(st, If) and bool(st.then) and not st.orelse
            and all(isinstance(x, Call) and x.code.startswith("scorch_prefetch(") and vals in x.code
                    for x in st.then))


def _find(loop) -> Optional[_Pack]:
    """The segment ``loop`` re-runs per iteration and the rows it gathers, if packable."""
    body = list(loop.body)
    segs = [k for k, st in enumerate(body) if isinstance(st, (For, While))]
    if len(segs) != 1 or not isinstance(body[segs[0]], For) or body[segs[0]].role != "segment":
        return None
    seg = body[segs[0]]
    setups = [st for st in body[:segs[0]] if isinstance(st, LevelCode)]
    if len(setups) != 1:
        return None
    lines = setups[0].lines
    ms = [_LINE.match(ln) for ln in lines]
    if len(lines) != 2 or not all(ms) or [m.group(1) for m in ms] != [seg.var, seg.hi] or seg.lo != seg.var:
        return None
    # the segment's bounds come from outside the loop: the same segment every iteration
    inside = assigned_names(body) | ({loop.var} if isinstance(loop, For) else set())
    if names(" ".join(m.group(2) for m in ms)) & inside:
        return None
    if has_loop(seg.body):
        return None
    coord = crd = None
    found: List[Tuple[str, str, str]] = []
    for st in seg.body:
        if isinstance(st, Assign):
            m = _CRD.match(st.expr)
            if m and m.group(2) == seg.var and coord is None:
                coord, crd = st.target, m.group(1)
                continue
            m = _OFFSET.match(st.expr)
            if m and coord is not None and m.group(1) == coord:
                found.append((st.target, f"a.t{m.group(3)}_vals", m.group(2)))
    text = " ".join(stmt_text(st) for st in seg.body if not _prefetch_of(st, "a.t"))
    for off, vals, stride in found:
        uses = len(re.findall(re.escape(vals) + r"\b", text))
        if uses and uses == len(re.findall(re.escape(vals) + r" \+ " + off + r"\b", text)) \
                and sum(1 for st in seg.body if isinstance(st, Assign) and st.target == off) == 1:
            return _Pack(tuple(lines), seg.var, crd, vals, stride, off,
                         _segment_factor(seg, f"{vals} + {off}"))
    return None


_CAST = re.compile(r"<[A-Za-z_][\w ]*\**>")


def _terms(node: ast.AST) -> Optional[List[List[ast.AST]]]:
    """``node`` as a sum of products (each a list of factors), through calls that are
    linear (a vector's horizontal sum); None where it is not one."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _terms(node.left), _terms(node.right)
        return None if left is None or right is None else left + right
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("_hsum")
            and len(node.args) == 1 and not node.keywords):
        return _terms(node.args[0])
    return [_factors(node)]


def _factors(node: ast.AST) -> List[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _linear_in(expr: str, factor: str, row: str) -> bool:
    """Whether ``expr`` is a sum of products in which every product that holds the gathered
    ``row`` or the ``factor`` holds each exactly once, as a factor of its own."""
    try:
        tree = ast.parse(_CAST.sub("", expr), mode="eval").body
    except SyntaxError:
        return False
    terms = _terms(tree)
    if terms is None:
        return False
    factor, row = factor.replace(" ", ""), row.replace(" ", "")
    for term in terms:
        texts = [ast.unparse(f).replace(" ", "") for f in term]
        n_factor = sum(t == factor for t in texts)
        n_row = sum(row in t for t in texts)
        inside = any(t != factor and factor in t for t in texts)
        rows_nested = any(row in t and not isinstance(f, ast.Subscript) for f, t in zip(term, texts))
        if inside or rows_nested or (n_factor, n_row) not in ((0, 0), (1, 1)):
            return False
    return True


def _segment_factor(seg: For, row: str) -> Optional[str]:
    """The sparse operand's value at the segment's position (``a.tK_vals[q]``) that
    multiplies every term reading the gathered ``row`` (``vals + off``), if there is one:
    the copy can scale the rows by it (module docstring)."""
    pattern = re.compile(r"a\.t\d+_vals\[" + re.escape(seg.var) + r"\]")
    candidates = {m.group(0) for st in seg.body if isinstance(st, (Assign, AddTo)) for m in pattern.finditer(st.expr)}
    for factor in sorted(candidates):
        ok = True
        for st in seg.body:
            text = stmt_text(st)
            if factor not in text and row not in text:
                continue
            if not isinstance(st, (Assign, AddTo)) or factor in st.target or row in st.target:
                if _prefetch_of(st, row.split(" + ")[0]) and factor not in text:
                    continue
                ok = False
                break
            expr = st.expr
            if isinstance(st, Assign):      # an accumulation ``acc = acc + ...``
                head = f"{st.target} + "
                if not expr.startswith(head):
                    ok = False
                    break
                expr = expr[len(head):]
            if not _linear_in(expr, factor, row):
                ok = False
                break
        if ok:
            return factor
    return None


_BLOCK_OFFSET = re.compile(r"^([A-Za-z_]\w*) \+ ([A-Za-z_]\w*) \* (a\.t(\d+)_st_\w+)$")


class _Block:
    """A dense loop inside a sparse loop reading one panel row of a block per iteration at
    ``base + c * stride`` (``base`` set outside the sparse loop): the block's rows, copied
    once before the sparse loop, serve every entry."""

    def __init__(self, dense: For, vals: str, base: str, stride: str, off: str):
        self.dense, self.vals, self.base, self.stride, self.off = dense, vals, base, stride, off

    def key(self):
        return (self.dense.lo, self.dense.hi, self.vals, self.base, self.stride)


def _find_block(loop) -> Optional[_Block]:
    """The block a sparse ``loop`` (a segment, or its register tile) re-reads per entry."""
    if not ((isinstance(loop, For) and loop.role == "segment") or (isinstance(loop, While) and loop.role == "tile")):
        return None
    dense = [st for st in loop.body if isinstance(st, For)]
    if len(dense) != 1 or dense[0].role != "dense" or any(isinstance(st, While) for st in loop.body):
        return None
    d = dense[0]
    if has_loop(d.body) or (d.lo or "0") != "0":
        return None
    inside = assigned_names(loop.body) | ({loop.var} if isinstance(loop, For) else set())
    if names(d.hi) & inside:
        return None
    text = " ".join(stmt_text(st) for st in d.body)
    for st in d.body:
        if not isinstance(st, Assign):
            continue
        m = _BLOCK_OFFSET.match(st.expr)
        if not m or m.group(2) != d.var or m.group(1) in inside:
            continue
        vals, off = f"a.t{m.group(4)}_vals", st.target
        uses = len(re.findall(re.escape(vals) + r"\b", text))
        if uses and uses == len(re.findall(re.escape(vals) + r" \+ " + off + r"\b", text)) \
                and sum(1 for x in d.body if isinstance(x, Assign) and x.target == off) == 1 \
                and vals not in " ".join(stmt_text(x) for x in loop.body if x is not d):
            return _Block(d, vals, m.group(1), m.group(3), off)
    return None


def _rewrite_block(loop, b: _Block, buf: str, step: str):
    """``loop`` reading the block's rows from ``buf`` (row ``c`` at ``c * step``)."""
    def dense_stmt(st: Stmt) -> Stmt:
        if isinstance(st, Assign) and st.target == b.off:
            return Assign(b.off, f"{b.dense.var} * {step}")
        if isinstance(st, (Assign, AddTo)):
            return type(st)(st.target, st.expr.replace(b.vals + " + " + b.off, buf + " + " + b.off))
        return st

    body = tuple(For(st.var, st.lo, st.hi, tuple(dense_stmt(x) for x in st.body), st.role) if st is b.dense else st
                 for st in loop.body)
    if isinstance(loop, For):
        return For(loop.var, loop.lo, loop.hi, body, loop.role)
    return While(loop.cond, body, loop.role)


def _copy_block(b: _Block, buf: str, step: str, store: str, pq: str, width: int, vt: str) -> List[Stmt]:
    """The block's rows copied to ``buf`` where they are not contiguous already and fit
    :data:`PACK_MAX_BYTES` (else ``buf`` points at the block itself)."""
    return [If(f"{b.stride} != {width} and {b.dense.hi} * {width * value_bytes(vt)} <= {PACK_MAX_BYTES}",
               (Call(f"{store}.resize({b.dense.hi} * {width} + 1)"),
                Assign(buf, f"{store}.data()"), Assign(step, str(width)),
                For(pq, None, b.dense.hi, (Call(f"memcpy({buf} + {pq} * {width}, {b.vals} + {b.base} + {pq} * "
                                                f"{b.stride}, {width * value_bytes(vt)})"),), "pack")),
               (Assign(buf, f"{b.vals} + {b.base}"), Assign(step, b.stride)))]


def _rewrite(loop, p: _Pack, buf: str, lo: str, on: str, width: int):
    """``loop`` reading the packed rows (where ``on``): row ``q - lo`` of ``buf`` for entry
    ``q``. With a folded factor, the loop as written where the rows were not copied."""
    if p.factor is not None:
        return If(on, (_rewrite_folded(loop, p, buf, lo, width),), (loop,))

    def seg_stmt(st: Stmt) -> List[Stmt]:
        if _prefetch_of(st, p.vals):
            return [If(f"not {on} and {st.cond}", st.then)]     # rows read in place
        if isinstance(st, Assign) and st.target == p.off:
            return [Assign(p.off, f"({p.q} - {lo}) * {width} if {on} else {st.expr}")]
        if isinstance(st, (Assign, AddTo)):
            return [type(st)(st.target, st.expr.replace(p.vals + " + " + p.off, buf + " + " + p.off))]
        return [st]
    return _map_segment(loop, seg_stmt)


def _rewrite_folded(loop, p: _Pack, buf: str, lo: str, width: int):
    """``loop`` reading the copied rows, which already carry ``p.factor`` (1 in its place)."""
    def seg_stmt(st: Stmt) -> List[Stmt]:
        if _prefetch_of(st, p.vals):
            return []
        if isinstance(st, Assign) and st.target == p.off:
            return [Assign(p.off, f"({p.q} - {lo}) * {width}")]
        if isinstance(st, (Assign, AddTo)):
            expr = st.expr.replace(p.vals + " + " + p.off, buf + " + " + p.off).replace(p.factor, "1")
            return [type(st)(st.target, expr)]
        return [st]
    return _map_segment(loop, seg_stmt)


def _map_segment(loop, seg_stmt: Callable[[Stmt], List[Stmt]]):
    """``loop`` with each statement of its segment loop replaced by ``seg_stmt``'s."""
    body = []
    for st in loop.body:
        if isinstance(st, For) and st.role == "segment":
            st = For(st.var, st.lo, st.hi, tuple(x for y in st.body for x in seg_stmt(y)), st.role)
        body.append(st)
    if isinstance(loop, For):
        return For(loop.var, loop.lo, loop.hi, tuple(body), loop.role)
    return While(loop.cond, tuple(body), loop.role)


def _copy(p: _Pack, buf: str, store: str, lo: str, hi: str, on: str, pq: str, width: int,
          vt: str, need: Callable) -> List[Stmt]:
    """The segment's rows copied to ``buf`` (``width`` values each, in segment order) when
    they fit :data:`PACK_MAX_BYTES` (``on``); else ``buf`` is the operand itself."""
    first, end = (ln.split(" = ", 1)[1] for ln in p.setup)
    if p.factor is None:
        row = (Call(f"memcpy({buf} + ({pq} - {lo}) * {width}, {p.vals} + {p.crd}[{pq}] * "
                    f"{p.stride}, {width * value_bytes(vt)})"),)
    else:   # each row scaled by its entry's value (the folded factor)
        scale, pe = need(f"{buf}_scale", vt), need(f"{buf}_e")
        row = (Assign(scale, p.factor.replace(f"[{p.q}]", f"[{pq}]")),
               For(pe, None, str(width),
                   (Assign(f"{buf}[({pq} - {lo}) * {width} + {pe}]",
                           f"{scale} * {p.vals}[{p.crd}[{pq}] * {p.stride} + {pe}]"),), "pack"))
    return [Assign(lo, first), Assign(hi, end),
            Assign(on, f"({hi} - {lo}) * {width * value_bytes(vt)} <= {PACK_MAX_BYTES}"),
            If(on, (Call(f"{store}.resize(({hi} - {lo}) * {width} + 1)"),
                    Assign(buf, f"{store}.data()"),
                    For(pq, lo, hi, row, "pack")),
               (Assign(buf, p.vals),))]


def pack_rows(body: Tuple[Stmt, ...], need: Callable, width: int, vt: str) -> Tuple[Stmt, ...]:
    """``body`` with the gathered rows of each re-run segment packed (module docstring);
    ``need`` declares a local, ``width``: the variant's row width, ``vt``: the value type."""
    count = [0]

    def visit(stmts: Sequence[Stmt]) -> Tuple[Stmt, ...]:
        out: List[Stmt] = []
        current = None            # (key, buf, lo) of the copy the previous sibling made
        written: set = set()      # names assigned since that copy
        for st in stmts:
            p = _find(st) if isinstance(st, (For, While)) else None
            blk = _find_block(st) if p is None and isinstance(st, (For, While)) else None
            if p is None and blk is None:
                if isinstance(st, For):
                    st = For(st.var, st.lo, st.hi, visit(st.body), st.role)
                elif isinstance(st, While):
                    st = While(st.cond, visit(st.body), st.role)
                elif isinstance(st, If):
                    st = If(st.cond, visit(st.then), visit(st.orelse))
                written |= assigned_names([st])
                out.append(st)
                current = None
                continue
            if p is not None:
                key, reads = p.key(), names(" ".join(ln.split(" = ", 1)[1] for ln in p.setup))
            else:
                key, reads = blk.key(), names(f"{blk.base} {blk.dense.hi}")
            if current is None or current[0] != key or written & reads:
                k = count[0]
                count[0] += 1
                store, buf = need(f"pk{k}_store", f"vector[{vt}]"), need(f"pk{k}", f"{vt}*")
                pq = need(f"pk{k}_q")
                on = None
                if p is not None:
                    lo, hi, on = need(f"pk{k}_lo"), need(f"pk{k}_hi"), need(f"pk{k}_on", "bint")
                    out += _copy(p, buf, store, lo, hi, on, pq, width, vt, need)
                else:
                    lo = need(f"pk{k}_step")
                    out += _copy_block(blk, buf, lo, store, pq, width, vt)
                current, written = (key, buf, lo, on), set()
            if p is not None:
                out.append(_rewrite(st, p, current[1], current[2], current[3], width))
            else:
                out.append(_rewrite_block(st, blk, current[1], current[2]))
            written |= assigned_names([st])
        return tuple(out)
    return visit(body)
