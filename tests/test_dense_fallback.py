"""The dense fallback policy: an ATen op with no sparse handler runs on dense copies only while
they fit under a user limit (default 64 MiB), warning once per op; past the limit it raises
an error that names the op and the shapes, before allocating anything."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch import _dispatch


@pytest.fixture(autouse=True)
def fresh_policy(monkeypatch):
    monkeypatch.delenv("SCORCH_DENSE_FALLBACK_LIMIT", raising=False)
    scorch.set_dense_fallback_limit(None)
    monkeypatch.setattr(_dispatch, "_warned", set())
    yield
    scorch.set_dense_fallback_limit(None)


def small():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    return x, scorch.sparse_tensor(x, format="csr")


def test_default_limit_is_64_mib():
    assert scorch.get_dense_fallback_limit() == 64 * 2**20


def test_below_the_limit_runs_densely_and_warns_once_naming_the_op():
    x, s = small()
    with pytest.warns(UserWarning, match="'_upsample_bilinear2d_aa' has no sparse kernel"):
        out = F.interpolate(s[None, None], size=(1, 4), mode="bilinear", antialias=True)
    assert torch.equal(out, F.interpolate(x[None, None], size=(1, 4), mode="bilinear", antialias=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # the second call is silent
        assert torch.equal(F.interpolate(s[None, None], size=(1, 4), mode="bilinear", antialias=True), F.interpolate(x[None, None], size=(1, 4), mode="bilinear", antialias=True))


def test_past_the_limit_raises_naming_the_op_and_shapes():
    n = 2_000_000
    big = scorch.sparse_tensor((torch.tensor([[0, n - 1], [1, 2]]), torch.tensor([1.0, 2.0])),
                               size=(n, n), format="coo")
    with pytest.raises(scorch.DenseFallbackError, match=r"'exp'.*\(2000000, 2000000\)"):
        torch.exp(big)
    assert issubclass(scorch.DenseFallbackError, RuntimeError)


def test_the_limit_is_settable():
    x, s = small()
    scorch.set_dense_fallback_limit(8)          # 16 bytes needed
    with pytest.raises(RuntimeError, match="_upsample_bilinear2d_aa.*16 bytes.*8 bytes"):
        F.interpolate(s[None, None], size=(1, 4), mode="bilinear", antialias=True)
    scorch.set_dense_fallback_limit(16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # warned once already in this process, or now
        assert torch.equal(F.interpolate(s[None, None], size=(1, 4), mode="bilinear", antialias=True), F.interpolate(x[None, None], size=(1, 4), mode="bilinear", antialias=True))
    scorch.set_dense_fallback_limit(0)          # no fallback at all
    with pytest.raises(scorch.DenseFallbackError):
        torch.exp(s)
    with pytest.raises(ValueError, match="bytes"):
        scorch.set_dense_fallback_limit(-1)


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SCORCH_DENSE_FALLBACK_LIMIT", "32")
    scorch.set_dense_fallback_limit(None)       # None: read the environment again
    assert scorch.get_dense_fallback_limit() == 32
    s = scorch.sparse_tensor(torch.ones(4, 4), format="csr")   # 64 bytes dense
    with pytest.raises(scorch.DenseFallbackError, match="'exp'"):
        torch.exp(s)
    monkeypatch.setenv("SCORCH_DENSE_FALLBACK_LIMIT", "lots")
    scorch.set_dense_fallback_limit(None)
    with pytest.raises(ValueError, match="SCORCH_DENSE_FALLBACK_LIMIT"):
        scorch.get_dense_fallback_limit()


def test_ops_with_sparse_kernels_do_not_fall_back():
    x, s = small()
    scorch.set_dense_fallback_limit(0)          # any fallback would raise
    assert torch.equal((s @ x), x @ x)
    assert torch.equal((s * 2 + s).to_dense(), 3 * x)
    col = s.sum(0)     # CSR summed over rows: a sparse vector (format inference)
    assert torch.equal(col.to_dense() if isinstance(col, scorch.SparseTensor) else col, x.sum(0))
    assert torch.equal(s.t().reshape(4).to_dense(), x.t().reshape(4))
    assert torch.equal(torch.ops.aten.t.default(s).to_dense(), x.t())
    assert torch.equal(s[1].to_dense(), x[1])


@pytest.mark.parametrize("op", [
    lambda t: torch.cumsum(t, 1), lambda t: t.logsumexp(0), lambda t: torch.cosh(t),
    lambda t: torch.nn.functional.cross_entropy(t, torch.tensor([1, 0])),
    lambda t: torch.nn.functional.mse_loss(t, torch.ones(2, 2, dtype=t.dtype)),
    lambda t: torch.nn.functional.layer_norm(t, (2,)), lambda t: t.cumprod(0),
], ids=["cumsum", "logsumexp", "cosh", "cross_entropy", "mse_loss", "layer_norm", "cumprod"])
def test_dense_by_nature_ops_are_silent_and_differentiable(op):
    """Ops dense whatever the sparsity (``sparse_ops/dense_by_nature.py``): torch's op on the
    dense copy, without the fallback's warning, with the gradient on the stored entries, and
    under the same dense-size limit."""
    x = torch.tensor([[0.0, 1.5], [-2.0, 0.0]], dtype=torch.float64)
    S = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    D = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = op(S)
    want = op(D)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), D.grad * (x != 0))
    scorch.set_dense_fallback_limit(8)
    try:
        with pytest.raises(scorch.DenseFallbackError, match="dense by nature"):
            op(S)
    finally:
        scorch.set_dense_fallback_limit(None)


def test_method_and_function_forms_share_their_handlers():
    """Every op scorch handles as ``torch.X`` is handled as ``Tensor.X`` too, and the
    reverse (``A.kron(B)``, ``A.equal(B)`` had taken the dense fallback while ``torch.kron``
    ran sparse), checked over the whole handler table."""
    from scorch._dispatch import _HANDLERS
    missing = []
    for fn in list(_HANDLERS):
        name = getattr(fn, "__name__", "")
        if not name or name.startswith("__"):
            continue
        for a, b in ((torch, torch.Tensor), (torch.Tensor, torch)):
            other = getattr(b, name, None)
            if getattr(a, name, None) is fn and callable(other) and other not in _HANDLERS:
                missing.append(f"{b.__name__}.{name}")
    assert not missing
    A = scorch.sparse_tensor(torch.eye(3), format="csr")
    scorch.set_dense_fallback_limit(0)
    try:
        assert A.equal(A) and tuple(A.kron(A).shape) == (9, 9)
        assert A.isposinf().to_dense().sum() == 0
    finally:
        scorch.set_dense_fallback_limit(None)
