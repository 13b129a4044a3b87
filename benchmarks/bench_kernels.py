"""pytest-benchmark: standard sparse kernels, scorch next to torch.sparse (CSR, COO) and scipy.

    python -m pytest benchmarks/bench_kernels.py                      # quick: 3 small matrices
    SCORCH_BENCH_FULL=1 python -m pytest benchmarks/bench_kernels.py  # every matrix
    python -m pytest benchmarks/bench_kernels.py -k "spmm and 4elt" --benchmark-columns=median

Not part of ``pytest tests``. Each test is one (case, implementation, threads); the benchmark
group is "<kernel> <matrix> T<threads>", so the peers of a case sit side by side in the
output. Every implementation's result is checked against a float64 reference before it is
timed. Peers torch has no kernel for, and scorch einsums the compiler cannot run yet, are
skipped with the reason. Environment: SCORCH_BENCH_THREADS="1 2" (default), SCORCH_BENCH_FULL.
For the one-process table with ratios, targets and bandwidth, use report_kernels.py.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")

import kernels as K  # noqa: E402

pytest.importorskip("pytest_benchmark")
pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]

THREADS = [int(t) for t in os.environ.get("SCORCH_BENCH_THREADS", "1 2").split()]
CASES = K.cases()  # quick matrices unless SCORCH_BENCH_FULL=1
# case outermost so the per-case operand/reference caches are reused by its peers
PARAMS = [pytest.param(c, impl, t, id=f"{c.id}-{impl}-T{t}")
          for c in CASES for t in THREADS for impl in K.IMPLS]


@pytest.fixture(autouse=True)
def _restore_threads():
    import torch
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("case, impl, threads", PARAMS)
def test_kernel(benchmark, case: K.Case, impl: str, threads: int):
    benchmark.group = f"{case.label} {case.matrix} T{threads}"
    benchmark.extra_info.update({"kernel": case.kernel, "K": case.k, "matrix": case.matrix,
                                 "impl": impl, "threads": threads})
    K.set_threads(threads)
    try:
        im = K.make_impl(case, impl)
    except K.Unavailable as e:
        pytest.skip(f"{impl}: {e}")
    except Exception as e:  # noqa: BLE001  (scorch compiler not ready / einsum unsupported)
        if impl == "scorch":
            pytest.skip(f"scorch cannot build this case: {type(e).__name__}: {e}")
        raise
    try:
        first = im.fn()  # also the first warm-up (scorch compiles here)
    except Exception as e:  # noqa: BLE001
        if impl == "scorch":
            pytest.skip(f"scorch einsum failed: {type(e).__name__}: {e}")
        raise
    ok, msg = K.check(case, im.to_host(first))
    del first
    assert ok, f"{impl} gives a wrong result for {case.id}: {msg}"
    benchmark.extra_info["api"] = im.api
    benchmark.extra_info["bytes"] = K.bytes_moved(case)

    # size the rounds from one warm call: >= 5 rounds, ~0.3 s per test, 2 warm-up rounds
    import time
    t0 = time.perf_counter()
    im.fn()
    dt = max(time.perf_counter() - t0, 1e-7)
    rounds = int(min(200, max(5, 0.3 / dt))) if dt < 1.0 else 3
    benchmark.pedantic(im.fn, rounds=rounds, iterations=1, warmup_rounds=2 if dt < 1.0 else 0)
