"""In-place and elementwise semantics of sparse tensors against dense torch (session 36):
in-place ops keep the pattern or raise, their operator spellings agree with their method
spellings, an optimizer step acts on the stored values for every dtype, and result types
follow torch (default dtype, integer wrap-around)."""
from __future__ import annotations

import operator

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

D = torch.tensor([[0.0, 1.5, 0.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, -2.0, 0.0],
                  [3.0, 0.0, 0.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0]])


def sparse(x, fmt="csr"):
    return scorch.sparse_tensor(x, format=fmt)


def dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


# --- 1. a scalar added in place -------------------------------------------------------------

SCALAR_STEPS = {
    "S += 2": lambda s: operator.iadd(s, 2),
    "S.add_(2)": lambda s: s.add_(2),
    "S.add_(1, alpha=2)": lambda s: s.add_(1, alpha=2),
    "S += tensor(2)": lambda s: operator.iadd(s, torch.tensor(2, dtype=s.dtype)),
    "S -= 2": lambda s: operator.isub(s, 2),
    "S.sub_(1)": lambda s: s.sub_(1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.float16])
@pytest.mark.parametrize("name", sorted(SCALAR_STEPS))
def test_scalar_added_in_place_leaves_the_pattern_so_it_raises(name, dtype):
    S = sparse(D.to(dtype))
    with pytest.raises(RuntimeError, match="unstored positions too"):
        SCALAR_STEPS[name](S)
    assert torch.equal(S.to_dense(), D.to(dtype))          # nothing written


@pytest.mark.parametrize("name", sorted(SCALAR_STEPS))
def test_scalar_added_in_place_to_a_full_pattern_is_the_dense_op(name):
    full = torch.arange(1.0, 7.0).reshape(2, 3)
    S = sparse(full)
    out = SCALAR_STEPS[name](S)
    assert out is S and S.nnz == 6
    assert torch.equal(S.to_dense(), SCALAR_STEPS[name](full.clone()))


def test_zero_added_in_place_changes_nothing_and_keeps_autograd():
    A = scorch.sparse_tensor(D.double(), format="csr", requires_grad=True)
    B = A * 2.0
    B += 0
    B.sub_(torch.tensor(0.0, dtype=torch.float64))
    assert torch.equal(B.to_dense(), 2 * D.double())
    B.to_dense().sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), 2.0 * (D != 0).double())


def test_scalar_added_below_torch_function_raises_outside_a_step():
    S = sparse(D)
    with pytest.raises(RuntimeError, match="unstored positions too"):
        torch._foreach_add_([S], 1.0)
    with pytest.raises(RuntimeError, match="unstored positions too"):
        torch.ops.aten.sub_.Scalar(S, 2.0)
    assert torch.equal(S.to_dense(), D)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=6, max_size=6), st.sampled_from([0.0, 1.0, -2.5, float("nan")]))
def test_scalar_add_in_place_raises_exactly_when_the_result_leaves_the_pattern(mask, value):
    x = (torch.tensor(mask) * torch.arange(1.0, 7.0, dtype=torch.float64)).reshape(2, 3)
    S = scorch.sparse_tensor((torch.nonzero(x).t(), x[x != 0]), size=(2, 3), format="coo")
    leaves = value != 0 and not all(mask)                 # (NaN != 0)
    if leaves:
        with pytest.raises(RuntimeError, match="unstored positions"):
            S.add_(value)
    else:
        S.add_(value)
        torch.testing.assert_close(S.to_dense(), x + value, equal_nan=True)


# --- 2. division in place by a sparse tensor ------------------------------------------------

def test_division_in_place_by_a_sparse_tensor_raises_where_dense_torch_gives_nan():
    for divide in (lambda s, t: s.div_(t), lambda s, t: operator.itruediv(s, t)):
        S = sparse(D)
        with pytest.raises(RuntimeError, match="in-place ops keep the pattern"):
            divide(S, sparse(D))
        assert torch.equal(S.to_dense(), D)
    other = torch.zeros(4, 5)
    other[0, 1], other[2, 2] = 3.0, 1.0
    with pytest.raises(RuntimeError, match="divisor stores 2 of 20") as err:
        sparse(D).div_(sparse(other))
    assert "optimizer" not in str(err.value)               # not the optimizer-state message


def test_division_in_place_by_a_sparse_tensor_storing_everything_is_the_dense_op():
    e = torch.arange(1.0, 21.0).reshape(4, 5)
    S = sparse(D)
    S /= sparse(e, "coo")
    assert torch.equal(S.to_dense(), D / e)


# --- 3. operator spellings of pattern-keeping in-place ops ----------------------------------

IN_PLACE = {
    "S **= 2": (lambda s: operator.ipow(s, 2), lambda d: d ** 2),
    "S.pow_(2)": (lambda s: s.pow_(2), lambda d: d ** 2),
    "S //= 2": (lambda s: operator.ifloordiv(s, 2), lambda d: d // 2),
    "S.floor_divide_(2)": (lambda s: s.floor_divide_(2), lambda d: d // 2),
    "S %= 3": (lambda s: operator.imod(s, 3), lambda d: d % 3),
    "S.remainder_(0.7)": (lambda s: s.remainder_(0.7), lambda d: d.remainder(0.7)),
    "S.fmod_(0.7)": (lambda s: s.fmod_(0.7), lambda d: d.fmod(0.7)),
    "S.fill_(0)": (lambda s: s.fill_(0), lambda d: torch.zeros_like(d)),
    "S.fill_(tensor(0))": (lambda s: s.fill_(torch.tensor(0.0)), lambda d: torch.zeros_like(d)),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_forms_keep_the_pattern_as_their_out_of_place_forms(name):
    op, oracle = IN_PLACE[name]
    S = sparse(D)
    nnz = S.nnz
    assert op(S) is S
    assert S.nnz == nnz and isinstance(S, scorch.SparseTensor)
    assert torch.equal(S.to_dense(), oracle(D))


def test_in_place_forms_that_move_zero_raise():
    for op in (lambda s: s.fill_(3.0), lambda s: s.fmod_(0.0), lambda s: operator.ipow(s, 0)):
        S = sparse(D)
        with pytest.raises(RuntimeError, match="could not stay sparse"):
            op(S)
        assert torch.equal(S.to_dense(), D)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        operator.ifloordiv(sparse(D.long()), 0)               # as dense torch


def test_in_place_power_under_autograd_is_rebased():
    A = scorch.sparse_tensor(D.double(), format="csr", requires_grad=True)
    B = A * 1.0
    B **= 3
    B.to_dense().sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), 3 * D.double() ** 2)


# --- 4. numpy operands ----------------------------------------------------------------------

def test_numpy_operand_of_floor_division():
    nd = np.arange(1, 6, dtype=np.float32)
    A = sparse(D)
    assert torch.equal(dense(A // nd), D // torch.as_tensor(nd))
    assert torch.equal(dense(A // np.array(2.0, dtype=np.float32)), D // 2)


def test_numpy_operand_of_mod_pow_and_augmented_assignment():
    """torch's C operator methods (``__mod__``, ``__iadd__``, ...) decline a numpy operand
    before ``__torch_function__``: SparseTensor's read it as a tensor (``tensor_type._reading_numpy``)."""
    nd = np.arange(1, 6, dtype=np.float32)
    A = sparse(D)
    assert torch.equal(dense(A % nd), D % torch.as_tensor(nd))
    assert torch.equal(dense(A ** nd), D ** torch.as_tensor(nd))
    S = alias = sparse(D)
    with pytest.raises(RuntimeError, match="outside the sparse tensor's pattern"):
        S += np.ones((4, 5), np.float32)                   # as S += a dense tensor
    assert S is alias


# --- 5. and 6. result types -----------------------------------------------------------------

def test_python_float_promotes_to_the_current_default_dtype():
    xi = torch.tensor([[123456789, 0], [0, 7]])
    S = sparse(xi)
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            for f in (lambda a: a + 0.5, lambda a: a - 0.5, lambda a: a * 2.5):
                got, want = f(S), f(xi)
                assert got.dtype == want.dtype == default
                assert torch.equal(dense(got), want)
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16])
def test_out_of_range_integer_scalar_wraps_as_dense_torch(dtype):
    x = torch.tensor([[3, 0, 5], [0, 0, 7]], dtype=dtype)
    S = sparse(x)
    for f in (lambda a: a + 1000, lambda a: a - 1000, lambda a: a * 1000, lambda a: a + 100000,
              lambda a: torch.add(a, 300), lambda a: a < 1000, lambda a: torch.sub(a, 300, alpha=2)):
        got, want = dense(f(S)), f(x)
        assert got.dtype == want.dtype and torch.equal(got, want)


# --- 7. and 8. optimizer steps --------------------------------------------------------------

OPTIMIZERS = [("SGD", {}), ("SGD", {"momentum": 0.9, "weight_decay": 0.1}), ("NAdam", {}),
              ("NAdam", {"weight_decay": 0.1}), ("RAdam", {}), ("Adamax", {}),
              ("Adamax", {"weight_decay": 0.1}), ("Adadelta", {}), ("ASGD", {}), ("Rprop", {}),
              ("Rprop", {"foreach": True})]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=[f"{n}{k}" for n, k in OPTIMIZERS])
def test_optimizer_steps_a_half_precision_sparse_parameter_as_dense_training(name, kw, dtype):
    """The sparse parameter's values follow dense training restricted to the pattern (the
    dense weight read through the mask, so nothing off the pattern takes part)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 8, generator=g)
    mask = torch.rand(6, 8, generator=g) < 0.4
    w = w * mask
    x = torch.randn(8, 3, generator=g)
    P = torch.nn.Parameter(sparse(w.to(dtype)))
    Wd = torch.nn.Parameter(w.to(dtype))
    opt = getattr(torch.optim, name)([P], lr=0.01, **kw)
    opt_d = getattr(torch.optim, name)([Wd], lr=0.01, **kw)
    for _ in range(2):
        opt.zero_grad()
        opt_d.zero_grad()
        (P.float() @ x).pow(2).sum().backward()
        (torch.where(mask, Wd, 0).float() @ x).pow(2).sum().backward()
        opt.step()
        opt_d.step()
    assert isinstance(P, scorch.SparseTensor) and P.dtype == dtype and P.nnz == int(mask.sum())
    got = P.detach().to_dense().float()
    want = torch.where(mask, Wd.detach(), 0).float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_hand_built_gradient_on_the_pattern_is_accepted():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 8, generator=g) * (torch.rand(6, 8, generator=g) < 0.4)
    x = torch.randn(8, 3, generator=g)
    results = []
    for rebuild in (False, True):
        P = torch.nn.Parameter(sparse(w))
        opt = torch.optim.Adam([P], lr=0.01)
        (P @ x).pow(2).sum().backward()
        if rebuild:                                        # a fresh tensor on P's exact pattern
            P.grad = sparse(P.grad.to_dense())
        opt.step()
        results.append(P.detach().to_dense())
    assert torch.equal(results[0], results[1])
    assert not torch.equal(results[0], w)


# --- 9. integer bitwise ops -----------------------------------------------------------------

DI = torch.tensor([[3, 0, -6, 0], [0, 5, 0, 12]])
DJ = torch.tensor([[1, 7, 0, 0], [0, 4, 2, 8]])
BITWISE = {
    "I & I": (lambda i, j: i & i), "I & J": (lambda i, j: i & j), "I & 6": (lambda i, j: i & 6),
    "6 & I": (lambda i, j: 6 & i), "I & row": (lambda i, j: i & torch.tensor([1, 2, 3, 4])),
    "bitwise_and(I, J)": (lambda i, j: torch.bitwise_and(i, j)), "I << 2": (lambda i, j: i << 2),
    "I >> 1": (lambda i, j: i >> 1), "I >> J": (lambda i, j: i >> j),
    "I.bitwise_left_shift(1)": (lambda i, j: i.bitwise_left_shift(1)),
}


@pytest.mark.parametrize("name", sorted(BITWISE))
def test_integer_bitwise_ops_that_keep_zero_are_sparse(name):
    f = BITWISE[name]
    r = f(sparse(DI), sparse(DJ, "coo"))
    want = f(DI, DJ)
    assert isinstance(r, scorch.SparseTensor)
    assert r.dtype == want.dtype and torch.equal(r.to_dense(), want)


def test_integer_bitwise_ops_that_move_zero_stay_dense_and_correct():
    I, J = sparse(DI), sparse(DJ)
    for f in (lambda i, j: i | j, lambda i, j: i ^ 3, lambda i, j: 3 << i):
        r = f(I, J)
        assert not isinstance(r, scorch.SparseTensor) and torch.equal(r, f(DI, DJ))


def test_integer_bitwise_in_place_keeps_the_pattern():
    for op in (lambda i: operator.iand(i, 5), lambda i: operator.ilshift(i, 2),
               lambda i: operator.irshift(i, 1), lambda i: i.bitwise_and_(torch.tensor([1, 2, 3, 4]))):
        S = sparse(DI)
        assert op(S) is S
        assert torch.equal(S.to_dense(), op(DI.clone()))


def test_integer_bitwise_follows_the_stored_entries():
    n = 200_000
    idx = torch.stack([torch.arange(n), torch.arange(n)])
    B = scorch.sparse_tensor((idx, torch.arange(n) + 1), size=(n, n), format="csr")
    for r, want in ((B & B, torch.arange(n) + 1), (B & 6, (torch.arange(n) + 1) & 6),
                    (B << 2, (torch.arange(n) + 1) << 2)):
        assert isinstance(r, scorch.SparseTensor) and r.nnz == n
        assert torch.equal(r.values(), want)
