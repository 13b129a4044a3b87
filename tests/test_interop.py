"""torch and scipy layouts in and out, sharing memory where the layouts agree."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import scorch
from scorch import Format


def dense_example(m=6, n=8, density=0.4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, n, generator=g)
    return (x * (torch.rand(m, n, generator=g) < density)).to(dtype)


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout,fmt", [
    ("to_sparse_csr", Format("dc")), ("to_sparse_csc", Format("dc", (1, 0))),
    ("to_sparse", Format("qq")),
])
def test_torch_in_shares_memory(layout, fmt):
    x = dense_example()
    t = getattr(x, layout)()
    s = scorch.sparse_tensor(t)
    assert s.format == fmt and torch.equal(s.to_dense(), x)
    values = t.values() if layout != "to_sparse" else t._values()
    assert shares(s.values(), values)
    if layout == "to_sparse_csr":
        assert shares(s._storage.levels[1].pos, t.crow_indices())
        assert shares(s._storage.levels[1].crd, t.col_indices())
    if layout == "to_sparse":
        assert shares(s._storage.levels[1].crd, t._indices())


@pytest.mark.parametrize("rowwise", [True, False])
def test_torch_blocked_in_and_out(rowwise):
    x = dense_example(6, 8, 0.3)
    t = x.to_sparse_bsr((2, 2)) if rowwise else x.to_sparse_bsc((2, 2))
    s = scorch.sparse_tensor(t)
    assert s.format == Format("dc", (0, 1) if rowwise else (1, 0), block=(2, 2))
    assert shares(s.values(), t.values()) and torch.equal(s.to_dense(), x)
    back = s.to_torch()
    assert back.layout == t.layout and shares(back.values(), t.values())
    assert torch.equal(back.to_dense(), x)


def test_uncoalesced_torch_coo_is_summed():
    t = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [2, 0, 2]]), torch.tensor([1.0, 2.0, 3.0]), (2, 3))
    s = scorch.sparse_tensor(t)
    assert s.nnz == 2 and torch.equal(s.to_dense(), t.to_dense())


def test_hybrid_torch_coo():
    x = dense_example(5, 4)
    t = x.to_sparse(1)  # one sparse dim, one dense dim
    s = scorch.sparse_tensor(t)
    assert s.format == Format("qd") and torch.equal(s.to_dense(), x)
    assert shares(s.values(), t._values())


@pytest.mark.parametrize("fmt,layout", [
    ("csr", torch.sparse_csr), ("csc", torch.sparse_csc), ("coo", torch.sparse_coo),
    ("dcsr", torch.sparse_coo),
])
def test_to_torch(fmt, layout):
    x = dense_example()
    s = scorch.sparse_tensor(x, format=fmt)
    t = s.to_torch()
    assert t.layout == layout and torch.equal(t.to_dense(), x)
    if layout in (torch.sparse_csr, torch.sparse_csc):
        assert shares(t.values(), s.values())


@pytest.mark.parametrize("kind", ["matrix", "array"])
@pytest.mark.parametrize("name", ["csr", "csc", "coo", "bsr"])
def test_scipy_roundtrip_shares_memory(kind, name):
    x = dense_example(6, 8).numpy()
    m = getattr(sp, f"{name}_{kind}")(x) if name != "bsr" else getattr(sp, f"bsr_{kind}")(x, blocksize=(2, 2))
    m.sum_duplicates()  # canonical: sorted, no duplicates (scipy's bsr from dense is unsorted)
    s = scorch.from_scipy(m)
    assert np.array_equal(s.to_dense().numpy(), x)
    assert np.shares_memory(s.values().numpy(), m.data)
    back = s.to_scipy(kind)
    assert back.format == name and np.shares_memory(back.data, m.data)
    assert np.array_equal(back.toarray(), x)
    assert (kind == "matrix") == sp.isspmatrix(back)


def test_scipy_duplicates_and_unsorted_are_canonicalised():
    m = sp.coo_array((np.array([1.0, 2.0, 3.0]), (np.array([1, 0, 1]), np.array([2, 0, 2]))), shape=(2, 3))
    s = scorch.from_scipy(m)
    assert s.nnz == 2 and np.array_equal(s.to_dense().numpy(), m.toarray())
    csr = sp.csr_matrix((np.array([1.0, 2.0]), np.array([2, 0]), np.array([0, 2, 2])), shape=(2, 3))
    assert np.array_equal(scorch.from_scipy(csr).to_dense().numpy(), csr.toarray())


def test_unsorted_scipy_bsr_is_sorted_on_the_way_in():
    x = dense_example(6, 8, 0.6).numpy()
    m = sp.bsr_array(x, blocksize=(2, 2))
    s = scorch.from_scipy(m)
    assert np.array_equal(s.to_dense().numpy(), x)
    crd, pos = s._storage.levels[1].crd.numpy(), s._storage.levels[1].pos.numpy()
    assert all((np.diff(crd[pos[r]:pos[r + 1]]) > 0).all() for r in range(len(pos) - 1))


def test_numpy_in():
    x = dense_example().numpy()
    s = scorch.sparse_tensor(x, format="csr")
    assert s.format.name == "csr" and np.array_equal(s.to_dense().numpy(), x)


def test_torch_sparse_operand_read_as_matching_format():
    x = dense_example()
    csr = x.to_sparse_csr()
    s = scorch.sparse_tensor(csr, format="csc")
    assert s.format.name == "csc" and torch.equal(s.to_dense(), x)


# --- session 30 ---------------------------------------------------------------------------

def test_unsupported_value_dtypes_are_refused_at_construction():
    import numpy as np
    import scipy.sparse as sp
    d = np.eye(3, dtype=np.uint16)
    for make in (lambda: scorch.sparse_tensor(sp.coo_array(d)), lambda: scorch.sparse_tensor(sp.csr_array(d)),
                 lambda: scorch.sparse_tensor(torch.eye(3).to_sparse_csr(), dtype=torch.uint16)):
        with pytest.raises(TypeError, match="uint16"):
            make()


def test_batched_and_hybrid_torch_compressed_tensors_are_read():
    b = torch.rand(2, 3, 4) * (torch.rand(3, 4) < 0.5)     # torch: equal counts per batch
    bc = b.to_sparse_csr()
    S = scorch.sparse_tensor(b, format="coo")
    torch.testing.assert_close(scorch.sparse_tensor(bc).to_dense(), b)
    torch.testing.assert_close((bc + S).to_dense(), 2 * b)
    h = torch.rand(3, 4, 2) * (torch.rand(3, 4, 1) < 0.5)
    torch.testing.assert_close(scorch.sparse_tensor(h.to_sparse_csr(dense_dim=1)).to_dense(), h)


def test_to_scipy_dtypes_and_ranks():
    A = scorch.sparse_tensor(torch.eye(3).half(), format="csr")
    with pytest.raises(TypeError, match="float16"):
        A.to_scipy()
    for shape in [(4,), (2, 3, 4)]:
        x = torch.rand(shape) * (torch.rand(shape) < 0.5)
        m = scorch.sparse_tensor(x).to_scipy()
        assert m.shape == shape
        torch.testing.assert_close(torch.from_numpy(m.toarray()), x)


def test_empty_coordinate_lists_and_foreign_numpy_types():
    import numpy as np
    s = scorch.sparse_tensor(([[], []], []), size=(3, 4))
    assert s.nnz == 0 and s.dtype == torch.get_default_dtype() and s.shape == (3, 4)
    big_endian = np.eye(2).astype(">f8")
    torch.testing.assert_close(scorch.sparse_tensor(big_endian).to_dense(), torch.eye(2, dtype=torch.float64))
    if np.dtype(np.longdouble).itemsize > 8:
        with pytest.raises(TypeError, match="no torch counterpart"):
            scorch.sparse_tensor(np.eye(2, dtype=np.longdouble))


def test_hybrid_coordinates_and_values_as_torch_sparse_coo_tensor_reads_them():
    """``sparse_tensor((indices, values))`` with a value block per coordinate (a hybrid COO
    tensor, as ``torch.sparse_coo_tensor`` reads it): dense trailing levels, differentiable
    in the blocks; a bad index gets torch's named error."""
    idx = torch.tensor([[0, 2], [1, 0]])
    v = torch.arange(6.0, dtype=torch.float64).reshape(2, 3).requires_grad_()
    S = scorch.sparse_tensor((idx, v), size=(3, 2, 3))
    want = torch.sparse_coo_tensor(idx, v.detach(), (3, 2, 3)).to_dense()
    assert torch.equal(S.to_dense(), want) and S.requires_grad
    w = torch.arange(18.0, dtype=torch.float64).reshape(3, 2, 3)
    (S.to_dense() * w).sum().backward()
    assert torch.equal(v.grad, torch.stack([w[0, 1], w[2, 0]]))
    with pytest.raises(RuntimeError, match="index 5"):
        scorch.sparse_tensor((torch.tensor([[5], [0]]), torch.ones(1, 3)), size=(3, 2, 3))
