"""pytest-benchmark: one GCN training step (forward + backward) with a scorch sparse
adjacency next to the same step with torch.sparse CSR (``torch.sparse.mm``).

    python -m pytest benchmarks/bench_autograd.py --benchmark-columns=median
    python benchmarks/bench_autograd.py            # one process: medians and ratios

The step: ``H = relu(A @ (X @ W1))``, ``out = A @ (H @ W2)``, cross-entropy, backward, on a
shared graph (``SCORCH_BENCH_GRAPHS``, default "4elt G51"; row-normalized, with self loops),
K = 64 features, float32, 2 threads (``SCORCH_BENCH_THREADS``); ``__main__`` runs the two
implementations in turns and prints medians and ratios. Variants: ``fixed`` (the
adjacency is data: gradients for W1, W2 and through A @ .) and ``learned`` (the adjacency's
values are a parameter too: its gradient is an SDDMM on A's pattern). Not part of ``pytest
tests``.

Two OpenMP runtimes share the process: torch's bundled libgomp and the system libgomp the
generated kernels link. Their idle workers spin, so alternating torch ops and scorch
kernels on 2 threads of a busy 2-core machine stalls for a scheduler slice (~130 ms steps
where 1-2 ms is right, for both implementations). ``OMP_WAIT_POLICY=PASSIVE`` (set before
the run) removes the stalls; the numbers are reported both ways.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

import scorch  # noqa: E402
from scorch import datasets  # noqa: E402

GRAPHS = os.environ.get("SCORCH_BENCH_GRAPHS", "4elt G51").split()
THREADS = int(os.environ.get("SCORCH_BENCH_THREADS", "2"))
K, HIDDEN, CLASSES = 64, 64, 16


def _data_dir():
    env = os.environ.get("SCORCH_DATA_DIR")
    if env:
        return env
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    return str(shared) if shared.exists() else str(Path("/work/shared/data"))


def load_graph(name: str):
    """Row-normalized adjacency with self loops (scipy CSR, float32), features, labels and
    initial weights, all seeded."""
    import scipy.sparse as sp
    m = datasets.load_matrix(name, _data_dir(), dtype=np.dtype("float32"))
    n = m.shape[0]
    a = (abs(m) + sp.eye(n, dtype=np.float32)).tocsr()
    a.data[:] = 1.0
    deg = np.asarray(a.sum(1)).ravel()
    a = sp.diags(1.0 / deg).astype(np.float32) @ a
    a = a.tocsr()
    a.sort_indices()
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, K, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    W1 = (torch.rand(K, HIDDEN, generator=g) - 0.5) * 0.2
    W2 = (torch.rand(HIDDEN, CLASSES, generator=g) - 0.5) * 0.2
    return a, X, y, W1, W2


def make_step(impl: str, variant: str, graph):
    """A zero-argument callable running one forward + backward; returns the loss."""
    a, X, y, W1, W2 = graph
    W1 = W1.clone().requires_grad_()
    W2 = W2.clone().requires_grad_()
    learned = variant == "learned"
    if impl == "scorch":
        A = scorch.sparse_tensor(a, format="csr", requires_grad=learned)

        def mm(B):
            return scorch.einsum("ij,jk->ik", A, B)
        params = [W1, W2] + ([A] if learned else [])
    elif impl == "torch_csr":
        A = torch.sparse_csr_tensor(torch.from_numpy(a.indptr).long(), torch.from_numpy(a.indices).long(),
                                    torch.from_numpy(a.data), a.shape)
        if learned:
            A = A.to_sparse_coo().coalesce().requires_grad_()   # torch's sparse backward is COO's

        def mm(B):
            return torch.sparse.mm(A, B)
        params = [W1, W2] + ([A] if learned else [])
    else:
        raise ValueError(impl)

    def step():
        for p in params:
            p.grad = None
        H = torch.relu(mm(X @ W1))
        out = mm(H @ W2)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        return loss
    return step


def median_time(fn, warmup: int = 3, repeats: int = 15) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(fns: dict, warmup: int = 3, repeats: int = 25) -> dict:
    """Median time of each callable, run in turns (one of each per round), so a change in
    machine load during the measurement hits every implementation alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


# --- pytest-benchmark ------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None and "pytest" in sys.modules and __name__ != "__main__":
    pytest.importorskip("pytest_benchmark")
    _GRAPHS = {}

    def _graph(name):
        if name not in _GRAPHS:
            _GRAPHS[name] = load_graph(name)
        return _GRAPHS[name]

    @pytest.mark.parametrize("variant", ["fixed", "learned"])
    @pytest.mark.parametrize("impl", ["scorch", "torch_csr"])
    @pytest.mark.parametrize("graph", GRAPHS)
    def test_gcn_step(benchmark, graph, impl, variant):
        saved = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            try:
                g = _graph(graph)
            except FileNotFoundError as e:
                pytest.skip(str(e))
            step = make_step(impl, variant, g)
            step()
            benchmark.group = f"gcn step {graph} {variant} T{THREADS}"
            benchmark.extra_info.update({"graph": graph, "impl": impl, "variant": variant, "K": K})
            benchmark(step)
        finally:
            torch.set_num_threads(saved)


def main() -> None:
    torch.set_num_threads(THREADS)
    print(f"GCN training step (forward + backward), K={K}, hidden={HIDDEN}, classes={CLASSES}, "
          f"float32, {THREADS} threads; median of 25 interleaved rounds after 3 warm-up steps")
    for name in GRAPHS:
        g = load_graph(name)
        print(f"{name}: n={g[0].shape[0]}, nnz={g[0].nnz} (with self loops)")
        for variant in ("fixed", "learned"):
            steps = {impl: make_step(impl, variant, g) for impl in ("scorch", "torch_csr")}
            losses = {impl: float(step().detach()) for impl, step in steps.items()}
            assert abs(losses["scorch"] - losses["torch_csr"]) < 1e-4 * abs(losses["torch_csr"]) + 1e-5
            t = interleaved_medians(steps)
            print(f"  {variant:8s} scorch {t['scorch'] * 1e3:8.2f} ms   torch.sparse "
                  f"{t['torch_csr'] * 1e3:8.2f} ms   torch/scorch = {t['torch_csr'] / t['scorch']:.2f}x")


if __name__ == "__main__":
    main()
