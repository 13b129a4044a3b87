"""What lowering decides about a kernel before it builds a single node.

Everything here is a pure function of the schedule, the value type and the index types:
the C types, which dense accesses stream with unit stride, the loop kind of every depth
(from the levels each loop iterates or locates and the merge lattice), whether every output
element is stored exactly once (no memset), the register-row and vector-dot forms, rows
assembly, the workspace flavour and how the outermost loop is chunked. The node builders
(``loops``, ``output``, ``entry``) read these facts; none of them sets one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

import torch

from .. import merge_lattice as ml
from ..cost_model import separated
from ..functions import function
from ..index_notation import Apply, Compare, Where
from ..levels import LevelPlan
from ..schedule import Schedule, sparse_loop_ranks
from ..target import Target, current as current_target, value_bytes, vector_type_name

__all__ = ["UNPREDICTABLE", "UNPREDICTABLE_DECL", "CTYPES", "NPTYPES", "ITYPES", "DENSE_WS_LIMIT", "SHORT_ROWS",
           "SHORT_ROWS_BY_DTYPE", "PREFETCH_DISTANCE", "PREFETCH_MIN_BYTES", "STREAM_BLOCK", "STREAM_DISTANCE",
           "STREAM_MIN_BYTES", "STREAM_MIN_GATHER_BYTES", "GATHER_DOT_LANES", "HW_GATHER_TARGETS",
           "HW_GATHER_MIN_BYTES", "PAIRED_ROWS_MIN", "RowLoopTuning", "AMD_ROW_LOOPS", "INTEL_ROW_LOOPS", "row_loop_tuning", "ROWS_VARY_SAMPLES", "ROWS_VARY_PERCENT", "gathered", "short_rows_limit",
           "DOT_PREFETCH_BYTES", "DOT_FAR_PREFETCH_ENTRIES", "DOT_FAR_PREFETCH_MIN_BYTES", "dot_gathers",
           "DOT_PREFETCH_SKIP_IN_L2", "dot_prefetch_skips_in_l2", "L2_BYTES_DECL",
           "dot_prefetch_distance", "dot_far_prefetch_distance", "DOT_ENTRIES", "dot_entries_type",
           "dot_row_shared", "SEGMENT_PREFETCH_DISTANCE", "chased_segments", "level_entries", "fiber_products",
           "reads_strided",
           "short_rows", "unit_stride_accesses", "relayouts", "gather_relayouts", "LoopLevels",
           "KernelFacts", "kernel_facts", "cvar", "ws_size"]

#: a sparse workspace whose extent is at most this many entries runs as a dense array with
#: a touched list (one per thread); larger ones use the std::map
DENSE_WS_LIMIT = 1 << 22

CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
          torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
          torch.uint8: "uint8_t"}
NPTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
           torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8"}
ITYPES = {torch.int32: "int32_t", torch.int64: "int64_t"}

#: segments (rows) of at most this many entries on average run the scalar variant of a
#: sparse-dot kernel (see short_rows); float32 rows shorter than one 512-bit vector (16)
#: never fill gcc's vector loop and run scalar faster (copter2, 12.7 a row: 286 -> 273 us,
#: random_uniform, 10 a row: 615 -> 559 us at 2 threads), float64 ones gain from 6 up.
#: The same holds for the AVX2 target's 8-wide loop, so the limits do not follow the vector
#: width (1 thread, ``SCORCH_TARGET=avx2``: random_uniform 1.92 -> 1.71 ms, 4elt 61 -> 50 us,
#: bcspwr10 18 -> 13 us, copter2 586 -> 568 us scalar; Groebner, 35 a row, 61 vs 150 us)
SHORT_ROWS = 6
SHORT_ROWS_BY_DTYPE = {torch.float32: 16}

#: a row loop gathering from a dense operand (SpMV's ``x[crd[q]]``) prefetches the entry
#: PREFETCH_DISTANCE positions ahead when that operand spans at least PREFETCH_MIN_BYTES
#: along the gathered dimension (twice this Zen 4's 1 MiB L2): every gather then misses L2.
#: A small gain, measured as CPU time per call (the machine was loaded; wall times swung
#: +-30 %), 1 thread, scalar short-rows build: uniform 2^20 rows x 10 a row (x 4 MiB)
#: 24.6 -> 22.9 ms, R-MAT 2^20 31.2 -> 29.8, uniform 2^18 4.57 -> 4.48. Where x fits in L2
#: (copter2, NotreDame, Groebner) prefetching cost 5-15 % in wall time, hence a run-time
#: choice (``run_chunk_prefetch``).
PREFETCH_DISTANCE = 64
PREFETCH_MIN_BYTES = 2 << 20

#: the short-rows module's stream variant (``lower/stream_rows.py``): a row loop whose row
#: exits mispredict (rows of a few entries, random lengths) stalls the hardware stream
#: prefetcher on the index and value arrays, so each row asks for the stream lines
#: STREAM_DISTANCE entries ahead, and rows longer than STREAM_BLOCK entries run in blocks of
#: STREAM_BLOCK with one such request a block; the requests are non-temporal, so the
#: streams pass by the L2 that holds the gathered x. Chosen at run time when the two streams
#: span at least STREAM_MIN_BYTES (twice this Zen 4's 1 MiB L2; below it, in cache, the
#: requests cost 5-10 %: bcspwr10, 4elt) and x at least STREAM_MIN_GATHER_BYTES (the L2:
#: with x of 256 KiB the generated variant was 5-10 % slower on uniform16 and 0-10 % faster
#: on rmat16). 1 thread, float32/int32, CPU time, loaded machine
#: (benchmarks/results/issue15/spmv4/NOTES.md): uniform18 1.13-1.26x, rmat18 1.11-1.20x;
#: with the gather prefetch (x >= PREFETCH_MIN_BYTES) rmat19 1.52x against 1.27x for the
#: gather prefetch alone (C prototypes).
STREAM_BLOCK = 16
STREAM_DISTANCE = 512
STREAM_MIN_BYTES = 2 << 20
STREAM_MIN_GATHER_BYTES = 1 << 20

#: values per vector in the vectorized (long-rows) module of a gathered dot (SpMV): its
#: gathers are emulated lane by lane, and on AVX-512 16 float32 lanes take more inserts and
#: a longer horizontal sum per row than two 8-lane vectors; float32 is built for 256-bit
#: vectors (1 thread, rows of 17 to 512 entries: 1.09-1.24x with x in L1, 0.99-1.14x with
#: x of 1 MiB; Groebner_id2003_aug 66 -> 58 us). float64 keeps 8 lanes in one zmm (4
#: lanes were 14 % slower on uniform16, session 7).
GATHER_DOT_LANES = 8

#: the targets whose gather instruction is pipelined (a few cycles a step, not one load a
#: lane): the short-rows module gets its gather variant there (``lower/gather_rows.py``).
#: Measured on an AVX-512 Zen 5 (hardware gathers 1.2-1.6x over the scalar row loop on
#: random rows); AVX2 machines keep the scalar loop until measured (Zen 2/3 microcode their
#: gathers; Intel client chips since 2023 slow them down to mitigate Downfall)
HW_GATHER_TARGETS = frozenset({"avx512"})
#: the gather variant runs when the gathered operand spans at least this many bytes (past
#: L1: G51's 4 KB x runs the scalar loop in 4.1 us, the gathers in 6.1) and the rows'
#: lengths change between neighbours in at least ROWS_VARY_PERCENT of ROWS_VARY_SAMPLES
#: sampled pairs (``gather_dot.h``'s ``rows_vary``: random and R-MAT rows 72-91 %, where
#: gathers won 1.2-1.6x; meshes and banded rows 0-53 %, where they lost 1.2-2.6x)
HW_GATHER_MIN_BYTES = 64 << 10
#: the scalar SpMV row loop keeps two partial sums a row when the rows hold at least this
#: many entries on average (``gather_dot.h``'s ``rows_dot_pairs``: 4elt, 5.9 a row, 35.8 ->
#: 31.5 us; bcspwr10, 4.1 a row, 7.3 -> 8.3 us and arrow, 2 a row, 57 -> 78 us the other way)
PAIRED_ROWS_MIN = 5
ROWS_VARY_SAMPLES = 128
ROWS_VARY_PERCENT = 60


@dataclass(frozen=True)
class RowLoopTuning:
    """How SpMV's row loop runs on one CPU maker's cores (``target.cpu``), each choice
    measured there: ``stream_requests``: the non-temporal stream requests of the stream
    variants (``stream_rows``, ``rows_gather_dot``'s distance); ``gather_min_bytes``: the
    gathered operand's span from which the gathered-dot loop runs; ``gather_vary_percent``:
    it runs where the rows' lengths change between neighbours in at least this share of
    sampled pairs (``rows_vary``), and, ``gather_rows_min`` (None: never), whatever they do
    where the rows hold at least that many entries on average."""
    stream_requests: bool
    gather_min_bytes: int
    gather_vary_percent: int
    gather_rows_min: Optional[int]


#: the AMD cores' choices, and those of any CPU not measured (Zen 3/4/5: the stream requests
#: gained 1.1-1.3x on uniform18 and rmat18, the gathers lost 1.2-2.6x on meshes, whose row
#: lengths repeat; ``HW_GATHER_MIN_BYTES``, ``STREAM_MIN_BYTES`` above)
AMD_ROW_LOOPS = RowLoopTuning(stream_requests=True, gather_min_bytes=HW_GATHER_MIN_BYTES,
                              gather_vary_percent=ROWS_VARY_PERCENT, gather_rows_min=None)
#: Intel's (a 2-core Xeon with AVX-512 and AMX, session 44, float32/int32, 1 thread, CPU time
#: of the forced variants, ``benchmarks/bench_spmv_paths.py``; ``results/issue15/xeon-s44``):
#: its non-temporal requests cost 1.2-3x (uniform16 392 -> 1104 us, uniform18 1737 -> 4235,
#: rmat18 1960 -> 2420, 4elt 57 -> 91 in the scalar loop), and its gathers win on rows of 5
#: and more whatever their lengths (4elt 57 -> 34 us, copter2 553 -> 330, Groebner, 35 a
#: row, 52 -> 43 against the vectorized module), on rows whose lengths change in a fifth of
#: the pairs or more (NotreDame_www, 2.9 a row, 26 % of pairs: 1231 -> 982 us; bcspwr10, 4.1
#: a row, 37 %: 14.4 -> 12.1) and with x in L1 (G51, 4 KB: 7.2 -> 4.3 us), but not on short
#: rows of repeating lengths (mdual, 4.0 a row, 4 %: 759 -> 818 us; Franz6, 4.6 a row, 0 %:
#: 21 -> 23; arrow_spqr, 3.0 a row, 1 %: equal)
INTEL_ROW_LOOPS = RowLoopTuning(stream_requests=False, gather_min_bytes=0, gather_vary_percent=20,
                                gather_rows_min=PAIRED_ROWS_MIN)


def row_loop_tuning(target: Target) -> RowLoopTuning:
    """The row-loop choices for the cores of ``target.cpu``."""
    return INTEL_ROW_LOOPS if target.cpu == "intel" else AMD_ROW_LOOPS


def short_rows_limit(value_dtype: torch.dtype) -> int:
    """Average entries per row up to which the short-rows variant runs (see short_rows)."""
    return SHORT_ROWS_BY_DTYPE.get(value_dtype, SHORT_ROWS)


#: the C builtin a kernel calls to mark a condition as unpredictable (gcc then selects with
#: a conditional move instead of a branch), declared in the kernel as this name
UNPREDICTABLE = "scorch_unpredictable"
UNPREDICTABLE_DECL = ("cdef extern from *:",
                      f'    bint {UNPREDICTABLE} "__builtin_expect_with_probability"(long, long, double) nogil')


def cvar(v: str) -> str:
    """The C local holding index variable ``v``'s current coordinate."""
    return "c_" + v


def unit_stride_accesses(s: Schedule):
    """Dense strided accesses that the innermost loop streams: the runtime hands them over
    with stride 1 in that variable (re-laid out if need be), so the kernel indexes them with
    ``+ c`` (vectorizable) instead of ``+ c * stride``."""
    if not s.loop_order:
        return set()
    last = s.loop_order[-1]
    return {ap.id for ap in s.accesses
            if not ap.sparse and last in ap.indices and len(set(ap.indices)) == len(ap.indices)}


def relayouts(s: Schedule) -> Dict[int, Tuple[int, Tuple[int, ...], Tuple[int, ...]]]:
    """Dense accesses the innermost loop streams (``unit_stride_accesses``), each with the
    dimension that must have stride 1 and the permutation that lays the operand out in loop
    order (and its inverse): the caller re-lays such an operand out when it arrives with
    another stride (e.g. SDDMM's C, read along k)."""
    rank = {v: n for n, v in enumerate(s.loop_order)}
    out = {}
    for i in unit_stride_accesses(s):
        ap = s.accesses[i]
        perm = sorted(range(len(ap.indices)), key=lambda d: rank[ap.indices[d]])
        inv = [0] * len(perm)
        for n, d in enumerate(perm):
            inv[d] = n
        out[ap.id] = (ap.indices.index(s.loop_order[-1]), tuple(perm), tuple(inv))
    return out


def order_relayouts(s: Schedule) -> Dict[int, Tuple[Tuple[int, int], ...]]:
    """Streamed dense accesses (:func:`relayouts`) whose layout also matters above the
    innermost loop: the pairs of dimensions ``(u, w)`` with ``u`` looped at or above a
    sparse loop and ``w`` below it (``cost_model.separated``). An operand that arrives with
    ``w`` outside ``u`` (a larger stride) is read at rows that far apart for every stored
    entry: BigBird's scores at batch 8, ``ij,bhid,bhjd->bhij`` in loops ``i, j, b, h, d``,
    read 32 head rows of ``q`` and of ``k`` 256 KB apart per entry (38 ms; 18 ms with both
    in ``i, b, h, d`` order, a 0.5 ms copy each). The caller copies such an operand to
    loop order where that pays (``relayout.relayout_pays``: each stored entry reads at least one of its rows)."""
    rank = {v: n for n, v in enumerate(s.loop_order)}
    sparse = sparse_loop_ranks(s.loop_order, s.accesses)
    out = {}
    for i in sorted(unit_stride_accesses(s)):
        idx = s.accesses[i].indices
        pairs = tuple((du, dw) for du, u in enumerate(idx) for dw, w in enumerate(idx)
                      if w != s.loop_order[-1]    # (its stride is 1: relayouts)
                      and separated(rank[u], rank[w], sparse, inclusive=True))
        if pairs:
            out[i] = pairs
    return out


def gather_relayouts(s: Schedule) -> Dict[int, Tuple[int, Tuple[int, ...], Tuple[int, ...]]]:
    """Dense accesses whose innermost index in loop order is a sparse loop (a gather: one
    value per stored entry) below a loop over another of their indices (the MoE expert
    gradient ``n, d, b, h`` reads ``x[b, d]``), each as in :func:`relayouts` with the
    gathered dimension. Row-major ``x`` puts each stored ``b`` on its own cache line, again
    for every ``d``; laid out in loop order (``d`` then ``b``), one ``d`` reads the stored
    ``b`` of a row from a few neighbouring lines. The kernel reads such an operand with its
    run-time strides, so the copy is the caller's choice per call (``relayout.gather_pays``)."""
    rank = {v: n for n, v in enumerate(s.loop_order)}
    sparse_vars = {lv.var for ap in s.accesses if ap.sparse for lv in ap.levels if lv.kind.is_sparse}
    streamed = unit_stride_accesses(s)
    out = {}
    for ap in s.accesses:
        if ap.sparse or ap.id in streamed or len(set(ap.indices)) != len(ap.indices) or len(ap.indices) < 2:
            continue
        perm = sorted(range(len(ap.indices)), key=lambda d: rank[ap.indices[d]])
        if ap.indices[perm[-1]] not in sparse_vars:
            continue
        inv = [0] * len(perm)
        for n, d in enumerate(perm):
            inv[d] = n
        out[ap.id] = (perm[-1], tuple(perm), tuple(inv))
    return out


def reads_strided(s: Schedule) -> bool:
    """Whether the kernel has a ``run_chunk_strided`` variant reading the accesses the
    innermost loop streams with their run-time strides: vector dots (SDDMM reads each
    stored entry's K values of C; when C arrives K x n and the pattern holds few entries
    per column, reading them with stride n costs less than copying C to n x K first)."""
    return s.assignment.reduce == "sum" and _vector_dot(s, unit_stride_accesses(s))


def short_rows(s: Schedule) -> Optional[Tuple[int, Tuple[str, ...]]]:
    """Whether the kernel has a short-rows variant, decided per input: the innermost loop
    is a reduction into a scalar over one sparse level (SpMV's ``acc += A[q] * x[crd[q]]``)
    whose parents are dense levels over the outer loops. gcc vectorizes that loop with
    emulated gathers, which pays on rows of a dozen entries and more but costs 10-15% on
    rows of 3-5 (NotreDame, mdual, arrow, bcspwr10), where the plain scalar loop wins; so
    a second module compiled without loop vectorization runs when ``nnz <=
    short_rows_limit(dtype) * rows``. Returns (access id, the dense parents' variables: rows = their extents'
    product), or None."""
    order, out = s.loop_order, s.output
    if not order or not out.dense or out.acc_depth != len(order) - 1:
        return None
    L = order[-1]
    if L not in s.assignment.reduction:
        return None
    iters = [(ap, lv) for ap in s.accesses if ap.sparse for lv in ap.levels if lv.var == L]
    if len(iters) != 1:
        return None
    ap, lv = iters[0]
    # one segment per row (a level with pos, coordinates unique) under levels that locate
    if (lv.k != len(ap.levels) - 1 or not lv.has_pos or lv.grouped
            or not all(p.locates for p in ap.levels[:-1])
            or tuple(p.var for p in ap.levels[:-1]) != tuple(order[:-1])):
        return None
    return ap.id, tuple(order[:-1])


def gathered(s: Schedule) -> Tuple[int, ...]:
    """The dense accesses a short-rows-shaped kernel (see :func:`short_rows`: one sparse
    row per segment, reduced into a scalar) reads at the row's stored coordinates: the
    gathers a ``run_chunk_prefetch`` variant prefetches ahead. Empty when none."""
    if short_rows(s) is None:
        return ()
    L = s.loop_order[-1]
    return tuple(ap.id for ap in s.accesses if not ap.sparse and L in ap.indices)


#: a vector-dot kernel (SDDMM: one K-long dot of ``B[i, :]`` and ``C[j, :]`` per stored
#: ``(i, j)``) prefetches the gathered row about this many bytes of rows ahead: K = 128
#: float32 8 entries, K = 32 32 entries (measured kernel-only, 1 thread, C as n x K, under
#: load: 4elt K = 128 3.30 -> 2.35 ms, rmat16 K = 32 9.4 -> 4.0 ms, K = 128 25.4 -> 17.9 ms,
#: Groebner K = 128 1.61 -> 1.39 ms; rows that stay in L2 lose nothing: bcspwr10 K = 32
#: 0.060 -> 0.051 ms). Rows narrower than a cache line are not prefetched (SpMV-like work).
#: SpMM's register rows gather ``B[j, :]`` the same way and prefetch by the same rule
#: (``KernelFacts.row_gathers``): on an AVX2-only Zen 3 the K = 128 row loop is bound by
#: those gathers, not by its 16 FMAs or the 2 accumulators gcc spills (1 thread, old / new
#: tree interleaved, under load: 4elt 1.16x, rmat16 1.33x, Groebner 1.11-1.41x; K = 32
#: rmat16 1.43x, bcspwr10 1.29x, 4elt and Groebner (B in L2) 0.93-1.01x).
DOT_PREFETCH_BYTES = 4096
#: the fewest and most entries ahead a vector dot prefetches
DOT_PREFETCH_MIN, DOT_PREFETCH_MAX = 8, 64
#: where the gathered rows span at least DOT_FAR_PREFETCH_MIN_BYTES (past most of L3: they
#: come from memory) a vector dot prefetches at least DOT_FAR_PREFETCH_ENTRIES entries
#: ahead: K = 128 float32 8 -> 32 entries. In-process A/B, same operands, 1 thread, AVX-512
#: Zen 5 (32 MB L3), C as n x K / SpMM, ratio old / new time: copter2 (gathered 28 MB)
#: 1.25x / 1.31x, arrow_spqr (24 MB) 1.07x / 1.13x, uniform 100k (51 MB) 1.08x / 1.09x,
#: NotreDame (166 MB) 1.09x / 1.06x; rows that stay in L2 or L3 lose 3-8 % with the far
#: distance (G51 0.5 MB 0.92x, bcspwr10 2.7 MB 0.96x, 4elt 8 MB 0.95x), so they keep the
#: near one. K = 32 (32 entries either way) is best at 32 on both sides
#: (``benchmarks/results/issue15/zen5-s28-dot-prefetch/``).
DOT_FAR_PREFETCH_ENTRIES = 32
DOT_FAR_PREFETCH_MIN_BYTES = 16 << 20
#: gathered rows that all fit in this core's L2 (``scorch_l2_bytes()``: sysconf at run time,
#: 512 KB where it says nothing) are not prefetched: the requests only cost there. Zen 5
#: (1 MB L2), in-process, same operands, 1 thread, SDDMM C as n x K / SpMM, no prefetch
#: against prefetch: K = 32 G51 (C 0.13 MB) 1.26x / 1.19x, Franz6 (0.39 MB) 1.49x /
#: 1.29x, bcspwr10 (0.68 MB) 1.28x / 1.08x, K = 128 G51 (0.5 MB) 1.03x / 1.04x. An AVX2 Zen 3
#: (512 KB L2) had gained from the prefetch on bcspwr10 K = 32 (0.060 -> 0.051 ms): its rows
#: do not fit there. (Rows in L3 with column locality, meshes, lose too, 1.1-1.4x, but
#: random ones gain: that needs the columns' locality, not only the span.)
DOT_PREFETCH_SKIP_IN_L2 = True


def dot_prefetch_skips_in_l2() -> bool:
    """Whether vector dots skip their prefetch where the gathered rows fit in L2 (the
    switch is read when a kernel is generated, so an A/B can flip it)."""
    return DOT_PREFETCH_SKIP_IN_L2


#: the C++ helper the generated code asks for the L2 size (queried once)
L2_BYTES_DECL = (
    "    #include <unistd.h>",
    "    static long scorch_l2_query(void) {",
    "        long s = 0;",
    "    #ifdef _SC_LEVEL2_CACHE_SIZE",
    "        s = sysconf(_SC_LEVEL2_CACHE_SIZE);",
    "    #endif",
    "        return s > 0 ? s : (512L << 10);",
    "    }",
    "    static long scorch_l2_bytes(void) {",
    "        static const long bytes = scorch_l2_query();   /* once, thread-safe (C++11) */",
    "        return bytes;",
    "    }",
)
CACHE_LINE = 64


def dot_gathers(s: Schedule) -> Tuple[int, ...]:
    """The dense accesses a vector-dot kernel (see ``_vector_dot``) reads at the stored
    coordinates of the sparse loop right above the dot: SDDMM's ``C[j, :]`` for each stored
    ``(i, j)`` (``B[i, :]`` is the same row for the whole segment). Empty when that loop
    is not one sparse level's segment."""
    order = s.loop_order
    if len(order) < 2:
        return ()
    v, L = order[-2], order[-1]
    if sum(1 for ap in s.accesses if ap.sparse and v in ap.level_vars) != 1:
        return ()
    return tuple(ap.id for ap in s.accesses if not ap.sparse and v in ap.indices and L in ap.indices)


def dot_prefetch_distance(width: int, vt: str) -> int:
    """How many stored entries ahead a vector dot of ``width`` values prefetches its
    gathered rows while they stay in cache (0: not at all, rows narrower than a cache
    line)."""
    row = width * value_bytes(vt)
    if row < CACHE_LINE:
        return 0
    return max(DOT_PREFETCH_MIN, min(DOT_PREFETCH_MAX, DOT_PREFETCH_BYTES // row))


def dot_far_prefetch_distance(width: int, vt: str) -> int:
    """The same where the gathered rows span ``DOT_FAR_PREFETCH_MIN_BYTES`` or more (they
    come from memory: the prefetch has to run further ahead)."""
    near = dot_prefetch_distance(width, vt)
    return max(near, DOT_FAR_PREFETCH_ENTRIES) if near else 0


#: a vector dot whose results are the sparse operand's stored values (SDDMM) runs this many
#: consecutive stored entries per step: each entry's products summed lane-wise into one
#: vector, then one transposing horizontal sum turns the four vectors into one vector of
#: their four sums, stored at once (4 shuffles and adds per entry -> about 2; kernel only,
#: 1 thread, C as n x K, under load: Groebner K = 32 0.363 -> 0.288 ms, K = 128 1.13 ->
#: 0.96 ms, 4elt K = 128 0.975 -> 0.849 ms)
DOT_ENTRIES = 4


def dot_row_shared(nvec: int, entries: int, registers: int) -> bool:
    """Whether ``entries`` vector dots run together read the row they share (SDDMM's
    ``B[i, :]``, ``nvec`` vectors) vector by vector for all of them at once: when the row
    and one sum per entry do not fit in half the vector registers (the other half for the
    gathered vectors and gcc's partial sums), each dot on its own reloads most of the
    row. AVX2 K = 128: 16 ymm a row, 66 loads of 256 bits per 4 entries instead of 125
    (kernel only, 1 thread, C as n x K, in-process A/B under load: bcspwr10 1.04-1.33x,
    4elt 1.01-1.08x, Groebner 0.93-1.13x, uniform16 1.11x; C in L1 8.9 -> 7.1 ns an
    entry). AVX2 K = 32 (4 ymm) and every AVX-512 width up to K = 128 (8 zmm) keep the
    row in registers: unchanged."""
    return nvec + entries > registers // 2


def _entries_step_ok(s: Schedule) -> bool:
    """The only sparse access is the output's pattern (an ``acc`` output whose values sit at
    the pattern's positions), iterated by the loop right above the dot at its last level:
    consecutive stored entries are consecutive output values, all present."""
    out, order = s.output, s.loop_order
    sparse = [ap for ap in s.accesses if ap.sparse]
    if out.mode != "acc" or out.pattern < 0 or len(sparse) != 1 or sparse[0].id != out.pattern:
        return False
    lv = sparse[0].levels[-1]
    return len(order) >= 2 and lv.var == order[-2] and not lv.grouped and not lv.locates


def dot_entries_type(s: Schedule, vt: str, lanes: int, target: Target) -> Optional[str]:
    """The vector type (``DOT_ENTRIES`` values) a vector dot with ``lanes``-lane vectors
    stores ``DOT_ENTRIES`` results in at once, or None where it runs entry by entry
    (see ``_entries_step_ok``; vectors of fewer lanes, or 4 values wider than a register)."""
    if vt not in ("float", "double"):
        return None
    nb = DOT_ENTRIES * value_bytes(vt)
    if lanes < DOT_ENTRIES or nb > target.vector_bytes:
        return None
    if not _entries_step_ok(s):
        return None
    return vector_type_name(vt, nb, target.vector_bytes)


@dataclass(frozen=True)
class LoopLevels:
    """The levels one loop (over ``var``) advances: ``iters`` drive it, ``locs`` locate
    the loop's coordinate, ``chased`` are deeper levels over already bound variables (a
    repeated index: a diagonal) located inside its body. ``kind``: ``"dense"`` (every
    coordinate, sparse iterators merged in), ``"segment"`` (one sparse level),
    ``"group"`` (one grouped coordinate level) or ``"merge"`` (k-pointer merge)."""
    depth: int
    var: str
    iters: Tuple[LevelPlan, ...]
    locs: Tuple[LevelPlan, ...]
    chased: Tuple[LevelPlan, ...]
    kind: str
    necessary: FrozenSet[int]     # iterators known present inside the body


def _loop_levels(s: Schedule) -> Tuple[LoopLevels, ...]:
    """Walk every sparse access's levels down the loop order (each loop takes the next
    level of an access when it is over the loop's variable)."""
    k = {ap.id: 0 for ap in s.accesses if ap.sparse}
    sparse = [ap for ap in s.accesses if ap.sparse]
    out = []
    for depth, v in enumerate(s.loop_order):
        iters, locs = [], []
        for ap in sparse:
            if k[ap.id] < len(ap.levels) and ap.levels[k[ap.id]].var == v:
                lv = ap.levels[k[ap.id]]
                (locs if lv.locates else iters).append(lv)
        for lv in iters + locs:
            k[lv.access] += 1
        bound = set(s.loop_order[:depth + 1])
        chased = []
        for ap in sparse:
            while k[ap.id] < len(ap.levels) and ap.levels[k[ap.id]].var in bound:
                chased.append(ap.levels[k[ap.id]])
                k[ap.id] += 1
        it_ids = [lv.access for lv in iters]
        if not iters or ml.dense_needed(s.formula, it_ids):
            kind = "dense"
        elif len(iters) == 1:
            kind = "group" if iters[0].grouped else "segment"
        else:
            kind = "merge"
        nec = frozenset(ml.necessary(s.formula, it_ids)) if iters else frozenset()
        out.append(LoopLevels(depth, v, tuple(iters), tuple(locs), tuple(chased), kind, nec))
    return tuple(out)


def _row_accumulation_depth(s: Schedule, out_unit: Optional[str]) -> int:
    """Depth ``d`` of the first reduction loop when a dense output's row (its innermost,
    unit-stride variable ``L``, the innermost loop, dense in every operand) is summed over
    the reduction loops ``d .. -1`` (SpMM ``i, j, k``: d = 1): that row is accumulated
    locally (a compile-time-width array gcc keeps in vector registers, or the output row
    itself, zeroed where it starts) and stored once per output row. -1 when not."""
    out, order = s.output, s.loop_order
    if not out.dense or out.mode != "dense" or out.acc_depth >= 0 or len(order) < 3:
        return -1
    L = order[-1]
    if out_unit != L or len(set(out.vars)) != len(out.vars):
        return -1
    if any(ap.sparse and L in ap.level_vars for ap in s.accesses):
        return -1
    # the row's vector leaves read every dense operand along L with stride 1: an operand
    # indexed by L twice (``jij,kik->kj``'s diagonal) is not (it summed x[j, i, j + lane])
    if any(not ap.sparse and L in ap.indices and len(set(ap.indices)) != len(ap.indices)
           for ap in s.accesses):
        return -1
    red = set(s.assignment.reduction)
    # reduction loops may also sit above the output loops (the MoE forward read
    # expert-major, n, b, d, h): the row is then added to the output, not stored
    top = next((n for n, v in enumerate(order) if v not in red), len(order))
    d = next((n for n, v in enumerate(order) if n > top and v in red), -1)
    if d <= top or not all(v in red for v in order[d:-1]):
        return -1
    if set(order[top:d]) | {L} != set(out.vars):
        return -1
    return d


def _scattered_rows(s: Schedule, out_unit: Optional[str], row_depth: int) -> bool:
    """The innermost loop adds a row into the dense output at its leaf, along the output's
    unit-stride variable and dense in every operand, and no register row holds it (a
    reduction above the output's row loop: CSC ``A @ X`` as ``j, i, k``, ``A^T @ G`` over
    CSR as ``i, j, k``, a sparse operand's gradient into a dense array). At a compile-time
    width the row is added vector by vector; gcc's run-time-width loop never runs its
    vector body for rows narrower than the register (K = 8 float32 on AVX-512) and checks
    the output against the operands for overlap on every row: on 4elt ``A^T @ G`` at
    K = 8 took 0.22 ms, 3.3x the gathering ``i, j, k`` over the transpose."""
    out, order = s.output, s.loop_order
    if (row_depth >= 0 or not out.dense or out.mode != "dense" or out.acc_depth >= 0
            or len(order) < 2 or s.assignment.reduce != "sum"):
        return False
    L = order[-1]
    if out_unit != L or len(set(out.vars)) != len(out.vars):
        return False
    if any(ap.sparse and L in ap.level_vars for ap in s.accesses):
        return False
    return not any(not ap.sparse and L in ap.indices and len(set(ap.indices)) != len(ap.indices)
                   for ap in s.accesses)


def _vector_dot(s: Schedule, unit) -> bool:
    """The innermost loop is a reduction of a scalar accumulator wrapping only it (SDDMM's
    ``k``), dense in every operand: at a compile-time width it becomes vector products
    summed lane-wise, then one horizontal sum (no loop, no remainder)."""
    out, order = s.output, s.loop_order
    if not order or not 0 <= out.acc_depth < len(order) or out.mode not in ("acc", "dense", "ws"):
        return False
    L = order[-1]
    # the accumulator may wrap more reduction loops than the innermost (the MoE gate
    # gradient's d, h): each of their iterations adds one vector dot
    if not all(v in s.assignment.reduction for v in order[out.acc_depth:]):
        return False
    if any(ap.sparse and L in ap.level_vars for ap in s.accesses):
        return False
    return all(ap.id in unit for ap in s.accesses if not ap.sparse and L in ap.indices)


def _rows_assembly(s: Schedule, rt_ws: bool) -> int:
    """``m`` when the sparse output is ``m >= 1`` dense levels over one compressed level
    (CSR, or a batch of CSRs) and the first ``m`` loops are those dense variables, in
    order: each chunk of the outer loop then appends only the last level's coordinates
    and values (already in the output's index type) and counts the entries of each row
    into ``pos``; a prefix sum and one parallel copy of the chunks' buffers finish the
    output: no coordinate tuples, no sort, no assembly pass. 0 otherwise (the general
    tuple path)."""
    out = s.output
    if out.dense or out.pattern >= 0 or out.format is None:
        return 0
    kinds = out.format.levels
    m = len(kinds) - 1
    last = kinds[-1]
    # the last level keeps pos with unique coordinates (appendable row by row) under
    # levels that locate
    if (m < 1 or not last.has_pos(kinds[-2]) or not last.unique_before(None)
            or any(not k.has_locate for k in kinds[:-1])):
        return 0
    if tuple(s.loop_order[:m]) != tuple(out.level_vars[:m]):
        return 0
    if out.mode == "ws" and (out.ws_dense or not rt_ws or out.ws_vars != out.level_vars[-1:]):
        return 0
    return m


def _chunk_level(s: Schedule) -> Tuple[Optional[str], Optional[LevelPlan]]:
    """How the outermost loop is cut into chunks that write disjoint parts of the output:
    ``("dense", None)`` over its extent, ``("sparse", level)`` over the positions of the
    one sparse level driving it, or ``(None, None)`` (one chunk)."""
    order, out = s.loop_order, s.output
    if not order or order[0] not in out.vars:
        return None, None
    if out.mode == "ws" and out.ws_depth == 0:
        return None, None
    v = order[0]
    iters = [ap.levels[0] for ap in s.accesses
             if ap.sparse and ap.levels[0].var == v and ap.levels[0].iterates]
    if not iters:
        return "dense", None
    if len(iters) == 1 and not iters[0].grouped and not ml.dense_needed(s.formula, [iters[0].access]):
        return "sparse", iters[0]
    return None, None


def _balance_pos(s: Schedule, chunk_kind: Optional[str]) -> Optional[str]:
    """The pos array that weighs a dense outermost loop's iterations by stored entries
    (a compressed level directly under a dense level on that variable: CSR's row
    pointer), or None."""
    if chunk_kind != "dense":
        return None
    v = s.loop_order[0]
    for ap in s.accesses:
        if (ap.sparse and len(ap.levels) > 1 and ap.levels[0].var == v
                and ap.levels[0].locates and ap.levels[1].has_pos and ap.levels[1].iterates):
            return ap.levels[1].pos
    return None


#: a segment loop whose coordinate locates another operand's compressed row (SpGEMM's
#: ``for j in A[i, :]: for k in B[j, :]``) asks, this many of its entries ahead, for that
#: row's first lines of ``crd`` and values, and twice as far ahead for its ``pos`` entry
#: (whose value those addresses need). The rows of B are scattered: without it each one
#: is two dependent misses that a ~10-entry row loop cannot hide (C prototype, 1 thread,
#: AVX2 Zen 3 under load, kernel CPU time: uniform 2^18 A @ A^T 1.7-2.05x, uniform 2^16
#: 1.3-1.8x, 4elt 1.00-1.06x, Groebner 0.99-1.01x; distances 4 and 16 gained less).
SEGMENT_PREFETCH_DISTANCE = 8


def chased_segments(loops: Sequence["LoopLevels"], depth: int) -> Tuple[LevelPlan, ...]:
    """The compressed levels the loop below ``depth`` iterates whose segment the loop at
    ``depth`` (one sparse level's segment) locates with its coordinate alone: the second
    level of an operand whose first, dense, level that loop's variable locates (SpGEMM's
    ``B`` under ``j``). Their rows are prefetched ahead (``SEGMENT_PREFETCH_DISTANCE``)."""
    if depth + 1 >= len(loops):
        return ()
    lp, nl = loops[depth], loops[depth + 1]
    if lp.kind != "segment" or len(lp.iters) != 1 or lp.iters[0].grouped or nl.kind != "segment":
        return ()
    roots = {loc.access for loc in lp.locs if loc.k == 0}
    return tuple(lv for lv in nl.iters
                 if lv.access in roots and lv.k == 1 and lv.has_pos and not lv.grouped)


def level_entries(f: "KernelFacts", lv: LevelPlan) -> str:
    """How many entries level ``lv``'s coordinate array holds (a C expression): a level with
    ``pos`` has ``pos[P]`` for its parent's ``P`` positions, a dense level ``P * N``, a
    level without ``pos`` shares its parent's positions (``P``)."""
    total = "1"
    for up in f.s.accesses[lv.access].levels[:lv.k + 1]:
        if up.locates:
            total = f"a.N_{up.var}" if total == "1" else f"{total} * a.N_{up.var}"
        elif up.has_pos:
            total = f"<int64_t>{up.pos}[{total}]"
    return total


def fiber_products(f: "KernelFacts") -> Optional[Tuple[str, str]]:
    """The mean number of leaf visits per workspace fiber as a fraction (numerator,
    denominator: C double expressions, the denominator at least 1): the product, over the
    loops the workspace wraps, of their extents (dense loops) or their level's mean segment
    (entries over parent positions; SpGEMM: ``nnz(A) * nnz(B) / (N_i * N_j)``). A fraction,
    not a quotient: a comparison multiplies it out, so the kernel divides nothing (``/``
    means true division in Cython, C's in C++). None where a loop is neither."""
    num, den = [], []
    for lp in f.loops[max(f.s.output.ws_depth, 0):]:
        if lp.kind == "dense" and not lp.iters:
            num.append(f"<double>a.N_{lp.var}")
        elif lp.kind == "segment" and len(lp.iters) == 1 and lp.iters[0].has_pos and not lp.iters[0].grouped:
            lv = lp.iters[0]
            up = f.s.accesses[lv.access].levels[lv.k - 1] if lv.k else None
            num.append(f"<double>{level_entries(f, lv)}")
            if up is not None:
                den.append(f"max(<double>{level_entries(f, up)}, 1.0)")
        else:
            return None
    if not num:
        return None
    return " * ".join(num), " * ".join(den) or "1.0"


@dataclass(frozen=True)
class KernelFacts:
    """The kernel-wide decisions, computed once from the schedule (see :func:`kernel_facts`)."""
    s: Schedule
    ids: Dict[object, int]                 # the right-hand side's accesses -> access id
    vt: str                                # C value type
    npvt: str                              # numpy value type name
    idx: Dict[int, str]                    # sparse access id -> C index type
    unit: FrozenSet[int]                   # dense accesses read with unit stride
    out_unit: Optional[str]                # the dense output's unit-stride variable
    rt_ws: bool                            # workspace from scorch._runtime.workspace
    row_depth: int                         # register-row accumulation depth (-1: none)
    dot: bool                              # vector dot product at fixed widths
    rows: int                              # rows assembly: dense levels over the last one
    row_room: bool                         # rows written straight into room from a bound pass
    oit: str                               # appended coordinates' type (rows assembly)
    crd_buf: str                           # chunk buffer types
    val_buf: str
    lanes: int                             # values per vector register of the target
    vtype: str                             # GCC vector type
    target: Target                         # the machine the kernel is built for
    widths: Tuple[int, ...]                # fixed innermost widths with their own variant
    panels: Tuple[int, ...]                # panel widths (Algorithm 3 tiling)
    loops: Tuple[LoopLevels, ...]          # one per loop depth
    store_all: bool                        # every dense output element stored exactly once
    chunk_kind: Optional[str]              # None | "dense" | "sparse"
    chunk_level: Optional[LevelPlan]
    balance: Optional[str]                 # pos array weighing chunks by entries
    gathers: Tuple[int, ...] = ()          # dense accesses gathered at stored coordinates
    cache_panels: bool = False             # s.cache_tile: register panels above every loop
    scatter: bool = False                  # rows added into the dense output at fixed widths

    @property
    def row_gathers(self) -> Tuple[int, ...]:
        """The dense rows the fixed-width variants gather per stored entry of the loop right
        above their vector loop (``dot_gathers``: SDDMM's ``C[j, :]``, SpMM's ``B[j, :]``),
        prefetched ahead (``dot_prefetch_distance``); empty outside those variants."""
        if not self.widths or not (self.dot or self.row_depth >= 0):
            return ()
        return dot_gathers(self.s)

    @property
    def chases(self) -> bool:
        """Some segment loop prefetches the rows it locates (``chased_segments``)."""
        return any(chased_segments(self.loops, d) for d in range(len(self.loops)))

    def vector(self, width: int) -> Tuple[int, str]:
        """Lanes and GCC vector type of a register row (or vector dot) ``width`` values
        wide: the target's register, or one narrower vector for rows that fit in less."""
        nb = self.target.vector_bytes_for(self.vt, width)
        return nb // (self.target.vector_bytes // self.lanes), vector_type_name(self.vt, nb, self.target.vector_bytes)


def _stores_once(s: Schedule, loops: Sequence[LoopLevels], depth: int) -> bool:
    """Every loop above ``depth`` is a dense output loop visiting its whole extent, so a
    store at ``depth`` writes every output element exactly once (it can assign: no memset)."""
    return all(loops[n].kind == "dense" and loops[n].var in s.output.vars for n in range(depth))


def _store_depth(s: Schedule, row_depth: int) -> Optional[int]:
    """The depth of the dense output's single store (register rows or a scalar
    accumulator), or None when the output is added to at the leaves."""
    if row_depth >= 0:
        return row_depth
    if s.output.mode == "dense" and s.output.acc_depth >= 0:
        return s.output.acc_depth
    return None


def _applies(e) -> bool:
    """The expression applies an elementwise function, a comparison or a selection somewhere
    (none of which the vector types compute)."""
    return any(isinstance(x, (Apply, Compare, Where)) for x in _nodes(e))


def _nodes(e):
    yield e
    for child in e.children():
        yield from _nodes(child)


def math_functions(s: Schedule) -> Tuple[str, ...]:
    """The libc.math names the kernel's expression calls."""
    names = []
    for x in _nodes(s.assignment.rhs):
        if isinstance(x, Apply):
            names.extend(n for n in function(x.fn).math if n not in names)
    return tuple(names)


#: the identity of each reduction by C value type (what an accumulator starts from)
_LIMITS = {"float": ("-INFINITY", "INFINITY"), "double": ("-INFINITY", "INFINITY"),
           "int64_t": ("(-9223372036854775807 - 1)", "9223372036854775807"),
           "int32_t": ("(-2147483647 - 1)", "2147483647"), "int16_t": ("-32768", "32767"),
           "int8_t": ("-128", "127"), "uint8_t": ("0", "255")}


def reduce_identity(reduce: str, vt: str) -> str:
    """The value an accumulator of ``reduce`` starts from."""
    if reduce == "sum":
        return "0"
    return _LIMITS[vt][0 if reduce == "max" else 1]


def reduce_into(reduce: str, target: str, val: str) -> str:
    """The new value of ``target`` after reducing ``val`` into it (``val``: a local)."""
    if reduce == "sum":
        return f"{target} + {val}"
    op = ">" if reduce == "max" else "<"
    # NaN wins, as in torch.amax (x != x only for NaN; a NaN target stays: no x > NaN)
    return f"{val} if ({val} {op} {target} or {val} != {val}) else {target}"


def kernel_facts(s: Schedule, value_dtype: torch.dtype, index_dtypes: Dict[int, torch.dtype],
                 target: Optional[Target] = None) -> KernelFacts:
    """Decide everything about the kernel for ``s`` that does not depend on a node, for
    ``target`` (default: ``target.current()``: its vector width sets the lanes and the
    register-row widths)."""
    tg = target or current_target()
    vt = CTYPES[value_dtype]
    idx = {i: ITYPES[d] for i, d in index_dtypes.items()}
    out, order = s.output, s.loop_order
    unit = frozenset(unit_stride_accesses(s))
    last = order[-1] if order else None
    out_unit = last if (out.dense and out.vars and out.memory_order[-1] == last) else None
    rt_ws = out.mode == "ws" and not out.ws_dense and vt in ("float", "double", "int32_t", "int64_t")
    summed = s.assignment.reduce == "sum"   # register rows and vector dots add, nothing else
    row_depth = _row_accumulation_depth(s, out_unit) if summed else -1
    dot = _vector_dot(s, unit) and summed
    rows = _rows_assembly(s, rt_ws)
    # appends at most once per iteration of the loop over the last output level (no
    # workspace between): that loop's trip count bounds the row, so a bound pass sizes the
    # output and the rows are written straight into it
    row_room = bool(rows) and out.mode in ("direct", "acc")
    oit = "int32_t" if idx and all(t == "int32_t" for t in idx.values()) else "int64_t"
    if row_room:
        crd_buf, val_buf = oit, vt
    elif rows:
        crd_buf, val_buf = f"AppendBuffer[{oit}]", f"AppendBuffer[{vt}]"
    elif s.output.dense or s.output.pattern >= 0:   # nothing appended (the signature only)
        crd_buf, val_buf = "vector[int64_t]", f"vector[{vt}]"
    else:   # coordinate tuples: buffers that record a failed allocation (never throw), in
        # the operands' index type (codegen._tuples_epilogue hands them over as the output)
        crd_buf, val_buf = f"AppendBuffer[{oit}]", f"AppendBuffer[{vt}]"
    scatter = not dot and _scattered_rows(s, out_unit, row_depth)
    widths: Tuple[int, ...] = ()
    # fixed-width variants compute on GCC vector types: arithmetic only, no function calls
    if (row_depth >= 0 or dot or scatter) and vt in ("float", "double") and not _applies(s.assignment.rhs):
        widths = tg.row_widths(vt)
    scatter = scatter and bool(widths)
    panels = widths if (row_depth >= 0 and order[-1] in s.tiled) else ()
    # cache blocking (schedule.CacheTile) in register panels, hoisted above every loop:
    # the output and every operand the innermost loop streams move with the panel (not
    # for the generic loop: it adds into the output row per iteration, bound by L1
    # stores, and ran slower in panels: MoE expert gradient 48 -> 59 ms CPU)
    cache_panels = bool(panels) and s.cache_tile is not None and out_unit == last
    loops = _loop_levels(s)
    depth = _store_depth(s, row_depth)
    store_all = depth is not None and _stores_once(s, loops, depth)
    chunk_kind, chunk_level = _chunk_level(s)
    return KernelFacts(s=s, ids=ml.access_ids(s.assignment.rhs), vt=vt, npvt=NPTYPES[value_dtype],
                       idx=idx, unit=unit, out_unit=out_unit, rt_ws=rt_ws, row_depth=row_depth,
                       dot=dot, rows=rows, row_room=row_room, oit=oit, crd_buf=crd_buf, val_buf=val_buf,
                       lanes=tg.lanes(vt if vt in ("float", "double") else "double"),
                       vtype=vector_type_name(vt, tg.vector_bytes, tg.vector_bytes), target=tg, widths=widths,
                       panels=panels, loops=loops, store_all=store_all, chunk_kind=chunk_kind,
                       chunk_level=chunk_level, balance=_balance_pos(s, chunk_kind),
                       gathers=gathered(s), cache_panels=cache_panels, scatter=scatter)


def ws_size(ws_vars: Sequence[str]) -> str:
    """The workspace's extent: the product of its variables' sizes (a C expression)."""
    return " * ".join(f"a.N_{v}" for v in ws_vars)
