"""Report kernel build/cache timings for scorch.tensor_compiler.build.

    python benchmarks/report_compile.py [--rounds 7]

Measures, for a realistic CSR SpMM kernel (raw pointers, prange dynamic, int32 + int64
index variants), each cold round using a fresh SCORCH_CACHE_DIR and a never-seen source
(a unique comment changes the key):

* cold compile in a fresh process with an empty cache dir (torch imported, as for a
  user): includes Cython's one-time start-up (lexicon + builtin tables) and runs while
  the precompiled header is built in the background: the first kernel a user ever sees;
* cold compile of a never-seen kernel in a fresh process, cache dir already holding
  the precompiled header (every later session);
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
    import json, resource, sys, time
    import scorch.tensor_compiler.build as b
    src = open(sys.argv[1]).read()
    def cpu():
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    c0, t0 = cpu(), time.perf_counter()
    b.load_kernel(src, "spmm")
    dt, dc = time.perf_counter() - t0, cpu() - c0
    print(json.dumps({"seconds": dt, "cpu_seconds": dc, **b.cache_info()}))
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


def _wait_for_pch(cache: str, timeout: float = 60.0) -> None:
    """The seeding child exits before its background PCH build does; wait for the file
    (none is built where the install's, ``scorch/_prebuilt/pch``, serves every cache dir)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (list(Path(cache).glob("kernels-v*/pch/*.gch"))
                or list((REPO / "scorch" / "_prebuilt" / "pch").glob("*.gch"))):
            return
        time.sleep(0.05)
    raise RuntimeError("precompiled header was not built")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    n = max(args.rounds, 5)

    import scorch.tensor_compiler.build as b

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        # 1. cold compile in a fresh process
        fresh, fresh_cpu = [], []
        for i in range(n):
            r = _child(_unique("fresh"), os.path.join(tmp, f"fresh{i}"))
            assert r["misses"] == 1, r
            fresh.append(r["seconds"])
            fresh_cpu.append(r["cpu_seconds"])
        # 1b. never-seen kernel, fresh process, cache dir that already has the PCH
        seeded = os.path.join(tmp, "seeded")
        _child(_unique("seed"), seeded)
        _wait_for_pch(seeded)
        fresh_seeded, seeded_cpu = [], []
        for i in range(n):
            r = _child(_unique("seeded"), seeded)
            assert r["misses"] == 1, r
            fresh_seeded.append(r["seconds"])
            seeded_cpu.append(r["cpu_seconds"])
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
        os.environ["SCORCH_CACHE_DIR"] = seeded
        b.load_kernel(_unique("warmup"), "spmm")          # pay Cython start-up here
        for v in stages.values():
            v.clear()
        warm_interp, rest = [], []
        for i in range(n):
            s = _unique("inproc")
            t = time.perf_counter()
            mod = b.load_kernel(s, "spmm")
            warm_interp.append(time.perf_counter() - t)
            rest.append(warm_interp[-1] - stages["_cythonize"][-1] - stages["_cc"][-1])
        for name, fn in originals.items():
            setattr(b, name, fn)

        # 4. warm lookup
        reps = 200_000
        lookup = min(timeit.repeat(lambda: b.load_kernel(s, "spmm"), number=reps, repeat=5))
        assert b.load_kernel(s, "spmm") is mod

    med = statistics.median
    print(f"CPU: {os.cpu_count()} cores; Python {sys.version.split()[0]}; rounds={n}; "
          f"load average before/after {load0[0]:.1f}/{os.getloadavg()[0]:.1f} "
          "(wall times on a shared machine are noisy; CPU seconds are not)")
    print(f"cold compile, fresh process, empty cache dir:        median {med(fresh):.3f} s"
          f"  [min {min(fresh):.3f}, max {max(fresh):.3f}]  cpu {med(fresh_cpu):.3f} s")
    print(f"cold compile, fresh process, cache dir with PCH:     median {med(fresh_seeded):.3f} s"
          f"  [min {min(fresh_seeded):.3f}, max {max(fresh_seeded):.3f}]  cpu {med(seeded_cpu):.3f} s")
    print(f"cold compile, warm interpreter:                      median {med(warm_interp):.3f} s"
          f"  [min {min(warm_interp):.3f}, max {max(warm_interp):.3f}]")
    cy, cc = med(stages["_cythonize"]), med(stages["_cc"])
    print(f"    cythonize {cy:.3f} s | gcc compile+link {cc:.3f} s | "
          f"rest (hash, publish, dlopen) {med(rest):.3f} s")
    print(f"    => Cython start-up in a fresh process ~{med(fresh_seeded) - med(warm_interp):.3f} s")
    print(f"disk-cache hit, fresh process:                       median {med(disk) * 1e3:.1f} ms")
    print(f"warm load_kernel (in-memory):                        {lookup / reps * 1e9:.0f} ns/call")


if __name__ == "__main__":
    main()
