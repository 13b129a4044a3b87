"""scorch under torch.compile (issue 16, point 4): three figures, each taken interleaved in
one process (medians of rounds, so load from other processes falls on both sides alike).

    SCORCH_DATA_DIR=/work/shared/data python benchmarks/report_torch_compile.py
        [--steps 10] [--rounds 5] [--before 8ac8988] [--threads 2]

1. A GCN training step (examples/gcn.py's model, Cora scale, Adam) with the model compiled
   by ``torch.compile`` (inductor) beside the eager step: as the example trains (dropout
   0.5), with inductor's ``fallback_random`` (dropout's mask drawn by torch's kernel rather
   than inductor's generated one), and without dropout (the sparse products alone).
2. The per-call time of a compiled ``A @ X`` on a 4 x 4 CSR operand beside the eager call
   (and a compiled dense op for scale: what any compiled call costs).
3. A dense control with no scorch tensor in it: the hidden layer's relu, dropout, product and
   backward, eager and compiled (what torch's own compile does with dropout on this CPU).
4. The eager operators' speed after this change against the tree ``--before`` (its
   ``scorch/tensor_type.py`` operators swapped in and out of ``SparseTensor`` in turn): the
   compile support must not slow the eager fast paths.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit
import types
import warnings
from pathlib import Path

# a loaded machine: OpenMP threads that spin after their region (the default) steal the
# cores from the next region of another runtime (torch's, inductor's, scorch's kernels)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
warnings.filterwarnings("ignore")

import scorch  # noqa: E402
import torch  # noqa: E402
from scorch import tensor_type  # noqa: E402
from scorch.nn import functional as F  # noqa: E402


def _best_us(fn, number: int, repeat: int = 3) -> float:
    """The best of ``repeat`` timings of ``number`` calls, per call (the least disturbed by
    other processes); the report takes the median of these over interleaved rounds."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _eager_and_compiled_ms(step, eager, compiled, steps: int, rounds: int):
    """Median ms per ``step(fn)`` for the eager and the compiled ``fn``, warmed, then timed
    in interleaved rounds (load from other processes falls on both alike)."""
    for _ in range(3):   # warm both (kernels built, recompiles done)
        step(compiled)
        step(eager)
    times = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for name, fn in (("eager", eager), ("compiled", compiled)):
            start = time.perf_counter()
            for _ in range(steps):
                step(fn)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    return tuple(statistics.median(times[k]) for k in ("eager", "compiled"))


def gcn_step(steps: int, rounds: int, dropout: float = 0.5, fallback_random: bool = False) -> None:
    import gcn
    import torch._inductor.config as inductor_config
    torch._dynamo.reset()
    inductor_config.fallback_random = fallback_random
    graph = gcn.load_graph("cora", data_dir=os.environ.get("SCORCH_DATA_DIR"))
    torch.manual_seed(0)
    model = gcn.GCN(graph.x.shape[1], 128, int(graph.y.max()) + 1, dropout)
    compiled = torch.compile(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step(m):
        opt.zero_grad()
        loss = F.cross_entropy(m(graph.a_hat, graph.x)[graph.train], graph.y[graph.train])
        loss.backward()
        opt.step()

    start = time.perf_counter()
    step(compiled)
    first = time.perf_counter() - start
    e, c = _eager_and_compiled_ms(step, model, compiled, steps, rounds)
    explained = torch._dynamo.explain(model)(graph.a_hat, graph.x)
    print(f"GCN training step, Cora scale ({graph.a_hat.shape[0]} nodes, {graph.a_hat.nnz} "
          f"entries in A_hat, features {tuple(graph.x.shape)} sparse), dropout {dropout}"
          f"{', inductor fallback_random' if fallback_random else ''}:")
    print(f"  eager {e:.2f} ms   compiled {c:.2f} ms   eager/compiled {e / c:.2f}x   "
          f"(first compiled step, with compilation: {first:.1f} s; graphs "
          f"{explained.graph_count}, graph breaks {explained.graph_break_count})")


def dense_dropout_control(steps: int, rounds: int) -> None:
    """The GCN's dense hidden-layer work alone (5300 x 128: relu, dropout 0.5, @ W, backward),
    eager and compiled: torch's own cost of compiling dropout, no scorch tensor involved."""
    torch._dynamo.reset()
    import torch._inductor.config as inductor_config
    inductor_config.fallback_random = False
    h0, w = torch.randn(5300, 128), torch.randn(128, 7, requires_grad=True)

    def f(h, w):
        return (F.dropout(F.relu(h), 0.5, True) @ w).sum()
    compiled = torch.compile(f)

    def step(fn):
        fn(h0.clone().requires_grad_(), w).backward()
    e, c = _eager_and_compiled_ms(step, f, compiled, steps, rounds)
    print("dense control (no scorch tensor): relu, dropout 0.5, @ W, backward on 5300 x 128:")
    print(f"  eager {e:.2f} ms   compiled {c:.2f} ms   eager/compiled {e / c:.2f}x")


def small_op(rounds: int) -> None:
    a = torch.tensor([[1., 0, 2, 0], [0, 0, 3, 0], [4, 0, 0, 5], [0, 6, 0, 0]])
    A = scorch.sparse_tensor(a, format="csr")
    X = torch.randn(4, 4)

    def spmm(A, X):
        return A @ X

    def dense(x):
        return x + 1
    compiled, compiled_dense = torch.compile(spmm), torch.compile(dense)
    torch.testing.assert_close(compiled(A, X), a @ X)
    compiled_dense(X)
    times = {"eager": [], "compiled": [], "dense": []}
    for _ in range(rounds):
        times["eager"].append(_best_us(lambda: spmm(A, X), 2000))
        times["compiled"].append(_best_us(lambda: compiled(A, X), 500))
        times["dense"].append(_best_us(lambda: compiled_dense(X), 500))
    eager_us, compiled_us, dense_us = (statistics.median(times[k])
                                       for k in ("eager", "compiled", "dense"))
    print("A @ X, 4 x 4 CSR times 4 x 4 dense, per call:")
    print(f"  eager {eager_us:.1f} us   compiled {compiled_us:.1f} us   "
          f"(a compiled dense x + 1: {dense_us:.1f} us)")


_SWAPPED = ("__torch_function__", "__torch_dispatch__", "__matmul__", "__rmatmul__", "mm",
            "sum", "__mul__", "__rmul__", "__truediv__", "__add__", "__sub__", "__neg__",
            "is_sparse")


def _operators_of(commit: str) -> dict:
    """``SparseTensor``'s operators as ``commit``'s tensor_type.py defines them, bound to
    this process's class and tables."""
    source = subprocess.run(["git", "show", f"{commit}:scorch/tensor_type.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("scorch.tensor_type")
    module.__dict__.update(__name__="scorch.tensor_type", __package__="scorch")
    exec(compile(source, "tensor_type@" + commit, "exec"), module.__dict__)
    old_class = module.__dict__["SparseTensor"]
    for shared in ("_SPMM", "_AUTOGRAD", "SparseTensor"):
        if shared in module.__dict__:
            module.__dict__[shared] = getattr(tensor_type, shared)
    return {name: vars(old_class).get(name) for name in _SWAPPED}


def eager_ab(commit: str, rounds: int) -> None:
    cls = tensor_type.SparseTensor
    after = {name: vars(cls)[name] for name in _SWAPPED if name in vars(cls)}
    before = _operators_of(commit)
    a = torch.tensor([[1., 0, 2, 0], [0, 0, 3, 0], [4, 0, 0, 5], [0, 6, 0, 0]])
    A = scorch.sparse_tensor(a, format="csr")
    B = A * 2
    X = torch.randn(4, 4)
    cases = {"A @ X": lambda: A @ X, "torch.mm(A, X)": lambda: torch.mm(A, X),
             "A * 2": lambda: A * 2, "A + B (one pattern)": lambda: A + B,
             "torch.relu(A)": lambda: torch.relu(A), "A.is_sparse": lambda: A.is_sparse}

    def use(ops):
        for name, value in ops.items():
            if value is not None:
                setattr(cls, name, value)
    times = {(case, side): [] for case in cases for side in ("before", "after")}
    try:
        for _ in range(rounds):
            for side, ops in (("before", before), ("after", after)):
                use(ops)
                for case, fn in cases.items():
                    times[case, side].append(_best_us(fn, 2000))
    finally:
        use(after)
    print(f"eager operators, before ({commit}) / after (this tree), per call:")
    for case in cases:
        b, a_ = (statistics.median(times[case, s]) for s in ("before", "after"))
        print(f"  {case:22s} before {b:6.2f} us   after {a_:6.2f} us   before/after {b / a_:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="8ac8988", help="the tree to compare eager speed with")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"(threads {args.threads}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')})")
    eager_ab(args.before, args.rounds)
    small_op(args.rounds)
    gcn_step(args.steps, args.rounds)                        # examples/gcn.py as it trains
    gcn_step(args.steps, args.rounds, fallback_random=True)  # dropout's mask by torch's kernel
    gcn_step(args.steps, args.rounds, dropout=0.0)           # the sparse products alone
    dense_dropout_control(args.steps, args.rounds)           # torch's compiled dropout alone


if __name__ == "__main__":
    main()
