"""SpMV's kernel variants against dense torch: the short-rows module (no loop vectorization,
loops aligned to 32 bytes) and the default one, chosen per input by the average row length,
over float32/float64 values and int32/int64 indices, for the native build and (where this CPU
runs it) the AVX2 target."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.tensor_compiler import build, codegen, target
from scorch.tensor_compiler.lower import short_rows_limit

FAST = settings(max_examples=20, deadline=None)
AVX2 = target.runnable(target.target_named("avx2"))


def _spmv_source(dtype=torch.float32, scalar_inner=True) -> str:
    A = scorch.sparse_tensor(torch.eye(3, dtype=dtype), format="csr")
    s = scorch.explain("ij,j->i", A, torch.ones(3, dtype=dtype)).schedule
    idx = {ap.id: torch.int32 for ap in s.accesses if ap.sparse}
    return codegen.generate(s, dtype, idx, scalar_inner=scalar_inner)[0]


def test_short_rows_variant_is_built_scalar_with_aligned_loops():
    short, default = _spmv_source(), _spmv_source(scalar_inner=False)
    flags = build.kernel_cflags(short)
    assert "-fno-tree-vectorize" in flags and "-falign-loops=32" in flags
    assert "-falign-loops=32" not in build.kernel_cflags(default)
    with pytest.raises(ValueError):      # a source cannot ask for arbitrary flags
        build.source_cflags("# scorch-cflags: -O0\n")


@st.composite
def spmv_case(draw, dtypes=(torch.float32, torch.float64), indices=(torch.int32, torch.int64)):
    rows = draw(st.integers(0, 40))
    cols = draw(st.integers(1, 60))
    dtype = draw(st.sampled_from(dtypes))
    # average row lengths on both sides of the short-rows limit
    per_row = draw(st.sampled_from([0.0, 1.0, 3.0, short_rows_limit(dtype) + 8.0]))
    density = min(1.0, per_row / cols)
    seed = draw(st.integers(0, 2**31 - 1))
    M = sp.random(rows, cols, density=density, format="csr", random_state=seed,
                  dtype=np.float64)
    index = draw(st.sampled_from(indices))
    return M, dtype, index


def _check(case, name):
    M, dtype, index = case
    dense = torch.from_numpy(M.toarray()).to(dtype)
    x = torch.randn(M.shape[1], dtype=torch.float64).to(dtype)
    A = torch.sparse_csr_tensor(torch.from_numpy(M.indptr).to(index),
                                torch.from_numpy(M.indices).to(index),
                                torch.from_numpy(M.data).to(dtype), size=M.shape)
    with target.use_target(name):
        got = scorch.einsum("ij,j->i", A, x)
        again = scorch.einsum("ij,j->i", A, x)      # the warm call
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, dense @ x, rtol=tol, atol=tol)
    assert torch.equal(got, again)


@FAST
@given(case=spmv_case())
def test_spmv_variants_match_dense(case):
    _check(case, "native")


@FAST
@given(case=spmv_case(dtypes=(torch.float32,), indices=(torch.int32,)))
def test_avx2_spmv_variants_match_dense(case):
    if not AVX2:     # the AVX2 build needs a CPU that runs it: the native test covers the rest
        assert not target.runnable(target.target_named("avx2"))
        return
    _check(case, "avx2")
