"""The fast paths of the op layer against dense torch: elementwise ops that keep the pattern
(a scalar factor or divisor, negation, operands over the same index arrays: values only,
arrays shared), the shared-pattern form of compiled expressions (``shared_pattern``), the
full sum as a values sum, the sparse-vector output assembly, ``A @ X`` / ``X @ A`` /
``A.mm`` straight to their handlers, and ``compute``'s warm plan lookup. Each result equals
the dense one, and a result that shares index arrays never lets an in-place op reach its
input."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.tensor_compiler import compute
from scorch.tensor_compiler import index_notation as ir
from ops_helpers import FLOATS, KERNEL_FORMATS, assert_matches, dense_values, side, sparse

FAST = settings(max_examples=25, deadline=None)
FORMATS2 = KERNEL_FORMATS[2]


@st.composite
def matrix(draw, dtypes=FLOATS, formats=FORMATS2):
    shape = (draw(side()), draw(side()))
    dtype = draw(st.sampled_from(dtypes))
    x = draw(dense_values(shape, dtype))
    return x, sparse(x, draw(st.sampled_from(formats)))


def _shares_arrays(a, b) -> bool:
    return all(la.pos is lb.pos and la.crd is lb.crd
               for la, lb in zip(a._storage.levels, b._storage.levels))


@FAST
@given(matrix(dtypes=FLOATS + [torch.int64]), st.sampled_from([2, -0.5, 3.0, True]))
def test_scalar_ops_keep_the_pattern(case, s):
    x, A = case
    for got, want in ((A * s, x * s), (s * A, s * x), (A / s, x / s), (-A, -x)):
        assert_matches(got, want, sparse=True)
        assert _shares_arrays(got, A)
        assert got._storage.values.data_ptr() != A._storage.values.data_ptr() or A.nnz == 0


@FAST
@given(matrix())
def test_same_arrays_elementwise(case):
    x, A = case
    B = A * 2.0                                  # A's very index arrays
    assert _shares_arrays(A, B)
    for got, want in ((A + B, x + 2 * x), (A - B, x - 2 * x), (A * B, x * (2 * x))):
        assert_matches(got, want, sparse=True)
        assert _shares_arrays(got, A)


def test_inplace_on_a_result_leaves_the_input_alone():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    A = scorch.sparse_tensor(x, format="csr")
    B = A * 2
    B.mul_(3)
    assert torch.equal(A.to_dense(), x)
    C = A + A
    C.add_(C)
    D = -A
    D.copy_(torch.ones(2, 3))
    E = A / 4
    E.div_(2)
    assert torch.equal(A.to_dense(), x)
    torch.testing.assert_close(B.to_dense(), 6 * x)
    torch.testing.assert_close(C.to_dense(), 4 * x)
    torch.testing.assert_close(E.to_dense(), x / 8)


@FAST
@given(matrix(formats=["csr", "coo", "csc"]), st.sampled_from(["csr", "coo", "csc"]))
def test_different_patterns_take_the_kernel(case, other):
    x, A = case
    y = torch.flip(x, [0]) if x.numel() else x
    C = scorch.sparse_tensor(y, format=other)
    if other == A.format:     # same format: the kernel over two patterns
        for got, want in ((A + C, x + y), (A - C, x - y), (A * C, x * y)):
            assert_matches(got, want, sparse=True)
    assert_matches(A + C.to_format(A.format), x + y, sparse=True)


@FAST
@given(matrix())
def test_compiled_expression_over_one_pattern(case):
    """compute() with operands over the same arrays: values only (torch ops), arrays shared;
    functions, scalars, a 0-d dense operand, division by it."""
    x, A = case
    B = A * 3.0
    s = torch.tensor(0.25, dtype=x.dtype)
    a, b, c = ir.Access(0, "ij"), ir.Access(1, "ij"), ir.Access(2, ())
    expr = ir.Apply("relu", a) * ir.Scalar(2.0) - ir.Apply("pow", b, 2.0) / c + ir.Apply("sin", -a)
    got = scorch.SparseTensor(compute(ir.Assignment("ij", expr), A, B, s))
    want = torch.relu(x) * 2 - (3 * x) ** 2 / 0.25 + torch.sin(-x)
    assert_matches(got, want, sparse=True)
    assert _shares_arrays(got, A)


def test_identity_expression_does_not_alias_values():
    A = scorch.sparse_tensor(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), format="csr")
    out = compute(ir.Assignment("ij", ir.Access(0, "ij")), A)
    assert out.values.data_ptr() != A._storage.values.data_ptr()
    out.values.mul_(5)
    assert torch.equal(A.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 2.0]]))


@FAST
@given(st.integers(1, 3), st.data())
def test_full_sum_is_the_values_sum(rank, data):
    shape = tuple(data.draw(side()) for _ in range(rank))
    dtype = data.draw(st.sampled_from(FLOATS + [torch.int64, torch.int32, torch.bool]))
    x = data.draw(dense_values(shape, torch.float64 if dtype == torch.bool else dtype))
    x = x != 0 if dtype == torch.bool else x
    A = scorch.sparse_tensor(x, format=data.draw(st.sampled_from(KERNEL_FORMATS[rank] + ["d" * rank])))
    assert_matches(A.sum(), x.sum(), sparse=False)
    assert_matches(A.sum(tuple(range(rank))), x.sum(tuple(range(rank))), sparse=False)
    assert_matches(torch.sum(A, dtype=torch.float64), x.sum(dtype=torch.float64), sparse=False)
    if rank == 2:
        assert_matches(A.sum(-1), x.sum(-1))


def test_full_sum_keeps_gradients():
    x = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    A = scorch.sparse_tensor(x, format="csr").requires_grad_(True)
    (A * 3).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), 3 * (x != 0).to(x.dtype))


@FAST
@given(matrix(formats=["csr", "dcsr"]))
def test_column_sum_of_rows_is_a_sparse_vector(case):
    x, A = case
    r = A.sum(0)
    assert_matches(r, x.sum(0))
    s = torch.sparse.sum(A, 0)
    assert_matches(s, x.sum(0), sparse=True)
    if isinstance(r, scorch.SparseTensor):   # stored where a column stores an entry
        assert r.nnz == int((x != 0).any(0).sum()) or A.nnz != int((x != 0).sum())


@FAST
@given(matrix(formats=["csr", "csc", "coo"]), st.integers(1, 4))
def test_matmul_dunders(case, k):
    x, A = case
    X = torch.rand(x.shape[1], k, dtype=x.dtype)
    Y = torch.rand(k, x.shape[0], dtype=x.dtype)
    assert_matches(A @ X, x @ X, sparse=False)
    assert_matches(A.mm(X), x.mm(X), sparse=False)
    assert_matches(Y @ A, Y @ x, sparse=False)
    assert_matches(torch.mm(A, X), x @ X, sparse=False)


def test_matmul_dunders_refuse_like_torch():
    A = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(RuntimeError):
        A @ torch.ones(4, 2)
    with pytest.raises(RuntimeError):
        A.mm(torch.ones(4, 2))
    with pytest.raises(TypeError):
        A @ 3
    with pytest.raises(RuntimeError):
        A @ torch.ones(3, 2, dtype=torch.float64)


def test_matmul_hot_path_after_a_warm_call_still_checks():
    """After a call that leaves the format on the hot path (straight to the warm C call),
    other shapes, dtypes, layouts and grad still get their own checks and answers."""
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 4.0]])
    A = scorch.sparse_tensor(x, format="csr")
    for _ in range(2):
        torch.testing.assert_close(A @ torch.ones(3, 2), x @ torch.ones(3, 2))
    for bad in (torch.ones(4, 2), torch.ones(3, 2, dtype=torch.float64)):
        with pytest.raises(RuntimeError):
            A @ bad
    Xt = torch.rand(5, 3).t()                       # strided: stride 1 along rows
    torch.testing.assert_close(A @ Xt, x @ Xt)
    torch.testing.assert_close(A @ torch.ones(3), x @ torch.ones(3))   # SpMV after SpMM
    X = torch.rand(3, 2, requires_grad=True)
    (A @ X).sum().backward()
    torch.testing.assert_close(X.grad, x.t() @ torch.ones(3, 2))
    B = scorch.sparse_tensor(torch.ones(2, 2), format="csr")
    with pytest.raises(RuntimeError):
        B @ torch.ones(3, 2)                        # same format, other shape


def test_matmul_dunder_keeps_gradients():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    A = scorch.sparse_tensor(x, format="csr").requires_grad_(True)
    X = torch.rand(2, 3, requires_grad=True)
    (A @ X).sum().backward()
    torch.testing.assert_close(X.grad, x.t() @ torch.ones(2, 3))
    torch.testing.assert_close(A.grad.to_dense(), (torch.ones(2, 3) @ X.t()) * (x != 0))


def test_compute_warm_lookup_checks_sizes_every_call():
    asg = ir.Assignment("ij", ir.Access(0, "ij") + ir.Access(1, "ij"))
    a = scorch.sparse_tensor(torch.eye(3), format="csr")
    b = scorch.sparse_tensor(torch.eye(4), format="csr")
    torch.testing.assert_close(scorch.SparseTensor(compute(asg, a, a)).to_dense(), 2 * torch.eye(3))
    torch.testing.assert_close(scorch.SparseTensor(compute(asg, b, b)).to_dense(), 2 * torch.eye(4))
    with pytest.raises(ValueError, match="operand 1"):
        compute(asg, a, b)


@FAST
@given(matrix(formats=["csr", "csc", "coo"]), st.sampled_from(["col", "row", "both"]))
def test_dense_broadcast_operand_is_not_stretched(case, which):
    x, A = case
    m, n = x.shape
    D = torch.rand((m, 1) if which == "col" else (1, n) if which == "row" else (1, 1), dtype=x.dtype)
    assert_matches(scorch.einsum("ij,ij->ij", A, D), x * D)
    assert_matches(scorch.einsum("ij,ij->i", A, D), (x * D).sum(1))


def test_broadcast_dimensions_leave_the_equation():
    from scorch.tensor_compiler.api import squeeze_dense_broadcasts
    A = scorch.sparse_tensor(torch.eye(4), format="csr")._storage
    col, row = torch.rand(4, 1), torch.rand(1, 4)
    eq, ops = squeeze_dense_broadcasts("ij,ij->ij", [A, col])
    assert eq == "ij,i->ij" and tuple(ops[1].shape) == (4,)
    assert ops[1].data_ptr() == col.data_ptr()            # a view, no copy
    eq, ops = squeeze_dense_broadcasts("ij,ij,ij->ij", [A, col, row])
    assert eq == "ij,i,j->ij"
    assert squeeze_dense_broadcasts("ij,ij->ij", [A, torch.rand(4, 4)])[0] == "ij,ij->ij"
    assert squeeze_dense_broadcasts("...j,...j->...j", [A, col])[0] == "...j,...j->...j"
