"""Code written for torch.sparse runs on scorch tensors with torch.sparse's results: found by
the sixth adversarial sweep (porting torch.sparse code)."""
from __future__ import annotations

import pytest
import torch

import scorch


def _pair(seed=0, shape=(5, 4), density=0.6):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(*shape, generator=g) * (torch.rand(*shape, generator=g) < density)
    d[1] = 0                                      # an empty row
    return d, scorch.sparse_tensor(d, format="csr")


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_reductions_match_torch(reduce):
    """GraphSAGE's aggregations: over each row's stored entries only; an empty row is 0."""
    d, A = _pair()
    X = torch.randn(4, 3)
    want = torch.sparse.mm(d.to_sparse_csr(), X, reduce)
    torch.testing.assert_close(torch.sparse.mm(A, X, reduce), want)


def test_sparse_mm_mean_gradient_and_refusals():
    d, A = _pair(1)
    X = torch.randn(4, 3, requires_grad=True)
    X2 = X.detach().clone().requires_grad_()
    torch.sparse.mm(A, X, "mean").sum().backward()
    torch.sparse.mm(d.to_sparse_csr(), X2, "mean").sum().backward()
    torch.testing.assert_close(X.grad, X2.grad)
    with pytest.raises(NotImplementedError, match="no backward"):
        torch.sparse.mm(A, torch.randn(4, 3, requires_grad=True), "amax")
    with pytest.raises(RuntimeError, match="reduce argument"):
        torch.sparse.mm(A, X2, "median")


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_sparse_mask_of_a_sparse_tensor(fmt):
    d, _ = _pair(2)
    m = torch.zeros(5, 4)
    m[0, :2], m[2, 3], m[1, 1] = 1, 1, 1
    S = scorch.sparse_tensor(d, format=fmt)
    M = scorch.sparse_tensor(m, format=fmt)
    got = S.sparse_mask(M)
    assert got._storage.nnz == M._storage.nnz
    torch.testing.assert_close(got.to_dense(), d.to_sparse().sparse_mask(m.to_sparse()).to_dense())
    S.requires_grad_()
    S.sparse_mask(M).to_dense().sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), ((m != 0) & (d != 0)).float())


def test_integer_blocksize_strided_layout_and_hybrids():
    d = torch.kron(torch.eye(3), torch.ones(2, 2))
    S = scorch.sparse_tensor(d, format="csr")
    for B in (S.to_sparse_bsr(2), S.to_sparse_bsc(2), S.to_sparse(layout=torch.sparse_bsr, blocksize=2)):
        assert B.format.block == (2, 2)
        torch.testing.assert_close(B.to_dense(), d)
    torch.testing.assert_close(S.to_sparse(layout=torch.strided), d)
    x = torch.zeros(4, 5, 3)
    x[1, 2], x[3, 0] = torch.tensor([1., 2, 3]), torch.tensor([4., 0, 5])
    H = scorch.sparse_tensor(x, format="coo")
    for hybrid, levels in [(H.to_sparse(2), "qqd"), (H.to_sparse_csr(dense_dim=1), "dcd"),
                           (H.to_sparse(layout=torch.sparse_csr, dense_dim=1), "dcd")]:
        assert isinstance(hybrid, scorch.SparseTensor)
        assert "".join(lv.letter for lv in hybrid.format.levels) == levels
        torch.testing.assert_close(hybrid.to_dense(), x)


def test_beta_zero_keeps_a_nan_of_input_as_torch():
    S = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 1]),
                                torch.tensor([float("nan"), 1.]), (2, 2))
    M1, M2 = torch.ones(2, 3), torch.ones(3, 2)
    got = torch.sparse.sampled_addmm(scorch.sparse_tensor(S), M1, M2, beta=0.0)
    want = torch.sparse.sampled_addmm(S, M1, M2, beta=0.0)
    torch.testing.assert_close(got.to_dense(), want.to_dense(), equal_nan=True)
    Snan = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([float("nan")]), (2, 2))
    A = torch.tensor([[1., 0], [0, 2]])
    got = torch.sspaddmm(scorch.sparse_tensor(Snan), scorch.sparse_tensor(A), torch.ones(2, 2), beta=0.0)
    want = torch.sspaddmm(Snan, A.to_sparse(), torch.ones(2, 2), beta=0.0)
    torch.testing.assert_close(got.to_dense(), want.to_dense(), equal_nan=True)
