"""Random chains of torch ops on a sparse tensor against the same chain on its dense copy:
values, dtypes, shapes and the gradient of the sparse input's stored values.

The einsum and expression fuzzers (``test_fuzz.py``) exercise the compiler one call at a
time; these chains exercise what a user composes at the torch level (elementwise ops with
sparse, dense, broadcast and scalar partners, shape ops, reductions, selections), where one
op's result format, dtype or graph feeds the next. Found so far: a norm that lost the graph
of an empty tensor, a null-pointer gradient (torch's efficient zero tensor) reaching a kernel,
NaN gradients of std / norm at 0, addcmul promoting integers to float, mean over an empty
dimension raising.

* CI (default): derandomized, ``CI_EXAMPLES`` chains per test.
* Long runs: ``SCORCH_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_ops.py -x`` draws
  that many chains with a new seed (``SCORCH_FUZZ_SEED=<int>`` repeats a run).
"""
from __future__ import annotations

import math
import random
import warnings
from typing import Callable, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import scorch
from test_fuzz import fuzz_settings

CI_EXAMPLES = 20
FORMATS = {1: ["coo", "c"], 2: ["csr", "csc", "coo", "dcsr", "dcsc"], 3: ["coo", "csf"]}

Unary = Tuple[str, Callable]

UNARY: List[Unary] = [
    ("relu", torch.relu), ("abs", torch.abs), ("neg", lambda x: -x), ("scale", lambda x: x * 2.5),
    ("div", lambda x: x / 3.0), ("square", lambda x: x ** 2), ("tanh", torch.tanh),
    ("sin", torch.sin), ("gelu", F.gelu), ("clamp", lambda x: x.clamp(-0.3, 0.4)),
    ("transpose", lambda x: x.transpose(0, -1)), ("flip", lambda x: x.flip(0)),
    ("self_add", lambda x: x + x), ("self_mul", lambda x: x * x),
    ("hardswish", lambda x: F.hardswish(x * 4)), ("fmod", lambda x: torch.fmod(x, 0.3)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1)), ("sign", torch.sign),
    ("where", lambda x: torch.where(x > 0.1, x, 0.0)),
    ("masked_fill", lambda x: x.masked_fill(x < -0.5, 0.0)),
    ("tril", lambda x: x.tril() if x.dim() >= 2 else x), ("roll", lambda x: x.roll(1, 0)),
    ("narrow", lambda x: x.narrow(0, 0, max(1, x.shape[0] - 1)) if x.shape[0] else x),
    ("fmax_self", lambda x: torch.fmax(x, x * 0.5)), ("maximum_neg", lambda x: torch.maximum(x, -x)),
    ("prelu", lambda x: F.prelu(x, torch.tensor([0.2], dtype=x.dtype))),
    ("threshold", lambda x: F.threshold(x, 0.2, 0.0)), ("sgn", torch.sgn),
    # session 18: in place on a non-leaf copy, torch's op on the stored values, layout ops
    ("relu_", lambda x: (x * 1).relu_()), ("clamp_", lambda x: (x * 1).clamp_(-0.3, 0.4)),
    ("abs_", lambda x: torch.abs_(x * 1)), ("F.relu inplace", lambda x: F.relu(x * 1, inplace=True)),
    ("masked_fill_", lambda x: (x * 1).masked_fill_(x < -0.5, 0)),
    ("setitem", lambda x: _setitem(x * 1, x > 0.6, 0)),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("xlogy", lambda x: torch.xlogy(x, 2.0)),
    ("copysign", lambda x: torch.copysign(x, -1.0)), ("hardtanh", lambda x: F.hardtanh(x, -0.2, 0.3)),
    ("pad", lambda x: F.pad(x, (1, 0))), ("index_fill", lambda x: x.index_fill(0, torch.tensor([0]), 0)),
    ("glu", lambda x: F.glu(x, 0) if x.shape[0] % 2 == 0 and x.dtype.is_floating_point else x),
    ("index_put", lambda x: x.index_put(tuple(torch.tensor([0]) for _ in range(x.dim())),
                                        torch.tensor(2, dtype=x.dtype))),
    # session 19
    ("renorm", lambda x: torch.renorm(x, 2, 0, 0.5) if x.dim() >= 2 and _float(x) else x),
    ("rms_norm", lambda x: F.rms_norm(x, x.shape[-1:]) if _float(x) else x),
    ("i1", lambda x: torch.special.i1(x) if _float(x) else x),
    ("rot90", lambda x: torch.rot90(x) if x.dim() >= 2 else x),
    ("slice_scatter", lambda x: torch.slice_scatter(x, x[:1] * 2, 0, 0, 1) if x.shape[0] else x),
    ("index_fill_value", lambda x: x.index_fill(0, torch.tensor([0]), 1.5) if x.shape[0] and _float(x) else x),
    ("pow_tensor", lambda x: torch.pow(x, torch.full(x.shape[-1:], 2.0, dtype=x.dtype)) if _float(x) else x),
    ("index_put_rows", lambda x: x.index_put((torch.tensor([0]),), torch.tensor(1, dtype=x.dtype)) if x.shape[0] else x),
    # session 23: selections and cat along the first stored level, values-level autograd
    ("rows_from_1", lambda x: x[1:]), ("row_0", lambda x: x[0] if x.dim() > 1 and x.shape[0] else x),
    ("cols_to_2", lambda x: x[:, :2] if x.dim() > 1 else x),
    ("cat_relu", lambda x: torch.cat([x, x.relu()], -1)), ("sin_times", lambda x: torch.sin(x) * x),
    ("scaled_sum", lambda x: x * 0.5 + x if _float(x) else x),
    ("col_0", lambda x: x[:, 0] if x.dim() == 2 and x.shape[1] else x),
    ("relu_chain", lambda x: (x * 2).relu().sin()), ("inplace_then_relu", lambda x: (x * 1).mul_(2).relu()),
    # session 24: products per head written on the pattern's arrays (its levels over a dense b)
    ("heads_sddmm", lambda x: torch.einsum("ij,bi,bj->bij", x, _ramp((2, x.shape[0]), x.dtype),
                                           _ramp((2, x.shape[1]), x.dtype)) if x.dim() == 2 else x),
    ("heads_scale", lambda x: torch.einsum("ij,bij->bij", x, _ramp((3,) + tuple(x.shape), x.dtype))
                              if x.dim() == 2 else x),
]


def _ramp(shape, dtype: torch.dtype) -> torch.Tensor:
    """A fixed dense operand of ``shape``: values from -2 to 2, in ``dtype``."""
    n = max(1, math.prod(shape))
    return torch.linspace(-2.0, 2.0, n, dtype=torch.float64).reshape(shape).to(dtype)


def _float(x) -> bool:
    return x.dtype.is_floating_point


def _setitem(x, mask, value):
    x[mask] = value
    return x

BINARY = [
    ("add", lambda x, y: x + y), ("sub", lambda x, y: x - y), ("mul", lambda x, y: x * y),
    ("div", lambda x, y: x / y), ("maximum", torch.maximum), ("minimum", torch.minimum),
    ("fmin", torch.fmin), ("where", lambda x, y: torch.where(y > 0.5, x, 0.0)),
    ("lerp", lambda x, y: torch.lerp(x, y, 0.3)),
    ("addcmul", lambda x, y: torch.addcmul(x, x, y, value=0.5)),
    ("add_alpha", lambda x, y: torch.add(x, y, alpha=-2)),
]
SHAPE = [
    ("reshape", lambda x: x.reshape(-1)), ("flatten", torch.flatten),
    ("cat", lambda x: torch.cat([x, x * 2], 0)), ("stack", lambda x: torch.stack([x, x], -1)),
    ("index_select", lambda x: x.index_select(0, torch.tensor([0, 0] if x.shape[0] else [],
                                                              dtype=torch.long))),
    ("getitem", lambda x: x[torch.tensor([x.shape[0] - 1, 0])]), ("unsqueeze", lambda x: x.unsqueeze(-1)),
    ("permute", lambda x: x.permute(*reversed(range(x.dim())))),
    ("repeat", lambda x: x.repeat(*([2] + [1] * (x.dim() - 1)))),
    ("expand", lambda x: x.unsqueeze(0).expand(2, *x.shape)), ("diff", lambda x: torch.diff(x, dim=0)),
    ("split", lambda x: torch.split(x, 2, 0)[0]), ("chunk", lambda x: x.chunk(2, -1)[-1]),
    ("select", lambda x: x.select(0, 0) if x.dim() > 1 else x), ("tile", lambda x: x.tile(2)),
    ("unbind_stack", lambda x: torch.stack(x.unbind(-1), 0)),
    ("block_diag", lambda x: torch.block_diag(x, x) if x.dim() == 2 else x),
    ("diag_embed", lambda x: torch.diag_embed(x, 1) if x.dim() < 3 else x),
    ("diagonal", lambda x: x.diagonal(-1) if x.dim() >= 2 else x),
    ("unfold", lambda x: x.unfold(0, min(2, x.shape[0]), 1)),
    ("repeat_interleave", lambda x: x.repeat_interleave(2, 0)),
]
TERMINAL = [
    ("sum", lambda x: x.sum()), ("sum0", lambda x: x.sum(0)), ("sum_keepdim", lambda x: x.sum(-1, keepdim=True)),
    ("mean0", lambda x: x.mean(0)), ("amax", lambda x: x.amax(-1)), ("amin", lambda x: x.amin(0)),
    ("argmax", lambda x: x.argmax(-1)), ("argmin", lambda x: x.argmin()), ("prod", lambda x: x.prod(-1)),
    ("norm", lambda x: x.norm()), ("count_nonzero", lambda x: torch.count_nonzero(x, 0)),
    ("nonzero", torch.nonzero), ("var", lambda x: x.var(0) if x.shape[0] > 1 else x.sum(0)),
    ("std", lambda x: x.std()), ("identity", lambda x: x),
    ("matmul", lambda x: x @ torch.ones(x.shape[-1], 3, dtype=x.dtype) if x.dim() == 2 else x),
    ("matvec", lambda x: x @ torch.ones(x.shape[-1], dtype=x.dtype) if x.dim() == 2 else x.sum()),
    ("topk", lambda x: x.topk(min(2, x.shape[-1]), -1).values), ("kthvalue", lambda x: x.kthvalue(1, 0).values),
    ("median", lambda x: x.median(-1).values), ("median_all", lambda x: x.median()),
    ("max_dim", lambda x: x.max(0).values), ("min_dim_indices", lambda x: x.min(-1).indices),
    ("gather", lambda x: torch.gather(x, -1, torch.zeros(x.shape[:-1] + (2,), dtype=torch.long))),
    ("masked_select", lambda x: torch.masked_select(x, x > 0.2)), ("nansum", lambda x: torch.nansum(x, 0)),
    ("aminmax", lambda x: torch.aminmax(x).max), ("unique", torch.unique),
    ("sort", lambda x: torch.sort(x, -1).values), ("matrix_norm_1", lambda x: torch.linalg.matrix_norm(x.double(), 1)
                                                    if x.dim() >= 2 else x.sum()),
    ("std_mean", lambda x: torch.std_mean(x.double(), -1)[1]),
    ("mode", lambda x: x.mode(-1).values if x.shape[-1] else x.sum(-1)),
    ("trapezoid", lambda x: torch.trapezoid(x.double())),
    ("cov", lambda x: torch.cov(x.double()) if x.dim() == 2 else x.sum()),
]
#: terminal ops with no gradient, or whose gradient follows a tie-break torch leaves open
#: (which of several equal entries topk or median picks)
NO_GRADIENT = {"argmax", "argmin", "nonzero", "count_nonzero", "topk", "kthvalue", "median",
               "median_all", "min_dim_indices", "unique", "sort", "mode"}


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _values(rng: random.Random, shape, dtype: torch.dtype, density: Optional[float] = None):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    keep = torch.rand(shape, generator=g) < (rng.choice([0.0, 0.2, 0.5, 1.0]) if density is None else density)
    x = x * keep + 0                                  # no -0.0: a sparse tensor stores no zero
    return (x * 5).round().to(dtype) if not dtype.is_floating_point else x.to(dtype)


def _partner(rng: random.Random, like: torch.Tensor, kind: str):
    """The second operand: sparse (another pattern), dense, or a broadcast row; dense
    divisors keep away from 0 (x / 0 where nothing is stored is 0 for a sparse dividend, as
    torch.sparse, not dense torch's NaN)."""
    if kind == "sparse":
        return _values(rng, tuple(like.shape), like.dtype, 0.4)
    shape = tuple(like.shape) if kind == "dense" else tuple(like.shape[-1:])
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    y = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5).to(like.dtype)
    return y if like.dtype.is_floating_point else y.clamp_min(1)


def run_chain(seed: int, dtype: torch.dtype) -> None:
    """One chain: 1-4 ops, then a terminal op; values and dtype as dense torch's, and the
    stored values' gradient as the dense gradient at the stored entries (float64)."""
    rng = random.Random(seed)
    rank = rng.choice([1, 2, 2, 3])
    shape = tuple(rng.randint(1, 5) for _ in range(rank))
    d = _values(rng, shape, dtype)
    grad = dtype == torch.float64
    S = scorch.sparse_tensor(d, format=rng.choice(FORMATS[rank]), requires_grad=grad)
    D = d.clone().requires_grad_(grad)
    xs, xd, names = S, D, [f"{S.format} {tuple(shape)} {dtype}"]
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.45:
            name, f = rng.choice(UNARY)
            args_s, args_d = (xs,), (xd,)
        elif roll < 0.8:
            name, f = rng.choice(BINARY)
            kind = rng.choice(["sparse", "dense", "row"])
            if name == "div" and kind == "sparse":    # division by a sparse tensor: dense, no backward
                name, f = "mul", BINARY[2][1]
            y = _partner(rng, xd.detach(), kind)
            ys = scorch.sparse_tensor(y, format=rng.choice(FORMATS.get(y.dim(), ["coo"]))) if kind == "sparse" else y
            name = f"{name}[{kind}]"
            args_s, args_d = (xs, ys), (xd, y)
        else:
            name, f = rng.choice(SHAPE)
            if xd.dim() >= 3 and name in ("stack", "unsqueeze", "expand"):
                name, f = "abs", torch.abs                # at most 3 dims for the formats above
            args_s, args_d = (xs,), (xd,)
        names.append(name)
        try:
            # the reference in memory of its own: torch's slice_scatter of an unfold (rows
            # shared by two windows) wrote through the alias and doubled the other window's
            # copy of the row (session 24's chains: unfold -> slice_scatter)
            nd = f(*args_d).contiguous()
        except (RuntimeError, IndexError, TypeError, ValueError):
            return                                    # dense torch refuses (an op ints lack)
        xs, xd = f(*args_s), nd
    name, f = rng.choice(TERMINAL)
    names.append(name)
    try:
        want = _dense(f(xd))
    except (RuntimeError, IndexError, TypeError, ValueError):
        return
    got = _dense(f(xs))
    where = " -> ".join(names)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{where}: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
    if not want.dtype.is_floating_point:
        assert torch.equal(got, want), f"{where}: {got} vs {want}"
        return
    tol = 1e-4 if torch.float32 in (dtype, want.dtype, xd.dtype) else 1e-9   # float32 on the way
    torch.testing.assert_close(got.detach(), want.detach(), rtol=tol, atol=tol, equal_nan=True,
                               msg=lambda m: f"{where}: {m}")
    if not (grad and want.requires_grad and name not in NO_GRADIENT):
        return
    assert got.requires_grad, f"{where}: the result left the graph"
    if not bool(torch.isfinite(want).all()):
        # a NaN result (cov of one observation) sends NaN gradients back; a sparse product
        # gives 0 where a factor stores nothing (torch.sparse's rule), NaN or not, so the
        # dense chain's NaN there is no reference (glu -> ... -> cov, session 23)
        return
    w = torch.rand(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed))
    (got * w).sum().backward()
    (want * w).sum().backward()
    stored = torch.zeros(shape, dtype=torch.bool)
    if S.nnz:
        stored[tuple(S.indices())] = True
    expect = torch.where(stored, D.grad, torch.zeros((), dtype=torch.float64))
    assert isinstance(S.grad, scorch.SparseTensor), f"{where}: no sparse gradient"
    torch.testing.assert_close(S.grad.to_dense(), expect, rtol=1e-7, atol=1e-8, equal_nan=True,
                               msg=lambda m: f"{where} (gradient): {m}")


@pytest.fixture(autouse=True)
def _quiet_fallbacks():
    """Ops dense by nature may take the fallback (its warning is not what this tests)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@fuzz_settings(CI_EXAMPLES)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float64, torch.float32]))
def test_random_op_chains_match_dense_torch(seed, dtype):
    run_chain(seed, dtype)


@fuzz_settings(CI_EXAMPLES // 2)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_integer_op_chains_match_dense_torch(seed):
    run_chain(seed, torch.int64)


def test_where_backward_selects_the_incoming_gradient():
    """Found by the chains (session 23): ``where -> abs().sqrt() -> amax``. sqrt's backward
    sends 0 * inf = NaN to an entry ``where`` had set to 0; torch's where backward selects
    the gradient of the branch taken (0 there), scorch's multiplied it by the condition
    (NaN). The gradient expression now carries the incoming gradient into the branches."""
    d = torch.tensor([0.3, -0.1, 0.0], dtype=torch.float64)
    S = scorch.sparse_tensor(d, format="coo", requires_grad=True)
    D = d.clone().requires_grad_()

    def chain(x):
        return torch.where(x > 0.1, x, 0.0).abs().sqrt().amax()
    chain(S).backward()
    chain(D).backward()
    assert torch.isfinite(S.grad.values()).all()
    torch.testing.assert_close(S.grad.to_dense(), D.grad * (d != 0))
