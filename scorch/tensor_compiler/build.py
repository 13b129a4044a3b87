"""Build-and-cache layer: Cython source text -> compiled, imported extension module.

The code generator hands us a complete ``.pyx`` source string; we return the imported
module. Compiling costs 0.3-1 s, so results are cached twice:

* in process, a dict keyed by the source text (a warm call is one dict lookup);
* on disk, under ``$SCORCH_CACHE_DIR`` (or ``$XDG_CACHE_HOME/scorch``, ``~/.cache/scorch``)
  in a folder versioned by :data:`BUILD_VERSION`, with the ``.pyx`` kept next to the
  ``.so`` so users can read what was compiled.

A kernel whose entry is ``kernel_c`` (raw pointers, no Python objects: dense and in-place
outputs, about half of all kernels) skips Cython: ``cxx_module`` lowers its ``.pyx`` to one
C++ file with a 40-line Python module around it, and g++ compiles that in ~0.3 s instead of
~0.9 s of g++ on Cython's ~6,500 lines of module code plus ~0.2 s of Cython (the same
functions, the same instructions). ``SCORCH_CXX_KERNELS=0`` turns this off.

The pipeline is tuned for cold-compile latency, not generality: Cython runs in process
(no subprocess, no setuptools, whose import and distutils machinery alone cost more than
a kernel's compile), and the compiler (``$CC`` / ``$CXX``, else gcc / g++) is invoked
once to compile *and* link. Cython directives
that only add code we never use (CyFunction binding, docstring signatures, pickling,
code comments) are switched off, which cuts gcc time by about 40%. Where the time goes
for a C SpMM kernel on the 2-core dev box: Cython's one-time start-up in a process
(lexicon + builtin tables, ~0.5 s, paid by the first kernel of a process only), cythonize
~0.02 s, gcc ~0.3 s of which -O3 vs -O0 is ~0.13 s and parsing ~0.07 s; C++ kernels spend
~40% of gcc in libstdc++ headers, which a precompiled header (built once per cache dir,
in the background) removes. ``benchmarks/report_compile.py`` measures all of this.

Publishing is atomic: each build happens in a private temp dir inside the cache, and the
finished files are moved in with :func:`os.replace` (``.pyx`` first, then the checksum,
``.so`` last; the ``.so`` is the "complete" marker), under a publish lock so the checksum
and the ``.so`` of one build go in together. Concurrent processes racing on one key each
compile and each replace the files; a process never sees a partial file.

Nothing is loaded unverified (a damaged ``.so`` would crash every later process that
``dlopen``s it):

* every built kernel has a ``<module>.so.sum`` beside it (size and SHA-256), checked just
  before ``dlopen`` (0.17 ms on average over the 55 prebuilt
  modules, once per kernel and process). A missing or mismatching checksum moves the file to ``quarantine/`` and the
  kernel is rebuilt; a damaged install-time (prebuilt) kernel is skipped and built instead.
* the in-process table keeps what was loaded, keyed by the source: a module cannot be
  unloaded, and a file replaced on disk later changes nothing for this process (our own
  replacements use :func:`os.replace`, so a mapped file is never rewritten in place); the
  next process verifies and loads the new file.
* the cache directory must be a directory owned by this user, writable, and not writable
  by group or others (another user could plant code there). Otherwise kernels go to a
  private temporary directory (removed at exit) and one warning says why; a directory of
  ours that is only read-only (a cache baked into an image) is still read, checksums
  verified, and only new kernels are built in the private one.
* the precompiled header is built once per cache directory (a lock file: other processes
  compile without it meanwhile), published atomically with its checksum, and verified once
  per process before use. The install builds both headers into ``_prebuilt/pch``, which is
  looked at first, so no cache directory builds them again.
* ``cache_clear`` also removes temporary build directories that no live build holds (each
  build holds a lock on its own).
"""
from __future__ import annotations

import errno
import fcntl
import gc
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Any

try:
    from . import target as _target
except ImportError:   # this module loaded alone, by path (tests, tools): its sibling by path
    _spec = importlib.util.spec_from_file_location(
        "_scorch_target", Path(__file__).resolve().with_name("target.py"))
    _target = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _target          # dataclasses look their module up
    _spec.loader.exec_module(_target)
    _spec = importlib.util.spec_from_file_location(
        "_scorch_cxx_module", Path(__file__).resolve().with_name("cxx_module.py"))
    _cxx = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _cxx
    _spec.loader.exec_module(_cxx)
else:
    from . import cxx_module as _cxx
SOURCE_TAG, TARGET_ENV, Target = _target.SOURCE_TAG, _target.TARGET_ENV, _target.Target
cpu_flags, openmp_link_flags, runnable = (_target.cpu_flags, _target.openmp_link_flags,
                                          _target.runnable)
target_named = _target.target_named

__all__ = ["BUILD_VERSION", "CompileError", "CompilerNotFound", "env_flag", "load_kernel",
           "cache_info", "cache_clear", "cache_dir", "kernel_cflags", "source_target",
           "cache_limit", "prune_cache"]

#: ``SCORCH_CXX_KERNELS=0`` builds every kernel with Cython (for comparing the two forms).
CXX_ENV = "SCORCH_CXX_KERNELS"

_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def env_flag(name: str, default: bool = True) -> bool:
    """An on/off environment switch (``SCORCH_CXX_KERNELS``, ``SCORCH_FASTCALL``, ...):
    1/true/on/yes is on and 0/false/off/no off, in any case; unset or empty is ``default``.
    Anything else raises ValueError naming the variable: a value such as "flase" silently
    meaning "on" hides the user's intent."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError(f"scorch: {name}={raw!r} is not an on/off value: use one of "
                     f"{', '.join(_ON)} (on) or {', '.join(_OFF)} (off)")

#: The most megabytes of kernels the cache folder keeps (``SCORCH_CACHE_MAX_MB``; 0: no
#: bound). Past it, the kernels used least recently (loading one from disk marks its file's
#: time) are removed down to :data:`PRUNE_TO` of it, checked after a compile at most every
#: :data:`PRUNE_EVERY_S` seconds, in the background. Unbounded, a developer's cache reached
#: 44,000 files and 816 MB; a kernel is ~20-60 KB, so the default keeps ~40,000.
CACHE_MAX_ENV = "SCORCH_CACHE_MAX_MB"
DEFAULT_CACHE_MAX_MB = 2048
PRUNE_TO = 0.75
PRUNE_EVERY_S = 60.0

#: Bump whenever the pipeline changes in a way that changes the produced ``.so``.
BUILD_VERSION = 2   # 2: a checksum beside every kernel (older caches are left alone, not quarantined)

logger = logging.getLogger("scorch")

#: Cython directives. The first four are the semantics kernels are written for; the rest
#: only remove generated C the kernels never need (``binding=False`` alone drops the
#: CyFunction type and ~20% of the C), which is what gcc spends its time on.
CYTHON_DIRECTIVES: dict[str, Any] = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
    "nonecheck": False,
    "binding": False,
    "embedsignature": False,
    "emit_code_comments": False,
    "auto_pickle": False,
    "always_allow_keywords": False,
    "optimize.unpack_method_calls": False,
}

#: Flags for the single compile+link gcc/g++ call. No ``-g``: debug info costs compile
#: time and disk. The macros drop C that gcc would otherwise optimize for nothing:
#: ``CYTHON_CLINE_IN_TRACEBACK=0`` the C-line lookup code, and
#: ``CYTHON_USE_PYLONG_INTERNALS=0`` Cython's digit-level int conversion fast paths
#: (argument conversion then goes through ``PyLong_As*``: nanoseconds per call, -8% gcc).
#: ``-fassociative-math -fno-signed-zeros -fno-trapping-math`` let gcc vectorize float
#: reductions (SDDMM's dot product, a dense reduction loop) into lane-wise partial sums;
#: without them a ``acc += x[k] * y[k]`` loop is one scalar add chain (kernels' sums are
#: then ordered differently from a sequential loop, as MKL's and torch's are).
#: ``-mprefer-vector-width=512``: gcc 12 tunes Zen 4 as Zen 3 and would otherwise prefer
#: 256-bit vectors even where AVX-512 is available (K = 16 float32 is one 512-bit register).
#: ``-mtune-ctrl=^use_gather``: no vector gathers (gcc 12 gathers SpMV's ``x[crd[q]]`` with
#: 64-bit indices; without them SpMV runs 5-15% faster here, and the issue's dense-row loops
#: that turned into ``vgatherqps`` ran 3-4x slower).
_X86_FLAGS: tuple[str, ...] = (
    ("-mprefer-vector-width=512", "-mtune-ctrl=^use_gather")
    if platform.machine().lower() in ("x86_64", "amd64") else ())
CFLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-pipe",
    "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", *_X86_FLAGS,
    "-fvisibility=hidden", "-DCYTHON_CLINE_IN_TRACEBACK=0",
    "-DCYTHON_USE_PYLONG_INTERNALS=0",
)
NUMPY_DEFINES: tuple[str, ...] = ("-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION",)

_PKG_DIR = Path(__file__).resolve().parent.parent          # .../scorch
_PKG_ROOT = _PKG_DIR.parent                                 # dir containing scorch/
_RUNTIME_DIR = _PKG_DIR / "_runtime"
#: Read-only kernels compiled when the package was installed (``scorch.tensor_compiler.prebuilt``),
#: laid out like the disk cache and looked up by the same key, so a standard kernel's
#: first call pays no compile; a package moved to another CPU simply misses.
PREBUILT_DIR = _PKG_DIR / "_prebuilt"
_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"

_CPP_MARKER = re.compile(r"^#\s*distutils\s*:\s*language\s*=\s*c\+\+", re.M)
_CPP_SCAN = re.compile(r"\blibcpp\b|\bcppclass\b|scorch\._runtime\.workspace")
_NUMPY_CIMPORT = re.compile(r"^\s*(?:cimport\s+numpy\b|from\s+numpy\s+cimport\b)", re.M)
_HINT_CLEAN = re.compile(r"[^0-9a-zA-Z_]+")


class CompileError(RuntimeError):
    """Cythonizing or compiling a kernel failed.

    The message names the ``.pyx`` (kept under the cache's ``failed/`` folder so it can be
    inspected) and carries the compiler's own diagnostics.
    """

    def __init__(self, message: str, pyx_path: str | None = None, stage: str = "") -> None:
        super().__init__(message)
        self.pyx_path = pyx_path
        self.stage = stage


# --------------------------------------------------------------------------- state

_memory: dict[tuple[str, str], types.ModuleType] = {}   # (name_hint, source) -> module
_stats = {"hits": 0, "disk_hits": 0, "misses": 0, "compile_seconds": 0.0,
          "cxx_builds": 0, "cxx_fallbacks": 0}
# serializes the slow path (Cython is not thread-safe); a child forked while another thread
# held it (a compile in progress when a DataLoader forks its workers) gets a fresh one, or it
# would wait forever (``locks.fork_safe_lock``; this module also loads standalone)
_slow_lock = threading.RLock()
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_slow_lock", threading.RLock()))
_warned_first_compile = False
_fingerprint_cache: str | None = None
_pch_threads: dict[str, threading.Thread] = {}   # .gch path -> background builder
_pch_failed: set[str] = set()                    # do not retry a PCH that failed
_last_cc_cmd: list[str] = []                      # for tests and debugging

#: Headers parsed into the precompiled headers (after Python.h): what the C++ that
#: ``cxx_module`` lowers kernels to includes, with ``scorch/_runtime/workspace.h``'s and
#: ``kernel_result.h``'s. gcc maps the whole ``.gch`` into every kernel's compile, so a
#: header no kernel includes costs each of them: ``<ios>``, ``<map>``, ``<unordered_map>``,
#: ``<deque>``, ``<mutex>``, ``<stdexcept>`` and ``<typeinfo>`` (75 -> 54 MB) made a small
#: kernel 0.19 s instead of 0.13 s. Only the few kernels built through Cython include
#: them; those parse them themselves.
PCH_C_HEADERS: tuple[str, ...] = ("stdint.h", "stddef.h", "math.h", "omp.h")
PCH_CXX_HEADERS: tuple[str, ...] = (
    "new", "utility", "vector", "atomic", "algorithm", "cstdint", "climits", "cstdlib",
    "cstring", "type_traits",
    "stdlib.h", "string.h", "math.h", "omp.h", "stdio.h", "sys/mman.h", "unistd.h",
    # workspace.h's intrinsics: ~1 s of parsing in each sparse-output kernel otherwise
    "immintrin.h" if platform.machine().lower() in ("x86_64", "amd64") else "cstddef",
)


class _NoCacheFolder(Exception):
    """No cache folder can be named (see :func:`_configured_base`); the message says why."""


def _configured_base() -> Path:
    """``$SCORCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/scorch``, else ``~/.cache/scorch``.

    A relative ``SCORCH_CACHE_DIR`` is made absolute against the working directory of its
    first use and kept (re-resolved at each lookup, a program that ``os.chdir``s would start
    a second cache). A relative ``XDG_CACHE_HOME`` is ignored, as the XDG spec says. Raises
    :class:`_NoCacheFolder` where no home directory is known (``HOME`` unset and a user id
    without a passwd entry, as in containers run under an arbitrary ``--user``)."""
    root = os.environ.get("SCORCH_CACHE_DIR")
    if root:
        base = _absolute_env_paths.get(root)
        if base is None:
            try:   # os.path.expanduser leaves "~" alone where no home is known
                base = Path(os.path.abspath(os.path.expanduser(root)))
            except OSError as exc:      # the working directory was removed
                raise _NoCacheFolder(f"SCORCH_CACHE_DIR={root!r} is relative and the working "
                                     f"directory is gone ({exc.strerror or exc})") from None
            _absolute_env_paths[root] = base
        return base
    xdg = os.path.expanduser(os.environ.get("XDG_CACHE_HOME", ""))
    if os.path.isabs(xdg):
        return Path(xdg) / "scorch"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        raise _NoCacheFolder("no home directory: HOME is unset and this user id has no passwd "
                             "entry; set SCORCH_CACHE_DIR to name a cache folder") from None
    return home / ".cache" / "scorch"


_absolute_env_paths: dict[str, Path] = {}   # SCORCH_CACHE_DIR as set -> the folder it named


_checked_dirs: dict[str, Path] = {}       # configured versioned dir -> the dir to use
_fallback_dir: list[Path] = []             # this process's private temporary cache
_warned_dirs: set[str] = set()


def cache_dir() -> Path:
    """The versioned cache folder in use (re-read from the environment on every call,
    so tests and users can redirect it with ``SCORCH_CACHE_DIR`` at any time).

    A configured folder that cannot be used safely (not a directory, not writable, owned by
    another user, or writable by group/others), one on a file system mounted ``noexec`` (no
    kernel could be loaded from it), or none at all (no home directory) is replaced by a
    private temporary folder for this process, with one warning."""
    try:
        wanted: Path | None = _configured_base() / f"kernels-v{BUILD_VERSION}"
    except _NoCacheFolder as exc:
        wanted, problem = None, str(exc)
    key = str(wanted)
    hit = _checked_dirs.get(key)
    if hit is not None and (hit != wanted or hit.is_dir()):
        return hit
    if wanted is not None:
        problem = _unusable(wanted)
        if problem is None:
            _checked_dirs[key] = wanted
            return wanted
    fallback = _private_cache()
    if problem == NOT_WRITABLE:
        # ours and safe, only read-only (a cache baked into an image): its kernels are still
        # read (``load_published``), only new ones go to the private folder
        _read_only_dirs[str(fallback)] = wanted
    if key not in _warned_dirs:
        _warned_dirs.add(key)
        reading = " (its kernels are still read)" if problem == NOT_WRITABLE else ""
        warnings.warn(f"scorch: kernel cache {wanted or '~/.cache/scorch'} is not usable "
                      f"({problem}); using the "
                      f"private temporary cache {fallback} for this process{reading}",
                      RuntimeWarning, stacklevel=2)
    _checked_dirs[key] = fallback
    return fallback


#: a private fallback folder -> the configured folder it stands in for, where that one is
#: only read-only (kernels are read from it, never written)
_read_only_dirs: dict[str, Path] = {}
NOT_WRITABLE = "it is not writable"


def _unusable(d: Path) -> str | None:
    """Why ``d`` (created if missing, mode 0700) cannot hold kernels, or None."""
    try:
        _make_private_dirs(d)
    except FileExistsError:
        return "it is not a directory"
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    import stat as _stat
    for level in (d, d.parent):
        try:
            st = os.stat(level)
        except OSError as exc:
            return f"cannot stat {level}: {exc.strerror or exc}"
        if not _stat.S_ISDIR(st.st_mode):
            return f"{level} is not a directory"
        if level == d.parent and st.st_mode & _stat.S_ISVTX:
            continue   # a sticky shared folder such as /tmp: others cannot replace our folder
        if uid is not None and st.st_uid != uid:
            return f"{level} is owned by user id {st.st_uid}, not by this user ({uid})"
        if st.st_mode & 0o022:
            return f"{level} is writable by {'group' if st.st_mode & 0o020 else 'others'} " \
                   f"(mode {oct(st.st_mode & 0o777)})"
    if _noexec(d):
        return NOEXEC
    if not os.access(d, os.W_OK | os.X_OK):
        return NOT_WRITABLE
    return None


NOEXEC = ("its file system is mounted noexec, so no kernel can be loaded from it; set "
          "SCORCH_CACHE_DIR to a folder elsewhere")


def _noexec(d: Path) -> bool:
    """``d`` is on a file system mounted ``noexec`` (a hardened /tmp, a Docker tmpfs):
    ``dlopen`` cannot map a shared object from there ("failed to map segment")."""
    try:
        return bool(os.statvfs(d).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False


def _unloadable(exc: BaseException) -> bool:
    """The error of ``dlopen`` on a file it may not map executable (``noexec`` where
    :func:`_noexec` cannot see it): the folder's fault, not the file's."""
    return isinstance(exc, ImportError) and "failed to map segment" in str(exc)


def _make_private_dirs(d: Path) -> None:
    """``d`` and each missing folder above it, created with mode 0700. (``mkdir(parents=
    True)`` gives the parents the umask's mode: 0775 under the common umask 002, which
    ``_unusable`` then refuses as writable by group, so no kernel was ever kept.) The default
    folder made that way by an earlier version is narrowed to 0700; a folder the user
    configured is left as it is."""
    missing = []
    p = d
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():
                raise
    if not os.environ.get("SCORCH_CACHE_DIR") and d.parent == _configured_base():
        base = d.parent
        st = os.stat(base)
        if st.st_mode & 0o022 and hasattr(os, "geteuid") and st.st_uid == os.geteuid():
            os.chmod(base, st.st_mode & 0o755)


def _give_up_on(cdir: Path, problem: str) -> Path:
    """Switch this process to its private cache after ``cdir`` failed (one warning)."""
    fallback = _private_cache()
    for key, used in list(_checked_dirs.items()):
        if used == cdir:
            _checked_dirs[key] = fallback
    if str(cdir) not in _warned_dirs:
        _warned_dirs.add(str(cdir))
        warnings.warn(f"scorch: kernel cache {cdir} is not usable ({problem}); using the "
                      f"private temporary cache {fallback} for this process", RuntimeWarning,
                      stacklevel=3)
    return fallback


def _private_cache() -> Path:
    """This process's private cache folder (made once, removed at exit), in the temporary
    folder, or where that is mounted ``noexec`` in the first other candidate kernels can be
    loaded from."""
    if not _fallback_dir:
        import atexit
        candidates = (tempfile.gettempdir(), "/var/tmp", "/dev/shm",
                      os.environ.get("XDG_RUNTIME_DIR", ""))
        parent = next((c for c in candidates if c and os.path.isdir(c) and not _noexec(Path(c))
                       and os.access(c, os.W_OK | os.X_OK)), None)
        d = Path(tempfile.mkdtemp(prefix="scorch-kernels-", dir=parent))
        d = d / f"kernels-v{BUILD_VERSION}"
        d.mkdir(mode=0o700)
        atexit.register(shutil.rmtree, d.parent, True)
        _fallback_dir.append(d)
    return _fallback_dir[0]


def _cpu_fingerprint() -> str:
    """Identify the CPU's ISA because ``-march=native`` binaries may not run elsewhere
    (a cache dir shared over NFS or baked into a container image)."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "vendor_id", "Features", "CPU part"):
                    parts.append(line.strip())
                elif not line.strip() and len(parts) > 1:
                    break                    # first processor block is enough
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def compiler_command(cpp: bool) -> list[str]:
    """The C++ (``cpp``) or C compiler as a command: ``$CXX`` / ``$CC`` where set, split
    into words as setuptools does (``CXX="ccache g++-12"`` works), else ``g++`` / ``gcc``."""
    var, default = ("CXX", "g++") if cpp else ("CC", "gcc")
    return shlex.split(os.environ.get(var, "")) or [default]


class CompilerNotFound(CompileError):
    """No C/C++ compiler to build a kernel with: the environment's problem, not the kernel's
    (not a failed translation; nothing is kept under ``failed/``)."""


def require_compiler(cpp: bool) -> list[str]:
    """:func:`compiler_command`, or :class:`CompilerNotFound` saying what to install or set
    when it is not there: checked before any work, so an op fails in microseconds (a PATH
    look-up), each time, until a compiler is installed."""
    cmd = compiler_command(cpp)
    if shutil.which(cmd[0]) is None:
        var = "CXX" if cpp else "CC"
        how = f"from {var}" if os.environ.get(var) else f"the default; {var} is not set"
        raise CompilerNotFound(
            f"scorch compiles kernels on first use and needs a {'C++' if cpp else 'C'} compiler, "
            f"but {cmd[0]!r} ({how}) was not found. Install GCC (e.g. `apt install "
            f"build-essential`, which has gcc and g++, or `conda install -c conda-forge "
            f"gxx_linux-64`), or set {var} to a compiler's path. (The standard kernels "
            f"prebuilt at install time run without one.)", stage="cc")
    return cmd


_compiler_ids: dict[tuple[str, ...], str] = {}


def _compiler_id(cpp: bool) -> str:
    """The compiler command and its version (asked once per command): a precompiled header
    is only good for the compiler that made it. (Kernels are not keyed by it: a built
    ``.so`` loads without a compiler, and a point release changes no ABI.)"""
    cmd = tuple(compiler_command(cpp))
    if cmd not in _compiler_ids:
        try:
            out = subprocess.run([*cmd, "-dumpfullversion", "-dumpversion"], capture_output=True,
                                 text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = "unknown"
        _compiler_ids[cmd] = " ".join(cmd) + " " + out
    return _compiler_ids[cmd]


def _runtime_fingerprint() -> str:
    """Hash of ``scorch/_runtime``'s .pxd/.pxi/.h files: kernels cimport and #include
    them, so editing one must invalidate the kernels built against it."""
    h = hashlib.sha256()
    if _RUNTIME_DIR.is_dir():
        for p in sorted(_RUNTIME_DIR.iterdir()):
            if p.suffix in (".pxd", ".pxi", ".h", ".hpp"):
                h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _environment_fingerprint() -> str:
    """Everything besides the source that decides whether a built binary fits this
    process (Python, its ABI, numpy, the CPU, the flags, the runtime headers, the codegen
    version); computed once. Not the compiler's version: a prebuilt or cached kernel loads
    without a compiler, and one compiler's point release builds the same ABI."""
    global _fingerprint_cache
    if _fingerprint_cache is None:
        import Cython
        try:
            import numpy
            np_version = numpy.__version__
        except ImportError:  # pragma: no cover - numpy is a hard dependency
            np_version = "none"
        _fingerprint_cache = json.dumps({
            "build": BUILD_VERSION,
            "cflags": CFLAGS,
            "directives": CYTHON_DIRECTIVES,
            "python": sys.version,
            "abi": _EXT_SUFFIX,
            "cython": Cython.__version__,
            "numpy": np_version,
            "cpu": _cpu_fingerprint(),
            "runtime": _runtime_fingerprint(),
            # torch's OpenMP runtime linked by path (absent where -fopenmp's is the one
            # torch loaded, so those keys stay as they were)
            **({"openmp": _openmp_flags()} if _openmp_flags() else {}),
        }, sort_keys=True)
    return _fingerprint_cache


#: flags a kernel source may add for itself (``# scorch-cflags: ...`` line; the source text,
#: hence the cache key, carries them)
SOURCE_CFLAGS = ("-fno-tree-vectorize", "-falign-loops=32", "-mprefer-vector-width=256", "-fassociative-math",
                 "-fno-associative-math",
                 "-fno-signed-zeros", "-fno-trapping-math", "-funroll-loops", "-fvariable-expansion-in-unroller",
                 "-mtune-ctrl=use_gather")
_SOURCE_CFLAGS_LINE = re.compile(r"^# scorch-cflags: (.*)$", re.M)


def source_cflags(source: str) -> list[str]:
    """The extra compiler flags a kernel asks for (only those in :data:`SOURCE_CFLAGS`)."""
    m = _SOURCE_CFLAGS_LINE.search(source)
    if m is None:
        return []
    flags = m.group(1).split()
    bad = [f for f in flags if f not in SOURCE_CFLAGS]
    if bad:
        raise ValueError(f"kernel source asks for compiler flags {bad}; allowed: {SOURCE_CFLAGS}")
    return flags


_SOURCE_TARGET_LINE = re.compile(r"^" + re.escape(SOURCE_TAG) + r"(\S+)\s*$", re.M)


def source_target(source: str) -> Target | None:
    """The chosen target a kernel source names (``# scorch-target: avx2``), or None for
    the native build."""
    m = _SOURCE_TARGET_LINE.search(source)
    return None if m is None else target_named(m.group(1))


def kernel_cflags(source: str) -> list[str]:
    """The compile flags of one kernel: :data:`CFLAGS` with the ISA flags of the target its
    source names (``-march=native`` otherwise) and the flags it asks for, then the link
    flags that bind it to torch's OpenMP runtime. Raises RuntimeError for a target this
    CPU cannot run (its kernels would die on their first illegal instruction)."""
    t = source_target(source)
    flags = list(CFLAGS)
    if t is not None and not t.native:
        if not runnable(t):
            raise RuntimeError(f"scorch: kernels for target {t.name!r} ({TARGET_ENV}) need the "
                               f"CPU features {sorted(t.requires)}; this CPU lacks "
                               f"{sorted(t.requires - cpu_flags())}")
        isa = ("-march=", "-mprefer-vector-width=", "-mtune-ctrl=")
        flags = [f for f in flags if not f.startswith(isa)]
        at = flags.index("-O3") + 1
        flags[at:at] = t.march
    return flags + source_cflags(source) + list(_openmp_flags())


_omp_flags: list[tuple[str, ...]] = []


def _openmp_flags() -> tuple[str, ...]:
    """``target.openmp_link_flags()``, computed once per process."""
    if not _omp_flags:
        _omp_flags.append(openmp_link_flags())
    return _omp_flags[0]


#: a source's comment lines, at the start of a line: what the key leaves out. Directives stay
#: in it (``# cython:``, ``# distutils:``, and every ``# scorch...`` line: the codegen
#: version, ``# scorch-cflags:``, ``# scorch-target:``), and so does every indented ``#``
#: line (C preprocessor lines in verbatim blocks)
_KEY_COMMENT = re.compile(r"^#(?! ?(?:cython|distutils)\s*:| scorch)(?: .*)?\n", re.M)


def _kernel_key(source: str) -> str:
    """The cache identity of ``source``: its text less its comment lines (``_KEY_COMMENT``).
    The header codegen writes (the expression, the operands' formats, the loop order) names
    what the kernel is for, not what it does: an elementwise product of two CSR operands
    and of two CSC ones (``ij`` against ``ji``) is one kernel. 12 % of the test suite's
    2,403 kernels differed from another only there."""
    h = hashlib.sha256()
    h.update(_environment_fingerprint().encode())
    h.update(b"\0")
    h.update(_KEY_COMMENT.sub("", source).encode("utf-8"))
    return h.hexdigest()


def _module_name(name_hint: str, key: str) -> str:
    hint = _HINT_CLEAN.sub("_", name_hint).strip("_")[:40] or "kernel"
    if hint[0].isdigit():
        hint = "k" + hint
    return f"{hint}_{key[:20]}"


def _is_cpp(source: str) -> bool:
    return bool(_CPP_MARKER.search(source) or _CPP_SCAN.search(source))


# --------------------------------------------------------------------------- public API

def load_kernel(source: str, name_hint: str = "kernel") -> types.ModuleType:
    """Return the compiled, imported extension module for Cython ``source``.

    Lookup order: in-process table -> disk cache -> compile (and publish to disk).
    ``name_hint`` only makes file and module names readable; it is part of the identity
    (same source under two hints is two modules). Raises :class:`CompileError` if Cython
    or the C compiler rejects the source.
    """
    mod = _memory.get((name_hint, source))
    if mod is not None:
        _stats["hits"] += 1
        return mod
    return _load_slow(source, name_hint)


def _load_slow(source: str, name_hint: str) -> types.ModuleType:
    # the process pool the kernels' output buffers share (workspace.h: process_pool_api):
    # imported here, on this thread, so that no kernel's OpenMP thread has to import it
    import scorch._runtime.workspace  # noqa: F401
    with _slow_lock:
        mod = _memory.get((name_hint, source))
        if mod is not None:                      # another thread just built it
            _stats["hits"] += 1
            return mod
        key = _kernel_key(source)
        name = _module_name(name_hint, key)
        cdir = cache_dir()
        mod = load_published(name, cdir)
        if mod is not None:
            _stats["disk_hits"] += 1
        else:
            cdir = cache_dir()            # load_published gives up a folder nothing loads from
            _log_compile(name, cdir)
            t0 = time.perf_counter()
            mod = _build_and_import(source, name, cdir)
            _stats["compile_seconds"] += time.perf_counter() - t0
            _stats["misses"] += 1
            _prune_soon(cdir)
        _memory[(name_hint, source)] = mod
        return mod


def _build_and_import(source: str, name: str, cdir: Path) -> types.ModuleType:
    """Build module ``name`` into ``cdir`` and import it (``_build``). Where another
    process's :func:`cache_clear` removed the folder during the build, the build runs again
    (a few tries); a folder that went bad otherwise (full, read-only) is given up for the
    private cache."""
    for attempt in range(3):
        try:
            return _build(source, name, cdir)
        except FileNotFoundError:
            if attempt == 2:
                raise
            _checked_dirs.pop(str(cdir), None)
            cdir = cache_dir()            # checked (and made) again
        except OSError as exc:
            if cdir == _private_cache():
                raise
            cdir = _give_up_on(cdir, f"building in it failed: {exc}")
            return _build(source, name, cdir)
    raise AssertionError("unreachable")


def load_published(name: str, cdir: Path | None = None) -> types.ModuleType | None:
    """Module ``name`` from the cache folder or the install-time folder, whichever holds a
    copy that matches its recorded checksum; None when neither does. A cached copy that
    fails the check (or fails to import) is quarantined so that it gets rebuilt; a damaged
    install-time copy, or one in a read-only configured cache, is only skipped (neither
    folder is written)."""
    cdir = cache_dir() if cdir is None else cdir
    read_only = _read_only_dirs.get(str(cdir))
    folders = ((cdir, True),) + (((read_only, False),) if read_only is not None else ()) + \
        ((PREBUILT_DIR, False),)
    for folder, in_cache in folders:
        path = folder / (name + _EXT_SUFFIX)
        if not path.exists():
            continue
        try:
            mod = _import_extension(name, path, require_checksum=True)
        except FileNotFoundError:      # removed since (another process's cache_clear)
            continue
        except (ImportError, KernelFileError) as exc:   # damaged, stale: rebuild
            if _unloadable(exc):     # a good file in a folder nothing loads from (noexec)
                if in_cache:
                    _give_up_on(folder, f"loading {path.name} from it failed: {exc}")
                continue
            logger.warning("scorch: module file %s not used (%s); %s", path, exc,
                           "rebuilding it" if in_cache else "building it instead")
            if in_cache:
                _quarantine(path)
            continue
        if in_cache:
            _mark_used(path)
        logger.debug("scorch: loaded %s from %s", name, path)
        return mod
    return None


def cache_info() -> dict[str, Any]:
    """Cache location and usage: ``cache_dir``, ``disk_kernels`` (``.so`` files on disk),
    ``disk_bytes`` (all files under the versioned folder, including the ~15 MB C and
    ~50 MB C++ precompiled headers), ``loaded`` (modules in the
    in-process table), and this process's counters: ``hits`` (in-memory), ``disk_hits``
    (loaded from disk, no compile), ``misses`` (compiled), ``compile_seconds``,
    ``cxx_builds`` (compiled from the C++ form, no Cython) and ``cxx_fallbacks`` (C++
    forms g++ rejected, built with Cython instead: a bug to report), and
    ``disk_limit_bytes`` (:func:`cache_limit`), and ``older_versions_bytes`` (the folders
    an earlier scorch left beside it, which :func:`cache_clear` removes)."""
    cdir = cache_dir()
    n_bytes, n_so = _tree_size(cdir)
    return {
        "cache_dir": str(cdir),
        "disk_kernels": n_so,
        "disk_bytes": n_bytes,
        "older_versions_bytes": sum(_tree_size(d)[0] for d in _older_versions(cdir)),
        "loaded": len(_memory),
        "hits": _stats["hits"],
        "disk_hits": _stats["disk_hits"],
        "misses": _stats["misses"],
        "compile_seconds": _stats["compile_seconds"],
        "cxx_builds": _stats["cxx_builds"],
        "cxx_fallbacks": _stats["cxx_fallbacks"],
        "disk_limit_bytes": cache_limit(),
    }


def _tree_size(d: Path) -> tuple[int, int]:
    """(bytes of all files under ``d``, kernel modules directly in it)."""
    n_bytes = n_so = 0
    for dirpath, _dirs, files in os.walk(d):
        for fn in files:
            try:
                n_bytes += os.path.getsize(os.path.join(dirpath, fn))
            except OSError:
                continue                      # removed concurrently
            if dirpath == str(d) and fn.endswith(_EXT_SUFFIX):
                n_so += 1
    return n_bytes, n_so


_VERSION_FOLDER = re.compile(r"kernels-v(\d+)")


def _older_versions(cdir: Path) -> list[Path]:
    """The cache folders of earlier versions (:data:`BUILD_VERSION`) beside ``cdir``
    (``kernels-v1`` after an upgrade): nothing loads them any more, so :func:`cache_clear`
    removes them and :func:`prune_cache` counts them and removes them first. (Newer
    versions' folders belong to a newer scorch sharing the folder and are left alone.)"""
    try:
        entries = list(cdir.parent.iterdir())
    except OSError:
        return []
    return sorted(e for e in entries if (m := _VERSION_FOLDER.fullmatch(e.name))
                  and int(m.group(1)) < BUILD_VERSION and e.is_dir() and not e.is_symlink())


def cache_clear() -> None:
    """Delete the on-disk kernels (and ``failed/``, ``quarantine/``, the precompiled
    headers, temporary build folders no live build holds and the folders of earlier
    versions), empty the in-process table and reset the counters. Modules already handed
    out stay usable (they remain mapped and in ``sys.modules``). Other processes' in-flight
    temp dirs are left alone. The freed output blocks kernels keep for reuse (the process
    pool, ``scorch._runtime.workspace``) go back to malloc too."""
    release = getattr(sys.modules.get("scorch._runtime.workspace"), "release_memory", None)
    if release is not None:          # not imported yet: no kernel has kept a block
        release()
    with _slow_lock:
        _memory.clear()
        _pch_threads.clear()
        _pch_failed.clear()
        for k in _stats:
            _stats[k] = 0.0 if k == "compile_seconds" else 0
        cdir = cache_dir()
        for old in _older_versions(cdir):
            shutil.rmtree(old, ignore_errors=True)
        if not cdir.is_dir():
            return
        for entry in cdir.iterdir():
            if entry.name == "tmp":
                _remove_stale_tmp(entry)
                continue
            if entry.name == ".publish.lock":
                continue
            try:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()
            except FileNotFoundError:
                pass


def cache_limit() -> int | None:
    """The bound on the cache folder's kernel files in bytes (``SCORCH_CACHE_MAX_MB``), or
    None for no bound."""
    raw = os.environ.get(CACHE_MAX_ENV, "")
    try:
        mb = float(raw) if raw.strip() else float(DEFAULT_CACHE_MAX_MB)
    except ValueError:
        mb = -1.0
    if mb < 0 or mb != mb:
        if raw not in _warned_limits:
            _warned_limits.add(raw)
            logger.warning("scorch: %s=%r is not a number of megabytes (0: no bound); keeping "
                           "the default %d MB", CACHE_MAX_ENV, raw, DEFAULT_CACHE_MAX_MB)
        mb = float(DEFAULT_CACHE_MAX_MB)
    return None if mb == 0 else int(mb * (1 << 20))


def prune_cache(cdir: Path | None = None, limit: int | None = None) -> int:
    """Where the kernels in ``cdir`` (a module: its ``.so``, checksum and ``.pyx``) and the
    folders of earlier versions beside it (removed first) total more than ``limit`` bytes,
    remove the least recently used (by their ``.so``'s time) until they total at most
    :data:`PRUNE_TO` of it; returns the bytes removed. A process that has a removed kernel
    loaded keeps it (the mapping outlives the file); one that looks for it later builds it
    again. Each module goes under the publish lock, so a
    concurrent build of the same key is never half removed."""
    cdir = cache_dir() if cdir is None else cdir
    limit = cache_limit() if limit is None else limit
    if limit is None or not cdir.is_dir():
        return 0
    suffixes = (_EXT_SUFFIX, _EXT_SUFFIX + CHECKSUM_SUFFIX, ".pyx")
    modules: dict[str, list] = {}       # stem -> [bytes, last used]
    with os.scandir(cdir) as entries:
        for e in entries:
            suffix = next((x for x in suffixes if e.name.endswith(x)), None)
            if suffix is None:
                continue
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue                          # removed concurrently
            m = modules.setdefault(e.name[:-len(suffix)], [0, 0.0])
            m[0] += st.st_size
            if suffix == _EXT_SUFFIX:
                m[1] = st.st_mtime
    older = {d: _tree_size(d)[0] for d in _older_versions(cdir)}
    total = sum(size for size, _ in modules.values()) + sum(older.values())
    if total <= limit:
        return 0
    removed = 0
    for d, size in older.items():       # an earlier version's kernels: never loaded again
        shutil.rmtree(d, ignore_errors=True)
        removed += size
    for stem, (size, _used) in sorted(modules.items(), key=lambda kv: kv[1][1]):
        if total - removed <= limit * PRUNE_TO:
            break
        with _publish_lock(cdir):
            for suffix in suffixes:     # the .so first: without it the module is absent
                try:
                    (cdir / (stem + suffix)).unlink()
                except FileNotFoundError:
                    pass
        removed += size
    logger.info("scorch: removed %d MB of least recently used kernels from %s (bound %d MB, "
                "%s)", removed >> 20, cdir, limit >> 20, CACHE_MAX_ENV)
    return removed


# --------------------------------------------------------------------------- internals

_warned_limits: set = set()
_last_prune = [0.0]


def _prune_soon(cdir: Path) -> None:
    """:func:`prune_cache` in a daemon thread, at most every :data:`PRUNE_EVERY_S` seconds
    (a scan of a 40,000-file folder takes ~0.1 s: never on the compile's own path)."""
    now = time.monotonic()
    if now - _last_prune[0] < PRUNE_EVERY_S or cache_limit() is None:
        return
    _last_prune[0] = now

    def run() -> None:
        try:
            prune_cache(cdir)
        except OSError as exc:
            logger.debug("scorch: pruning %s failed: %s", cdir, exc)
    threading.Thread(target=run, name="scorch-cache-prune", daemon=True).start()


def _mark_used(path: Path) -> None:
    """A kernel loaded from the cache is recent again for :func:`prune_cache` (its
    ``.so``'s time; file systems mounted ``noatime`` keep no access times)."""
    try:
        os.utime(path)
    except OSError:
        pass

def _remove_stale_tmp(tmp_root: Path) -> None:
    """Drop build dirs that no live build holds (each build keeps an flock on its
    ``.lock``; a killed process's lock is gone, so its dir is removed). A dir made in the
    last minute is left alone: between ``mkdtemp`` and its flock a build holds no lock yet."""
    for d in tmp_root.iterdir():
        try:
            if not d.is_dir():
                d.unlink()
                continue
            if time.time() - d.stat().st_mtime < 60:
                continue
            fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            os.close(fd)
            continue   # in use by a build right now
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def _log_compile(name: str, cdir: Path) -> None:
    """Log a cold compile. The first one in a process is a WARNING so that it is visible
    without any logging configuration (Python's last-resort handler prints WARNINGs to
    stderr): a user whose first sparse op stalls for a second should learn why, once.
    We deliberately do not install handlers, which is the application's business. Later
    compiles are INFO, so long runs do not spam stderr."""
    global _warned_first_compile
    level = logging.INFO if _warned_first_compile else logging.WARNING
    _warned_first_compile = True
    logger.log(level, "scorch: compiling kernel %s on first use (cached in %s)", name, cdir)


class KernelFileError(RuntimeError):
    """A compiled kernel file does not match the checksum recorded when it was built."""


CHECKSUM_SUFFIX = ".sum"


def _digest_fd(fd: int) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        size += len(chunk)
        h.update(chunk)
    return size, h.hexdigest()


def file_checksum(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size, digest = _digest_fd(fd)
    finally:
        os.close(fd)
    return {"size": size, "sha256": digest}


def write_checksum(so: Path, dest_name: str | None = None) -> Path:
    """Write the checksum file of ``so`` beside it (named after ``dest_name`` when the file
    will be published under another name); returns its path."""
    sum_path = so.with_name((dest_name or so.name) + CHECKSUM_SUFFIX)
    sum_path.write_text(json.dumps(file_checksum(so)))
    return sum_path


def _recorded_checksum(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.with_name(path.name + CHECKSUM_SUFFIX).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("size"), int) \
            or not isinstance(rec.get("sha256"), str):
        return None
    return rec


def _elf_complete(fd: int, size: int) -> bool:
    """For files without a checksum: the ELF header's section table lies inside the file
    (a truncated shared object fails this; ``dlopen`` of one can crash the process)."""
    import struct
    os.lseek(fd, 0, os.SEEK_SET)
    head = os.read(fd, 64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        return False
    endian = "<" if head[5] == 1 else ">"
    shoff = struct.unpack_from(endian + "Q", head, 0x28)[0]
    shentsize, shnum = struct.unpack_from(endian + "HH", head, 0x3A)
    return shoff + shentsize * shnum <= size


def _import_extension(name: str, path: Path, require_checksum: bool = False) -> types.ModuleType:
    """Import ``path`` as module ``name``, after checking its bytes against the checksum
    recorded beside it (``require_checksum``: a file without one is refused; otherwise a
    file without one gets a structural check). Between the check and ``dlopen`` only an
    ``os.replace`` by a builder of the same key can change the file (the folder is this
    user's alone), and that publishes a whole, checked file. (Loading through
    ``/proc/self/fd`` would close even that gap, but glibc identifies loaded objects by
    that path name, and descriptor numbers are reused.) The name embeds the key, so
    it is unique per source; if it is already imported (e.g. after :func:`cache_clear`)
    reuse it, as extension modules cannot be re-initialised. Raises KernelFileError for a
    file that fails the check."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    fd = os.open(path, os.O_RDONLY)
    try:
        size, digest = _digest_fd(fd)
        rec = _recorded_checksum(path)
        if rec is None and require_checksum:
            raise KernelFileError(f"no checksum file beside {path.name}")
        if rec is not None and (rec["size"] != size or rec["sha256"] != digest):
            raise KernelFileError(f"{path.name} has {size} bytes with SHA-256 {digest[:12]}..., "
                                  f"the build recorded {rec['size']} bytes, {rec['sha256'][:12]}...")
        if rec is None and not _elf_complete(fd, size):
            raise KernelFileError(f"{path.name} is not a complete shared object")
    finally:
        os.close(fd)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:  # pragma: no cover
        raise ImportError(f"cannot create a module spec for {path}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


def _quarantine(path: Path) -> Path | None:
    """Move a kernel file that failed its check (and its checksum) to ``quarantine/`` so
    no process loads it again; returns the new path (None if it could not be moved)."""
    qdir = path.parent / "quarantine"
    stamp = f"{time.time_ns()}.{os.getpid()}"
    try:
        qdir.mkdir(exist_ok=True)
        with _publish_lock(path.parent):
            if not path.exists():
                return None
            if _verified_now(path):   # a concurrent publish replaced it meanwhile
                return None
            dest = qdir / f"{path.name}.{stamp}"
            os.replace(path, dest)
            sum_path = path.with_name(path.name + CHECKSUM_SUFFIX)
            if sum_path.exists():
                os.replace(sum_path, qdir / f"{sum_path.name}.{stamp}")
        logger.warning("scorch: moved the damaged kernel file %s to %s", path, dest)
        return dest
    except OSError as exc:
        logger.warning("scorch: could not quarantine %s: %s", path, exc)
        return None


def _verified_now(path: Path) -> bool:
    rec = _recorded_checksum(path)
    try:
        return rec is not None and file_checksum(path) == rec
    except OSError:
        return False


class _publish_lock:
    """An exclusive ``flock`` on ``<dir>/.publish.lock`` while a checksum and its file are
    replaced together (readers that see a mismatch re-check under it)."""

    def __init__(self, d: Path) -> None:
        self.path = d / ".publish.lock"
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def publish(src: Path, dest: Path) -> None:
    """Move a finished kernel file into the cache with its checksum, atomically and
    together (for other builders of cached modules too, e.g. the warm-call module)."""
    sum_tmp = write_checksum(src, dest.name)
    with _publish_lock(dest.parent):
        os.replace(sum_tmp, dest.with_name(dest.name + CHECKSUM_SUFFIX))
        os.replace(src, dest)


def _build(source: str, name: str, cdir: Path) -> types.ModuleType:
    """Cythonize + compile in a private temp dir (locked while in use, so ``cache_clear``
    in another process leaves it alone), atomically publish into ``cdir``, and import the
    module from a second link to the file in the temp dir (so another process's
    ``cache_clear`` right after the publishing cannot take it away from this import)."""
    tmp_root = cdir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=name[-20:] + "-", dir=tmp_root))
    lock_fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        pyx = work / (name + ".pyx")
        pyx.write_text(source, encoding="utf-8")
        so = work / (name + _EXT_SUFFIX)
        rejected: list = []              # the C++ form's CompileError (see _built_as_cxx)
        if not _built_as_cxx(source, name, pyx, so, cdir, work, rejected):
            cpp = _is_cpp(source)
            require_compiler(cpp)        # before any work: no compiler fails at once, clearly
            pch = _pch(cdir, cpp)        # first: a background PCH build overlaps Cython
            c_file = work / (name + (".cpp" if cpp else ".c"))
            _cythonize(pyx, c_file, name, cpp, cdir)
            _cc_with_pch(source, c_file, so, pyx, cpp, cdir, pch)
            if rejected:                 # Cython's form built: the lowering was at fault
                _report_cxx_fallback(name, rejected[0])
        own = work / "loaded" / so.name
        own.parent.mkdir()
        os.link(so, own)
        os.replace(pyx, cdir / pyx.name)
        publish(so, cdir / so.name)
        try:
            mod = _import_extension(name, own)    # our own build: the ELF check suffices
        except ImportError as exc:
            if _unloadable(exc):                  # the folder's fault: _build_and_import moves on
                raise OSError(errno.EACCES, f"kernels cannot be loaded from {cdir} (a file "
                              f"system mounted noexec?; SCORCH_CACHE_DIR names another "
                              f"folder): {exc}") from None
            raise
        mod.__file__ = str(cdir / so.name)         # where it lives from now on
        return mod
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock_fd)


def _cc_with_pch(source: str, c_file: Path, so: Path, pyx: Path, cpp: bool, cdir: Path,
                 pch: Path | None, extra: tuple[str, ...] = ()) -> None:
    """:func:`_cc` with the precompiled header, again without it if that fails (a damaged
    PCH must not stop kernels; it is not offered again in this process)."""
    try:
        _cc(source, c_file, so, pyx, cpp, cdir, pch, extra)
    except CompileError:
        if pch is None:
            raise
        _pch_failed.add(str(pch) + ".gch")
        _cc(source, c_file, so, pyx, cpp, cdir, None, extra)


def _built_as_cxx(source: str, name: str, pyx: Path, so: Path, cdir: Path, work: Path,
                  rejected: list | None = None) -> bool:
    """Build a kernel whose entry is ``kernel_c`` from the C++ that ``cxx_module`` lowers
    it to, skipping Cython's module code (~3x faster to compile); False when the source
    is outside that subset (or ``SCORCH_CXX_KERNELS=0``), and Cython builds it.

    A C++ form that g++ rejects with diagnostics in it may be a bug in the lowering: its
    CompileError goes into ``rejected`` and the kernel is built with Cython; only once
    that build succeeds is it reported as one (``_report_cxx_fallback``), since a Cython
    build that fails too means the compiler or its setup is at fault. A compiler that
    failed without reading the C++ form (it cannot run, cannot write its output, ...) is
    the environment's fault, never the lowering's: its CompileError is raised at once
    when the Cython route would run the same compiler (one failing call, not four or
    five), and the Cython route is taken, unreported, when it runs another (``$CC``)."""
    if not env_flag(CXX_ENV):
        return False
    try:
        text = _cxx.to_cpp(source)
    except _cxx.Unsupported:
        return False
    if shutil.which(compiler_command(True)[0]) is None:
        return False
    c_file = work / (name + "_lowered.cpp")    # not Cython's output name: it may follow
    c_file.write_text(text, encoding="utf-8")
    try:
        _cc_with_pch(source, c_file, so, pyx, True, cdir, _pch(cdir, True),
                     (f"-D{_cxx.MODULE_MACRO}={name}",))
    except CompileError as exc:
        # gcc locates a complaint about the code as ``file:line`` (``file:(.text+0x..)`` for
        # the linker), where the file is the lowered C++ (a path under ``failed/`` by now)
        if re.search(re.escape(c_file.name) + r":[\d(]", str(exc)):
            if rejected is not None:
                rejected.append(exc)
            else:
                _report_cxx_fallback(name, exc)
            return False
        if _is_cpp(source) or compiler_command(False) == compiler_command(True):
            raise
        return False
    _stats["cxx_builds"] += 1
    return True


def _report_cxx_fallback(name: str, exc: CompileError) -> None:
    """A C++ form gcc rejected while Cython's form of the same kernel built: a lowering
    bug, logged with the kept files and counted (``cache_info()["cxx_fallbacks"]``)."""
    _stats["cxx_fallbacks"] += 1
    logger.warning("scorch: the C++ form of kernel %s did not compile; building it with "
                   "Cython instead. Please report this with the files it names:\n%s",
                   name, exc)


def _keep_failed(pyx: Path, c_file: Path | None, cdir: Path) -> tuple[Path, Path | None]:
    """Copy the failing sources to ``failed/`` (they outlive the temp dir)."""
    failed = cdir / "failed"
    failed.mkdir(parents=True, exist_ok=True)
    kept_pyx = failed / pyx.name
    shutil.copyfile(pyx, kept_pyx)
    kept_c = None
    if c_file is not None and c_file.exists():
        kept_c = failed / c_file.name
        shutil.copyfile(c_file, kept_c)
    return kept_pyx, kept_c


def _cythonize(pyx: Path, c_file: Path, name: str, cpp: bool, cdir: Path) -> None:
    """Run Cython in process; errors go to a listing file, not to our stderr."""
    from Cython.Compiler import Errors
    from Cython.Compiler.Main import CompilationOptions, compile_single, default_options

    options = CompilationOptions(
        default_options,
        cplus=cpp,
        language_level=3,
        compiler_directives=dict(CYTHON_DIRECTIVES),
        include_path=[str(_PKG_ROOT), str(_RUNTIME_DIR)],
        output_file=str(c_file),
        use_listing_file=True,
        errors_to_stderr=False,
        annotate=False,
        cache=False,
        timestamps=False,
    )
    listing = pyx.with_suffix(".lis")
    error_text = ""
    num_errors = 0
    # Cython allocates many small objects; with torch loaded, cyclic-GC passes over
    # torch's heap made the first compile ~0.35 s slower. Nothing here creates garbage
    # cycles that must be collected mid-compile.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = compile_single(str(pyx), options, name)
        num_errors = result.num_errors
    except (Errors.CompileError, Errors.AbortError, Errors.InternalError) as exc:
        num_errors = max(num_errors, 1)
        error_text = str(exc)
    except OSError:            # writing its output failed (a full disk): not the kernel's fault
        raise
    except Exception as exc:  # Cython crashed on odd input: still a compile error
        num_errors = max(num_errors, 1)
        error_text = f"{type(exc).__name__}: {exc}"
    finally:
        if gc_was_enabled:
            gc.enable()
        Errors.close_listing_file()
    if num_errors or not c_file.exists():
        if listing.exists():
            error_text = (listing.read_text(encoding="utf-8", errors="replace") + error_text)
        if _disk_error(error_text):
            raise _disk_error(error_text)
        kept_pyx, _ = _keep_failed(pyx, None, cdir)
        msg = _trim(error_text.replace(str(pyx), str(kept_pyx))) or "(no message from Cython)"
        raise CompileError(f"Cython failed on kernel source {kept_pyx}:\n{msg}",
                           pyx_path=str(kept_pyx), stage="cython")


def _include_flags(source: str) -> list[str]:
    paths = sysconfig.get_paths()
    incs = [paths["include"]]
    if paths.get("platinclude") and paths["platinclude"] != paths["include"]:
        incs.append(paths["platinclude"])
    incs.append(str(_RUNTIME_DIR))
    flags = []
    if _NUMPY_CIMPORT.search(source):
        import numpy
        incs.append(numpy.get_include())
        flags.extend(NUMPY_DEFINES)
    return [f"-I{p}" for p in incs] + flags


def _pch(cdir: Path, cpp: bool) -> Path | None:
    """Return the precompiled header to ``-include`` if its ``.gch`` is built.

    Otherwise start building it on a background thread and return None: the kernel that
    triggered it compiles without it, on the other core (the build is niced so the kernel
    the user waits for comes first). Saves ~40% of gcc's CPU time for C++ kernels
    (libstdc++ headers) and ~10% for C kernels (Python.h). The ``.gch`` is published with
    :func:`os.replace`; its name carries the flags/CPU/compiler fingerprint, and gcc
    ignores a ``.gch`` that does not match the command line (falling back to the plain
    header), so a stale or foreign one is only slower, never wrong.
    """
    header, gch = _pch_paths(cdir, cpp)
    installed = PREBUILT_DIR / "pch" / header.name
    installed_gch = installed.with_name(gch.name)
    if str(installed_gch) not in _pch_failed and installed_gch.exists() and _pch_ok(installed_gch):
        return installed             # built at install time (prebuilt.py)
    if str(gch) in _pch_failed:
        return None
    if gch.exists():
        if _pch_ok(gch):
            return header
        if _pch_building_elsewhere(gch):
            return None
    thread = _pch_threads.get(str(gch))
    if thread is None or not thread.is_alive():
        thread = threading.Thread(target=_build_pch, args=(header, gch, cpp), daemon=True,
                                  name="scorch-pch")
        _pch_threads[str(gch)] = thread
        thread.start()
    return None


def _pch_paths(cdir: Path, cpp: bool) -> tuple[Path, Path]:
    """The header and its ``.gch`` for this cache dir; the name carries the fingerprint."""
    headers = "\0".join(PCH_CXX_HEADERS if cpp else PCH_C_HEADERS)
    tag = hashlib.sha256((_environment_fingerprint() + _compiler_id(cpp) + headers).encode()
                         ).hexdigest()[:16]
    header = cdir / "pch" / f"scorch_{'cxx' if cpp else 'c'}_{tag}.h"
    return header, header.with_name(header.name + ".gch")


def build_precompiled_headers() -> list[Path]:
    """Build the C and C++ precompiled headers of the cache dir in use now, waiting for a
    build another process started; returns the ``.gch`` files that are ready (the install
    step copies them to ``_prebuilt/pch``, where :func:`_pch` finds them first)."""
    ready = []
    for cpp in (False, True):
        header, gch = _pch_paths(cache_dir(), cpp)
        for _attempt in range(2):       # the first may only have waited for another builder
            _build_pch(header, gch, cpp)
            lock_fd = os.open(gch.with_name(gch.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)    # until a build elsewhere finishes
            finally:
                os.close(lock_fd)
            if gch.exists() and _pch_ok(gch):
                ready.append(gch)
                break
    return ready


_pch_checked: dict[str, tuple[int, int]] = {}   # verified .gch -> (inode, mtime_ns)


def _pch_ok(gch: Path) -> bool:
    """The ``.gch`` matches the checksum its build recorded (hashed once per process and
    file version; a damaged one is rebuilt, never handed to gcc)."""
    try:
        st = gch.stat()
    except OSError:
        return False
    stamp = (st.st_ino, st.st_mtime_ns)
    if _pch_checked.get(str(gch)) == stamp:
        return True
    if not _verified_now(gch):
        return False
    _pch_checked[str(gch)] = stamp
    return True


def _pch_building_elsewhere(gch: Path) -> bool:
    """True while some process holds the PCH build lock."""
    try:
        fd = os.open(gch.with_name(gch.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)   # closing drops a lock we took
    return False


def _build_pch(header: Path, gch: Path, cpp: bool) -> None:
    """Build the ``.gch`` once per cache dir: an ``flock`` on ``<gch>.lock`` (held by the
    compiling shell, so it outlives this process if it exits first) keeps other processes
    from building the same 50 MB at the same time; they compile without it meanwhile. The
    shell publishes the checksum and then the file, both with ``mv``."""
    headers = PCH_CXX_HEADERS if cpp else PCH_C_HEADERS
    lock_fd = -1
    try:
        header.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(gch.with_name(gch.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return   # another process builds it
        if gch.exists() and _pch_ok(gch):
            return   # built by another process meanwhile
        text = ("/* scorch: precompiled header for kernels (see scorch/tensor_compiler/build.py) */\n"
                "#ifndef PY_SSIZE_T_CLEAN\n#define PY_SSIZE_T_CLEAN\n#endif\n"
                "#include \"Python.h\"\n"
                + "".join(f"#include <{h}>\n" for h in headers))
        tmp_h = header.with_name(f"{header.name}.{os.getpid()}.tmp")
        tmp_h.write_text(text)
        os.replace(tmp_h, header)
        tmp_gch = gch.with_name(f"{gch.name}.{os.getpid()}.tmp")
        sum_path = gch.with_name(gch.name + CHECKSUM_SUFFIX)
        flags = [f for f in CFLAGS if f != "-shared"]
        nice = ["nice", "-n", "15"] if shutil.which("nice") else []
        cc, lang = compiler_command(cpp), ("c++-header" if cpp else "c-header")
        # The shell renames the finished files itself, so a process that exits before
        # the build ends (daemon thread) still publishes them instead of leaving a .tmp.
        script = ('out="$1"; dst="$2"; sum="$3"; shift 3; '
                  '"$@" -o "$out" && '
                  'printf \'{"size": %s, "sha256": "%s"}\' "$(stat -c %s "$out")" '
                  '"$(sha256sum "$out" | cut -d " " -f 1)" > "$out.sum" && '
                  'mv -f "$out.sum" "$sum" && mv -f "$out" "$dst" '
                  '|| { rm -f "$out" "$out.sum"; exit 1; }')
        proc = subprocess.run(["sh", "-c", script, "sh", str(tmp_gch), str(gch), str(sum_path),
                               *nice, *cc, *flags, *_include_flags(""), "-x", lang, str(header)],
                              capture_output=True, text=True, errors="replace",
                              pass_fds=(lock_fd,))
        if proc.returncode != 0:
            if header.parent.is_dir():          # not merely removed by cache_clear()
                _pch_failed.add(str(gch))
            logger.debug("scorch: building the PCH failed (kernels still build "
                         "without it):\n%s", proc.stderr[-2000:])
    except OSError as exc:   # e.g. cache_clear() removed the folder meanwhile
        logger.debug("scorch: building the PCH failed: %s", exc)
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _cc(source: str, c_file: Path, so: Path, pyx: Path, cpp: bool, cdir: Path,
        pch: Path | None = None, extra: tuple[str, ...] = ()) -> None:
    """Compile and link in one gcc/g++ call (no separate .o step; ``$CXX`` / ``$CC``).
    A compiler that ran out of disk raises the OSError (``_build_and_import`` moves to
    the private cache; the kernel is not at fault)."""
    cc = require_compiler(cpp)
    flags = kernel_cflags(source)
    # the precompiled header is built with the native flags (gcc would only reject it)
    pch_flags = ["-include", str(pch)] if pch is not None and source_target(source) is None else []
    cmd = [*cc, *flags, *extra, *pch_flags, *_include_flags(source), str(c_file), "-o", str(so)]
    _last_cc_cmd[:] = cmd
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        kept_pyx, _ = _keep_failed(pyx, c_file, cdir)
        raise CompileError(f"could not run {cc[0]} for kernel {kept_pyx}: {exc}",
                           pyx_path=str(kept_pyx), stage="cc") from None
    if proc.returncode != 0 and _disk_error(proc.stderr):
        raise _disk_error(proc.stderr)
    if proc.returncode != 0 or not so.exists():
        kept_pyx, kept_c = _keep_failed(pyx, c_file, cdir)
        text = proc.stderr.replace(str(c_file), str(kept_c)).replace(str(pyx), str(kept_pyx))
        raise CompileError(
            f"{cc[0]} failed (exit {proc.returncode}) on kernel {kept_pyx} "
            f"(generated C: {kept_c}):\n{_trim(_errors_first(text))}",
            pyx_path=str(kept_pyx), stage="cc")


#: what a compiler or Cython reports when the disk, not the kernel, is the problem
_DISK_ERRORS = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT}


def _disk_error(text: str) -> OSError | None:
    """The OSError a failed compile's message reports (a full disk, a quota), or None."""
    for message, code in _DISK_ERRORS.items():
        if message in text:
            return OSError(code, f"{message} (while compiling a kernel)")
    return None


def _errors_first(text: str) -> str:
    """From gcc's stderr keep the error lines (with a little context) ahead of the
    'In function' preamble and warnings, which for generated code are mostly noise."""
    lines = text.splitlines()
    keep: list[int] = []
    for i, line in enumerate(lines):
        if " error:" in line or "fatal error" in line or "undefined reference" in line:
            keep.extend(range(max(0, i - 1), min(len(lines), i + 3)))
    if not keep:
        return text
    seen: set[int] = set()
    out = []
    for i in keep:
        if i not in seen:
            seen.add(i)
            out.append(lines[i])
    return "\n".join(out)


def _trim(text: str, max_lines: int = 40, max_chars: int = 4000) -> str:
    text = text.strip()
    lines = text.splitlines()
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = text[:max_chars] + "\n... (truncated)"
    return text
