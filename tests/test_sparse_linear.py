"""``F.linear`` through a sparse weight with the batch as the SpMM's dense columns
(``sparse_linear._ColumnBatchLinear``), against dense torch: values, the weight's gradient
on its own pattern, the batch's and the bias's, over batch shapes (empty, 3-D, strided),
weight formats (a blocked one takes the general einsum) and densities, dtypes and bias kinds; when a sparse batch is expanded
(``expand_pays``); and the runtime's one-pass ``to_dense`` of CSR / CSC storages (also seen
transposed) that the expansion writes ``x^T`` with.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import conversion
from scorch.nn import functional as F
from scorch.sparse_ops import gathered_columns, sparse_linear

from compiler_helpers import sparse

_COLUMN = "_ColumnBatchLinearBackward"


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else \
        dict(rtol=1e-9, atol=1e-9)


def _sparse_dense(shape, density, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < density)
    return x.to(dtype)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(lead=st.sampled_from([(0,), (1,), (5,), (2, 3)]), inputs=st.integers(1, 9),
       outputs=st.integers(1, 6), w_density=st.sampled_from([0.0, 0.3, 1.0]),
       w_fmt=st.sampled_from(["csr", "csc", "coo", "dcsr", "dcsc"]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       bias=st.sampled_from([None, "vector", "scalar", "matrix"]), x_grad=st.booleans(),
       layout=st.sampled_from(["contiguous", "transposed"]), seed=st.integers(0, 2**16))
def test_dense_batch_through_a_sparse_weight_matches_dense(lead, inputs, outputs, w_density, w_fmt,
                                                           dtype, bias, x_grad, layout, seed):
    wd = _sparse_dense((outputs, inputs), w_density, dtype, seed)
    W = scorch.sparse_tensor(wd, format=w_fmt, requires_grad=True)
    xd = _sparse_dense((*lead, inputs), 0.7, dtype, seed + 1)
    if layout == "transposed" and len(lead) == 1:
        xd = xd.t().contiguous().t()
    x = xd.clone().requires_grad_(x_grad)
    b = {None: None, "vector": torch.rand(outputs, dtype=dtype, requires_grad=True),
         "scalar": torch.rand((), dtype=dtype, requires_grad=True),
         "matrix": torch.rand(*lead, outputs, dtype=dtype, requires_grad=True)}[bias]
    y = F.linear(x, W, b)
    column = bias != "matrix"
    node = y.grad_fn
    if len(lead) > 1 and type(node).__name__ == "ViewBackward0":   # the batch's shape restored
        node = node.next_functions[0][0]
    assert (type(node).__name__ == _COLUMN) == column
    G = torch.rand(y.shape, dtype=dtype)
    (y * G).sum().backward()

    xr, wr = xd.clone().requires_grad_(x_grad), wd.clone().requires_grad_()
    br = b.detach().clone().requires_grad_() if b is not None else None
    yr = torch.nn.functional.linear(xr, wr, br)
    (yr * G).sum().backward()
    torch.testing.assert_close(y.detach(), yr.detach(), **_tol(dtype))
    assert y.is_contiguous()
    assert W.grad._storage.shares_pattern(W._storage)   # on W's own pattern
    torch.testing.assert_close(W.grad.to_dense(), wr.grad * (wd != 0), **_tol(dtype))
    if x_grad:
        torch.testing.assert_close(x.grad, xr.grad, **_tol(dtype))
    if b is not None:
        torch.testing.assert_close(b.grad, br.grad, **_tol(dtype))


def test_blocked_weight_takes_the_general_einsum():
    wd = _sparse_dense((4, 6), 0.5, torch.float64, 2)
    W = scorch.sparse_tensor(wd, format=scorch.Format("dc", block=(2, 2)), requires_grad=True)
    x = torch.rand(3, 6, dtype=torch.float64)
    y = F.linear(x, W)
    assert type(y.grad_fn).__name__ != _COLUMN
    torch.testing.assert_close(y, x @ wd.t())
    y.sum().backward()
    wr = wd.clone().requires_grad_()
    (x @ wr.t()).sum().backward()
    torch.testing.assert_close(W.grad.to_dense() * (wd != 0), wr.grad * (wd != 0))


def test_column_form_under_no_grad_builds_no_node():
    wd = _sparse_dense((6, 8), 0.5, torch.float32, 1)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    x, b = torch.rand(4, 8), torch.rand(6)
    with torch.no_grad():
        y = F.linear(x, W, b)
    assert y.grad_fn is None
    torch.testing.assert_close(y, torch.nn.functional.linear(x, wd, b))
    frozen = scorch.sparse_tensor(wd, format="csr")   # nothing requires grad: no node either
    assert F.linear(x, frozen).grad_fn is None


def test_column_form_double_backward():
    """create_graph through the node: the composed graph gives the second derivatives."""
    wd = _sparse_dense((5, 7), 0.6, torch.float64, 3)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    x = torch.rand(4, 7, dtype=torch.float64, requires_grad=True)
    gx, = torch.autograd.grad((F.linear(x, W) ** 2).sum(), x, create_graph=True)
    (gx ** 2).sum().backward()
    wr, xr = wd.clone().requires_grad_(), x.detach().clone().requires_grad_()
    gxr, = torch.autograd.grad((torch.nn.functional.linear(xr, wr) ** 2).sum(), xr, create_graph=True)
    (gxr ** 2).sum().backward()
    torch.testing.assert_close(gx, gxr)
    torch.testing.assert_close(W.grad.to_dense(), wr.grad * (wd != 0))


def test_optimizer_update_is_read_by_the_next_step():
    wd = _sparse_dense((5, 7), 0.6, torch.float32, 4)
    W = torch.nn.Parameter(scorch.sparse_tensor(wd, format="csr"))
    opt = torch.optim.SGD([W], lr=0.5)
    x = torch.rand(3, 7)
    F.linear(x, W).sum().backward()
    opt.step()
    want = wd - 0.5 * (x.sum(0).expand_as(wd) * (wd != 0))
    torch.testing.assert_close(F.linear(x, W), x @ want.t())


def test_expand_pays_at_the_measured_points():
    # MNIST: 64 x 784 at 18 % through a 784 -> 256 weight at 10 %, or 1 %
    assert sparse_linear.expand_pays(9000, 64, 784, 20000, 256)
    assert sparse_linear.expand_pays(9000, 64, 784, 2000, 256)
    # a 64 x 100k bag-of-words batch at 0.1 % through a 1 % weight stays sparse
    assert not sparse_linear.expand_pays(6400, 64, 100_000, 256_000, 256)
    assert sparse_linear.expand_pays(0, 0, 5, 0, 3)   # an empty batch: nothing to write


@settings(max_examples=30, deadline=None, derandomize=True)
@given(rows=st.integers(0, 7), cols=st.integers(0, 9), density=st.sampled_from([0.0, 0.3, 1.0]),
       fmt=st.sampled_from(["csr", "csc"]), transpose=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool, torch.complex128,
                              torch.float16]),
       index=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_compressed_matrix_to_dense(rows, cols, density, fmt, transpose, dtype, index, seed):
    x = _sparse_dense((rows, cols), density, torch.float64, seed) * 3
    x = x.to(dtype) if dtype != torch.bool else x != 0
    st_ = sparse(x, fmt, index_dtype=index)
    want = x
    if transpose:
        st_ = st_.permuted((1, 0))
        want = x.t()
    got = conversion.to_dense(st_)
    assert got.is_contiguous() and got.dtype == want.dtype
    assert torch.equal(got, want)


def test_warm_steps_run_both_kernels_through_the_c_call(monkeypatch):
    """After a first step, the column form's SpMM and the weight gradient's SDDMM take the
    warm call in C: the Python runner (``einsum_declined``) is never reached. The gradient's
    pattern factor (``pattern.pattern_ones``) carries the weight's plan signature and the
    kept ones."""
    from scorch.gradients import pattern
    from scorch.tensor_compiler import api
    wd = _sparse_dense((16, 40), 0.3, torch.float32, 5)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.rand(16, requires_grad=True)
    batches = [scorch.sparse_tensor(_sparse_dense((8, 40), 0.4, torch.float32, s), format="csr")
               for s in range(3)]
    F.linear(batches[0], W, b).sum().backward()
    ones = pattern.pattern_ones(W._storage, torch.float32)
    assert ones._sig is not None and ones._sig == W._storage._sig   # W's plan signature
    assert ones.values is pattern.pattern_ones(W._storage, torch.float32).values   # kept
    calls = []
    real = api.einsum_declined

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(api, "einsum_declined", counting)
    for X in batches[1:]:
        W.grad = None
        y = F.linear(X, W, b)
        assert type(y.grad_fn).__name__ == _COLUMN
        y.sum().backward()
        torch.testing.assert_close(W.grad.to_dense(), X.to_dense().sum(0).expand_as(wd) * (wd != 0))
    assert calls == []


def test_permuted_format_is_kept_and_equal():
    fmt = scorch.as_format("csr", 2)
    assert fmt.permuted((1, 0)) is fmt.permuted((1, 0))
    assert fmt.permuted((1, 0)) == scorch.as_format("csc", 2)
    assert fmt.permuted((0, 1)) == fmt


def test_a_batch_past_the_dense_limit_stays_sparse():
    """A sparse batch whose dense transpose would pass the dense limit is not expanded (the
    kept-sparse node runs) and the result is the same."""
    from scorch import _dispatch
    wd = _sparse_dense((6, 50), 0.5, torch.float64, 8)
    xd = _sparse_dense((4, 50), 0.5, torch.float64, 9)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    X = scorch.sparse_tensor(xd, format="csr")
    assert type(F.linear(X, W).grad_fn).__name__ == _COLUMN
    old = _dispatch.get_dense_fallback_limit()
    _dispatch.set_dense_fallback_limit(4 * 50 * 8 - 1)
    try:
        y = F.linear(X, W)
    finally:
        _dispatch.set_dense_fallback_limit(old)
    assert type(y.grad_fn).__name__ == "_SparseBatchLinearBackward"
    torch.testing.assert_close(y, xd @ wd.t())


def test_kept_ones_go_with_their_pattern():
    """``pattern_ones`` keeps only the values: once the pattern's arrays are freed, so is
    the cache entry (a kept Storage would hold the arrays, and so itself, alive)."""
    import gc
    from scorch.gradients import pattern
    gc.collect()                 # entries of earlier tests' patterns kept only by cycles
    before = len(pattern._ONES)
    W = scorch.sparse_tensor(_sparse_dense((30, 20), 0.3, torch.float32, 6), format="csr")
    pattern.pattern_ones(W._storage, torch.float32)
    assert len(pattern._ONES) == before + 1
    del W
    gc.collect()
    assert len(pattern._ONES) == before


def test_weight_gradient_through_the_general_path_where_the_fast_one_declines(monkeypatch):
    """Where ``einsum_grad.pattern_gradient_values`` declines (None), the column form's
    weight gradient comes from ``operand_gradient``: the same values, on W's own pattern."""
    from scorch.gradients import einsum_grad
    monkeypatch.setattr(einsum_grad, "pattern_gradient_values", lambda *a, **k: None)
    wd = _sparse_dense((6, 9), 0.5, torch.float64, 10)
    x = torch.rand(4, 9, dtype=torch.float64)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    y = F.linear(x, W)
    assert type(y.grad_fn).__name__ == _COLUMN
    (y ** 2).sum().backward()
    wr = wd.clone().requires_grad_()
    (torch.nn.functional.linear(x, wr) ** 2).sum().backward()
    assert W.grad._storage.shares_pattern(W._storage)
    torch.testing.assert_close(W.grad.to_dense(), wr.grad * (wd != 0))


def test_batch_panel_choice_at_the_measured_points(monkeypatch):
    """``_batch_panel`` with a 1 MiB L2 (the machine it was measured on): panels for the
    4096 -> 4096 layers and the 10 % 1024 -> 1024 one at batch 512, none where they lost."""
    monkeypatch.setattr(sparse_linear, "l2_cache_bytes", lambda: 1 << 20)
    panel = sparse_linear._batch_panel
    assert panel(512, 4096, 4096, 167_772, 4) == 64
    assert panel(512, 4096, 4096, 1_677_722, 4) == 64
    assert panel(512, 1024, 1024, 104_858, 4) == 128
    assert panel(512, 1024, 1024, 10_486, 4) is None       # 5M multiply-adds: panels lost
    assert panel(512, 784, 256, 20_070, 4) is None
    assert panel(64, 4096, 4096, 1_677_722, 4) is None     # the batch fits: no panels


@pytest.mark.parametrize("sparse_batch", [False, True])
@pytest.mark.parametrize("x_grad", [False, True])
def test_batch_panels_match_dense(monkeypatch, sparse_batch, x_grad):
    """The column form over batch panels (forced: 16 rows, the last one shorter) gives the
    dense results and gradients, the weight's summed over the panels."""
    monkeypatch.setattr(sparse_linear, "_batch_panel", lambda *a: 16)
    dtype = torch.float64
    wd = _sparse_dense((7, 11), 0.4, dtype, 3)
    xd = _sparse_dense((70, 11), 0.5, dtype, 4)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.rand(7, dtype=dtype, requires_grad=True)
    if sparse_batch:
        x = scorch.sparse_tensor(xd, format="csr")
        x_grad = False
    else:
        x = xd.clone().requires_grad_(x_grad)
    y = F.linear(x, W, b)
    assert type(y.grad_fn).__name__ == _COLUMN
    assert len(y.grad_fn.saved_tensors) == 3 + 5        # x, W, b and five panels' x^T
    G = torch.rand(y.shape, dtype=dtype)
    (y * G).sum().backward()
    xr, wr, br = xd.clone().requires_grad_(x_grad), wd.clone().requires_grad_(), b.detach().clone().requires_grad_()
    yr = torch.nn.functional.linear(xr, wr, br)
    (yr * G).sum().backward()
    torch.testing.assert_close(y.detach(), yr.detach())
    torch.testing.assert_close(W.grad.to_dense(), wr.grad * (wd != 0))
    torch.testing.assert_close(b.grad, br.grad)
    if x_grad:
        torch.testing.assert_close(x.grad, xr.grad)
    with torch.no_grad():
        torch.testing.assert_close(F.linear(x, W, b), yr.detach())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batch=st.integers(0, 6), inputs=st.integers(0, 60), outputs=st.integers(1, 9),
       density=st.sampled_from([0.0, 0.02, 0.1, 0.6, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]), w_grad=st.booleans(),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_sparse_batch_through_an_out_by_in_weight_matches_dense(batch, inputs, outputs, density, dtype,
                                                                 w_grad, bias, seed):
    """A CSR batch through a dense weight stored out x in: where it touches few of the
    inputs, the product reads a copy of only those columns of the weight
    (``gathered_columns_product``); either way the output and the weight's and bias's
    gradients are dense torch's."""
    g = torch.Generator().manual_seed(seed)
    x = _sparse_dense((batch, inputs), density, dtype, seed)
    w = torch.randn(outputs, inputs, generator=g, dtype=dtype)
    b = torch.randn(outputs, generator=g, dtype=dtype) if bias else None
    X = scorch.sparse_tensor(x, format="csr")
    W = w.clone().requires_grad_(w_grad)
    B = None if b is None else b.clone().requires_grad_(w_grad)
    got = F.linear(X, W, B)
    want_w = w.clone().requires_grad_(w_grad)
    want_b = None if b is None else b.clone().requires_grad_(w_grad)
    want = torch.nn.functional.linear(x, want_w, want_b)
    torch.testing.assert_close(got, want, **_tol(dtype))
    if w_grad:
        g_out = torch.randn(want.shape, generator=g, dtype=dtype)
        got.backward(g_out)
        want.backward(g_out)
        torch.testing.assert_close(W.grad, want_w.grad, **_tol(dtype))
        if bias:
            torch.testing.assert_close(B.grad, want_b.grad, **_tol(dtype))


def test_gathered_columns_taken_only_where_few_inputs_are_touched():
    """The narrow copy is taken for a batch whose columns touch at most GATHER_MAX_LINES of
    the weight's cache lines (or a big weight that trains), a module's Parameter included,
    and leaves a batch that needs its own gradient, a weight stored in x out, and a wide
    batch to the einsum."""
    x = torch.zeros(4, 1000)
    x[0, 3], x[1, 999], x[2, 3], x[3, 500] = 1.0, 2.0, -1.0, 0.5
    X = scorch.sparse_tensor(x, format="csr")
    w = torch.randn(8, 1000)
    out = gathered_columns.gathered_columns_product(X, w)
    torch.testing.assert_close(out, x @ w.t())
    p = torch.nn.Parameter(w.clone())
    torch.testing.assert_close(gathered_columns.gathered_columns_product(X, p), x @ w.t())
    assert gathered_columns.gathered_columns_product(X, w.t().contiguous().t()) is None   # in x out
    assert gathered_columns.gathered_columns_product(X.detach().requires_grad_(), w) is None
    wide = scorch.sparse_tensor(torch.ones(2, 10), format="csr")
    assert gathered_columns.gathered_columns_product(wide, torch.randn(3, 10)) is None
    assert gathered_columns.gathered_columns_product(scorch.sparse_tensor(x, format="csc"), w) is None


@settings(max_examples=25, deadline=None, derandomize=True)
@given(batch=st.integers(1, 5), inputs=st.integers(1, 80), outputs=st.integers(2, 7),
       density=st.sampled_from([0.0, 0.02, 0.1, 1.0]), w_grad=st.booleans(), seed=st.integers(0, 2**16))
def test_csr_batch_times_a_transposed_weight(batch, inputs, outputs, density, w_grad, seed):
    """``X @ W.t()`` (and ``mm``) with ``W`` stored out x in takes F.linear's copy of only
    the touched columns where it pays; values and W's gradient are dense torch's."""
    g = torch.Generator().manual_seed(seed)
    x = _sparse_dense((batch, inputs), density, torch.float64, seed)
    w = torch.randn(outputs, inputs, generator=g, dtype=torch.float64)
    X = scorch.sparse_tensor(x, format="csr")
    W = w.clone().requires_grad_(w_grad)
    got = X @ W.t()
    torch.testing.assert_close(got, x @ w.t(), **_tol(torch.float64))
    torch.testing.assert_close(torch.mm(X, W.t()), x @ w.t(), **_tol(torch.float64))
    if w_grad:
        got.sum().backward()
        torch.testing.assert_close(W.grad, (x.t() @ torch.ones(batch, outputs, dtype=torch.float64)).t(),
                                   **_tol(torch.float64))
