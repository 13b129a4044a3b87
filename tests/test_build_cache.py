"""Tests for the kernel build-and-cache layer (scorch/tensor_compiler/build.py).

Compiles cost ~0.4-1 s each, so kernels are built once per module where possible.
Subprocesses load build.py by file path rather than ``import scorch`` so each one skips
the ~1.5 s torch import; build.py has no scorch imports, so this is the same code.
"""
from __future__ import annotations

import json
import os
import warnings
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from scorch.tensor_compiler import build
from scorch.tensor_compiler.build import CompileError, cache_clear, cache_info, load_kernel

BUILD_PY = Path(build.__file__).resolve()

SPMM = textwrap.dedent('''
    from cython.parallel import prange
    from libc.stdint cimport int32_t, int64_t

    cdef void _spmm_i32(const int32_t* indptr, const int32_t* indices, const float* data,
                        const float* B, float* C, Py_ssize_t nrows, Py_ssize_t ncols,
                        int nthreads) noexcept nogil:
        cdef Py_ssize_t i, jj, k
        for i in prange(nrows, nogil=True, schedule='dynamic', num_threads=nthreads):
            for jj in range(indptr[i], indptr[i + 1]):
                for k in range(ncols):
                    C[i * ncols + k] += data[jj] * B[indices[jj] * ncols + k]

    cdef void _spmm_i64(const int64_t* indptr, const int64_t* indices, const float* data,
                        const float* B, float* C, Py_ssize_t nrows, Py_ssize_t ncols,
                        int nthreads) noexcept nogil:
        cdef Py_ssize_t i, jj, k
        for i in prange(nrows, nogil=True, schedule='dynamic', num_threads=nthreads):
            for jj in range(indptr[i], indptr[i + 1]):
                for k in range(ncols):
                    C[i * ncols + k] += data[jj] * B[indices[jj] * ncols + k]

    def spmm(size_t indptr, size_t indices, size_t data, size_t B, size_t C,
             Py_ssize_t nrows, Py_ssize_t ncols, bint idx64, int nthreads=2):
        with nogil:
            if idx64:
                _spmm_i64(<const int64_t*>indptr, <const int64_t*>indices,
                          <const float*>data, <const float*>B, <float*>C, nrows, ncols,
                          nthreads)
            else:
                _spmm_i32(<const int32_t*>indptr, <const int32_t*>indices,
                          <const float*>data, <const float*>B, <float*>C, nrows, ncols,
                          nthreads)
''')

LIBCPP_MAP = textwrap.dedent('''
    from libcpp.map cimport map
    from libc.stdint cimport int64_t

    def count_distinct(size_t keys, Py_ssize_t n):
        cdef map[int64_t, int64_t] m
        cdef const int64_t* k = <const int64_t*>keys
        cdef Py_ssize_t i
        for i in range(n):
            m[k[i]] += 1
        return [(p.first, p.second) for p in m]
''')

# Loads build.py standalone, waits for a "go" file (so two copies really race), then
# loads the kernel and reports where it came from.
CHILD = textwrap.dedent('''
    import importlib.util, json, os, sys, time
    spec = importlib.util.spec_from_file_location("_scorch_build", sys.argv[1])
    b = importlib.util.module_from_spec(spec)
    sys.modules["_scorch_build"] = b
    spec.loader.exec_module(b)
    src = open(sys.argv[2]).read()
    go = sys.argv[3] if len(sys.argv) > 3 else None
    while go and not os.path.exists(go):
        time.sleep(0.005)
    m = b.load_kernel(src, "child")
    ok = m.add(2, 3) == 5 if hasattr(m, "add") else True
    print(json.dumps({"file": m.__file__, "ok": ok, **b.cache_info()}))
''')


def _csr(rng, nrows, ncols, density, idx_dtype):
    dense = rng.random((nrows, ncols)).astype(np.float32)
    dense[rng.random((nrows, ncols)) > density] = 0
    indptr = np.zeros(nrows + 1, dtype=idx_dtype)
    indptr[1:] = np.cumsum((dense != 0).sum(axis=1))
    rows, cols = np.nonzero(dense)
    return dense, indptr, cols.astype(idx_dtype), dense[rows, cols].astype(np.float32)


def _run_child(script: Path, source_file: Path, cache: Path, go: Path | None = None):
    env = dict(os.environ, SCORCH_CACHE_DIR=str(cache))
    args = [sys.executable, str(script), str(BUILD_PY), str(source_file)]
    if go is not None:
        args.append(str(go))
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One cache dir for the module; the in-process table is global, so reset it."""
    d = tmp_path_factory.mktemp("kcache")
    old = os.environ.get("SCORCH_CACHE_DIR")
    os.environ["SCORCH_CACHE_DIR"] = str(d)
    cache_clear()
    yield d
    cache_clear()
    if old is None:
        os.environ.pop("SCORCH_CACHE_DIR", None)
    else:
        os.environ["SCORCH_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def spmm_mod(cache_dir):
    return load_kernel(SPMM, "spmm")


@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_kernel_compiles_and_computes(spmm_mod, idx_dtype):
    rng = np.random.default_rng(0)
    dense, indptr, indices, data = _csr(rng, 57, 41, 0.2, idx_dtype)
    B = rng.random((41, 9)).astype(np.float32)
    C = np.zeros((57, 9), dtype=np.float32)
    spmm_mod.spmm(indptr.ctypes.data, indices.ctypes.data, data.ctypes.data, B.ctypes.data,
                  C.ctypes.data, 57, 9, idx_dtype == np.int64)
    np.testing.assert_allclose(C, dense @ B, rtol=1e-5, atol=1e-5)


def test_disk_layout_and_memory_hit(spmm_mod, cache_dir):
    info = cache_info()
    assert info["misses"] == 1 and info["loaded"] == 1
    so = Path(spmm_mod.__file__)
    assert so.parent == cache_dir / f"kernels-v{build.BUILD_VERSION}"
    assert so.with_name(so.name.split(".")[0] + ".pyx").read_text() == SPMM  # readable
    assert info["disk_kernels"] == 1 and info["disk_bytes"] > so.stat().st_size
    assert list((so.parent / "tmp").iterdir()) == []        # temp build dirs cleaned

    hits = info["hits"]
    t0 = time.perf_counter()
    for _ in range(1000):
        assert load_kernel(SPMM, "spmm") is spmm_mod
    per_call = (time.perf_counter() - t0) / 1000
    info = cache_info()
    assert info["hits"] == hits + 1000 and info["misses"] == 1
    assert per_call < 50e-6, f"warm lookup took {per_call * 1e6:.1f} us"


def test_fresh_process_loads_from_disk(spmm_mod, cache_dir, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    src = tmp_path / "src.pyx"
    src.write_text(SPMM)
    # name_hint is part of the identity; the child uses "child", so publish one under it
    load_kernel(SPMM, "child")
    p = _run_child(script, src, cache_dir)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    info = json.loads(out)
    assert info["disk_hits"] == 1 and info["misses"] == 0, info
    assert "compiling" not in err
    assert Path(info["file"]).parent == Path(spmm_mod.__file__).parent


def test_compile_logs_location(cache_dir, caplog):
    src = SPMM.replace("nthreads=2", "nthreads=1")       # a new key
    with caplog.at_level("INFO", logger="scorch"):
        load_kernel(src, "logged")
    msgs = [r.getMessage() for r in caplog.records if r.name == "scorch"]
    assert any("compiling kernel" in m and str(cache_dir) in m for m in msgs), msgs


def test_cache_clear(cache_dir):
    mod = load_kernel(SPMM, "spmm")
    assert cache_info()["disk_kernels"] >= 1
    cache_clear()
    info = cache_info()
    assert info["disk_kernels"] == 0 and info["loaded"] == 0
    assert info["hits"] == info["misses"] == 0
    assert not any(p.suffix == ".pyx" for p in Path(info["cache_dir"]).iterdir())
    # the module a caller holds keeps working
    indptr = np.array([0, 1], dtype=np.int32)
    indices = np.array([0], dtype=np.int32)
    data = np.array([2.0], dtype=np.float32)
    B = np.array([[3.0]], dtype=np.float32)
    C = np.zeros((1, 1), dtype=np.float32)
    mod.spmm(indptr.ctypes.data, indices.ctypes.data, data.ctypes.data, B.ctypes.data,
             C.ctypes.data, 1, 1, False)
    assert C[0, 0] == 6.0
    # and the next load rebuilds the disk entry
    again = load_kernel(SPMM, "spmm")
    assert cache_info()["misses"] == 1 and cache_info()["disk_kernels"] == 1
    assert Path(again.__file__).exists()


def test_cython_error_raises_compile_error(cache_dir):
    bad = "def f(x):\n    return x +* 2\n"
    with pytest.raises(CompileError) as ei:
        load_kernel(bad, "broken")
    msg = str(ei.value)
    pyx = Path(ei.value.pyx_path)
    assert str(pyx) in msg and pyx.exists() and pyx.parent.name == "failed"
    assert pyx.read_text() == bad
    assert "Expected" in msg or "Syntax" in msg, msg                 # Cython's own words
    assert f"{pyx}:2:" in msg                                           # position -> kept file
    assert isinstance(ei.value, RuntimeError)


def test_c_error_raises_compile_error(cache_dir):
    bad = textwrap.dedent('''
        cdef extern from "scorch_no_such_header.h":
            int scorch_missing(int)

        def f(int x):
            return scorch_missing(x)
    ''')
    with pytest.raises(CompileError) as ei:
        load_kernel(bad, "cbroken")
    msg = str(ei.value)
    pyx = Path(ei.value.pyx_path)
    assert str(pyx) in msg and pyx.exists() and ei.value.stage == "cc"
    assert "scorch_no_such_header.h" in msg and "error" in msg, msg   # gcc's stderr
    tmp_root = Path(cache_info()["cache_dir"]) / "tmp"
    assert str(tmp_root) not in msg                 # paths point at the kept copies
    assert not list(tmp_root.iterdir())


def test_concurrent_processes_same_key(tmp_path):
    cache = tmp_path / "race-cache"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    src = tmp_path / "src.pyx"
    src.write_text(f"# race {time.time_ns()}\ndef add(int a, int b):\n    return a + b\n")
    go = tmp_path / "go"
    procs = [_run_child(script, src, cache, go) for _ in range(2)]
    time.sleep(0.3)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        results.append((json.loads(out), err))
    (a, err_a), (b, _) = results
    assert a["ok"] and b["ok"]
    assert a["file"] == b["file"] and Path(a["file"]).exists()
    assert a["misses"] + a["disk_hits"] == 1 and b["misses"] + b["disk_hits"] == 1
    # the very first compile in a process is visible with no logging configuration
    if a["misses"]:
        assert "compiling kernel" in err_a and "on first use" in err_a
    kdir = Path(a["cache_dir"])
    assert sorted(p.name.rsplit(".", 1)[-1] for p in kdir.iterdir() if p.is_file()
                  and p.name != ".publish.lock") == ["pyx", "so", "sum"]
    assert list((kdir / "tmp").iterdir()) == []


def test_libcpp_kernel_builds_as_cpp(cache_dir):
    assert build._is_cpp(LIBCPP_MAP)
    assert build._is_cpp("# distutils: language = c++\ndef f(): pass\n")
    assert not build._is_cpp(SPMM)
    mod = load_kernel(LIBCPP_MAP, "cppmap")
    keys = np.array([5, 1, 5, 3, 1, 5], dtype=np.int64)
    assert mod.count_distinct(keys.ctypes.data, len(keys)) == [(1, 2), (3, 1), (5, 3)]


def test_cpp_kernels_use_precompiled_header_once_built(cache_dir, monkeypatch):
    """The first C++ kernel starts the PCH build; later ones compile with -include."""
    monkeypatch.setattr(build, "PREBUILT_DIR", cache_dir / "no-install")   # not the installed PCH
    load_kernel(LIBCPP_MAP.replace("count_distinct", "count_distinct_first"), "cppmap_first")
    for t in list(build._pch_threads.values()):
        t.join(timeout=120)
    gch = list((Path(cache_info()["cache_dir"]) / "pch").glob("scorch_cxx_*.h.gch"))
    assert len(gch) == 1, "PCH was not built"
    src = LIBCPP_MAP.replace("count_distinct", "count_distinct2")
    mod = load_kernel(src, "cppmap_pch")
    assert "-include" in build._last_cc_cmd
    keys = np.array([7, 7, 2], dtype=np.int64)
    assert mod.count_distinct2(keys.ctypes.data, 3) == [(2, 1), (7, 2)]


# --- a damaged cache heals itself ---------------------------------------------------------

HEAL_CHILD = textwrap.dedent('''
    import importlib.util, json, sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("_scorch_build", sys.argv[1])
    b = importlib.util.module_from_spec(spec)
    sys.modules["_scorch_build"] = b
    spec.loader.exec_module(b)
    if len(sys.argv) > 3:
        b.PREBUILT_DIR = Path(sys.argv[3])
    m = b.load_kernel(open(sys.argv[2]).read(), "heal")
    print(json.dumps({"file": m.__file__, "value": m.add(2, 3), **b.cache_info()}))
''')


def _heal_child(tmp_path, cache, source, prebuilt=None):
    script = tmp_path / "heal_child.py"
    script.write_text(HEAL_CHILD)
    src = tmp_path / "heal_src.pyx"
    src.write_text(source)
    args = [sys.executable, str(script), str(BUILD_PY), str(src)]
    if prebuilt is not None:
        args.append(str(prebuilt))
    proc = subprocess.run(args, env=dict(os.environ, SCORCH_CACHE_DIR=str(cache)),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _unique_add():
    return f"# heal {time.time_ns()}\ndef add(int a, int b):\n    return a + b\n"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One kernel built by a child into a cache that the tests below copy and damage."""
    tmp = tmp_path_factory.mktemp("pristine")
    source = _unique_add()
    out, _ = _heal_child(tmp, tmp / "cache", source)
    assert out["misses"] == 1
    return source, tmp / "cache", Path(out["file"])


def _copy_of(pristine, dest):
    import shutil
    source, cache, so = pristine
    shutil.copytree(cache, dest)
    return dest / so.relative_to(cache)


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_checksum"])
def test_damaged_kernel_is_quarantined_and_rebuilt_in_a_fresh_process(tmp_path, pristine, damage):
    source = pristine[0]
    so = _copy_of(pristine, tmp_path / "cache")
    assert so.with_name(so.name + ".sum").exists()
    data = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 3])
    elif damage == "flip":
        so.write_bytes(data[:4000] + bytes([data[4000] ^ 0xFF]) + data[4001:])
    else:
        so.with_name(so.name + ".sum").unlink()
    second, err = _heal_child(tmp_path, tmp_path / "cache", source)
    assert second["value"] == 5 and second["misses"] == 1 and second["disk_hits"] == 0
    assert "not used" in err and "rebuilding" in err
    quarantined = list((so.parent / "quarantine").iterdir())
    assert any(p.name.startswith(so.name) for p in quarantined), quarantined
    assert build.file_checksum(so) == json.loads(so.with_name(so.name + ".sum").read_text())
    if damage == "truncate":
        third, _ = _heal_child(tmp_path, tmp_path / "cache", source)   # healed: a disk hit
        assert third["disk_hits"] == 1 and third["misses"] == 0


def test_damaged_prebuilt_kernel_falls_back_to_building(tmp_path, pristine):
    source, _, so = pristine
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    (prebuilt / so.name).write_bytes(so.read_bytes()[:5000])        # truncated copy
    (prebuilt / (so.name + ".sum")).write_text(so.with_name(so.name + ".sum").read_text())
    out, err = _heal_child(tmp_path, tmp_path / "cache", source, prebuilt)
    assert out["value"] == 5 and out["misses"] == 1 and "building it instead" in err
    assert (prebuilt / so.name).exists()           # the package folder is not touched
    good = tmp_path / "prebuilt_ok"
    good.mkdir()
    for f in (so, so.with_name(so.name + ".sum")):
        (good / f.name).write_bytes(f.read_bytes())
    out, _ = _heal_child(tmp_path, tmp_path / "cache2", source, good)
    assert out["misses"] == 0 and out["disk_hits"] == 1 and "prebuilt_ok" in out["file"]


def test_elf_check_for_modules_without_checksum(tmp_path, spmm_mod):
    so = Path(spmm_mod.__file__)
    fd = os.open(so, os.O_RDONLY)
    try:
        assert build._elf_complete(fd, so.stat().st_size)
        assert not build._elf_complete(fd, so.stat().st_size // 2)
    finally:
        os.close(fd)
    bad = tmp_path / ("truncated_mod" + build._EXT_SUFFIX)
    bad.write_bytes(so.read_bytes()[:1000])
    with pytest.raises(build.KernelFileError, match="not a complete shared object"):
        build._import_extension("truncated_mod", bad)


# --- an unusable cache directory --------------------------------------------------------

def _fresh_dir_state():
    build._checked_dirs.clear()
    build._warned_dirs.clear()


@pytest.mark.parametrize("problem", ["file", "group_writable", "world_writable", "other_owner"])
def test_unusable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch, problem):
    base = tmp_path / "base"
    if problem == "file":
        base.write_text("not a folder")
        expect = "[Nn]ot a directory"
    else:
        base.mkdir(mode=0o700)
        if problem == "group_writable":
            base.chmod(0o770)
            expect = "writable by group"
        elif problem == "world_writable":
            base.chmod(0o707)
            expect = "writable by others"
        else:
            if os.geteuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(base, 1, 1)
            expect = "owned by user id 1"
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(base))
    _fresh_dir_state()
    try:
        with pytest.warns(RuntimeWarning, match=expect) as record:
            first = build.cache_dir()
            second = build.cache_dir()
        assert len(record) == 1 and first == second
        assert not str(first).startswith(str(base)) and first.is_dir()
        assert (first.parent.stat().st_mode & 0o077) == 0       # private
        mod = load_kernel(_unique_add(), "fallback")
        assert mod.add(1, 2) == 3 and Path(mod.__file__).parent == first
    finally:
        _fresh_dir_state()


def test_usable_cache_dir_in_a_sticky_shared_folder(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(shared / "mine"))
    _fresh_dir_state()
    try:
        import warnings as _w
        with _w.catch_warnings():
            _w.simplefilter("error")
            assert build.cache_dir() == shared / "mine" / f"kernels-v{build.BUILD_VERSION}"
    finally:
        _fresh_dir_state()


# --- temporary build folders and the precompiled header ------------------------------

def test_cache_clear_removes_temporary_build_dirs_not_in_use(cache_dir):
    import fcntl
    tmp_root = Path(cache_info()["cache_dir"]) / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    left = tmp_root / "left-by-a-killed-build"
    left.mkdir()
    (left / "k.c").write_text("int x;")
    busy = tmp_root / "in-flight"
    busy.mkdir()
    fd = os.open(busy / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    starting = tmp_root / "just-made"         # between mkdtemp and its flock: no lock yet
    starting.mkdir()
    old = time.time() - 120
    for d in (left, busy):
        os.utime(d, (old, old))
    try:
        cache_clear()
        assert not left.exists() and busy.exists() and starting.exists()
    finally:
        os.close(fd)
    cache_clear()
    assert not busy.exists()


def test_damaged_precompiled_header_is_not_used(cache_dir, monkeypatch):
    monkeypatch.setattr(build, "PREBUILT_DIR", cache_dir / "no-install")
    cdir = build.cache_dir()
    header, gch = build._pch_paths(cdir, False)
    header.parent.mkdir(parents=True, exist_ok=True)
    # a lock held elsewhere: no second build starts, and the damaged file is not used
    import fcntl
    fd = os.open(gch.with_name(gch.name + ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        gch.write_bytes(b"garbage")
        gch.with_name(gch.name + ".sum").write_text(json.dumps({"size": 1, "sha256": "0" * 64}))
        build._pch_checked.clear()
        assert build._pch(cdir, False) is None
        assert not build._pch_ok(gch) and build._pch_building_elsewhere(gch)
        assert str(gch) not in build._pch_threads or not build._pch_threads[str(gch)].is_alive()
    finally:
        os.close(fd)
    gch.with_name(gch.name + ".sum").write_text(json.dumps(build.file_checksum(gch)))
    build._pch_checked.clear()
    assert build._pch_ok(gch) and build._pch(cdir, False) == header
    gch.unlink()


FASTCALL_CHILD = textwrap.dedent('''
    import json, shutil, sys
    from pathlib import Path
    from scorch.tensor_compiler import build, fastcall
    good, where = Path(sys.argv[1]), sys.argv[2]
    build.PREBUILT_DIR = Path(sys.argv[3])
    name = fastcall.module_name()
    folder = build.cache_dir() if where == "cache" else build.PREBUILT_DIR
    damaged = folder / (name + build._EXT_SUFFIX)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(good, damaged)
    build.write_checksum(damaged)                       # the checksum of the whole file
    damaged.write_bytes(good.read_bytes()[: good.stat().st_size // 2])   # then truncated
    compiled = []

    def compile_copy(name, dest):                       # a build, without the 15 s of g++
        compiled.append(name)
        tmp = dest.parent / "tmp-copy.so"
        shutil.copyfile(good, tmp)
        build.publish(tmp, dest)
    fastcall._compile = compile_copy
    mod = fastcall.load()
    cached = build.cache_dir() / damaged.name
    print(json.dumps({"name": damaged.name, "loaded": mod is not None and mod.__name__ == name, "compiled": len(compiled),
                      "from": mod.__file__, "verified": build._verified_now(cached),
                      "quarantined": [p.name for p in (damaged.parent / "quarantine").glob("*")]
                      if (damaged.parent / "quarantine").is_dir() else [],
                      "install_copy_left": damaged.exists() if where == "install" else None}))
''')


@pytest.mark.parametrize("where", ["cache", "install"])
def test_damaged_fastcall_module_is_not_loaded_and_is_rebuilt(tmp_path, where):
    """The C warm-call module is published with its checksum like a kernel: a truncated copy
    is never loaded; in the cache it is quarantined, at the install it is skipped; either
    way a fresh build is published (and verified) in the cache."""
    from scorch.tensor_compiler import fastcall
    mod = fastcall.load()
    if mod is None:
        pytest.skip("the C warm-call module cannot be built here (no torch headers / g++)")
    env = dict(os.environ, SCORCH_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", FASTCALL_CHILD, mod.__file__, where,
                          str(tmp_path / "install")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] and report["compiled"] == 1 and report["verified"], report
    assert str(tmp_path / "cache") in report["from"], report
    assert "not used" in out.stderr, out.stderr[-2000:]
    if where == "cache":
        assert any(q.startswith(report["name"] + ".") and ".sum." not in q
                   for q in report["quarantined"]), report
    else:
        assert report["install_copy_left"] and not report["quarantined"], report


# --- install progress ---------------------------------------------------------------

def test_prebuild_prints_a_line_per_kernel(monkeypatch, capsys):
    from scorch.tensor_compiler import prebuilt
    assert prebuilt._case_count() == len(prebuilt.standard_cases())
    ran = []
    fake = [(f"case{n}", lambda n=n: ran.append(n)) for n in range(5)]
    monkeypatch.setattr(prebuilt, "standard_cases", lambda: fake)
    monkeypatch.setattr(build, "PREBUILT_DIR", build.PREBUILT_DIR)   # restored afterwards
    prebuilt._run_part(1, 2)
    lines = capsys.readouterr().out.splitlines()
    assert ran == [1, 3]
    assert lines[0].startswith("scorch: [worker 2/2] 1/2 case1") and "2 of 5 overall" in lines[0]
    assert lines[1].startswith("scorch: [worker 2/2] 2/2 case3") and "4 of 5 overall" in lines[1]


def test_a_cache_dir_failing_during_a_build_falls_back_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path / "fails"))
    _fresh_dir_state()
    real = build._build
    calls = []

    def flaky(source, name, cdir):
        calls.append(cdir)
        if len(calls) == 1:
            raise PermissionError(13, "Permission denied", str(cdir / "tmp"))
        return real(source, name, cdir)

    monkeypatch.setattr(build, "_build", flaky)
    try:
        with pytest.warns(RuntimeWarning, match="building in it failed") as record:
            mod = load_kernel(_unique_add(), "flaky")
            load_kernel(_unique_add(), "flaky2")
        assert mod.add(2, 2) == 4 and len(record) == 1
        assert calls[1] == calls[2] == build._private_cache() != calls[0]
    finally:
        _fresh_dir_state()


def test_precompiled_header_build_waits_for_no_one(tmp_path):
    """A PCH build lock held by another process: this one does not build a second copy."""
    import fcntl
    header = tmp_path / "pch" / "scorch_c_test.h"
    gch = header.with_name(header.name + ".gch")
    header.parent.mkdir()
    fd = os.open(gch.with_name(gch.name + ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        t0 = time.perf_counter()
        build._build_pch(header, gch, False)
        assert time.perf_counter() - t0 < 1.0
        assert not gch.exists() and not header.exists()
    finally:
        os.close(fd)


def test_prebuilt_cases_take_scorch_and_torch_operands():
    import torch

    import scorch
    from scorch.tensor_compiler import prebuilt
    s = scorch.sparse_tensor(torch.eye(3), format="csr")
    assert prebuilt._storage_of(s) is s._storage            # (the add cases failed on this)
    assert prebuilt._storage_of(torch.eye(3).to_sparse_csr()).format == scorch.Format("dc")


def test_cache_folders_scorch_creates_are_private_under_umask_002(tmp_path, monkeypatch):
    """The folders scorch creates for its cache (the default ``~/.cache/scorch`` and any
    missing parent) are 0700 whatever the umask: under the common 002, ``mkdir(parents=True)``
    made the parents 0775, which the safety check then refused, so no kernel was ever kept.
    A default folder left 0775 by an earlier version is narrowed; a configured one is not."""
    monkeypatch.delenv("SCORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg" / "cache"))
    old = os.umask(0o002)
    _fresh_dir_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")                 # no fallback warning
            d = build.cache_dir()
        assert d == tmp_path / "xdg" / "cache" / "scorch" / f"kernels-v{build.BUILD_VERSION}"
        for p in (d, d.parent, d.parent.parent, d.parent.parent.parent):
            assert (p.stat().st_mode & 0o777) == 0o700, p
        d.parent.chmod(0o775)                               # as an earlier version left it
        _fresh_dir_state()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert build.cache_dir() == d
        assert (d.parent.stat().st_mode & 0o777) == 0o755
    finally:
        os.umask(old)
        _fresh_dir_state()


def test_a_kernel_removed_right_after_publishing_still_loads(cache_dir, monkeypatch):
    """Another process's ``cache_clear`` may delete the file a build just published before
    the builder imports it: the builder imports its own link to the file."""
    real_publish = build.publish

    def publish_then_cleared(src, dest):
        real_publish(src, dest)
        dest.unlink()
        dest.with_name(dest.name + build.CHECKSUM_SUFFIX).unlink()
    monkeypatch.setattr(build, "publish", publish_then_cleared)
    mod = load_kernel(_unique_add(), "cleared")
    assert mod.add(2, 3) == 5


def _fake_kernels(folder: Path, sizes_and_ages: dict) -> None:
    """A module per stem: its .so (``size`` bytes, last used ``age`` seconds ago), checksum
    and .pyx."""
    now = time.time()
    for stem, (size, age) in sizes_and_ages.items():
        so = folder / (stem + build._EXT_SUFFIX)
        so.write_bytes(b"\0" * size)
        (folder / (so.name + build.CHECKSUM_SUFFIX)).write_text("{}")
        (folder / (stem + ".pyx")).write_text("#")
        os.utime(so, (now - age, now - age))


def test_prune_removes_least_recently_used_kernels_past_the_bound(tmp_path):
    """Past the bound, whole modules go oldest first until at most PRUNE_TO of it is left;
    other files (precompiled headers, folders) stay; under the bound nothing goes."""
    _fake_kernels(tmp_path, {"k_old": (4000, 500), "k_mid": (4000, 300), "k_new": (4000, 10),
                             "k_newest": (4000, 1)})
    (tmp_path / "pch").mkdir()
    (tmp_path / "other.gch").write_bytes(b"\0" * 50000)
    assert build.prune_cache(tmp_path, limit=20000) == 0          # 16k + small files
    removed = build.prune_cache(tmp_path, limit=12000)             # keep <= 9000
    names = sorted(p.name for p in tmp_path.iterdir())
    assert removed > 8000
    assert not any(n.startswith(("k_old", "k_mid")) for n in names)
    assert sum(n.startswith("k_new.") for n in names) == 3 and sum(n.startswith("k_newest.") for n in names) == 3
    assert "pch" in names and "other.gch" in names


def test_cache_limit_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(build.CACHE_MAX_ENV, "0")
    assert build.cache_limit() is None and build.prune_cache(limit=None) == 0
    monkeypatch.setenv(build.CACHE_MAX_ENV, "1.5")
    assert build.cache_limit() == int(1.5 * (1 << 20))
    monkeypatch.setenv(build.CACHE_MAX_ENV, "lots")
    with caplog.at_level("WARNING", logger="scorch"):
        assert build.cache_limit() == build.DEFAULT_CACHE_MAX_MB << 20
    assert "SCORCH_CACHE_MAX_MB='lots' is not a number" in caplog.text
    monkeypatch.delenv(build.CACHE_MAX_ENV)
    assert cache_info()["disk_limit_bytes"] == build.DEFAULT_CACHE_MAX_MB << 20


def test_loading_a_kernel_from_disk_marks_it_used(cache_dir):
    source = _unique_add()
    mod = load_kernel(source, "marked")
    so = Path(mod.__file__)
    os.utime(so, (1000, 1000))
    build._memory.clear()                 # the next lookup goes to the disk
    assert load_kernel(source, "marked") is mod
    assert time.time() - so.stat().st_mtime < 60


def test_a_compile_prunes_the_cache_in_the_background(tmp_path, monkeypatch):
    """A compile past the bound starts the pruning (at most once a minute): the oldest
    kernels go, the one just built stays."""
    folder = tmp_path / f"kernels-v{build.BUILD_VERSION}"
    folder.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    _fake_kernels(folder, {"k_stale": (300_000, 10_000)})
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(build.CACHE_MAX_ENV, "0.2")                  # ~210 KB
    monkeypatch.setattr(build, "_last_prune", [float("-inf")])
    started = []
    real_thread = build.threading.Thread

    def recording(*args, **kwargs):
        t = real_thread(*args, **kwargs)
        started.append(t)
        return t
    monkeypatch.setattr(build.threading, "Thread", recording)
    mod = load_kernel(_unique_add(), "prunes")
    assert mod.add(1, 1) == 2
    assert started, "no pruning started"
    started[0].join(10)
    assert not (folder / ("k_stale" + build._EXT_SUFFIX)).exists()
    assert Path(mod.__file__).exists()


def test_a_read_only_cache_is_still_read(tmp_path, monkeypatch, pristine):
    """A configured cache of ours that is only read-only (baked into an image): its kernels
    load from it, and only new ones are built, in the private folder."""
    source = pristine[0]
    base = tmp_path / "baked"
    so = _copy_of(pristine, base)
    real = build._unusable
    monkeypatch.setattr(build, "_unusable",
                        lambda d: build.NOT_WRITABLE if str(d).startswith(str(base)) else real(d))
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(base))
    _fresh_dir_state()
    try:
        with pytest.warns(RuntimeWarning, match="still read"):
            private = build.cache_dir()
        before = build.cache_info()["misses"]
        mod = load_kernel(source, "heal")
        assert mod.add(2, 3) == 5 and Path(mod.__file__) == so
        assert build.cache_info()["misses"] == before
        new = load_kernel(_unique_add(), "fresh")            # not in the image: built privately
        assert Path(new.__file__).parent == private
    finally:
        _fresh_dir_state()


def test_kernel_key_leaves_out_comment_lines_but_not_directives():
    """The header codegen writes (expression, formats, loop order) does not change the
    kernel: sources that differ only there are one cached module. Directives (Cython's,
    distutils', scorch's flags, target and codegen version) and indented ``#`` lines (C
    preprocessor lines in verbatim blocks) stay part of the key."""
    body = ("# cython: language_level=3\n# distutils: language = c++\n"
            "# scorch generated kernel (codegen v1)\n{head}cdef extern from *:\n"
            '    """\n    #define N {n}\n    """\ndef f(): return 1  # the value\n')
    one = body.format(head="# out(i,j) = A(i,j) * B(i,j)\n# loop order: i, j\n#\n", n=1)
    two = body.format(head="# out(j,i) = A(j,i) * B(j,i)\n# loop order: j, i\n", n=1)
    assert build._kernel_key(one) == build._kernel_key(two)
    assert build._kernel_key(one) != build._kernel_key(body.format(head="", n=2))
    for directive in ("# scorch-cflags: -fno-tree-vectorize\n", "# scorch-target: avx2\n",
                      "# cython: boundscheck=True\n"):
        assert build._kernel_key(directive + one) != build._kernel_key(one), directive
    assert build._kernel_key(one.replace("codegen v1", "codegen v2")) != build._kernel_key(one)
