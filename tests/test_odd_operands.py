"""Operands torch accepts that are unusual in memory or in type (session 33's sweep): a lazy
negative or conjugate bit, strided index arrays of a torch CSR, wrapper subclasses, nested and
meta tensors, numpy arrays and foreign objects beside a sparse tensor, dense tensors written
in place with a sparse operand. Oracle: dense torch (or torch's own error)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scorch

warnings.filterwarnings("ignore", message=".*(MaskedTensor|nested|Sparse CSR|dense copy).*")


def _dense(m=7, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g) * (torch.rand(m, n, generator=g) < 0.4)


def _d(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


def _negative_views(shape):
    """Tensors whose memory holds the other sign: torch's lazy negative bit, two ways."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(*shape, dtype=torch.complex64, generator=g)
    flagged = torch._neg_view(torch.randn(*shape, generator=g))      # contiguous
    imag = z.conj().imag                                               # strided
    assert flagged.is_neg() and imag.is_neg()
    return [flagged, imag]


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_negative_bit_operands_read_their_values(fmt):
    D = _dense(7, 5)
    A = scorch.sparse_tensor(D, format=fmt)
    for Q in _negative_views((5, 3)):
        want = D @ Q.clone()
        for _ in range(3):          # the C warm path declines after the first calls too
            torch.testing.assert_close(_d(A @ Q), want)
            torch.testing.assert_close(_d(scorch.einsum("ij,jk->ik", A, Q)), want)
    for Q in _negative_views((7, 5)):
        Qc = Q.clone()
        torch.testing.assert_close(scorch.sparse_tensor(Q, format=fmt).to_dense(), Qc)
        torch.testing.assert_close(_d(Q.t() @ A), Qc.t() @ D)
        W = _dense(4, 5, seed=2)
        torch.testing.assert_close(_d(F.linear(Q, scorch.sparse_tensor(W, format=fmt))),
                                   Qc @ W.t())
        torch.testing.assert_close(_d(A * Q), D * Qc)
        torch.testing.assert_close(_d(A + Q), D + Qc)
        torch.testing.assert_close(Q.sparse_mask(A.to_torch().to_sparse_coo()).to_dense()
                                   if fmt == "coo" else Qc * (D != 0), Qc * (D != 0))
    for P in _negative_views((7, 4)):
        Pc = P.clone()
        R = _negative_views((5, 4))[0]
        got = torch.sparse.sampled_addmm(A.to_format("csr"), P, R.t()).to_dense()
        torch.testing.assert_close(got, D + (Pc @ R.clone().t()) * (D != 0))


def test_conjugate_bit_is_resolved():
    z = torch.tensor([[1 + 2j, 0], [0, 3 - 1j]], dtype=torch.complex64)
    torch.testing.assert_close(scorch.sparse_tensor(z.conj(), format="csr").to_dense(),
                               z.conj().resolve_conj())


@pytest.mark.parametrize("which", ["col", "crow"])
def test_torch_csr_with_strided_index_arrays(which):
    crow = torch.tensor([0, 1, 2, 3])
    col = torch.tensor([1, 2, 0])
    if which == "col":
        col = torch.tensor([1, 9, 2, 9, 0, 9])[::2]
    else:
        crow = torch.tensor([0, 7, 1, 7, 2, 7, 3, 7])[::2]
    T = torch.sparse_csr_tensor(crow, col, torch.tensor([1., 3., 5.]), (3, 3))
    want = T.to_dense()
    torch.testing.assert_close(scorch.sparse_tensor(T).to_dense(), want)
    torch.testing.assert_close(scorch.einsum("ij,j->i", T, torch.ones(3)), want.sum(1))


def test_torch_coo_with_strided_indices():
    """A coalesced torch COO whose indices are a transposed (nnz, 2) array (strided rows)."""
    idx = torch.tensor([[0, 1], [1, 0], [2, 2]]).t()
    assert not idx.is_contiguous()
    T = torch.sparse_coo_tensor(idx, torch.tensor([1., 2., 3.]), (3, 3), is_coalesced=True)
    want = T.to_dense()
    torch.testing.assert_close(scorch.sparse_tensor(T).to_dense(), want)
    torch.testing.assert_close(_d(scorch.einsum("ij,j->i", T, torch.ones(3))), want.sum(1))


def test_wrapper_subclass_operand_is_refused_by_name():
    from torch.masked import masked_tensor
    A = scorch.sparse_tensor(_dense(5, 5), format="csr")
    M = masked_tensor(torch.randn(5, 3), torch.rand(5, 3) > 0.5)
    for f in (lambda: A @ M, lambda: scorch.einsum("ij,jk->ik", A, M)):
        with pytest.raises(TypeError, match="MaskedTensor.*__torch_dispatch__"):
            f()


def test_meta_and_nested_operands_raise_named_errors():
    A = scorch.sparse_tensor(_dense(4, 6), format="csr")
    with pytest.raises(ValueError, match="device meta"):
        F.linear(torch.empty(3, 6, device="meta"), A)
    X = torch.rand(6, 2)
    for out in (torch.empty(4, 2, device="meta"),):
        with pytest.raises(RuntimeError, match="device cpu, but got meta"):
            torch.mm(A, X, out=out)
    nt = torch.nested.nested_tensor([torch.rand(6, 2), torch.rand(6, 3)])
    with pytest.raises(TypeError, match="operand 1 is a nested tensor"):
        A @ nt


@pytest.mark.parametrize("op", ["div_", "itruediv", "addcmul_", "addcdiv_", "lerp_weight",
                                "lerp_end"])
def test_dense_written_in_place_with_a_sparse_operand(op):
    D = _dense(4, 5) + 2.0 * (torch.arange(20).reshape(4, 5) % 3 == 0)
    A = scorch.sparse_tensor(D, format="csr")
    Y = torch.rand(4, 5) + 1
    X0 = torch.rand(4, 5)
    do = {"div_": lambda X, S: X.div_(S), "itruediv": lambda X, S: X.__itruediv__(S),
          "addcmul_": lambda X, S: X.addcmul_(S, Y, value=0.5),
          "addcdiv_": lambda X, S: X.addcdiv_(Y, S + 3 if not isinstance(S, scorch.SparseTensor)
                                              else S.to_dense() + 3),
          "lerp_weight": lambda X, S: X.lerp_(S, 0.3), "lerp_end": lambda X, S: X.lerp_(Y, S)}[op]
    want = do(X0.clone(), D)
    X = X0.clone()
    got = do(X, A)
    assert got is X
    torch.testing.assert_close(X, want, equal_nan=True)


def test_numpy_and_foreign_right_operands():
    D = _dense(3, 3)
    A = scorch.sparse_tensor(D, format="csr")
    N = np.arange(9, dtype=np.float32).reshape(3, 3)
    torch.testing.assert_close(_d(A * N), D * torch.from_numpy(N))
    torch.testing.assert_close(_d(A + N), D + torch.from_numpy(N))
    torch.testing.assert_close(_d(A @ N), D @ torch.from_numpy(N))

    class Scale:
        def __rmul__(self, other):
            return "rmul"

        def __radd__(self, other):
            return "radd"
    assert A * Scale() == "rmul" and A + Scale() == "radd"
    for bad in (None, [1.0, 2.0, 3.0], object()):
        with pytest.raises(TypeError, match="unsupported operand"):
            A + bad


def test_constructor_tuples_name_the_mistake():
    i = torch.tensor([[0, 1, 2], [1, 0, 2]])
    with pytest.raises(TypeError, match="an \\(indices, values\\) pair, got a tuple of 3"):
        scorch.sparse_tensor((i, torch.ones(3), (3, 3)))
    with pytest.raises(ValueError, match="size needs 3 dimensions"):
        scorch.sparse_tensor((i, torch.ones(3, 2)), size=(3, 3))


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_broadcast_operands_are_read_without_expanding(fmt, monkeypatch):
    """A dense operand expanded with stride 0 (the gradient of ``.sum()``, a broadcast bias)
    that a kernel streams along another dimension: one row is made stride 1 and read with
    stride 0 (``execute._broadcast_rows_once``), never the whole expanded tensor; values as
    dense torch's, for a fully and a partly broadcast operand and through backward."""
    from scorch.tensor_compiler import execute
    a = _dense(40, 30, seed=5)
    A = scorch.sparse_tensor(a, format=fmt)
    copied = []
    real = execute._broadcast_rows_once

    def spy(x, d):
        y = real(x, d)
        copied.append((tuple(x.shape), y.untyped_storage().nbytes() // y.element_size()))
        return y
    monkeypatch.setattr(execute, "_broadcast_rows_once", spy)
    for g in (torch.ones(1, 1).expand(40, 16), torch.randn(16, 1).t().expand(40, 16),
              torch.randn(40, 1).expand(40, 16)):
        got = scorch.einsum("ij,ik->jk", A, g)
        torch.testing.assert_close(_d(got), a.t() @ g, rtol=1e-5, atol=1e-5)
    assert ((40, 16), 16) in copied, copied   # one row of 16 values, not 40 x 16
    X = torch.randn(30, 16, requires_grad=True)
    (A @ X).sum().backward()
    torch.testing.assert_close(X.grad, a.t() @ torch.ones(40, 16), rtol=1e-5, atol=1e-5)
