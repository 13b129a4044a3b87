"""``lower.output.inner_sum``: a scalar accumulator over the innermost loop and loops above
it sums the innermost loop into a partial sum of its own and multiplies the factors that
loop does not index in once after it (``sum_h s * v(h) = s * sum_h v(h)``: one FMA a
vector instead of a multiply and an FMA; the MoE gate gradient). Sources are checked for
where it applies and where it must not; results against dense torch under hypothesis."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.tensor_compiler import threads

GATE_GRAD = "bn,bh,bd,ndh->bn"


def _generic(plan) -> str:
    """The run-time-width chunk function's source (the one inner_sum applies to)."""
    return plan.source.split("cdef void run_chunk(")[1].split("cdef void ")[0]


def test_gate_gradient_sums_the_innermost_loop_apart():
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr")
    plan = scorch.explain(GATE_GRAD, G, torch.rand(16, 200), torch.rand(16, 8), torch.rand(4, 8, 200))
    body = _generic(plan)
    assert "pacc += (a.t1_vals[o1_3] * a.t3_vals[o3_3])" in body          # dy * E only
    assert "acc += (a.t0_vals[q0_1] * a.t2_vals[o2_2]) * pacc" in body     # G * x once per d
    assert "pacc_u1" in body                                               # each tile copy its own
    assert "-funroll-loops -fvariable-expansion-in-unroller" in plan.source
    # the fixed-width variants keep their vector dot
    assert "pacc" not in plan.source.split("cdef void run_chunk_w8(")[1].split("cdef void ")[0]


@pytest.mark.parametrize("eq, shapes, fmt, dtype", [
    ("ij,ik,jk->ij", [(30, 30), (30, 40), (30, 40)], "csr", torch.float32),   # SDDMM: one loop summed
    ("bn,bh,bd,ndh->bn", [(16, 4), (16, 200), (16, 8), (4, 8, 200)], "csr", torch.int64),  # integers
    ("ij,jk,jk->i", [(30, 30), (30, 40), (30, 40)], "csr", torch.int32),
])
def test_inner_sum_refusals(eq, shapes, fmt, dtype):
    """Not where the accumulator wraps the innermost loop alone, nor on integer values."""
    ops = [scorch.sparse_tensor(topk_gate(*shapes[0], 2).to(dtype), format=fmt)]
    ops += [(torch.rand(s) * 10).to(dtype) for s in shapes[1:]]
    assert "pacc" not in scorch.explain(eq, *ops).source


def test_inner_sum_refuses_sums_and_max():
    G = scorch.sparse_tensor(topk_gate(20, 20, 3), format="csr")
    B, C = torch.rand(20, 30), torch.rand(20, 30)
    from scorch.tensor_compiler import compute
    from scorch.tensor_compiler.index_notation import Access, Add, Assignment, Mul
    a, b, c = Access(0, ("i", "j")), Access(1, ("j", "k")), Access(2, ("j", "k"))
    plan = scorch.explain("ij,jk,jk->i", G, B, C)
    assert "pacc" in _generic(plan)                                    # the product: applies
    got = compute(Assignment(("i",), Mul(a, Add(b, c))), G, B, C)      # a sum inside: refused
    torch.testing.assert_close(torch.as_tensor(got), G.to_dense() @ (B + C).sum(1), rtol=1e-4, atol=1e-4)


SETTINGS = dict(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def cases(draw):
    eq = draw(st.sampled_from(["ij,ikl,jkl->ij", "ij,jk,jk->i", "ij,jk,jk,j->i", GATE_GRAD]))
    m = draw(st.sampled_from([0, 1, 9, 40]))
    n = draw(st.sampled_from([1, 6]))
    k = draw(st.sampled_from([0, 1, 7, 150]))
    nnz = draw(st.integers(0, n))                      # 0: empty, n: full
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    fmt = draw(st.sampled_from(["csr", "coo", "dcsc"]))
    return eq, m, n, k, nnz, dtype, fmt, draw(st.sampled_from([1, 2])), draw(st.integers(0, 3))


@settings(**SETTINGS)
@given(cases())
def test_inner_sums_equal_dense(case):
    eq, m, n, k, nnz, dtype, fmt, nthreads, seed = case
    g = torch.Generator().manual_seed(seed)
    A = topk_gate(m, n, nnz, dtype, seed)
    lhs = eq.split("->")[0].split(",")
    size = {"i": m, "j": n, "b": m, "n": n, "k": k, "l": 5, "h": k, "d": 3}
    dense = [torch.rand(*[size[v] for v in idx], generator=g, dtype=dtype) for idx in lhs[1:]]
    old, known, free = torch.get_num_threads(), threads._load_known, threads._free_cores
    torch.set_num_threads(nthreads)
    threads._load_known, threads._free_cores = True, (lambda T: T)
    try:
        got = scorch.einsum(eq, scorch.sparse_tensor(A, format=fmt), *dense)
    finally:
        torch.set_num_threads(old)
        threads._load_known, threads._free_cores = known, free
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else torch.as_tensor(got)
    want = torch.einsum(eq, A, *dense)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(1.0, want.abs().max().item() if want.numel() else 0.0))
