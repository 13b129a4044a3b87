"""Where sparse results once differed from dense torch in result type, shape, ``out=``, in-place
forms and limits (session 30's adversarial sweep): each case against dense torch."""
import warnings

import pytest
import torch

import scorch

F64 = torch.float64


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _same(got, want):
    got = _dense(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_extremes_of_bool_tensors(fmt):
    b = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    B = scorch.sparse_tensor(b, format=fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no dense fallback
        for f in (lambda x: x.amax(), lambda x: x.amin(), lambda x: x.amax(1), lambda x: x.amin(0),
                  lambda x: x.max(), lambda x: x.min(), lambda x: x.max(1).values,
                  lambda x: x.min(0).values, lambda x: x.max(1).indices, lambda x: x.min(1).indices):
            _same(f(B), f(b))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_functions_keep_torchs_result_type(dtype):
    a = torch.tensor([[0, 2, 0], [3, 0, 5]]).to(dtype)
    A = scorch.sparse_tensor(a, format="csr")
    calls = [lambda x: x ** 2, lambda x: torch.pow(x, 2), lambda x: x.pow(2.0), lambda x: x ** 0.5,
             lambda x: torch.sign(x), lambda x: x.sgn(), lambda x: torch.square(x), lambda x: x ** 0]
    if dtype != torch.bool:
        calls += [lambda x: torch.abs(x), lambda x: torch.relu(x), lambda x: torch.sqrt(x)]
    for f in calls:
        _same(f(A), f(a))
    if dtype != torch.bool:                           # torch has no gelu of integers: neither here
        with pytest.raises(RuntimeError):
            torch.nn.functional.gelu(a)
        with pytest.raises(RuntimeError):
            torch.nn.functional.gelu(A)


def test_complex_values_are_computed_as_torch_or_refused():
    a = torch.tensor([[1j, 0], [0, 1 + 2j]], dtype=torch.complex64)
    A = scorch.sparse_tensor(a, format="coo")
    for f in (torch.exp, torch.cos, torch.sigmoid, torch.sin, torch.tanh, torch.abs):
        _same(f(A), f(a))
    with pytest.raises(RuntimeError, match="complex"):
        A.sum(0)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_arg_extremes_over_everything_keep_dims(fmt):
    a = torch.tensor([[0.0, 3.0, 0.0], [-1.0, 0.0, 2.0]])
    A = scorch.sparse_tensor(a, format=fmt)
    for f in (lambda x: x.argmax(keepdim=True), lambda x: torch.argmin(x, dim=None, keepdim=True),
              lambda x: x.argmax()):
        _same(f(A), f(a))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_in_place_division_with_a_rounding_mode(dtype):
    a = torch.tensor([[0, 5, 0], [-7, 0, 3]]).to(dtype)
    for mode in ("floor", "trunc"):
        for divisor in (2, torch.tensor(2), torch.tensor([1, 2, 3]).to(dtype)):
            A = scorch.sparse_tensor(a, format="csr")
            values = A._storage.values
            assert A.div_(divisor, rounding_mode=mode) is A
            _same(A, torch.div(a, divisor, rounding_mode=mode))
            assert A._storage.values is values          # the pattern kept, written in place


def test_in_place_ops_on_a_dense_tensor_with_a_sparse_operand():
    a = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    A = scorch.sparse_tensor(a, format="csr")
    for f in (lambda d, m: d.masked_fill_(m > 0, 1.0), lambda d, m: d.logical_and_(m),
              lambda d, m: d.__setitem__(m > 0, 0.0)):
        d, e = torch.full((2, 3), 5.0), torch.full((2, 3), 5.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # densified: the fallback's warning
            f(d, A)
        f(e, a)
        _same(d, e)
    with pytest.raises(RuntimeError, match="in-place"):
        A.sigmoid_()                                  # a sparse tensor written: still refused


def test_out_arguments_as_torch():
    a = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, -3.0]])
    d = torch.ones(2, 3)
    A = scorch.sparse_tensor(a, format="csr")
    calls = [lambda x, o: torch.add(x, d, out=o), lambda x, o: torch.sum(x, 0, out=o),
             lambda x, o: torch.amax(x, 1, out=o), lambda x, o: torch.exp(x, out=o),
             lambda x, o: torch.mul(x, 2, out=o), lambda x, o: torch.cat([x, x], out=o),
             lambda x, o: torch.gt(x, 0, out=o)]
    for f in calls:
        want = torch.empty(0, dtype=torch.bool if f is calls[-1] else torch.float32)
        got = torch.empty(0, dtype=want.dtype)
        assert f(A, got) is got
        f(a, want)
        _same(got, want)
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    r = torch.max(A, 1, out=(values, indices))
    assert type(r) is torch.return_types.max and r.values is values
    _same(values, a.max(1).values)
    O = scorch.sparse_tensor(torch.zeros(2, 3), format="csc")
    assert torch.mul(A, 2, out=O) is O
    _same(O, a * 2)
    assert O.format == scorch.as_format("csc", 2)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.exp(A, out=torch.empty(2, 3, dtype=torch.long))
    R = scorch.sparse_tensor(a, format="csr").requires_grad_()
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        torch.exp(R, out=torch.empty(0))


def test_a_scalar_added_to_a_huge_sparse_matrix_is_bounded():
    """``A + 1`` is dense by nature: the dense limit applies (a 2M x 2M result would be 16 TB);
    ``A + D`` with D of the result's size is the user's own size and runs."""
    n = 2_000_000
    idx = torch.randint(0, n, (2, 1000))
    A = scorch.sparse_tensor((idx, torch.rand(1000)), size=(n, n), format="csr")
    for f in (lambda: A + 1, lambda: 1 - A, lambda: A - 0.5, lambda: A + torch.ones(n),
              lambda: torch.add(A, torch.tensor(1.0))):
        with pytest.raises(scorch.DenseFallbackError, match="dense by nature"):
            f()
    small = scorch.sparse_tensor(torch.eye(3), format="csr")
    _same(small + torch.ones(3, 3), torch.eye(3) + 1)


def test_sum_over_size_one_dims_is_a_squeeze():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, 4, generator=g) * (torch.rand(5, 4, generator=g) < 0.4)
    A = scorch.sparse_tensor(a, format="csr")
    for f in (lambda x: x.unsqueeze(1).sum(1), lambda x: x.unsqueeze(0).sum(0),
              lambda x: x.unsqueeze(1).sum((1, 2)), lambda x: x.unsqueeze(0).sum(0, keepdim=True),
              lambda x: x.unsqueeze(2).sum((0, 2))):
        _same(f(A), f(a))
    r = A.unsqueeze(1).sum(1)
    assert r._storage.values.data_ptr() != A._storage.values.data_ptr()   # a new tensor
    ai = torch.tensor([[1, 0, 2]], dtype=torch.int32)
    _same(scorch.sparse_tensor(ai, format="csr").sum(0), ai.sum(0))   # int64, as torch


def test_count_nonzero_along_a_dim_is_dense():
    a = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    A = scorch.sparse_tensor(a, format="csr")
    for d in (0, 1):
        r = torch.count_nonzero(A, d)
        assert type(r) is torch.Tensor
        _same(r, torch.count_nonzero(a, d))


def test_unsupported_dtypes_say_what_to_do():
    A = scorch.sparse_tensor(torch.eye(3).half(), format="csr")
    with pytest.raises(RuntimeError, match=r"float16.*\.float\(\)"):
        A @ torch.ones(3, 2, dtype=torch.float16)
    # API.md: an unsupported dtype is a ValueError naming the operand; torch's own
    # "not implemented for 'Half'" is a RuntimeError: it is both, exported by name
    B = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(scorch.UnsupportedDtypeError, match=r"operand 1 is complex64") as e:
        torch.einsum("ij,jk->ik", B, torch.ones(3, 2, dtype=torch.complex64))
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    assert "operand 0" not in str(e.value)


@pytest.mark.parametrize("block", [(2, 2), (2, 3), (1, 3)])
def test_blocked_tensors_transpose_as_torch(block):
    """BSR ``.t()`` is BSC (as torch's): a conversion, since blocks are stored row-major."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g, dtype=F64)
    a = a * (torch.rand(6 // block[0], 6 // block[1], generator=g) < 0.5).repeat_interleave(
        block[0], 0).repeat_interleave(block[1], 1)
    B = scorch.sparse_tensor(a, format=scorch.Format("dc", block=block))
    for f in (lambda x: x.t(), lambda x: x.T, lambda x: x.transpose(0, 1), lambda x: x.permute(1, 0),
              lambda x: x.mT, lambda x: x.transpose(1, 1)):
        r = f(B)
        _same(r, f(a))
    assert B.t().format.block == (block[1], block[0])
    assert B.permute(0, 1) is B
    X = torch.randn(6, 3, dtype=F64, generator=g)
    _same(B.t() @ X, a.t() @ X)
    W = scorch.sparse_tensor(a, format=scorch.Format("dc", block=block)).requires_grad_()
    (W.t() @ X).sum().backward()
    torch.testing.assert_close(W.grad.to_dense(), (torch.ones(6, 3, dtype=F64) @ X.t()).t() * (a != 0))


def test_subtracting_bool_tensors_raises_as_torch():
    A = scorch.sparse_tensor(torch.eye(2), format="csr")
    for f in (lambda: A - True, lambda: True - A, lambda: A - torch.ones(2, 2, dtype=torch.bool)):
        with pytest.raises(RuntimeError, match="Subtraction.*bool"):
            f()


def test_assigning_data():
    """``p.data = value`` (``vector_to_parameters``, EMA copies) swaps a sparse tensor's
    contents (it was silently ignored)."""
    w = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=F64)
    p = torch.nn.Parameter(scorch.sparse_tensor(w, format="csr"))
    p.data = scorch.sparse_tensor(w * 5, format="coo")
    assert isinstance(p, torch.nn.Parameter) and p.format == scorch.as_format("csr", 2)
    _same(p.detach(), w * 5)
    p.data = torch.full((2, 3), 7.0, dtype=F64)
    _same(p.detach(), torch.full((2, 3), 7.0, dtype=F64))
    lin = torch.nn.Linear(3, 2).double()
    lin.weight = torch.nn.Parameter(scorch.sparse_tensor(w, format="csr"))
    vec = torch.nn.utils.parameters_to_vector(lin.parameters())
    torch.nn.utils.vector_to_parameters(vec * 2, lin.parameters())
    _same(lin.weight.detach(), w * 2)
    with pytest.raises(RuntimeError, match="shape"):
        p.data = torch.ones(3, 3, dtype=F64)


def test_embedding_arguments_as_torch():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 4, generator=g) * (torch.rand(5, 4, generator=g) < 0.5)
    W = scorch.sparse_tensor(w, format="csr")
    F = torch.nn.functional
    with pytest.raises(IndexError, match="out of range"):
        F.embedding(torch.tensor([0, -1]), W)
    with pytest.raises(RuntimeError, match="idx >= 0"):
        F.embedding_bag(torch.tensor([0, -1]), W, torch.tensor([0]))
    idx = torch.tensor([0, 2, 4, 1, 3, 3])
    # (a last offset short of the input's length is invalid input on which torch's own
    # kernels disagree by mode and dtype: not compared)
    for offsets, mode in [([0, 2, 6], "sum"), ([0, 2, 6], "mean"), ([0, 6], "max"), ([0, 3, 6], "max")]:
        o = torch.tensor(offsets)
        _same(F.embedding_bag(idx, W, o, mode=mode, include_last_offset=True),
              F.embedding_bag(idx, w, o, mode=mode, include_last_offset=True))
    for offsets, message in [([1, 3], "offsets\\[0\\] has to be 0"), ([0, 2, 9], "can not be greater")]:
        with pytest.raises(RuntimeError, match=message):
            F.embedding_bag(idx, W, torch.tensor(offsets))
    with pytest.raises(NotImplementedError):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.embedding_bag(idx, W, torch.tensor([0, 3]), mode="mean",
                            per_sample_weights=torch.ones(6))


# --- session 31's sweep: argument checks, call forms, bool scalar indices -----------------------

def _both_raise(fn, x, X, exc):
    with pytest.raises(exc):
        fn(x)
    with pytest.raises(exc):
        fn(X)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_dims_out_of_range_or_repeated_raise_as_torch(fmt):
    x = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 4.0], [5.0, 0.0, 0.0, 6.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format=fmt)
    for fn in (lambda t: t.narrow(2, 0, 1), lambda t: t.narrow(-3, 0, 1), lambda t: t.flip(2),
               lambda t: t.roll(1, 2), lambda t: t.diagonal(0, 0, -3), lambda t: t.prod(2),
               lambda t: t.diff(dim=2), lambda t: t.gather(2, torch.zeros(1, 1, dtype=torch.long)),
               lambda t: torch.linalg.vector_norm(t, dim=5)):
        _both_raise(fn, x, X, IndexError)
    _both_raise(lambda t: t.flip((0, 0)), x, X, RuntimeError)
    _both_raise(lambda t: t.roll((1, 2), (0,)), x, X, RuntimeError)
    _both_raise(lambda t: t.index_select(1, torch.tensor([-1])), x, X, (IndexError, RuntimeError))
    _same(X.flip(0, 1), x.flip(0, 1))                          # dims as separate arguments
    _same(X.flip(dims=(1,)), x.flip(dims=(1,)))


def test_where_keyword_forms():
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr")
    c = x > 1
    y = torch.zeros((), dtype=F64)
    _same(torch.where(condition=c, input=X, other=y), torch.where(condition=c, input=x, other=y))
    _same(X.where(c, other=y), x.where(c, other=y))
    _same(torch.where(c, X, other=y), torch.where(c, x, other=y))


@pytest.mark.parametrize("index", [True, False, torch.tensor(True), torch.tensor(False),
                                   (None, True), (0, True, slice(1, 3)), (Ellipsis, False),
                                   (slice(None), False, 1)])
def test_bool_scalar_indices(index):
    x = torch.arange(24.0, dtype=F64).reshape(2, 3, 4)
    x[x.remainder(3) == 0] = 0
    _same(scorch.sparse_tensor(x, format="coo")[index], x[index])


def test_bucketize_and_searchsorted_keep_the_pattern_where_zero_finds_zero():
    x = torch.tensor([[0.0, 1.5, 0.0], [3.5, 0.0, -1.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr")
    bounds = torch.tensor([-2.0, 1.0, 3.0], dtype=F64)     # 0 lies in bucket 1: dense by nature
    low = torch.tensor([0.0, 1.0, 3.0], dtype=F64)          # 0 finds position 0: the pattern
    for b in (bounds, low):
        for right in (False, True):
            got = torch.bucketize(X, b, right=right)
            _same(got, torch.bucketize(x, b, right=right))
            _same(torch.searchsorted(b, X, right=right), torch.searchsorted(b, x, right=right))
    kept = torch.bucketize(X, low)
    assert isinstance(kept, scorch.SparseTensor) and kept.nnz == X.nnz
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # no dense fallback on a big one
        n = 100_000
        idx = torch.randint(0, n, (2, 1000), generator=torch.Generator().manual_seed(0))
        big = scorch.sparse_tensor((idx, torch.rand(1000, dtype=F64) + 0.5), size=(n, n), format="csr")
        assert torch.bucketize(big, low).nnz == big.nnz


def test_out_of_range_write_errors_name_the_index_and_dim():
    X = scorch.sparse_tensor(torch.eye(3, 4, dtype=F64), format="csr")
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        X.index_copy(0, torch.tensor([3]), torch.zeros(1, 4, dtype=F64))
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"):
        X.index_fill(1, torch.tensor([4]), 0.0)
    with pytest.raises(IndexError, match="index 12 on a tensor of 12 elements"):
        X.put(torch.tensor([12]), torch.zeros(1, dtype=F64))
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 1 with size 4"):
        X[[0], [7]] = 0.0
    with pytest.raises(RuntimeError, match="format csr and shape"):
        X.ccol_indices()


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "dcsr"])
def test_einsum_sums_one_integer_operand_in_int64(fmt):
    """torch.einsum sums a lone integer or bool operand as ``sum`` does, in int64; a
    diagonal or a transpose keeps the dtype."""
    x = torch.full((3, 4), 100, dtype=torch.int8)
    x[2, 2] = 0
    X = scorch.sparse_tensor(x, format=fmt)
    for eq in ("ij->j", "ij->", "ij->i", "ij->ji"):
        _same(scorch.einsum(eq, X), torch.einsum(eq, x))
    b = x > 50
    _same(scorch.einsum("ij->j", scorch.sparse_tensor(b, format=fmt)), torch.einsum("ij->j", b))
    sq = torch.full((3, 3), 100, dtype=torch.int8)
    _same(scorch.einsum("ii->i", scorch.sparse_tensor(sq, format=fmt)), torch.einsum("ii->i", sq))
    _same(scorch.einsum("ii->", scorch.sparse_tensor(sq, format=fmt)), torch.einsum("ii->", sq))


def test_torch_sparse_destinations_take_a_scorch_source():
    y = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    S = scorch.sparse_tensor(y, format="csr")
    for dest in (torch.zeros(2, 3).to_sparse(), y.to_sparse_csr() * 0, y.to_sparse_csc() * 0):
        dest.copy_(S)
        assert torch.equal(dest.to_dense(), y)
    out = torch.zeros(2, 3).to_sparse()
    torch.add(S, S, out=out)
    assert torch.equal(out.to_dense(), 2 * y)
    assert S.to_sparse(sparse_dim=2).format == scorch.as_format("coo", 2)


@pytest.mark.parametrize("fmt", ["coo", "csf"])
def test_index_tensors_of_two_or_more_dims(fmt):
    """A batch of lookups, ``S[idx2d]``: the index's dims where torch puts a lone index
    tensor's; writes through the same index; the gradient on the pattern."""
    x = torch.arange(60.0, dtype=F64).reshape(3, 4, 5)
    x[x.remainder(4) == 0] = 0
    i2 = torch.tensor([[0, 2], [1, 1], [2, 0]])
    j2 = torch.tensor([[3, -1], [0, 2]])
    for index in [(i2,), (slice(None), j2), (Ellipsis, torch.tensor([[4, 0]])), (None, i2),
                  (slice(1, 3), j2, slice(None, None, 2)), (i2, Ellipsis)]:
        _same(scorch.sparse_tensor(x, format=fmt)[index], x[index])
        X, want = scorch.sparse_tensor(x, format=fmt), x.clone()
        X[index] = 0.0
        want[index] = 0.0
        _same(X, want)
    X = scorch.sparse_tensor(x, format=fmt, requires_grad=True)
    X[:, j2].to_dense().sum().backward()
    d = x.clone().requires_grad_()
    d[:, j2].sum().backward()
    _same(X.grad, d.grad * (x != 0))
    # beside ints and other index tensors (``S[rows[:, None], cols]``), broadcast together
    rows, cols = torch.tensor([2, 0, 2])[:, None], torch.tensor([1, 3])
    for index in [(0, j2), (i2, 3), (rows, cols), (rows, cols, 4), (rows, 1, cols),
                  (slice(None), rows, cols), (rows, slice(None), cols), (None, rows, cols),
                  (i2, 2, j2[:1])]:
        _same(scorch.sparse_tensor(x, format=fmt)[index], x[index])
        X, want = scorch.sparse_tensor(x, format=fmt), x.clone()
        X[index] = 0.0
        want[index] = 0.0
        _same(X, want)
    with pytest.raises(IndexError, match="broadcast"):
        scorch.sparse_tensor(x, format=fmt)[i2, torch.tensor([[0, 1, 2]])]
    with pytest.raises(IndexError, match="bool masks"):
        scorch.sparse_tensor(x, format=fmt)[i2, torch.ones(4, dtype=torch.bool)]


def test_numpy_and_list_forms_name_what_to_call():
    """``.numpy()``, ``.tolist()`` and ``np.asarray`` of a sparse tensor refuse (as torch's
    sparse layouts do) with a message naming the dense and scipy conversions."""
    import numpy as np
    S = scorch.sparse_tensor(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), format="csr")
    for call in (S.numpy, S.tolist, lambda: np.asarray(S), lambda: S.sum(0).numpy()):
        with pytest.raises(RuntimeError, match=r"to_dense\(\)\.numpy\(\).*to_scipy"):
            call()
    assert S.to_dense().tolist() == [[0.0, 1.0], [2.0, 0.0]]


def test_embedding_max_norm_renormalizes_stored_rows():
    """``F.embedding(..., max_norm=)`` with a sparse table scales each looked-up row whose
    norm exceeds ``max_norm`` in place (its stored values), as torch does to a dense table;
    it had taken the dense fallback (``embedding_renorm_``)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(10, 6, dtype=F64, generator=g) * (torch.rand(10, 6, generator=g) < 0.5) * 3
    idx = torch.tensor([[1, 4, 4], [7, 0, 9]])
    for norm_type in (2.0, 1.0):
        S, d = scorch.sparse_tensor(w, format="csr"), w.clone()
        scorch.set_dense_fallback_limit(0)
        try:
            got = torch.nn.functional.embedding(idx, S, max_norm=1.0, norm_type=norm_type)
        finally:
            scorch.set_dense_fallback_limit(None)
        want = torch.nn.functional.embedding(idx, d, max_norm=1.0, norm_type=norm_type)
        _same(got, want)
        _same(S, d)


def test_operators_on_dtypes_without_kernels_raise_not_compare_identity():
    """``==`` / ``!=`` / ``+`` on float16, bfloat16 or complex computations raise the
    dtype error, a RuntimeError as torch's: raised as a TypeError, torch's operators had
    read it as "not implemented" and Python compared the objects (``s16 != 0``: ``True``)."""
    x = torch.tensor([[1.0, 0, 2], [0, 0, 3]])
    S = scorch.sparse_tensor(x, format="csr")
    h = S.half()
    for call in (lambda: h != 0, lambda: h == h, lambda: S.int() != x.half(),
                 lambda: S == x.to(torch.complex64), lambda: 2.5 + h):
        with pytest.raises(RuntimeError, match=r"\.float\(\)"):
            call()
    with pytest.raises(RuntimeError, match=r"float16.*\.float\(\)"):
        torch.ne(h, torch.ones(2, 3, dtype=torch.float16))


def test_explicit_dtypes_complex_norms_and_zero_dim_exponents():
    """``sum(dim, dtype=int32)`` / ``prod(dtype=int16)`` return the asked dtype (they came
    back int64); norms of complex values are the moduli's (they were refused); a 0-d
    tensor exponent follows torch's type promotion (``bool ** tensor(3, uint8)`` is
    uint8) and an integer base to a negative 0-d power is computed, as torch does."""
    x = torch.tensor([[1, 0, 2], [0, -1, 3]], dtype=torch.int32)
    for fmt in ("csr", "coo", "csc"):
        S = scorch.sparse_tensor(x, format=fmt)
        for dim in (0, 1):
            for dt in (torch.int32, torch.int16, torch.int8):
                got, want = S.sum(dim, dtype=dt), x.sum(dim, dtype=dt)
                got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
                assert got.dtype == want.dtype and torch.equal(got, want)
        for dt in (torch.int16, torch.int32):
            assert S.prod(dtype=dt).dtype == dt and S.prod(dtype=dt) == x.prod(dtype=dt)
    c = torch.tensor([[1 + 1j, 0], [0, 2 - 1j]], dtype=torch.complex64)
    C = scorch.sparse_tensor(c, format="coo")
    assert torch.allclose(torch.linalg.vector_norm(C), torch.linalg.vector_norm(c))
    assert torch.allclose(torch.linalg.vector_norm(C, dim=1), torch.linalg.vector_norm(c, dim=1))
    b = torch.tensor([[True, False], [False, True]])
    for e in (torch.tensor(3, dtype=torch.uint8), torch.tensor(2, dtype=torch.int8)):
        got = scorch.sparse_tensor(b, format="csr") ** e
        assert got.dtype == (b ** e).dtype
    i8 = torch.tensor([[1, 0, -1], [0, 0, 0]], dtype=torch.int8)
    _same(scorch.sparse_tensor(i8, format="csr") ** torch.tensor(-1, dtype=torch.int8),
          i8 ** torch.tensor(-1, dtype=torch.int8))


def test_bool_einsum():
    """einsum over bool operands (a sparse one among them): products as 0/1, a contraction
    as an OR of ANDs, the result bool, as torch's bool einsum where torch has one (it had
    raised on the kernels' missing bool type)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(4, 4, generator=g) > 0.5, torch.rand(4, 4, generator=g) > 0.5
    v = torch.rand(4, generator=g) > 0.5
    A, B = scorch.sparse_tensor(a, format="csr"), scorch.sparse_tensor(b, format="coo")
    V = scorch.sparse_tensor(v, format="coo")
    for eq, ops, dense in [("ij,ij->ij", (A, B), (a, b)), ("ij,ij->ij", (A, b), (a, b)),
                           ("i,j->ij", (V, v), (v, v)), ("ij->ji", (A,), (a,)),
                           ("ii->i", (A,), (a,))]:
        _same(scorch.einsum(eq, *ops), torch.einsum(eq, *dense))
    _same(scorch.einsum("ij,jk->ik", A, B), (a.int() @ b.int()) != 0)
    _same(torch.outer(V, v), torch.outer(v, v))


def test_indices_are_kept_with_the_pattern():
    """``A.indices()`` is built once per pattern (a loop calling it had rebuilt the int64
    array every time); writing into the returned tensor makes the next call rebuild it,
    so the tensor's own coordinates never change."""
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    A = scorch.sparse_tensor(x, format="coo")
    first = A.indices()
    assert A.indices() is first
    assert torch.equal(first, x.to_sparse().indices())
    first[0, 0] = 1
    again = A.indices()
    assert again is not first and torch.equal(again, x.to_sparse().indices())
    _same(A, x)


def test_torch_func_transforms_say_they_are_unsupported():
    """``vmap``, ``grad`` and ``jacrev`` over a function using a sparse tensor raise a
    NotImplementedError naming what to use (they failed deep in torch: "Cannot access data
    pointer", "must override the setup_context staticmethod")."""
    A = scorch.sparse_tensor(torch.eye(4) * 2, format="csr")
    xs = torch.randn(3, 4)
    for call in (lambda: torch.func.vmap(lambda x: A @ x)(xs),
                 lambda: torch.func.grad(lambda x: (A @ x).sum())(xs[0]),
                 lambda: torch.func.jacrev(lambda x: A @ x)(xs[0])):
        with pytest.raises(NotImplementedError, match="torch.autograd.functional.jacobian"):
            call()
    J = torch.autograd.functional.jacobian(lambda x: A @ x, xs[0])
    assert torch.equal(J, torch.eye(4) * 2)
