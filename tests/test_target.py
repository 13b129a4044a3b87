"""Build targets (``scorch.tensor_compiler.target``): the widths each ISA level gets, the
generated source per target, the flags a chosen target builds with, results equal to dense
torch for every target this machine runs, and one OpenMP runtime per process."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler_helpers import dense, rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import build, plans
from scorch.tensor_compiler import target as T

NAMED = ("avx512", "avx2", "sse", "generic")
#: the targets this machine runs: its native build and every chosen one its CPU supports
#: (generic is sse's build on x86: one of them)
RUNNABLE = ["native"]
for _n in NAMED:
    _t = T.target_named(_n)
    if T.runnable(_t) and not _t.native and all(
            (_t.vector_bytes, _t.march) != (T.target_named(r).vector_bytes, T.target_named(r).march)
            for r in RUNNABLE):
        RUNNABLE.append(_n)


@pytest.fixture(autouse=True)
def _restore_target():
    yield
    T.set_target(None)


def test_widths_follow_vector_size_and_registers():
    avx512, avx2, sse = T.TARGETS["avx512"], T.TARGETS["avx2"], T.TARGETS["sse"]
    assert (avx512.vector_bytes, avx512.vector_registers) == (64, 32)
    assert (avx2.vector_bytes, avx2.vector_registers) == (32, 16)
    assert (sse.vector_bytes, T.TARGETS["generic"].vector_bytes) == (16, 16)
    assert avx512.lanes("float") == 16 and avx2.lanes("float") == 8 and avx2.lanes("double") == 4
    # rows of 16 and 32 bytes have their own (narrower) vector; then 1, 2, 4, ... registers
    # up to 512 bytes (AVX-512: 8 zmm; AVX2: 16 ymm)
    assert avx512.row_widths("float") == (4, 8, 16, 32, 64, 128)
    assert avx512.row_widths("double") == (2, 4, 8, 16, 32, 64)
    assert avx2.row_widths("float") == (4, 8, 16, 32, 64, 128)
    assert avx2.row_widths("double") == (2, 4, 8, 16, 32, 64)
    # 16 registers of 16 bytes: rows up to 256 bytes
    assert sse.row_widths("float") == (4, 8, 16, 32, 64)
    # a row narrower than the register is one vector of its own size
    assert [avx512.vector_bytes_for("float", w) for w in (4, 8, 16, 128)] == [16, 32, 64, 64]
    assert [avx512.vector_bytes_for("double", w) for w in (2, 4, 8)] == [16, 32, 64]
    assert [avx2.vector_bytes_for("float", w) for w in (4, 8, 16)] == [16, 32, 32]
    assert T.vector_type_name("float", 32, 64) == "scorch_vf32"
    assert T.vector_type_name("double", 32, 32) == "scorch_vd"


def _spmm_args(dtype=torch.float32):
    a = sparse(rand((6, 5), 0.5, dtype=dtype), "csr", index_dtype=torch.int32)
    return "ij,jk->ik", a, torch.randn(5, 4, dtype=dtype)


@pytest.mark.parametrize("name", NAMED)
def test_generated_source_per_target(name):
    t = T.target_named(name)
    for dtype, ct, size in ((torch.float32, "float", 4), (torch.float64, "double", 8)):
        with T.use_target(name):
            plan = C.explain(*_spmm_args(dtype))
            sddmm = C.explain("ij,ik,kj->ij", sparse(rand((6, 5), 0.5, dtype=dtype), "csr"),
                              torch.randn(6, 3, dtype=dtype), torch.randn(3, 5, dtype=dtype))
        src = plan.source
        nb = t.vector_bytes
        v = "scorch_vf" if ct == "float" else "scorch_vd"
        assert f"typedef {ct} {v} __attribute__((vector_size({nb}), aligned({size})" in src
        assert f"for (int i = 0; i < {nb // size}; i++)" in src
        widths = tuple(int(w) for w in re.findall(r"^cdef void run_chunk_w(\d+)\(", src, re.M))
        assert widths == t.row_widths(ct)
        # the widest variant holds one accumulator per vector of its row
        top = max(widths)
        assert len(set(re.findall(r"\bwv(\d+) = wv\1 \+", src))) == top * size // nb
        # a narrow row (16 bytes) is one accumulator of its own 16-byte vector type
        body = src.split(f"cdef void run_chunk_w{widths[0]}(")[1].split("cdef void")[0]
        narrow = T.vector_type_name(ct, 16, nb)
        assert f"cdef {narrow} wv0" in body and "wv1" not in body
        assert widths[0] * size == 16
        assert f"typedef {ct} {narrow} __attribute__((vector_size(16)" in src
        assert plan.loop_ir.vector_bytes == nb
        # the SDDMM dot product: lane-wise partial sums of the target's vectors
        assert f"vector_size({nb})" in sddmm.source
        assert (T.SOURCE_TAG + name in src) == (not t.native)


def test_native_source_has_no_target_line():
    with T.use_target("native"):
        src = C.explain(*_spmm_args()).source
    assert T.SOURCE_TAG not in src
    assert f"vector_size({T.native_target().vector_bytes})" in src


def test_plan_key_carries_the_target():
    eq, a, b = _spmm_args()
    with T.use_target("native"):
        native = C.explain(eq, a, b)
    with T.use_target("avx2"):
        chosen = C.explain(eq, a, b)
    assert (native.source == chosen.source) == T.target_named("avx2").native
    assert any(k[-1] == ("avx2", T.target_named("avx2").native, T.cpu_maker()) for k in plans._plans)
    # warm calls after a switch run the new target's kernel (the front table was emptied)
    plans._fast[("marker",)] = None
    T.set_target("sse" if T.current().name != "sse" else "avx2")   # another target than now
    assert ("marker",) not in plans._fast


def test_environment_variable_and_errors(monkeypatch):
    monkeypatch.setenv(T.TARGET_ENV, "avx2")
    assert T.set_target(None).name == "avx2"
    monkeypatch.setenv(T.TARGET_ENV, "native")
    assert T.set_target(None) == T.native_target()
    with pytest.raises(ValueError, match="SCORCH_TARGET='avx3'.*avx512, avx2"):
        T.set_target("avx3")
    monkeypatch.delenv(T.TARGET_ENV)
    assert T.set_target(None) == T.native_target()


def test_chosen_target_flags():
    flags = build.kernel_cflags(T.SOURCE_TAG + "avx2\n")
    if T.target_named("avx2").native:          # an AVX2-only machine: naming it is the native build
        assert "-march=native" in flags and "-march=haswell" not in flags
    else:
        assert "-march=haswell" in flags and "-march=native" not in flags
        assert "-mprefer-vector-width=512" not in flags
    assert "-fopenmp" in flags
    assert build.kernel_cflags("# no target\n")[:len(build.CFLAGS)] == list(build.CFLAGS)
    if T.target_named("avx512").native:        # naming the native ISA: the native build
        assert "-march=native" in build.kernel_cflags(T.SOURCE_TAG + "avx512\n")
    elif T.runnable(T.TARGETS["avx512"]):
        flags = build.kernel_cflags(T.SOURCE_TAG + "avx512\n")
        assert "-march=x86-64-v4" in flags and "-mprefer-vector-width=512" in flags


def test_unrunnable_target_is_refused(monkeypatch):
    fake = T.Target("future", 128, 32, ("-march=haswell",), frozenset({"no_such_isa_flag"}))
    monkeypatch.setitem(T.TARGETS, "future", fake)
    with pytest.raises(RuntimeError, match="target 'future'.*lacks.*no_such_isa_flag"):
        build.kernel_cflags(T.SOURCE_TAG + "future\n")


@pytest.mark.parametrize("name", RUNNABLE)
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(m=st.integers(0, 9), n=st.integers(0, 9), kind=st.sampled_from(["width", "width+1", "3", "0"]),
       density=st.sampled_from([0.0, 0.3, 1.0]), dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt=st.sampled_from(["csr", "dcsr"]), seed=st.integers(0, 99))
def test_spmm_equals_dense_per_target(name, m, n, kind, density, dtype, fmt, seed):
    """SpMM at every register width of the target (and just past it, and the generic
    row widths), against dense torch."""
    with T.use_target(name) as t:
        widths = t.row_widths("float" if dtype == torch.float32 else "double")
        w = widths[seed % len(widths)]
        k = {"width": w, "width+1": w + 1, "3": 3, "0": 0}[kind]
        a = rand((m, n), density, dtype=dtype, seed=seed)
        b = torch.randn(n, k, dtype=dtype, generator=torch.Generator().manual_seed(seed))
        got = dense(C.einsum("ij,jk->ik", sparse(a, fmt), b))
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, a @ b, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", RUNNABLE)
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(m=st.integers(0, 9), n=st.integers(0, 9), kind=st.sampled_from(["width", "width+1", "0"]),
       density=st.sampled_from([0.0, 0.3, 1.0]), dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt=st.sampled_from(["csr", "csc", "coo"]), strided=st.booleans(), seed=st.integers(0, 99))
def test_scattered_rows_equal_dense_per_target(name, m, n, kind, density, dtype, fmt, strided, seed):
    """``A^T @ G`` into a dense result adds each stored entry's row of G into the output
    row at its column (``facts._scattered_rows``): at every register width of the target,
    just past it and at 0, from a G laid out row-major or column-major, against torch."""
    with T.use_target(name) as t:
        widths = t.row_widths("float" if dtype == torch.float32 else "double")
        w = widths[seed % len(widths)]
        k = {"width": w, "width+1": w + 1, "0": 0}[kind]
        a = rand((m, n), density, dtype=dtype, seed=seed)
        g = torch.randn(m, k, dtype=dtype, generator=torch.Generator().manual_seed(seed))
        if strided:
            g = g.t().contiguous().t()
        plan = C.explain("ij,ik->jk", sparse(a, fmt), g, out_format="dense")
        got = C.einsum("ij,ik->jk", sparse(a, fmt), g, out_format="dense")
    if fmt == "csr":
        assert plan.loop_order == ["i", "j", "k"]
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, a.t() @ g, rtol=tol, atol=tol)


def test_scattered_rows_run_at_the_row_width():
    """The scatter's fixed-width variants exist for the target's row widths and the source
    adds whole vectors into the output (no run-time-width loop at those widths)."""
    a = sparse(rand((40, 30), 0.2, dtype=torch.float32, seed=3), "csr")
    src = C.explain("ij,ik->jk", a, torch.randn(40, 8), out_format="dense").source
    for w in T.current().row_widths("float"):
        assert f"run_chunk_w{w}(" in src and f"a.N_k == {w}" in src
    assert re.search(r"\(<scorch_vf\w*\*>\(a\.out_vals \+ oo_1 \+ 0\)\)\[0\] = \(<scorch_vf\w*\*>\(a\.out_vals", src)


@pytest.mark.parametrize("name", RUNNABLE)
def test_sddmm_spmv_and_panels_equal_dense_per_target(name):
    with T.use_target(name) as t:
        for dtype in (torch.float32, torch.float64):
            widths = t.row_widths("float" if dtype == torch.float32 else "double")
            a = rand((37, 29), 0.3, dtype=dtype, seed=1)
            s = sparse(a, "csr")
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            for k in (widths[0], widths[-1], 2 * widths[-1] + 3):   # the last: panels
                b, c = torch.randn(37, k, dtype=dtype), torch.randn(k, 29, dtype=dtype)
                torch.testing.assert_close(dense(C.einsum("ij,ik,kj->ij", s, b, c)),
                                           a * (b @ c), rtol=tol, atol=tol)
                x = torch.randn(29, k, dtype=dtype)
                torch.testing.assert_close(dense(C.einsum("ij,jk->ik", s, x)), a @ x, rtol=tol, atol=tol)
            v = torch.randn(29, dtype=dtype)
            torch.testing.assert_close(dense(C.einsum("ij,j->i", s, v)), a @ v, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmv_prefetch_variant_equals_dense(dtype):
    """An SpMV whose x exceeds facts.PREFETCH_MIN_BYTES runs the prefetching row loop (its
    last rows stop prefetching before the end of the coordinates); both builds (long rows:
    vectorized, short rows: scalar) agree with dense torch."""
    from scorch.tensor_compiler.lower.facts import PREFETCH_MIN_BYTES
    n = PREFETCH_MIN_BYTES // (4 if dtype == torch.float32 else 8) + 7
    g = torch.Generator().manual_seed(0)
    src = C.explain("ij,j->i", sparse(rand((3, 5), 0.5, dtype=dtype), "csr"), torch.randn(5, dtype=dtype)).source
    assert "cdef void run_chunk_prefetch(" in src and f">= {PREFETCH_MIN_BYTES}" in src
    assert "scorch_prefetch(a.t1_vals + a.t0_crd1[q0_1 + 64])" in src
    for m, per_row in ((40, 3), (6, 70)):          # short rows, then long ones
        rows = torch.arange(m).repeat_interleave(per_row)
        cols = torch.randint(0, n, (m * per_row,), generator=g)
        a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.rand(m * per_row, dtype=dtype, generator=g),
                                    (m, n)).coalesce().to_sparse_csr()
        x = torch.randn(n, dtype=dtype, generator=g)
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        torch.testing.assert_close(C.einsum("ij,j->i", a, x), torch.mv(a.to_dense(), x), rtol=tol, atol=tol)


def _openmp_mappings() -> set:
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if re.search(r"/libgomp[^/]*\.so", line)}


def test_one_openmp_runtime_after_running_kernels():
    from scorch._runtime import convert  # noqa: F401  (an extension built by setup.py)
    eq, a, b = _spmm_args()
    torch.testing.assert_close(dense(C.einsum(eq, a, b)), dense(a) @ b)
    maps = _openmp_mappings()
    assert len(maps) == 1, f"several OpenMP runtimes mapped: {sorted(maps)}"
    lib = T.openmp_library()
    if lib is not None:   # torch's own runtime is the one
        assert Path(next(iter(maps))).resolve() == lib.resolve()


def test_openmp_link_flags(tmp_path, monkeypatch):
    assert T.openmp_link_flags(tmp_path) == ()                      # torch ships none
    (tmp_path / "libgomp.so.1").write_bytes(b"")
    assert T.openmp_link_flags(tmp_path) == ()                      # shared by soname
    (tmp_path / "libgomp.so.1").unlink()
    renamed = tmp_path / "libgomp-a34b3233.so.1"
    renamed.write_bytes(b"")
    flags = T.openmp_link_flags(tmp_path)
    assert str(renamed) in flags and f"-Wl,-rpath,{tmp_path}" in flags and "-Wl,--as-needed" in flags
    monkeypatch.setattr(build, "_omp_flags", [flags])
    assert build.kernel_cflags("# kernel\n")[-len(flags):] == list(flags)


def test_cpu_maker_goes_with_every_target(monkeypatch):
    """The maker comes from /proc/cpuinfo (or SCORCH_CPU) and travels with named targets too;
    use_target can choose another for a block and restores the one before; unknown makers
    are refused by name."""
    monkeypatch.delenv(T.CPU_ENV, raising=False)
    here = T.cpu_maker()
    assert here in T.CPU_MAKERS and T.native_target().cpu == here
    assert T.target_named("avx2").cpu == here and T.target_named("native").cpu == here
    monkeypatch.setenv(T.CPU_ENV, "intel")
    assert T.cpu_maker() == "intel"
    monkeypatch.setenv(T.CPU_ENV, "arm")
    with pytest.raises(ValueError, match="SCORCH_CPU='arm'.*intel, amd, other"):
        T.cpu_maker()
    monkeypatch.delenv(T.CPU_ENV)
    before = T.current()
    other = "amd" if before.cpu == "intel" else "intel"
    with T.use_target(None, cpu=other) as t:
        assert t.cpu == other and t.name == before.name and T.current() == t
        assert t.key != before.key
        with T.use_target("avx2") as t2:            # a named target keeps this CPU's maker
            assert t2.cpu == here
    assert T.current() == before
    with pytest.raises(ValueError, match="cpu='via'"):
        T.set_target(None, cpu="via")
    assert T.current() == before
