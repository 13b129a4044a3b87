"""Standard kernels compiled at install time, so their first call pays no compile.

SpMV and SpMM (as einsums and as the ops ``@`` and ``F.linear``, which ask for other
kernels, with a sparse layer's weight gradient), SDDMM, SpGEMM and elementwise add/mul, for CSR, CSC and COO operands in
float32 and float64 (int32 indices, as scorch builds them, plus int64 CSR, as torch's own
CSR tensors arrive), are produced by running each operation once on small operands: the
kernels come out of the ordinary compiler path (nothing is written by hand) and land in a
scratch kernel cache, from which the compiled modules are copied into ``scorch/_prebuilt``.
``build.load_kernel`` looks there with the same key as the disk cache, so a kernel whose
source, flags or CPU differ is simply compiled on first use as usual.

The C warm-call module (``fastcall``, built against torch's headers) is compiled beside
them into the same folder, and the C and C++ precompiled headers into ``pch/`` in it: a
kernel compiled later (in any cache dir, e.g. the test suite's) uses them instead of
building its own (``build._pch`` looks there first). Every file goes with its checksum.

Run ``python -m scorch.tensor_compiler.prebuilt`` (setup.py does, after building the runtime).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Tuple

__all__ = ["standard_cases", "build_prebuilt"]

FORMATS = ("csr", "csc", "coo")
CASE_NAMES = ("spmv", "spmm", "mv", "mm", "linear", "linear-step", "sddmm", "spgemm", "mul", "add")


def standard_cases() -> List[Tuple[str, Callable[[], object]]]:
    """(name, thunk) per standard kernel; each thunk runs the operation once."""
    import torch

    import scorch
    from . import compute
    from .index_notation import Access, Assignment

    g = torch.Generator().manual_seed(0)
    cases = []
    add = Assignment(("i", "j"), Access(0, ("i", "j")) + Access(1, ("i", "j")))
    for dtype in (torch.float32, torch.float64):
        dense = (torch.rand(8, 8, generator=g) * (torch.rand(8, 8, generator=g) < 0.4)).to(dtype)
        x, X = torch.rand(8, dtype=dtype), torch.rand(8, 4, dtype=dtype)
        B, C = torch.rand(8, 4, dtype=dtype), torch.rand(4, 8, dtype=dtype)
        operands = [(f, scorch.sparse_tensor(dense, format=f)) for f in FORMATS]
        operands.append(("csr-int64", dense.to_sparse_csr()))  # torch's CSR: int64 indices
        for label, A in operands:
            tag = f"{label}-{str(dtype).split('.')[-1]}"
            cases += [
                (f"spmv-{tag}", lambda A=A, x=x: scorch.einsum("ij,j->i", A, x)),
                (f"spmm-{tag}", lambda A=A, X=X: scorch.einsum("ij,jk->ik", A, X)),
                # the op layer asks for a dense result where einsum infers a sparse one
                # (COO rows), and reads CSC through its transpose: other kernels
                (f"mv-{tag}", lambda A=A, x=x: A @ x),
                (f"mm-{tag}", lambda A=A, X=X: A @ X),
                (f"linear-{tag}", lambda A=A, X=X: torch.nn.functional.linear(X.t(), A)),
                # a sparse layer's training step: its weight gradient (an SDDMM on the
                # weight's pattern, ``sparse_linear._ColumnBatchLinear``) is its own kernel
                (f"linear-step-{tag}", lambda A=A, X=X: _linear_step(A, X.t())),
                (f"sddmm-{tag}", lambda A=A, B=B, C=C: scorch.einsum("ij,ik,kj->ij", A, B, C)),
                (f"spgemm-{tag}", lambda A=A: scorch.einsum("ij,jk->ik", A, A)),
                (f"mul-{tag}", lambda A=A: scorch.einsum("ij,ij->ij", A, A)),
                (f"add-{tag}", lambda A=A: compute(add, _storage_of(A), _storage_of(A))),
            ]
    return cases


def _linear_step(A, x) -> None:
    """``F.linear(x, W)`` and its backward, for a sparse weight ``W`` with ``A``'s values."""
    import torch
    import scorch
    W = scorch.sparse_tensor(A, requires_grad=True)
    torch.nn.functional.linear(x, W).sum().backward()


def _storage_of(x):
    """The Storage of a scorch SparseTensor or of a torch sparse tensor."""
    from .operands import as_operand
    return as_operand(x)


def _run_part(part: int, parts: int) -> None:
    """Worker ``part`` of ``parts``: run every ``parts``-th case, printing one progress line
    per kernel (the install is otherwise silent for a minute or more)."""
    import time
    from . import build
    build.PREBUILT_DIR = Path(os.devnull)  # compile everything afresh into the scratch cache
    cases = standard_cases()
    mine = [(n, name, thunk) for n, (name, thunk) in enumerate(cases) if n % parts == part]
    for k, (n, name, thunk) in enumerate(mine, 1):
        t0 = time.perf_counter()
        thunk()
        print(f"scorch: [worker {part + 1}/{parts}] {k}/{len(mine)} {name} "
              f"({time.perf_counter() - t0:.1f} s; {n + 1} of {len(cases)} overall)", flush=True)


def build_prebuilt(dest: Path | None = None, jobs: int = 2) -> int:
    """Compile every standard kernel into ``dest`` (default ``scorch/_prebuilt``); returns
    how many kernel modules it holds. Runs ``jobs`` worker processes (Cython compiles are
    serialised within one process)."""
    from . import build
    from .build import PREBUILT_DIR, BUILD_VERSION
    dest = Path(dest) if dest is not None else PREBUILT_DIR
    print(f"scorch: prebuilding {_case_count()} standard kernel cases in {jobs} parallel "
          f"processes, and the C warm-call module and the precompiled headers in one more; "
          f"one line per kernel:", flush=True)
    with tempfile.TemporaryDirectory(prefix="scorch-prebuilt-") as scratch:
        # the kernel workers do not need the C warm-call module: it compiles beside them
        env = dict(os.environ, SCORCH_CACHE_DIR=scratch, SCORCH_FASTCALL="0")
        procs = [subprocess.Popen([sys.executable, "-m", "scorch.tensor_compiler.prebuilt", "--part",
                                   str(p), str(jobs)], env=env) for p in range(jobs)]
        procs.append(subprocess.Popen([sys.executable, "-m", "scorch.tensor_compiler.prebuilt",
                                       "--fastcall"], env=dict(env, SCORCH_FASTCALL="1")))
        failed = [p.args for p in procs if p.wait() != 0]
        if failed:
            raise RuntimeError(f"prebuilt kernels: worker failed: {failed}")
        built = Path(scratch) / f"kernels-v{BUILD_VERSION}"
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.iterdir():  # kernels of an earlier compiler version
            if old.suffix in (".so", ".pyx", ".pyd", build.CHECKSUM_SUFFIX):
                old.unlink()
        count = 0
        # each kernel's checksum goes with it: build.load_kernel verifies a prebuilt kernel
        # like a cached one and builds it afresh when the copy is damaged
        for f in sorted(built.glob("*")):
            if f.suffix in (".so", ".pyx", build.CHECKSUM_SUFFIX) or f.name.endswith(".pyd"):
                shutil.copy2(f, dest / f.name)
                count += f.suffix == ".so"
        shutil.rmtree(dest / "pch", ignore_errors=True)
        (dest / "pch").mkdir()
        for f in sorted((built / "pch").glob("scorch_*")):
            if f.name.endswith((".h", ".gch", ".gch" + build.CHECKSUM_SUFFIX)):
                shutil.copy2(f, dest / "pch" / f.name)
    (dest / "__init__.py").write_text('"""Kernels compiled at install time (scorch.tensor_compiler.prebuilt)."""\n')
    return count


def _case_count() -> int:
    """How many cases ``standard_cases`` runs (without importing torch in the parent)."""
    return len(CASE_NAMES) * (len(FORMATS) + 1) * 2


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="compile scorch's standard kernels")
    parser.add_argument("--part", nargs=2, type=int, metavar=("I", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--fastcall", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dest", default=None)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.part:
        _run_part(*args.part)
        return
    if args.fastcall:
        from . import build, fastcall
        build.PREBUILT_DIR = Path(os.devnull)
        if fastcall.load() is None:
            raise SystemExit("scorch: the C warm-call module did not build")
        print("scorch: the C warm-call module is built; building the precompiled headers",
              flush=True)
        if len(build.build_precompiled_headers()) != 2:
            print("scorch: WARNING: the precompiled headers did not build (kernels compile "
                  "without them, a little slower)", flush=True)
        return
    n = build_prebuilt(args.dest, args.jobs)
    print(f"scorch: {n} standard kernels compiled into {args.dest or 'scorch/_prebuilt'}")


if __name__ == "__main__":
    main()
