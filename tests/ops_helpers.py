"""Shared strategies and checks for the op tests (test_ops_*.py): dense torch is the oracle.

Ops that compile a kernel draw their formats from small fixed lists (a cold kernel costs ~1 s,
so the set of distinct kernels must stay small); shape ops compile nothing and draw any
format: any level kinds, any mode order."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import scorch

#: formats for kernel-compiling tests, by rank (prebuilt or cheap kernels first)
KERNEL_FORMATS = {
    1: ["coo", "c"],
    2: ["csr", "csc", "coo", "dcsr"],
    3: ["coo", "csf"],
}
#: formats for ops that compile nothing or one cheap kernel, by rank
FORMATS = {1: ["c", "coo"], 2: ["csr", "csc", "coo", "dcsr"], 3: ["coo", "csf"]}
FLOATS = [torch.float32, torch.float64]
#: dense torch's function for each elementwise function of scorch's table (the oracle)
TORCH_FUNCTIONS = {"abs": torch.abs, "relu": torch.relu, "sqrt": torch.sqrt, "sin": torch.sin,
                   "tanh": torch.tanh, "sign": torch.sign, "square": torch.square, "expm1": torch.expm1,
                   "log1p": torch.log1p, "erf": torch.erf, "atan": torch.atan, "gelu": F.gelu, "silu": F.silu,
                   "leaky_relu": F.leaky_relu, "elu": F.elu, "hardtanh": F.hardtanh, "softsign": F.softsign,
                   "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
                   "frac": torch.frac, "relu6": F.relu6, "selu": F.selu, "celu": F.celu, "mish": F.mish,
                   "tanhshrink": F.tanhshrink, "softshrink": F.softshrink, "hardshrink": F.hardshrink,
                   "hardswish": F.hardswish, "threshold": lambda x, p=0.0: F.threshold(x, p, 0.0),
                   "asin": torch.asin, "asinh": torch.asinh, "atanh": torch.atanh, "sinh": torch.sinh,
                   "tan": torch.tan, "deg2rad": torch.deg2rad, "rad2deg": torch.rad2deg,
                   "exp": torch.exp, "cos": torch.cos, "sigmoid": torch.sigmoid, "log": torch.log,
                   "logsigmoid": F.logsigmoid, "softplus": F.softplus}

DENSITIES = [0.0, 0.3, 1.0]   # empty, sparse, full


def dense_of(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def assert_matches(got, expected, *, sparse=None):
    """Same shape and dtype as the dense result, equal values (float tolerance by dtype);
    ``sparse`` (when given) says whether the result must be a SparseTensor."""
    assert tuple(got.shape) == tuple(expected.shape), (tuple(got.shape), tuple(expected.shape))
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    if sparse is not None:
        assert isinstance(got, scorch.SparseTensor) == sparse, type(got)
    if not isinstance(got, scorch.SparseTensor):
        assert type(got) is torch.Tensor and got.layout == torch.strided
    d = dense_of(got)
    if expected.dtype.is_floating_point:
        tol = 1e-4 if expected.dtype == torch.float32 else 1e-10
        torch.testing.assert_close(d, expected, rtol=tol, atol=tol)
    else:
        assert torch.equal(d, expected)


@st.composite
def side(draw, lo: int = 0, hi: int = 5) -> int:
    return draw(st.integers(lo, hi))


@st.composite
def dense_values(draw, shape, dtype=torch.float64, density=None) -> torch.Tensor:
    """A dense tensor of ``shape`` with about ``density`` of its entries nonzero."""
    if density is None:
        density = draw(st.sampled_from(DENSITIES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if dtype.is_floating_point:
        x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    else:
        x = torch.randint(-4, 5, shape, generator=g, dtype=torch.int64)
    keep = torch.rand(shape, generator=g) < density
    return (x * keep).to(dtype)


@st.composite
def any_format(draw, rank: int) -> scorch.Format:
    """Any level kinds, any mode order."""
    levels = "".join(draw(st.lists(st.sampled_from("dcq"), min_size=rank, max_size=rank)))
    order = draw(st.permutations(list(range(rank))))
    return scorch.Format(levels, order)


def sparse(x: torch.Tensor, fmt) -> scorch.SparseTensor:
    return scorch.sparse_tensor(x, format=fmt)


def stored_mask(S) -> torch.Tensor:
    """Where ``S`` stores an entry, as a dense bool tensor."""
    mask = torch.zeros(S.shape, dtype=torch.bool)
    if S.nnz:
        mask[tuple(S.indices())] = True
    return mask


def grad_matches(S, D) -> None:
    """``S``'s gradient equals the dense one at ``S``'s stored entries (and is on its pattern)."""
    assert isinstance(S.grad, scorch.SparseTensor) and S.grad.nnz == S.nnz
    want = torch.where(stored_mask(S), D.grad, torch.zeros((), dtype=D.dtype))
    torch.testing.assert_close(S.grad.to_dense(), want, rtol=1e-9, atol=1e-10)
