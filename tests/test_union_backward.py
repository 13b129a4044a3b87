"""Backward of two-operand elementwise ops whose sparse operands have DIFFERENT patterns
(``maximum``, ``minimum``, ``where``, ``A + B``, ``A * B``): each operand's gradient on its own
pattern equals dense torch's at its stored entries, including ties (torch splits a tie's
gradient evenly), NaN entries, explicit zeros, empty and full patterns.

``expr_grad.operand_gradient`` runs one kernel per sparse operand (the derivatives of all its
occurrences summed into one expression) and places the result on the operand's pattern
without a search where the kernel produced exactly that pattern (``pattern.values_from_factor``).
The kernels are few (one per op and format), so hypothesis is derandomized."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

KERNELS = settings(max_examples=30, deadline=None, derandomize=True)
FORMATS = ["csr", "csc", "coo", "dcsr"]
OPS = {"maximum": torch.maximum, "minimum": torch.minimum,
       "where": lambda a, b: torch.where(a > 0, a, b), "add": lambda a, b: a + b,
       "sub_mul": lambda a, b: 2 * a - b * 3}
#: stored values: ties between the operands (1 against 1), explicit zeros (a tie with the
#: other side's implicit zero) and NaN
VALUES = torch.tensor([-1.0, 0.0, 1.0, 2.0, float("nan")], dtype=torch.float64)


def _operand(draw, shape, density, fmt, with_nan):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(shape, generator=g) < density
    idx = mask.nonzero().T
    choices = VALUES if with_nan else VALUES[:-1]
    vals = choices[torch.randint(0, choices.numel(), (idx.shape[1],), generator=g)]
    dense = torch.zeros(shape, dtype=torch.float64)
    dense[tuple(idx)] = vals
    S = scorch.sparse_tensor((idx, vals.clone()), size=shape, format=fmt, requires_grad=True)
    return S, dense.requires_grad_(), mask


def _check(got, want, mask, skip=None):
    """``got`` (a gradient on the operand's pattern) equals ``want`` at the stored entries
    (but those in ``skip``)."""
    assert isinstance(got, scorch.SparseTensor)
    expected, got = torch.where(mask, want, torch.zeros((), dtype=want.dtype)), got.to_dense()
    if skip is not None:
        expected, got = expected[~skip], got[~skip]
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


@KERNELS
@given(st.data(), st.sampled_from(sorted(OPS)), st.sampled_from(FORMATS),
       st.sampled_from([0.0, 0.4, 1.0]), st.sampled_from([0.0, 0.4, 1.0]), st.booleans())
def test_gradients_on_each_pattern_match_dense(data, op, fmt, da, db, with_nan):
    shape = (data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6)))
    A, a, ma = _operand(data.draw, shape, da, fmt, with_nan)
    B, b, mb = _operand(data.draw, shape, db, fmt, with_nan)
    f = OPS[op]
    Y = f(A, B)
    # the incoming gradient: random on the result's stored entries, 0 elsewhere (the dense
    # loss weighs only those entries, so the dense gradients are the reference)
    w = torch.randn(Y.nnz, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (Y.values() * w).sum().backward()
    W = torch.zeros(shape, dtype=torch.float64)
    if Y.nnz:
        W[tuple(Y.indices())] = w
    (f(a, b) * W).sum().backward()
    _check(A.grad, a.grad, ma, None)
    _check(B.grad, b.grad, mb, None)
    assert A.grad.nnz == A.nnz and B.grad.nnz == B.nnz


@pytest.mark.parametrize("fmt", FORMATS)
def test_maximum_tie_splits_the_gradient(fmt):
    # ties on shared entries, A-only and B-only entries (against the other side's zero)
    a = torch.tensor([[1.0, 0.0, 3.0], [0.0, -2.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 5.0, 0.0], [4.0, -2.0, 0.0]], dtype=torch.float64)
    A = scorch.sparse_tensor(a, format=fmt, requires_grad=True)
    B = scorch.sparse_tensor(b, format=fmt, requires_grad=True)
    torch.maximum(A, B).values().sum().backward()
    ad, bd = a.clone().requires_grad_(), b.clone().requires_grad_()
    W = ((a != 0) | (b != 0)).double()
    (torch.maximum(ad, bd) * W).sum().backward()
    _check(A.grad, ad.grad, a != 0)
    _check(B.grad, bd.grad, b != 0)
    assert A.grad.to_dense()[0, 0] == 0.5 and B.grad.to_dense()[1, 1] == 0.5


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_nan_entries_match_dense(op):
    # NaN against a number, against the other side's implicit zero, and against NaN
    nan = float("nan")
    a = torch.tensor([[nan, 1.0, nan], [2.0, 0.0, nan]], dtype=torch.float64)
    b = torch.tensor([[3.0, nan, 0.0], [0.0, nan, nan]], dtype=torch.float64)
    A = scorch.sparse_tensor(a, format="csr", requires_grad=True)
    B = scorch.sparse_tensor(b, format="coo", requires_grad=True)
    Y = OPS[op](A, B)
    w = torch.arange(1.0, Y.nnz + 1, dtype=torch.float64)
    (Y.values() * w).sum().backward()
    W = torch.zeros(a.shape, dtype=torch.float64)
    W[tuple(Y.indices())] = w
    ad, bd = a.clone().requires_grad_(), b.clone().requires_grad_()
    (OPS[op](ad, bd) * W).sum().backward()
    _check(A.grad, ad.grad, a != 0)
    _check(B.grad, bd.grad, b != 0)


def test_one_kernel_per_operand():
    """The gradient of each operand runs one kernel, not one per occurrence (maximum's
    derivative has 4 occurrences of A and 3 of B)."""
    from scorch.gradients import expr_grad
    calls = []
    real = expr_grad._occurrence

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    A = scorch.sparse_tensor(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), format="csr", requires_grad=True)
    B = scorch.sparse_tensor(torch.tensor([[0.0, 3.0], [0.0, 1.0]]), format="csr", requires_grad=True)
    expr_grad._occurrence = counting
    try:
        torch.maximum(A, B).values().sum().backward()
    finally:
        expr_grad._occurrence = real
    assert len(calls) == 2
    torch.testing.assert_close(A.grad.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    torch.testing.assert_close(B.grad.to_dense(), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gradient_placed_without_searching_the_pattern(fmt, monkeypatch):
    """The kernel's result holds the operand's entries (the incoming gradient covers them):
    its values are placed as they are (through the COO's permutation), no key sort/search."""
    from scorch.gradients import pattern

    def refuse(*args):
        raise AssertionError("positions_in_pattern called")
    a = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 3.0, 2.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    A = scorch.sparse_tensor(a, format=fmt, requires_grad=True)
    B = scorch.sparse_tensor(b, format=fmt, requires_grad=True)
    Y = torch.maximum(A, B)
    monkeypatch.setattr(pattern, "positions_in_pattern", refuse)
    Y.values().sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), torch.tensor([[1.0, 0, 0.5], [0, 1, 0]], dtype=torch.float64))
    torch.testing.assert_close(B.grad.to_dense(), torch.tensor([[0.0, 1, 0.5], [1, 0, 0]], dtype=torch.float64))
