"""Python-level Tensor protocol on scorch sparse tensors (``scorch/sparse_ops/protocol.py``)
and the keyword / dtype conventions torch's argument parser and autocast give dense tensors:
each compared with dense torch, or a clear refusal where a sparse tensor has no such thing
(one block of memory)."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch import _dispatch


def _dense():
    d = torch.zeros(4, 5)
    d[0, 1], d[1, 3], d[2, 0] = 1.5, -2.0, 3.0
    return d


def _sparse(d=None, fmt="csr"):
    return scorch.sparse_tensor(_dense() if d is None else d, format=fmt)


def _as_dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


@pytest.fixture
def no_dense_fallback():
    """Any dense copy of a sparse operand (the fallback) raises inside the test."""
    old = _dispatch.get_dense_fallback_limit()
    _dispatch.set_dense_fallback_limit(0)
    yield
    _dispatch.set_dense_fallback_limit(old)


# --- memory-level accessors: refused by name ------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda A: torch.from_dlpack(A),           # segfaulted (data_ptr 0)
    lambda A: np.from_dlpack(A),              # returned garbage
    lambda A: A.storage(),
    lambda A: A.untyped_storage(),            # torch's internal "data is not allocated" message
], ids=["torch.from_dlpack", "np.from_dlpack", "storage", "untyped_storage"])
def test_memory_accessors_refuse_naming_to_dense(call, no_dense_fallback):
    A = _sparse()
    with pytest.raises(RuntimeError, match=r"no single dense memory block.*\.to_dense\(\)"):
        call(A)


def test_apply_refuses_and_leaves_the_tensor(no_dense_fallback):
    A = _sparse()
    with pytest.raises(RuntimeError, match=r"apply_ is not supported.*\.to_dense\(\)\.apply_"):
        A.apply_(lambda x: x * 2)                 # segfaulted
    assert torch.equal(A.to_dense(), _dense())
    A.values().apply_(lambda x: x * 2)          # the way the message names (f(0) == 0)
    assert torch.equal(A.to_dense(), _dense().apply_(lambda x: x * 2))


def test_data_ptr_is_the_values_address():
    """It was 0 for every sparse tensor (all looked like aliases of each other); torch's
    ``allow_mutation_on_saved_tensors`` reads it, so it answers: the stored values' address."""
    A, B = _sparse(), _sparse()
    assert A.data_ptr() == A._storage.values.data_ptr() != 0
    assert A.data_ptr() != B.data_ptr()
    assert A.t().data_ptr() == A.data_ptr()          # a view shares the values


def test_copies_and_pickling_still_work():
    A = _sparse()
    for B in (copy.deepcopy(A), pickle.loads(pickle.dumps(A))):
        assert isinstance(B, scorch.SparseTensor) and torch.equal(B.to_dense(), _dense())
    buf = io.BytesIO()
    torch.save(A, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=False).to_dense(), _dense())


# --- type_as: a cast, not a dense copy ------------------------------------------------------

def test_type_as_stays_sparse(no_dense_fallback):
    A = _sparse()
    r = A.type_as(torch.zeros(1, dtype=torch.float64))
    assert isinstance(r, scorch.SparseTensor) and r.dtype == torch.float64
    assert torch.equal(r.to_dense(), _dense().double())
    assert A.type_as(torch.zeros(1)) is A          # torch's: no-op on the same type
    n = 200_000                                     # was a 149 GiB dense allocation
    idx = torch.stack([torch.arange(n), (torch.arange(n) * 7) % n])
    B = scorch.sparse_tensor((idx, torch.ones(n)), size=(n, n), format="csr")
    C = B.type_as(torch.zeros(1, dtype=torch.float64))
    assert isinstance(C, scorch.SparseTensor) and C.dtype == torch.float64 and C.nnz == n


def test_type_as_keeps_the_gradient_on_the_pattern():
    A = scorch.sparse_tensor(_dense(), format="csr", requires_grad=True)
    A.type_as(torch.zeros(1, dtype=torch.float64)).to_dense().sum().backward()
    assert A.grad.dtype == torch.float32 and A.grad.nnz == A.nnz


# --- numpy's keyword aliases ------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda X: X.sum(axis=0), lambda X: torch.sum(X, axis=1), lambda X: X.mean(axis=0),
    lambda X: X.amax(axis=1), lambda X: X.sum(0, keepdims=True), lambda X: X.std(axis=0),
    lambda X: X.argmax(axis=1), lambda X: X.any(axis=1), lambda X: torch.count_nonzero(X, axis=1),
    lambda X: X[None].squeeze(axis=0), lambda X: X.prod(axis=1), lambda X: X.var(axis=0, keepdims=True),
    lambda X: X.cumsum(axis=0), lambda X: X.max(axis=1).values, lambda X: X.unsqueeze(axis=0),
])
def test_numpy_keyword_aliases_as_dense(call):
    want = call(_dense())
    got = _as_dense(call(_sparse()))
    assert got.dtype == want.dtype and torch.allclose(got, want, equal_nan=True)


def test_alias_with_its_torch_name_is_refused():
    with pytest.raises(TypeError, match="'dim' and its numpy alias 'axis'"):
        _sparse().sum(dim=0, axis=0)


# --- reversed, in ---------------------------------------------------------------------------

def test_reversed_is_the_sparse_flip(no_dense_fallback):
    A = _sparse()
    r = reversed(A)
    assert isinstance(r, scorch.SparseTensor)          # a tensor, as torch's (not an iterator)
    rows = list(r)
    assert all(isinstance(x, scorch.SparseTensor) for x in rows)
    assert torch.equal(torch.stack([x.to_dense() for x in rows]), _dense().flip(0))


def test_contains_as_dense_without_a_dense_copy(no_dense_fallback):
    d = _dense()
    A = _sparse(d)
    for v in (1.5, -2, 3.0, 0, 0.0, 7.0, float("nan"), torch.tensor(1.5), torch.tensor(4.0)):
        assert (v in A) == (v in d), v
    full = torch.tensor([[1.0, 2.0], [3.0, 4.0]])        # every position stored: no 0 in it
    assert (0 in scorch.sparse_tensor(full, format="coo")) is False
    assert (0 in full) is False
    B = scorch.sparse_tensor(torch.tensor([True, False, False]), format="c")
    assert (True in B) and (False in B) and not (True in scorch.sparse_tensor(torch.zeros(3, dtype=torch.bool)))


def test_contains_a_row_and_refuses_other_objects():
    d, A = _dense(), _sparse()
    assert (torch.tensor([0.0, 1.5, 0.0, 0.0, 0.0]) in A) == (torch.tensor([0.0, 1.5, 0.0, 0.0, 0.0]) in d)
    assert (torch.tensor([9.0, 9.0, 9.0, 9.0, 9.0]) in A) == (torch.tensor([9.0] * 5) in d) is False
    with pytest.raises(RuntimeError, match="only supports Tensor or scalar"):
        "x" in A


# --- numpy index arrays --------------------------------------------------------------------

_NUMPY_INDICES = [np.array([0, 2]), np.array([0, 2], dtype=np.int32),
                  np.array([True, False, True, False]), (slice(None), np.array([4, 1])),
                  (np.array([0, 1]), np.array([1, 3]))]


@pytest.mark.parametrize("index", _NUMPY_INDICES, ids=range(len(_NUMPY_INDICES)))
def test_numpy_index_arrays_read_as_dense(index):
    want = _dense()[index]
    assert torch.equal(_as_dense(_sparse()[index]), want)


@pytest.mark.parametrize("index, value", [(i, 0.0) for i in _NUMPY_INDICES]
                         + [((np.array([0, 1, 2]), np.array([1, 3, 0])), 7.0)])
def test_numpy_index_arrays_write_as_dense(index, value):
    """(A write keeps the pattern: zeros anywhere, other values at stored positions.)"""
    A, d = _sparse(), _dense()
    A[index] = value
    d[index] = value
    assert torch.equal(A.to_dense(), d)


# --- rms_norm's default eps ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_half_default_eps_as_dense(dtype):
    x = torch.tensor([[0.05, 0.0, -0.2, 0.0, 0.0, 0.1, 0.0, 0.0],
                      [1.0, 0.0, -2.0, 0.0, 3.0, 0.0, 0.0, 0.5]]).to(dtype)
    S = scorch.sparse_tensor(x, format="csr")
    got = F.rms_norm(S, (8,)).to_dense()
    assert got.dtype == dtype and torch.allclose(got.double(), F.rms_norm(x, (8,)).double(), atol=1e-2)
    m = torch.nn.RMSNorm(8).to(dtype)
    assert torch.allclose(m(S).to_dense().double(), m(x).double(), atol=1e-2)


# --- CPU autocast: the dtype dense torch gives there --------------------------------------

def _autocast_operands():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 8, generator=g) * (torch.rand(8, 8, generator=g) < 0.3)
    return a, scorch.sparse_tensor(a, format="csr"), torch.randn(8, 3, generator=g), torch.randn(8, generator=g)


@pytest.mark.parametrize("name, call", [
    ("einsum spmm", lambda M, x, v: torch.einsum("ij,jk->ik", M, x)),
    ("einsum sddmm", lambda M, x, v: torch.einsum("ij,ik,jk->ij", M, x, x)),
    ("einsum sum", lambda M, x, v: torch.einsum("ij->j", M)),                  # no bmm: float32
    ("einsum mul", lambda M, x, v: torch.einsum("ij,ij->ij", M, M)),
    ("einsum then promoted", lambda M, x, v: torch.einsum("ij,j,k->ik", M, v, v)),
    ("einsum sublist", lambda M, x, v: torch.einsum(M, [0, 1], v, [1], [0])),
    ("mv", lambda M, x, v: torch.mv(M, v)),                                   # not on the list
    ("addmv", lambda M, x, v: torch.addmv(torch.zeros(8), M, v)),
    ("mm", lambda M, x, v: torch.mm(M, x)),
    ("matmul vec", lambda M, x, v: M @ v),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_products_in_cpu_autocast_have_dense_dtypes(name, call, dtype):
    a, A, x, v = _autocast_operands()
    with torch.autocast("cpu", dtype=dtype):
        want, got = call(a, x, v), _as_dense(call(A, x, v))
    assert got.dtype == want.dtype, name
    assert torch.allclose(got.double(), want.double(), atol=5e-2, rtol=2e-2)


# --- torch.sparse.sum(dtype=) -----------------------------------------------------------------

@pytest.mark.parametrize("args", [(), (1,), (0,), ((0, 1),)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.float64])
def test_sparse_sum_dtype_as_asked(args, dtype):
    """The dtype asked for, as torch.sparse.sum's full and 2-D COO reductions and dense
    ``sum`` give it (einsum's int64 accumulation had leaked out)."""
    d = torch.tensor([[3.0, 0.0, 5.0], [0.0, 0.0, 7.0]])
    got = torch.sparse.sum(scorch.sparse_tensor(d, format="csr"), *args, dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(_as_dense(got), d.sum(*args, dtype=dtype))
    if not args:
        assert torch.sparse.sum(d.to_sparse(), dtype=dtype).dtype == dtype
