"""The build layer in unusual environments (scorch/tensor_compiler/build.py, fastcall.py): no
compiler, a compiler named by CC / CXX, a cache folder that cannot hold loadable kernels
(noexec, full, none at all), relative cache paths, old versions' folders, on/off switches,
and the source distribution's contents."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import pytest

from scorch.tensor_compiler import build, fastcall

ROOT = Path(__file__).resolve().parent.parent


def _unique_add() -> str:
    """A C kernel (Cython, C compiler) no cache holds yet."""
    return f"# environment {time.time_ns()}\ndef add(int a, int b):\n    return a + b\n"


def _unique_kernel_c() -> str:
    """A kernel whose C++ form builds (``cxx_module``, C++ compiler): an installed standard
    kernel's source with a line that makes its key new."""
    from scorch.tensor_compiler import cxx_module
    for pyx in sorted(build.PREBUILT_DIR.glob("*.pyx")):
        source = pyx.read_text()
        try:
            cxx_module.to_cpp(source)
        except cxx_module.Unsupported:
            continue
        return source + f"\n# environment {time.time_ns()}\n"
    pytest.skip("no prebuilt kernel sources (the install did not prebuild them)")


@pytest.fixture
def fresh_dirs(monkeypatch):
    """``cache_dir``'s per-process decisions start afresh here and are restored after."""
    for name, value in (("_checked_dirs", {}), ("_warned_dirs", set()),
                        ("_read_only_dirs", {}), ("_absolute_env_paths", {})):
        monkeypatch.setattr(build, name, value)


# --- the compiler: not in the key, named by CC / CXX, missing --------------------------

def test_kernel_keys_do_not_depend_on_the_compiler(tmp_path, monkeypatch):
    """A point release of gcc, or no gcc at all, keeps every kernel's key (and the warm-call
    module's name): the prebuilt and cached kernels stay in use."""
    key, name = build._kernel_key("source"), fastcall.module_name()
    fake = tmp_path / "bin"
    fake.mkdir()
    for cc in ("gcc", "g++"):
        (fake / cc).write_text("#!/bin/sh\necho 99.1.2\n")
        (fake / cc).chmod(0o755)
    for path in (f"{fake}:{os.environ['PATH']}", str(tmp_path / "empty")):
        monkeypatch.setenv("PATH", path)
        monkeypatch.setattr(build, "_fingerprint_cache", None)
        assert build._kernel_key("source") == key
        assert fastcall.module_name() == name


NO_COMPILER_PROBE = r"""
import json, time, torch, scorch
from scorch.tensor_compiler import build, fastcall
g = torch.Generator().manual_seed(0)
d = torch.rand(20, 10, generator=g)
d = d * (d < 0.3)
A, x = scorch.sparse_tensor(d, format="csr"), torch.rand(10, generator=g)
out = {"spmv": bool(torch.allclose(scorch.einsum("ij,j->i", A, x), d @ x, atol=1e-5))}
warm = fastcall.load(compile_missing=False)
out["fastcall"] = None if warm is None else warm.__file__
out["errors"], out["seconds"] = [], []
for _ in range(2):
    t0 = time.perf_counter()
    try:
        A.sum(0)                      # no standard kernel: it must compile
    except build.CompilerNotFound as exc:
        out["errors"].append(str(exc))
    out["seconds"].append(time.perf_counter() - t0)
out.update({k: build.cache_info()[k] for k in ("misses", "disk_hits", "cxx_fallbacks")})
print(json.dumps(out))
"""


def test_without_a_compiler_prebuilt_kernels_run_and_others_fail_fast_and_clearly(tmp_path):
    empty = tmp_path / "no-compilers"
    empty.mkdir()
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "SCORCH_FASTCALL")}
    env.update(PATH=str(empty), SCORCH_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", NO_COMPILER_PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["spmv"] and report["disk_hits"] >= 1, report
    assert report["fastcall"] is not None and "_prebuilt" in report["fastcall"], report
    assert len(report["errors"]) == 2, report
    message = report["errors"][0]
    assert "needs a C++ compiler" in message and "'g++'" in message, message
    assert "apt install build-essential" in message and "set CXX" in message, message
    assert report["seconds"][1] < 0.5, report          # no Cython run, no build attempt
    assert report["misses"] == 0 and report["cxx_fallbacks"] == 0, report
    assert "Please report" not in out.stderr, out.stderr[-2000:]
    assert not (cache / f"kernels-v{build.BUILD_VERSION}" / "failed").exists()


def _wrapper(folder: Path, name: str, real: str) -> tuple[Path, Path]:
    """A compiler under another name (as conda's or a versioned g++-12 is) that logs each run;
    it drops a first argument ``--via-wrapper`` (CC / CXX may hold arguments)."""
    log = folder / f"{name}.log"
    script = folder / name
    script.write_text(f'#!/bin/sh\n[ "$1" = "--via-wrapper" ] && shift\necho run >> "{log}"\n'
                      f'exec {real} "$@"\n')
    script.chmod(0o755)
    return script, log


def test_cc_and_cxx_name_the_compilers(tmp_path, monkeypatch, fresh_dirs):
    cc, cc_log = _wrapper(tmp_path, "my-cc", "gcc")
    cxx, cxx_log = _wrapper(tmp_path, "my-cxx", "g++")
    monkeypatch.setenv("CC", f"{cc} --via-wrapper")
    monkeypatch.setenv("CXX", f"{cxx} --via-wrapper")
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_pch", lambda cdir, cpp: None)   # no 50 MB header build here
    assert build.load_kernel(_unique_add(), "via_cc").add(2, 3) == 5
    assert build._last_cc_cmd[:2] == [str(cc), "--via-wrapper"] and cc_log.exists()
    build.load_kernel(_unique_kernel_c(), "via_cxx")
    assert build._last_cc_cmd[:2] == [str(cxx), "--via-wrapper"] and cxx_log.exists()
    # the warm-call module too
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "error: stop here")
    monkeypatch.setattr(fastcall.subprocess, "run", run)
    with pytest.raises(build.CompileError, match="my-cxx failed"):
        fastcall._compile("scorch_fastcall_probe", tmp_path / "out" / "probe.so")
    assert seen[0][:2] == [str(cxx), "--via-wrapper"]


def test_a_missing_compiler_named_by_cc_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(build.CompilerNotFound, match=r"needs a C compiler.*from CC.*set CC"):
        build.require_compiler(False)


# --- cache folders that cannot hold loadable kernels ------------------------------------

def test_a_noexec_cache_folder_is_replaced_by_the_private_one(tmp_path, monkeypatch, fresh_dirs):
    base = tmp_path / "noexec"
    monkeypatch.setattr(build, "_noexec", lambda d: str(d).startswith(str(base)))
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(base))
    with pytest.warns(RuntimeWarning, match="mounted noexec") as record:
        first, second = build.cache_dir(), build.cache_dir()
    assert len(record) == 1 and first == second == build._private_cache()
    mod = build.load_kernel(_unique_add(), "noexec")
    assert mod.add(1, 2) == 3 and Path(mod.__file__).parent == first


def test_a_folder_kernels_fail_to_map_from_is_given_up_and_nothing_quarantined(
        tmp_path, monkeypatch, fresh_dirs):
    """Where the statvfs flag does not tell (``_noexec`` False), the first "failed to map
    segment" moves the process to the private cache, with one warning; the valid file stays."""
    base = tmp_path / "maps-nothing"
    real = build._import_extension

    def import_extension(name, path, require_checksum=False):
        if str(path).startswith(str(base)):
            raise ImportError(f"{path}: failed to map segment from shared object")
        return real(name, path, require_checksum=require_checksum)
    monkeypatch.setattr(build, "_import_extension", import_extension)
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(base))
    source = _unique_add()
    # a build there: published, then its import fails -> built again in the private cache
    with pytest.warns(RuntimeWarning, match="cannot be loaded from") as record:
        mod = build.load_kernel(source, "maps")
    assert len(record) == 1 and mod.add(2, 2) == 4
    assert Path(mod.__file__).parent == build._private_cache()
    kernel = next(base.rglob("maps_*" + build._EXT_SUFFIX))
    # a fresh lookup of the published (valid) file: not quarantined, the folder given up
    build._memory.pop(("maps", source))
    build._checked_dirs.clear()
    build._warned_dirs.clear()
    with pytest.warns(RuntimeWarning, match="failed to map segment") as record:
        again = build.load_kernel(source, "maps")
    assert len(record) == 1 and again.add(3, 4) == 7
    assert kernel.exists() and not (kernel.parent / "quarantine").exists()
    assert build.cache_dir() == build._private_cache()


def test_a_full_disk_moves_to_the_private_cache_and_blames_no_kernel(
        tmp_path, monkeypatch, fresh_dirs, caplog):
    """ENOSPC inside the compiler (C++ form) or Cython (C kernel): the op works from the
    private cache, with one warning; nothing is logged or counted as a translation bug."""
    import Cython.Compiler.Main as cython_main
    full = tmp_path / "full"
    real_run, real_compile = subprocess.run, cython_main.compile_single

    def run(cmd, *args, **kw):
        if isinstance(cmd, list) and "-o" in cmd and str(full) in cmd[cmd.index("-o") + 1]:
            return subprocess.CompletedProcess(cmd, 1, "", "/usr/bin/ld: final link failed: "
                                               "No space left on device\n")
        return real_run(cmd, *args, **kw)

    def compile_single(source, *args, **kw):
        if str(full) in source:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_compile(source, *args, **kw)
    monkeypatch.setattr(build.subprocess, "run", run)
    monkeypatch.setattr(cython_main, "compile_single", compile_single)
    monkeypatch.setattr(build, "_pch", lambda cdir, cpp: None)
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(full))
    fallbacks = build.cache_info()["cxx_fallbacks"]
    for source in (_unique_kernel_c(), _unique_add()):
        build._checked_dirs.clear()
        build._warned_dirs.clear()
        with pytest.warns(RuntimeWarning, match="No space left on device") as record:
            mod = build.load_kernel(source, "full")
        assert len(record) == 1 and Path(mod.__file__).parent == build._private_cache()
    assert mod.add(5, 6) == 11
    assert build.cache_info()["cxx_fallbacks"] == fallbacks
    assert "Please report" not in caplog.text
    assert not (full / f"kernels-v{build.BUILD_VERSION}" / "failed").exists()


def test_no_home_directory_uses_the_private_cache(monkeypatch, fresh_dirs):
    """HOME unset and a user id without a passwd entry (Path.home() raises): one warning,
    the private cache, and kernels (prebuilt ones included) still load."""
    for var in ("HOME", "SCORCH_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.warns(RuntimeWarning, match="no home directory.*SCORCH_CACHE_DIR") as record:
        first, second = build.cache_dir(), build.cache_dir()
    assert len(record) == 1 and first == second == build._private_cache()
    assert build.cache_info()["cache_dir"] == str(first)
    prebuilt = sorted(build.PREBUILT_DIR.glob("*" + build._EXT_SUFFIX))
    if prebuilt:
        name = prebuilt[0].name[:-len(build._EXT_SUFFIX)]
        assert build.load_published(name) is not None


# --- where the cache folder is ---------------------------------------------------------

def test_a_relative_cache_dir_is_resolved_once(tmp_path, monkeypatch, fresh_dirs):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.setenv("SCORCH_CACHE_DIR", "rel-cache")
    first = build.cache_dir()
    monkeypatch.chdir(tmp_path / "b")
    assert first == tmp_path / "a" / "rel-cache" / f"kernels-v{build.BUILD_VERSION}"
    assert build.cache_dir() == first
    assert not (tmp_path / "b" / "rel-cache").exists()


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    monkeypatch.delenv("SCORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    assert build._configured_base() == tmp_path / "home" / ".cache" / "scorch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build._configured_base() == tmp_path / "xdg" / "scorch"


def test_older_versions_folders_are_reported_pruned_and_cleared(tmp_path, monkeypatch,
                                                                fresh_dirs):
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path))
    newer = tmp_path / f"kernels-v{build.BUILD_VERSION + 1}"   # a newer scorch's: left alone
    newer.mkdir()
    (newer / "k.so").write_bytes(b"\0" * 100)

    def leave_old_kernels():
        old = tmp_path / "kernels-v1"
        (old / "quarantine").mkdir(parents=True)
        for i in range(3):
            (old / f"k{i}.so").write_bytes(b"\0" * 1000)
        (old / "quarantine" / "q.so").write_bytes(b"\0" * 500)
        return old
    old = leave_old_kernels()
    cdir = build.cache_dir()
    assert build.cache_info()["older_versions_bytes"] == 3500
    assert build.prune_cache(cdir, limit=10_000) == 0 and old.exists()    # within the bound
    assert build.prune_cache(cdir, limit=2000) == 3500 and not old.exists()
    old = leave_old_kernels()
    build.cache_clear()
    assert not old.exists() and newer.exists() and build.cache_info()["older_versions_bytes"] == 0


# --- on/off switches --------------------------------------------------------------------

@pytest.mark.parametrize("raw, value", [
    ("0", False), ("false", False), ("OFF", False), (" No ", False),
    ("1", True), ("True", True), ("on", True), ("YES", True), ("", True)])
def test_on_off_switches_read_the_usual_words(monkeypatch, raw, value):
    monkeypatch.setenv("SCORCH_CXX_KERNELS", raw)
    assert build.env_flag("SCORCH_CXX_KERNELS") is value
    monkeypatch.setenv("SCORCH_FASTCALL", raw)
    monkeypatch.setattr(fastcall, "_state", {})
    if not value:
        assert fastcall.load(compile_missing=False) is None
        here = Path(".")
        assert build._built_as_cxx("", "k", here, here, here, here) is False   # Cython builds it


def test_an_on_off_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv("SCORCH_FASTCALL", "flase")
    monkeypatch.setattr(fastcall, "_state", {})
    with pytest.raises(ValueError, match=r"SCORCH_FASTCALL='flase' is not an on/off value"):
        fastcall.load(compile_missing=False)
    monkeypatch.delenv("SCORCH_FASTCALL")
    assert build.env_flag("SCORCH_FASTCALL") is True
    assert build.env_flag("SCORCH_FASTCALL", default=False) is False


# --- the source distribution -------------------------------------------------------------

def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split() + ["LICENSE", "MANIFEST.in"]


def test_the_sdist_manifest_carries_tests_helpers_examples_docs_and_license():
    from setuptools._distutils.filelist import FileList
    files = FileList()
    files.set_allfiles(_tracked_files())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for line in (ROOT / "MANIFEST.in").read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                files.process_template_line(line)
    shipped = set(files.files)
    for needed in ("LICENSE", "README.md", "tests/conftest.py", "tests/ops_helpers.py",
                   "tests/compiler_helpers.py", "tests/reference_storage.py",
                   "tests/golden/spmm.pyx", "examples/demo.py", "docs/ops.md",
                   "benchmarks/report_opinfo.py", "scorch/_runtime/fastcall.cpp",
                   "scorch/_runtime/workspace.h"):
        assert needed in shipped, needed
    assert not any(f.startswith(("benchmarks/results/", "scorch/_prebuilt/")) for f in shipped)
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text


def test_every_package_data_pattern_names_files():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["scorch"]
    for pattern in patterns:
        assert list((ROOT / "scorch").glob(pattern)), f"package data {pattern!r} matches nothing"
