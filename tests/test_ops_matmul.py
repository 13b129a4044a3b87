"""The matmul family (``@``, mm, mv, bmm, matmul, addmm, F.linear) on sparse operands against
dense torch: any side sparse, empty and full operands, float32/float64, several formats."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FLOATS, KERNEL_FORMATS, assert_matches, dense_values, side, sparse

FAST = settings(max_examples=25, deadline=None)


@FAST
@given(st.data(), st.sampled_from(KERNEL_FORMATS[2]), st.sampled_from(FLOATS),
       st.sampled_from(["left", "right"]))
def test_mm_and_operator_match_dense(data, fmt, dtype, where):
    m, k, n = data.draw(side()), data.draw(side()), data.draw(side())
    a = data.draw(dense_values((m, k), dtype))
    b = data.draw(dense_values((k, n), dtype))
    A, B = (sparse(a, fmt), b) if where == "left" else (a, sparse(b, fmt))
    expected = a @ b
    # sparse @ dense and dense @ sparse give dense tensors, as torch
    assert_matches(A @ B, expected, sparse=False)
    assert_matches(torch.mm(A, B), expected, sparse=False)
    assert_matches(torch.matmul(A, B), expected, sparse=False)
    assert_matches(A.matmul(B) if where == "left" else B.__rmatmul__(A), expected)


@settings(max_examples=10, deadline=None)
@given(st.data(), st.sampled_from([("csr", "csr"), ("coo", "csc")]))
def test_sparse_times_sparse_is_sparse(data, fmts):
    m, k, n = data.draw(side(1)), data.draw(side(1)), data.draw(side(1))
    a = data.draw(dense_values((m, k)))
    b = data.draw(dense_values((k, n)))
    assert_matches(sparse(a, fmts[0]) @ sparse(b, fmts[1]), a @ b, sparse=True)


@FAST
@given(st.data(), st.sampled_from(["csr", "dcsr"]))
def test_vector_forms_match_dense(data, fmt):
    dtype = torch.float64
    m, k = data.draw(side()), data.draw(side())
    a = data.draw(dense_values((m, k), dtype))
    v = data.draw(dense_values((k,), dtype))
    u = data.draw(dense_values((m,), dtype))
    A = sparse(a, fmt)
    assert_matches(A.mv(v), a.mv(v), sparse=False)
    assert_matches(torch.mv(A, v), a @ v)
    assert_matches(A @ v, a @ v)                   # 2-D @ 1-D
    assert_matches(u @ A, u @ a)                   # 1-D @ 2-D: promoted, then dropped
    s = sparse(v, "coo") if k else None
    if s is not None:
        assert_matches(s @ v, v @ v)               # 1-D @ 1-D: a 0-d dot product
        assert_matches(A @ s, a @ v)               # sparse matrix @ sparse vector


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_bmm_and_batched_matmul_broadcast(data):
    dtype = torch.float64
    bsz, m, k, n = (data.draw(side(1, 3)), data.draw(side()), data.draw(side()),
                    data.draw(side()))
    a = data.draw(dense_values((bsz, m, k), dtype))
    b = data.draw(dense_values((bsz, k, n), dtype))
    A = sparse(a, "coo")
    assert_matches(torch.bmm(A, b), torch.bmm(a, b))
    assert_matches(A @ b, a @ b)
    # batch broadcasting: a 2-D operand against a batch, and size-1 batch dims of a dense operand
    w = data.draw(dense_values((k, n), dtype))
    assert_matches(A @ w, a @ w)
    assert_matches(A @ b[:1], a @ b[:1])
    v = data.draw(dense_values((k,), dtype))
    assert_matches(A @ v, a @ v)
    d4 = data.draw(dense_values((2, 1, n, m), dtype))
    assert_matches(d4 @ A, d4 @ a)                 # dense (2, 1, n, m) @ sparse (bsz, m, k)


@FAST
@given(st.data(), st.sampled_from(["csr", "coo"]), st.sampled_from([0, 1, 0.5]),
       st.sampled_from([1, -2.0]), st.booleans())
def test_addmm_matches_dense(data, fmt, beta, alpha, broadcast_input):
    m, k, n = data.draw(side()), data.draw(side()), data.draw(side())
    a = data.draw(dense_values((m, k)))
    x = data.draw(dense_values((k, n)))
    c = data.draw(dense_values((n,) if broadcast_input else (m, n)))
    expected = torch.addmm(c, a, x, beta=beta, alpha=alpha)
    assert_matches(torch.addmm(c, sparse(a, fmt), x, beta=beta, alpha=alpha), expected)


@FAST
@given(st.data(), st.sampled_from(["csr", "coo"]), st.booleans(), st.booleans())
def test_linear_sparse_weight_or_input(data, fmt, sparse_weight, with_bias):
    dtype = torch.float64
    b, i, o = data.draw(side()), data.draw(side()), data.draw(side())
    x = data.draw(dense_values((b, i), dtype))
    w = data.draw(dense_values((o, i), dtype))
    bias = data.draw(dense_values((o,), dtype)) if with_bias else None
    expected = F.linear(x, w, bias)
    if sparse_weight:
        got = F.linear(x, sparse(w, fmt), bias)
        x3 = data.draw(dense_values((2, b, i), dtype))   # leading batch dims of the input
        assert_matches(F.linear(x3, sparse(w, fmt), bias), F.linear(x3, w, bias))
    else:
        got = F.linear(sparse(x, fmt), w, bias)
    assert_matches(got, expected)


def test_matmul_runs_without_densifying(monkeypatch):
    a = torch.rand(6, 5).double()
    a[a < 0.5] = 0
    A = sparse(a, "csr")
    x = torch.rand(5, 3).double()

    def no_dense(*args, **kwargs):
        raise AssertionError("a sparse operand was densified")
    monkeypatch.setattr(scorch.SparseTensor, "to_dense", no_dense)
    out = A @ x
    out2 = torch.addmm(torch.zeros(6, 3).double(), A, x)
    out3 = F.linear(x.T, A, None)
    monkeypatch.undo()
    assert torch.allclose(out, a @ x) and torch.allclose(out2, a @ x)
    assert torch.allclose(out3, x.T @ a.T)


def test_matmul_errors_name_the_problem():
    A = sparse(torch.eye(3).double(), "csr")
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        A @ torch.rand(4, 2).double()
    with pytest.raises(RuntimeError, match="dtype"):
        A @ torch.rand(3, 2)
    with pytest.raises(RuntimeError, match="2-D"):
        torch.mm(A, torch.rand(3).double())
    with pytest.raises(RuntimeError, match="batch"):
        torch.bmm(sparse(torch.ones(2, 3, 3).double(), "coo"), torch.ones(3, 3, 3).double())
    with pytest.raises(RuntimeError, match="linear"):
        F.linear(torch.rand(2, 4).double(), A)


def test_linear_dense_batch_through_sparse_weight_runs_as_spmm():
    """F.linear(x, W) with W sparse runs as W @ x^T (the batch as SpMM's dense columns):
    contiguous like torch's, equal to dense, differentiable in both operands."""
    torch.manual_seed(0)
    wd = torch.randn(7, 5, dtype=torch.float64) * (torch.rand(7, 5) < 0.4)
    w = scorch.sparse_tensor(wd, format="csr").requires_grad_()
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    y = F.linear(x, w)
    assert y.shape == (2, 3, 7) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, wd))
    g = torch.randn_like(y)
    y.backward(g)
    xr, wr = x.detach().requires_grad_(), wd.clone().requires_grad_()
    F.linear(xr, wr).backward(g)
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad.to_dense(), wr.grad * (wd != 0))


def test_linear_sparse_by_sparse_is_dense_when_the_product_fills_up():
    """A CSR batch through a CSR weight whose product stores (nearly) every entry gives a
    dense result (then the weight's gradient is an SDDMM); a product expected to stay sparse
    stays sparse. Both equal dense torch and differentiate on the weight's pattern."""
    torch.manual_seed(0)
    x = (torch.rand(16, 60, dtype=torch.float64) < 0.3) * torch.rand(16, 60, dtype=torch.float64)
    wd = torch.randn(12, 60, dtype=torch.float64) * (torch.rand(12, 60) < 0.3)
    X, W = scorch.sparse_tensor(x, format="csr"), scorch.sparse_tensor(wd, format="csr").requires_grad_()
    y = F.linear(X, W)
    assert type(y) is torch.Tensor
    torch.testing.assert_close(y, x @ wd.t())
    y.sum().backward()
    torch.testing.assert_close(W.grad.to_dense(), x.sum(0).expand(12, 60) * (wd != 0))
    eye = scorch.sparse_tensor(torch.eye(50, dtype=torch.float64), format="csr")
    z = F.linear(eye, eye)
    assert isinstance(z, scorch.SparseTensor)
    torch.testing.assert_close(z.to_dense(), torch.eye(50, dtype=torch.float64))


def test_low_rank_solvers_run_on_the_sparse_operand():
    """``torch.svd_lowrank``, ``pca_lowrank`` (centred: a rank-one correction, not the dense
    ``A - mean``) and ``lobpcg`` with a sparse A: every product a scorch kernel (no dense
    fallback: its limit is 0 here), the results those of dense torch."""
    g = torch.Generator().manual_seed(0)
    n = 60
    mask = torch.rand(n, n, generator=g) < 0.1
    x = torch.randn(n, n, dtype=torch.float64, generator=g) * mask
    x = x + x.t() + torch.diag(torch.arange(n, dtype=torch.float64))   # a spread spectrum
    A = scorch.sparse_tensor(x, format="csr")
    scorch.set_dense_fallback_limit(0)
    try:
        torch.manual_seed(1)
        U, S, V = torch.svd_lowrank(A, q=6, niter=6)
        torch.manual_seed(1)
        U2, S2, V2 = torch.svd_lowrank(x, q=6, niter=6)
        assert torch.allclose(S, S2) and torch.allclose(U @ torch.diag(S) @ V.mT,
                                                        U2 @ torch.diag(S2) @ V2.mT)
        U, S, V = torch.pca_lowrank(A, q=n, niter=2)
        centred = x - x.mean(0, keepdim=True)
        assert torch.allclose(S, torch.linalg.svdvals(centred), atol=1e-8)
        assert torch.allclose(U @ torch.diag(S) @ V.mT, centred, atol=1e-8)
        e, X = torch.lobpcg(A, k=3, largest=True, niter=200, tol=1e-10)
        assert torch.allclose(e, torch.linalg.eigvalsh(x)[-3:].flip(0), atol=1e-6)
    finally:
        scorch.set_dense_fallback_limit(None)
    with pytest.raises(NotImplementedError, match="detach"):
        torch.lobpcg(scorch.sparse_tensor(x, format="csr", requires_grad=True), k=2)


def test_products_inside_cpu_autocast():
    """Inside ``torch.autocast("cpu", torch.bfloat16)`` a product with a sparse operand
    takes bf16 and float32 operands alike (computed in float32) and returns bf16, as dense
    torch's products do there; a bf16 activation times a float32 sparse matrix had raised
    on the dtypes. Outside the block nothing changes."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(30, 20, generator=g) * (torch.rand(30, 20, generator=g) < 0.2)
    A = scorch.sparse_tensor(a, format="csr")
    lin = torch.nn.Linear(12, 20)
    x = torch.randn(7, 12, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x).t()                                   # bf16, 20 x 7
        for got, want in ((A @ h, a @ h), (torch.matmul(A, h), torch.matmul(a, h)),
                          (torch.mm(A, h), torch.mm(a, h)), (A @ h.float(), a @ h.float()),
                          (F.linear(h.t(), A), F.linear(h.t(), a))):
            assert got.dtype == want.dtype == torch.bfloat16
            assert torch.allclose(got.float(), want.float(), atol=0.1, rtol=0.05)
    assert (A @ h.float()).dtype == torch.float32
    w = scorch.sparse_tensor(a, format="csr", requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = (w @ h.detach()).float().sum()
    loss.backward()
    assert w.grad.dtype == torch.float32 and w.grad.nnz == w.nnz
