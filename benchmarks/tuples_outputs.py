"""Ops whose sparse result is assembled as coordinate tuples (``TuplesOutput``: a DCSR or
COO result, an outer product of sparse vectors), timed warm at 1 thread (median of 7).

    python benchmarks/tuples_outputs.py [TREE]

``TREE`` (default: the installed scorch) is a checkout put first on ``sys.path``; run it
for two trees, alternating, with a kernel cache each (``SCORCH_CACHE_DIR``), to compare
them (session 31: AppendBuffer for these outputs).
"""
import statistics
import sys
import time

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

import scorch  # noqa: E402


def _random(n: int, nnz: int, fmt: str, g: torch.Generator):
    idx = torch.stack([torch.randint(0, n, (nnz,), generator=g), torch.randint(0, n, (nnz,), generator=g)])
    return scorch.sparse_tensor((idx, torch.rand(nnz, generator=g)), size=(n, n), format=fmt)


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = 200_000
    u = scorch.sparse_tensor(torch.rand(4000, generator=g) * (torch.rand(4000, generator=g) < 0.5),
                             format="c")
    A, B = _random(n, 1_000_000, "dcsr", g), _random(n, 1_000_000, "dcsr", g)
    C, D = _random(n, 1_000_000, "coo", g), _random(n, 1_000_000, "coo", g)
    cases = {"outer c x c (4M)": lambda: scorch.einsum("i,j->ij", u, u),
             "dcsr + dcsr (2M)": lambda: A + B,
             "coo + coo (2M)": lambda: C + D,
             "dcsr * dcsr": lambda: A * B}
    print(f"scorch from {scorch.__file__}")
    for name, f in cases.items():
        f()
        f()
        times = []
        for _ in range(7):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        print(f"{name:18s} {statistics.median(times) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
