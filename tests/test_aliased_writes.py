"""Writes that no torch version counter sees, through memory a sparse operand shares: a
scipy matrix's numpy arrays (``from_scipy``, ``to_scipy``), the tensors given to torch's
sparse constructors, a ``to_torch`` result's ``values()``. What scorch keeps across calls
(a transpose's pattern and gathered values, an uncoalesced COO's canonical copy) must
follow them, as dense torch does (session 39, red-team findings R2.1-R2.4 and R1.1).

The kept conversions are reached through a product's gradient: from the second call on,
the gradient reads the operand's transpose through ``kept_conversions`` (``_warm``
checks that it did)."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import kept_conversions as kc
from scorch import tensor_cache
from scorch.gradients.pattern import same_pattern

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = dict(atol=1e-5, rtol=1e-5)


def _grad_through_transpose(A, k: int, dtype) -> torch.Tensor:
    """``y``'s gradient of ``sum(A @ y)``: ``A^T @ ones``, read through ``A``'s kept transpose."""
    y = torch.randn(A.shape[1], k, dtype=dtype, requires_grad=True)
    scorch.einsum("ij,jk->ik", A, y).sum().backward()
    return y.grad


def _expected(D: torch.Tensor, k: int) -> torch.Tensor:
    return D.t() @ torch.ones(D.shape[0], k, dtype=D.dtype)


def _warm(A, k: int, dtype) -> None:
    """Three gradients, the last two through the kept transpose."""
    before = kc.reformat_cache_info()
    for _ in range(3):
        _grad_through_transpose(A, k, dtype)
    after = kc.reformat_cache_info()
    assert after["hits"] + after["content_hits"] > before["hits"] + before["content_hits"], \
        "the gradient no longer reads a kept transpose: this test checks nothing"


def _scipy(n: int, density: float, fmt: str, dtype, seed: int):
    np_dtype = np.float32 if dtype == torch.float32 else np.float64
    m = sp.random(n, n, density=density, format=fmt, random_state=seed, dtype=np_dtype)
    m.data += 1     # (no stored zero: a doubled value then differs)
    m.sort_indices()
    return m


shapes = dict(n=st.integers(6, 30), density=st.floats(0.1, 0.5), fmt=st.sampled_from(["csr", "csc"]),
              dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2 ** 16))


# --- R2.1: scipy's arrays written in place --------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(**shapes, k=st.integers(1, 5))
def test_scipy_value_writes_reach_kept_transposes(n, density, fmt, dtype, seed, k):
    m = _scipy(n, density, fmt, dtype, seed)
    A = scorch.from_scipy(m)
    _warm(A, k, dtype)
    m.data *= 2     # a scipy user's in-place update: A shares the array
    D = torch.as_tensor(m.toarray())
    assert torch.equal(A.to_dense(), D)
    torch.testing.assert_close(_grad_through_transpose(A, k, dtype), _expected(D, k), **TOL)


@settings(max_examples=12, deadline=None)
@given(**shapes)
def test_scipy_index_writes_reach_kept_transposes(n, density, fmt, dtype, seed):
    m = _scipy(n, density, fmt, dtype, seed)
    A = scorch.from_scipy(m)
    _warm(A, 2, dtype)
    # a buffer refilled in place: each row keeps its count, its columns move (shifted by
    # one, wrapped, sorted again)
    for r in range(m.shape[0] if fmt == "csr" else m.shape[1]):
        lo, hi = m.indptr[r], m.indptr[r + 1]
        m.indices[lo:hi] = np.sort((m.indices[lo:hi] + 1) % n)
    D = torch.as_tensor(m.toarray())
    assert torch.equal(A.to_dense(), D)
    torch.testing.assert_close(_grad_through_transpose(A, 2, dtype), _expected(D, 2), **TOL)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_to_scipy_writes_reach_kept_transposes(fmt):
    torch.manual_seed(0)
    d = (torch.rand(30, 20) < 0.3) * torch.randn(30, 20)
    A = scorch.sparse_tensor(d, format=fmt)
    _warm(A, 3, torch.float32)
    s = A.to_scipy()
    s.data *= 2
    torch.testing.assert_close(_grad_through_transpose(A, 3, torch.float32), _expected(2 * d, 3), **TOL)


# --- R2.2 / R2.4: the tensors given to torch's sparse constructors ------------------------

def _torch_compressed(layout: str, D: torch.Tensor):
    """A torch CSR / CSC tensor over fresh arrays, and those arrays (which it aliases)."""
    src = D.to_sparse_csr() if layout == "csr" else D.to_sparse_csc()
    pos, crd = (src.crow_indices(), src.col_indices()) if layout == "csr" else \
        (src.ccol_indices(), src.row_indices())
    pos, crd, vals = pos.clone(), crd.clone(), src.values().clone()
    ctor = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
    return ctor(pos, crd, vals, D.shape), crd, vals


def _moved_pattern(D: torch.Tensor, layout: str) -> torch.Tensor:
    """``D``'s stored entries moved one place along the stored dimension (same counts per
    row / column), with new values."""
    dim = 1 if layout == "csr" else 0
    return torch.roll(D, 1, dims=dim) * 3 + torch.roll(D != 0, 1, dims=dim)


def _write(write: str, D: torch.Tensor, fmt: str, crd: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """Write through the constructor's tensors (the sparse tensor's version stays); the
    dense tensor it then holds."""
    if write == "values":
        vals.mul_(2)
        return 2 * D
    new = _moved_pattern(D, fmt)
    _, crd2, vals2 = _torch_compressed(fmt, new)
    crd.copy_(crd2)
    vals.copy_(vals2)
    return new


@settings(max_examples=12, deadline=None)
@given(**shapes, write=st.sampled_from(["values", "pattern"]))
def test_torch_constructor_writes_reach_kept_transposes(n, density, fmt, dtype, seed, write):
    g = torch.Generator().manual_seed(seed)
    D = (torch.rand(n, n, generator=g) < density) * (torch.rand(n, n, generator=g, dtype=dtype) + 1)
    S, crd, vals = _torch_compressed(fmt, D)
    A = scorch.sparse_tensor(S)                        # reads S's arrays as they are
    _warm(A, 2, dtype)
    new = _write(write, D, fmt, crd, vals)
    assert S._version == 0 and torch.equal(S.to_dense(), new) and torch.equal(A.to_dense(), new)
    torch.testing.assert_close(_grad_through_transpose(A, 2, dtype), _expected(new, 2), **TOL)


@pytest.mark.parametrize("write", ["values", "pattern"])
def test_torch_csr_operand_writes_reach_transposed_einsum(write):
    """R2.2 / R2.4's repros: a torch CSR operand itself, its transpose read by the forward
    product's plan, kept from the fourth call (3000 x 3000, 0.5 %). A seed per case: the
    kept transposes are matched by content, so the same matrix twice would hit the first
    case's."""
    g = torch.Generator().manual_seed(1 if write == "values" else 2)
    n = 3000
    D = (torch.rand(n, n, generator=g) < 0.005) * torch.randn(n, n, generator=g)
    S, crd, vals = _torch_compressed("csr", D)
    y = torch.randn(n, 8, generator=g)
    before = kc.reformat_cache_info()
    for _ in range(5):     # kept on the fourth call, read on the fifth
        scorch.einsum("ji,jk->ik", S, y)
    after = kc.reformat_cache_info()
    reused = lambda info: info["hits"] + info["content_hits"]  # noqa: E731
    assert reused(after) > reused(before), "no transpose kept: this test checks nothing"
    new = _write(write, D, "csr", crd, vals)
    got = scorch.einsum("ji,jk->ik", S, y)
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, new.t() @ y, atol=1e-4, rtol=1e-4)


# --- R2.3: an uncoalesced COO whose values are refreshed ------------------------------------

def test_uncoalesced_coo_values_refreshed():
    i = torch.tensor([[0, 0, 1, 2], [1, 1, 2, 0]])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    A = torch.sparse_coo_tensor(i, v, (3, 3))          # duplicates (FEM assembly); aliases v
    x = torch.ones(3)
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).to_dense(), A.to_dense() @ x)
    v.mul_(10)
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).to_dense(), torch.tensor([30.0, 30, 40]))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 8), nnz=st.integers(1, 30), seed=st.integers(0, 2 ** 16))
def test_uncoalesced_coo_assembly_loop(n, nnz, seed):
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(0, n, (2, nnz), generator=g)
    v = torch.randn(nnz, generator=g, dtype=torch.float64)
    A = torch.sparse_coo_tensor(i, v, (n, n))
    x = torch.randn(n, dtype=torch.float64, generator=g)
    for step in range(3):
        v.copy_(torch.randn(nnz, generator=g, dtype=torch.float64))   # the next assembly
        got = scorch.einsum("ij,j->i", A, x)
        torch.testing.assert_close(got.to_dense() if got.layout != torch.strided or
                                   isinstance(got, scorch.SparseTensor) else got,
                                   A.to_dense() @ x)


# --- R1.1: the version is read before the work it stamps ------------------------------------

def test_update_during_a_gather_is_not_taken_as_seen(monkeypatch):
    """Another thread's in-place update landing right after a gather (``index_select``
    releases the GIL), made certain here: the gather itself performs it once."""
    torch.manual_seed(0)
    d = (torch.rand(40, 30) < 0.3) * (torch.rand(40, 30) + 1)
    A = scorch.sparse_tensor(d, format="csr")
    _warm(A, 2, torch.float32)
    vals = A.values()
    with torch.no_grad():
        vals.mul_(2)                                   # the next call gathers anew ...
    real, armed = kc._gather, [True]

    def gather_then_update(values, perm):
        out = real(values, perm)
        if armed and values is vals:
            armed.clear()
            with torch.no_grad():
                vals.mul_(3)                           # ... and this update lands meanwhile
        return out
    monkeypatch.setattr(kc, "_gather", gather_then_update)
    _grad_through_transpose(A, 2, torch.float32)
    assert not armed
    torch.testing.assert_close(_grad_through_transpose(A, 2, torch.float32), _expected(6 * d, 2), **TOL)


# --- to_torch: a torch tensor over scorch's own arrays -------------------------------------

@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_to_torch_values_writes_reach_kept_transposes(fmt):
    torch.manual_seed(1)
    d = (torch.rand(30, 20) < 0.3) * (torch.rand(30, 20) + 1)
    A = scorch.sparse_tensor(d, format=fmt)
    _warm(A, 2, torch.float32)
    S = A.to_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = S._values() if S.layout == torch.sparse_coo else S.values()
    assert values.data_ptr() == A.values().data_ptr()
    values.mul_(2)                                     # moves S's version counter only
    del S, values
    torch.testing.assert_close(A.to_dense(), 2 * d)
    torch.testing.assert_close(_grad_through_transpose(A, 2, torch.float32), _expected(2 * d, 2), **TOL)


# --- what untracked memory still allows -----------------------------------------------------

def test_untracked_memory_follows_its_storage():
    t = torch.arange(10.0)
    view = t[2:5]
    assert tensor_cache.version(t) == tensor_cache.version(t)
    tensor_cache.untracked(view)                       # marks the memory, seen through any view
    assert tensor_cache.is_untracked(t) and tensor_cache.is_untracked(t[::2])
    assert tensor_cache.version(t) != tensor_cache.version(t)
    assert tensor_cache.counter(t) == tensor_cache.counter(t) == t._version
    key = id(t.untyped_storage())
    assert key in tensor_cache._UNTRACKED
    del t, view
    assert key not in tensor_cache._UNTRACKED          # gone with the memory
    assert not tensor_cache.is_untracked(torch.arange(10.0))


def test_same_pattern_of_untracked_arrays():
    """One pattern's storages stay the same pattern when its arrays are scipy's (an in-place
    op with a same-pattern operand runs on the values)."""
    m = _scipy(40, 0.2, "csr", torch.float32, 0)
    A = scorch.from_scipy(m)
    B = A * 2
    assert same_pattern(A._storage, B._storage)
    A.add_(B)
    torch.testing.assert_close(A.to_dense(), torch.as_tensor(m.toarray()))


def test_scipy_shared_operand_keeps_its_conversion():
    """The transpose of scipy's pattern is converted once and compared, not converted every
    call (the speed kept by the content comparison)."""
    m = _scipy(40, 0.2, "csr", torch.float32, 1)
    A = scorch.from_scipy(m)
    _warm(A, 2, torch.float32)
    before = kc.reformat_cache_info()
    for _ in range(3):
        _grad_through_transpose(A, 2, torch.float32)
    after = kc.reformat_cache_info()
    assert after["misses"] == before["misses"]
    assert after["content_hits"] == before["content_hits"] + 3


# --- R2.6: scorch's coordinate constructor copies the values --------------------------------

@pytest.mark.parametrize("fmt", ["coo", "csr", "csc"])
def test_coordinate_constructor_copies_values(fmt):
    i = torch.tensor([[0, 1, 2], [1, 2, 0]])
    v = torch.tensor([1.0, 2.0, 3.0])
    A = scorch.sparse_tensor((i, v), size=(3, 3), format=fmt)
    before = A.to_dense().clone()
    v.mul_(10)         # torch.sparse_coo_tensor's result would see this; scorch's copy does not
    assert torch.equal(A.to_dense(), before)


def test_untracked_values_are_gathered_again_only_after_a_write():
    """Values no version counter follows (a scipy matrix's) are compared with the copy
    they were gathered from: unchanged, the kept gather is reused; any changed bit
    (``-0.0`` for ``0.0`` too) gathers again."""
    arr = np.arange(1000, dtype=np.float32) - 500
    values = torch.from_numpy(arr)
    tensor_cache.untracked(values)
    perm = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    first = kc._gathered(values, perm)
    assert torch.equal(first, values[perm])
    assert kc._gathered(values, perm) is first            # unchanged: reused
    arr[7] = 1e6                                          # a write numpy makes, unseen by torch
    second = kc._gathered(values, perm)
    assert second is not first and torch.equal(second, values[perm])
    arr[500] = -0.0                                       # was 0.0: equal as numbers, not as bits
    third = kc._gathered(values, perm)
    assert third is not second and torch.equal(third.view(torch.int32), values[perm].view(torch.int32))
