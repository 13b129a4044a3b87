"""Comparisons, ``where``, ``masked_fill`` and the logical ops on sparse operands against dense
torch: values, dtype (bool results) and layout (sparse exactly when the op keeps 0 where
nothing is stored: ``A > s`` iff ``not 0 > s``, ``A != 0``, ``where(A > 0, A, 0)``).

Each drawn combination is a kernel to compile, so the compile-heavy tests are derandomized
(the same few kernels every run, cached on disk)."""
import operator

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import assert_matches, dense_values, side, sparse

KERNELS = settings(max_examples=20, deadline=None, derandomize=True)

OPS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
       "eq": operator.eq, "ne": operator.ne}
TORCH_OPS = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
             "ne": torch.ne}
# (format, dtype, scalars of that dtype)
CASES = [("csr", torch.float64, [0.0, 0.5, -0.5]), ("coo", torch.float32, [0.0, 0.25, -1.0]),
         ("csc", torch.int64, [0, 2, -1]), ("dcsr", torch.bool, [False, True])]


def _values(data, shape, dtype):
    if dtype == torch.bool:
        return data.draw(dense_values(shape, torch.int64)) > 0
    return data.draw(dense_values(shape, dtype))


@KERNELS
@given(st.data(), st.sampled_from(sorted(OPS)), st.sampled_from(range(len(CASES))), st.booleans())
def test_tensor_against_a_scalar(data, op, case, scalar_first):
    fmt, dtype, scalars = CASES[case]
    s = data.draw(st.sampled_from(scalars))
    a = _values(data, (data.draw(side()), data.draw(side())), dtype)
    A = sparse(a, fmt)
    py = OPS[op]
    got, want = (py(s, A), py(s, a)) if scalar_first else (py(A, s), py(a, s))
    keeps_zero = not (py(s, 0) if scalar_first else py(0, s))
    assert_matches(got, want, sparse=keeps_zero)
    if keeps_zero:
        assert got.nnz == A.nnz, "the operand's pattern, no more"
    assert_matches(TORCH_OPS[op](A, torch.tensor(s, dtype=dtype)), TORCH_OPS[op](a, torch.tensor(s, dtype=dtype)))


# (format of a, format of b); None = dense
PAIRS = [("csr", "csr"), ("coo", "dcsc"), ("csr", None), (None, "coo")]


@KERNELS
@given(st.data(), st.sampled_from(sorted(OPS)), st.sampled_from(PAIRS),
       st.sampled_from([torch.float64, torch.int64]))
def test_tensor_against_a_tensor(data, op, pair, dtype):
    m, n = data.draw(side()), data.draw(side())
    a, b = data.draw(dense_values((m, n), dtype)), data.draw(dense_values((m, n), dtype))
    A = a if pair[0] is None else sparse(a, pair[0])
    B = b if pair[1] is None else sparse(b, pair[1])
    # sparse + sparse keeps zeros where "0 op 0" is false: the union of the patterns
    both = None not in pair
    assert_matches(OPS[op](A, B), OPS[op](a, b), sparse=both and not OPS[op](0, 0))


# broadcasting: (shape of a, shape of b, b sparse?)
BROADCAST = [((4, 5), (5,), False), ((4, 1), (4, 5), True), ((3, 4, 5), (4, 5), False),
             ((4, 5), (), False), ((1, 1), (2, 3), True)]


@pytest.mark.parametrize("shape_a,shape_b,sparse_b", BROADCAST)
@settings(max_examples=4, deadline=None, derandomize=True)
@given(data=st.data())
def test_broadcasting(data, shape_a, shape_b, sparse_b):
    a, b = data.draw(dense_values(shape_a)), data.draw(dense_values(shape_b))
    A = sparse(a, "coo")
    B = sparse(b, "coo") if sparse_b and b.dim() else b
    assert_matches(A < B, a < b)
    assert_matches(B != A, b != a)


RANK3_FORMATS = [scorch.Format("cqq", (2, 0, 1)), scorch.Format("dcc", (1, 2, 0))]


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from([0, 1]))
def test_rank3_any_mode_order(data, which):
    shape = tuple(data.draw(side()) for _ in range(3))
    a, b = data.draw(dense_values(shape)), data.draw(dense_values(shape))
    A, B = sparse(a, RANK3_FORMATS[which]), sparse(b, RANK3_FORMATS[which])
    assert_matches(A > 0.1, a > 0.1, sparse=True)
    assert_matches(torch.where(A > 0, A, B), torch.where(a > 0, a, b), sparse=True)


# where(cond, x, y) operands: a sparse A, a dense D, the scalar 0, the scalar 1.5
WHERE_X = ["A", "D", 0.0, 1.5]


@KERNELS
@given(st.data(), st.sampled_from(WHERE_X), st.sampled_from(WHERE_X), st.sampled_from(["csr", "coo"]),
       st.booleans())
def test_where(data, x, y, fmt, sparse_mask):
    m, n = data.draw(side()), data.draw(side())
    a, b, d = (data.draw(dense_values((m, n))) for _ in range(3))
    c = b > 0
    A, C = sparse(a, fmt), (sparse(c, fmt) if sparse_mask else c)

    def pick(v, sparse_side):
        return {"A": (A, a), "D": (d, d)}.get(v, (v, v))[sparse_side]
    if not any(isinstance(o, scorch.SparseTensor) for o in (C, pick(x, 0), pick(y, 0))):
        return
    got, want = torch.where(C, pick(x, 0), pick(y, 0)), torch.where(c, pick(x, 1), pick(y, 1))
    # zero where nothing is stored: y is 0 or sparse, and x is 0 or sparse unless the mask is
    # (then x counts only where the mask stores True)
    y_zero = y in ("A", 0.0)
    x_zero = x in ("A", 0.0) or sparse_mask
    assert_matches(got, want, sparse=y_zero and x_zero)


def test_where_keeps_the_pattern_of_its_operand():
    a = torch.tensor([[0.0, -2.0, 3.0], [4.0, 0.0, -1.0]])
    A = sparse(a, "csr")
    r = torch.where(A > 0, A, 0)
    assert_matches(r, torch.where(a > 0, a, 0.0), sparse=True)
    assert r.nnz == A.nnz
    assert_matches(torch.where(A > 0, A, torch.zeros(2, 3)), torch.where(a > 0, a, 0.0), sparse=False)
    assert_matches(A.where(A < 0, 0.0), a.where(a < 0, 0.0), sparse=True)


@KERNELS
@given(st.data(), st.sampled_from([0.0, 2.5]), st.sampled_from(["csr", "coo"]))
def test_masked_fill(data, value, fmt):
    m, n = data.draw(side()), data.draw(side())
    a, b = data.draw(dense_values((m, n))), data.draw(dense_values((m, n)))
    A, M = sparse(a, fmt), sparse(b, fmt) > 0
    assert_matches(A.masked_fill(M, value), a.masked_fill(b > 0, value), sparse=True)
    assert_matches(torch.masked_fill(A, b > 0, torch.tensor(value)),
                   torch.masked_fill(a, b > 0, torch.tensor(value)))


@KERNELS
@given(st.data(), st.sampled_from(["and", "or", "xor"]), st.sampled_from(["csr", "coo"]),
       st.booleans())
def test_logical_ops(data, op, fmt, dense_b):
    m, n = data.draw(side()), data.draw(side())
    a, b = data.draw(dense_values((m, n))), data.draw(dense_values((m, n)))
    A, B = sparse(a, fmt), (b if dense_b else sparse(b, fmt))
    fn = getattr(torch, f"logical_{op}")
    assert_matches(fn(A, B), fn(a, b), sparse=not dense_b or op == "and")
    bit = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}[op]
    assert_matches(bit(A > 0, B > 0), bit(a > 0, b > 0), sparse=not dense_b or op == "and")
    assert_matches(torch.logical_not(A), torch.logical_not(a), sparse=False)


def test_bool_inputs_and_outputs_are_torch_bool():
    a = torch.tensor([[0.0, 1.5], [-2.0, 0.0]])
    M = sparse(a, "csr") != 0
    assert M.dtype == torch.bool and M.values().dtype == torch.bool
    assert M.nnz == 2
    assert_matches(M == (sparse(a, "csr") > 0), (a != 0) == (a > 0), sparse=False)
    assert_matches(sparse(a, "coo").bool(), a.bool(), sparse=True)


def test_errors_are_torch_like():
    a = torch.tensor([[0.0, 1.5], [-2.0, 0.0]])
    A = sparse(a, "csr")
    with pytest.raises(RuntimeError, match="boolean"):
        torch.where(A, A, 0.0)
    g = sparse(a, "csr").requires_grad_()
    torch.where(A > 0, g, 0.0).to_dense().sum().backward()   # differentiable: on g's pattern
    torch.testing.assert_close(g.grad.to_dense(), (a > 0).to(a.dtype))
    with torch.no_grad():
        assert_matches(torch.where(A > 0, g, 0.0), torch.where(a > 0, a, 0.0))


def test_dense_by_nature_results_respect_the_dense_limit():
    big = scorch.sparse_tensor(torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]),
                                                       (200_000, 200_000)).coalesce(), format="csr")
    assert (big > 0.5).nnz == 1          # sparse: costs the stored entries only
    with pytest.raises(scorch.DenseFallbackError, match="dense by nature"):
        big == 0


@settings(max_examples=10, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(["csr", "coo"]))
def test_bool_and_integer_arithmetic_follows_torch(data, fmt):
    """bool ``+`` is or and ``*`` is and (bool results, the union / intersection of the
    patterns); integer dtypes keep their type."""
    m, n = data.draw(side()), data.draw(side())
    a, b = _values(data, (m, n), torch.bool), _values(data, (m, n), torch.bool)
    A, B = sparse(a, fmt), sparse(b, fmt)
    assert_matches(A + B, a + b, sparse=True)
    assert_matches(A * B, a * b, sparse=True)
    assert_matches(A * b, a * b, sparse=True)
    assert_matches(A * 2, a * 2, sparse=True)
    for dtype in (torch.int32, torch.uint8):
        x, y = a.to(dtype) * 3, b.to(dtype) * 2
        assert_matches(sparse(x, fmt) + sparse(y, fmt), x + y, sparse=True)
        assert_matches(sparse(x, fmt) * sparse(y, fmt), x * y, sparse=True)
        assert_matches(sparse(x, fmt) > 1, x > 1, sparse=True)


def test_a_comparison_that_keeps_zeros_is_written_on_the_operands_pattern():
    """``A > s`` stores exactly A's entries, so the kernel writes values at A's positions and
    the result shares A's index arrays (no coordinate buffers, no assembly)."""
    a = torch.tensor([[0.0, -2.0, 3.0], [4.0, 0.0, -1.0]])
    A = sparse(a, "csr")
    for r in (A > 0.5, A != 0, A <= -1):
        assert r.nnz == A.nnz
        assert r._storage.levels[1].crd.data_ptr() == A._storage.levels[1].crd.data_ptr()


@KERNELS
@given(st.data(), st.sampled_from(["maximum", "minimum"]), st.sampled_from(PAIRS),
       st.sampled_from([torch.float64, torch.float32, torch.int64]))
def test_maximum_and_minimum(data, op, pair, dtype):
    """Two sparse operands of different patterns: the union (max(a, 0) where only one
    stores); a dense operand: dense by nature. NaN propagates from either side, as torch."""
    m, n = data.draw(side()), data.draw(side())
    a, b = data.draw(dense_values((m, n), dtype)), data.draw(dense_values((m, n), dtype))
    if dtype.is_floating_point and m * n and data.draw(st.booleans()):
        a.view(-1)[0], b.view(-1)[-1] = float("nan"), float("nan")
    A = a if pair[0] is None else sparse(a, pair[0])
    B = b if pair[1] is None else sparse(b, pair[1])
    fn = getattr(torch, op)
    want = fn(a, b)
    for got in (fn(A, B), getattr(A, op)(B) if pair[0] else getattr(B, op)(A)):
        assert isinstance(got, scorch.SparseTensor) == (None not in pair) and got.dtype == want.dtype
        torch.testing.assert_close(got.to_dense() if None not in pair else got, want, equal_nan=True)
    if None not in pair:   # on the union of the stored patterns, no more
        assert got.nnz <= A.nnz + B.nnz


def test_maximum_of_two_patterns_reached_below_torch_function_names_the_op(monkeypatch):
    """At the ATen level two patterns raise, naming the op, inside an optimizer's
    values-level step (its state stays on one pattern); outside one (a torch function
    without a handler that reached ATen) the dense fallback runs, warning with the op's name."""
    from scorch import _dispatch
    from scorch.gradients import optim_ops
    A = sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "csr")
    B = sparse(torch.tensor([[0.0, 3.0], [0.0, 1.0]]), "csr")
    monkeypatch.setattr(_dispatch, "_warned", set())
    with pytest.warns(UserWarning, match="'maximum' has no sparse kernel"):
        assert torch.equal(torch.ops.aten.maximum.default(A, B), torch.tensor([[1.0, 3.0], [0.0, 2.0]]))
    monkeypatch.setattr(optim_ops, "values_level", lambda: True)
    with pytest.raises(RuntimeError, match="maximum.*different sparsity pattern"):
        torch.ops.aten.maximum.default(A, B)
    assert_matches(torch.maximum(A, B), torch.tensor([[1.0, 3.0], [0.0, 2.0]]), sparse=True)
