"""Dense dropout through ``scorch.nn.functional.dropout`` (scorch.nn.dropout): torch's
distribution and API, its own mask RNG, the backward on the forward's mask."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch._runtime.dropout import keep_threshold, mask_scale
from scorch.nn import functional as F


def _fraction_ok(kept: int, n: int, q: float) -> bool:
    """A kept count within 6 standard deviations of ``n * q`` (binomial)."""
    return abs(kept - n * q) <= 6 * math.sqrt(n * q * (1 - q)) + 1


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 70), cols=st.integers(1, 300),
       p=st.floats(0.02, 0.98), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**31))
def test_keeps_one_minus_p_and_scales_by_its_inverse(rows, cols, p, dtype, seed):
    torch.manual_seed(seed)
    x = torch.rand(rows, cols, dtype=dtype) + 0.5           # no zeros: a zero means dropped
    y = F.dropout(x, p)
    assert y.dtype == dtype and y.shape == x.shape and y is not x
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    assert _fraction_ok(int(kept.sum()), x.numel(), 1 - p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_multiplies_by_the_forwards_mask(dtype):
    torch.manual_seed(1)
    x = torch.randn(301, 77, dtype=dtype, requires_grad=True)
    w = torch.randn(301, 77, dtype=dtype)
    y = F.dropout(x, 0.3)
    assert y.grad_fn is not None
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, w * (y != 0) / 0.7)
    # an expanded (stride-0) incoming gradient, as from ``sum()``
    x.grad = None
    y = F.dropout(x, 0.6)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).to(dtype) / 0.4)


def test_gradcheck_and_double_backward():
    x = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)

    def fixed_mask(t):   # the same seed each call: one mask, a linear map
        torch.manual_seed(2)
        return F.dropout(t, 0.4)
    assert torch.autograd.gradcheck(fixed_mask, (x,))
    assert torch.autograd.gradgradcheck(fixed_mask, (x,))


def test_manual_seed_repeats_masks_and_calls_draw_new_ones():
    x = torch.ones(500, 300)
    torch.manual_seed(3)
    a, b = F.dropout(x, 0.5), F.dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(F.dropout(x, 0.5), a)
    # two calls' masks are independent: they agree on ~half the entries
    agree = int(((a != 0) == (b != 0)).sum())
    assert _fraction_ok(agree, x.numel(), 0.5)


def test_neighbouring_entries_are_independent():
    """Adjacent entries (in a row and across rows) of one mask: all four (kept, kept) combinations
    at their product frequencies (chi-square, 3 degrees of freedom, far tail)."""
    torch.manual_seed(4)
    m = F.dropout(torch.ones(1024, 1024), 0.3) != 0
    for a, b in ((m[:, :-1], m[:, 1:]), (m[:-1], m[1:]), (m[:, ::2], m[:, 1::2])):
        q, n = 0.7, a.numel()
        chi2 = 0.0
        for ka in (True, False):
            for kb in (True, False):
                expected = n * (q if ka else 1 - q) * (q if kb else 1 - q)
                seen = int(((a == ka) & (b == kb)).sum())
                chi2 += (seen - expected) ** 2 / expected
        assert chi2 < 30        # p ~ 1e-6 under independence


def test_same_mask_at_any_thread_count():
    x = torch.randn(100_003, dtype=torch.float64)
    outs = []
    for threads in (1, 2, 3):
        out = torch.empty_like(x)
        mask_scale(x.data_ptr(), out.data_ptr(), x.numel(), True, 12345, keep_threshold(0.5),
                   2.0, threads)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_edge_probabilities_and_modes_match_torch():
    x = torch.randn(40, 30)
    assert F.dropout(x, 0.5, training=False) is x
    assert torch.equal(F.dropout(x, 0.0), x)
    assert torch.equal(F.dropout(x, 1.0), torch.zeros_like(x))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            F.dropout(x, bad)
    with torch.no_grad():
        assert F.dropout(x.requires_grad_(), 0.5).grad_fn is None
    assert keep_threshold(1e-15) == 1 and keep_threshold(1 - 1e-15) == 2**32 - 1


def test_nan_stays_nan_where_dropped_as_in_torch():
    torch.manual_seed(5)
    y = F.dropout(torch.full((1000,), float("nan")), 0.5)
    assert torch.isnan(y).all()


def test_inplace():
    torch.manual_seed(6)
    x = torch.rand(200, 50) + 0.5
    before, version = x.clone(), x._version
    y = F.dropout(x, 0.25, inplace=True)
    assert y is x and x._version > version
    kept = x != 0
    torch.testing.assert_close(x[kept], before[kept] / 0.75)
    assert _fraction_ok(int(kept.sum()), x.numel(), 0.75)
    # a tensor autograd records: torch's in-place dropout, gradient on its mask
    w = torch.rand(200, 50, requires_grad=True)
    h = w * 1.0
    F.dropout(h, 0.5, inplace=True).sum().backward()
    torch.testing.assert_close(w.grad, (h != 0).float() * 2.0)


def test_uncovered_inputs_go_to_torch():
    torch.manual_seed(7)
    half = F.dropout(torch.ones(100, 100, dtype=torch.bfloat16), 0.5)
    assert half.dtype == torch.bfloat16 and _fraction_ok(int((half != 0).sum()), 10_000, 0.5)
    t = torch.rand(60, 40).t() + 0.5                       # not contiguous
    y = F.dropout(t, 0.5)
    torch.testing.assert_close(y[y != 0], t[y != 0] * 2)
    s = scorch.sparse_tensor(torch.eye(20), format="csr")  # scorch's sparse dropout
    d = F.dropout(s, 0.5)
    assert isinstance(d, scorch.SparseTensor) and d.nnz == s.nnz


def test_dropout_module_is_torchs_with_scorchs_mask():
    m = scorch.nn.Dropout(0.5)
    assert isinstance(m, torch.nn.Dropout)
    x = torch.ones(100, 100, requires_grad=True)
    torch.manual_seed(8)
    y = m(x)
    assert type(y.grad_fn).__name__.startswith("_DropoutFunction")
    assert m.eval()(x) is x
