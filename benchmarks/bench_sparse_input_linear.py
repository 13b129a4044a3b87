"""F.linear of a CSR bag-of-words batch through a dense out x in weight: the whole weight
re-laid out per call (the einsum with its narrowed gather switched off) against the
einsum ``"bj,oj->bo"`` (the re-layout narrowed to the touched columns,
``tensor_compiler/narrowed_gather.py``) and F.linear (the same gather with a gradient that
scatters back in the weight's layout, ``sparse_ops/gathered_columns.py``), interleaved in
one process, forward and forward + backward, medians in ms.

Run: ``python benchmarks/bench_sparse_input_linear.py``."""
import time

import numpy as np
import torch
import torch.nn.functional as F

import scorch
from scorch.sparse_ops.matmul import _contract
from scorch.tensor_compiler.narrowed_gather import NarrowedGather

#: (inputs V, outputs H, documents B, words a document)
CASES = [(80000, 256, 64, 150), (80000, 256, 8, 100), (20000, 128, 64, 50),
         (80000, 256, 64, 30), (20000, 128, 64, 5)]


def interleaved(*fns, n: int = 11):
    """Median seconds of each of ``fns``, timed in turn after two warm-up calls each."""
    for _ in range(2):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(n):
        for f, t in zip(fns, times):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def _whole(x, w):
    """The einsum with the narrowed gather off: the whole weight re-laid out."""
    real = NarrowedGather.columns
    NarrowedGather.columns = lambda self, ops: None
    try:
        return _contract("bj,oj->bo", x, w)
    finally:
        NarrowedGather.columns = real


def main() -> None:
    torch.manual_seed(0)
    for V, H, B, words in CASES:
        xd = torch.zeros(B, V)
        xd.scatter_(1, torch.randint(0, V, (B, words)), 1.0)
        X = scorch.sparse_tensor(xd, format="csr")
        W = torch.randn(H, V) * 0.01
        whole, narrow, linear = interleaved(lambda: _whole(X, W),
                                            lambda: _contract("bj,oj->bo", X, W),
                                            lambda: F.linear(X, W))
        Wr = W.clone().requires_grad_()

        def step(f):
            def run():
                Wr.grad = None
                f(X, Wr).sum().backward()
            return run
        times = interleaved(step(_whole), step(lambda x, w: _contract("bj,oj->bo", x, w)),
                            step(F.linear))
        print(f"V={V} H={H} B={B} words={words}: forward whole / einsum / F.linear "
              f"{whole * 1e3:.2f} / {narrow * 1e3:.2f} / {linear * 1e3:.2f} ms, forward + backward "
              + " / ".join(f"{t * 1e3:.2f}" for t in times) + " ms")


if __name__ == "__main__":
    main()
