"""Elementwise functions on the stored values (``value_ops``, the non-default parameters of
the function table), the dense-by-nature additions of session 18, softmin / glu and the
channel and alpha dropouts: every result equals dense torch's, sparse exactly where 0 stays
0, with no dense fallback, and differentiable in the stored values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, assert_matches, dense_of, dense_values

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


def _sparse(x, fmt="csr", requires_grad=False):
    return scorch.sparse_tensor(x, format=fmt, requires_grad=requires_grad)


#: name -> (call, result sparse?) for one operand
UNARY = {
    "erfinv": (lambda x: torch.erfinv(x.clamp(-0.9, 0.9)), True),
    "rrelu eval": (lambda x: F.rrelu(x, training=False), True),
    "gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), True),
    "hardtanh(-2, 0.5)": (lambda x: F.hardtanh(x, -2.0, 0.5), True),
    "round(decimals=1)": (lambda x: torch.round(x, decimals=1), True),
    "softplus(beta=2)": (lambda x: F.softplus(x, beta=2.0), False),
    "float_power 2": (lambda x: torch.float_power(x, 2), True),
    "xlogy dense": (lambda x: torch.xlogy(x, torch.linspace(0.5, 2.0, x.shape[-1], dtype=x.dtype)), True),
    "copysign": (lambda x: torch.copysign(x, -1.0), True),
    "clamp tensor": (lambda x: torch.clamp(x, min=torch.full(x.shape[-1:], -0.3, dtype=x.dtype)), False),
    "softmin": (lambda x: F.softmin(x, dim=-1), True),
    "glu": (lambda x: F.glu(x, dim=0), True),
    # dense by nature
    "sort": (lambda x: torch.sort(x, dim=-1)[0], False),
    "argsort": (lambda x: torch.argsort(x, dim=0, stable=True), False),
    "msort": (lambda x: torch.msort(x), False),
    "log2": (lambda x: torch.log2(x.abs()), False),
    "log10": (lambda x: x.abs().log10(), False),
    "logit": (lambda x: torch.logit(x.clamp(0, 0.9), eps=1e-3), False),
    "sinc": (lambda x: torch.sinc(x), False),
    "hardsigmoid": (lambda x: F.hardsigmoid(x), False),
    "atan2": (lambda x: torch.atan2(x, torch.ones(x.shape[-1], dtype=x.dtype)), False),
    "logaddexp": (lambda x: torch.logaddexp(x, x), False),
    "rpow": (lambda x: 2.0 ** x, False),
    "batch_norm": (lambda x: F.batch_norm(x, None, None, training=True), False),
    "group_norm": (lambda x: F.group_norm(x.reshape(2, -1), 1), False),
    "cdist": (lambda x: torch.cdist(x, x), False),
    "pairwise_distance": (lambda x: F.pairwise_distance(x, x.flip(0)), False),
    "hinge_embedding_loss": (lambda x: F.hinge_embedding_loss(x, torch.ones_like(x.to_dense() if isinstance(x, scorch.SparseTensor) else x)), False),
}


def _stored_softmin(d, stored):
    """softmin over the stored entries of each row (the others take no part), 0 elsewhere."""
    s = torch.softmax(torch.where(stored, -d, float("-inf")), -1)
    return torch.where(stored, s, 0.0)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(UNARY)), dtype=st.sampled_from([torch.float32, F64]),
       density=st.sampled_from([0.0, 0.4, 1.0]))
def test_each_function_matches_dense_torch(data, name, dtype, density):
    x = data.draw(dense_values((4, 6), dtype, density=density)) + 0
    X = _sparse(x, data.draw(st.sampled_from(FORMATS[2])))
    call, sparse = UNARY[name]
    got = call(X)
    expected = _stored_softmin(x, x != 0) if name == "softmin" else call(x)
    assert_matches(got, expected, sparse=sparse)


@pytest.mark.parametrize("name", ["erfinv", "gelu tanh", "hardtanh(-2, 0.5)", "float_power 2",
                                  "xlogy dense", "softmin", "glu", "log2", "batch_norm", "cdist",
                                  "softplus(beta=2)", "clamp tensor"])
def test_gradients_reach_the_stored_values(name):
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(4, 6, dtype=F64, generator=g) - 0.5) * (torch.rand(4, 6, generator=g) < 0.6)
    w = torch.rand(4, 6, dtype=F64, generator=g)
    call = UNARY[name][0]
    X = _sparse(x, requires_grad=True)
    D = x.clone().requires_grad_()
    out = dense_of(call(X))
    (out * w[:out.shape[0], :out.shape[1]]).sum().backward()
    expected = call(D) if name != "softmin" else _stored_softmin(D, x != 0)
    (expected * w[:out.shape[0], :out.shape[1]]).sum().backward()
    mask = x != 0
    torch.testing.assert_close(X.grad.to_dense(), torch.where(mask, D.grad, 0.0))


def test_hypot_of_two_sparse_tensors_stays_sparse_on_the_union():
    a = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=F64)
    b = torch.tensor([[4.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    assert_matches(torch.hypot(_sparse(a), _sparse(b)), torch.hypot(a, b), sparse=True)
    assert_matches(torch.hypot(_sparse(a), b), torch.hypot(a, b), sparse=False)


def test_bitwise_not_of_a_sparse_bool_is_dense():
    x = torch.tensor([[True, False], [False, False]])
    X = _sparse(x)
    assert_matches(~X, ~x, sparse=False)
    assert_matches(torch.bitwise_not(X), ~x, sparse=False)


@pytest.mark.parametrize("fn,shape", [(F.dropout1d, (3, 4, 5)), (F.dropout2d, (2, 3, 4, 2)),
                                      (F.dropout3d, (2, 2, 3, 2, 2)), (F.dropout3d, (2, 3, 2, 2))])
def test_channel_dropout_zeroes_whole_channels_and_keeps_the_pattern(fn, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(shape, dtype=F64, generator=g) * (torch.rand(shape, generator=g) < 0.5)
    X = scorch.sparse_tensor(x, format="coo")
    torch.manual_seed(0)
    got = fn(X, 0.5, True)
    assert isinstance(got, scorch.SparseTensor) and got.nnz == X.nnz
    spatial = {F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}[fn]
    lead = shape[:len(shape) - spatial]
    got_c, x_c = got.to_dense().reshape(*lead, -1), x.reshape(*lead, -1)
    factor = got_c.sum(-1) / x_c.sum(-1).where(x_c.sum(-1) != 0, 1.0)   # one factor per channel
    assert set(torch.round(factor[x_c.sum(-1) != 0], decimals=6).tolist()) <= {0.0, 2.0}
    torch.testing.assert_close(got_c, x_c * factor[..., None])
    assert fn(X, 0.5, False) is X                     # evaluation: the identity
    assert torch.equal(fn(X, 1.0, True).to_dense(), torch.zeros(shape, dtype=F64))


def test_alpha_dropout_is_the_identity_in_evaluation_and_dense_in_training():
    X = _sparse(torch.eye(4, dtype=F64))
    assert F.alpha_dropout(X, 0.5, False) is X
    out = F.alpha_dropout(X, 0.5, True)
    assert type(out) is torch.Tensor and out.shape == (4, 4)


def test_dense_by_nature_functions_respect_the_dense_limit():
    n = 100_000
    A = scorch.sparse_tensor((torch.tensor([[0, 5], [1, 7]]), torch.tensor([1.0, 2.0])), size=(n, n), format="csr")
    with pytest.raises(scorch.DenseFallbackError, match="sort"):
        torch.sort(A, 1)
    with pytest.raises(scorch.DenseFallbackError, match="log2"):
        torch.log2(A)


def test_dropout2d_of_a_3d_input_drops_1d_channels_as_torch():
    """torch reads a 3-D input to dropout2d as (N, C, L) and warns: one factor per (n, c)."""
    x = torch.rand(2, 3, 4, dtype=F64) + 0.5
    X = scorch.sparse_tensor(x, format="coo")
    with pytest.warns(UserWarning, match="3D input to dropout2d"):
        got = F.dropout2d(X, 0.5, True).to_dense()
    factor = got / x
    assert torch.equal(factor, factor[..., :1].expand_as(factor))


def test_random_like_is_dense_by_nature():
    X = _sparse(torch.eye(3, dtype=F64))
    for f in (torch.rand_like, torch.randn_like):
        r = f(X)
        assert type(r) is torch.Tensor and r.shape == (3, 3) and r.dtype == F64
    assert torch.randint_like(X, 5).shape == (3, 3)
