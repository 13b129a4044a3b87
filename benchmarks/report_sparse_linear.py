"""A sparse layer (``F.linear`` through a sparse weight) against torch.sparse and a dense
layer: forward + backward of ``y = x @ W^T + b`` with the weight's gradient (scorch: on the
weight's pattern; torch.sparse: a CSR weight through ``torch.sparse.mm(W, x.t()).t()``; dense:
``nn.Linear``), over layer sizes, weight densities and batch sizes, the batch dense or
(``--sparse-batch``) converted to CSR in every call.

    python benchmarks/report_sparse_linear.py                    # 1 thread, markdown table
    python benchmarks/report_sparse_linear.py --threads 2 --sparse-batch

Interleaved: each round times every implementation for a burst of back-to-back calls; the
median of every timed call. Ratios are peer time / scorch time (> 1: scorch faster).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import scorch  # noqa: E402

LAYERS = [(784, 256), (1024, 1024), (4096, 4096)]
DENSITIES = [0.01, 0.1]
BATCHES = [32, 128, 512]


def implementations(inputs: int, outputs: int, density: float, batch: int, sparse_batch: bool):
    g = torch.Generator().manual_seed(0)
    wd = torch.randn(outputs, inputs, generator=g) * (torch.rand(outputs, inputs, generator=g) < density)
    x = torch.rand(batch, inputs, generator=g) * (torch.rand(batch, inputs, generator=g) < 0.2)
    grad = torch.rand(batch, outputs, generator=g)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.zeros(outputs, requires_grad=True)
    wt = wd.to_sparse_csr().requires_grad_()
    bt = torch.zeros(outputs, requires_grad=True)
    dense = torch.nn.Linear(inputs, outputs)

    def ours():
        W.grad = b.grad = None
        inp = scorch.sparse_tensor(x, format="csr") if sparse_batch else x
        F.linear(inp, W, b).backward(grad)

    def torch_sparse():
        wt.grad = bt.grad = None
        (torch.sparse.mm(wt, x.t()).t() + bt).backward(grad)

    def torch_dense():
        dense.weight.grad = dense.bias.grad = None
        dense(x).backward(grad)
    return {"scorch": ours, "torch.sparse CSR": torch_sparse, "dense nn.Linear": torch_dense}


def time_all(fns, rounds: int, burst: float) -> dict:
    for f in fns.values():
        f()
        f()
    times = {k: [] for k in fns}
    for r in range(rounds):
        names = list(fns)
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                fns[name]()
                t1 = time.perf_counter()
                times[name].append(t1 - t0)
                if t1 - start >= burst:
                    break
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--burst-ms", type=float, default=20.0)
    parser.add_argument("--sparse-batch", action="store_true", help="the batch converted to CSR in every call")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"F.linear fwd + bwd, {args.threads} thread(s), batch {'CSR (converted per call)' if args.sparse_batch else 'dense'} "
          f"at 20 % non-zero, float32, median ms\n")
    print("| in -> out | weight stored | batch | scorch | torch.sparse CSR | dense nn.Linear | vs torch.sparse | vs dense |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for inputs, outputs in LAYERS:
        for density in DENSITIES:
            for batch in BATCHES:
                ms = time_all(implementations(inputs, outputs, density, batch, args.sparse_batch),
                              args.rounds, args.burst_ms * 1e-3)
                s = ms["scorch"]
                print(f"| {inputs} -> {outputs} | {density:.0%} | {batch} | {s:.3f} | {ms['torch.sparse CSR']:.3f} | "
                      f"{ms['dense nn.Linear']:.3f} | {ms['torch.sparse CSR'] / s:.2f}x | {ms['dense nn.Linear'] / s:.2f}x |",
                      flush=True)


if __name__ == "__main__":
    main()
