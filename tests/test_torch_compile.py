"""scorch under torch.compile (issue 16): compiled functions that mix scorch sparse tensors
and dense tensors give the eager result, forward and backward, with the default backend
(inductor). Compiles are kept few and small: each test compiles one function once or twice."""
from __future__ import annotations

import pytest
import torch

import scorch
from scorch.nn import functional as F

DT = torch.float64


def _sparse(shape, density, fmt, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(*shape, generator=g, dtype=DT)
    d[torch.rand(*shape, generator=g) > density] = 0
    return d, scorch.sparse_tensor(d, format=fmt, requires_grad=requires_grad)


def _dense(*shape, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DT).requires_grad_(requires_grad)


def gcn_layer(A, X, W):
    return torch.relu(A @ (X @ W))


def attention(M, Q, K, V):
    scores = scorch.einsum("ij,id,jd->ij", M, Q, K) / Q.shape[1] ** 0.5   # SDDMM
    return scorch.sparse.softmax(scores, dim=1) @ V                       # SpMM


class SparseLinear(torch.nn.Module):
    """A layer whose weight is a scorch sparse parameter, compiled as a whole."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.nn.Parameter(torch.linspace(-1, 1, weight.shape[0], dtype=weight.dtype))

    def forward(self, x):
        return torch.tanh(F.linear(x, self.weight, self.bias))


def _grads(out, inputs):
    return torch.autograd.grad(out.square().sum(), inputs)


def _to_dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _check_same(compiled, eager, inputs):
    torch.testing.assert_close(compiled, eager)
    for gc, ge in zip(_grads(compiled, inputs), _grads(eager, inputs)):
        torch.testing.assert_close(_to_dense(gc), _to_dense(ge))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gcn_layer_forward_backward(fmt):
    _, A = _sparse((7, 6), 0.4, fmt, seed=1)
    X, W = _dense(6, 5, seed=2), _dense(5, 3, seed=3)
    f = torch.compile(gcn_layer)
    _check_same(f(A, X, W), gcn_layer(A, X, W), [X, W])
    # another pattern of the same format: right too (a guard or a recompile, never stale)
    _, A2 = _sparse((7, 6), 0.7, fmt, seed=4)
    _check_same(f(A2, X, W), gcn_layer(A2, X, W), [X, W])


def test_gcn_layer_sparse_operand_gradient():
    _, A = _sparse((6, 6), 0.5, "csr", seed=5, requires_grad=True)
    X, W = _dense(6, 4, seed=6), _dense(4, 2, seed=7)
    f = torch.compile(gcn_layer)
    out, ref = f(A, X, W), gcn_layer(A, X, W)
    torch.testing.assert_close(out, ref)
    gA, gX = _grads(out, [A, X])
    rA, rX = _grads(ref, [A, X])
    assert isinstance(gA, scorch.SparseTensor) and gA.format == A.format
    torch.testing.assert_close(gA.to_dense(), rA.to_dense())
    torch.testing.assert_close(gX, rX)


def test_attention_sddmm_softmax_spmm():
    _, M = _sparse((6, 6), 0.5, "csr", seed=8)
    Q, K, V = (_dense(6, 4, seed=s) for s in (9, 10, 11))
    out = torch.compile(attention)(M, Q, K, V)
    _check_same(out, attention(M, Q, K, V), [Q, K, V])


def test_sparse_weight_linear_module_compiled_whole():
    _, Wt = _sparse((4, 6), 0.5, "csr", seed=12)
    eager = SparseLinear(Wt)
    compiled = torch.compile(eager)
    x = _dense(3, 6, seed=13, requires_grad=False)
    out, ref = compiled(x), eager(x)
    torch.testing.assert_close(out, ref)
    params = [eager.weight, eager.bias]
    for gc, ge in zip(_grads(out, params), _grads(ref, params)):
        assert type(gc) is type(ge)
        torch.testing.assert_close(_to_dense(gc), _to_dense(ge))
