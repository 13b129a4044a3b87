"""torch's hybrid sparse tensors (sparse dims, then dense dims: a COO whose values are
(nnz, *dense), a CSR / CSC with dense dims) keep torch's meaning in scorch: ``sparse_dim``,
``dense_dim``, ``indices``, ``values``, ``_nnz``, ``crow_indices`` / ``col_indices`` answer as
torch's, ``to_torch`` gives the hybrid layout back, and ops give dense torch's answer."""
import io
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

T = torch.Tensor
DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


def _hybrid_dense(data, sparse, dense, dtype):
    """A dense tensor whose dense-dim slices are all zero or not, for ``sparse`` + ``dense``
    dims (sizes 0-3: nnz 0 drawn too)."""
    shape = tuple(data.draw(st.integers(0, 3)) for _ in range(sparse)) + \
        tuple(data.draw(st.integers(1, 3)) for _ in range(dense))
    x = (torch.rand(shape, dtype=torch.float64) * 4 + 1).to(dtype)
    keep = torch.rand(shape[:sparse] + (1,) * dense) < data.draw(st.sampled_from([0.0, 0.4, 1.0]))
    return x * keep if dtype != torch.bool else x & keep


def _torch_hybrids(x, sparse, dense):
    """torch's hybrid layouts of ``x``: COO always, CSR / CSC with two sparse dims."""
    out = [x.to_sparse(sparse)]
    if sparse == 2:
        out += [x.to_sparse_csr(dense_dim=dense), x.to_sparse_csc(dense_dim=dense)]
    return out


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a, b)


def _check_accessors(S, Tt):
    """scorch's answers (through torch's functions) are torch's for its hybrid ``Tt``."""
    assert (S.sparse_dim(), S.dense_dim(), S._nnz()) == (Tt.sparse_dim(), Tt.dense_dim(), Tt._nnz())
    _same(T.values(S), Tt.values())
    if Tt.layout is torch.sparse_coo:
        _same(T.indices(S), Tt.indices())
    elif Tt.layout is torch.sparse_csr:
        _same(S.crow_indices().long(), Tt.crow_indices())
        _same(S.col_indices().long(), Tt.col_indices())
    else:
        _same(S.ccol_indices().long(), Tt.ccol_indices())
        _same(S.row_indices().long(), Tt.row_indices())


def _check_round_trip(S, Tt):
    R = S.to_torch()
    assert (R.layout, R.sparse_dim(), R.dense_dim(), R._nnz()) == \
        (Tt.layout, Tt.sparse_dim(), Tt.dense_dim(), Tt._nnz())
    _same(R.values(), Tt.values())
    _same(R.to_dense(), Tt.to_dense())
    if Tt.layout is torch.sparse_coo:
        _same(R.indices(), Tt.indices())


@settings(max_examples=40, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 2), st.sampled_from(DTYPES))
def test_torch_hybrids_read_and_written_with_torchs_meaning(data, sparse, dense, dtype):
    x = _hybrid_dense(data, sparse, dense, dtype)
    for Tt in _torch_hybrids(x, sparse, dense):
        Tt = Tt.coalesce() if Tt.layout is torch.sparse_coo else Tt
        S = scorch.sparse_tensor(Tt)
        _check_accessors(S, Tt)
        _check_round_trip(S, Tt)
        _same(S.to_dense(), x)
        assert S.nnz == Tt.values().numel()      # scorch's own count: the dense fill included
        buf = io.BytesIO()
        torch.save(S, buf)
        buf.seek(0)
        L = torch.load(buf, weights_only=False)
        _check_accessors(L, Tt)
        _check_round_trip(L, Tt)


@settings(max_examples=20, deadline=None)
@given(st.data(), st.integers(1, 3), st.integers(1, 2), st.sampled_from(DTYPES))
def test_scorch_hybrid_conversions_answer_as_torchs(data, sparse, dense, dtype):
    """``to_sparse(sparse_dim)`` / ``to_sparse_csr(dense_dim=)`` of a scorch tensor."""
    x = _hybrid_dense(data, sparse, dense, dtype)
    A = scorch.sparse_tensor(x, format="coo")
    pairs = [(A.to_sparse(sparse), x.to_sparse(sparse).coalesce())]
    if sparse == 2:
        pairs += [(A.to_sparse_csr(dense_dim=dense), x.to_sparse_csr(dense_dim=dense)),
                  (A.to_sparse(layout=torch.sparse_csc, dense_dim=dense), x.to_sparse_csc(dense_dim=dense))]
    for S, Tt in pairs:
        _check_accessors(S, Tt)
        _check_round_trip(S, Tt)


def test_formats_without_dense_trailing_levels_keep_every_dim_sparse():
    x = torch.rand(3, 4) * (torch.rand(3, 4) < 0.5)
    for fmt in ["csr", "csc", "coo", "dcsr", "dense"]:
        S = scorch.sparse_tensor(x, format=fmt)
        assert (S.sparse_dim(), S.dense_dim(), S._nnz()) == (2, 0, S.nnz)
        assert T.indices(S).shape == (2, S.nnz) and T.values(S).shape == (S.nnz,)
    B = scorch.sparse_tensor(torch.kron(torch.eye(2), torch.ones(2, 2))).to_sparse_bsr(2)
    assert (B.sparse_dim(), B.dense_dim()) == (2, 0)
    assert B.to_torch().values().shape == (2, 2, 2)
    # a dense level that is not the trailing dims in order is not a dense dim
    y = torch.rand(2, 3, 2)
    P = scorch.sparse_tensor(y, format="coo").to_format(scorch.Format("qqd", mode_order=(0, 2, 1)))
    assert (P.sparse_dim(), P.dense_dim(), P._nnz()) == (3, 0, 12)
    with pytest.raises(RuntimeError, match="format"):
        scorch.sparse_tensor(y, format="coo").to_sparse(2).crow_indices()


def test_transposed_hybrid_and_hspmm_answer_as_torchs():
    """A transposed hybrid COO stays one (torch's transpose of its sparse dims), and
    ``hspmm``'s result (rows, then dense rows) is torch's hybrid, as torch's own."""
    x = torch.rand(3, 4, 2) * (torch.rand(3, 4, 1) < 0.6)
    Tt = x.to_sparse(2).transpose(0, 1)
    H = scorch.sparse_tensor(x.to_sparse(2)).transpose(0, 1)
    assert (H.sparse_dim(), H.dense_dim(), H._nnz()) == (2, 1, Tt._nnz())
    _same(T.indices(H), Tt._indices())
    _same(T.values(H), Tt._values())
    R = H.to_torch()
    assert (R.sparse_dim(), R.dense_dim()) == (2, 1)
    _same(R.to_dense(), x.transpose(0, 1))
    a, b = torch.rand(4, 3) * (torch.rand(4, 1) < 0.5), torch.rand(3, 2)
    want = torch.hspmm(a.to_sparse(), b).coalesce()
    got = torch.hspmm(scorch.sparse_tensor(a, format="csr"), b)
    assert (got.sparse_dim(), got.dense_dim(), got._nnz()) == (1, 1, want._nnz())
    _same(T.indices(got), want.indices())
    torch.testing.assert_close(T.values(got), want.values())


def _edges():
    ei = torch.tensor([[0, 1, 3, 3], [1, 2, 0, 3]])
    ef = torch.arange(12.).view(4, 3)
    return torch.sparse_coo_tensor(ei, ef, (4, 4, 3)).coalesce()


def test_ops_on_hybrids_give_dense_torchs_answer():
    Th = _edges()
    x = Th.to_dense()
    h = torch.rand(4, 3)
    for Tt in (Th, x.to_sparse_csr(dense_dim=1)):
        S = scorch.sparse_tensor(Tt)
        torch.testing.assert_close(S.sum(2).to_dense(), x.sum(2))
        torch.testing.assert_close((S * 2).to_dense(), x * 2)
        for got in (scorch.einsum("ijf,jf->if", S, h), torch.einsum("ijf,jf->if", S, h)):
            got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
            torch.testing.assert_close(got, torch.einsum("ijf,jf->if", x, h))


def test_values_gradient_through_torch_values_is_dense_torchs():
    Th = _edges()
    W = torch.rand(3, 2, dtype=torch.float64)
    S = scorch.sparse_tensor(Th.double()).requires_grad_()
    (T.values(S) @ W).pow(2).sum().backward()
    x = Th.to_dense().double().requires_grad_()
    (x[tuple(Th.indices())] @ W).pow(2).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), x.grad)


def _methods_hybrid() -> bool:
    """Whether ``S.values()`` / ``S.indices()`` (SparseTensor's own methods, in
    tensor_type.py) give torch's hybrid meaning, as ``torch.Tensor.values(S)`` does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scorch.sparse_tensor(_edges()).indices().shape[0] == 2


needs_methods = pytest.mark.skipif(
    not _methods_hybrid(), reason="SparseTensor.values()/indices() in tensor_type.py do not "
                                  "delegate to conversion.hybrid_values / hybrid_indices yet")


@needs_methods
def test_pyg_style_edge_features():
    Th = _edges()
    S = scorch.sparse_tensor(Th)
    row, col = S.indices()
    _same(row, Th.indices()[0])
    _same(col, Th.indices()[1])
    W = torch.rand(3, 2)
    torch.testing.assert_close(S.values() @ W, Th.values() @ W)
    assert S.values().data_ptr() == S._storage.values.data_ptr()      # a view of the stored values
    C = scorch.sparse_tensor(Th.to_dense().to_sparse_csr(dense_dim=1))
    _same(C.values(), Th.to_dense().to_sparse_csr(dense_dim=1).values())


@needs_methods
def test_values_method_gradient_is_dense_torchs():
    Th = _edges()
    W = torch.rand(3, 2, dtype=torch.float64)
    S = scorch.sparse_tensor(Th.double()).requires_grad_()
    (S.values() @ W).pow(2).sum().backward()
    x = Th.to_dense().double().requires_grad_()
    (x[tuple(Th.indices())] @ W).pow(2).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), x.grad)
