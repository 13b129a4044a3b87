"""A sparse operand's gradient from the product the forward keeps
(``gradients.partial_product``): the MoE layer ``bd,ndh,bn->bh`` keeps ``P(b,n,h)`` and its
gate gradient becomes a dot of ``grad`` and ``P`` at each stored gate value. Oracle: dense
torch autograd (the sparse operand's gradient on its pattern), over shapes with 0/1-sized
dims, empty to full gates, float32/64, csr/csc/coo gates, either operand order; the split
is taken where it pays and never where it does not (no hidden variable, a large ``P``,
inference, double backward)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.gradients import functions, partial_product

SETTINGS = dict(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture
def split_calls(monkeypatch):
    """How many sparse gradients came from a kept product."""
    calls = []
    original = functions._partial_gradient

    def counted(*args):
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(functions, "_partial_gradient", counted)
    return calls


@st.composite
def cases(draw):
    b = draw(st.sampled_from([0, 1, 7, 33]))
    d = draw(st.sampled_from([1, 5, 40]))
    h = draw(st.sampled_from([1, 8, 37]))
    n = draw(st.sampled_from([1, 2, 5]))
    k = draw(st.integers(0, n))
    return (b, d, h, n, k, draw(st.sampled_from([torch.float32, torch.float64])),
            draw(st.sampled_from(["csr", "csc", "coo"])), draw(st.booleans()), draw(st.integers(0, 3)))


@settings(**SETTINGS)
@given(cases())
def test_gradients_equal_dense(case):
    b, d, h, n, k, dtype, fmt, gate_first, seed = case
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, d, generator=g, dtype=dtype, requires_grad=True)
    E = torch.rand(n, d, h, generator=g, dtype=dtype, requires_grad=True)
    dense = topk_gate(b, n, k, dtype, seed)
    G = scorch.sparse_tensor(dense, format=fmt).requires_grad_()
    Gd = dense.clone().requires_grad_()
    eq, ops, dense_ops = (("bn,bd,ndh->bh", (G, x, E), (Gd, x, E)) if gate_first
                          else ("bd,ndh,bn->bh", (x, E, G), (x, E, Gd)))
    dy = torch.rand(b, h, generator=g, dtype=dtype)
    calls = []
    original = functions._partial_gradient
    with mock.patch.object(functions, "_partial_gradient", lambda *a: calls.append(1) or original(*a)):
        got, y, was_sparse = _forward_backward(eq, ops, dy)
    # P (b, n, h) against the work nnz * d * h: kept where n <= nnz * d / (16 b) and
    # n <= 8 k, for a dense result (format inference keeps some sparse: made as before)
    if b and k and n * 16 <= k * d and n <= 8 * k and not was_sparse:
        assert calls == [1]
    tol = dict(rtol=1e-4, atol=1e-4 * d) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10 * d)
    torch.testing.assert_close(y, torch.einsum(eq, *dense_ops), **tol)
    want = torch.autograd.grad(torch.einsum(eq, *dense_ops), (x, E, Gd), dy)
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    dG = got[2].to_dense() if isinstance(got[2], scorch.SparseTensor) else got[2]
    torch.testing.assert_close(dG, want[2] * (dense != 0), **tol)


def _forward_backward(eq, ops, dy):
    y = scorch.einsum(eq, *ops)
    was_sparse = isinstance(y, scorch.SparseTensor)
    if was_sparse:
        y = y.to_dense()
    x, E, G = (ops[1], ops[2], ops[0]) if eq.startswith("bn") else ops
    return torch.autograd.grad(y, (x, E, G), dy), y.detach(), was_sparse


def test_moe_gate_gradient_from_the_kept_product(split_calls):
    x, E = torch.rand(64, 40), torch.rand(4, 40, 24, requires_grad=True)
    G = scorch.sparse_tensor(topk_gate(64, 4, 2), format="csr").requires_grad_()
    y = scorch.einsum("bd,ndh,bn->bh", x, E, G)
    y.pow(2).sum().backward()
    assert split_calls == [1] and G.grad is not None and E.grad is not None


def test_no_split_where_it_does_not_pay(split_calls):
    A = scorch.sparse_tensor(torch.rand(30, 20) * (torch.rand(30, 20) < 0.3), format="csr").requires_grad_()
    B = torch.rand(20, 8, requires_grad=True)
    scorch.einsum("ij,jk->ik", A, B).sum().backward()                 # no hidden variable
    G = scorch.sparse_tensor(topk_gate(64, 4, 2), format="csr").requires_grad_()
    with torch.no_grad():                                             # inference
        scorch.einsum("bd,ndh,bn->bh", torch.rand(64, 40), torch.rand(4, 40, 24), G)
    # P (b, n, h) dense would be far larger than the work on 2 stored entries
    S = scorch.sparse_tensor(torch.zeros(400, 300).index_put_((torch.tensor([0, 1]), torch.tensor([2, 3])),
                                                              torch.tensor([1.0, 2.0])), format="csr")
    S.requires_grad_()
    scorch.einsum("bd,ndh,bn->bh", torch.rand(400, 2), torch.rand(300, 2, 50), S).sum().backward()
    # 1 expert in 64: P would be 64 rows per row used
    G = scorch.sparse_tensor(topk_gate(64, 64, 1), format="csr").requires_grad_()
    scorch.einsum("bd,ndh,bn->bh", torch.rand(64, 40), torch.rand(64, 40, 24), G).sum().backward()
    assert split_calls == []
    assert partial_product.partial_plan("ij,jk->ik", 0, 2) is None
    assert partial_product.partial_plan("ii,ik,kl->il", 0, 3) is None
    assert partial_product.partial_plan("...d,ndh,bn->bh", 2, 3) is None
    plan = partial_product.partial_plan("bd,ndh,bn->bh", 2, 3)
    assert (plan.p_term, plan.hidden, plan.p_equation, plan.out_equation) == \
        ("bnh", "d", "bn,bd,ndh->bnh", "bnh,bn->bh")


def test_double_backward_recontracts(split_calls):
    """With create_graph the gate gradient is itself differentiable in E: it comes from the
    original einsum, not from the constant P."""
    x = torch.rand(16, 6, dtype=torch.float64)
    E = torch.rand(3, 6, 5, dtype=torch.float64, requires_grad=True)
    dense = topk_gate(16, 3, 2, torch.float64)
    G = scorch.sparse_tensor(dense, format="csr").requires_grad_()
    (dG,) = torch.autograd.grad(scorch.einsum("bd,ndh,bn->bh", x, E, G).sum(), (G,), create_graph=True)
    assert split_calls == []
    Ed = E.detach().clone().requires_grad_()
    Gd = dense.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.einsum("bd,ndh,bn->bh", x, Ed, Gd).sum(), (Gd,), create_graph=True)
    torch.testing.assert_close(dG.to_dense(), want * (dense != 0))
