"""SpMV's kernel variants against dense torch: the short-rows module (no loop vectorization,
loops aligned to 32 bytes) and the default one, chosen per input by the average row length,
over float32/float64 values and int32/int64 indices, for the native build and (where this CPU
runs it) the AVX2 target; the short-rows module's stream variants (``lower/stream_rows.py``)
forced on small inputs and chosen by size on a large one; the vectorized module's vector
width (``facts.GATHER_DOT_LANES``); the runtime row loops (``lower/gather_rows.py``: the
scalar one everywhere, the gathered-dot one on AVX-512) forced and chosen by the rows."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.tensor_compiler import build, codegen, target
from scorch.tensor_compiler.lower import short_rows_limit
from scorch.tensor_compiler.lower.facts import (AMD_ROW_LOOPS, HW_GATHER_MIN_BYTES, INTEL_ROW_LOOPS, PAIRED_ROWS_MIN,
                                                ROWS_VARY_PERCENT, ROWS_VARY_SAMPLES, STREAM_BLOCK, STREAM_MIN_BYTES,
                                                STREAM_MIN_GATHER_BYTES, row_loop_tuning)

FAST = settings(max_examples=20, deadline=None)
AVX2 = target.runnable(target.target_named("avx2"))
AVX512 = target.runnable(target.target_named("avx512"))


def _spmv_source(dtype=torch.float32, scalar_inner=True, index=torch.int32) -> str:
    A = scorch.sparse_tensor(torch.eye(3, dtype=dtype), format="csr")
    s = scorch.explain("ij,j->i", A, torch.ones(3, dtype=dtype)).schedule
    idx = {ap.id: index for ap in s.accesses if ap.sparse}
    src, args = codegen.generate(s, dtype, idx, scalar_inner=scalar_inner)
    # the argument order _run_forced passes
    assert [a[0] for a in args] == ["N_i", "N_j", "t0_pos1", "t0_crd1", "t0_vals", "t1_st_j",
                                    "t1_vals", "out_vals", "out_st_i"]
    return src


def test_short_rows_variant_is_built_scalar_with_aligned_loops():
    short, default = _spmv_source(), _spmv_source(scalar_inner=False)
    flags = build.kernel_cflags(short)
    assert "-fno-tree-vectorize" in flags and "-falign-loops=32" in flags
    assert "-falign-loops=32" not in build.kernel_cflags(default)
    with pytest.raises(ValueError):      # a source cannot ask for arbitrary flags
        build.source_cflags("# scorch-cflags: -O0\n")


@st.composite
def spmv_case(draw, dtypes=(torch.float32, torch.float64), indices=(torch.int32, torch.int64)):
    rows = draw(st.integers(0, 40))
    cols = draw(st.integers(1, 60))
    dtype = draw(st.sampled_from(dtypes))
    # average row lengths on both sides of the short-rows limit
    per_row = draw(st.sampled_from([0.0, 1.0, 3.0, short_rows_limit(dtype) + 8.0]))
    density = min(1.0, per_row / cols)
    seed = draw(st.integers(0, 2**31 - 1))
    M = sp.random(rows, cols, density=density, format="csr", random_state=seed,
                  dtype=np.float64)
    index = draw(st.sampled_from(indices))
    return M, dtype, index


def _check(case, name):
    M, dtype, index = case
    dense = torch.from_numpy(M.toarray()).to(dtype)
    x = torch.randn(M.shape[1], dtype=torch.float64).to(dtype)
    A = torch.sparse_csr_tensor(torch.from_numpy(M.indptr).to(index),
                                torch.from_numpy(M.indices).to(index),
                                torch.from_numpy(M.data).to(dtype), size=M.shape)
    with target.use_target(name):
        got = scorch.einsum("ij,j->i", A, x)
        again = scorch.einsum("ij,j->i", A, x)      # the warm call
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, dense @ x, rtol=tol, atol=tol)
    assert torch.equal(got, again)


@FAST
@given(case=spmv_case())
def test_spmv_variants_match_dense(case):
    _check(case, "native")


@FAST
@given(case=spmv_case(dtypes=(torch.float32,), indices=(torch.int32,)))
def test_avx2_spmv_variants_match_dense(case):
    if not AVX2:     # the AVX2 build needs a CPU that runs it: the native test covers the rest
        assert not target.runnable(target.target_named("avx2"))
        return
    _check(case, "avx2")


def _forced(src: str, variant: str) -> str:
    """``src`` with the chunk function ``variant`` chosen whatever the input's size
    (``run_chunk``: none of the others)."""
    lines = src.split("\n")
    at = -1
    if variant != "run_chunk":
        at = lines.index(f"        fn = {variant}")
        assert lines[at - 1].startswith("    if ")
        lines[at - 1] = "    if True:"
    for n, ln in enumerate(lines):     # later selects would override it
        if n > at and ln.startswith("        fn = run_chunk_"):
            lines[n - 1] = "    if False:"
    return "\n".join(lines)


def test_short_rows_module_has_stream_variants_chosen_by_size():
    """AMD's tuning (``facts.AMD_ROW_LOOPS``: Intel's cores have no stream variants)."""
    with target.use_target(None, cpu="amd"):
        short, default = _spmv_source(), _spmv_source(scalar_inner=False)
    assert "cdef void run_chunk_streams" in short
    select = short.split("\n")[short.split("\n").index("        fn = run_chunk_streams") - 1]
    assert f">= {STREAM_MIN_BYTES}" in select and f">= {STREAM_MIN_GATHER_BYTES}" in select
    # and only where the row lengths vary (the mispredicted exits the requests make up for)
    assert f"rows_vary_i32(a.t0_pos1, a.N_i, {ROWS_VARY_SAMPLES}, {ROWS_VARY_PERCENT})" in select
    assert "scorch_prefetch_stream(a.t0_crd1 + qb + " in short
    # the gather prefetch runs in the stream form too, and comes last (it wins when both hold)
    assert short.index("fn = run_chunk_streams") < short.index("fn = run_chunk_prefetch")
    pf = short[short.index("cdef void run_chunk_prefetch"):short.index("cdef void kernel_c")]
    assert f"while qb + {STREAM_BLOCK} <= h" in pf and "scorch_prefetch(a.t1_vals" in pf
    assert "run_chunk_streams" not in default and "scorch_prefetch_stream" not in default


def test_vectorized_gather_dot_uses_eight_lanes():
    """float32 on a 512-bit target asks for 256-bit vectors; float64 (8 lanes in 512 bits)
    and the AVX2 target (already 8 float32 lanes) ask for nothing; the flag is allowed."""
    flag = "-mprefer-vector-width=256"
    with target.use_target("avx512"):
        f32 = _spmv_source(scalar_inner=False)
        f64 = _spmv_source(torch.float64, scalar_inner=False)
        short = _spmv_source(scalar_inner=True)
    assert f"# scorch-cflags: {flag}" in f32
    assert flag not in f64 and flag not in short
    assert flag in build.source_cflags(f32)
    if AVX2:
        with target.use_target("avx2"):
            assert flag not in _spmv_source(scalar_inner=False)


@st.composite
def csr_case(draw, dtypes=(torch.float32, torch.float64), indices=(torch.int32, torch.int64)):
    """A scipy CSR matrix with empty rows, short rows, a single long row, or rows of several
    stream blocks, and the value and index types to run it with."""
    rows = draw(st.sampled_from([0, 1, 2, 17, 50, 150]))
    cols = draw(st.integers(1, 80))
    dtype, index = draw(st.sampled_from(dtypes)), draw(st.sampled_from(indices))
    kind = draw(st.sampled_from(["empty", "short", "mixed", "one long", "dense"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if kind == "empty":
        lens = np.zeros(rows, np.int64)
    elif kind == "short":
        lens = rng.integers(0, min(cols, 6) + 1, rows)
    elif kind == "mixed":
        lens = rng.integers(0, cols + 1, rows)
    elif kind == "one long":
        lens = rng.integers(0, min(cols, 3) + 1, rows)
        if rows:
            lens[rng.integers(rows)] = cols
    else:
        lens = np.full(rows, cols)
    crd = [np.sort(rng.choice(cols, int(n), replace=False)) for n in lens]
    M = sp.csr_matrix((rng.standard_normal(int(lens.sum())),
                       np.concatenate(crd + [np.zeros(0, np.int64)]).astype(np.int64),
                       np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)), shape=(rows, cols))
    return M, dtype, index


def _run_forced(M, dtype, index, variant, threads=1, name="native", scalar_inner=True, cpu="amd"):
    """Runs ``variant`` of the kernel generated for target ``name`` tuned for ``cpu``'s cores
    (AMD's tuning has every variant) on ``M`` and checks it against dense torch."""
    np_index = {torch.int32: np.int32, torch.int64: np.int64}[index]
    np_dtype = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    ptr, crd = M.indptr.astype(np_index), M.indices.astype(np_index)
    vals = M.data.astype(np_dtype)
    x = np.random.default_rng(1).standard_normal(M.shape[1]).astype(np_dtype)
    out = np.full(M.shape[0], np.nan, np_dtype)
    with target.use_target(name, cpu=cpu):
        mod = build.load_kernel(_forced(_spmv_source(dtype, scalar_inner, index), variant), name_hint="spmv_forced")
    mod.kernel([M.shape[0], M.shape[1], ptr.ctypes.data, crd.ctypes.data, vals.ctypes.data, 1,
                x.ctypes.data, out.ctypes.data, 1], threads)
    ref = torch.from_numpy(M.toarray()).to(dtype) @ torch.from_numpy(x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(torch.from_numpy(out), ref, rtol=tol, atol=tol)


@FAST
@given(data=st.data(), variant=st.sampled_from(["run_chunk_streams", "run_chunk_prefetch", "run_chunk_pairs"]),
       threads=st.sampled_from([1, 2]), cpu=st.sampled_from(["amd", "intel"]))
def test_stream_variants_match_dense(data, variant, threads, cpu):
    """Forced on small inputs (2 threads: chunks of rows from 64 rows up); Intel's tuning
    has no stream variant, and its gather prefetch runs without stream requests."""
    M, dtype, index = data.draw(csr_case())
    _run_forced(M, dtype, index, variant, threads, cpu="amd" if variant == "run_chunk_streams" else cpu)


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_avx2_stream_variant_matches_dense(data):
    if not AVX2:
        assert not target.runnable(target.target_named("avx2"))
        return
    M, dtype, index = data.draw(csr_case(dtypes=(torch.float32,), indices=(torch.int32,)))
    with target.use_target("avx2"):
        _run_forced(M, dtype, index, "run_chunk_streams")


@pytest.mark.parametrize("name", ["native", "avx2"])
def test_large_short_rows_input_takes_stream_variant(name):
    """Streams past STREAM_MIN_BYTES (float32/int32: 2^18 + entries) and x of
    STREAM_MIN_GATHER_BYTES, rows of 0 to 20 entries, one of 300: einsum chooses the stream
    variant by size, and it equals scipy."""
    if name == "avx2" and not AVX2:
        return
    rng = np.random.default_rng(3)
    rows = STREAM_MIN_BYTES // 8 // 9 + 1000
    lens = rng.integers(0, 21, rows)
    lens[rows // 2] = 300
    cols = STREAM_MIN_GATHER_BYTES // 4
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    assert ptr[-1] * 8 >= STREAM_MIN_BYTES and ptr[-1] <= short_rows_limit(torch.float32) * rows
    M = sp.csr_matrix((rng.standard_normal(ptr[-1]).astype(np.float32),
                       rng.integers(0, cols, ptr[-1]).astype(np.int32), ptr), shape=(rows, cols))
    M.sort_indices()
    x = torch.from_numpy(rng.standard_normal(cols).astype(np.float32))
    with target.use_target(name, cpu="amd"):
        got = scorch.einsum("ij,j->i", scorch.from_scipy(M), x)
    ref = torch.from_numpy((M.astype(np.float64) @ x.double().numpy()))
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)


def test_short_rows_module_calls_the_runtime_row_loops():
    """The plain chunk is the runtime's scalar row loop on every target; AVX-512 adds the
    gathered-dot loop, chosen when x spans HW_GATHER_MIN_BYTES and the rows vary, with its
    stream form last; AVX2 has no gathered variant (its gathers were never measured fast).
    AMD's tuning; Intel's: ``test_intel_tuning_gathers_more_rows_and_requests_no_streams``."""
    with target.use_target("avx512", cpu="amd"):
        short = _spmv_source()
        f64 = _spmv_source(torch.float64, index=torch.int64)
    lines = short.split("\n")
    chunk = short[short.index("cdef void run_chunk("):short.index("cdef void run_chunk_streams")]
    assert "rows_dot_f32_i32(a.t0_pos1, a.t0_crd1, a.t0_vals, a.t1_vals, a.out_vals, a.out_st_i, clo, chi)" in chunk
    # two sums a row from PAIRED_ROWS_MIN entries a row on average, chosen before the
    # stream and prefetch variants (which override it past the cache)
    select = lines[lines.index("        fn = run_chunk_pairs") - 1]
    assert select == f"    if a.t0_pos1[a.N_i] - a.t0_pos1[0] >= {PAIRED_ROWS_MIN} * a.N_i:"
    assert short.index("fn = run_chunk_pairs") < short.index("fn = run_chunk_streams")
    assert "rows_dot_pairs_f32_i32(" in short
    select = lines[lines.index("        fn = run_chunk_gathers") - 1]
    assert f">= {HW_GATHER_MIN_BYTES}" in select
    assert f"rows_vary_i32(a.t0_pos1, a.N_i, {ROWS_VARY_SAMPLES}, {ROWS_VARY_PERCENT})" in select
    assert short.index("fn = run_chunk_prefetch") < short.index("fn = run_chunk_gathers")
    assert "rows_gather_dot_f32_i32(" in short and ", clo, chi, 0)" in short and ", clo, chi, 512)" in short
    assert "rows_gather_dot_f64_i64(" in f64 and "rows_vary_i64(" in f64
    with target.use_target("avx2", cpu="amd"):
        avx2 = _spmv_source()
    assert "rows_dot_f32_i32(" in avx2 and "run_chunk_gathers" not in avx2
    # the vectorized module keeps its generated loop, and on AVX-512 gets the gathered one
    with target.use_target("avx512", cpu="amd"):
        vec = _spmv_source(scalar_inner=False)
    plain = vec[vec.index("cdef void run_chunk("):vec.index("cdef void run_chunk_prefetch")]
    assert "rows_dot" not in plain and "for q0_1 in range(" in plain
    assert "rows_gather_dot_f32_i32(" in vec and "fn = run_chunk_gathers_streams" in vec
    with target.use_target("avx2"):
        assert "rows_" not in _spmv_source(scalar_inner=False)


def test_intel_tuning_gathers_more_rows_and_requests_no_streams():
    """Intel's cores (``facts.INTEL_ROW_LOOPS``): no non-temporal stream requests (no stream
    variants, the gather prefetch without them), and the gathered dots for rows of
    PAIRED_ROWS_MIN and more on average or lengths that change in a fifth of the pairs,
    whatever x spans; the kernels of the two makers differ, and so do their plan keys."""
    tune = INTEL_ROW_LOOPS
    with target.use_target("avx512", cpu="intel") as t:
        assert t.cpu == "intel" and row_loop_tuning(t) is tune
        short, vec = _spmv_source(), _spmv_source(scalar_inner=False)
        intel_key = t.key
    with target.use_target("avx512", cpu="amd") as t:
        amd_short, amd_key = _spmv_source(), t.key
    assert intel_key != amd_key and short != amd_short
    for src in (short, vec):
        assert "run_chunk_streams" not in src and "run_chunk_gathers_streams" not in src
        assert "scorch_prefetch_stream(a." not in src and ", clo, chi, 512)" not in src
        lines = src.split("\n")
        select = lines[lines.index("        fn = run_chunk_gathers") - 1]
        assert select == (f"    if (a.t0_pos1[a.N_i] - a.t0_pos1[0] >= {tune.gather_rows_min} * a.N_i or "
                          f"rows_vary_i32(a.t0_pos1, a.N_i, {ROWS_VARY_SAMPLES}, {tune.gather_vary_percent})):")
    pf = short[short.index("cdef void run_chunk_prefetch"):short.index("cdef void run_chunk_gathers")]
    assert "scorch_prefetch(a.t1_vals" in pf and "qb" not in pf
    assert not tune.stream_requests and AMD_ROW_LOOPS.stream_requests
    with target.use_target("avx2", cpu="intel"):     # no gathered dots on AVX2, Intel or not
        assert "run_chunk_gathers" not in _spmv_source()


@pytest.mark.parametrize("dtype,index", [(torch.float32, torch.int32), (torch.float64, torch.int64)])
@pytest.mark.parametrize("variant", ["run_chunk", "run_chunk_pairs"])
def test_scalar_row_loops_split_long_rows(dtype, index, variant):
    """Rows of 1-3 entries with a few long ones (the scalar loops' four-sum path from 64
    entries: rows of 63, 64, 65 and 1,000, and a last row of 200) equal dense torch."""
    rng = np.random.default_rng(11)
    lens = rng.integers(1, 4, 300)
    lens[[10, 50, 51, 120]] = [63, 64, 65, 1000]
    lens[-1] = 200
    cols = 1200
    crd = [np.sort(rng.choice(cols, int(n), replace=False)) for n in lens]
    M = sp.csr_matrix((rng.standard_normal(int(lens.sum())), np.concatenate(crd),
                       np.concatenate([[0], np.cumsum(lens)])), shape=(len(lens), cols))
    for threads in (1, 2):
        _run_forced(M, dtype, index, variant, threads)


@FAST
@given(data=st.data(), variant=st.sampled_from(["run_chunk_gathers", "run_chunk_gathers_streams"]),
       threads=st.sampled_from([1, 2]), scalar_inner=st.booleans())
def test_gathered_row_loop_matches_dense(data, variant, threads, scalar_inner):
    """Forced on small inputs, in either module: empty rows, rows of 1-8 entries (one masked
    step), longer ones (full steps and a tail), every value and index type."""
    M, dtype, index = data.draw(csr_case())
    if not AVX512:      # built only for AVX-512 targets (the source test covers the rest)
        assert not target.runnable(target.target_named("avx512"))
        return
    _run_forced(M, dtype, index, variant, threads, name="avx512", scalar_inner=scalar_inner)


@pytest.mark.parametrize("kind", ["random rows", "mesh rows"])
@pytest.mark.parametrize("dtype,index", [(torch.float32, torch.int32), (torch.float64, torch.int64)])
def test_spmv_past_l1_matches_scipy(kind, dtype, index):
    """x past HW_GATHER_MIN_BYTES, rows of random lengths (the gathered-dot loop on AVX-512)
    or all of one length (the scalar loop): einsum equals scipy either way."""
    rng = np.random.default_rng(5)
    rows, cols = 3000, HW_GATHER_MIN_BYTES // 4 + 100
    lens = rng.integers(0, 14, rows) if kind == "random rows" else np.full(rows, 6)
    ptr = np.concatenate([[0], np.cumsum(lens)])
    M = sp.csr_matrix((rng.standard_normal(ptr[-1]), rng.integers(0, cols, ptr[-1]), ptr), shape=(rows, cols))
    M.sum_duplicates()
    A = torch.sparse_csr_tensor(torch.from_numpy(M.indptr).to(index), torch.from_numpy(M.indices).to(index),
                                torch.from_numpy(M.data).to(dtype), size=M.shape)
    x = torch.from_numpy(rng.standard_normal(cols)).to(dtype)
    got = scorch.einsum("ij,j->i", A, x)
    ref = torch.from_numpy(M @ x.double().numpy())
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
