"""Eager fusion across operators (scorch.sparse_ops.fusion): ``A * B + A`` and
``A * B * 0.5 + A``, ``A * B + C`` on sparse tensors run ONE kernel by default (``A + B + C``
too when new operands are allowed), equal dense torch, and are never deferred where something could
change an operand in between; a pending result never reaches anything but the next operator."""
import copy
import pickle
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ops_helpers import DENSITIES, assert_matches, dense_values, side, sparse
from scorch.sparse_ops import fusion
from scorch.sparse_ops.fusion import Pending, pending_of
from scorch.tensor_compiler import api, build
from scorch.tensor_type import PENDING_LIVE, make_pending


@pytest.fixture(autouse=True)
def eager_fusion():
    """The default policy (on, new operands only after a product) for every test, restored after; yields
    whether fusion was on when the test started."""
    was, tracer = fusion.eager_fusion_enabled(), sys.gettrace()
    new_operands = fusion._NEW_OPERANDS[0]
    fusion.set_eager_fusion(True)
    sys.settrace(None)     # a trace function (coverage, a debugger) turns deferral off
    smallest, fusion.MIN_ENTRIES[0] = fusion.MIN_ENTRIES[0], 0   # the tests' operands are small
    try:
        yield was
    finally:
        fusion.MIN_ENTRIES[0] = smallest
        sys.settrace(tracer)
        fusion.set_eager_fusion(was, new_operands)


def new_operands():
    """Defer also where the consumer brings a new operand (``A * B + C``): the mechanism's
    guards are tested there, where a new operand could be anything."""
    fusion.set_eager_fusion(True, new_operands=True)


@pytest.fixture
def kernels(monkeypatch):
    """Counts the compiler's kernel runs (``api.run``: every ``compute`` goes through it)."""
    count = [0]
    run = api.run

    def counting(entry, ops):
        count[0] += 1
        return run(entry, ops)
    monkeypatch.setattr(api, "run", counting)
    return count


# each expression written as a user would (the operators in this frame), with its dense value;
# these read only operands they already have and numbers: fused by default
FUSED_BY_DEFAULT = {
    "A*B+A": lambda A, B, C, D, E: A * B + A,
    "A+A*B": lambda A, B, C, D, E: A + A * B,
    "-(A*B)+A": lambda A, B, C, D, E: -(A * B) + A,
    "A*B*0.5+A": lambda A, B, C, D, E: A * B * 0.5 + A,
    "A-0.5*(A*B)": lambda A, B, C, D, E: A - 0.5 * (A * B),
    "A*B*B-A": lambda A, B, C, D, E: A * B * B - A,
    "A*B/2": lambda A, B, C, D, E: A * B / 2,
    "A*B*0.5": lambda A, B, C, D, E: A * B * 0.5,   # the number on the product's values
}
# these bring new operands: fused by default after a product, all with new_operands=True
WITH_NEW_OPERANDS = {
    "A*B+C": lambda A, B, C, D, E: A * B + C,
    "C+A*B": lambda A, B, C, D, E: C + A * B,
    "A*B-C": lambda A, B, C, D, E: A * B - C,
    "chain": lambda A, B, C, D, E: A * B + C * D - E,
    "-(A*B)+C": lambda A, B, C, D, E: -(A * B) + C,
}
EXPRESSIONS = {**FUSED_BY_DEFAULT, **WITH_NEW_OPERANDS}


def _eager(name, *operands):
    """The expression with fusion off: one kernel per operator."""
    fusion.set_eager_fusion(False)
    try:
        return EXPRESSIONS[name](*operands)
    finally:
        fusion.set_eager_fusion(True, fusion._NEW_OPERANDS[0])


# (expression, formats of A..E, dtype): a small fixed set, each a kernel compiled once
CASES = [
    ("A*B+C", ("csr",) * 5, torch.float32),
    ("A*B+C", ("coo",) * 5, torch.float64),
    ("C+A*B", ("csc",) * 5, torch.float32),
    ("A*B-C", ("dcsr",) * 5, torch.float64),
    ("chain", ("csr",) * 5, torch.float64),
    ("-(A*B)+C", ("csr",) * 5, torch.float32),
    ("A*B+C", ("csr", "csc", "coo", "csr", "csr"), torch.float64),
    ("A*B+A", ("csr",) * 5, torch.float32),
    ("A+A*B", ("coo", "csc") * 2 + ("csr",), torch.float64),
    ("-(A*B)+A", ("dcsr",) * 5, torch.float64),
    ("A*B*0.5+A", ("csc",) * 5, torch.float32),
    ("A-0.5*(A*B)", ("csr",) * 5, torch.float64),
    ("A*B*B-A", ("coo",) * 5, torch.float32),
    ("A*B/2", ("csr",) * 5, torch.float32),
    ("A*B*0.5", ("csc",) * 5, torch.float64),
]


@settings(max_examples=20, deadline=None)
@given(st.data(), st.sampled_from(range(len(CASES))), st.booleans(), st.booleans())
def test_fused_equals_dense_torch(data, case, same_pattern, with_new_operands):
    if with_new_operands:
        new_operands()
    name, fmts, dtype = CASES[case]
    m, n = data.draw(side()), data.draw(side())
    dense = [data.draw(dense_values((m, n), dtype)) for _ in range(5)]
    if same_pattern:   # B on A's pattern (other values): a product of one pattern
        dense[1] = dense[0] * 3 - 1 * (dense[0] != 0)
    ops = [sparse(x, f) for x, f in zip(dense, fmts)]
    got = EXPRESSIONS[name](*ops)
    assert pending_of(got) is None   # a result held in a name is never pending
    assert_matches(got, EXPRESSIONS[name](*dense), sparse=True)
    eager = _eager(name, *ops)
    assert got.format == eager.format
    assert_matches(got, eager.to_dense(), sparse=True)


@settings(max_examples=6, deadline=None)
@given(st.data(), st.sampled_from(DENSITIES))
def test_rank3_csf(data, density):
    shape = (data.draw(side(0, 3)), data.draw(side(0, 3)), data.draw(side(0, 3)))
    a, b, c = (data.draw(dense_values(shape, torch.float32, density)) for _ in range(3))
    A, B, C = (sparse(x, "csf") for x in (a, b, c))
    assert_matches(A * B + C, a * b + c, sparse=True)


def _three(fmt="csr", dtype=torch.float64, n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = [torch.rand(n, n + 3, generator=g, dtype=dtype)
             * (torch.rand(n, n + 3, generator=g) < 0.3) for _ in range(5)]
    return dense, [sparse(x, fmt) for x in dense]


def test_one_kernel_by_default(kernels):
    """No new operand (``A * B + A``, a number), or a product meeting one in a sum
    (``A * B + C``): one kernel; a sum meeting a new operand (``A + B + C``) or a product
    multiplied by one (``A * B * C``): two (a three-way union or intersection is slower than
    two two-way merges)."""
    (a, b, c, d, e), (A, B, C, D, E) = _three()
    for name, expression in FUSED_BY_DEFAULT.items():
        kernels[0] = 0
        got = expression(A, B, C, D, E)
        assert kernels[0] == 1, (name, kernels[0])
        assert_matches(got, expression(a, b, c, d, e), sparse=True)
    kernels[0] = 0
    got = A * B + 2          # a number added: one kernel, dense as the eager form
    assert kernels[0] == 1 and not isinstance(got, type(A))
    torch.testing.assert_close(got, a * b + 2)
    for name, expression in WITH_NEW_OPERANDS.items():
        kernels[0] = 0
        got = expression(A, B, C, D, E)
        # a product meets a new operand: one kernel (its matches merged with the operand);
        # the chain's sum ``A * B + C * D`` then meets E: two
        assert kernels[0] == (2 if name == "chain" else 1), (name, kernels[0])
        assert_matches(got, expression(a, b, c, d, e), sparse=True)
    kernels[0] = 0
    got = A + B + C          # a sum meets a new operand: not deferred (a three-way union)
    assert kernels[0] == 2
    assert_matches(got, a + b + c, sparse=True)
    kernels[0] = 0
    got = A * B * C          # a product multiplied by a new operand: not deferred either
    assert kernels[0] == 2
    assert_matches(got, a * b * c, sparse=True)


def test_one_kernel_with_new_operands(kernels):
    new_operands()
    (a, b, c, d, e), (A, B, C, D, E) = _three()
    for name in EXPRESSIONS:
        kernels[0] = 0
        got = EXPRESSIONS[name](A, B, C, D, E)
        assert kernels[0] == 1, (name, kernels[0])
        assert_matches(got, EXPRESSIONS[name](a, b, c, d, e), sparse=True)
    kernels[0] = 0
    x = A * B
    x + C                    # one statement per operator: two kernels
    assert kernels[0] == 2
    kernels[0] = 0
    torch.add(A * B, C)      # a call, not an operator: not deferred
    assert kernels[0] == 2


@pytest.mark.parametrize("with_new_operands", [False, True])
def test_in_place_change_between_statements(kernels, with_new_operands):
    if with_new_operands:
        new_operands()
    (a, b, c, _, _), (A, B, C, _, _) = _three()
    X = A * B              # stored: computed now
    A.mul_(2)
    assert_matches(X + C, a * b + c)
    Y = A * B
    A.values().mul_(2)
    assert_matches(Y + C, 2 * a * b + c)
    Z = A * B
    B.values().zero_()
    assert_matches(C + Z, 4 * a * b + c)
    W = A * B + A          # B is 0 now
    A.values().mul_(2)
    assert_matches(W + A, 4 * a + 8 * a)


def test_operand_with_its_own_operator_is_not_deferred():
    new_operands()
    (a, b, _, _, _), (A, B, _, _, _) = _three()

    class Sneaky:
        """Its + changes A first: the product must already be computed when it runs."""
        def __add__(self, other):
            A.values().mul_(10)
            return other.to_dense()

    torch.testing.assert_close(Sneaky() + A * B, a * b)           # made by a call
    s = Sneaky()                                                    # (A is now 10 a)
    torch.testing.assert_close(s + A * B, 10 * a * b)             # a local of another type
    A.values().div_(100)
    torch.testing.assert_close(s + (A * B - B), a * b - b)        # the chain too


def test_in_place_consumer():
    (a, b, c, _, _), (A, B, C, _, _) = _three()
    C2 = c.clone()          # dense: a sparse += keeps its own pattern
    C2 += A * B
    assert_matches(C2, a * b + c)
    A2 = A.clone()
    A2 *= A * B             # the product of sparse tensors on A's pattern
    assert_matches(A2, a * a * b)


def test_autograd_through_the_expression():
    (a, b, c, _, _), (A, B, C, _, _) = _three(seed=3)
    for t in (A, B, C):
        t.requires_grad_(True)
    da, db, dc = (x.clone().requires_grad_(True) for x in (a, b, c))
    out = A * B + C
    out.values().pow(2).sum().backward()
    ref = da * db + dc
    ref.pow(2).sum().backward()
    pattern = (a != 0).to(a.dtype)
    torch.testing.assert_close(A.grad.to_dense(), da.grad * pattern)
    torch.testing.assert_close(B.grad.to_dense(), db.grad * (b != 0))
    torch.testing.assert_close(C.grad.to_dense(), dc.grad * (c != 0))


def _pending(A, B, C):
    """A pending ``A * B + C`` as the fusion module makes it (for the leak checks)."""
    return make_pending(A.shape, A.dtype, Pending((A, B, C), ("add", ("mul", 0, 1), 2)))


@pytest.mark.parametrize("reader", [
    "repr", "str", "values", "to_dense", "indices", "pickle", "deepcopy", "nnz", "relu",
    "sum", "matmul", "format", "requires_grad"])
def test_pending_is_materialized_by_any_reader(reader):
    (a, b, c, _, _), (A, B, C, _, _) = _three(seed=5)
    P = _pending(A, B, C)
    expected = a * b + c
    if reader in ("repr", "str"):
        text = repr(P) if reader == "repr" else str(P)
        assert f"nnz={int((expected != 0).sum())}" in text
    elif reader == "values":
        assert P.values().numel() == int((expected != 0).sum())
    elif reader == "to_dense":
        assert_matches(P.to_dense(), expected)
    elif reader == "indices":
        assert P.indices().shape[1] == int((expected != 0).sum())
    elif reader == "pickle":
        assert_matches(pickle.loads(pickle.dumps(P)), expected)
    elif reader == "deepcopy":
        assert_matches(copy.deepcopy(P), expected)
    elif reader == "nnz":
        assert P.nnz == int((expected != 0).sum())
    elif reader == "relu":
        assert_matches(torch.relu(P), torch.relu(expected))
    elif reader == "sum":
        torch.testing.assert_close(P.sum(), expected.sum())
    elif reader == "matmul":
        x = torch.rand(expected.shape[1], 2, dtype=expected.dtype)
        torch.testing.assert_close(P @ x, expected @ x)
    elif reader == "format":
        assert P.format == A.format and P.is_sparse
    else:
        P.requires_grad_(True)
        P.values().sum().backward()
        assert P.grad is not None
    assert pending_of(P) is None
    A.values().mul_(2)   # computed already: later changes do not reach it
    assert_matches(P.to_dense(), expected)


def test_results_held_in_names_are_never_pending():
    (_, _, _, _, _), (A, B, C, _, _) = _three()
    X = A * B + C * B - C
    assert pending_of(X) is None
    values = [A * B, A * B + C]
    assert all(pending_of(v) is None for v in values)
    assert PENDING_LIVE[0] == 0    # every pending made was consumed (computed once)


def test_on_by_default(eager_fusion):
    assert eager_fusion == build.env_flag("SCORCH_EAGER_FUSION")
    assert not fusion._NEW_OPERANDS[0]


def test_off_runs_two_kernels(kernels):
    fusion.set_eager_fusion(False)
    (a, b, c, _, _), (A, B, C, _, _) = _three()
    kernels[0] = 0
    assert_matches(A * B + A, a * b + a)
    assert kernels[0] == 2
    kernels[0] = 0
    assert_matches(A * B * 0.5 + A, a * b * 0.5 + a)
    assert kernels[0] == 2


def test_not_deferred_under_a_trace_function(kernels):
    (a, b, c, _, _), (A, B, C, _, _) = _three()
    sys.settrace(lambda frame, event, arg: None)
    try:
        kernels[0] = 0
        got = A * B + A
    finally:
        sys.settrace(None)
    assert kernels[0] == 2
    assert_matches(got, a * b + a)


def test_not_deferred_under_a_torch_function_mode(kernels):
    new_operands()
    from torch.overrides import TorchFunctionMode
    (a, b, c, _, _), (A, B, C, _, _) = _three()

    class Changes(TorchFunctionMode):
        """Runs user code on every torch op: here it changes A before each add."""
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("add", "__add__"):
                A.values().mul_(2)
            return func(*args, **(kwargs or {}))

    with Changes():
        got = c + A * B              # dense c: torch's + runs the mode first
    assert_matches(got, a * b + c)   # the product was computed before the mode changed A


GLOBAL_C = None


def test_names_of_every_kind(kernels):
    """Locals, closure cells, globals and module-level names (LOAD_FAST, LOAD_DEREF,
    LOAD_GLOBAL, LOAD_NAME) are all read to check the operands' types."""
    new_operands()
    global GLOBAL_C
    (a, b, c, _, _), (A, B, C, _, _) = _three()
    GLOBAL_C = C

    def closure():
        return A * B + C

    def with_global():
        return A * B + GLOBAL_C
    names = {"A": A, "B": B, "C": C}
    runs = (closure, with_global, lambda: exec("R = A * B + C", names) or names["R"])
    for run in runs:
        kernels[0] = 0
        assert_matches(run(), a * b + c)
        assert kernels[0] == 1, run
    fusion.set_eager_fusion(True)    # the default: C now names A, an operand it has
    C = GLOBAL_C = names["C"] = A
    for run in runs:
        kernels[0] = 0
        assert_matches(run(), a * b + a)
        assert kernels[0] == 1, run


def test_small_operands_are_not_deferred(kernels):
    """Below ``MIN_ENTRIES`` stored entries the bytecode is not read: two kernels, as in
    plain eager mode (the read would cost more than fusion saves)."""
    import scorch
    fusion.MIN_ENTRIES[0] = 16384
    d = torch.rand(30, 30) * (torch.rand(30, 30) < 0.3)
    A = scorch.sparse_tensor(d, format="csr")
    B = scorch.sparse_tensor(d * 2, format="csr")
    before = kernels[0]
    R = A * B + A
    assert kernels[0] - before == 2
    torch.testing.assert_close(R.to_dense(), d * (d * 2) + d)
