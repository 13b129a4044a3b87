"""Numerics against dense torch where scorch's formula differed from torch's in rounding,
overflow or sign (each found by a red-team sweep; each test fails on the old code):
covariance of data with a large mean, the conjugate transpose of complex tensors, ties of
maximum / minimum at the ends of the float range and at subnormals, float32 variance over
many entries, float16 means, division by a divisor whose reciprocal overflows, and lerp's
exact end points."""
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch


def _sp(x, fmt="csr"):
    return scorch.sparse_tensor(x, format=fmt)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_cov_and_corrcoef_of_data_with_a_large_mean(fmt):
    """2000 float32 observations around 1000 with spread 0.1: the expanded formula cancelled
    (cov[0,0] 0.448 against 0.0104); summed in float64 it is torch's."""
    g = torch.Generator().manual_seed(0)
    x = (1000 + 0.1 * torch.randn(3, 2000, generator=g)).float()
    S = _sp(x, fmt)
    torch.testing.assert_close(torch.cov(S), torch.cov(x), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.corrcoef(S), torch.corrcoef(x), rtol=1e-4, atol=1e-5)
    assert torch.cov(S).dtype == torch.float32
    w = torch.randint(1, 4, (2000,), generator=g)
    torch.testing.assert_close(torch.cov(S, fweights=w), torch.cov(x, fweights=w), rtol=1e-4, atol=1e-6)


def test_cov_warns_only_when_torch_does():
    x = torch.randn(2, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.cov(_sp(x))                               # 50 observations: no warning
    with pytest.warns(UserWarning, match="degrees of freedom"):
        torch.cov(_sp(torch.randn(2, 1)))


@pytest.mark.parametrize("name", ["mH", "H", "adjoint", "torch.adjoint"])
def test_conjugate_transpose_of_complex_sparse(name):
    d = torch.tensor([[1 + 2j, 0], [0, 3 - 4j], [5j, 0]], dtype=torch.complex64)
    f = {"mH": lambda x: x.mH, "H": lambda x: x.H, "adjoint": lambda x: x.adjoint(),
         "torch.adjoint": torch.adjoint}[name]
    got = f(_sp(d))
    assert torch.equal(got.to_dense(), f(d).resolve_conj())
    real = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert torch.equal(f(_sp(real)).to_dense(), f(real))   # real: the transpose


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_maximum_minimum_ties_at_the_range_ends_and_subnormals(dtype):
    fi = torch.finfo(dtype)
    d = torch.tensor([[fi.min, 0.0, 1.5], [0.0, fi.max, -2.0], [fi.tiny / 4, 0.0, 3 * fi.tiny / 4]],
                     dtype=dtype)
    S = _sp(d)
    for op in (torch.maximum, torch.minimum):
        assert torch.equal(op(S, S).to_dense(), op(d, d))
        assert torch.equal(op(S, d).to_dense(), op(d, d))
    low = torch.full((), fi.min, dtype=dtype)
    assert torch.equal(torch.maximum(S, low), torch.maximum(d, low))
    inf = torch.tensor([[float("inf"), 0.0, float("nan")]], dtype=dtype)
    got = torch.maximum(_sp(inf), _sp(inf)).to_dense()
    assert torch.equal(got[:, :2], inf[:, :2]) and bool(got[0, 2].isnan())


def test_maximum_splits_the_gradient_at_ties_as_torch():
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    other = torch.tensor([[1.0, 5.0, 1.0], [0.0, 3.0, 4.0]])
    A = _sp(d).requires_grad_()
    B = other.clone().requires_grad_()
    torch.maximum(A, B).sum().backward()
    a, b = d.clone().requires_grad_(), other.clone().requires_grad_()
    torch.maximum(a, b).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), a.grad * (d != 0))
    torch.testing.assert_close(B.grad, b.grad)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(rows=st.integers(1, 4), scale=st.sampled_from([1.0, 1e20, 1e-25]), fmt=st.sampled_from(["csr", "coo"]))
def test_float32_var_and_std_are_torchs(rows, scale, fmt):
    """Summed in float64 as torch's CPU var: 1e6 entries, magnitudes whose squares leave
    float32's range."""
    g = torch.Generator().manual_seed(rows)
    n = 250_000
    x = ((torch.randn(rows, n, generator=g, dtype=torch.float64) * 30 + 1000) * scale).float()
    x[:, ::7] = 0
    S = _sp(x, fmt)
    for f in (lambda t: t.var(), lambda t: t.var(1), lambda t: t.std(1), lambda t: t.std(1, correction=0)):
        torch.testing.assert_close(f(S), f(x), rtol=2e-6, atol=0)


def test_float16_mean_sums_in_float32():
    d = torch.tensor([[40000.0] * 4 + [0.0] * 4], dtype=torch.float16)
    S = _sp(d)
    assert S.mean().item() == d.mean().item() == 20000.0
    assert torch.equal(S.mean(1), d.mean(1)) and S.mean(1).dtype == torch.float16
    assert torch.equal(S.std(), d.std())
    assert torch.equal(torch.nn.functional.rms_norm(S, (8,)).to_dense(),
                       torch.nn.functional.rms_norm(d, (8,)) * (d != 0))


@pytest.mark.parametrize("dtype,tiny", [(torch.float32, 1e-39), (torch.float64, 1e-310)])
def test_division_by_a_divisor_whose_reciprocal_overflows(dtype, tiny):
    d = torch.tensor([[1e-3, 0.0, 2e-5]], dtype=dtype)
    S = _sp(d)
    want = d / tiny
    for got in (S / tiny, S / torch.tensor(tiny, dtype=dtype), torch.div(S, tiny)):
        assert torch.isfinite(got.to_dense()).all()
        torch.testing.assert_close(got.to_dense(), want)


def test_lerp_is_exact_at_its_ends():
    a = torch.tensor([[1e8, 0.0, -1e8, 0.0]])
    b = torch.tensor([[1.0, 1e8, 2.0, 0.0]])
    A, B = _sp(a), _sp(b)
    for w in (1.0, 0.75, 0.25, 0.0):
        assert torch.equal(torch.lerp(A, B, w).to_dense(), torch.lerp(a, b, w))
        assert torch.equal(torch.lerp(A, b, w).to_dense() if isinstance(torch.lerp(A, b, w), scorch.SparseTensor)
                           else torch.lerp(A, b, w), torch.lerp(a, b, w))
    wt = torch.tensor([[1.0, 0.75, 0.2, 0.9]])
    got = torch.lerp(A, B, wt)
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, torch.lerp(a, b, wt), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_stored_negative_zero_keeps_its_sign(dtype):
    """Coordinates and values: a lone -0.0 was summed into a zeroed slot (+0.0), so 1 / S
    gave +inf where dense torch gives -inf; duplicates still sum."""
    idx = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    vals = torch.tensor([-0.0, 1.0, -0.0, 2.0, 3.0], dtype=dtype)
    S = scorch.sparse_tensor((idx, vals), size=(2, 2), format="csr")
    dense = torch.tensor([[-0.0, 1.0], [5.0, -0.0]], dtype=dtype)
    assert torch.equal(torch.signbit(S.to_dense()), torch.signbit(dense))
    assert torch.equal((1 / S).to_dense(), 1 / dense)


def test_pca_lowrank_centring_of_columns_with_large_means():
    g = torch.Generator().manual_seed(0)
    x = (1e4 + 0.1 * torch.randn(200, 6, generator=g)).float()
    x[::5] = 0
    torch.manual_seed(0)
    U, S, V = torch.pca_lowrank(scorch.sparse_tensor(x), q=6)
    want = torch.linalg.svdvals(x.double() - x.double().mean(0))
    assert S.dtype == torch.float32 and U.dtype == torch.float32
    torch.testing.assert_close(S.double(), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dcsr"])
def test_log_softmax_of_large_stored_values_keeps_its_order_of_operations(fmt):
    """The result kernel computes ``(x - m) - log(s)`` as written (``Assignment.exact``: no
    ``-fassociative-math``); regrouped as ``x - (m + log(s))`` a float32 row near 1e6 was
    0.03 off (torch.sparse: 8e-8)."""
    d = torch.tensor([[1e6, 1e6 - 1, 1e6 - 2, 0.0], [1e4, 1e4 - 1, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 3.0]], dtype=torch.float32)
    dim = 0 if fmt == "csc" else 1
    got = torch.sparse.log_softmax(scorch.sparse_tensor(d, format=fmt), dim).to_dense()
    want = torch.sparse.log_softmax(d.to_sparse(), dim).to_dense()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-7)
