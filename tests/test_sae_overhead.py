"""The sparse autoencoder's per-step fast paths, against dense torch:

- a dense batch to CSR / CSC (``from_dense``'s matrix path: the two scans write the level
  arrays directly), over shapes with 0 and 1 sized dimensions, empty and full densities,
  dtypes and strided (non-contiguous) inputs;
- ``F.linear`` of a sparse batch through a sparse weight as ONE autograd node
  (``sparse_linear._SparseBatchLinear``): values, the weight's gradient on its own pattern, the
  bias's and the batch's, double backward, and a weight updated in place between steps.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.formats import Format
from scorch.nn import functional as F
from scorch.sparse_ops import sparse_linear

DTYPES = [torch.float32, torch.float64]


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)


def _sparse_dense(shape, density, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (torch.rand(shape, generator=g) < density)).to(dtype)


# --- dense -> CSR / CSC --------------------------------------------------------------------

@settings(max_examples=30, deadline=None, derandomize=True)
@given(rows=st.integers(0, 7), cols=st.integers(0, 9), density=st.sampled_from([0.0, 0.3, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool,
                              torch.complex64]),
       fmt=st.sampled_from(["csr", "csc"]), layout=st.sampled_from(["contiguous", "transposed", "sliced"]),
       seed=st.integers(0, 2**16))
def test_matrix_from_dense_matches_dense(rows, cols, density, dtype, fmt, layout, seed):
    base = _sparse_dense((rows, 2 * cols), density, torch.float64, seed)
    x = (base * 3).to(dtype) if dtype != torch.bool else base != 0
    if layout == "transposed":
        x = x.t().contiguous().t()
    elif layout == "sliced":                     # every other column: a stride-2 view
        x = x[:, ::2]
    else:
        x = x[:, :cols].contiguous()
    s = scorch.sparse_tensor(x, format=fmt)
    assert s.format == scorch.as_format(fmt, 2)
    assert torch.equal(s.to_dense(), x)
    stg = s._storage
    assert stg.nnz == int((x != 0).sum())
    lv = stg.levels[1]
    assert lv.pos.dtype == lv.crd.dtype == stg.index_dtype
    if fmt == "csr" and x.dtype in (torch.float32, torch.float64):   # torch's own arrays
        ref = x.to_sparse_csr()
        assert torch.equal(lv.pos.long(), ref.crow_indices())
        assert torch.equal(lv.crd.long(), ref.col_indices())
        assert torch.equal(stg.values, ref.values())


def test_from_dense_keeps_nan_and_negative_zero_semantics():
    """NaN is stored (it is not 0), -0.0 is not (it equals 0), as torch's to_sparse_csr."""
    x = torch.tensor([[0.0, float("nan"), -0.0], [1.0, 0.0, -2.0]])
    s = scorch.sparse_tensor(x, format="csr")
    ref = x.to_sparse_csr()
    assert torch.equal(s._storage.levels[1].crd.long(), ref.col_indices())
    assert s._storage.nnz == 3


def test_from_dense_matrix_path_builds_the_same_storage_as_the_general_path():
    """The matrix path's storage equals the general path's (a 3-level format with the same
    leading dense level goes through the general scan): same arrays, same dtypes."""
    x = _sparse_dense((6, 10), 0.4, torch.float32, 5)
    fast = scorch.conversion.from_dense(x, Format("dc"))
    general = scorch.conversion.from_dense(x.reshape(6, 10, 1), Format("dcd"))
    assert torch.equal(fast.levels[1].pos, general.levels[1].pos)
    assert torch.equal(fast.levels[1].crd, general.levels[1].crd)
    assert torch.equal(fast.values, general.values)


# --- F.linear(sparse batch, sparse weight) as one node ---------------------------------------

@settings(max_examples=24, deadline=None, derandomize=True)
@given(batch=st.integers(0, 5), inputs=st.integers(1, 9), outputs=st.integers(1, 6),
       x_density=st.sampled_from([0.0, 0.5, 1.0]), w_density=st.sampled_from([0.0, 0.5, 1.0]),
       x_fmt=st.sampled_from(["csr", "csc", "coo", "dcsr"]), w_fmt=st.sampled_from(["csr", "coo", "dcsr"]),
       dtype=st.sampled_from(DTYPES), bias=st.sampled_from([None, "vector", "scalar", "parameter"]),
       input_grad=st.booleans(), seed=st.integers(0, 2**16))
def test_sparse_batch_linear_matches_dense(batch, inputs, outputs, x_density, w_density, x_fmt,
                                           w_fmt, dtype, bias, input_grad, seed):
    xd = _sparse_dense((batch, inputs), x_density, dtype, seed)
    wd = _sparse_dense((outputs, inputs), w_density, dtype, seed + 1)
    X = scorch.sparse_tensor(xd, format=x_fmt, requires_grad=input_grad)
    W = scorch.sparse_tensor(wd, format=w_fmt, requires_grad=True)
    b = {None: None, "vector": torch.rand(outputs, dtype=dtype, requires_grad=True),
         "scalar": torch.rand((), dtype=dtype, requires_grad=True),
         "parameter": torch.nn.Parameter(torch.rand(outputs, dtype=dtype))}[bias]
    G = torch.rand(batch, outputs, dtype=dtype)
    y = F.linear(X, W, b)
    if sparse_linear._fills_up(X, W, inputs):   # one graph node for the layer
        expanded = not input_grad and sparse_linear.expand_pays(X._storage.nnz, batch, inputs,
                                                                W._storage.nnz, outputs)
        assert type(y.grad_fn).__name__ == ("_ColumnBatchLinearBackward" if expanded
                                            else "_SparseBatchLinearBackward")
    y = y.to_dense() if isinstance(y, scorch.SparseTensor) else y
    (y * G).sum().backward()

    Xr, Wr = xd.clone().requires_grad_(), wd.clone().requires_grad_()
    br = b.detach().clone().requires_grad_() if b is not None else None
    yr = torch.nn.functional.linear(Xr, Wr, br)
    (yr * G).sum().backward()
    torch.testing.assert_close(y.detach(), yr.detach(), **_tol(dtype))
    assert W.grad._storage.shares_pattern(W._storage)   # the gradient on W's own pattern
    torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (wd != 0), **_tol(dtype))
    if input_grad:
        torch.testing.assert_close(X.grad.to_dense(), Xr.grad * (xd != 0), **_tol(dtype))
    if b is not None:
        torch.testing.assert_close(b.grad, br.grad, **_tol(dtype))


def _dense_layer(seed=0, dtype=torch.float64):
    wd = _sparse_dense((5, 7), 0.7, dtype, seed)
    xd = _sparse_dense((4, 7), 0.8, dtype, seed + 1)
    return wd, xd


def _wide_layer(seed=0, dtype=torch.float64):
    """A batch too wide and sparse to expand (2 x 2000 at 1 %) whose product still fills up."""
    wd = _sparse_dense((3, 2000), 0.05, dtype, seed)
    xd = _sparse_dense((2, 2000), 0.01, dtype, seed + 1)
    return wd, xd


@pytest.mark.parametrize("layer,node", [(_dense_layer, "_ColumnBatchLinearBackward"),
                                        (_wide_layer, "_SparseBatchLinearBackward")])
def test_sparse_batch_linear_is_one_node_with_the_leaves_behind_it(layer, node):
    wd, xd = layer()
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.rand(wd.shape[0], dtype=torch.float64, requires_grad=True)
    X = scorch.sparse_tensor(xd, format="csr")
    assert sparse_linear._fills_up(X, W, wd.shape[1])
    y = F.linear(X, W, b)
    assert type(y.grad_fn).__name__ == node
    behind = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
    assert behind == ["AccumulateGrad", "AccumulateGrad"]
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(W.grad.to_dense(), xd.sum(0).expand_as(wd) * (wd != 0))


@pytest.mark.parametrize("layer", [_dense_layer, _wide_layer])
def test_sparse_batch_linear_double_backward(layer):
    """create_graph through the node: the bias's gradient is differentiated again."""
    wd, xd = layer(3)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.rand(wd.shape[0], dtype=torch.float64, requires_grad=True)
    y = F.linear(scorch.sparse_tensor(xd, format="csr"), W, b)
    gb, = torch.autograd.grad((y ** 2).sum(), b, create_graph=True)
    (gb ** 2).sum().backward()
    Wr, br = wd.clone().requires_grad_(), b.detach().clone().requires_grad_()
    gbr, = torch.autograd.grad((torch.nn.functional.linear(xd, Wr, br) ** 2).sum(), br, create_graph=True)
    (gbr ** 2).sum().backward()
    torch.testing.assert_close(W.grad.to_dense(), Wr.grad * (wd != 0))
    torch.testing.assert_close(b.grad, br.grad)


def test_weight_updated_in_place_between_steps_is_read_fresh():
    """The gathered input-major values are reused only while the weight's values are
    unchanged: an optimizer's in-place update is seen by the next step, and a weight whose
    pattern was replaced gets its own input-major form."""
    wd, xd = _dense_layer(7, torch.float32)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    X = scorch.sparse_tensor(xd, format="csr")
    y1 = F.linear(X, W)
    with torch.no_grad():
        W.values().mul_(2)
    y2 = F.linear(X, W)
    torch.testing.assert_close(y2, 2 * y1)
    pruned = wd * (torch.rand(wd.shape, generator=torch.Generator().manual_seed(1)) < 0.5)
    with torch.no_grad():
        W._storage = scorch.sparse_tensor(pruned, format="csr")._storage
    torch.testing.assert_close(F.linear(X, W), xd @ pruned.t(), rtol=1e-5, atol=1e-5)


def test_sparse_batch_linear_under_no_grad_and_with_a_3d_batch():
    wd = _sparse_dense((6, 8), 0.6, torch.float32, 11)
    xd = _sparse_dense((2, 3, 8), 0.7, torch.float32, 12)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    b = torch.rand(6)
    with torch.no_grad():
        y = F.linear(scorch.sparse_tensor(xd, format="csf"), W, b)
    assert y.grad_fn is None
    torch.testing.assert_close(y, torch.nn.functional.linear(xd, wd, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [torch.rand(3, 5), torch.rand(5, dtype=torch.float64)])
def test_sparse_batch_linear_unusual_bias_takes_the_composed_path(bias):
    """A bias that is not a vector of the layer's dtype is left to the composed graph
    (torch's broadcasting and type rules apply there)."""
    wd = _sparse_dense((5, 7), 0.8, torch.float32, 2)
    xd = _sparse_dense((3, 7), 0.8, torch.float32, 3)
    W = scorch.sparse_tensor(wd, format="csr", requires_grad=True)
    X = scorch.sparse_tensor(xd, format="csr")
    try:
        ref = torch.nn.functional.linear(xd, wd, bias)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            F.linear(X, W, bias)
        return
    y = F.linear(X, W, bias)
    assert type(y.grad_fn).__name__ not in ("_SparseBatchLinearBackward", "_ColumnBatchLinearBackward")
    torch.testing.assert_close(y.to(ref.dtype), ref, rtol=1e-5, atol=1e-5)
