"""The stream variant of a short-rows row loop (SpMV's ``for q in pos[i]..pos[i+1]``).

Rows of a few entries with random lengths mispredict their exit once a row, and the
hardware stream prefetcher then falls behind on the index and value arrays: the loop is
bound by latency, not by bandwidth (rmat18: 2.1 ns an entry; 1.35 with its row lengths and x
in L1; 0.54 with 10 entries in every row and x in L1). This variant asks for the stream lines ``STREAM_DISTANCE``
entries ahead at every row start, and runs rows longer than ``STREAM_BLOCK`` entries in
blocks of ``STREAM_BLOCK`` (a fixed trip count gcc unrolls) with one request a block::

    prefetch(crd + q + D); prefetch(vals + q + D)
    qb = q
    while qb + B <= h:
        prefetch(crd + qb + D + B); prefetch(vals + qb + D + B)
        for q in range(qb, qb + B): body
        qb = qb + B
    for q in range(qb, h): body

The requests are non-temporal hints (``scorch_prefetch_stream``): the streams are read
once, the gathered vector stays in cache. A prefetch never faults, so addresses past the
arrays' end are harmless.
"""
from __future__ import annotations

from typing import Tuple

from ..loop_ir import Assign, Call, For, If, Stmt, While
from .facts import STREAM_BLOCK, STREAM_DISTANCE, KernelFacts, short_rows

__all__ = ["STREAM_PREFETCH", "STREAM_PREFETCH_DECL", "stream_blocks"]

#: the C macro the variant calls, declared in the kernel (``entry._imports``)
STREAM_PREFETCH = "scorch_prefetch_stream"
STREAM_PREFETCH_DECL = (f"    #define {STREAM_PREFETCH}(p) __builtin_prefetch((const void*)(p), 0, 0)",)


def _requests(arrays: Tuple[str, ...], at: str) -> Tuple[Stmt, ...]:
    return tuple(Call(f"{STREAM_PREFETCH}({arr} + {at} + {STREAM_DISTANCE})") for arr in arrays)


def _rewrite(st: Stmt, q: str, arrays: Tuple[str, ...], qb: str) -> Tuple[Stmt, ...]:
    if isinstance(st, For) and st.var == q and st.role == "segment":
        block = For(q, qb, f"{qb} + {STREAM_BLOCK}", st.body, st.role)
        return (_requests(arrays, st.lo)
                + (Assign(qb, st.lo),
                   While(f"{qb} + {STREAM_BLOCK} <= {st.hi}",
                         _requests(arrays, f"{qb} + {STREAM_BLOCK}")
                         + (block, Assign(qb, f"{qb} + {STREAM_BLOCK}")), "stream"),
                   For(q, qb, st.hi, st.body, st.role)))
    if isinstance(st, For):
        return (For(st.var, st.lo, st.hi, _walk(st.body, q, arrays, qb), st.role),)
    if isinstance(st, While):
        return (While(st.cond, _walk(st.body, q, arrays, qb), st.role),)
    if isinstance(st, If):
        return (If(st.cond, _walk(st.then, q, arrays, qb), _walk(st.orelse, q, arrays, qb)),)
    return (st,)


def _walk(body: Tuple[Stmt, ...], q: str, arrays: Tuple[str, ...], qb: str) -> Tuple[Stmt, ...]:
    return tuple(x for st in body for x in _rewrite(st, q, arrays, qb))


def stream_blocks(f: KernelFacts, body: Tuple[Stmt, ...], block_cursor: str) -> Tuple[Stmt, ...]:
    """``body`` (a chunk function's loop nest) with its short-rows segment loop in the
    stream form (see the module docstring); ``block_cursor``: the local holding the
    block's first position (declared by the caller)."""
    acc, _ = short_rows(f.s)
    lv = f.loops[-1].iters[0]
    return _walk(body, lv.q, (lv.crd, f"a.t{acc}_vals"), block_cursor)
