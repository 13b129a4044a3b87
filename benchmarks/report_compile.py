"""Report kernel build/cache timings for scorch.compiler.build.

    python benchmarks/report_compile.py [--rounds 7]

Measures, for a realistic CSR SpMM kernel (raw pointers, prange dynamic, int32 + int64
index variants), each cold round using a fresh SCORCH_CACHE_DIR and a never-seen source
(a unique comment changes the key):

* cold compile in a fresh process (torch imported, as for a user): includes Cython's
  one-time start-up (lexicon + builtin tables), the number users see first;
* cold compile in a warm interpreter (second and later kernels of a process), split
  into cythonize / gcc / rest;
* load from the disk cache in a fresh process;
* warm ``load_kernel`` (in-memory lookup).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPMM = textwrap.dedent('''
    from cython.parallel import prange
    from libc.stdint cimport int32_t, int64_t

    cdef void _spmm_i32(const int32_t* indptr, const int32_t* indices, const float* data,
                        const float* B, float* C, Py_ssize_t nrows, Py_ssize_t ncols,
                        int nthreads) noexcept nogil:
        cdef Py_ssize_t i, jj, k
        cdef int32_t j
        cdef float a
        for i in prange(nrows, nogil=True, schedule='dynamic', num_threads=nthreads):
            for jj in range(indptr[i], indptr[i + 1]):
                j = indices[jj]
                a = data[jj]
                for k in range(ncols):
                    C[i * ncols + k] += a * B[j * ncols + k]

    cdef void _spmm_i64(const int64_t* indptr, const int64_t* indices, const float* data,
                        const float* B, float* C, Py_ssize_t nrows, Py_ssize_t ncols,
                        int nthreads) noexcept nogil:
        cdef Py_ssize_t i, jj, k
        cdef int64_t j
        cdef float a
        for i in prange(nrows, nogil=True, schedule='dynamic', num_threads=nthreads):
            for jj in range(indptr[i], indptr[i + 1]):
                j = indices[jj]
                a = data[jj]
                for k in range(ncols):
                    C[i * ncols + k] += a * B[j * ncols + k]

    def spmm(size_t indptr, size_t indices, size_t data, size_t B, size_t C,
             Py_ssize_t nrows, Py_ssize_t ncols, bint idx64, int nthreads=1):
        with nogil:
            if idx64:
                _spmm_i64(<const int64_t*>indptr, <const int64_t*>indices,
                          <const float*>data, <const float*>B, <float*>C, nrows, ncols,
                          nthreads)
            else:
                _spmm_i32(<const int32_t*>indptr, <const int32_t*>indices,
                          <const float*>data, <const float*>B, <float*>C, nrows, ncols,
                          nthreads)
''')

CHILD = textwrap.dedent('''
    import json, sys, time
    import scorch.compiler.build as b
    src = open(sys.argv[1]).read()
    t0 = time.perf_counter()
    b.load_kernel(src, "spmm")
    dt = time.perf_counter() - t0
    print(json.dumps({"seconds": dt, **b.cache_info()}))
''')


def _unique(tag: str) -> str:
    return f"# {tag} {time.time_ns()} {os.getpid()}\n" + SPMM


def _child(src: str, cache: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".pyx", delete=False) as f:
        f.write(src)
    try:
        env = dict(os.environ, SCORCH_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", CHILD, f.name], env=env, check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)
    finally:
        os.unlink(f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n = max(args.rounds, 5)

    import scorch.compiler.build as b

    with tempfile.TemporaryDirectory() as tmp:
        # 1. cold compile in a fresh process
        fresh = []
        for i in range(n):
            r = _child(_unique("fresh"), os.path.join(tmp, f"fresh{i}"))
            assert r["misses"] == 1, r
            fresh.append(r["seconds"])
        # 2. disk hit in a fresh process (reuse the last cache dir and source)
        src = _unique("disk")
        cache = os.path.join(tmp, "disk")
        _child(src, cache)
        disk = []
        for _ in range(n):
            r = _child(src, cache)
            assert r["disk_hits"] == 1 and r["misses"] == 0, r
            disk.append(r["seconds"])

        # 3. cold compile in this (warm) interpreter, with a stage breakdown
        stages: dict[str, list[float]] = {"_cythonize": [], "_cc": []}
        originals = {name: getattr(b, name) for name in stages}

        def timed(name):
            fn = originals[name]

            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    stages[name].append(time.perf_counter() - t)
            return wrapper

        for name in stages:
            setattr(b, name, timed(name))
        os.environ["SCORCH_CACHE_DIR"] = os.path.join(tmp, "warmup")
        b.load_kernel(_unique("warmup"), "spmm")          # pay Cython start-up here
        for v in stages.values():
            v.clear()
        warm_interp = []
        for i in range(n):
            os.environ["SCORCH_CACHE_DIR"] = os.path.join(tmp, f"inproc{i}")
            s = _unique("inproc")
            t = time.perf_counter()
            mod = b.load_kernel(s, "spmm")
            warm_interp.append(time.perf_counter() - t)
        for name, fn in originals.items():
            setattr(b, name, fn)

        # 4. warm lookup
        reps = 200_000
        lookup = min(timeit.repeat(lambda: b.load_kernel(s, "spmm"), number=reps, repeat=5))
        assert b.load_kernel(s, "spmm") is mod

    med = statistics.median
    print(f"CPU: {os.cpu_count()} cores; Python {sys.version.split()[0]}; rounds={n}")
    print(f"cold compile, fresh process (incl. Cython start-up): median {med(fresh):.3f} s"
          f"  [min {min(fresh):.3f}, max {max(fresh):.3f}]")
    print(f"cold compile, warm interpreter:                      median {med(warm_interp):.3f} s"
          f"  [min {min(warm_interp):.3f}, max {max(warm_interp):.3f}]")
    cy, cc = med(stages["_cythonize"]), med(stages["_cc"])
    print(f"    cythonize {cy:.3f} s | gcc compile+link {cc:.3f} s | "
          f"rest (hash, publish, dlopen) {med(warm_interp) - cy - cc:.3f} s")
    print(f"    => Cython start-up in a fresh process ~{med(fresh) - med(warm_interp):.3f} s")
    print(f"disk-cache hit, fresh process:                       median {med(disk) * 1e3:.1f} ms")
    print(f"warm load_kernel (in-memory):                        {lookup / reps * 1e9:.0f} ns/call")


if __name__ == "__main__":
    main()
