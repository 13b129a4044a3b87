"""Golden tests of the generated Cython for SpMM, SDDMM (also per attention head), SpGEMM and the
transposed SpMM that adds rows into a dense output (``A^T @ G``: a dense operand's gradient), and of the C++ that
SpMM's and SDDMM's (dense or in-place outputs: a C entry) are built from.

Regenerate after an intended codegen change with
``SCORCH_REGEN_GOLDEN=1 python -m pytest tests/test_compiler_golden.py`` and review the diff."""
import os
from pathlib import Path

import pytest
import torch

from compiler_helpers import rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import cxx_module
from scorch.tensor_compiler.target import SOURCE_TAG, use_target

GOLDEN = Path(__file__).parent / "golden"


def _cases():
    a = sparse(rand((6, 5), 0.5, dtype=torch.float32), "csr", index_dtype=torch.int32)
    b = sparse(rand((5, 4), 0.5, dtype=torch.float32), "csr", index_dtype=torch.int32)
    d = torch.randn(5, 4)
    return {
        "spmm": ("ij,jk->ik", a, d),
        "sddmm": ("ij,ik,kj->ij", a, torch.randn(6, 3), torch.randn(3, 5)),
        "spgemm": ("ij,jk->ik", a, b),
        # attention scores per head on the pattern: values at (pattern position, b, h)
        "sddmm_heads": ("ij,bhid,bhjd->bhij", a, torch.randn(1, 2, 6, 3), torch.randn(1, 2, 5, 3)),
        # rows of G added into the output's rows at A's columns (fixed-width vector adds)
        "spmm_scatter": ("ij,ik->jk", a, torch.randn(6, 4)),
    }


#: the cases asked for with a dense result (format inference would give a sparse one)
_DENSE_OUT = {"spmm_scatter"}


@pytest.mark.parametrize("name", ["spmm", "sddmm", "spgemm", "sddmm_heads", "spmm_scatter"])
def test_golden_source(name):
    eq, *ops = _cases()[name]
    out = "dense" if name in _DENSE_OUT else None
    # the golden files are the AVX-512 build's tuned for AMD's cores, on any machine
    with use_target("avx512", cpu="amd"):
        src = C.explain(eq, *ops, out_format=out).source
        assert src == C.explain(eq, *ops, out_format=out).source  # deterministic
    src = "\n".join(ln for ln in src.split("\n") if not ln.startswith(SOURCE_TAG))
    path = GOLDEN / f"{name}.pyx"
    if os.environ.get("SCORCH_REGEN_GOLDEN"):
        path.write_text(src)
    assert path.exists(), f"missing {path}; run with SCORCH_REGEN_GOLDEN=1"
    assert src == path.read_text(), f"generated source for {name} changed; see {path}"
    cxx, cxx_path = cxx_module.to_cpp(src), GOLDEN / f"{name}.cpp"
    if os.environ.get("SCORCH_REGEN_GOLDEN"):
        cxx_path.write_text(cxx)
    assert cxx == cxx_path.read_text(), f"the C++ form of {name} changed; see {cxx_path}"


def test_golden_sources_compile_and_run():
    for name, (eq, *ops) in _cases().items():
        from compiler_helpers import dense
        want = torch.einsum(eq, *[dense(o) if not isinstance(o, torch.Tensor) else o for o in ops])
        out = "dense" if name in _DENSE_OUT else None
        torch.testing.assert_close(dense(C.einsum(eq, *ops, out_format=out)), want, rtol=1e-5, atol=1e-5)
