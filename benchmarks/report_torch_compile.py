"""scorch under torch.compile (issue 16, point 4): four figures, each taken interleaved in
one process (medians of rounds, so load from other processes falls on all sides alike).

    SCORCH_DATA_DIR=/work/shared/data python benchmarks/report_torch_compile.py
        [--steps 5] [--rounds 5] [--before 8ac8988] [--threads 2]
        [--parts eager_ab,small_op,gcn,control]

1. A GCN training step (examples/gcn.py's model, Cora scale, Adam) eager beside the model
   compiled by ``torch.compile`` (inductor) with each of ``VARIANTS``' options, as the
   example trains (dropout 0.5) and without dropout (the sparse products alone).
2. The per-call time of a compiled ``A @ X`` on a 4 x 4 CSR operand beside the eager call
   (and a compiled dense op for scale: what any compiled call costs).
3. A dense control with no scorch tensor in it: the hidden layer's relu, dropout, product and
   backward, eager and compiled with the same options (what torch's own compile does here).
4. The eager operators' speed after this change against the tree ``--before`` (its
   ``scorch/tensor_type.py`` operators swapped in and out of ``SparseTensor`` in turn): the
   compile support must not slow the eager fast paths.
"""
from __future__ import annotations

import argparse
import itertools
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


#: ``torch.compile(options=...)`` compared for the GCN step and the dense control, each a
#: compiled copy of its own in the one process: inductor as it comes; dropout's mask drawn
#: by torch's eager kernel (``fallback_random``); CPU kernels without SIMD (``cpp.simdlen``
#: 1: torch 2.13's vectorized store of a bool mask, the one the partitioner saves for
#: relu's backward and the dropout mask, runs a scalar loop over 64 lanes per 16 values);
#: both (the setting docs/torch_compile.md recommends for a CPU model with dropout)
VARIANTS = {"default": {}, "fallback_random": {"fallback_random": True},
            "cpp.simdlen=1": {"cpp.simdlen": 1},
            "both": {"fallback_random": True, "cpp.simdlen": 1}}


def _interleaved_ms(step, fns: dict, steps: int, rounds: int) -> dict:
    """Median ms of one ``step(fn)`` for each of ``fns`` (name -> callable), warmed, then
    timed one step at a time, every fn in turn in a rotating order (load from other
    processes, which changes within a second here, falls on all alike)."""
    for _ in range(3):   # warm all (kernels built, recompiles done)
        for fn in fns.values():
            step(fn)
    names = list(fns)
    times = {name: [] for name in names}
    for k in range(steps * rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:
            start = time.perf_counter()
            step(fns[name])
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _print_variants(ms: dict) -> None:
    eager = ms.pop("eager")
    print(f"  eager {eager:.2f} ms")
    for name, m in ms.items():
        print(f"  compiled, {name:16s} {m:6.2f} ms   eager/compiled {eager / m:.2f}x")


def _compiled_variants(fn) -> dict:
    return {"eager": fn, **{name: torch.compile(fn, options=dict(options))
                            for name, options in VARIANTS.items()}}


def gcn_step(steps: int, rounds: int, dropout: float = 0.5) -> None:
    """examples/gcn.py's training step (Adam), eager and compiled with each of VARIANTS."""
    import gcn
    torch._dynamo.reset()
    graph = gcn.load_graph("cora", data_dir=os.environ.get("SCORCH_DATA_DIR"))
    torch.manual_seed(0)
    model = gcn.GCN(graph.x.shape[1], 128, int(graph.y.max()) + 1, dropout)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def step(m):
        opt.zero_grad()
        loss = F.cross_entropy(m(graph.a_hat, graph.x)[graph.train], graph.y[graph.train])
        loss.backward()
        opt.step()

    fns = _compiled_variants(model)
    start = time.perf_counter()
    step(fns["default"])
    first = time.perf_counter() - start
    ms = _interleaved_ms(step, fns, steps, rounds)
    explained = torch._dynamo.explain(model)(graph.a_hat, graph.x)
    print(f"GCN training step, Cora scale ({graph.a_hat.shape[0]} nodes, {graph.a_hat.nnz} "
          f"entries in A_hat, features {tuple(graph.x.shape)} sparse), dropout {dropout} "
          f"(first compiled step, with compilation: {first:.1f} s; graphs "
          f"{explained.graph_count}, graph breaks {explained.graph_break_count}):")
    _print_variants(ms)


def dense_dropout_control(steps: int, rounds: int) -> None:
    """The GCN's dense hidden-layer work alone (5300 x 128: relu, dropout 0.5, @ W, backward),
    eager and compiled with each of VARIANTS: torch's own cost of compiling it, no scorch
    tensor involved."""
    torch._dynamo.reset()
    h0, w = torch.randn(5300, 128), torch.randn(128, 7, requires_grad=True)

    def f(h, w):
        return (F.dropout(F.relu(h), 0.5, True) @ w).sum()

    def step(fn):
        fn(h0.clone().requires_grad_(), w).backward()
    ms = _interleaved_ms(step, _compiled_variants(f), steps, rounds)
    print("dense control (no scorch tensor): relu, dropout 0.5, @ W, backward on 5300 x 128:")
    _print_variants(ms)

    def mask(h):   # what the partitioner saves for relu's backward, and dropout's mask
        return h > 0
    ms = _interleaved_ms(lambda fn: fn(h0), _compiled_variants(mask), steps, rounds)
    print("the bool mask h > 0 alone, 5300 x 128:")
    _print_variants(ms)


def small_op(rounds: int) -> None:
    """A compiled ``A @ X`` on a 4 x 4 operand, with what its call is made of beside it: the
    eager call, the operator called directly (torch's custom-operator dispatch around
    scorch's kernel call), and a compiled dense op (Dynamo's guards and the graph call)."""
    from scorch import library_ops
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
    metas, arrays = library_ops.flatten_operands([A, X])
    key = library_ops._key("ij,jk->ik", None, metas, [A, X])
    operator = torch.ops.scorch.einsum.default
    fresh = itertools.cycle([torch.randn(4, 4) for _ in range(16)])   # a new X every call
    cases = {"eager": (lambda: spmm(A, X), 2000),
             "operator": (lambda: operator(key, arrays), 1000),
             "compiled": (lambda: compiled(A, X), 500),
             "compiled, new X": (lambda: compiled(A, next(fresh)), 500),
             "dense": (lambda: compiled_dense(X), 500)}
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, (fn, number) in cases.items():
            times[k].append(_best_us(fn, number))
    us = {k: statistics.median(t) for k, t in times.items()}
    print("A @ X, 4 x 4 CSR times 4 x 4 dense, per call:")
    print(f"  eager {us['eager']:.1f} us   compiled {us['compiled']:.1f} us (a new X every "
          f"call: {us['compiled, new X']:.1f} us)   (the operator "
          f"torch.ops.scorch.einsum called directly: {us['operator']:.1f} us; a compiled "
          f"dense x + 1: {us['dense']:.1f} us)")


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
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="8ac8988", help="the tree to compare eager speed with")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", default="eager_ab,small_op,gcn,control",
                        help="which figures, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(args.threads)
    print(f"(threads {args.threads}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')})")
    if "eager_ab" in parts:
        eager_ab(args.before, args.rounds)
    if "small_op" in parts:
        small_op(args.rounds)
    if "gcn" in parts:
        gcn_step(args.steps, args.rounds)                  # examples/gcn.py as it trains
        gcn_step(args.steps, args.rounds, dropout=0.0)     # the sparse products alone
    if "control" in parts:
        dense_dropout_control(args.steps, args.rounds)     # torch's compiled dropout alone


if __name__ == "__main__":
    main()
