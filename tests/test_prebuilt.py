"""Standard kernels are compiled at install time: a fresh process with an empty kernel
cache runs them without compiling, through einsum and through the torch ops (``@``,
``F.linear`` and a sparse layer's backward) alike, and a kernel it does compile uses the install's precompiled header;
a source checkout without built extensions says so on import."""
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import scorch

PROBE = r"""
import json, torch, scorch, warnings
warnings.simplefilter("ignore")
import importlib
build = importlib.import_module("scorch.tensor_compiler.build")
g = torch.Generator().manual_seed(1)
d = (torch.rand(50, 40, generator=g) * (torch.rand(50, 40, generator=g) < 0.1))
res = {}
for fmt in ["csr", "csc", "coo"]:
    for dtype in [torch.float32, torch.float64]:
        A = scorch.sparse_tensor(d.to(dtype), format=fmt)
        X = torch.rand(40, 16, dtype=dtype)
        ok = torch.allclose(scorch.einsum("ij,jk->ik", A, X), d.to(dtype) @ X, atol=1e-5)
        ok &= torch.allclose(scorch.einsum("ij,j->i", A, X[:, 0]), d.to(dtype) @ X[:, 0], atol=1e-5)
        B, C = torch.rand(50, 8, dtype=dtype), torch.rand(8, 40, dtype=dtype)
        S = scorch.einsum("ij,ik,kj->ij", A, B, C)
        ok &= torch.allclose(S.to_dense(), d.to(dtype) * (B @ C), atol=1e-5)
        At = scorch.sparse_tensor(d.t().contiguous().to(dtype), format=fmt)
        P = scorch.einsum("ij,jk->ik", A, At)
        ok &= torch.allclose(P.to_dense(), d.to(dtype) @ d.t().to(dtype), atol=1e-4)
        # the op layer asks for other kernels than einsum (a dense result, CSC transposed)
        ok &= torch.allclose(A @ X, d.to(dtype) @ X, atol=1e-5)
        ok &= torch.allclose(A @ X[:, 0], d.to(dtype) @ X[:, 0], atol=1e-5)
        ok &= torch.allclose(torch.nn.functional.linear(X.t(), A), X.t() @ d.to(dtype).t(), atol=1e-5)
        W = scorch.sparse_tensor(A, requires_grad=True)   # a sparse layer's training step
        torch.nn.functional.linear(X.t(), W).sum().backward()
        ok &= torch.allclose(W.grad.to_dense(), X.sum(1).expand(50, 40).to(dtype) * (d != 0), atol=1e-4)
        res[f"{fmt}-{dtype}"] = bool(ok)
csr64 = d.to_sparse_csr()
res["torch-csr-spmm"] = bool(torch.allclose(scorch.einsum("ij,jk->ik", csr64, torch.ones(40, 3)), d @ torch.ones(40, 3), atol=1e-5))
info = build.cache_info()
fastcall = importlib.import_module("scorch.tensor_compiler.fastcall").load(compile_missing=False)
print(json.dumps({"results": res, "misses": info["misses"],
                  "fastcall": None if fastcall is None else fastcall.__file__}))
"""


def test_standard_kernels_need_no_compile(tmp_path):
    env = dict(os.environ, SCORCH_CACHE_DIR=str(tmp_path / "empty-cache"))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(report["results"].values()), report
    assert report["misses"] == 0, (
        f"{report['misses']} standard kernels compiled on first use: the install did not "
        f"prebuild them (see setup.py / scorch.tensor_compiler.prebuilt); stderr: {out.stderr[-2000:]}")
    assert report["fastcall"] is not None and "_prebuilt" in report["fastcall"], (
        f"the C warm-call module was not prebuilt: {report['fastcall']}; stderr: {out.stderr[-2000:]}")


PCH_PROBE = r"""
import json
from scorch.tensor_compiler import build
src = ("# distutils: language = c++\nfrom libcpp.vector cimport vector\n"
       "def size_of(int n):\n    cdef vector[int] v\n    v.resize(n)\n    return v.size()\n")
m = build.load_kernel(src, "pch_probe")
pch = build.cache_dir() / "pch"
print(json.dumps({"value": m.size_of(3), "cmd": build._last_cc_cmd, "prebuilt": str(build.PREBUILT_DIR),
                  "built_here": sorted(p.name for p in pch.glob("*.gch*")) if pch.is_dir() else []}))
"""


def test_kernels_compiled_later_use_the_installed_precompiled_header(tmp_path):
    """The install builds the C and C++ precompiled headers; a C++ kernel compiled in an
    empty cache includes the installed one (gcc reports it used) and builds none itself."""
    env = dict(os.environ, SCORCH_CACHE_DIR=str(tmp_path / "empty-cache"))
    out = subprocess.run([sys.executable, "-c", PCH_PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["value"] == 3
    cmd = report["cmd"]
    header = Path(cmd[cmd.index("-include") + 1]) if "-include" in cmd else None
    assert header is not None and header.parent == Path(report["prebuilt"]) / "pch", (
        f"the C++ kernel did not include the install's precompiled header: {cmd}")
    assert report["built_here"] == [], report
    # gcc itself: -H marks a precompiled header it used with "!", one it rejected with "x"
    flags, skip = [], False
    for a in cmd[1:]:
        if skip or a == "-o":
            skip = not skip
            continue
        if not a.endswith((".c", ".cpp")):
            flags.append(a)
    probe = tmp_path / "probe.cpp"
    probe.write_text("int probe() { return 0; }\n")
    gcc = subprocess.run([cmd[0], *flags, "-H", "-Winvalid-pch", "-fsyntax-only", str(probe)],
                         capture_output=True, text=True, timeout=120)
    assert f"! {header}.gch" in gcc.stderr, gcc.stderr[-2000:]


def test_source_tree_without_built_extensions_says_why(tmp_path):
    """Python run where a ``scorch/`` checkout that was never built is on sys.path (its root
    as the current directory, or its parent on PYTHONPATH) gets an ImportError that names
    the tree, the missing extensions, the installed copy it hides and the fix."""
    package = Path(scorch.__file__).resolve().parent
    checkout = tmp_path / "checkout"
    shutil.copytree(package, checkout / "scorch",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "_prebuilt", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [(checkout, env),                                          # the checkout's root
            (tmp_path, dict(env, PYTHONPATH=os.pathsep.join([str(checkout), str(package.parent)])))]
    for cwd, run_env in runs:
        out = subprocess.run([sys.executable, "-c", "import scorch"], cwd=cwd, env=run_env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ImportError: scorch: the source tree at {checkout / 'scorch'} has "
                               f"no built extensions"), out.stderr[-2000:]
        assert "convert" in last and "pip install -e ." in last and "another directory" in last
    assert f"It hides the installed scorch at {package}" in last     # PYTHONPATH run: ours is found


def test_the_precompiled_header_holds_what_lowered_kernels_include_and_no_more():
    """gcc maps the whole ``.gch`` into every kernel's compile, and parses itself any header
    a kernel includes that the ``.gch`` lacks. So the PCH lists each system header that the
    C++ lowering (``cxx_module``) and the runtime headers it includes can bring in, and none
    of the heavy libstdc++ headers no lowered kernel includes (75 -> 54 MB: 0.19 -> 0.13 s
    for a small kernel). Only ``<map>`` (the rare std::map workspace) is left to the kernel
    that needs it."""
    import re

    from scorch.tensor_compiler import build, cxx_module

    compiler = Path(build.__file__).resolve().parent
    runtime = compiler.parent / "_runtime"
    wanted = {"stdint.h", "type_traits"}                       # every lowered kernel's
    wanted |= {inc.strip("<>") for inc in cxx_module._INCLUDES.values()
               if inc and inc.startswith("<")}
    # the C the generator writes verbatim (lower/facts.py, relayout.py) and the runtime
    # headers kernels include; build.py writes the PCH itself
    texts = [p.read_text() for p in compiler.rglob("*.py") if p.name != "build.py"]
    texts += [(runtime / h).read_text()
              for h in ("workspace.h", "kernel_result.h", "gather_dot.h", "pack_nonzeros.h")]
    wanted |= set(re.findall(r"#include <([^>]+)>", "\n".join(texts)))
    wanted -= {"Python.h", "map"}
    have = set(build.PCH_CXX_HEADERS)
    # a C header is in when its C++ form is (<cstdint> includes <stdint.h>)
    missing = {h for h in wanted if h not in have and not (h.endswith(".h") and f"c{h[:-2]}" in have)}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        missing.discard("immintrin.h")
    assert not missing, f"headers lowered kernels include that the PCH lacks: {sorted(missing)}"
    assert not have & {"ios", "map", "unordered_map", "deque", "mutex", "stdexcept", "typeinfo"}
