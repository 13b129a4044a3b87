"""Operands of the matmul family and of amax / amin, against dense torch.

* a torch sparse tensor (CSR / CSC / COO) as an operand of ``@`` / ``mm`` / ``matmul`` with a
  scorch tensor is sparse @ sparse (a sparse result, as ``scorch.einsum``), never the sparse @
  dense path (a dense result, an error on the strides) - and it leaves that path's cache of
  output formats right for later ``S @ X`` calls;
* ``amax`` / ``amin`` along dims whose kept dims are stored sparsely (DCSR, COO, CSC over its
  columns, CSF) give a sparse result over the fibers that store an entry (0 elsewhere, as
  torch's value of an empty fiber): values, gradients (ties, full fibers) as dense torch's.
"""
import contextlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.gradients import fiber_ops
from scorch.sparse_ops import matmul as _matmul

FORMATS = ["csr", "csc", "coo", "dcsr", "dcsc"]


def _dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) or x.layout != torch.strided else x


def _matrix(seed: int, shape=(6, 5), density=0.4, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(shape, generator=g, dtype=dtype)
    return d * (torch.rand(shape, generator=g) < density)


# --- bug: a torch sparse operand took the sparse @ dense path ------------------------------

TORCH_LAYOUTS = {"csr": torch.Tensor.to_sparse_csr, "csc": torch.Tensor.to_sparse_csc,
                 "coo": torch.Tensor.to_sparse}


@pytest.mark.parametrize("layout", TORCH_LAYOUTS)
@pytest.mark.parametrize("op", ["@", "mm", "matmul", "method_mm", "left"])
def test_torch_sparse_operand_is_sparse_product(layout, op):
    A, B = _matrix(0, (6, 5)), _matrix(1, (5, 4))
    S = scorch.sparse_tensor(A, format="csr")
    S @ torch.randn(5, 3, dtype=A.dtype)           # the warm sparse @ dense path primed
    T = TORCH_LAYOUTS[layout](B)
    if op == "left":                               # torch sparse @ scorch sparse
        r, ref = TORCH_LAYOUTS[layout](A) @ scorch.sparse_tensor(B, format="csr"), A @ B
    else:
        r = {"@": lambda: S @ T, "mm": lambda: torch.mm(S, T), "matmul": lambda: torch.matmul(S, T),
             "method_mm": lambda: S.mm(T)}[op]()
        ref = A @ B
    assert isinstance(r, scorch.SparseTensor)
    torch.testing.assert_close(r.to_dense(), ref)
    if op != "left":
        e = scorch.einsum("ij,jk->ik", S, T)
        assert r._storage.format == e._storage.format


def test_torch_sparse_operand_leaves_spmm_cache_right():
    A = _matrix(2, (8, 8))
    S = scorch.sparse_tensor(A, format="csr")
    X = torch.randn(8, 3, dtype=A.dtype)
    _matmul._SPMM_OUT.clear()
    _matmul._last_spmm[:] = [None, 0, None]
    r = S @ A.to_sparse_csr()                       # first product in this format: sparse
    assert isinstance(r, scorch.SparseTensor)
    assert all(k[0] != S._storage.format for k in _matmul._SPMM_OUT)   # nothing recorded
    y = S @ X
    assert type(y) is torch.Tensor
    torch.testing.assert_close(y, A @ X)
    assert _matmul._SPMM_OUT[(S._storage.format, 2)] is None            # the warm C path's entry
    r2 = S @ A.to_sparse_csr()                       # after S @ X: still sparse, no stride error
    torch.testing.assert_close(r2.to_dense(), A @ A)


def test_torch_sparse_operand_addmm_and_sparse_mm_reduce():
    A, B = _matrix(3, (5, 5)), _matrix(4, (5, 5))
    S = scorch.sparse_tensor(A, format="csr")
    C = torch.randn(5, 5, dtype=A.dtype)
    torch.testing.assert_close(_dense(torch.addmm(C, S, B.to_sparse_csr(), beta=0.5, alpha=2.0)),
                               0.5 * C + 2.0 * (A @ B))
    # reduce= takes a dense mat2 only (as torch's); a sparse one is not read as dense
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        torch.sparse.mm(S, B.to_sparse_csr(), "amax")


# --- bug: amax / amin along a dim gave a dense vector as long as the dim --------------------

def _check_extreme(A: torch.Tensor, fmt: str, name: str, dim, keepdim=False):
    S = scorch.sparse_tensor(A, format=fmt)
    r = getattr(torch, name)(S, dim, keepdim)
    ref = getattr(torch, name)(A, dim, keepdim)
    torch.testing.assert_close(_dense(r), ref, equal_nan=True)
    return S, r


@pytest.mark.parametrize("fmt,dim,sparse", [
    ("dcsr", 0, True), ("dcsr", 1, True), ("coo", 0, True), ("coo", 1, True),
    ("csr", 0, True), ("csc", 1, True), ("dcsc", 0, True), ("dcsc", 1, True),
    ("csr", 1, False), ("csc", 0, False)])          # kept dim a dense level: dense by design
def test_extreme_layout(fmt, dim, sparse):
    A = _matrix(5, (7, 6), 0.3)
    A[2] = 0
    A[:, 3] = 0
    for name in ("amax", "amin"):
        _, r = _check_extreme(A, fmt, name, dim)
        assert isinstance(r, scorch.SparseTensor) == sparse
        if sparse:        # one entry per fiber that stores one
            assert r._storage.nnz == int((A != 0).any(dim).sum())


def test_extreme_hypersparse_costs_the_entries():
    n = 5_000_000
    idx = torch.tensor([[3, 3, 900_000, 4_000_000], [7, 2_000_000, 5, 7]])
    vals = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    for fmt in ("dcsr", "coo"):
        S = scorch.sparse_tensor((idx, vals), size=(n, n), format=fmt)
        for dim in (0, 1):
            r = S.amax(dim)
            assert isinstance(r, scorch.SparseTensor) and r._storage.nnz == idx[1 - dim].unique().numel()
        r = S.amin(1)
        coords, got = r.to_torch().coalesce().indices()[0], r.to_torch().coalesce().values()
        assert coords.tolist() == [3, 900_000, 4_000_000]
        assert got.tolist() == [-1.0, -3.0, 0.0]          # each row also holds implicit zeros


@contextlib.contextmanager
def _slots(wide: bool):
    """With ``wide``, every reduction takes the one-slot-per-stored-fiber path (that of
    hypersparse tensors) instead of the dense kernels' result read at the pattern."""
    saved = fiber_ops.DENSE_FIBERS_LIMIT, fiber_ops.DENSE_FIBERS_PER_ENTRY
    if wide:
        fiber_ops.DENSE_FIBERS_LIMIT = fiber_ops.DENSE_FIBERS_PER_ENTRY = 0
    try:
        yield
    finally:
        fiber_ops.DENSE_FIBERS_LIMIT, fiber_ops.DENSE_FIBERS_PER_ENTRY = saved


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(FORMATS), st.sampled_from(["amax", "amin"]), st.integers(0, 1),
       st.integers(1, 5), st.integers(1, 5), st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       st.booleans(), st.integers(0, 2 ** 16), st.booleans())
def test_extreme_values_and_gradient(fmt, name, dim, m, n, density, keepdim, seed, wide):
    with _slots(wide):
        _extreme_values_and_gradient(fmt, name, dim, m, n, density, keepdim, seed)


def _extreme_values_and_gradient(fmt, name, dim, m, n, density, keepdim, seed):
    g = torch.Generator().manual_seed(seed)
    # few distinct values: ties, stored zeros and full fibers are common
    A = torch.randint(-2, 3, (m, n), generator=g).double() * (torch.rand(m, n, generator=g) < density)
    S = scorch.sparse_tensor(A, format=fmt)
    r = getattr(torch, name)(S, dim, keepdim)
    ref = getattr(torch, name)(A, dim, keepdim)
    torch.testing.assert_close(_dense(r), ref)
    # gradient: torch's split among ties (implicit zeros counted) on the stored entries
    Sg = scorch.sparse_tensor(A, format=fmt).requires_grad_()
    Ad = A.clone().requires_grad_()
    w = torch.randn(ref.shape, generator=g, dtype=A.dtype)
    out = getattr(torch, name)(Sg, dim, keepdim)
    (_dense(out) * w).sum().backward()
    (getattr(torch, name)(Ad, dim, keepdim) * w).sum().backward()
    # (sparse_tensor of a dense tensor stores its nonzeros: the gradient lives there)
    torch.testing.assert_close(_dense(Sg.grad), torch.where(A != 0, Ad.grad, torch.zeros(())))


def test_extreme_values_through_sparse_result():
    # grad through the sparse result's own values (no to_dense in the graph)
    A = torch.tensor([[0., 2., 2.], [0., 0., 0.], [-1., -1., 0.], [3., 3., 3.]])
    S = scorch.sparse_tensor(A, format="dcsr").requires_grad_()
    r = S.amax(1)
    assert isinstance(r, scorch.SparseTensor)
    r.values().sum().backward()
    Ad = A.clone().requires_grad_()
    Ad.amax(1).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), Ad.grad * (A != 0))


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("fmt", ["ccc", "coo"])
@pytest.mark.parametrize("dim", [0, 1, 2, (0, 2), (1, 2)])
def test_extreme_rank3(fmt, dim, wide):
    g = torch.Generator().manual_seed(7)
    A = torch.randn(3, 4, 5, generator=g, dtype=torch.float64) * (torch.rand(3, 4, 5, generator=g) < 0.3)
    with _slots(wide):
        for name in ("amax", "amin"):
            for keepdim in (False, True):
                _check_extreme(A, fmt, name, dim, keepdim)


@pytest.mark.parametrize("wide", [False, True])
def test_extreme_dtypes_nan_and_empty(wide):
    with _slots(wide):
        _extreme_dtypes_nan_and_empty()


def _extreme_dtypes_nan_and_empty():
    A = torch.tensor([[0, 5, 0], [0, 0, 0], [-4, -1, -3]])
    for dtype in (torch.int64, torch.int32, torch.float32, torch.bool):
        _check_extreme(A.to(dtype), "dcsr", "amax", 1)
        _check_extreme(A.to(dtype), "coo", "amin", 0)
    N = torch.tensor([[0., float("nan"), 1.], [2., 0., 0.]])
    _check_extreme(N, "dcsr", "amax", 1)
    _check_extreme(N, "coo", "amin", 0)
    E = torch.zeros(4, 3)
    for fmt in ("dcsr", "coo", "csr"):
        _, r = _check_extreme(E, fmt, "amax", 0)
        _check_extreme(E, fmt, "amin", 1, True)
    with pytest.raises(IndexError):
        scorch.sparse_tensor(torch.zeros(3, 0), format="coo").amax(1)
