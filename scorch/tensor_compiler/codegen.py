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
loop; an entry without the GIL or any Python object that fills the struct from an ``int64``
argument array and runs chunks under ``prange`` when the outermost variable is an output
variable (so chunks write disjoint parts of the output): ``kernel_c`` for a dense or
in-place output, ``kernel_result_c`` for a sparse one (it hands the output's arrays over in
a ``KernelResult``, ``scorch/_runtime/kernel_result.h``); and ``def kernel(list args, int
nthreads, panel=0)`` over it (``cxx_module`` prints the same entries as plain C++).

Sparse output assembly. Each chunk appends, in loop order, every output entry to its own
growable buffers (``AppendBuffer``: one coordinate buffer per output level and one value
buffer): directly (loop order concordant with the output, reductions below the last output
variable through a scalar accumulator), or by draining a per-chunk workspace in key order (a
reduction above an output variable: Gustavson SpGEMM; a one-variable workspace drains
straight into the buffers). Chunks cover increasing ranges of the outermost loop, so
concatenating the buffers in chunk order gives sorted, unique coordinate tuples, returned
level-major in the output's index type: one chunk's buffers become the output in place
(``result_join_level``: no copy beside them), several are gathered into it (CSR-like
outputs: into chunk 0's blocks, grown in place, each other chunk's given back once copied,
``_gather_into_first_chunk``). A chain of
compressed levels (DCSR, CSF) has its upper levels built in the kernel from there
(``result_chain_levels``); other formats' ``pos``/``crd`` are built in one vectorized
O(nnz) pass (``level_kinds.assembly.build_levels``). This needs no symbolic pass and no
over-allocation bound, and reads the inputs once.
A CSR-like output written directly (no workspace: unions, intersections, selections) has a
bound pass instead (``run_bound``: the loops down to the last output level, adding up that
loop's trip-count bound, e.g. the operands' row lengths of a union) and its chunks write
their rows straight into that room through a local counter (``_rows_bound_epilogue``).
Entries are kept where the expression's operands are stored, even if the computed value is
0 (e.g. ``A - A``): computed zeros are kept, never duplicates.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import torch

from .loop_ir import (AddTo, ArgSpec, AppendEntry, Assign, Call, ChunkFunction, DenseOutput, For, If,
                      Kernel, LevelCode, RowEnd, RowsOutput, Stmt, TuplesOutput, While)
from .lower import (CTYPES, DENSE_WS_LIMIT, ITYPES, NPTYPES, SHORT_ROWS, SHORT_ROWS_BY_DTYPE,
                    kernel_facts, lower_kernel, reads_strided, relayouts, order_relayouts, gather_relayouts, short_rows, short_rows_limit,
                    unit_stride_accesses)
from .lower.register_tile import has_tile
from .canonical import caller_args, canonical_schedule
from .schedule import Schedule
from ..level_kinds.assembly import segment_chain
from .target import MIN_VECTOR_BYTES, SOURCE_TAG, value_bytes, vector_type_name

# the type tables and schedule analyses live with the lowering; the compiler reads them here
__all__ = ["generate", "kernel_source", "print_kernel", "print_stmts", "panel_widths", "cache_panels", "tiled_widths", "reads_strided", "relayouts", "order_relayouts", "gather_relayouts",
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
                into: Tuple[str, str] = ("", ""), choices: Sequence[str] = ()) -> None:
    """Lines that run chunk function ``fn`` over all chunks: inline for one chunk,
    else under ``prange`` (dynamic); ``one``/``each``: its buffer arguments; ``into``:
    where the one chunk's / chunk ``t``'s returned count goes; ``choices``: the chunk
    functions ``fn`` may hold (each then called by name, see ``_call``)."""
    one_into, each_into = (f"{x} = " if x else "" for x in into)
    w(f"{ind}if nchunks == 1:")
    w(f"{ind}    with nogil:")
    _direct_calls(w, f"{ind}        ", fn, choices, f"{args}, lo0, hi0, {one}", one_into)
    w(f"{ind}else:")
    w(f"{ind}    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    _direct_calls(w, f"{ind}        ", fn, choices, f"{args}, bounds[t], bounds[t + 1], {each}", each_into)


def _direct_calls(w, ind: str, fn: str, choices: Sequence[str], call: str, into: str) -> None:
    """``into fn(call)``; where ``fn`` holds one of ``choices`` (the kernel's chunk
    variants), each named in its own branch: a direct call gcc can inline. (Session 19 read
    the SpMV row loop's 21 -> 7.8 us on bcspwr10 as the inlining's gain; session 20 saw the
    same loop flip between the two speeds with unrelated changes elsewhere in the kernel,
    inlined or not, so that loop now lives out of line in the runtime: ``gather_rows``.)"""
    if not choices:
        w(f"{ind}{into}{fn}({call})")
        return
    for n, name in enumerate(choices):
        w(f"{ind}{'if' if n == 0 else 'elif'} {fn} == {name}:")
        w(f"{ind}    {into}{name}({call})")
    w(f"{ind}else:")
    w(f"{ind}    {into}{fn}({call})")


def _variants_of(k: Kernel, fn: str) -> Tuple[str, ...]:
    """The chunk functions variable ``fn`` chooses among (none when it names one)."""
    return tuple(f.name for f in k.chunk_functions) if fn == "fn" else ()


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


def _panel_loop(k: Kernel, w, ret: str) -> None:
    """Tiling of the innermost dense loop into panels (paper Algorithm 3; the width is
    chosen per input by ``tensor_compiler.choose_panel``): the loop nest runs once per
    panel of ``panel`` columns on shifted base pointers of the operands the loop
    streams and of the output, with the register kernel of that width; a last, narrower
    panel runs the generic chunk function."""
    p = k.panels
    L = p.var
    if p.cache:
        _cache_panel_loop(k, w, ret)
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


def _cache_panel_loop(k: Kernel, w, ret: str) -> None:
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
    w(f"        return{ret}")


#: the C result kinds (``kernel_result.h``) of the value types
_RESULT_KINDS = {"float": "RESULT_FLOAT", "double": "RESULT_FLOAT", "uint8_t": "RESULT_UINT"}


def _result_kind(ct: str) -> str:
    return _RESULT_KINDS.get(ct, "RESULT_INT")


def _set_array(w, ind: str, i: int, data: str, n: str, ct: str, nbytes: str = "",
               give: str = "result_free") -> None:
    """Array ``i`` of the result: ``n`` values of C type ``ct`` at ``data``."""
    w(f"{ind}result_array(res, {i}, {data}, {n}, {_result_kind(ct)}, sizeof({ct}), "
      f"{nbytes or f'({n}) * sizeof({ct})'}, {give})")


def _no_memory(w, ind: str, test: str, what: str, count: str, free: Sequence[str] = ()) -> None:
    """Where ``test`` holds, free the blocks ``free`` (the result owns none of them) and
    return the error ``MemoryError`` raises."""
    w(f"{ind}if {test}:")
    for p in free:
        w(f"{ind}    result_free({p}, 0)")
    w(f'{ind}    return result_error(res, RESULT_NOMEM, b"out of memory for the %lld {what} of the output", {count})')


def _tuples_epilogue(k: Kernel, w, fn: str, ret: str, chain: bool = False) -> None:
    """Run the chunks, then concatenate their coordinate tuples (level-major, in the output's
    index type) and values; ``chain``: the output is a chain of compressed levels (DCSR,
    CSF), whose levels but the last are built here (``result_chain_levels``: a third
    array), the first array holding only the last level's coordinates."""
    if isinstance(k.output, DenseOutput):
        # nothing is appended: no buffers (their allocation showed in small kernels)
        if k.panels is not None:
            _panel_loop(k, w, ret)
        _run_chunks(w, fn, "NULL, NULL", "NULL, NULL", choices=_variants_of(k, fn))
        w(f"    return{ret}")
        return
    R, vt = k.output.levels, k.value_type
    ct = k.buffers[0][len("AppendBuffer["):-1]     # the chunks' coordinate type
    extents = [f"a.{name}" for name, _, _ in k.args if name.startswith("N_")]
    if ct == "int32_t" and extents:   # int32 coordinates cannot hold a larger extent
        w(f"    if max({', '.join(extents + ['0'])}) > 2147483647:")
        w('        return result_error(res, RESULT_OVERFLOW, b"a loop extent does not fit the int32 '
          'coordinates of this kernel%.0lld", 0)')
    w(f"    cdef ChunkBuffers[{k.buffers[0]}] crds")
    w(f"    cdef ChunkBuffers[{k.buffers[1]}] vals")
    w(f"    crds.allocate(nchunks * {R})")
    w("    vals.allocate(nchunks)")
    _sharing_failure(w, R)
    _run_chunks(w, fn, "&crds[0], &vals[0]", f"&crds[t * {R}], &vals[t]", choices=_variants_of(k, fn))
    _buffers_failed(w)
    w("    cdef vector[int64_t] offs")
    w("    offs.resize(nchunks + 1)")
    w("    offs[0] = 0")
    w("    for t in range(nchunks):")
    w("        offs[t + 1] = offs[t] + vals[t].size()")
    w("    total = offs[nchunks]")
    # level-major coordinates (row l = level l) in the output's index type: int64 only
    # where a count or an extent needs it (assemble's index_dtype_for; every loop's extent
    # is checked, the output's among them: a wider one costs only assemble's conversion)
    w(f"    cdef bint wide = max({', '.join(['total'] + extents)}) > 2147483647")
    w("    cdef int64_t isz = 8 if wide else 4")
    w("    cdef size_t nbytes")
    w("    cdef int l")
    w("    cdef void* cp")
    w(f"    cdef {vt}* vp")
    w("    if nchunks == 1 and total > 0:")
    # one chunk: its buffers become the output, converted and resized in place (no copy
    # of the output beside them)
    w("        cp = NULL")
    w(f"        for l in range({R}):")
    w(f"            cp = result_join_level(cp, crds[l].release(&nbytes), l, {R}, total, wide)")
    w(f"        vp = <{vt}*>result_resize(vals[0].release(&nbytes), total * sizeof({vt}))")
    w("    else:")
    w(f"        cp = result_alloc({R} * total * isz)")
    w(f"        vp = <{vt}*>result_alloc(total * sizeof({vt}))")
    w("        if cp != NULL and vp != NULL:")
    w("            for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    w(f"                memcpy(vp + offs[t], vals[t].data(), vals[t].size() * sizeof({vt}))")
    for l in range(R):   # unrolled: a prange body that writes no local (cxx_module)
        w(f"                result_put_coords(vals[t].size(), {l} * total + offs[t], crds[t * {R} + {l}].data(), cp, wide)")
    # each chunk's blocks back once copied: the output is not held twice while gathered
    for l in range(R):
        w(f"                crds[t * {R} + {l}].give_back()")
    w("                vals[t].give_back()")
    w(f"    result_array(res, 0, cp, {R} * total, RESULT_INT, isz, {R} * total * isz, result_free)")
    _set_array(w, "    ", 1, "vp", "total", vt)
    _no_memory(w, "    ", "cp == NULL or vp == NULL", "entries", "total")
    if chain:
        w("    cdef int64_t nup = 0")
        w("    cdef void* up")
        w("    if wide:")
        w(f"        up = result_chain_levels(<int64_t*>cp, {R}, total, &nup)")
        w("    else:")
        w(f"        up = result_chain_levels(<int32_t*>cp, {R}, total, &nup)")
        w("    result_array(res, 2, up, nup, RESULT_INT, isz, nup * isz, result_free)")
        _no_memory(w, "    ", "up == NULL", "levels", "total")
        w("    cp = result_resize(cp, total * isz)   # the last level's coordinates")
        w("    result_array(res, 0, cp, total, RESULT_INT, isz, total * isz, result_free)")
        _no_memory(w, "    ", "cp == NULL", "entries", "total")
    w("    return RESULT_OK")


def _rows_epilogue(k: Kernel, w, fn: str) -> None:
    """Run the chunks (each counts its rows' entries into ``out_pos[row + 1]`` and appends
    the entries to its own buffers), prefix-sum the counts into ``pos``, and copy the
    buffers, in chunk order, into the output arrays in parallel. The result is ``(pos,
    crd, vals)`` in the output's index type (int32 unless a count or extent needs int64);
    one chunk in that type hands its buffers over as the output (no copy)."""
    o: RowsOutput = k.output
    _rows_counts(o, w)
    w(f"    cdef ChunkBuffers[{k.buffers[0]}] crds")
    w(f"    cdef ChunkBuffers[{k.buffers[1]}] vals")
    w("    crds.allocate(nchunks)")
    w("    vals.allocate(nchunks)")
    _sharing_failure(w, 1)
    _run_chunks(w, fn, "&crds[0], &vals[0]", "&crds[t], &vals[t]", choices=_variants_of(k, fn))
    _buffers_failed(w)
    _offsets_and_pos(o, w, "vals[t].size()", "appended")
    it, vt = o.index_type, k.value_type
    w("    cdef size_t nbytes")
    w("    cdef void* block")
    w(f"    if nchunks == 1 and total > 0 and wide == {it == 'int64_t'}:")
    w("        block = crds[0].release(&nbytes)   # (C leaves argument order open)")
    w(f"        result_hand_over(res, 1, block, nbytes, total, RESULT_INT, sizeof({it}), pool_give)")
    w("        block = vals[0].release(&nbytes)")
    w(f"        result_hand_over(res, 2, block, nbytes, total, {_result_kind(vt)}, sizeof({vt}), pool_give)")
    w("        return RESULT_OK")
    _gather_into_first_chunk(k, w)
    _gather_chunks(k, w, "vals[t].size()", "crds[t].data()", "vals[t].data()")
    _set_gathered(k, w)
    w("    return RESULT_OK")


def _sharing_failure(w, R: int) -> None:
    """Every output buffer of the call (``R`` coordinate buffers and one value buffer a
    chunk) records a failed allocation in the call's flag (``result_failure_flag``), not
    the module's: a call in another Python thread neither sees it nor clears it."""
    w("    for t in range(nchunks):")
    w("        vals[t].report_failure_to(result_failure_flag(res))")
    for l in range(R):
        w(f"        crds[t * {R} + {l}].report_failure_to(result_failure_flag(res))")


def _buffers_failed(w) -> None:
    """An output buffer of this call that could not grow (``AppendBuffer``, ``workspace.h``)
    lost the chunks' entries: no buffer is read, and the call raises MemoryError."""
    w("    if result_failed(res):")
    w('        return result_error(res, RESULT_NOMEM, b"out of memory while the kernel appended '
      'its output entries: the result does not fit in memory%.0lld", 0)')


def _offsets_and_pos(o: RowsOutput, w, count: str, verb: str) -> None:
    """Each chunk's offset in the output (``offs``; ``count``: its entries, an expression in
    ``t``), ``total``, ``wide`` (the output needs int64 coordinates: a count or an extent over
    int32), and ``pos``: the rows' counts prefix-summed in one pass, as int32 in place unless
    ``wide``; a sum that disagrees with the chunks' entries is an error."""
    w("    cdef vector[int64_t] offs")
    w("    offs.resize(nchunks + 1)")
    w("    offs[0] = 0")
    w("    for t in range(nchunks):")
    w(f"        offs[t + 1] = offs[t] + {count}")
    w("    total = offs[nchunks]")
    w(f"    cdef bint wide = max(total, P, {', '.join(f'a.N_{v}' for v in o.level_vars)}) > 2147483647")
    w("    if result_pos(pp, P, not wide) != total:")
    w(f'        return result_error(res, RESULT_RUNTIME, b"scorch kernel: row counts and {verb} entries disagree", 0)')
    w("    if not wide:")
    w("        result_array(res, 0, pp, P + 1, RESULT_INT, sizeof(int32_t), (P + 1) * sizeof(int64_t), result_free)")


def _gather_into_first_chunk(k: Kernel, w) -> None:
    """Several chunks whose buffers hold the output's index type: chunk 0's blocks, grown
    in place to ``total`` entries (``result_resize``: remapped, not copied), become the
    output, and every other chunk is copied in after it, in parallel, its blocks given
    back as soon as they are copied. The output is then never held twice (gathered into
    fresh arrays beside the chunks' buffers, A @ A^T on 2 threads peaked at 2.1-2.3x its
    size; this way at about 1x plus what the block pool keeps)."""
    o: RowsOutput = k.output
    it, vt = o.index_type, k.value_type
    w(f"    cdef {it}* gc")
    w(f"    cdef {vt}* gv")
    w(f"    if total > 0 and wide == {it == 'int64_t'}:")
    w(f"        gc = <{it}*>result_resize(crds[0].release(&nbytes), total * sizeof({it}))")
    w(f"        gv = <{vt}*>result_resize(vals[0].release(&nbytes), total * sizeof({vt}))")
    _no_memory(w, "        ", "gc == NULL or gv == NULL", "entries", "total", free=("gc", "gv"))
    w("        for t in prange(1, nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    w("            result_gather(offs[t + 1] - offs[t], offs[t], crds[t].data(), vals[t].data(), gc, gv, wide)")
    w("            crds[t].give_back()")
    w("            vals[t].give_back()")
    _set_array(w, "        ", 1, "gc", "total", it)
    _set_array(w, "        ", 2, "gv", "total", vt)
    w("        return RESULT_OK")


def _gather_chunks(k: Kernel, w, count: str, crd_src: str, val_src: str, drop: bool = False) -> None:
    """Copy every chunk's ``count`` entries (``crd_src`` / ``val_src``: its coordinates and
    values, expressions in ``t``), in chunk order and in parallel, into output arrays of
    the exact size (``total`` entries at offsets ``offs``), the coordinates in the output's
    index type (``wide``: int64; a plain memcpy where the chunk's type is that one).
    ``drop``: the pages of each chunk's source go back to the system once it is copied
    (``result_drop_range``), so the output is not held twice while it is gathered (a CSR
    union on 2 threads peaked at 2x: the room its chunks wrote into, and the copy)."""
    vt = k.value_type
    w("    cdef int64_t isz = 8 if wide else 4")
    w("    cdef void* cp = result_alloc(total * isz)")
    w(f"    cdef {vt}* vp = <{vt}*>result_alloc(total * sizeof({vt}))")
    _no_memory(w, "    ", "cp == NULL or vp == NULL", "entries", "total", free=("cp", "vp"))
    w("    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
    w(f"        result_gather({count}, offs[t], {crd_src}, {val_src}, cp, vp, wide)")
    if drop:
        it = k.output.index_type
        w(f"        result_drop_range({crd_src}, {count} * sizeof({it}))")
        w(f"        result_drop_range({val_src}, {count} * sizeof({vt}))")


def _set_gathered(k: Kernel, w) -> None:
    """The gathered arrays become the result's coordinates and values."""
    w("    result_array(res, 1, cp, total, RESULT_INT, isz, total * isz, result_free)")
    _set_array(w, "    ", 2, "vp", "total", k.value_type)


def _rows_bound_epilogue(k: Kernel, w, fn: str) -> None:
    """Rows assembly with a bound pass: ``run_bound`` adds up each chunk's upper bound of
    entries (the trip counts of the loop over the last level: for a union, the operands'
    row lengths), the chunks write their rows straight into that room (no growable
    buffers) and return their counts; ``pos`` is prefix-summed. One chunk in the output's
    index type: the room is the output (its first ``total`` entries, copied when it is less
    than half used); else the chunks' entries are copied, in parallel, into arrays of the
    exact size."""
    o: RowsOutput = k.output
    it, vt = o.index_type, k.value_type
    _rows_counts(o, w)
    w("    cdef vector[int64_t] room, counts")
    w("    room.resize(nchunks + 1)")
    w("    counts.resize(nchunks)")
    _run_chunks(w, "run_bound", "NULL, NULL", "NULL, NULL", into=("room[1]", "room[t + 1]"))
    w("    room[0] = 0")
    w("    for t in range(nchunks):")
    w("        room[t + 1] += room[t]")
    # the room belongs to the result until the output replaces it (an error gives it back)
    w(f"    cdef {it}* bc = <{it}*>result_alloc(room[nchunks] * sizeof({it}))")
    _set_array(w, "    ", 1, "bc", "room[nchunks]", it)
    w(f"    cdef {vt}* bv = <{vt}*>result_alloc(room[nchunks] * sizeof({vt}))")
    _set_array(w, "    ", 2, "bv", "room[nchunks]", vt)
    _no_memory(w, "    ", "bc == NULL or bv == NULL", "entries", "room[nchunks]")
    _run_chunks(w, fn, "bc, bv", "bc + room[t], bv + room[t]", into=("counts[0]", "counts[t]"),
                choices=_variants_of(k, fn))
    _offsets_and_pos(o, w, "counts[t]", "written")
    w(f"    if nchunks == 1 and wide == {it == 'int64_t'}:")
    w(f"        result_hand_over(res, 1, bc, room[1] * sizeof({it}), total, RESULT_INT, sizeof({it}), result_free)")
    w(f"        result_hand_over(res, 2, bv, room[1] * sizeof({vt}), total, {_result_kind(vt)}, sizeof({vt}), result_free)")
    w("        return RESULT_OK")
    _gather_chunks(k, w, "counts[t]", "bc + room[t]", "bv + room[t]", drop=True)
    w("    result_free(bc, 0)")
    w("    result_free(bv, 0)")
    _set_gathered(k, w)
    w("    return RESULT_OK")


def _rows_counts(o: RowsOutput, w) -> None:
    """The rows epilogues' start: int32 coordinates that cannot hold the last dimension's
    extent raise; ``P`` rows and their counts ``pp`` (int64, zeroed: the result's first
    array, pos), which the chunks fill through ``a.out_pos``."""
    if o.index_type == "int32_t":
        w(f"    if a.N_{o.last} > 2147483647:")
        w(f'        return result_error(res, RESULT_OVERFLOW, b"output dimension {o.last} (%lld) does not fit the '
          f'int32 coordinates of this kernel", a.N_{o.last})')
    P = " * ".join(f"a.N_{v}" for v in o.dense_vars)
    w(f"    cdef int64_t P = {P}")
    w("    cdef int64_t* pp = result_zeros_i64(P + 1)")
    _set_array(w, "    ", 0, "pp", "P + 1", "int64_t")
    _no_memory(w, "    ", "pp == NULL", "row counts", "P + 1")
    w("    a.out_pos = pp")


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


def _result_entry(k: Kernel, w) -> None:
    """The Python ``kernel`` over ``kernel_result_c``: ``None``, or the output's arrays."""
    n = len(k.args)
    w("def kernel(list args, int nthreads, int panel=0):")
    w(f"    cdef int64_t values[{n}]")
    w("    cdef KernelResult res")
    w("    cdef int i")
    w(f"    for i in range({n}):")
    w("        values[i] = args[i]")
    w("    result_init(&res)")
    w("    with nogil:")
    w("        kernel_result_c(values, nthreads, panel, &res)")
    w("        result_check_allocation(&res)")
    w("    return result_to_python(&res)")
    w("")


def print_kernel(k: Kernel, chain: bool = False) -> str:
    """The Cython module of kernel ``k`` (``chain``: see ``_tuples_epilogue``)."""
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
    if isinstance(k.output, TuplesOutput):   # the tuples epilogue's helpers
        w("from scorch._runtime.result cimport result_join_level, result_resize, result_put_coords, "
          "result_chain_levels")
    elif isinstance(k.output, RowsOutput):   # _gather_into_first_chunk's, _gather_chunks's
        w("from scorch._runtime.result cimport result_resize, result_drop_range")
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
    # the body runs without the GIL and without a Python object: ``kernel_c`` writes a
    # preallocated output (``kernel`` and the ``KERNEL_C`` capsule for the C fast path,
    # ``scorch/_runtime/fastcall.cpp``, call it); ``kernel_result_c`` hands its output
    # arrays over in a ``KernelResult`` (``kernel`` makes them numpy arrays)
    if k.c_entry:
        w("cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:")
    else:
        w("cdef int kernel_result_c(const int64_t* args, int nthreads, int panel, KernelResult* res) "
          "noexcept nogil:")
    ret = "" if k.c_entry else " RESULT_OK"
    w("    cdef Args a")
    for n, (name, ct, _) in enumerate(k.args):
        cast = f"<{ct}><size_t>args[{n}]" if ct.endswith("*") else f"args[{n}]"
        w(f"    a.{name} = {cast}")
    if k.ws_vars:
        # the linear key of a workspace position must fit int64 (2**63 - 1 is 9.22e18); a
        # std::map workspace holds only the positions touched, so an extent of 2**62 is fine
        prod = " * ".join(f"<double>a.N_{v}" for v in k.ws_vars)
        w(f"    if {prod} >= 9.2e18:")
        w(f'        return result_error(res, RESULT_OVERFLOW, b"workspace over {",".join(k.ws_vars)} is too '
          f'large to index with int64", 0)')
    _chunking(k, w)
    fn = "fn" if len(fns) > 1 else "run_chunk"
    if rows and k.output.bound:
        _rows_bound_epilogue(k, w, fn)
    elif rows:
        _rows_epilogue(k, w, fn)
    else:
        _tuples_epilogue(k, w, fn, ret, chain)
    w("")
    if k.c_entry:
        _c_entry(k, w)
    else:
        _result_entry(k, w)
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


def _compressed_chain(k: Kernel, s: Schedule) -> bool:
    """The kernel appends tuples of a chain of compressed levels (DCSR, CSF: see
    ``level_kinds.assembly.segment_chain``), built in the kernel (``_tuples_epilogue``;
    ``result_chain_levels`` builds at most 16 upper levels)."""
    fmt = s.output.format
    return (isinstance(k.output, TuplesOutput) and fmt is not None and 1 < len(fmt.levels) <= 17
            and segment_chain(fmt.levels) == "chain")


def kernel_source(k: Kernel, s: Schedule) -> str:
    """The Cython module of kernel ``k`` lowered from ``s``: what ``generate`` builds and
    ``explain`` shows."""
    return print_kernel(k, _compressed_chain(k, s))


def generate(s: Schedule, value_dtype: torch.dtype, index_dtypes: Dict[int, torch.dtype],
             scalar_inner: bool = False):
    """Cython source of the kernel and its argument list (field, C type, meaning).
    ``scalar_inner``: the short-rows variant (see :func:`short_rows`), built without loop
    vectorization and with aligned loops (``SHORT_ROWS_CFLAGS``), with a stream variant for
    streams larger than the cache (``lower/stream_rows.py``). Generated from the schedule
    with its variables named by loop depth (``canonical``): the same kernel whatever the
    caller's letters; the argument list names the caller's variables."""
    s, back = canonical_schedule(s)
    k = lower_kernel(s, value_dtype, index_dtypes, short_module=scalar_inner)
    src = kernel_source(k, s)
    if scalar_inner:
        lines = src.split("\n")
        lines.insert(2, f"# scorch-cflags: {SHORT_ROWS_CFLAGS}")
        lines.insert(3, f"# short-rows variant: segments of <= {short_rows_limit(value_dtype)} "
                        f"entries on average")
        src = "\n".join(lines)
    return src, caller_args(k.args, back)
