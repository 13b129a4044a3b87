"""Elementwise add/sub/mul, division by a scalar, neg, the operators and the in-place forms on
sparse operands against dense torch, with torch's broadcasting and format inference (a
product with a sparse operand is sparse, a sum is sparse only when both terms are)."""
import operator

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import assert_matches, dense_values, side, sparse

FAST = settings(max_examples=30, deadline=None)

OPS = {
    "add": (operator.add, torch.add),
    "sub": (operator.sub, torch.sub),
    "mul": (operator.mul, torch.mul),
}
# (format of a, format of b); None = dense
PAIRS = [("csr", "csr"), ("coo", "dcsc"), ("csr", None), (None, "coo")]


def _operand(x, fmt):
    return x if fmt is None else sparse(x, fmt)


@FAST
@given(st.data(), st.sampled_from(sorted(OPS)), st.sampled_from(PAIRS))
def test_binary_same_shape(data, op, pair):
    m, n = data.draw(side()), data.draw(side())
    a = data.draw(dense_values((m, n)))
    b = data.draw(dense_values((m, n)))
    A, B = _operand(a, pair[0]), _operand(b, pair[1])
    both = pair[0] is not None and pair[1] is not None
    is_sparse = both or op == "mul"
    py, fn = OPS[op]
    assert_matches(py(A, B), py(a, b), sparse=is_sparse)
    assert_matches(fn(A, B), fn(a, b), sparse=is_sparse)
    if op != "mul" and pair == ("csr", "csr"):
        assert_matches(fn(A, B, alpha=2.5), fn(a, b, alpha=2.5), sparse=is_sparse)


@settings(max_examples=10, deadline=None)
@given(st.data(), st.sampled_from(sorted(OPS)))
def test_binary_float32_and_int64(data, op):
    m, n = data.draw(side()), data.draw(side())
    for dtype in (torch.float32, torch.int64):
        a = data.draw(dense_values((m, n), dtype))
        b = data.draw(dense_values((m, n), dtype))
        assert_matches(OPS[op][0](sparse(a, "csr"), sparse(b, "csr")), OPS[op][0](a, b))


# broadcasting cases: (op, shape of a, a sparse?, shape of b, b sparse?)
BROADCAST = [
    ("mul", (4, 5), True, (5,), False),          # rank difference, dense row vector
    ("add", (4, 5), True, (4, 1), False),        # dense column stretched
    ("mul", (4, 1), True, (4, 5), False),        # sparse column stretched (squeezed, indexed by i)
    ("add", (1, 5), True, (4, 5), True),         # sparse row against a sparse matrix
    ("mul", (4, 1), True, (1, 5), True),         # outer product of a sparse column and row
    ("add", (4, 1), True, (1, 5), True),         # outer sum: every row/column it touches fills
    ("mul", (3, 4, 5), True, (4, 5), False),     # batch against a matrix
    ("mul", (2, 1, 5), True, (3, 1), False),     # both stretch
    ("sub", (5,), True, (3, 5), True),           # sparse vector against a sparse matrix
    ("mul", (4, 5), True, (), False),            # 0-d tensor
    ("mul", (1, 1), True, (2, 3), False),        # a single entry against a matrix
]


@pytest.mark.parametrize("op,shape_a,sparse_a,shape_b,sparse_b", BROADCAST)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_broadcasting(data, op, shape_a, sparse_a, shape_b, sparse_b):
    a = data.draw(dense_values(shape_a))
    b = data.draw(dense_values(shape_b))
    fa = "coo" if len(shape_a) != 2 else "csr"
    fb = "coo" if len(shape_b) != 2 else "csr"
    A = sparse(a, fa) if sparse_a else a
    B = sparse(b, fb) if sparse_b else b
    py = OPS[op][0]
    # a product with a sparse operand is sparse; a sum is sparse only if both terms are (and
    # may be dense then when a stretched operand fills whole rows: format inference decides)
    expected_sparse = True if op == "mul" else (False if not (sparse_a and sparse_b) else None)
    assert_matches(py(A, B), py(a, b), sparse=expected_sparse)
    assert_matches(py(B, A), py(b, a), sparse=expected_sparse)


@FAST
@given(st.data(), st.sampled_from(["csr", "coo"]),
       st.sampled_from([2, -0.5, 3.25]), st.booleans())
def test_scalars_division_and_neg(data, fmt, c, as_tensor):
    m, n = data.draw(side()), data.draw(side())
    a = data.draw(dense_values((m, n)))
    A = sparse(a, fmt)
    s = torch.tensor(c, dtype=torch.float64) if as_tensor else c
    assert_matches(A * s, a * s, sparse=True)
    assert_matches(s * A, s * a, sparse=True)
    assert_matches(A / s, a / s, sparse=True)
    assert_matches(torch.div(A, s), torch.div(a, s), sparse=True)
    assert_matches(-A, -a, sparse=True)
    assert_matches(torch.neg(A), torch.neg(a), sparse=True)
    assert_matches(A + s, a + s, sparse=False)       # 0 + s is not 0: dense by nature
    assert_matches(s - A, s - a, sparse=False)
    assert_matches(torch.sub(A, A, alpha=s) if not as_tensor else A - A, a - a * (
        s if not as_tensor else 1))


def test_integer_tensors_keep_torch_dtypes():
    a = torch.tensor([[0, 2], [3, 0]])
    A = sparse(a, "csr")
    assert_matches(A * 2, a * 2)
    assert_matches(A / 2, a / 2)        # true division gives the default float dtype
    assert_matches(A * 0.5, a * 0.5)    # int * float scalar promotes
    assert_matches(A.float() * torch.tensor(2.0, dtype=torch.float64), a.float() * 2)  # 0-d: no promotion


def test_torch_sparse_operand_and_result_formats():
    a = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    A = sparse(a, "csr")
    assert_matches(A * a.to_sparse(), a * a, sparse=True)
    assert_matches(A + a.to_sparse_csr(), a + a, sparse=True)
    assert (A + A).format == A.format
    # division by zero follows torch's sparse layouts: only stored entries change
    torch.testing.assert_close((A / 0).to_dense(), (a.to_sparse() / 0).to_dense())


def test_division_by_a_dense_tensor_keeps_the_pattern():
    a = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    for fmt in ("csr", "coo", "csc"):
        out = sparse(a, fmt) / torch.tensor([1.0, 2.0])   # broadcast along rows
        assert isinstance(out, scorch.SparseTensor) and out.nnz == 2
        assert torch.equal(out.to_dense(), a / torch.tensor([1.0, 2.0]))
        col = sparse(a, fmt) / torch.tensor([[2.0], [4.0]])
        assert torch.equal(col.to_dense(), a / torch.tensor([[2.0], [4.0]]))


@FAST
@given(st.data(), st.sampled_from(["csr", "coo"]))
def test_in_place_forms_keep_the_pattern(data, fmt):
    m, n = data.draw(side(1)), data.draw(side(1))
    a = data.draw(dense_values((m, n)))
    b = data.draw(dense_values((m, n)))
    A = sparse(a, fmt)
    values = A.values()
    A.mul_(3)
    assert_matches(A, a * 3)
    A *= torch.tensor(0.5, dtype=torch.float64)
    assert_matches(A, a * 1.5)
    A.div_(3)
    assert_matches(A, a * 0.5)
    A2 = sparse(a, fmt)
    A.add_(A2, alpha=2)            # same pattern: stays in place
    assert_matches(A, a * 2.5)
    A -= A2
    assert_matches(A, a * 1.5)
    A.mul_(sparse(b, fmt))         # a product stays on self's pattern (missing entries -> 0)
    assert_matches(A, a * 1.5 * b)
    A.add_(sparse(b * (a != 0), fmt))   # a sum with a sub-pattern too
    assert_matches(A, a * 1.5 * b + b * (a != 0))
    assert A.values().data_ptr() == values.data_ptr()   # the same values array throughout
    assert A.format == sparse(a, fmt).format


def test_in_place_errors_when_the_pattern_changes():
    a = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    A = sparse(a, "csr")
    with pytest.raises(RuntimeError, match="dense"):
        A.add_(torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="pattern"):
        A.add_(sparse(torch.eye(2), "csr"))
    with pytest.raises(RuntimeError, match="pattern"):
        A.add_(sparse(torch.ones(2, 2), "coo"))
    with pytest.raises(RuntimeError, match="can't be cast"):
        sparse(torch.tensor([[0, 1]]), "coo").mul_(0.5)
    assert torch.equal(A.to_dense(), a)
    d = torch.ones(2, 2)
    d.add_(A)                       # a dense self takes a sparse operand
    assert torch.equal(d, 1 + a)


def test_sparse_broadcast_needs_no_dense_copy(monkeypatch):
    a = torch.tensor([[0.0], [3.0]])
    A = sparse(a, "coo")

    def no_dense(*args, **kwargs):
        raise AssertionError("densified")
    monkeypatch.setattr(scorch.SparseTensor, "to_dense", no_dense)
    out = A * torch.ones(2, 4, dtype=torch.float32)
    monkeypatch.undo()
    assert_matches(out, a * torch.ones(2, 4), sparse=True)


RANK3_FORMATS = [scorch.Format("cqq", (2, 0, 1)), scorch.Format("dcc", (1, 2, 0))]


@settings(max_examples=15, deadline=None)
@given(st.data(), st.sampled_from(sorted(OPS)), st.sampled_from([0, 1]))
def test_rank3_any_mode_order(data, op, which):
    shape = tuple(data.draw(side()) for _ in range(3))
    a = data.draw(dense_values(shape))
    b = data.draw(dense_values(shape))
    fa, fb = RANK3_FORMATS[which], RANK3_FORMATS[1 - which]
    assert_matches(OPS[op][0](sparse(a, fa), sparse(b, fb)), OPS[op][0](a, b), sparse=True)
    assert_matches(OPS[op][0](sparse(a, fa), b), OPS[op][0](a, b), sparse=op == "mul")


def test_blocked_operands():
    x = torch.zeros(4, 6, dtype=torch.float64)
    x[0, 1], x[3, 4], x[2, 2] = 1.0, 2.0, 3.0
    B = sparse(x, scorch.Format("dc", block=(2, 2)))
    assert_matches(B * 2, x * 2, sparse=True)
    assert_matches(B + B, x + x, sparse=True)
    assert_matches(B - x, x - x, sparse=False)
    assert_matches(B @ torch.ones(6, 2, dtype=torch.float64), x @ torch.ones(6, 2).double())
    assert_matches(B.sum(1), x.sum(1))
    assert_matches(B.reshape(2, 12), x.reshape(2, 12))
    assert_matches(torch.cat([B, B], 1), torch.cat([x, x], 1))
    assert_matches(B[1:, ::2], x[1:, ::2])
    C = B.clone()
    C.add_(B)
    C.mul_(0.5)
    assert_matches(C, x)
    assert C.format == B.format


# (format of the numerator, of the divisor); None = dense or, first, a Python number
DIVISORS = [("csr", "csr"), ("coo", "dcsc"), (None, "csr"), ("scalar", "coo")]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(DIVISORS), st.sampled_from([torch.float32, torch.float64, torch.int64]))
def test_division_by_a_sparse_tensor_is_dense_by_nature(data, pair, dtype):
    """x / 0 where the divisor stores nothing: +-inf, and NaN where the numerator is 0
    too, exactly as dense torch (integers divide to the default float dtype)."""
    m, n = data.draw(side()), data.draw(side())
    a, b = data.draw(dense_values((m, n), dtype)), data.draw(dense_values((m, n), dtype))
    A = 2.5 if pair[0] == "scalar" else _operand(a, pair[0])
    # an unstored entry is +0 (a dense -0.0 is not stored, so it divides as +0)
    want = (2.5 if pair[0] == "scalar" else a) / (b + 0.0 if dtype.is_floating_point else b)
    for got in [A / _operand(b, pair[1])] + ([] if pair[0] == "scalar" else [torch.div(A, _operand(b, pair[1]))]):
        assert type(got) is torch.Tensor and got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)


UNION_FORMATS = [("csr", "csr"), ("csc", "coo"), ("dcsr", "csr"), ("coo", "coo")]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(UNION_FORMATS), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(["add", "sub"]))
def test_union_of_two_patterns(data, fmts, dtype, op):
    """The union merge (lattice points: the two-way merge, then the rest of either operand)
    over empty, sparse and full operands, rows that end early on either side."""
    m, n = data.draw(side(0, 7)), data.draw(side(0, 7))
    a, b = data.draw(dense_values((m, n), dtype)), data.draw(dense_values((m, n), dtype))
    A, B = sparse(a, fmts[0]), sparse(b, fmts[1])
    py, _ = OPS[op]
    got = py(A, B)
    assert_matches(got, py(a, b), sparse=True)
    # entries exactly where either operand stores one (computed zeros kept)
    assert got.nnz == int(((A.to_dense() != 0) | (B.to_dense() != 0)).sum()) or \
        got.nnz == len({tuple(c) for c in torch.cat([A.indices().t(), B.indices().t()]).tolist()})


def test_union_of_three_patterns_in_one_kernel():
    """``A + B - 2 C`` through the compiler: every lattice point of three iterators."""
    from scorch.tensor_compiler import compute
    from scorch.tensor_compiler.index_notation import Access, Assignment
    g = torch.Generator().manual_seed(3)
    xs = [(torch.rand(9, 11, generator=g) < p) * torch.rand(9, 11, generator=g) for p in (0.2, 0.5, 0.05)]
    A, B, C = (sparse(x, f) for x, f in zip(xs, ("csr", "csr", "coo")))
    i = "ij"
    got = compute(Assignment(i, Access(0, i) + Access(1, i) - 2.0 * Access(2, i)),
                  A._storage, B._storage, C._storage)
    want = xs[0] + xs[1] - 2 * xs[2]
    assert torch.allclose(scorch.SparseTensor(got).to_dense(), want)
    assert got.nnz == int(((xs[0] != 0) | (xs[1] != 0) | (xs[2] != 0)).sum())


@pytest.mark.parametrize("threads", [1, 2])
def test_union_rows_pos_against_scipy(threads):
    """A union written row by row (the bound pass's room): ``pos`` prefix-summed into int32
    over the row counts, one chunk or several, equals scipy's ``indptr`` (empty rows too)."""
    import scipy.sparse as sp
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(3000, 40, generator=g) < 0.05) * torch.rand(3000, 40, generator=g)
    c = (torch.rand(3000, 40, generator=g) < 0.05) * torch.rand(3000, 40, generator=g)
    a[100:300] = 0
    c[200:400] = 0
    A, C = sparse(a, "csr"), sparse(c, "csr")
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = (A + C).to_scipy()
    finally:
        torch.set_num_threads(was)
    want = sp.csr_array(a.numpy()) + sp.csr_array(c.numpy())
    assert got.indptr.dtype == np.int32
    assert np.array_equal(got.indptr, want.indptr)
    assert np.array_equal(got.indices, want.indices)
    assert np.allclose(got.data, want.data)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), value=st.sampled_from([0.5, 2, 1.5, -1]),
       dtypes=st.sampled_from([(torch.int64,) * 3, (torch.float32, torch.int64, torch.int64),
                               (torch.int32, torch.float64, torch.int32), (torch.float64,) * 3]),
       sparse_y=st.booleans())
def test_addcmul_casts_the_value_to_the_tensors_type(data, value, dtypes, sparse_y):
    """torch's addcmul promotes the three tensors only; the value takes their type (an
    integer result truncates 0.5 to 0). Found by a random op chain: scorch promoted to float."""
    c, x, y = (data.draw(dense_values((3, 4), dt)) for dt in dtypes)
    C, X = scorch.sparse_tensor(c, format="csr"), scorch.sparse_tensor(x, format="coo")
    Y = scorch.sparse_tensor(y, format="csr") if sparse_y else y
    got = torch.addcmul(C, X, Y, value=value)
    assert_matches(got, torch.addcmul(c, x, y, value=value))
