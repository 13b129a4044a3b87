"""Lowering of the whole module: the argument struct, the chunk-function variants and the
``kernel`` entry (chunking and load balancing, memset, panels, the output epilogue).

Each variant is its own function so the hot loop has no run-time branch and no call that
would push its variables out of registers: ``run_chunk`` (run-time widths), one
``run_chunk_w<W>`` per compile-time row width (register rows, vector dot) and
``run_chunk_map`` (the runtime workspace too large for a dense array per thread).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

import torch

from ..loop_ir import (ArgSpec, Assign, Call, ChunkFunction, Chunking, DenseOutput, For, Kernel,
                       Panels, RowsOutput, Stmt, TuplesOutput, While)
from ..schedule import Schedule
from ..target import value_bytes
from .facts import (DENSE_WS_LIMIT, GATHER_DOT_LANES, PAIRED_ROWS_MIN, PREFETCH_DISTANCE,
                    PREFETCH_MIN_BYTES,
                    ROWS_VARY_PERCENT, ROWS_VARY_SAMPLES, STREAM_MIN_BYTES,
                    STREAM_MIN_GATHER_BYTES, UNPREDICTABLE_DECL, L2_BYTES_DECL, KernelFacts, dot_entries_type,
                    dot_prefetch_skips_in_l2, fiber_products,
                    kernel_facts, math_functions, reads_strided,
                    reduce_identity, row_loop_tuning, short_rows, ws_size)
from .loops import loop_nest
from .output import _STOP_AFTER_FAILURE
from .nest import Cursor, Decls, Nest, Variant
from .gather_rows import extern_lines, pipelined_gathers, row_loop, row_loop_call
from .stream_rows import STREAM_PREFETCH, STREAM_PREFETCH_DECL, stream_blocks

__all__ = ["lower_kernel", "kernel_args"]

def kernel_args(f: KernelFacts) -> Tuple[ArgSpec, ...]:
    """The kernel's argument table: sizes, the operands' arrays and strides, the output."""
    s, args = f.s, {}

    def arg(name: str, ctype: str, what: tuple) -> None:
        args.setdefault(name, (name, ctype, what))
    for v in s.loop_order:
        arg(f"N_{v}", "int64_t", ("size", v))
    for ap in s.accesses:
        if ap.sparse:
            it = f.idx[ap.id]
            for lv in ap.levels:
                if lv.has_pos:
                    arg(f"t{ap.id}_pos{lv.k}", it + "*", ("pos", ap.id, lv.k))
                if lv.iterates:
                    arg(f"t{ap.id}_crd{lv.k}", it + "*", ("crd", ap.id, lv.k))
        else:
            for v in dict.fromkeys(ap.indices):
                arg(f"t{ap.id}_st_{v}", "int64_t", ("stride", ap.id, v))
        arg(f"t{ap.id}_vals", f.vt + "*", ("vals", ap.id))
    if s.output.pattern >= 0 or s.output.dense:
        arg("out_vals", f.vt + "*", ("out",))
    if s.output.dense:
        for v in s.output.vars:
            arg(f"out_st_{v}", "int64_t", ("ostride", v))
    return tuple(args.values())


def _workspace_setup(n: Nest) -> Tuple[List[Stmt], List[Stmt]]:
    """The chunk's workspace: statements before the loop nest and after it."""
    f, d = n.facts, n.decls
    out = f.s.output
    size = ws_size(out.ws_vars)
    if out.mode == "ws" and out.ws_dense:
        for name, ct in (("wsize", "int64_t"), ("wi", "int64_t"), ("wsv", f.vt + "*"),
                         ("wsf", "char*")):
            d.need(name, ct)
        return ([Assign("wsize", size), Assign("wsv", f"<{f.vt}*>calloc(wsize + 1, sizeof({f.vt}))"),
                 Assign("wsf", "<char*>calloc(wsize + 1, 1)")],
                [Call("free(wsv)"), Call("free(wsf)")])
    if out.mode == "ws" and f.rt_ws and n.variant.ws_map:
        d.need("ws", f"SparseWorkspace[{f.vt}]")
    elif out.mode == "ws" and f.rt_ws:
        # a dense array with a touched list when the workspace's extent is small enough
        # to allocate per thread: the thread's own arrays, kept across calls (no
        # allocation, no zeroing)
        for name, ct in (("wv", f.vt + "*"), ("wm", "uint8_t*"), ("wl", "int32_t*"),
                         ("wc", "int64_t"),
                         ("wsize", "int64_t"), ("wsp", f"DenseScratch[{f.vt}]*")):
            d.need(name, ct)
        return ([Assign("wsize", size), Assign("wsp", f"dense_scratch[{f.vt}](wsize + 1)"),
                 Assign("wv", "wsp.values"), Assign("wm", "wsp.mark"), Assign("wl", "wsp.touched")],
                [])
    elif out.mode == "ws":
        # std::map (the paper's red-black tree)
        d.need("ws", f"cmap[int64_t, {f.vt}]")
    return [], []


def chunk_function(f: KernelFacts, variant: Variant) -> ChunkFunction:
    """The loop nest of one chunk-function variant, with the locals it declares."""
    n = Nest(f, variant, Decls())
    s = f.s
    start = Cursor(pos={a.id: "0" for a in s.accesses if a.sparse},
                   pres={a.id: "1" for a in s.accesses},
                   off={a.id: "0" for a in s.accesses if not a.sparse})
    pre, post = _workspace_setup(n)
    if variant.prefetch:     # the last position whose entry PREFETCH_DISTANCE ahead exists
        acc, rows = short_rows(s)
        lv = s.accesses[acc].levels[-1]
        extent = " * ".join(f"a.N_{v}" for v in rows) or "1"
        pre.insert(0, Assign(n.decls.need("pfe"), f"{lv.pos}[{extent}] - {PREFETCH_DISTANCE}"))
    if f.row_room:
        # the chunk's entries (or, in the bound pass, their bound) counted from its room's start
        pre.append(Assign(n.decls.need("ok"), "0"))
    nest = loop_nest(n, 0, start)
    if variant.row_loop is not None:
        nest = row_loop_call(row_loop(f, nest), variant.row_loop == "gather", variant.streams,
                             variant.row_loop == "pairs")
    elif variant.streams:
        nest = stream_blocks(f, nest, n.decls.need("qb"))
    if _appends_tuples(f):
        nest = _stopping_after_failure(nest)
    body = tuple(pre) + tuple(n.setup) + nest + tuple(post)
    return ChunkFunction(variant.name, variant.select, n.decls.items(), body,
                         "ok" if f.row_room else None, variant.width)


def _appends_tuples(f: KernelFacts) -> bool:
    """The output is coordinate tuples (``TuplesOutput``), appended to growable buffers."""
    return not (f.rows or f.s.output.dense or f.s.output.pattern >= 0)


def _stopping_after_failure(nest: Tuple[Stmt, ...]) -> Tuple[Stmt, ...]:
    """Coordinate tuples: each outermost iteration ends by checking that the output buffers
    grew (a chunk whose result no longer fits stops; the call raises MemoryError)."""
    return tuple(replace(st, body=st.body + (_STOP_AFTER_FAILURE,))
                 if isinstance(st, (For, While)) else st for st in nest)


def _streams_bytes(f: KernelFacts) -> str:
    """The C expression of the bytes a short-rows kernel's index and value streams span."""
    lv = f.loops[-1].iters[0]
    extent = _rows_extent(f)
    return f"({lv.pos}[{extent}] - {lv.pos}[0]) * (sizeof({lv.crd}[0]) + sizeof({f.vt}))"


def _rows_average_at_least(f: KernelFacts, entries: int) -> str:
    """The C condition that the short-rows level holds at least ``entries`` a row on average."""
    lv, extent = f.loops[-1].iters[0], _rows_extent(f)
    return f"{lv.pos}[{extent}] - {lv.pos}[0] >= {entries} * {extent}"


def _rows_extent(f: KernelFacts) -> str:
    return " * ".join(f"a.N_{v}" for v in short_rows(f.s)[1]) or "1"


def _rows_vary(f: KernelFacts, rl, percent: int = ROWS_VARY_PERCENT) -> str:
    """The C condition that the rows' lengths change between neighbours in at least
    ``percent`` % of sampled pairs (``gather_dot.h``'s ``rows_vary``)."""
    return f"{rl.rows_vary}({rl.pos}, {_rows_extent(f)}, {ROWS_VARY_SAMPLES}, {percent})"


def _row_loop(f: KernelFacts):
    """The row loop's arrays when the plain chunk is exactly SpMV's row loop
    (``gather_rows.row_loop``), else None."""
    if not f.gathers or short_rows(f.s) is None:
        return None
    return row_loop(f, chunk_function(f, Variant()).body)


def _gathers_span(f: KernelFacts, least: int) -> str:
    """The C condition that some gathered operand spans at least ``least`` bytes."""
    L = f.s.loop_order[-1]
    return " or ".join(f"a.N_{L} * a.t{i}_st_{L} * sizeof({f.vt}) >= {least}" for i in f.gathers)


def variants(f: KernelFacts, short_module: bool = False) -> Tuple[Variant, ...]:
    """The chunk-function variants this kernel has (``run_chunk`` first; the last whose
    condition holds runs). ``short_module``: the short-rows module (``codegen.generate``'s
    ``scalar_inner``), which adds the stream variant (``stream_rows``) where the streams
    outgrow the cache and runs its gather prefetch in the stream form too."""
    s = f.s
    out = [Variant()]
    L = s.loop_order[-1] if s.loop_order else None
    out += [Variant(f"run_chunk_w{W}", f"a.N_{L} == {W}", width=W) for W in f.widths]
    rl = _row_loop(f)
    vary = _rows_vary(f, rl) if rl is not None else ""
    tune = row_loop_tuning(f.target)
    if f.gathers and short_module and tune.stream_requests:
        # the stream requests make up for the row exits a varying row length mispredicts
        # (stream_rows); where the lengths repeat they only cost (NotreDame, 58 % empty rows:
        # 1136 -> 996 us without them, AVX-512 Zen 5; mdual equal), so SpMV asks rows_vary
        out.append(Variant("run_chunk_streams", f"{_streams_bytes(f)} >= {STREAM_MIN_BYTES} and "
                                                f"({_gathers_span(f, STREAM_MIN_GATHER_BYTES)})"
                                                + (f" and {vary}" if vary else ""), streams=True))
    if f.gathers:
        out.append(Variant("run_chunk_prefetch", _gathers_span(f, PREFETCH_MIN_BYTES), prefetch=True,
                           streams=short_module and tune.stream_requests))
    if rl is not None and short_module:
        out[0] = Variant(row_loop="dot")
        # right after run_chunk: the stream and prefetch variants override it past the cache
        out.insert(1, Variant("run_chunk_pairs", _rows_average_at_least(f, PAIRED_ROWS_MIN), row_loop="pairs"))
    if rl is not None and pipelined_gathers(f):
        # random row lengths past L1 (on Intel also rows of several entries, and any x):
        # one gathered dot a row (gather_rows), with the stream requests where the streams
        # outgrow the cache and the cores gain from them; in the vectorized module too (rows
        # of 17 and more: uniform 2^18 x 24 a row 6.1 -> 3.9 ms)
        vary = _rows_vary(f, rl, tune.gather_vary_percent)
        rows = vary if tune.gather_rows_min is None else \
            f"({_rows_average_at_least(f, tune.gather_rows_min)} or {vary})"
        select = rows if not tune.gather_min_bytes else \
            f"({_gathers_span(f, tune.gather_min_bytes)}) and {rows}"
        out.append(Variant("run_chunk_gathers", select, row_loop="gather"))
        if tune.stream_requests:
            out.append(Variant("run_chunk_gathers_streams",
                               f"fn == run_chunk_gathers and {_streams_bytes(f)} >= {STREAM_MIN_BYTES}",
                               row_loop="gather", streams=True))
    if reads_strided(s):     # last: chosen over the widths whenever a streamed stride is not 1
        out.append(Variant("run_chunk_strided", " or ".join(f"a.t{i}_st_{L} != 1" for i in sorted(f.unit)),
                           strided=True))
    products = fiber_products(f) if f.rt_ws and f.rows and len(s.output.ws_vars) == 1 else None
    if products is not None:
        # fibers that mark at least one column in eight of the extent on average: their
        # marks scan costs less than keeping the touched list (Groebner A @ A^T, ~4400 adds
        # into ~380 of 2456 columns a row: 1.33-1.43x in a C prototype, AVX2 Zen 3)
        num, den = products
        out.append(Variant("run_chunk_scan", f"8 * {num} >= {ws_size(s.output.ws_vars)} * {den}",
                           ws_scan=True))
    if f.rt_ws:
        out.append(Variant("run_chunk_map", f"{ws_size(s.output.ws_vars)} > {DENSE_WS_LIMIT}",
                           ws_map=True))
    return tuple(out)


def _header(s: Schedule) -> Tuple[str, ...]:
    out = s.output
    lines = [f"{s.assignment}", f"loop order: {', '.join(s.loop_order)}"]
    for ap in s.accesses:
        desc = f"{ap.format} levels {ap.level_vars}" if ap.sparse else f"dense strided {ap.indices}"
        lines.append(f"T{ap.tensor} access {ap.id}: {desc}")
    pat = f", values in access {out.pattern}'s pattern" if out.pattern >= 0 else ""
    lines.append(f"output: {'dense' if out.dense else out.format} ({out.mode}{pat})")
    return tuple(lines)


def _imports(f: KernelFacts, short_module: bool) -> Tuple[str, ...]:
    out = f.s.output
    lines = ["from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t",
             "from libc.string cimport memcpy, memset"]
    math = list(math_functions(f.s))
    if f.s.assignment.reduce != "sum" and f.vt in ("float", "double"):
        math.append("INFINITY")
    if math:
        lines.append(f"from libc.math cimport {', '.join(math)}")
    if out.mode == "ws" and out.ws_dense:
        lines.append("from libc.stdlib cimport calloc, free")
    elif f.cache_panels:   # the panels' argument blocks
        lines.append("from libc.stdlib cimport malloc, free")
    lines.append("from libcpp.vector cimport vector")
    if f.gathers or f.row_gathers or f.chases:
        lines += ["cdef extern from *:", '    """',
                  "    #define scorch_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)"]
        if short_module:
            lines += list(STREAM_PREFETCH_DECL)
        if f.row_gathers and dot_prefetch_skips_in_l2():
            lines += list(L2_BYTES_DECL)
        lines += ['    """', "    void scorch_prefetch(const void*) noexcept nogil"]
        if f.row_gathers and dot_prefetch_skips_in_l2():
            lines.append("    long scorch_l2_bytes() noexcept nogil")
        if short_module:
            lines.append(f"    void {STREAM_PREFETCH}(const void*) noexcept nogil")
    if out.mode == "ws" and f.rt_ws:
        lines.append("from scorch._runtime.workspace cimport AppendBuffer, ChunkBuffers, DenseScratch, "
                     "SparseWorkspace, dense_scratch, dense_ws_drain_list, pool_give")
        if out.unsorted:
            lines.append("from scorch._runtime.workspace cimport dense_ws_drain_unsorted")
        if any(v.ws_scan for v in variants(f)):
            lines.append("from scorch._runtime.workspace cimport dense_ws_drain_scan")
    elif f.rows and not f.row_room:
        lines.append("from scorch._runtime.workspace cimport AppendBuffer, ChunkBuffers, pool_give")
    elif out.mode == "ws" and not out.ws_dense:
        lines.append("from libcpp.map cimport map as cmap")
    if _appends_tuples(f) and not (out.mode == "ws" and f.rt_ws):
        lines.append("from scorch._runtime.workspace cimport AppendBuffer, ChunkBuffers")   # tuples' buffers
    rl = _row_loop(f)
    if rl is not None and (short_module or pipelined_gathers(f)):
        lines += list(extern_lines(f, rl))
    lines += ["from cython.operator cimport dereference as deref, preincrement as inc",
              "from cython.parallel cimport prange"]
    if any(lp.kind == "merge" for lp in f.loops):   # merge points select without branches
        lines += list(UNPREDICTABLE_DECL)
    if not _has_c_entry(f):
        lines.append(RESULT_DECL)
    return tuple(lines)


#: what a kernel that hands its output over (``codegen._result_entry``) uses of
#: ``scorch/_runtime/result.pxd``
RESULT_DECL = ("from scorch._runtime.result cimport KernelResult, RESULT_OK, RESULT_OVERFLOW, RESULT_RUNTIME, "
               "RESULT_NOMEM, RESULT_INT, RESULT_UINT, RESULT_FLOAT, result_init, result_alloc, result_free, "
               "result_zeros_i64, result_array, result_error, result_hand_over, result_gather, "
               "result_pos, result_check_allocation, result_failed, result_failure_flag, result_to_python")


def _has_c_entry(f: KernelFacts) -> bool:
    """Kernels that only write a preallocated output (dense, or values in an operand's
    pattern) get the C entry point ``kernel_c`` (and the C fast path); the others hand
    their output arrays over through ``kernel_result_c``."""
    out = f.s.output
    return (out.dense or out.pattern >= 0) and out.mode != "ws" and not f.rows


def _output(f: KernelFacts):
    out = f.s.output
    if f.rows:
        return RowsOutput(tuple(out.level_vars[:f.rows]), out.level_vars[-1], tuple(out.level_vars), f.oit,
                          f.row_room)
    if not _appends_tuples(f):
        return DenseOutput()
    return TuplesOutput(max(1, len(out.level_vars)))


def _chunking(f: KernelFacts) -> Chunking:
    if f.chunk_kind == "dense":
        return Chunking("dense", f.s.loop_order[0], balance=f.balance)
    if f.chunk_kind == "sparse":
        return Chunking("sparse", f.s.loop_order[0], level_pos=f.chunk_level.pos)
    return Chunking(None)


def _panels(f: KernelFacts):
    """Tiling of the innermost dense loop into panels (paper Algorithm 3): the operands the
    loop streams and the output move with the panel."""
    if not (f.panels or f.cache_panels) or not (f.s.output.dense or f.s.output.pattern >= 0):
        return None
    L = f.s.loop_order[-1]
    shifted = tuple(f"t{i}_vals" for i in sorted(f.unit)) + (("out_vals",) if f.out_unit == L else ())
    if f.cache_panels:
        # panels of the register widths or any width (the generic chunk); they write
        # disjoint columns, so
        # they run in parallel when the loops below them are not split into chunks
        return Panels(L, f.panels, shifted, cache=True, parallel=f.chunk_kind is None)
    return Panels(L, f.panels, shifted)


def _gather_dot_cflags(f: KernelFacts) -> str:
    """The vectorized gathered dot's vector width (``facts.GATHER_DOT_LANES`` values) where
    it is narrower than the target's registers (float32 on AVX-512: 256-bit), else ""."""
    if not f.gathers or f.vt not in ("float", "double"):
        return ""
    size = value_bytes(f.vt)
    if GATHER_DOT_LANES * size >= f.target.vector_bytes:
        return ""
    return f"-mprefer-vector-width={GATHER_DOT_LANES * size * 8}"


def _sums4(f: KernelFacts) -> Tuple[str, ...]:
    """The vector types whose dots run ``DOT_ENTRIES`` entries per step (they need the
    transposing horizontal sum ``<type>_hsum4``)."""
    if not f.dot:
        return ()
    out = []
    for W in f.widths:
        lanes, vtype = f.vector(W)
        if dot_entries_type(f.s, f.vt, lanes, f.target) and vtype not in out:
            out.append(vtype)
    return tuple(out)


#: a scalar accumulator over a run-time-width innermost reduction (the vector dot's
#: generic variant: the MoE gate gradient's h = 512) is vectorized by gcc only when it may
#: reassociate the sum (lane-wise partial sums, like the fixed-width dots); unrolled with
#: its partial sums expanded, a 4-entry register tile runs 8 FMA chains instead of 4 (one
#: chain an entry waits out the FMA latency: 4 cycles on Zen 3 and Zen 4, 2 FMAs a cycle),
#: with ``output.inner_sum``: gate gradient 55.5 -> 44.6 ms at 1 thread on a Zen 3 core
REDUCTION_CFLAGS = ("-fassociative-math -fno-signed-zeros -fno-trapping-math -funroll-loops "
                    "-fvariable-expansion-in-unroller")


#: an assignment that must keep its order of operations (``Assignment.exact``); last, so it
#: overrides the build's and REDUCTION_CFLAGS' ``-fassociative-math``
EXACT_CFLAGS = "-fno-associative-math"


def _block_dot(f: KernelFacts) -> bool:
    """A vector dot whose accumulator wraps more loops than the innermost (a block)."""
    return f.dot and f.s.output.acc_depth < len(f.s.loop_order) - 1


def lower_kernel(s: Schedule, value_dtype: torch.dtype,
                 index_dtypes: Dict[int, torch.dtype], short_module: bool = False) -> Kernel:
    """The loop IR of the kernel for ``s``; ``short_module``: the short-rows module of a
    gathered dot (``codegen.generate``'s ``scalar_inner``: its stream variant)."""
    f = kernel_facts(s, value_dtype, index_dtypes)
    out = s.output
    c_entry = _has_c_entry(f)
    memset = None
    if out.dense and not f.store_all:
        # the output arrives uninitialized (torch.empty: cheaper than torch.zeros' dispatch)
        memset = " * ".join(f"a.N_{v}" for v in out.vars) or "1"
    return Kernel(header=_header(s), imports=_imports(f, short_module), args=kernel_args(f), value_type=f.vt,
                  np_value_type=f.npvt, vector_type=f.vtype if f.widths else None,
                  buffers=(f.crd_buf, f.val_buf),
                  chunk_functions=tuple(chunk_function(f, v) for v in variants(f, short_module)),
                  c_entry=c_entry, ws_vars=tuple(out.ws_vars) if out.mode == "ws" else (),
                  chunking=_chunking(f), memset=memset, panels=_panels(f), output=_output(f),
                  fill=None if s.assignment.reduce == "sum" else reduce_identity(s.assignment.reduce, f.vt),
                  vector_bytes=f.target.vector_bytes, target=f.target.tag, sums4=_sums4(f),
                  bound_function=chunk_function(f, Variant("run_bound", bound_only=True)) if f.row_room else None,
                  # rows written straight run short loops (a union's rest of a row: a few
                  # entries), where gcc's vectorized copies cost more in set-up than they
                  # save (arrow, 3 a row: 1.09 -> 0.65 ms; 4elt, 6: 0.65 -> 0.44 ms)
                  cflags=" ".join(x for x in (
                      "-fno-tree-vectorize" if f.row_room else "",
                      REDUCTION_CFLAGS if _block_dot(f) and not f.row_room else "",
                      "" if short_module or f.row_room else _gather_dot_cflags(f),
                      EXACT_CFLAGS if s.assignment.exact else "") if x))
