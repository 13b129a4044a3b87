"""A/B: chunk variant called through the function pointer (old) or by name (new), same
process, interleaved rounds, wall time medians."""
import sys, time, statistics
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import numpy as np, torch, scorch
import kernels as K
from scorch.tensor_compiler import codegen, build

def old_source(src):
    """Undo the by-name dispatch: every `if fn == X: X(...) elif ... else: fn(...)` chain -> fn(...)."""
    out, lines, i = [], src.split("\n"), 0
    while i < len(lines):
        ln = lines[i]
        st = ln.strip()
        if st.startswith("if fn == run_chunk"):
            ind = ln[:len(ln) - len(ln.lstrip())]
            j = i
            while not lines[j].strip() == "else:" or lines[j][:len(ind)] != ind or lines[j][len(ind)] == " ":
                j += 1
            call = lines[j + 1].strip()
            out.append(ind + call)
            i = j + 2
            continue
        out.append(ln); i += 1
    return "\n".join(out)

def run(name, eq, K_):
    A = K.load_matrix(name).astype("float32"); A.indptr, A.indices = A.indptr.astype("int32"), A.indices.astype("int32")
    As = scorch.from_scipy(A)
    if eq == "spmv":
        X = np.random.default_rng(0).standard_normal(A.shape[1]).astype("float32"); out = np.zeros(A.shape[0], "float32")
        s = scorch.explain("ij,j->i", As, torch.from_numpy(X)).schedule
        args = [A.shape[0], A.shape[1], A.indptr.ctypes.data, A.indices.ctypes.data, A.data.ctypes.data, 1, X.ctypes.data, out.ctypes.data, 1]
        srcs = [codegen.generate(s, torch.float32, {ap.id: torch.int32 for ap in s.accesses if ap.sparse}, scalar_inner=True)[0]]
    else:
        X = np.random.default_rng(0).standard_normal((A.shape[1], K_)).astype("float32"); out = np.zeros((A.shape[0], K_), "float32")
        s = scorch.explain("ij,jk->ik", As, torch.from_numpy(X)).schedule
        args = [A.shape[0], A.shape[1], K_, A.indptr.ctypes.data, A.indices.ctypes.data, A.data.ctypes.data, K_, 1, X.ctypes.data, out.ctypes.data, K_, 1]
        srcs = [codegen.generate(s, torch.float32, {ap.id: torch.int32 for ap in s.accesses if ap.sparse})[0]]
    new = srcs[0]; old = old_source(new)
    assert old != new
    mods = {"pointer": build.load_kernel(old), "by name": build.load_kernel(new)}
    for T in (1, 2):
        ts = {k: [] for k in mods}
        for r in range(11):
            for k, m in mods.items():
                f = lambda: m.kernel(args, T)
                f(); n = max(1, int(0.05 / max(1e-6, (lambda t0: (f(), time.perf_counter() - t0)[1])(time.perf_counter()))))
                t0 = time.perf_counter()
                for _ in range(n): f()
                ts[k].append((time.perf_counter() - t0) / n * 1e6)
        a, b = statistics.median(ts["pointer"]), statistics.median(ts["by name"])
        print(f"{eq:5} K={K_:3} {name:22} T={T}  pointer {a:9.1f} us  by name {b:9.1f} us  speedup {a/b:.2f}x", flush=True)

for name in sys.argv[1:]:
    run(name, "spmv", 0)
    run(name, "spmm", 32)
    run(name, "spmm", 128)
