"""A sparse result built in a workspace whose expression also sums over loops below every
output loop (``ij,ik,jk->i`` over CSC, loops ``j, i, k``): those reductions sum in a
register (a vector dot at the compile-time widths) and each sum is added to the workspace
once. Adding every term to the workspace made a load-add-store chain per ``k`` (2.5 ms
where the register sum takes 0.2 ms at 3000^2, 0.5 %, K = 32)."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

import scorch

F32, F64 = torch.float32, torch.float64


def _matrix(m, n, density, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g, dtype=F64) * (torch.rand(m, n, generator=g) < density)
    return d.to(dtype) if dtype.is_floating_point else (d * 10).round().to(dtype)


def _dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(0, 9), k=st.sampled_from([1, 3, 4, 8, 16, 32, 37]),
       density=st.sampled_from([0.0, 0.3, 1.0]), fmt=st.sampled_from(["csc", "dcsc"]),
       sparse_x=st.booleans(), dtype=st.sampled_from([F32, F64, torch.int64]),
       seed=st.integers(0, 999))
def test_workspace_results_with_inner_reductions_match_dense(m, n, k, density, fmt, sparse_x, dtype, seed):
    A = _matrix(m, n, density, seed, dtype)
    X = _matrix(m, k, 0.5 if sparse_x else 1.0, seed + 1, dtype)
    Y = _matrix(n, k, 1.0, seed + 2, dtype)
    ops = (scorch.sparse_tensor(A, format=fmt), scorch.sparse_tensor(X, format="csr") if sparse_x else X, Y)
    for equation, operands, dense_operands in [("ij,ik,jk->i", ops, (A, X, Y)),
                                               ("ij,jk->i", (ops[0], Y), (A, Y))]:
        for _ in range(2):   # planned, then the warm path
            got = _dense(scorch.einsum(equation, *operands))
            torch.testing.assert_close(got, torch.einsum(equation, *dense_operands))


def test_the_inner_reduction_is_added_to_the_workspace_once():
    A = scorch.sparse_tensor(_matrix(30, 20, 0.2, 1, F32), format="csc")
    X, Y = torch.randn(30, 16), torch.randn(20, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # (at more threads the order may transpose A for a parallel i)
    try:
        plan = scorch.explain("ij,ik,jk->i", A, X, Y)
    finally:
        torch.set_num_threads(threads)
    assert plan.loop_order == ["j", "i", "k"]
    out = plan.schedule.output
    assert out.mode == "ws" and out.ws_vars == ("i",) and out.acc_depth == 2
    src = plan.source
    # the workspace is added to from the accumulator only, never per term of the k loop
    adds = [ln.strip() for ln in src.splitlines() if "wv[wkey] = wv[wkey] +" in ln]
    assert adds and all(ln.endswith("+ acc") for ln in adds), adds
    assert "_hsum(" in src   # the 16-wide variant is a vector dot
