"""F.linear of a CSR bag-of-words batch through a dense out x in weight: the general einsum
(the whole weight re-laid out per call) against F.linear (only the touched columns gathered
where that pays, ``sparse_ops/gathered_columns.py``), interleaved in one process,
forward and forward + backward, medians in ms.

Run: ``python benchmarks/bench_sparse_input_linear.py``."""
import time

import numpy as np
import torch
import torch.nn.functional as F

import scorch
from scorch.sparse_ops.matmul import _contract

#: (inputs V, outputs H, documents B, words a document)
CASES = [(80000, 256, 64, 150), (80000, 256, 8, 100), (20000, 128, 64, 50),
         (80000, 256, 64, 30), (20000, 128, 64, 5)]


def interleaved(fa, fb, n: int = 11):
    """Median seconds of ``fa`` and ``fb``, timed alternately after two warm-up calls each."""
    for _ in range(2):
        fa()
        fb()
    ta, tb = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        fa()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fb()
        tb.append(time.perf_counter() - t0)
    return float(np.median(ta)), float(np.median(tb))


def main() -> None:
    torch.manual_seed(0)
    for V, H, B, words in CASES:
        xd = torch.zeros(B, V)
        xd.scatter_(1, torch.randint(0, V, (B, words)), 1.0)
        X = scorch.sparse_tensor(xd, format="csr")
        W = torch.randn(H, V) * 0.01
        old, new = interleaved(lambda: _contract("bj,oj->bo", X, W), lambda: F.linear(X, W))
        Wr = W.clone().requires_grad_()

        def step(f):
            def run():
                Wr.grad = None
                f(X, Wr).sum().backward()
            return run
        old_t, new_t = interleaved(step(lambda x, w: _contract("bj,oj->bo", x, w)), step(F.linear))
        print(f"V={V} H={H} B={B} words={words}: forward {old * 1e3:.2f} -> {new * 1e3:.2f} ms, "
              f"forward + backward {old_t * 1e3:.2f} -> {new_t * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
