"""Gathered rows packed once per segment: where a loop re-runs the same sparse segment for
each of its iterations and the segment's loop reads a dense operand's row per stored
entry (a gather), the rows of that segment are copied into one contiguous buffer before
the loop, and every pass reads the buffer (a GEMM's packed panel).

The MoE expert gradient ``dE(n,d,h) = sum_b dy(b,h) x(b,d) G(b,n)`` runs ``n, d, b, h``:
for each of the 784 rows ``d`` the segment of expert ``n`` (~256 inputs) reads
``dy[b, panel]``. The gathered rows lie 2 KB apart (hidden 512), so a 32-float panel of
each maps to the same few L1 sets, and every pass reloads them from L2; packed, the
segment's panel is 32 KB read in order. Hand-written harness on a Zen 3 core (1 thread,
under load): 61-66 -> 35-38 ms for the 2-row jam (blocking the segment alone, without the
copy, gained nothing). Copying costs one read of the rows per loop, against one read per
iteration of it.

On the IR, in a fixed-width chunk function (the segment's body loads whole vectors): a
``For``/``While`` whose body sets up a segment (``q = pos[p]``, ``h = pos[p + 1]``, from
names set outside it) and runs it, where the segment's body has no loops, computes a row
offset ``o = c * a.tK_st_v`` of the coordinate ``c = crd[q]`` and reads ``a.tK_vals``
only at ``o``. Consecutive such loops over one segment share one copy.
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional, Sequence, Tuple

from ..loop_ir import AddTo, Assign, Call, For, If, LevelCode, Stmt, While

__all__ = ["pack_rows"]

_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b")
_LINE = re.compile(r"^([A-Za-z_]\w*) = (.+)$")
_OFFSET = re.compile(r"^([A-Za-z_]\w*) \* (a\.t(\d+)_st_\w+)$")
_CRD = re.compile(r"^(a\.t\d+_crd\d+)\[([A-Za-z_]\w*)\]$")


def _names(code: str) -> set:
    return set(_NAME.findall(code))


class _Pack:
    """What one segment loop gathers: the setup lines, the segment loop's variable and end,
    the coordinate array, the gathered access's field and row stride, its offset local."""

    def __init__(self, setup: Tuple[str, ...], q: str, crd: str, vals: str, stride: str, off: str):
        self.setup, self.q, self.crd, self.vals, self.stride, self.off = setup, q, crd, vals, stride, off

    def key(self):
        return (self.setup, self.crd, self.vals, self.stride)


def _text(st: Stmt) -> str:
    if isinstance(st, (Assign, AddTo)):
        return f"{st.target} {st.expr}"
    if isinstance(st, Call):
        return st.code
    if isinstance(st, LevelCode):
        return " ".join(st.lines)
    if isinstance(st, If):
        return " ".join([st.cond] + [_text(x) for x in st.then + st.orelse])
    if isinstance(st, For):
        return " ".join([st.var, st.lo or "", st.hi] + [_text(x) for x in st.body])
    if isinstance(st, While):
        return " ".join([st.cond] + [_text(x) for x in st.body])
    return ""


def _assigned(stmts: Sequence[Stmt]) -> set:
    out = set()
    for st in stmts:
        if isinstance(st, (Assign, AddTo)) and re.fullmatch(r"[A-Za-z_]\w*", st.target):
            out.add(st.target)
        elif isinstance(st, LevelCode):
            out |= {m.group(1) for m in map(_LINE.match, st.lines) if m}
        elif isinstance(st, If):
            out |= _assigned(st.then) | _assigned(st.orelse)
        elif isinstance(st, (For, While)):
            out |= _assigned(st.body) | ({st.var} if isinstance(st, For) else set())
    return out


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
    inside = _assigned(body) | ({loop.var} if isinstance(loop, For) else set())
    if _names(" ".join(m.group(2) for m in ms)) & inside:
        return None
    if _has_loop(seg.body):
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
    text = " ".join(_text(st) for st in seg.body if not _prefetch_of(st, "a.t"))
    for off, vals, stride in found:
        uses = len(re.findall(re.escape(vals) + r"\b", text))
        if uses and uses == len(re.findall(re.escape(vals) + r" \+ " + off + r"\b", text)) \
                and _assigned(seg.body).isdisjoint(_names(off + " " + coord) - {off, coord}) \
                and sum(1 for st in seg.body if isinstance(st, Assign) and st.target == off) == 1:
            return _Pack(tuple(lines), seg.var, crd, vals, stride, off)
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
    if _has_loop(d.body) or (d.lo or "0") != "0":
        return None
    inside = _assigned(loop.body) | ({loop.var} if isinstance(loop, For) else set())
    if _names(d.hi) & inside:
        return None
    text = " ".join(_text(st) for st in d.body)
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
                and vals not in " ".join(_text(x) for x in loop.body if x is not d):
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
    """The block's rows copied to ``buf`` where they are not contiguous already (then
    ``buf`` points at the block itself)."""
    return [If(f"{b.stride} != {width}",
               (Call(f"{store}.resize({b.dense.hi} * {width} + 1)"),
                Assign(buf, f"{store}.data()"), Assign(step, str(width)),
                For(pq, None, b.dense.hi, (Call(f"memcpy({buf} + {pq} * {width}, {b.vals} + {b.base} + {pq} * "
                                                f"{b.stride}, {width} * sizeof({vt}))"),), "pack")),
               (Assign(buf, f"{b.vals} + {b.base}"), Assign(step, b.stride)))]


def _has_loop(stmts: Sequence[Stmt]) -> bool:
    return any(isinstance(st, (For, While)) or (isinstance(st, If) and _has_loop(st.then + st.orelse))
               for st in stmts)


def _rewrite(loop, p: _Pack, buf: str, lo: str, width: int):
    """``loop`` reading the packed rows: row ``q - lo`` of ``buf`` for entry ``q``."""
    def seg_stmt(st: Stmt) -> List[Stmt]:
        if _prefetch_of(st, p.vals):
            return []
        if isinstance(st, Assign) and st.target == p.off:
            return [Assign(p.off, f"({p.q} - {lo}) * {width}")]
        if isinstance(st, (Assign, AddTo)):
            return [type(st)(st.target, st.expr.replace(p.vals + " + " + p.off, buf + " + " + p.off))]
        return [st]

    body = []
    for st in loop.body:
        if isinstance(st, For) and st.role == "segment":
            st = For(st.var, st.lo, st.hi, tuple(x for y in st.body for x in seg_stmt(y)), st.role)
        body.append(st)
    if isinstance(loop, For):
        return For(loop.var, loop.lo, loop.hi, tuple(body), loop.role)
    return While(loop.cond, tuple(body), loop.role)


def _copy(p: _Pack, buf: str, store: str, lo: str, hi: str, pq: str, width: int, vt: str) -> List[Stmt]:
    """The segment's rows copied to ``buf`` (``width`` values each, in segment order)."""
    first, end = (ln.split(" = ", 1)[1] for ln in p.setup)
    return [Assign(lo, first), Assign(hi, end),
            Call(f"{store}.resize(({hi} - {lo}) * {width} + 1)"),
            Assign(buf, f"{store}.data()"),
            For(pq, lo, hi, (Call(f"memcpy({buf} + ({pq} - {lo}) * {width}, {p.vals} + {p.crd}[{pq}] * "
                                  f"{p.stride}, {width} * sizeof({vt}))"),), "pack")]


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
                written |= _assigned([st])
                out.append(st)
                current = None
                continue
            if p is not None:
                key, reads = p.key(), _names(" ".join(ln.split(" = ", 1)[1] for ln in p.setup))
            else:
                key, reads = blk.key(), _names(f"{blk.base} {blk.dense.hi}")
            if current is None or current[0] != key or written & reads:
                k = count[0]
                count[0] += 1
                store, buf = need(f"pk{k}_store", f"vector[{vt}]"), need(f"pk{k}", f"{vt}*")
                pq = need(f"pk{k}_q")
                if p is not None:
                    lo, hi = need(f"pk{k}_lo"), need(f"pk{k}_hi")
                    out += _copy(p, buf, store, lo, hi, pq, width, vt)
                else:
                    lo = need(f"pk{k}_step")
                    out += _copy_block(blk, buf, lo, store, pq, width, vt)
                current, written = (key, buf, lo), set()
            if p is not None:
                out.append(_rewrite(st, p, current[1], current[2], width))
            else:
                out.append(_rewrite_block(st, blk, current[1], current[2]))
            written |= _assigned([st])
        return tuple(out)
    return visit(body)
