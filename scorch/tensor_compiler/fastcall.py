"""Build and load the C warm-call module (``scorch/_runtime/fastcall.cpp``).

The module reads tensors through ATen, so it is compiled against the installed torch's
headers: by ``scorch.tensor_compiler.prebuilt`` at install time (about 15 s), or on first
use when no copy exists (with ``$CXX``, else g++), and kept in the kernel cache under a key of
its source, torch's and Python's versions and the flags (not the compiler's version: a built
copy loads without a compiler), with its checksum (``build.publish``): like a kernel, it is verified
before it is loaded, and a damaged copy is quarantined and rebuilt. Where it cannot be built
(no headers, no C++ compiler) warm calls keep the Python runner, which does the same work more
slowly; ``SCORCH_FASTCALL=0`` (or false/off/no) chooses that.
"""
from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path
from typing import Optional

from . import build
from .locks import fork_safe_lock

__all__ = ["load", "module_name", "SOURCE"]

logger = logging.getLogger("scorch")

SOURCE = Path(__file__).resolve().parent.parent / "_runtime" / "fastcall.cpp"
CXXFLAGS = ("-O2", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden", "-w")

_lock = fork_safe_lock(globals(), "_lock")
_state: dict = {}   # "module": the loaded module or None once decided


def _torch_flags() -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths
    lib = str(Path(torch.__file__).resolve().parent / "lib")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return ([f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-L{lib}", f"-Wl,-rpath,{lib}",
            "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"])


def module_name() -> str:
    """``scorch_fastcall_<key>``: the key covers the source, torch, Python and the flags (and
    the publishing scheme: copies from before checksums have other names, so they are not
    taken for damaged ones)."""
    import torch
    h = hashlib.sha256(b"published with a checksum\0")
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                 " ".join(CXXFLAGS).encode()):
        h.update(part + b"\0")
    return f"scorch_fastcall_{h.hexdigest()[:20]}"


def _compile(name: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fastcall-", dir=dest.parent) as tmp:
        so = Path(tmp) / dest.name
        cmd = [*build.require_compiler(True), *CXXFLAGS, f"-DSCORCH_FASTCALL_MODULE={name}",
               str(SOURCE), "-o", str(so), *_torch_flags()]
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if proc.returncode != 0 or not so.exists():
            raise build.CompileError(
                f"{cmd[0]} failed (exit {proc.returncode}) on {SOURCE}:\n"
                f"{build._trim(build._errors_first(proc.stderr))}", pyx_path=str(SOURCE),
                stage="cc")
        build.publish(so, dest)     # with its checksum, checked before every load


def load(compile_missing: bool = True) -> Optional[types.ModuleType]:
    """The module, or None where it is switched off or cannot be built (then logged once).
    Looks in the install-time copies, then the kernel cache; compiles into the cache when
    neither has it and ``compile_missing``."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" in _state:
            return _state["module"]
        if not build.env_flag("SCORCH_FASTCALL"):
            _state["module"] = None
            return None
        try:
            name = module_name()
            module = build.load_published(name)    # verified; a damaged copy is not loaded
            if module is None:
                if not compile_missing:
                    return None
                path = build.cache_dir() / (name + build._EXT_SUFFIX)
                logger.warning("scorch: compiling the warm-call module once (about 15 s; "
                               "cached in %s)", path.parent)
                _compile(name, path)
                module = build._import_extension(name, path, require_checksum=True)
        except Exception as exc:  # noqa: BLE001  (the Python runner does the same work)
            logger.warning("scorch: the C warm-call module is unavailable (%s); warm calls "
                           "take the Python path", str(exc).splitlines()[0] if str(exc) else exc)
            module = None
        _state["module"] = module
        return module
