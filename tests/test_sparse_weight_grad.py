"""The gradient of a sparse weight read by a sparse input (the sparse autoencoder's encoder,
``F.linear(X_csr, W_csr)``, and any einsum of two sparse operands): an SDDMM generated on the
weight's pattern. The compiler writes it at the pattern's positions (every stored weight once,
0 where the input holds nothing), so autograd never searches for positions afterwards; the
other sparse operand is handed over with its pattern-indexed dimension as a dense level.
Checked against dense torch over shapes (0 and 1 sized), densities, dtypes and formats."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.gradients import pattern
from scorch.nn import functional as F

FORMATS_2D = ["csr", "csc", "coo", "dcsr", "dcsc"]
DTYPES = [torch.float32, torch.float64]


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)


def _sparse_dense_pair(shape, density, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(shape, generator=g) * (torch.rand(shape, generator=g) < density)).to(dtype)
    return d


def _no_position_search(monkeypatch):
    """Fail if autograd locates a result's entries in a pattern by searching."""
    def refuse(*args, **kwargs):
        raise AssertionError("the gradient was searched for in the pattern (positions_in_pattern)")
    monkeypatch.setattr(pattern, "positions_in_pattern", refuse)


@settings(max_examples=14, deadline=None, derandomize=True)
@given(batch=st.integers(0, 5), inputs=st.integers(1, 9), outputs=st.integers(1, 6),
       x_density=st.sampled_from([0.0, 0.3, 1.0]), w_density=st.sampled_from([0.0, 0.4, 1.0]),
       x_fmt=st.sampled_from(FORMATS_2D), w_fmt=st.sampled_from(FORMATS_2D),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), input_grad=st.booleans(),
       seed=st.integers(0, 2**16))
def test_linear_sparse_input_sparse_weight_matches_dense(batch, inputs, outputs, x_density, w_density,
                                                        x_fmt, w_fmt, dtype, bias, input_grad, seed):
    xd = _sparse_dense_pair((batch, inputs), x_density, dtype, seed)
    wd = _sparse_dense_pair((outputs, inputs), w_density, dtype, seed + 1)
    X = scorch.sparse_tensor(xd, format=x_fmt, requires_grad=input_grad)
    W = scorch.sparse_tensor(wd, format=w_fmt, requires_grad=True)
    b = torch.rand(outputs, dtype=dtype, requires_grad=True) if bias else None
    G = torch.rand(batch, outputs, dtype=dtype)
    y = F.linear(X, W, b)
    y = y.to_dense() if isinstance(y, scorch.SparseTensor) else y
    (y * G).sum().backward()

    Xr, Wr = xd.clone().requires_grad_(), wd.clone().requires_grad_()
    br = b.detach().clone().requires_grad_() if bias else None
    yr = torch.nn.functional.linear(Xr, Wr, br)
    (yr * G).sum().backward()
    torch.testing.assert_close(y.detach(), yr.detach(), **_tol(dtype))
    assert W.grad.format == W.format
    assert W.grad._storage.shares_pattern(W._storage)     # the gradient lives on W's pattern
    torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (wd != 0), **_tol(dtype))
    if input_grad:
        torch.testing.assert_close(X.grad.to_dense(), Xr.grad * (xd != 0), **_tol(dtype))
    if bias:
        torch.testing.assert_close(b.grad, br.grad, **_tol(dtype))


# equation, shape of the sparse weight (operand 0), shape of the sparse partner (operand 1)
_FORMS = {
    "oj,aj->ao": ((5, 7), (4, 7)),         # F.linear's form
    "ij,jk->ik": ((5, 6), (6, 4)),         # SpGEMM
    "oj,ja->oa": ((5, 6), (6, 3)),         # W @ X^T
    "ijk,jk->i": ((3, 4, 5), (4, 5)),      # a 3-D pattern sharing two dimensions
    "ij,kj->ikj": ((4, 5), (3, 5)),        # no reduction: every variable an output one
}


@settings(max_examples=12, deadline=None, derandomize=True)
@given(form=st.sampled_from(sorted(_FORMS)), w_density=st.sampled_from([0.0, 0.5, 1.0]),
       x_density=st.sampled_from([0.0, 0.3, 1.0]), w_fmt=st.sampled_from(["csr", "coo", "csc", "csf"]),
       x_fmt=st.sampled_from(["csr", "coo", "dcsr", "csc"]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_sparse_times_sparse_weight_gradient_matches_dense(form, w_density, x_density, w_fmt, x_fmt,
                                                          dtype, seed):
    ws, xs = _FORMS[form]
    if (w_fmt in ("csr", "csc") and len(ws) != 2) or (w_fmt == "csf" and len(ws) == 2):
        w_fmt = "coo"
    wd = _sparse_dense_pair(ws, w_density, dtype, seed)
    xd = _sparse_dense_pair(xs, x_density, dtype, seed + 1)
    W = scorch.sparse_tensor(wd, format=w_fmt, requires_grad=True)
    X = scorch.sparse_tensor(xd, format=x_fmt)
    y = scorch.einsum(form, W, X)
    y = y.to_dense() if isinstance(y, scorch.SparseTensor) else y
    G = torch.rand(y.shape, dtype=dtype)
    (y * G).sum().backward()
    Wr = wd.clone().requires_grad_()
    (torch.einsum(form, Wr, xd) * G).sum().backward()
    assert W.grad._storage.shares_pattern(W._storage)
    torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (wd != 0), **_tol(dtype))


def test_weight_gradient_is_written_on_the_pattern(monkeypatch):
    """The SAE's weight gradient: W's pattern as the pattern factor, the CSR batch read
    column-major: the kernel writes the pattern's values (weights whose input column is
    empty in the batch get 0), no search for positions."""
    torch.manual_seed(0)
    wd = torch.rand(16, 30) * (torch.rand(16, 30) < 0.3)
    xd = torch.rand(8, 30) * (torch.rand(8, 30) < 0.3)
    xd[:, :10] = 0                                          # input columns empty in the batch
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    X = scorch.sparse_tensor(xd, format="csr")
    ones = scorch.SparseTensor(pattern.pattern_ones(W._storage, torch.float32))
    located = X.to_format("csc")
    plan = scorch.explain("oj,ao,aj->oj", ones, torch.rand(8, 16), located)
    assert plan.schedule.output.pattern == 0, str(plan)
    _no_position_search(monkeypatch)
    G = torch.rand(8, 16)
    (F.linear(X, W) * G).sum().backward()
    ref = (G.t() @ xd) * (wd != 0)
    torch.testing.assert_close(W.grad.to_dense(), ref, rtol=1e-5, atol=1e-5)
    assert bool((W.grad.to_dense()[:, :10] == 0).all())


def test_partner_with_a_compressed_level_on_the_pattern_is_not_a_pattern_output():
    """A sparse partner whose level on an output variable is compressed filters the output
    loop (entries of the pattern would be skipped): the compiler does not write the
    pattern's values then, and the result still equals dense torch."""
    torch.manual_seed(1)
    wd = torch.rand(6, 9) * (torch.rand(6, 9) < 0.5)
    xd = torch.rand(5, 9) * (torch.rand(5, 9) < 0.3)
    ones = scorch.SparseTensor(pattern.pattern_ones(scorch.sparse_tensor(wd, format="csr")._storage,
                                                    torch.float32))
    X = scorch.sparse_tensor(xd, format="dcsc")             # j compressed: it filters
    G = torch.rand(5, 6)
    plan = scorch.explain("oj,ao,aj->oj", ones, G, X)
    assert plan.schedule.output.pattern == -1
    R = scorch.einsum("oj,ao,aj->oj", ones, G, X)
    torch.testing.assert_close(scorch.SparseTensor(R).to_dense() if not isinstance(R, scorch.SparseTensor)
                               else R.to_dense(), (G.t() @ xd) * (wd != 0))


def _weight_and_batches(inputs: int, w_density: float, x_density: float):
    """A 12 x ``inputs`` CSR weight that requires grad and three 6-row CSR batches."""
    torch.manual_seed(2)
    W = scorch.sparse_tensor(torch.rand(12, inputs) * (torch.rand(12, inputs) < w_density), format="csr",
                             requires_grad=True)
    batches = [scorch.sparse_tensor(torch.rand(6, inputs) * (torch.rand(6, inputs) < x_density), format="csr")
               for _ in range(3)]
    return W, batches


def test_training_steps_transpose_neither_weight_nor_batch_twice(monkeypatch):
    """Per step of ``F.linear(X_csr, W_csr)`` with a batch kept sparse (too wide and sparse
    to expand: 6 x 2000 at 1 %; new batch, values of W updated in place): the weight's
    pattern is never converted again after the first step, and the batch once (to the
    column-major form the weight gradient reads)."""
    from scorch._runtime import convert as runtime
    W, batches = _weight_and_batches(2000, 0.05, 0.01)
    assert type(F.linear(batches[0], W).grad_fn).__name__ == "_SparseBatchLinearBackward"
    (F.linear(batches[0], W) ** 2).sum().backward()
    anchors = {id(a) for lv in W._storage.levels for a in (lv.pos, lv.crd) if a is not None}
    weight_conversions, batch_conversions = [], []
    real = runtime.convert

    def counting(st_, fmt, *args, **kwargs):
        ids = {id(a) for lv in st_.levels for a in (lv.pos, lv.crd) if a is not None}
        (weight_conversions if ids & anchors else batch_conversions).append(fmt)
        return real(st_, fmt, *args, **kwargs)
    monkeypatch.setattr(runtime, "convert", counting)
    for X in batches[1:]:
        with torch.no_grad():
            W.values().mul_(0.9)
        W.grad = None
        (F.linear(X, W) ** 2).sum().backward()
    assert weight_conversions == []
    assert len(batch_conversions) == 2, batch_conversions    # a new batch: converted once
    fixed = batches[0]                  # a fixed input: its conversion is kept from its 2nd step
    (F.linear(fixed, W) ** 2).sum().backward()
    batch_conversions.clear()
    for _ in range(2):
        W.grad = None
        (F.linear(fixed, W) ** 2).sum().backward()
    assert batch_conversions == []
    Wr = W.detach().to_dense().requires_grad_()
    (torch.nn.functional.linear(fixed.to_dense(), Wr) ** 2).sum().backward()
    torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (Wr.detach() != 0), rtol=1e-5, atol=1e-5)


def test_expanded_batch_steps_convert_nothing(monkeypatch):
    """A batch worth expanding (its transpose written dense, ``sparse_linear.expand_pays``):
    no step converts the weight or the batch to another sparse format."""
    from scorch._runtime import convert as runtime
    W, batches = _weight_and_batches(20, 0.3, 0.4)
    assert type(F.linear(batches[0], W).grad_fn).__name__ == "_ColumnBatchLinearBackward"
    conversions = []
    real = runtime.convert

    def counting(st_, fmt, *args, **kwargs):
        conversions.append(fmt)
        return real(st_, fmt, *args, **kwargs)
    monkeypatch.setattr(runtime, "convert", counting)
    for X in batches:
        W.grad = None
        (F.linear(X, W) ** 2).sum().backward()
        Wr = W.detach().to_dense().requires_grad_()
        (torch.nn.functional.linear(X.to_dense(), Wr) ** 2).sum().backward()
        torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (Wr.detach() != 0), rtol=1e-5, atol=1e-5)
    assert conversions == []


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gradcheck_sparse_input_and_sparse_weight(fmt):
    """Both sparse operands' gradients (gradcheck, float64), the input's on its own pattern."""
    torch.manual_seed(3)
    wd = (torch.rand(4, 6) * (torch.rand(4, 6) < 0.6)).double()
    xd = (torch.rand(3, 6) * (torch.rand(3, 6) < 0.6)).double()
    X0, W0 = scorch.sparse_tensor(xd, format=fmt), scorch.sparse_tensor(wd, format="csr")
    xv, wv = X0.values().clone().requires_grad_(), W0.values().clone().requires_grad_()

    def fn(xv, wv):
        X = scorch.sparse_tensor((X0.indices(), xv), size=(3, 6), format=fmt)
        W = scorch.sparse_tensor((W0.indices(), wv), size=(4, 6), format="csr")
        return F.linear(X, W)
    assert torch.autograd.gradcheck(fn, (xv, wv), fast_mode=True)
