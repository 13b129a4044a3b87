"""The index-notation IR beyond sums and products: division and elementwise functions, with
format inference reading the zero-preserving table (``tensor_compiler/functions.py``).
Every result is checked against dense torch, NaN and inf included."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.tensor_compiler import Access, Assignment, compute
from scorch.tensor_compiler.functions import FUNCTIONS
from scorch.tensor_compiler.index_notation import Apply, Div, Mul, Scalar, Sub
from scorch import conversion
from scorch.tensor_type import SparseTensor
from ops_helpers import TORCH_FUNCTIONS

TORCH = TORCH_FUNCTIONS
A, B, C = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")


def _dense(r):
    if isinstance(r, SparseTensor):
        return r.to_dense()
    return SparseTensor(r).to_dense() if not isinstance(r, torch.Tensor) else r


def _matrix(m, n, density, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < density)
    return d


OF_VALUES = {f for f in FUNCTIONS if not FUNCTIONS[f].of_pattern}


def test_every_torch_function_has_a_row_in_the_table():
    assert set(TORCH) | {"pow"} == OF_VALUES
    assert {f for f in OF_VALUES if FUNCTIONS[f].zero_preserving and f != "pow"} == {
        f for f in TORCH if float(TORCH[f](torch.zeros(1))) == 0}


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(["csr", "coo", "dense_rows", "dcsr"]), m=st.integers(0, 6),
       n=st.integers(1, 6), density=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 99))
def test_stored_is_one_on_the_pattern(fmt, m, n, density, seed):
    # stored(x): 1 at every stored entry (a stored 0 too), absent elsewhere; times exp(x - 1)
    # it is computed on x's pattern alone (a pattern output, no assembly)
    d = _matrix(m, n, density, torch.float64, seed)
    d[:, 0] = 0.0
    fmt = {"dense_rows": scorch.Format("dd")}.get(fmt, fmt)
    S = scorch.sparse_tensor(d, format=fmt)
    if S.nnz:
        S._storage.values[0] = 0.0                 # a stored zero stays stored
    dense = S.to_dense()
    mask = torch.zeros_like(dense, dtype=torch.bool)
    if S.nnz:
        mask[tuple(conversion.coords(S._storage))] = True
    ones = compute(Assignment("ij", Apply("stored", A)), S)
    torch.testing.assert_close(_dense(ones), mask.double())
    r = compute(Assignment("ij", Mul(Apply("stored", A), Apply("exp", Sub(A, Scalar(1.0))))), S)
    torch.testing.assert_close(_dense(r), torch.where(mask, torch.exp(dense - 1), 0.0))


@settings(max_examples=30, deadline=None)
@given(fn=st.sampled_from(sorted(TORCH)), fmt=st.sampled_from(["csr", "coo"]),
       m=st.integers(0, 7), n=st.integers(1, 6), density=st.sampled_from([0.0, 0.3, 1.0]),
       dtype=st.just(torch.float64), seed=st.integers(0, 99))
def test_function_of_a_sparse_operand(fn, fmt, m, n, density, dtype, seed):
    d = _matrix(m, n, density, dtype, seed)
    S = scorch.sparse_tensor(d, format=fmt)
    r = compute(Assignment("ij", Apply(fn, A)), S)
    if FUNCTIONS[fn].zero_preserving:
        assert not isinstance(r, torch.Tensor), "a zero-preserving function keeps sparsity"
        assert SparseTensor(r).nnz == S.nnz
    else:
        assert isinstance(r, torch.Tensor), "a function that maps 0 elsewhere is dense"
    torch.testing.assert_close(_dense(r), TORCH[fn](d), equal_nan=True)


@pytest.mark.parametrize("p,sparse", [(2.0, True), (0.5, True), (3.0, True), (0.0, False),
                                      (-1.0, False)])
def test_pow_keeps_zero_only_for_positive_exponents(p, sparse):
    d = _matrix(5, 4, 0.4, torch.float64, 1).abs()
    r = compute(Assignment("ij", Apply("pow", A, p)), scorch.sparse_tensor(d, format="csr"))
    assert (not isinstance(r, torch.Tensor)) == sparse
    torch.testing.assert_close(_dense(r), torch.pow(d, p), equal_nan=True)


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(["csr", "coo", "dcsc"]), m=st.integers(1, 6), n=st.integers(1, 6),
       seed=st.integers(0, 99))
def test_fused_relu_of_product_plus_sparse_is_one_sparse_kernel(fmt, m, n, seed):
    x, y = _matrix(m, n, 0.5, torch.float64, seed), _matrix(m, n, 0.5, torch.float64, seed + 1)
    D = torch.randn(m, n, dtype=torch.float64)
    r = compute(Assignment("ij", Apply("relu", A * B + C)), scorch.sparse_tensor(x, format=fmt), D,
                scorch.sparse_tensor(y, format=fmt))
    assert not isinstance(r, torch.Tensor)
    torch.testing.assert_close(_dense(r), torch.relu(x * D + y))


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(["csr", "coo"]), m=st.integers(0, 6), n=st.integers(1, 6),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 99))
def test_division_by_dense_and_by_scalar_keeps_the_numerators_pattern(fmt, m, n, dtype, seed):
    x = _matrix(m, n, 0.4, dtype, seed)
    D = torch.rand(m, n, dtype=dtype) + 0.5
    S = scorch.sparse_tensor(x, format=fmt)
    for expr, want in ((Div(A, B), x / D), (A / 4.0, x / 4.0), (Div(A * B, B + 1.0), x * D / (D + 1))):
        r = compute(Assignment("ij", expr), S, D)
        assert not isinstance(r, torch.Tensor)
        torch.testing.assert_close(_dense(r), want)
    col = torch.rand(m, 1, dtype=dtype) + 1   # a denominator broadcast along j
    torch.testing.assert_close(_dense(compute(Assignment("ij", Div(A, B)), S, col)), x / col)


def test_division_by_a_sparse_operand_is_refused_with_the_reason():
    """A quotient computed only where a sparse numerator stores entries cannot divide by a
    sparse operand (x / 0 elsewhere); one computed everywhere (a dense numerator) can, and
    reads an unstored entry as 0, as dense torch."""
    x = _matrix(4, 3, 0.5, torch.float64, 0)
    S = scorch.sparse_tensor(x, format="csr")
    with pytest.raises(ValueError, match="division by sparse operand 1"):
        compute(Assignment("ij", Div(A, B)), S, S)
    D = torch.tensor([[1.0, 0.0, -2.0]] * 4, dtype=torch.float64)
    got = compute(Assignment("ij", Div(A, B)), D, S)
    torch.testing.assert_close(got, D / S.to_dense(), equal_nan=True)


def test_explain_source_calls_libm():
    S = scorch.sparse_tensor(_matrix(4, 3, 0.5, torch.float64, 0), format="csr")
    from scorch.tensor_compiler.planner import make_entry
    from scorch.tensor_compiler.codegen import generate
    e = make_entry(Assignment("ij", Apply("sqrt", A) + Apply("exp", A)), [("i", "j")], [S._storage], None)
    src, _ = generate(e.schedule, torch.float64, {0: S._storage.index_dtype})
    assert "from libc.math cimport sqrt, exp" in src
    assert e.schedule.output.dense   # exp maps 0 to 1: dense by nature


def _stored_reduce(d, mask, red, dim):
    """torch's amax/amin over the stored entries only (an empty fiber: -inf / +inf)."""
    if d.dtype.is_floating_point:
        fill = torch.tensor(float("-inf") if red == "max" else float("inf"), dtype=d.dtype)
    else:
        info = torch.iinfo(d.dtype)
        fill = torch.tensor(info.min if red == "max" else info.max, dtype=d.dtype)
    x = torch.where(mask, d, fill)
    return x.amax(dim) if red == "max" else x.amin(dim)


@settings(max_examples=30, deadline=None)
@given(red=st.sampled_from(["max", "min"]), fmt=st.sampled_from(["csr", "csc", "coo", "dcsr", "dcsc"]),
       out=st.sampled_from(["i", "j"]), m=st.integers(1, 7), n=st.integers(1, 6),
       density=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 99),
       scaled=st.booleans())
def test_max_min_over_stored_entries(red, fmt, out, m, n, density, seed, scaled):
    """``Assignment(out, rhs, "max")``: the reduction runs over stored entries; a sparse
    result has no entry for an empty fiber, a dense one holds -inf / +inf there."""
    d = _matrix(m, n, density, torch.float64, seed)
    mask = d != 0
    D = torch.rand(m, n, dtype=torch.float64) + 0.5
    S = scorch.sparse_tensor(d, format=fmt)
    rhs = A * B if scaled else A
    r = compute(Assignment(out, rhs, red), S, D) if scaled else compute(Assignment(out, rhs, red), S)
    dim = 1 if out == "i" else 0
    want = _stored_reduce(d * D if scaled else d, mask, red, dim)
    if isinstance(r, torch.Tensor):
        torch.testing.assert_close(r, want)
    else:
        got = SparseTensor(r)
        nonempty = mask.any(dim)
        assert got.nnz == int(nonempty.sum())
        torch.testing.assert_close(got.to_dense(), torch.where(nonempty, want, torch.zeros_like(want)))


def test_max_over_a_3d_tensor_and_integers():
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-5, 5, (4, 3, 5), generator=g) * (torch.rand(4, 3, 5, generator=g) < 0.5)
    S = scorch.sparse_tensor(x, format=scorch.Format("dcc"))
    r = compute(Assignment("ik", Access(0, "ijk"), "max"), S)
    want = _stored_reduce(x, x != 0, "max", 1)   # an empty fiber holds the int64 minimum
    if isinstance(r, torch.Tensor):
        torch.testing.assert_close(r, want)
    else:
        nonempty = (x != 0).any(1)
        torch.testing.assert_close(SparseTensor(r).to_dense(), torch.where(nonempty, want, torch.zeros_like(want)))
    assert "max_j" in str(Assignment("ik", Access(0, "ijk"), "max"))
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        Assignment("i", A, "mean")


# --- comparisons and where --------------------------------------------------------------------

def _keeps_zero(expr) -> bool:
    """Format inference's answer for an "ij" expression over sparse (compressed) accesses."""
    from scorch.formats import LevelKind
    from scorch.tensor_compiler.format_inference import infer_kind
    return infer_kind(expr, "j", lambda a, v: LevelKind.COMPRESSED) != LevelKind.DENSE


def test_zero_analysis_decides_which_comparisons_keep_zeros():
    from scorch.tensor_compiler.index_notation import COMPARISONS, Scalar, Where
    for name, node in COMPARISONS.items():
        for s in (-1.0, 0.0, 2.0):
            assert _keeps_zero(node(A, Scalar(s))) == (not node.holds(0, s)), (name, s)
        assert _keeps_zero(node(A, B)) == (not node.holds(0, 0)), name   # both sparse: union
    Gt, Ne, Eq = COMPARISONS["gt"], COMPARISONS["ne"], COMPARISONS["eq"]
    assert _keeps_zero(Where(Gt(A, Scalar(0.0)), A, Scalar(0.0)))
    assert _keeps_zero(Where(B, A, Scalar(0.0)))            # a sparse mask picks
    assert not _keeps_zero(Where(B, A, Scalar(1.0)))       # 1 where the mask is unstored
    assert _keeps_zero(Where(B, Scalar(1.0), A))            # where(mask, 1, A): mask | A
    assert not _keeps_zero(Eq(A, Scalar(0.0)))
    assert _keeps_zero(Ne(A, Scalar(0.0)) * Apply("exp", B))   # a product with a sparse factor
    assert not _keeps_zero(Apply("exp", Ne(A, Scalar(0.0))))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(op=st.sampled_from(["lt", "ge", "eq", "ne"]), fmt=st.sampled_from(["csr", "dcsc"]),
       m=st.integers(0, 6), n=st.integers(1, 6), density=st.sampled_from([0.0, 0.4, 1.0]),
       dtype=st.sampled_from([torch.float64, torch.int64]), seed=st.integers(0, 99))
def test_comparison_and_where_kernels(op, fmt, m, n, density, dtype, seed):
    """The nodes run in any format: ``cmp(A, B)`` over two sparse operands (union of their
    patterns when ``0 op 0`` is false) and ``where(A op B, A, 0) * 2 + B``."""
    from scorch.tensor_compiler.index_notation import COMPARISONS, Scalar, Where
    node = COMPARISONS[op]
    x, y = (_matrix(m, n, density, torch.float64, seed + k).mul(3).to(dtype) for k in (0, 1))
    X, Y = scorch.sparse_tensor(x, format=fmt), scorch.sparse_tensor(y, format=fmt)
    ref = getattr(torch, op)(x, y)
    r = compute(Assignment("ij", node(A, B)), X, Y)
    assert isinstance(r, torch.Tensor) == node.holds(0, 0)
    torch.testing.assert_close(_dense(r), ref.to(dtype))
    r = compute(Assignment("ij", Where(node(A, B), A, Scalar(0)) * 2 + B), X, Y)
    assert not isinstance(r, torch.Tensor)
    torch.testing.assert_close(_dense(r), torch.where(ref, x, 0) * 2 + y)


# --- fused forms --------------------------------------------------------------------------------

def _count_kernel_runs(monkeypatch):
    """Every compute/einsum run goes through ``api.run`` once (a warm einsum may go to C,
    compute never): count them."""
    import scorch.tensor_compiler.api as api
    runs = [0]
    original = api.run

    def counting(*args, **kwargs):
        runs[0] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(api, "run", counting)
    return runs


# (format of C, of A, of B); None = dense
ADDC = [("csr", "csr", "csr"), ("coo", None, "coo"), ("csr", "csr", None), (None, "csr", None)]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(formats=st.sampled_from(ADDC), value=st.sampled_from([1, 0.5, -2]),
       dtype=st.sampled_from([torch.float32, torch.float64]), m=st.integers(0, 5),
       n=st.integers(1, 5), density=st.sampled_from([0.0, 0.4, 1.0]), seed=st.integers(0, 99))
def test_addcmul_and_addcdiv_are_one_kernel(formats, value, dtype, m, n, density, seed):
    import _pytest.monkeypatch
    mp = _pytest.monkeypatch.MonkeyPatch()
    try:
        runs = _count_kernel_runs(mp)
        c, a, b = (_matrix(m, n, density, dtype, seed + k) for k in range(3))
        C, X, Y = (t if f is None else scorch.sparse_tensor(t, format=f)
                   for t, f in zip((c, a, b), formats))
        got = torch.addcmul(C, X, Y, value=value)
        assert runs[0] == 1, "C + v * A * B is one kernel"
        want = torch.addcmul(c, a, b, value=value)
        assert isinstance(got, SparseTensor) == (formats[0] is not None and formats[1:] != (None, None))
        torch.testing.assert_close(_dense(got), want)
        if formats[2] is None:
            d = torch.rand(m, n, dtype=dtype) + 0.5
            runs[0] = 0
            got = torch.addcdiv(C, X, d, value=value)
            assert runs[0] == 1
            torch.testing.assert_close(_dense(got), torch.addcdiv(c, a, d, value=value))
    finally:
        mp.undo()


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(["csr", "csc", "coo", "dcsr"]), m=st.integers(1, 7), n=st.integers(1, 7),
       density=st.sampled_from([0.0, 0.3, 1.0]), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**16))
def test_product_with_an_absent_sparse_factor_is_zero_even_beside_inf(fmt, m, n, density, dtype, seed):
    """``sum -(D * S) * log(D) + E`` with dense D holding zeros (log(0) = -inf): where S stores
    nothing the product is 0, as in dense torch with S's absent entries masked out, not
    ``0 * -inf`` = NaN (the kernel selects the whole product, not only S's read). Found by
    the long fuzz run (``SCORCH_FUZZ_EXAMPLES``)."""
    s = _matrix(m, n, density, dtype, seed)
    S = scorch.sparse_tensor(s, format=fmt)
    D = _matrix(m, n, 0.5, dtype, seed + 1).abs()          # zeros where log gives -inf
    E = _matrix(m, n, 1.0, dtype, seed + 2)
    stored = s != 0
    prod = torch.where(stored, -(D * s) * torch.log(D), torch.zeros((), dtype=dtype))
    for out, want in ((("i", "j"), prod + E), ((), (prod + E).sum())):
        rhs = Access(0, "ij") * Access(1, "ij")
        expr = Assignment(out, (-rhs) * Apply("log", Access(0, "ij")) + Access(2, "ij"))
        got = _dense(compute(expr, D, S._storage, E))
        torch.testing.assert_close(got, want, equal_nan=True,
                                   rtol=1e-5 if dtype == torch.float32 else 1e-9,
                                   atol=1e-4 if dtype == torch.float32 else 1e-9)


@pytest.mark.parametrize("fn", sorted(TORCH))
def test_functions_on_special_values_match_torch(fn, dtype=torch.float64):
    """NaN and infinities propagate as torch's (``relu(nan)`` is nan), rounding ties go to
    even (``round(2.5)`` is 2), kinks and bounds (0, +-1) give torch's values. (float64
    only: one kernel per function, shared with the test above; float32 is the same C.)"""
    vals = [float("nan"), float("inf"), float("-inf"), 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.7, -0.2,
            3.0, -3.0]   # hardswish's bounds
    d = torch.zeros(3, len(vals), dtype=dtype)
    d[1] = torch.tensor(vals, dtype=dtype)
    r = compute(Assignment("ij", Apply(fn, A)), scorch.sparse_tensor(d, format="csr"))
    torch.testing.assert_close(_dense(r), TORCH[fn](d), equal_nan=True)


@pytest.mark.parametrize("outer", ["softsign", "silu", "gelu", "elu", "atan"])
def test_a_function_of_sign_computes_in_the_value_type(outer):
    """sign's C expression is an int; the function around it must not divide integers
    (softsign(sign(x)) = 1 / 2, not 0). Found by the long fuzz run."""
    d = torch.tensor([[0.0, 2.0, -3.0], [0.5, 0.0, 0.0]])
    r = compute(Assignment("ij", Apply(outer, Apply("sign", A))), scorch.sparse_tensor(d, format="csr"))
    torch.testing.assert_close(_dense(r), TORCH[outer](torch.sign(d)))
