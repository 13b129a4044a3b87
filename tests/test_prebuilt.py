"""Standard kernels are compiled at install time: a fresh process with an empty kernel
cache runs them without compiling."""
import json
import os
import subprocess
import sys

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
