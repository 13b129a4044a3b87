"""The MoE layer's three generated kernels alone, against the dense-gate einsum, interleaved in
one process: the forward ``einsum("bd,ndh,bn->bh", x, E, G)`` (G: a top-k CSR gate), the
expert gradient ``bh,bd,bn->ndh`` (the gate read expert-major, as autograd passes it) and the
gate gradient ``bn,bh,bd,ndh->bn`` (on the gate's pattern); the peer: the dense-gate forward
and its forward + backward (expert and gate gradients) through torch autograd.

    python benchmarks/moe_kernels.py                       # 1 and 2 threads, hidden 512
    python benchmarks/moe_kernels.py --hidden 128 --threads 1 --reps 9
    python benchmarks/moe_kernels.py --plans               # also print the three plans
    python benchmarks/moe_kernels.py --tree /path/to/other/checkout   # that tree's scorch

Times are medians in ms; ``cpu`` is this process's CPU time (steadier than wall time on a
loaded machine, meaningful at 1 thread), ``wall`` the elapsed time. The ratios divide the
dense peer by scorch: inference = dense forward / forward kernel, training = dense forward +
backward / the sum of the three kernels.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

# a source checkout, not installed: this one, or the one after --tree (before/after runs)
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv[:-1] else Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_TREE))

import torch  # noqa: E402

import scorch  # noqa: E402

FORWARD, EXPERT_GRAD, GATE_GRAD = "bd,ndh,bn->bh", "bh,bd,bn->ndh", "bn,bh,bd,ndh->bn"


def cases(batch: int, inputs: int, hidden: int, experts: int, k: int) -> Dict[str, Callable]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, inputs, generator=g)
    E = torch.rand(experts, inputs, hidden, generator=g) / inputs ** 0.5
    dy = torch.rand(batch, hidden, generator=g)
    chosen = torch.rand(batch, experts, generator=g).topk(k, dim=1).indices
    dense = torch.zeros(batch, experts).scatter(1, chosen, torch.rand(batch, k, generator=g))
    csr = scorch.sparse_tensor(dense, format="csr")
    csc = scorch.sparse_tensor(dense, format="csc")
    Eg, Gg = E.clone().requires_grad_(), dense.clone().requires_grad_()

    def dense_train():
        Eg.grad = Gg.grad = None
        torch.einsum(FORWARD, x, Eg, Gg).backward(dy)

    return {"forward": lambda: scorch.einsum(FORWARD, x, E, csr),
            "expert_grad": lambda: scorch.einsum(EXPERT_GRAD, dy, x, csc, out_format="ddd"),
            "gate_grad": lambda: scorch.einsum(GATE_GRAD, csr, dy, x, E),
            "dense_forward": lambda: torch.einsum(FORWARD, x, E, dense),
            "dense_train": dense_train,
            "_plans": lambda: [scorch.explain(FORWARD, x, E, csr),
                               scorch.explain(EXPERT_GRAD, dy, x, csc, out_format="ddd"),
                               scorch.explain(GATE_GRAD, csr, dy, x, E)]}


def measure(fns: Dict[str, Callable], reps: int) -> Dict[str, Dict[str, float]]:
    for f in fns.values():          # compile, warm up
        f()
    cpu: Dict[str, List[float]] = {n: [] for n in fns}
    wall: Dict[str, List[float]] = {n: [] for n in fns}
    for _ in range(reps):
        for n, f in fns.items():
            c, w = time.process_time(), time.perf_counter()
            f()
            cpu[n].append(time.process_time() - c)
            wall[n].append(time.perf_counter() - w)

    def med(v):
        return sorted(v)[len(v) // 2] * 1e3
    return {"cpu": {n: med(v) for n, v in cpu.items()}, "wall": {n: med(v) for n, v in wall.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--inputs", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--tree", default=None, help="time the scorch of this source checkout")
    args = ap.parse_args()
    fns = cases(args.batch, args.inputs, args.hidden, args.experts, args.top_k)
    plans = fns.pop("_plans")
    if args.plans:
        for p in plans():
            print(p, "\n")
    print(f"scorch from {Path(scorch.__file__).parent}")
    print(f"MoE kernels: {args.batch} inputs x {args.inputs} -> {args.hidden}, {args.experts} experts, "
          f"top-{args.top_k} (ms, median of {args.reps}, interleaved)")
    for t in args.threads:
        torch.set_num_threads(t)
        r = measure(fns, args.reps)
        for clock in ("cpu", "wall") if t == 1 else ("wall",):
            m = r[clock]
            kernels = m["forward"] + m["expert_grad"] + m["gate_grad"]
            print(f"  {t} thr {clock:4}: forward {m['forward']:.1f}, expert_grad {m['expert_grad']:.1f}, "
                  f"gate_grad {m['gate_grad']:.1f} | dense forward {m['dense_forward']:.1f}, "
                  f"dense forward+backward {m['dense_train']:.1f} | inference "
                  f"{m['dense_forward'] / m['forward']:.2f}x, training {m['dense_train'] / kernels:.2f}x")


if __name__ == "__main__":
    main()
