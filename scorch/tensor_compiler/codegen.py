"""Printing of the loop IR (:mod:`.loop_ir`) as Cython source, and the codegen entry points.

``generate`` lowers a :class:`~scorch.tensor_compiler.schedule.Schedule` to a
:class:`~scorch.tensor_compiler.loop_ir.Kernel` (``lower``: every decision is made there)
and prints it; printing a node depends only on the node. The kernel is one loop nest, one
loop per index variable in the schedule's order. At each loop the levels bound to its
variable decide how it runs (``levels.py``), and the merge lattice (``merge_lattice.py``)
decides which coordinates it visits:

* no sparse level: ``for c in range(N)``, dense levels *locate*;
* one sparse level that the expression needs: a loop over its segment;
* several sparse levels: a two-pointer (k-pointer) merge visiting the smallest current
  coordinate, entering the body where the lattice point holds (intersection for products,
  union for sums);
* sparse levels the expression does not need (a dense term in a sum): a dense loop with
  the sparse iterators merged into it.

Each access carries a presence flag (``"1"`` when known present), so an absent access
reads as zero and its child levels see an empty segment.

Generated code layout: ``cdef struct Args`` with typed raw pointers and sizes; ``cdef
void run_chunk(...) noexcept nogil`` with the loop nest for one range of the outermost
loop; ``def kernel(list args, int nthreads)`` that casts the Python ints (``data_ptr()``
values and sizes) to the struct and runs chunks under ``prange`` when the outermost
variable is an output variable (so chunks write disjoint parts of the output).

Sparse output assembly. Each chunk appends, in loop order, every output entry to its own
growable buffers (``std::vector``: one coordinate vector per output level and one value
vector): directly (loop order concordant with the output, reductions below the last output
variable through a scalar accumulator), or by draining a per-chunk workspace in key order (a
reduction above an output variable: Gustavson SpGEMM; a one-variable workspace drains
straight into the buffers). Chunks cover increasing ranges of the outermost loop, so
concatenating the buffers in chunk order gives sorted, unique coordinate tuples, returned
level-major; ``pos``/``crd`` are then built in one vectorized O(nnz) pass
(``level_kinds.assembly.build_levels``). This needs no symbolic pass and no over-allocation bound, and
reads the inputs once; the price is one copy of the output through the buffers.
A CSR-like output written directly (no workspace: unions, intersections, selections) has a
bound pass instead (``run_bound``: the loops down to the last output level, adding up that
loop's trip-count bound, e.g. the operands' row lengths of a union) and its chunks write
their rows straight into that room through a local counter (``_rows_bound_epilogue``).
Entries are kept where the expression's operands are stored, even if the computed value is
0 (e.g. ``A - A``): computed zeros are kept, never duplicates.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

from .loop_ir import (AddTo, ArgSpec, AppendEntry, Assign, Call, ChunkFunction, DenseOutput, For, If,
                      Kernel, LevelCode, RowEnd, RowsOutput, Stmt, While)
from .lower import (CTYPES, DENSE_WS_LIMIT, ITYPES, NPTYPES, SHORT_ROWS, SHORT_ROWS_BY_DTYPE,
                    kernel_facts, lower_kernel, reads_strided, relayouts, gather_relayouts, short_rows, short_rows_limit,
                    unit_stride_accesses)
from .lower.register_tile import has_tile
from .schedule import Schedule
from .target import MIN_VECTOR_BYTES, SOURCE_TAG, value_bytes, vector_type_name

# the type tables and schedule analyses live with the lowering; the compiler reads them here
__all__ = ["generate", "print_kernel", "print_stmts", "panel_widths", "cache_panels", "tiled_widths", "reads_strided", "relayouts", "gather_relayouts",
           "short_rows", "short_rows_limit", "unit_stride_accesses", "CTYPES", "NPTYPES", "ITYPES", "ArgSpec",
           "SHORT_ROWS", "SHORT_ROWS_BY_DTYPE", "SHORT_ROWS_CFLAGS", "DENSE_WS_LIMIT", "CODEGEN_VERSION",
           "KERNEL_C_CAPSULE"]

CODEGEN_VERSION = 1

#: name of the capsule holding a kernel's C entry ``void kernel_c(const int64_t* args, int
#: nthreads, int panel)`` (``KERNEL_C`` in kernels that only write a preallocated output)
KERNEL_C_CAPSULE = "scorch.kernel_c"

_IND = "    "

#: a dense outermost loop weighed by stored entries (``Chunking.balance``) is split into
#: chunks when it has 2 iterations and this many entries below them, however few the
#: iterations (MoE's 8 experts of 256 inputs); an unweighed loop needs 64 iterations
SHORT_LOOP_MIN_ENTRIES = 1024


# ---- statements -----------------------------------------------------------------------
def print_stmts(stmts: Sequence[Stmt], ind: int, w: Callable[[str], None]) -> None:
    """Write ``stmts`` at indentation level ``ind``: each line a function of its node."""
    for st in stmts:
        _print_stmt(st, _IND * ind, ind, w)


def _print_stmt(st: Stmt, pre: str, ind: int, w) -> None:
    if isinstance(st, Assign):
        w(f"{pre}{st.target} = {st.expr}")
    elif isinstance(st, AddTo):
        w(f"{pre}{st.target} += {st.expr}")
    elif isinstance(st, Call):
        w(pre + st.code)
    elif isinstance(st, LevelCode):
        for ln in st.lines:
            w(pre + ln)
    elif isinstance(st, AppendEntry) and st.local:
        # rows assembly straight into the chunk's room (plain arrays)
        w(f"{pre}ocrd[ok] = {st.coords[-1]}")
        w(f"{pre}oval[ok] = {st.value}")
        w(f"{pre}ok += 1")
    elif isinstance(st, RowEnd):
        w(f"{pre}a.out_pos[{st.row} + 1] = ok - ob")
    elif isinstance(st, AppendEntry):
        if st.row is not None:     # rows assembly: the last coordinate, counted into pos
            w(f"{pre}deref(ocrd).push_back({st.coords[-1]})")
            w(f"{pre}deref(oval).push_back({st.value})")
            w(f"{pre}a.out_pos[{st.row} + 1] += 1")
        else:                      # one coordinate vector per output level, one value vector
            for l, c in enumerate(st.coords):
                w(f"{pre}ocrd[{l}].push_back({c})")
            w(f"{pre}deref(oval).push_back({st.value})")
    elif isinstance(st, For):
        rng = st.hi if st.lo is None else f"{st.lo}, {st.hi}"
        w(f"{pre}for {st.var} in range({rng}):")
        print_stmts(st.body, ind + 1, w)
    elif isinstance(st, While):
        w(f"{pre}while {st.cond}:")
        print_stmts(st.body, ind + 1, w)
    elif isinstance(st, If):
        w(f"{pre}if {st.cond}:")
        print_stmts(st.then, ind + 1, w)
        if st.orelse:
            w(f"{pre}else:")
            print_stmts(st.orelse, ind + 1, w)
    else:
        raise TypeError(f"not a loop IR statement: {st!r}")


# ---- the module ------------------------------------------------------------------------
def _vector_types(k: Kernel, w) -> None:
    """GCC vector types of one register of the target (``k.vector_bytes``: 64 on AVX-512,
    32 on AVX2, 16 on SSE/NEON) and of each narrower size down to 16 bytes (register rows
    narrower than a register), their zero and horizontal sum. A type wider than the
    registers is not split into registers: gcc keeps it on the stack."""
    nb = k.vector_bytes
    sizes = [b for b in (16, 32, 64) if MIN_VECTOR_BYTES <= b < nb] + [nb]
    ct, size = k.value_type, value_bytes(k.value_type)
    w("cdef extern from *:")
    w('    """')
    for b in sizes:
        v = vector_type_name(ct, b, nb)
        w(f"    typedef {ct} {v} __attribute__((vector_size({b}), aligned({size}), may_alias));")
        w(f"    static inline {v} {v}_zero(void) {{ {v} z = {{0}}; return z; }}")
        w(f"    static inline {ct} {v}_hsum({v} v) {{ {ct} s = 0; for (int i = 0; i < {b // size}; i++) s += v[i]; return s; }}")
        if v in k.sums4:
            for line in _hsum4(v, b // size, vector_type_name(ct, 4 * size, nb)):
                w(f"    {line}")
    w('    """')
    for b in sizes:
        v = vector_type_name(ct, b, nb)
        w(f"    ctypedef {ct} {v}")
        w(f"    {v} {v}_zero() noexcept nogil")
        w(f"    {ct} {v}_hsum({v}) noexcept nogil")
        if v in k.sums4:
            w(f"    {vector_type_name(ct, 4 * size, nb)} {v}_hsum4({v}, {v}, {v}, {v}) noexcept nogil")
    w("")


def _shuffle(a: str, b: str, idx) -> str:
    return f"__builtin_shufflevector({a}, {b}, {', '.join(map(str, idx))})"


def _hsum4(v: str, lanes: int, quad: str) -> List[str]:
    """C of ``<v>_hsum4(a, b, c, d)``: the four vectors' lane sums as one 4-lane ``quad``
    (``{sum a, sum b, sum c, sum d}``). Each vector is halved (low + high half) down to 8
    lanes, then pairs are folded together: 8 lanes of a and b -> 4 of a | 4 of b, then
    two such -> 2 per vector, then 1 (a transposing add: ~2 shuffles and adds per vector
    where four separate sums take 4 each)."""
    out = [f"static inline {quad} {v}_hsum4({v} a, {v} b, {v} c, {v} d) {{"]
    cur = {x: x for x in "abcd"}
    n = lanes
    while n > 8:
        h = n // 2
        for x in "abcd":
            out.append(f"    auto {x}{h} = {_shuffle(cur[x], cur[x], range(h))} + "
                       f"{_shuffle(cur[x], cur[x], range(h, n))};")
            cur[x] = f"{x}{h}"
        n = h
    a, b, c, d = (cur[x] for x in "abcd")
    if n == 8:   # 4 | 4 -> 2 2 2 2 -> 1 1 1 1
        out.append(f"    auto x = {_shuffle(a, b, [0, 1, 2, 3, 8, 9, 10, 11])} + {_shuffle(a, b, [4, 5, 6, 7, 12, 13, 14, 15])};")
        out.append(f"    auto y = {_shuffle(c, d, [0, 1, 2, 3, 8, 9, 10, 11])} + {_shuffle(c, d, [4, 5, 6, 7, 12, 13, 14, 15])};")
        out.append(f"    auto z = {_shuffle('x', 'y', [0, 1, 8, 9, 4, 5, 12, 13])} + {_shuffle('x', 'y', [2, 3, 10, 11, 6, 7, 14, 15])};")
        out.append(f"    return {_shuffle('z', 'z', [0, 4, 2, 6])} + {_shuffle('z', 'z', [1, 5, 3, 7])};")
    else:        # 4 lanes: 2 | 2 -> 1 1 1 1
        out.append(f"    auto x = {_shuffle(a, b, [0, 1, 4, 5])} + {_shuffle(a, b, [2, 3, 6, 7])};")
        out.append(f"    auto y = {_shuffle(c, d, [0, 1, 4, 5])} + {_shuffle(c, d, [2, 3, 6, 7])};")
        out.append(f"    return {_shuffle('x', 'y', [0, 2, 4, 6])} + {_shuffle('x', 'y', [1, 3, 5, 7])};")
    out.append("}")
    return out


def _chunk_return_type(k: Kernel) -> str:
    """``int64_t`` when the chunk functions return their entry counts, else ``void``."""
    return "int64_t" if isinstance(k.output, RowsOutput) and k.output.bound else "void"


def _chunk_function(k: Kernel, fn: ChunkFunction, w) -> None:
    crd, val = k.buffers
    w(f"cdef {_chunk_return_type(k)} {fn.name}(Args* pa, int64_t clo, int64_t chi, {crd}* ocrd, "
      f"{val}* oval) noexcept nogil:")
    w("    cdef Args a = pa[0]")
    for name, ct in fn.locals:
        w(f"    cdef {ct} {name}")
    print_stmts(fn.body, 1, w)
    if fn.returns is not None:
        w(f"    return {fn.returns}")
    w("")


def _run_chunks(w, fn: str, one: str, each: str, ind: str = "    ", args: str = "&a",
                into: Tuple[str, str] = ("", "")) -> None:
    """Lines that run chunk function ``fn`` over all chunks: inline for one chunk,
    else under ``prange`` (dynamic); ``one``/``each``: its buffer arguments; ``into``:
    where the one chunk's / chunk ``t``'s returned count goes."""
    one_into, each_into = (f"{x} = " if x else "" for x in into)
    w(f"{ind}if nchunks == 1:")
    w(f"{ind}    with nogil:")
    w(f"{ind}        {one_into}{fn}({args}, lo0, hi0, {one})")
    w(f"{ind}else:")
    w(f"{ind}    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    w(f"{ind}        {each_into}{fn}({args}, bounds[t], bounds[t + 1], {each})")


def _chunking(k: Kernel, w) -> None:
    """The outermost loop's range, the chunk count, the chunk variant, the boundaries."""
    c = k.chunking
    w("    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off")
    if c.kind == "dense":
        w(f"    hi0 = a.N_{c.var}")
    elif c.kind == "sparse":
        w(f"    lo0 = {c.level_pos}[0]")
        w(f"    hi0 = {c.level_pos}[1]")
    if c.kind is not None and c.balance is not None:
        # a short outer loop over many stored entries (8 experts of 256 inputs each) is
        # split too: the balance array says the iterations carry the work, not their count
        w(f"    if nthreads > 1 and hi0 - lo0 >= 2 and {c.balance}[hi0] - {c.balance}[lo0] >= {SHORT_LOOP_MIN_ENTRIES}:")
        w("        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)")
    elif c.kind is not None:
        w("    if nthreads > 1 and hi0 - lo0 >= 64:")
        w("        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)")
    if k.memset is not None and k.fill is None:
        # the output arrives uninitialized (torch.empty: cheaper than torch.zeros' dispatch)
        w(f"    memset(<void*>a.out_vals, 0, {k.memset} * sizeof({k.value_type}))")
    elif k.memset is not None:   # a max/min reduction starts from its identity
        w(f"    for t in range({k.memset}):")
        w(f"        a.out_vals[t] = {k.fill}")
    if len(k.chunk_functions) > 1:
        w("    cdef chunk_fn fn = run_chunk")
        for fn in k.chunk_functions[1:]:
            w(f"    if {fn.select}:")
            w(f"        fn = {fn.name}")
    w("    cdef int64_t bounds[1025]   # chunk boundaries (at most 1024 chunks)")
    w("    if nchunks > 1:")
    w("        for t in range(nchunks + 1):")
    w("            bounds[t] = lo0 + ((hi0 - lo0) * t) // nchunks")
    bal = c.balance
    if bal is not None:
        # equal numbers of stored entries per chunk, not equal rows: a power-law row
        # distribution would otherwise leave one thread with most of the work
        w("    cdef int64_t btot, btarget, blo, bhi, bmid")
        w("    if nchunks > 1:")
        w(f"        btot = {bal}[hi0] - {bal}[lo0]")
        w("        blo = lo0")
        w("        for t in range(1, nchunks):")
        w(f"            btarget = {bal}[lo0] + (btot * t) // nchunks")
        w("            bhi = hi0")
        w("            while blo < bhi:")
        w("                bmid = (blo + bhi) // 2")
        w(f"                if {bal}[bmid] < btarget:")
        w("                    blo = bmid + 1")
        w("                else:")
        w("                    bhi = bmid")
        w("            bounds[t] = blo")


def _panel_loop(k: Kernel, w) -> None:
    """Tiling of the innermost dense loop into panels (paper Algorithm 3; the width is
    chosen per input by ``tensor_compiler.choose_panel``): the loop nest runs once per
    panel of ``panel`` columns on shifted base pointers of the operands the loop
    streams and of the output, with the register kernel of that width; a last, narrower
    panel runs the generic chunk function."""
    p = k.panels
    L = p.var
    if p.cache:
        _cache_panel_loop(k, w)
        return
    w("    cdef Args b")
    w("    cdef int64_t pp, pw")
    w("    cdef chunk_fn pfn")
    w(f"    if panel > 0 and panel < a.N_{L} and panel in {tuple(p.widths)!r}:")
    w("        pfn = run_chunk")
    for W in p.widths:
        w(f"        if panel == {W}:")
        w(f"            pfn = run_chunk_w{W}")
    w("        pp = 0")
    w(f"        while pp < a.N_{L}:")   # a C loop (a range with a run-time step is not)
    w(f"            pw = min(panel, a.N_{L} - pp)")
    w("            b = a")
    w(f"            b.N_{L} = pw")
    for f in p.shifted:
        w(f"            b.{f} = a.{f} + pp")
    w("            fn = pfn if pw == panel else run_chunk")
    _run_chunks(w, "fn", "NULL, NULL", "NULL, NULL", " " * 12, "&b")
    w("            pp += panel")
    w("        return")


def _cache_panel_loop(k: Kernel, w) -> None:
    """Cache blocking (``schedule.CacheTile``): the loop nest runs once per panel of
    ``panel`` columns on shifted base pointers (the register kernel of that width; a last,
    narrower panel the generic chunk function), so the block the sparse loop re-reads stays in cache; the
    panels write disjoint columns of the output and run under ``prange`` when the nest
    below is one chunk."""
    p = k.panels
    L = p.var
    w("    cdef Args* pargs")
    w("    cdef chunk_fn* pfns")
    w("    cdef int64_t npan, pi")
    w(f"    if panel > 0 and panel < a.N_{L}:")
    w(f"        npan = (a.N_{L} + panel - 1) // panel")
    w("        pargs = <Args*>malloc(npan * sizeof(Args))")
    w("        pfns = <chunk_fn*>malloc(npan * sizeof(chunk_fn))")
    w("        for pi in range(npan):")
    w("            pargs[pi] = a")
    w(f"            pargs[pi].N_{L} = min(panel, a.N_{L} - pi * panel)")
    for f in p.shifted:
        w(f"            pargs[pi].{f} = a.{f} + pi * panel")
    w("            pfns[pi] = run_chunk")
    for W in p.widths:   # a full panel of a register width runs that width's kernel
        w(f"            if pargs[pi].N_{L} == {W}:")
        w(f"                pfns[pi] = run_chunk_w{W}")
    if p.parallel:
        w("        if nthreads > 1 and npan > 1:")
        w("            for pi in prange(npan, nogil=True, schedule='dynamic', num_threads=nthreads):")
        w("                pfns[pi](&pargs[pi], lo0, hi0, NULL, NULL)")
        w("        else:")
        w("            for pi in range(npan):")
        w("                pfns[pi](&pargs[pi], lo0, hi0, NULL, NULL)")
    else:
        w("        for pi in range(npan):")
        _run_chunks(w, "pfns[pi]", "NULL, NULL", "NULL, NULL", " " * 12, "&pargs[pi]")
    w("        free(pfns)")
    w("        free(pargs)")
    w("        return")


def _tuples_epilogue(k: Kernel, w, fn: str) -> None:
    """Run the chunks, then concatenate their coordinate tuples (level-major) and values."""
    if isinstance(k.output, DenseOutput):
        # nothing is appended: no buffers (their allocation showed in small kernels)
        if k.panels is not None:
            _panel_loop(k, w)
        _run_chunks(w, fn, "NULL, NULL", "NULL, NULL")
        w("    return")
        return
    R, vt = k.output.levels, k.value_type
    w("    cdef vector[vector[int64_t]] crds")
    w(f"    cdef vector[vector[{vt}]] vals")
    w(f"    crds.resize(nchunks * {R})")
    w("    vals.resize(nchunks)")
    _run_chunks(w, fn, "&crds[0], &vals[0]", f"&crds[t * {R}], &vals[t]")
    w("    total = 0")
    w("    for t in range(nchunks):")
    w("        total += vals[t].size()")
    w(f"    crd_arr = np.empty({R} * total, dtype=np.int64)  # level-major: row l = level l")
    w(f"    val_arr = np.empty(total, dtype=np.{k.np_value_type})")
    w("    cdef size_t cp = _addr(crd_arr), vp = _addr(val_arr)")
    w("    cdef int64_t l")
    w("    off = 0")
    w("    for t in range(nchunks):")
    w("        n = vals[t].size()")
    w("        if n:")
    w(f"            for l in range({R}):")
    w(f"                memcpy(<void*>(cp + (l * total + off) * sizeof(int64_t)), crds[t * {R} + l].data(), n * sizeof(int64_t))")
    w(f"            memcpy(<void*>(vp + off * sizeof({vt})), vals[t].data(), n * sizeof({vt}))")
    w("        off += n")
    w("    return crd_arr, val_arr")


def _rows_epilogue(k: Kernel, w, fn: str) -> None:
    """Run the chunks (each counts its rows' entries into ``out_pos[row + 1]`` and appends
    the entries to its own buffers), prefix-sum the counts into ``pos``, and copy the
    buffers, in chunk order, into the output arrays in parallel. Returns ``(pos, crd,
    vals)`` in the output's index type (int32 unless a count or extent needs int64)."""
    o: RowsOutput = k.output
    _rows_counts(o, w)
    w(f"    cdef vector[{k.buffers[0]}] crds")
    w(f"    cdef vector[{k.buffers[1]}] vals")
    w("    crds.resize(nchunks)")
    w("    vals.resize(nchunks)")
    _run_chunks(w, fn, "&crds[0], &vals[0]", "&crds[t], &vals[t]")
    w("    cdef int64_t* pp = a.out_pos")
    w("    with nogil:")
    w("        for t in range(P):")
    w("            pp[t + 1] += pp[t]")
    w("    total = pp[P]")
    w("    cdef vector[int64_t] offs")
    w("    offs.resize(nchunks + 1)")
    w("    offs[0] = 0")
    w("    for t in range(nchunks):")
    w("        offs[t + 1] = offs[t] + vals[t].size()")
    w("    if offs[nchunks] != total:")
    w("        raise RuntimeError('scorch kernel: row counts and appended entries disagree')")
    w(f"    cdef bint wide = max(total, P, {', '.join(f'a.N_{v}' for v in o.level_vars)}) > 2147483647")
    it, vt = o.index_type, k.value_type
    # one chunk in the output's index type: its buffers are the output (POOLED_DECL)
    w("    cdef size_t nbytes")
    w("    cdef void* block")
    w(f"    if nchunks == 1 and total > 0 and wide == {it == 'int64_t'}:")
    w("        block = crds[0].release(&nbytes)   # (C leaves argument order open)")
    w(f"        crd_arr = _pooled(block, nbytes, total, sizeof({it}), '{'<i8' if it == 'int64_t' else '<i4'}')")
    w("        block = vals[0].release(&nbytes)")
    w(f"        val_arr = _pooled(block, nbytes, total, sizeof({vt}), '{np.dtype(k.np_value_type).str}')")
    w(f"        return pos_arr{'' if it == 'int64_t' else '.astype(np.int32)'}, crd_arr, val_arr")
    _gather_chunks(k, w, "vals[t].size()", "crds[t].data()", "vals[t].data()")
    w("    return (pos_arr if wide else pos_arr.astype(np.int32)), crd_arr, val_arr")


def _gather_chunks(k: Kernel, w, count: str, crd_src: str, val_src: str) -> None:
    """Copy every chunk's ``count`` entries (``crd_src`` / ``val_src``: its coordinates and
    values, expressions in ``t``), in chunk order and in parallel, into output arrays of
    the exact size (``total`` entries at offsets ``offs``), the coordinates in the output's
    index type (``wide``: int64; a plain memcpy where the chunk's type is that one)."""
    it, vt = k.output.index_type, k.value_type
    w("    crd_arr = np.empty(total, dtype=np.int64 if wide else np.int32)")
    w(f"    val_arr = np.empty(total, dtype=np.{k.np_value_type})")
    w("    cdef size_t cp = _addr(crd_arr), vp = _addr(val_arr)")
    w("    cdef int64_t e")
    w("    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    w(f"        n = {count}")
    w("        if n:")
    w(f"            memcpy(<void*>(vp + offs[t] * sizeof({vt})), {val_src}, n * sizeof({vt}))")
    if it == "int32_t":
        w("            if wide:")
        w("                for e in range(n):")
        w(f"                    (<int64_t*>cp)[offs[t] + e] = {crd_src}[e]")
        w("            else:")
        w(f"                memcpy(<void*>(cp + offs[t] * sizeof(int32_t)), {crd_src}, n * sizeof(int32_t))")
    else:
        w("            if wide:")
        w(f"                memcpy(<void*>(cp + offs[t] * sizeof(int64_t)), {crd_src}, n * sizeof(int64_t))")
        w("            else:")
        w("                for e in range(n):")
        w(f"                    (<int32_t*>cp)[offs[t] + e] = <int32_t>{crd_src}[e]")


def _rows_bound_epilogue(k: Kernel, w, fn: str) -> None:
    """Rows assembly with a bound pass: ``run_bound`` adds up each chunk's upper bound of
    entries (the trip counts of the loop over the last level: for a union, the operands'
    row lengths), the chunks write their rows straight into that room (no growable
    buffers) and return their counts; ``pos`` is prefix-summed. One chunk in the output's
    index type: the room is the output (a view of its first ``total`` entries, copied when
    it is less than half used); else the chunks' entries are copied, in parallel, into
    arrays of the exact size."""
    o: RowsOutput = k.output
    it, vt = o.index_type, k.value_type
    np_it = "np.int32" if it == "int32_t" else "np.int64"
    _rows_counts(o, w)
    w("    cdef vector[int64_t] room, counts")
    w("    room.resize(nchunks + 1)")
    w("    counts.resize(nchunks)")
    _run_chunks(w, "run_bound", "NULL, NULL", "NULL, NULL", into=("room[1]", "room[t + 1]"))
    w("    room[0] = 0")
    w("    for t in range(nchunks):")
    w("        room[t + 1] += room[t]")
    w(f"    buf_crd = np.empty(room[nchunks], dtype={np_it})")
    w(f"    buf_val = np.empty(room[nchunks], dtype=np.{k.np_value_type})")
    w(f"    cdef {it}* bc = <{it}*><size_t>_addr(buf_crd)")
    w(f"    cdef {vt}* bv = <{vt}*><size_t>_addr(buf_val)")
    _run_chunks(w, fn, "bc, bv", "bc + room[t], bv + room[t]", into=("counts[0]", "counts[t]"))
    w("    cdef vector[int64_t] offs")
    w("    offs.resize(nchunks + 1)")
    w("    offs[0] = 0")
    w("    for t in range(nchunks):")
    w("        offs[t + 1] = offs[t] + counts[t]")
    w("    total = offs[nchunks]")
    w(f"    cdef bint wide = max(total, P, {', '.join(f'a.N_{v}' for v in o.level_vars)}) > 2147483647")
    # the rows' counts prefix-summed straight into pos in its index type (one pass)
    w("    cdef int64_t* pp = a.out_pos")
    w("    cdef int32_t* p32")
    w("    cdef int64_t run = 0")
    w("    if wide:")
    w("        with nogil:")
    w("            for t in range(P):")
    w("                pp[t + 1] += pp[t]")
    w("        run = pp[P]")
    w("    else:")
    w("        pos32 = np.empty(P + 1, dtype=np.int32)")
    w("        p32 = <int32_t*><size_t>_addr(pos32)")
    w("        with nogil:")
    w("            p32[0] = 0")
    w("            for t in range(P):")
    w("                run += pp[t + 1]")
    w("                p32[t + 1] = <int32_t>run")
    w("        pos_arr = pos32")
    w("    if run != total:")
    w("        raise RuntimeError('scorch kernel: row counts and written entries disagree')")
    w(f"    if nchunks == 1 and wide == {it == 'int64_t'}:")
    w("        if 2 * total < room[1]:")
    w("            buf_crd, buf_val = buf_crd[:total].copy(), buf_val[:total].copy()")
    w("        return pos_arr, buf_crd[:total], buf_val[:total]")
    _gather_chunks(k, w, "counts[t]", "(bc + room[t])", "bv + room[t]")
    w("    return pos_arr, crd_arr, val_arr")


def _rows_counts(o: RowsOutput, w) -> None:
    """The rows epilogues' start: int32 coordinates that cannot hold the last dimension's
    extent raise; ``P`` rows and their counts array ``pos_arr`` (int64, zeroed), which the
    chunks fill through ``a.out_pos``."""
    if o.index_type == "int32_t":
        w(f"    if a.N_{o.last} > 2147483647:")
        w(f"        raise OverflowError('output dimension {o.last} ({{}}) does not fit the int32 "
          f"coordinates of this kernel'.format(a.N_{o.last}))")
    P = " * ".join(f"a.N_{v}" for v in o.dense_vars)
    w(f"    cdef int64_t P = {P}")
    w("    pos_arr = np.zeros(P + 1, dtype=np.int64)")
    w("    a.out_pos = <int64_t*><size_t>_addr(pos_arr)")


def _c_entry(k: Kernel, w) -> None:
    """The Python ``kernel`` over ``kernel_c`` and the ``KERNEL_C`` capsule."""
    n = len(k.args)
    w("def kernel(list args, int nthreads, int panel=0):")
    w(f"    cdef int64_t values[{n}]")
    w("    cdef int i")
    w(f"    for i in range({n}):")
    w("        values[i] = args[i]")
    w("    with nogil:")
    w("        kernel_c(values, nthreads, panel)")
    w("    return None")
    w("")
    w("cdef extern from \"Python.h\":")
    w("    object PyCapsule_New(void*, const char*, void*)")
    w("")
    w(f"KERNEL_C = PyCapsule_New(<void*>kernel_c, b\"{KERNEL_C_CAPSULE}\", NULL)")
    w("")


def print_kernel(k: Kernel) -> str:
    """The Cython module of kernel ``k``."""
    src: List[str] = []
    w = src.append
    w("# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True")
    w("# distutils: language = c++")
    w(f"# scorch generated kernel (codegen v{CODEGEN_VERSION})")
    if k.cflags:
        w(f"# scorch-cflags: {k.cflags}")
    if k.target:   # built for a chosen target (its flags: build.py), part of the cache key
        w(f"{SOURCE_TAG}{k.target}")
    for line in k.header:
        w(f"# {line}")
    for line in k.imports:
        w(line)
    w("")
    w("cdef struct Args:")
    for name, ct, _ in k.args:
        w(f"    {ct} {name}")
    rows = isinstance(k.output, RowsOutput)
    if rows:
        w("    int64_t* out_pos   # row counts, then (prefix sum) the compressed level's pos")
    w("")
    if k.vector_type is not None:
        _vector_types(k, w)
    fns = k.chunk_functions
    if len(fns) > 1:
        w(f"ctypedef {_chunk_return_type(k)} (*chunk_fn)(Args*, int64_t, int64_t, {k.buffers[0]}*, "
          f"{k.buffers[1]}*) noexcept nogil")
        w("")
    for fn in fns:
        _chunk_function(k, fn, w)
    if k.bound_function is not None:
        _chunk_function(k, k.bound_function, w)
    if k.c_entry:
        # the body runs without the GIL; ``kernel`` (Python) and ``KERNEL_C`` (a capsule
        # for the C fast path, ``scorch/_runtime/fastcall.cpp``) both call it
        w("cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:")
    else:
        w("def kernel(list args, int nthreads, int panel=0):")
    w("    cdef Args a")
    for n, (name, ct, _) in enumerate(k.args):
        cast = f"<{ct}><size_t>args[{n}]" if ct.endswith("*") else f"args[{n}]"
        w(f"    a.{name} = {cast}")
    if k.ws_vars:
        prod = " * ".join(f"<object>a.N_{v}" for v in k.ws_vars)
        w(f"    if {prod} >= 4611686018427387904:")
        w(f"        raise OverflowError('workspace over {','.join(k.ws_vars)} is too large to index with int64')")
    _chunking(k, w)
    fn = "fn" if len(fns) > 1 else "run_chunk"
    if rows and k.output.bound:
        _rows_bound_epilogue(k, w, fn)
    elif rows:
        _rows_epilogue(k, w, fn)
    else:
        _tuples_epilogue(k, w, fn)
    w("")
    if k.c_entry:
        _c_entry(k, w)
    return "\n".join(src)


# ---- public entry points ---------------------------------------------------------------
def panel_widths(s: Schedule, value_dtype: torch.dtype) -> Tuple[int, ...]:
    """The panel widths a kernel for ``s`` accepts (empty: no tiling)."""
    if value_dtype not in (torch.float32, torch.float64) or not s.loop_order:
        return ()
    return kernel_facts(s, value_dtype, {}).panels


#: the short-rows variant's flags: no loop vectorization, and loops aligned to 32 bytes. A row
#: loop of a few entries is a 7-instruction, ~28-byte loop entered once per row; where gcc's
#: default 16-byte alignment lets it straddle a 32/64-byte fetch window, every iteration
#: fetches twice (measured under load, one process, CPU time, same machine code otherwise:
#: bcspwr10 15.8 -> 12.9 us, 4elt 95 -> 53 us; benchmarks/report_kernels.py --kernels spmv)
SHORT_ROWS_CFLAGS = "-fno-tree-vectorize -falign-loops=32"


def cache_panels(s: Schedule, value_dtype: torch.dtype) -> bool:
    """Whether a kernel for ``s`` runs its cache tile (``schedule.CacheTile``) in panels."""
    return kernel_facts(s, value_dtype, {}).cache_panels


def tiled_widths(s: Schedule, value_dtype: torch.dtype) -> Tuple[int, ...]:
    """The register widths whose chunk function of the kernel for ``s`` runs a register tile
    (``lower/register_tile``): a panel of such a width feeds several rows from each load
    (``tiling.choose_cache_panel`` prefers them)."""
    k = lower_kernel(s, value_dtype, {ap.id: torch.int64 for ap in s.accesses if ap.sparse})
    return tuple(sorted(fn.width for fn in k.chunk_functions
                        if fn.width is not None and has_tile(fn.body)))


def generate(s: Schedule, value_dtype: torch.dtype, index_dtypes: Dict[int, torch.dtype],
             scalar_inner: bool = False):
    """Cython source of the kernel and its argument list (field, C type, meaning).
    ``scalar_inner``: the short-rows variant (see :func:`short_rows`), built without loop
    vectorization and with aligned loops (``SHORT_ROWS_CFLAGS``), with a stream variant for
    streams larger than the cache (``lower/stream_rows.py``)."""
    k = lower_kernel(s, value_dtype, index_dtypes, short_module=scalar_inner)
    src = print_kernel(k)
    if scalar_inner:
        lines = src.split("\n")
        lines.insert(2, f"# scorch-cflags: {SHORT_ROWS_CFLAGS}")
        lines.insert(3, f"# short-rows variant: segments of <= {short_rows_limit(value_dtype)} "
                        f"entries on average")
        src = "\n".join(lines)
    return src, list(k.args)
