"""Dropout over stored entries, and ops with bool results on tensors that require grad."""
import pytest
import torch
import torch.nn.functional as F

import scorch


def _sparse(shape, density, seed, fmt="csr", dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=g, dtype=dtype) + 0.5) * (torch.rand(shape, generator=g) < density)
    return scorch.sparse_tensor(x, format=fmt)


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
def test_dropout_keeps_pattern_and_scales_kept_entries(fmt, p):
    torch.manual_seed(0)
    s = _sparse((200, 150), 0.2, 1, fmt)
    d = F.dropout(s, p, training=True)
    assert isinstance(d, scorch.SparseTensor) and d.format == s.format and d.nnz == s.nnz
    dd, sd = d.to_dense(), s.to_dense()
    assert torch.all(dd[sd == 0] == 0)                   # nothing appears off the pattern
    kept = dd != 0
    if p < 1:
        torch.testing.assert_close(dd[kept], sd[kept] / (1 - p))
    frac = kept.sum().item() / (sd != 0).sum().item()
    assert abs(frac - (1 - p)) < 0.05                    # ~6,000 entries: 5 % is > 6 sigma


def test_dropout_eval_mode_and_bad_probability():
    s = _sparse((10, 10), 0.3, 2)
    assert F.dropout(s, 0.5, training=False) is s
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(s, 1.5)


def test_dropout_is_differentiable_on_the_pattern():
    torch.manual_seed(3)
    w = _sparse((30, 20), 0.3, 4).requires_grad_()
    x = torch.randn(20, 5, dtype=torch.float64)
    d = F.dropout(w, 0.5)
    (d @ x).sum().backward()
    assert w.grad.nnz == w.nnz
    keep = d.detach().to_dense() / w.detach().to_dense().masked_fill(w.detach().to_dense() == 0, 1)
    expected = keep * x.sum(1)[None, :] * (w.detach().to_dense() != 0)
    torch.testing.assert_close(w.grad.to_dense(), expected)


def test_bool_results_need_no_gradient():
    s = _sparse((6, 6), 0.5, 5).requires_grad_()
    assert torch.allclose(s, s)            # nothing to detach: a bool has no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_mask_repeats_with_the_seed_and_differs_between_calls(dtype):
    """The stored values' mask comes from dense dropout's RNG (scorch.nn.dropout.scaled_mask),
    seeded from torch's generator."""
    s = _sparse((300, 200), 0.3, 6, dtype=dtype)
    torch.manual_seed(9)
    a, b = F.dropout(s, 0.5).to_dense(), F.dropout(s, 0.5).to_dense()
    torch.manual_seed(9)
    assert torch.equal(F.dropout(s, 0.5).to_dense(), a)
    stored = s.to_dense() != 0
    n = int(stored.sum())
    agree = int(((a != 0) == (b != 0))[stored].sum())
    assert abs(agree - n / 2) < 6 * (n / 4) ** 0.5     # independent masks agree on ~half
