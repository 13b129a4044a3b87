"""Where the sparse autoencoder's training step spends its time, scorch (CSR batch, CSR
weight: the paper's form) next to torch.sparse (CSR weight, dense batch), phase by phase,
and the encoder's kernels on their own. Interleaved, median (and 10th percentile) of CPU
time per call, so machine load from other processes weighs less than in wall time.

    python benchmarks/profile_sae.py                  # MNIST, 1 thread, 300 steps
    python benchmarks/profile_sae.py --dataset fashion-mnist --threads 2 --steps 100

Phases of a step: the batch to CSR (scorch only; the paper counts it), the encoder's forward
(``F.linear``), the decoder's forward with the loss, the backward. Kernels: the encoder's
forward and its weight gradient (an SDDMM on W's pattern) in the column form F.linear runs
for this batch (``sparse_linear._ColumnBatchLinear``: the CSR batch expanded into ``x^T``,
``W @ x^T``, the gradient from ``g^T`` and ``x^T``) and in the kept-sparse form (X CSR
through the input-major weight, the gradient reading X as CSC), the dense batch's
conversion to CSR (against torch's ``to_sparse_csr``), and torch's counterparts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import scorch  # noqa: E402
from scorch.conversion import to_dense  # noqa: E402
from scorch.formats import Format  # noqa: E402
from scorch.gradients import pattern  # noqa: E402


def summary(times) -> str:
    v = sorted(times)
    return f"median {statistics.median(v) * 1e6:7.0f} us   p10 {v[len(v) // 10] * 1e6:7.0f} us"


def phases(xs, model, steps: int) -> dict:
    """CPU time per phase of a training step, scorch and torch.sparse interleaved."""
    w = model.encoder.weight.detach().to_torch().requires_grad_()
    b = model.encoder.bias.detach().clone().requires_grad_()
    dec = torch.nn.Linear(256, 784)
    dec.load_state_dict(model.decoder.state_dict())
    clock, out = time.process_time, {}

    def lap(name, t0):
        t = clock()
        out.setdefault(name, []).append(t - t0)
        return t
    for step in range(steps + 10):
        x = xs[step % len(xs)]
        for p in [*model.parameters(), w, b, *dec.parameters()]:
            p.grad = None
        t = clock()
        xs_csr = scorch.sparse_tensor(x, format="csr")
        t = lap("scorch: batch to CSR", t)
        h = scorch.nn.functional.linear(xs_csr, model.encoder.weight, model.encoder.bias)
        t = lap("scorch: encoder forward", t)
        loss = F.mse_loss(torch.sigmoid(model.decoder(F.relu(h))), x)
        t = lap("scorch: decoder forward + loss", t)
        loss.backward()
        lap("scorch: backward", t)
        t = clock()
        h = torch.sparse.mm(w, x.t()).t() + b
        t = lap("torch.sparse: encoder forward", t)
        loss = F.mse_loss(torch.sigmoid(dec(F.relu(h))), x)
        t = lap("torch.sparse: decoder forward + loss", t)
        loss.backward()
        lap("torch.sparse: backward", t)
    return {k: v[10:] for k, v in out.items()}


def kernels(xs, model, calls: int) -> dict:
    """CPU time of the encoder's kernels (as F.linear runs them) and torch's counterparts."""
    W = model.encoder.weight.detach()
    csc = Format("dc", (1, 0))
    Wc = scorch.SparseTensor(pattern.reformatted(W._storage, W._storage.format.transposed_copy((1, 0))))
    ones = scorch.SparseTensor(pattern.pattern_ones(Wc._storage, torch.float32))
    ones_w = scorch.SparseTensor(pattern.pattern_ones(W._storage, torch.float32))
    X = [scorch.sparse_tensor(x, format="csr") for x in xs]
    Xc = [scorch.SparseTensor(scorch._runtime.convert.convert(x._storage, csc)) for x in X]
    g = torch.rand(xs[0].shape[0], W.shape[0])
    wt = W.to_torch()
    XT = [to_dense(x._storage.permuted((1, 0))) for x in X]
    gt = g.t().contiguous()
    fns = {
        "scorch: the CSR batch expanded into x^T (column form)":
            lambda i: to_dense(X[i]._storage.permuted((1, 0))),
        "scorch: forward kernel oj,ja->oa (W CSR, x^T dense; column form)":
            lambda i: scorch.einsum("oj,ja->oa", W, XT[i]),
        "scorch: weight gradient oj,oa,ja->oj on W's pattern (column form)":
            lambda i: scorch.einsum("oj,oa,ja->oj", ones_w, gt, XT[i]),
        "scorch: forward kernel aj,oj->ao (X CSR, W input-major; kept sparse)":
            lambda i: scorch.einsum("aj,oj->ao", X[i], Wc, out_format="dense"),
        "scorch: weight gradient oj,ao,aj->oj on W's pattern (X CSC; kept sparse)":
            lambda i: scorch.einsum("oj,ao,aj->oj", ones, g, Xc[i]),
        "scorch: the batch CSR -> CSC": lambda i: scorch._runtime.convert.convert(X[i]._storage, csc),
        "scorch: the dense batch -> CSR (scorch.sparse_tensor)": lambda i: scorch.sparse_tensor(xs[i], format="csr"),
        "torch: the dense batch -> CSR (x.to_sparse_csr())": lambda i: xs[i].to_sparse_csr(),
        "torch.sparse: W @ x^T (torch.sparse.mm)": lambda i: torch.sparse.mm(wt, xs[i].t()),
        "torch: g^T @ x (the dense product torch's W gradient masks)": lambda i: g.t() @ xs[i],
    }
    out = {k: [] for k in fns}
    for k, f in fns.items():
        f(0)
    for i in range(calls):
        for k, f in fns.items():
            t = time.process_time()
            f(i % len(xs))
            out[k].append(time.process_time() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["mnist", "fashion-mnist"], default="mnist")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    import sparse_autoencoder as sae
    torch.set_num_threads(args.threads)
    xs = sae.load_images(args.dataset, "test", limit=args.batch * 8).split(args.batch)
    model = sae.SparseAutoencoder(784, 256, 0.1, torch.Generator().manual_seed(0))
    print(f"SAE step, {args.dataset}, batch {args.batch}, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}: CPU time per call")
    ph = phases(xs, model, args.steps)
    for name, times in ph.items():
        print(f"  {name:42s} {summary(times)}")
    total = {side: sum(statistics.median(v) for k, v in ph.items() if k.startswith(side))
             for side in ("scorch", "torch.sparse")}
    print(f"  sum of medians: scorch {total['scorch'] * 1e6:.0f} us, torch.sparse "
          f"{total['torch.sparse'] * 1e6:.0f} us: ratio {total['torch.sparse'] / total['scorch']:.2f}x")
    for name, times in kernels(xs, model, args.steps).items():
        print(f"  {name:62s} {summary(times)}")


if __name__ == "__main__":
    main()
