"""SpMV's row loop (``out[i] = sum_q A[q] * x[crd[q]]`` over the rows ``clo..chi``) in the
short-rows module as one call of a runtime row loop (``scorch/_runtime/gather_dot.h``).

Two loops, chosen per call like the other chunk variants:

- ``rows_dot``: the scalar loop (``run_chunk``). Generated inline, the same loop ran
  bcspwr10 in 7.8 or 21 us (AVX-512 Zen 5, 1 thread) depending on code elsewhere in the
  kernel (a condition added to the variant choice was enough); out of line and aligned in
  the header it runs 7.3-8.9 us whatever surrounds it. ``rows_dot_pairs``
  (``run_chunk_pairs``, rows of ``facts.PAIRED_ROWS_MIN`` entries and more on average): two
  partial sums a row, 4elt (6 a row) 35.8 -> 31.5 us; rows of 2 pay for the pairing (arrow
  57 -> 78 us), hence the choice by length.
- ``rows_gather_dot`` (``run_chunk_gathers``): each row one gathered dot with the CPU's
  gather instruction, 8 lanes and a masked tail, so a row of up to 8 entries is one
  branch-free step. The scalar loop mispredicts its exit about once a row when the
  lengths change from row to row (random graphs, R-MAT: 72-91 % of neighbouring rows
  differ) and the next row's loads wait for the restart. Chosen when the gathered operand
  is past L1 and the rows vary (``facts.HW_GATHER_MIN_BYTES``, ``rows_vary``) on targets
  with pipelined gathers (``facts.HW_GATHER_TARGETS``). Meshes (4elt, mdual: lengths
  repeat) and rows of 1-4 entries keep the scalar loop: one gather step costs ~8-10 cycles
  whatever its lanes (bcspwr10 8.5 -> 16.8 us, mdual 566 -> 968 us in a C prototype).
  AVX-512 Zen 5, 1 thread, C prototypes: rmat16 674 -> 460 us, uniform16 627 -> 476, rmat18
  3205 -> 2462, uniform20 16.9 -> 10.6 ms (``benchmarks/results/issue15/zen5-s20``). On
  Intel's cores the gathers also win on meshes and with x in L1, and the stream form loses:
  ``facts.row_loop_tuning`` says which rows and sizes take it on whose cores.

Other short-rows kernels (a gathered operand with an offset, several row variables, other
products) keep their generated loops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..loop_ir import AddTo, Assign, Call, For, LevelCode, Stmt
from .facts import HW_GATHER_TARGETS, KernelFacts, short_rows
from .stream_rows import STREAM_DISTANCE

__all__ = ["GATHER_DOT_HEADER", "RowLoop", "row_loop", "row_loop_call", "extern_lines", "pipelined_gathers"]

#: the runtime header with the row loops (``scorch/_runtime/gather_dot.h``)
GATHER_DOT_HEADER = "gather_dot.h"
_TYPES = {"float": "f32", "double": "f64", "int32_t": "i32", "int64_t": "i64"}


@dataclass(frozen=True)
class RowLoop:
    """The arrays of a chunk loop that is exactly SpMV's row loop over rows ``clo..chi``:
    ``pos``/``crd`` of the sparse level, the sparse values ``vals``, the gathered operand
    ``x`` (unit stride, no offset), the output's row stride ``ostride``; ``suffix`` names
    the value and index types (``f32_i32``)."""
    pos: str
    crd: str
    vals: str
    x: str
    ostride: str
    suffix: str

    @property
    def rows_vary(self) -> str:
        """The header's ``rows_vary`` for this loop's index type."""
        return f"rows_vary_{self.suffix.split('_')[1]}"


def row_loop(f: KernelFacts, body: Tuple[Stmt, ...]) -> Optional[RowLoop]:
    """The row loop's arrays when the chunk function ``body`` is exactly::

        for c_i in range(clo, chi):
            p = c_i; oo = c_i * a.out_st_i; acc = 0
            q = pos[p]; h = pos[p + 1]
            for q in range(q, h): c = crd[q]; o = c; acc += A[q] * x[o]
            a.out_vals[oo] = acc

    with float values and int32/int64 coordinates; else None (the chunk stays generated)."""
    sr = short_rows(f.s)
    if sr is None or len(sr[1]) != 1 or len(f.gathers) != 1 or f.vt not in ("float", "double"):
        return None
    it = f.idx.get(sr[0])
    if it not in ("int32_t", "int64_t") or len(body) != 1 or not isinstance(body[0], For):
        return None
    rows, i = body[0], sr[1][0]
    if (rows.lo, rows.hi) != ("clo", "chi") or len(rows.body) != 6:
        return None
    p, oo, init, level, seg, store = rows.body
    lv = f.loops[-1].iters[0]
    ok = (isinstance(p, Assign) and p.expr == rows.var
          and isinstance(oo, Assign) and oo.expr == f"{rows.var} * a.out_st_{i}"
          and isinstance(init, Assign) and init.expr == "0"
          and isinstance(level, LevelCode)
          and isinstance(seg, For) and seg.role == "segment" and len(seg.body) == 3
          and level.lines == (f"{seg.lo} = {lv.pos}[{p.target}]", f"{seg.hi} = {lv.pos}[{p.target} + 1]")
          and isinstance(store, Assign) and store.target == f"a.out_vals[{oo.target}]"
          and store.expr == init.target)
    if not ok:
        return None
    c, o, add = seg.body
    q, A, X = seg.var, f"a.t{sr[0]}_vals", f"a.t{f.gathers[0]}_vals"
    ok = (isinstance(c, Assign) and c.expr == f"{lv.crd}[{q}]"
          and isinstance(o, Assign) and o.expr == c.target
          and isinstance(add, AddTo) and add.target == init.target
          and add.expr in (f"({A}[{q}] * {X}[{o.target}])", f"({X}[{o.target}] * {A}[{q}])"))
    if not ok:
        return None
    return RowLoop(lv.pos, lv.crd, A, X, f"a.out_st_{i}", f"{_TYPES[f.vt]}_{_TYPES[it]}")


def row_loop_call(r: RowLoop, gathers: bool, streams: bool, pairs: bool = False) -> Tuple[Stmt, ...]:
    """The chunk function's body: one call of the header's row loop (see the module
    docstring); ``gathers``: the gathered-dot loop (targets in ``HW_GATHER_TARGETS``),
    ``streams``: with its stream requests; ``pairs``: the scalar loop with two sums a row."""
    args = f"{r.pos}, {r.crd}, {r.vals}, {r.x}, a.out_vals, {r.ostride}, clo, chi"
    if not gathers:
        return (Call(f"rows_dot{'_pairs' if pairs else ''}_{r.suffix}({args})"),)
    return (Call(f"rows_gather_dot_{r.suffix}({args}, {STREAM_DISTANCE if streams else 0})"),)


def pipelined_gathers(f: KernelFacts) -> bool:
    """Whether the target's gathers are pipelined (``facts.HW_GATHER_TARGETS``)."""
    return f.target.name in HW_GATHER_TARGETS


def extern_lines(f: KernelFacts, r: RowLoop) -> Tuple[str, ...]:
    """The Cython declarations of the header functions a kernel with row loop ``r`` calls."""
    it, vt = f.idx[short_rows(f.s)[0]], f.vt
    arrays = f"const {it}*, const {it}*, const {vt}*, const {vt}*, {vt}*, int64_t, int64_t, int64_t"
    return (f'cdef extern from "{GATHER_DOT_HEADER}" namespace "scorch" nogil:',
            f"    void rows_dot_{r.suffix}({arrays})",
            f"    void rows_dot_pairs_{r.suffix}({arrays})",
            f"    void rows_gather_dot_{r.suffix}({arrays}, int64_t)",
            f"    bint {r.rows_vary}(const {it}*, int64_t, int64_t, int64_t)")
