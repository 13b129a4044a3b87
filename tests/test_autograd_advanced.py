"""Autograd beyond one backward with sparse tensors (the sixth adversarial sweep): second
order through in-place ops, gradients accumulated across patterns, and what a backward
keeps alive."""
from __future__ import annotations

import gc

import pytest
import torch

import scorch

DT = torch.float64


def _operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 6, generator=g) < 0.5
    a = torch.randn(6, 6, generator=g, dtype=DT) * mask
    b = torch.randn(6, 6, generator=g, dtype=DT) * mask
    return a, b, torch.randn(6, 3, generator=g, dtype=DT)


@pytest.mark.parametrize("change", [
    lambda c, b: c.mul_(2), lambda c, b: c.div_(2), lambda c, b: c.tanh_(), lambda c, b: c.relu_(),
    lambda c, b: c.mul_(b.detach()), lambda c, b: c.add_(b.detach()),
    lambda c, b: c.masked_fill_(c > 0.5, 0.0)])
def test_gradient_penalty_through_an_in_place_op(change):
    """``grad(..., create_graph=True)`` through ``C.op_()`` keeps the second-order terms
    (the in-place backward used to hand back a constant)."""
    a, b, x = _operands()
    mask = a != 0

    def penalty(A, B, sparse):
        C = A * B
        change(C, B)
        y = torch.tanh(C @ x).square().sum()
        gA, gB = torch.autograd.grad(y, (A, B), create_graph=True)
        # a sparse operand's gradient lives on its pattern: the dense one restricted there
        gA = gA.to_dense() if sparse else gA * mask
        gB = gB.to_dense() if sparse else gB * mask
        return (gA.square().sum() + gB.square().sum())

    A = scorch.sparse_tensor(a, format="csr").requires_grad_()
    B = scorch.sparse_tensor(b, format="csr").requires_grad_()
    hA, hB = torch.autograd.grad(penalty(A, B, True), (A, B))
    Ad, Bd = a.clone().requires_grad_(), b.clone().requires_grad_()
    wA, wB = torch.autograd.grad(penalty(Ad, Bd, False), (Ad, Bd))
    torch.testing.assert_close(hA.to_dense(), wA * mask)
    torch.testing.assert_close(hB.to_dense(), wB * mask)


def test_gradient_penalty_through_an_in_place_op_with_a_tracked_tensor_is_refused():
    """``C.mul_(B)`` with ``B`` requiring grad: the values before the change depend on ``B``
    too; rather than count that path twice, a second-order gradient is refused (first
    order is exact)."""
    a, b, x = _operands(1)
    A = scorch.sparse_tensor(a, format="csr").requires_grad_()
    B = scorch.sparse_tensor(b, format="csr").requires_grad_()
    C = A * B
    C.mul_(B)
    y = torch.tanh(C @ x).square().sum()
    with pytest.raises(NotImplementedError, match="create_graph"):
        torch.autograd.grad(y, (A, B), create_graph=True)
    C = A * B
    C.mul_(B)
    gA, gB = torch.autograd.grad(torch.tanh(C @ x).square().sum(), (A, B))
    Ad, Bd = a.clone().requires_grad_(), b.clone().requires_grad_()
    wA, wB = torch.autograd.grad(torch.tanh((Ad * Bd * Bd) @ x).square().sum(), (Ad, Bd))
    torch.testing.assert_close(gA.to_dense(), wA * (a != 0))
    torch.testing.assert_close(gB.to_dense(), wB * (a != 0))


@pytest.mark.parametrize("late", ["register_hook", "retain_grad"])
def test_a_hook_on_a_sparse_intermediate(late):
    """Registered before the tensor's first use it runs (torch's own); after a use that read
    the values directly, where it would never run, it is refused."""
    a, _, _ = _operands(2)
    A = scorch.sparse_tensor(a, format="csr").requires_grad_()
    seen = []
    B = A * 2
    B.register_hook(lambda g: seen.append(1) or g * 10)
    B.relu().square().sum().backward()
    assert seen == [1]
    torch.testing.assert_close(A.grad.to_dense(), 80 * a.clamp(min=0))
    B = A * 2
    B.relu().square().sum()                 # a use (read through the values shortcut)
    with pytest.raises(RuntimeError, match="after an op has used it"):
        B.register_hook(lambda g: g) if late == "register_hook" else B.retain_grad()
    C = A * 3
    C.retain_grad()
    C.relu().sum().backward()
    torch.testing.assert_close(C.grad.to_dense(), (3 * a > 0).to(DT))


def test_gradient_accumulates_into_a_grad_of_another_pattern_or_format():
    """Autograd adds a new gradient into an existing ``.grad``: kept through
    ``zero_grad(set_to_none=False)`` across a pruning (``p.data = sparse``), or assigned in
    another format; the buffer takes the union, and the step applies it on the pattern."""
    a, _, x = _operands(3)
    a[:, 0] = 1.0
    g_ones = torch.ones(6, 3, dtype=DT) @ x.t()
    A = torch.nn.Parameter(scorch.sparse_tensor(a, format="csr"))
    opt = torch.optim.SGD([A], lr=0.1)
    (A @ x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    pruned = A.detach().to_dense() * (A.detach().to_dense().abs() > 0.5)
    A.data = scorch.sparse_tensor(pruned, format="csr")
    (A @ x).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), g_ones * (pruned != 0))
    before = A.detach().to_dense().clone()
    opt.step()
    torch.testing.assert_close(A.detach().to_dense(), before - 0.1 * g_ones * (pruned != 0))
    assert A._storage.nnz == int((pruned != 0).sum())
    B = scorch.sparse_tensor(a, format="csr", requires_grad=True)
    B.grad = scorch.sparse_tensor((a != 0).to(DT), format="coo")
    (B @ x).sum().backward()
    torch.testing.assert_close(B.grad.to_dense(), (g_ones + 1) * (a != 0))


def test_a_kept_graph_does_not_keep_the_values_it_saw():
    """A loss kept after its backward (``losses.append(loss)``) keeps the graph's nodes, as
    torch's does, but not the values arrays of the sparse tensors in it: a backward keeps
    patterns, not values, outside what torch frees."""
    import weakref
    g = torch.Generator().manual_seed(4)
    m = (torch.rand(200, 200, generator=g) < 0.05).to(DT)
    M = scorch.sparse_tensor(m, format="csr")
    q = torch.randn(200, 8, dtype=DT, requires_grad=True)
    scores = scorch.einsum("ij,id,jd->ij", M, q, q)
    attn = torch.sparse.softmax(scores, dim=1)
    loss = (attn @ q).square().sum()
    refs = [weakref.ref(scores._storage.values), weakref.ref(attn._storage.values)]
    loss.backward()
    del scores, attn
    gc.collect()
    assert all(r() is None for r in refs)
    assert loss.grad_fn is not None          # the graph itself is still there
