"""In-place elementwise functions on sparse tensors (``relu_``, ``abs_``, ``clamp_``,
``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``): the stored values change in place,
the pattern and views keep, the result equals dense torch's, autograd rebases the history as
torch does, and an op that moves 0 raises naming the op."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import FORMATS, dense_values

F64 = torch.float64

#: (call on a tensor, in place) -> its dense oracle is the same call on a dense tensor
CALLS = {
    "relu_": lambda x: x.relu_(), "torch.relu_": lambda x: torch.relu_(x), "abs_": lambda x: x.abs_(),
    "neg_": lambda x: x.neg_(), "square_": lambda x: x.square_(), "sin_": lambda x: x.sin_(),
    "tanh_": lambda x: x.tanh_(), "sign_": lambda x: x.sign_(), "floor_": lambda x: x.floor_(),
    "round_": lambda x: x.round_(), "clamp_": lambda x: x.clamp_(-0.5, 0.25),
    "clamp_min_": lambda x: x.clamp_min_(-0.2), "clip_": lambda x: x.clip_(max=0.3),
    "nan_to_num_": lambda x: x.nan_to_num_(), "pow_": lambda x: x.pow_(3),
    "F.relu inplace": lambda x: F.relu(x, inplace=True), "F.relu_": lambda x: F.relu_(x),
    "F.leaky_relu inplace": lambda x: F.leaky_relu(x, 0.2, inplace=True),
    "F.elu_": lambda x: F.elu_(x), "F.hardtanh inplace": lambda x: F.hardtanh(x, -0.5, 0.5, inplace=True),
    "F.relu6 inplace": lambda x: F.relu6(x, inplace=True), "F.silu inplace": lambda x: F.silu(x, inplace=True),
    "F.threshold_": lambda x: F.threshold_(x, 0.1, 0.0), "F.selu inplace": lambda x: F.selu(x, inplace=True),
    "nn.ReLU(inplace=True)": lambda x: torch.nn.ReLU(inplace=True)(x),
}
FLOAT_ONLY = {"sin_", "tanh_", "F.elu_", "F.silu inplace", "F.selu inplace", "F.leaky_relu inplace",
              "nan_to_num_", "round_", "floor_", "F.relu6 inplace", "F.hardtanh inplace"}


pytestmark = pytest.mark.usefixtures("no_dense_fallback")


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(CALLS)),
       shape=st.sampled_from([(4, 5), (0, 3), (6,), (2, 3, 2)]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       density=st.sampled_from([0.0, 0.4, 1.0]))
def test_in_place_ops_change_the_stored_values_as_dense_torch(data, name, shape, dtype, density):
    if dtype == torch.int64 and name in FLOAT_ONLY:
        dtype = F64
    x = data.draw(dense_values(shape, dtype, density=density)) + 0
    X = scorch.sparse_tensor(x, format=data.draw(st.sampled_from(FORMATS[len(shape)])))
    order = tuple(reversed(range(len(shape))))
    view = X.permute(order)                                   # a view: the same arrays
    indices = X.indices().clone()
    try:
        expected = CALLS[name](x.clone())
    except RuntimeError as e:                   # torch's dtype rules (clamp_ of int64 by a float)
        with pytest.raises(RuntimeError, match=str(e).split(":")[0][:30]):
            CALLS[name](X)
        return
    got = CALLS[name](X)
    assert got is X
    assert torch.equal(X.indices(), indices)                 # the pattern kept
    torch.testing.assert_close(X.to_dense(), expected, equal_nan=True)
    torch.testing.assert_close(view.to_dense(), expected.permute(order), equal_nan=True)  # sees it


@pytest.mark.parametrize("name", ["relu_", "abs_", "tanh_", "clamp_", "pow_", "F.relu inplace",
                                  "F.leaky_relu inplace", "nn.ReLU(inplace=True)", "floor_"])
def test_in_place_ops_rebase_the_history_as_torch(name):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, dtype=F64, generator=g) * (torch.rand(5, 4, generator=g) < 0.6)
    w = torch.rand(5, 4, dtype=F64, generator=g)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    D = x.clone().requires_grad_()
    Y = X * 2.0
    out = CALLS[name](Y)
    assert out is Y and Y.requires_grad
    (Y.to_dense() * w).sum().backward()
    (CALLS[name](D * 2.0) * w).sum().backward()
    torch.testing.assert_close(X.grad.to_dense(), D.grad * (x != 0))


def test_a_tensor_saved_for_a_backward_then_changed_in_place_raises_as_torch():
    x = torch.tensor([[1.0, 0.0, -2.0], [0.0, 3.0, 0.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    Y = X * 2.0
    Z = torch.einsum("ij,ij->ij", Y, Y)       # saves Y for its backward
    Y.relu_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        Z.to_dense().sum().backward()


def test_in_place_on_a_leaf_that_requires_grad_raises_as_torch():
    X = scorch.sparse_tensor(torch.eye(3), format="csr", requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        X.relu_()
    with torch.no_grad():                       # as an optimizer step would
        X.clamp_(-0.5, 0.5)
    assert torch.equal(X.to_dense(), torch.eye(3) * 0.5)


@pytest.mark.parametrize("call", [lambda x: x.sigmoid_(), lambda x: x.exp_(), lambda x: x.clamp_(min=0.5),
                                  lambda x: F.threshold_(x, 0.5, 2.0), lambda x: x.cos_()])
def test_in_place_ops_that_move_zero_raise_naming_the_op(call):
    X = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(RuntimeError, match=r"in-place '\w+_' maps 0 to .*could not stay sparse"):
        call(X)
    assert torch.equal(X.to_dense(), torch.eye(3))   # untouched


def test_in_place_keeps_torch_dtype_rules():
    X = scorch.sparse_tensor(torch.tensor([[4, 0], [0, 9]]), format="csr")
    with pytest.raises(RuntimeError, match="can't be cast"):
        X.sqrt_()
    assert torch.equal(X.abs_().to_dense(), torch.tensor([[4, 0], [0, 9]]))


def test_a_model_with_in_place_relu_trains_on_a_sparse_activation():
    g = torch.Generator().manual_seed(0)
    A = scorch.sparse_tensor(torch.rand(8, 8, generator=g) * (torch.rand(8, 8, generator=g) < 0.3), format="csr")
    W = torch.nn.Parameter(torch.randn(8, 8, generator=g))
    relu = torch.nn.ReLU(inplace=True)
    H = relu(A * (A @ W))                     # a sparse activation on A's pattern, changed in place
    H.to_dense().sum().backward()
    Wd = W.detach().clone().requires_grad_()
    torch.relu(A.to_dense() * (A.to_dense() @ Wd)).sum().backward()
    torch.testing.assert_close(W.grad, Wd.grad)


# --- writes at positions ---------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(4, 5), (6,), (2, 3, 2)]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       density=st.sampled_from([0.0, 0.4, 1.0]), value=st.sampled_from([0, 3]))
def test_writes_at_positions_match_dense_torch_or_refuse_to_grow(data, shape, dtype, density, value):
    x = data.draw(dense_values(shape, dtype, density=density)) + 0
    fmt = data.draw(st.sampled_from(FORMATS[len(shape)]))
    X = scorch.sparse_tensor(x, format=fmt)
    stored = x != 0
    # a bool mask, dense or sparse
    mask = (x > 0) if dtype != torch.int64 else (x > 1)
    sparse_mask = data.draw(st.booleans())
    M = scorch.sparse_tensor(mask, format=fmt) if sparse_mask else mask
    grows = value != 0 and bool((mask & ~stored).any())
    Y = X.clone()
    if grows:
        with pytest.raises(RuntimeError, match="does not store"):
            Y.masked_fill_(M, value)
    else:
        Y.masked_fill_(M, value)
        assert torch.equal(Y.to_dense(), x.masked_fill(mask, value)) and Y.nnz == X.nnz
        Z = X.clone()
        Z[M] = value                                  # __setitem__ with a mask
        assert torch.equal(Z.to_dense(), x.masked_fill(mask, value))
    # positions as index tensors: in place (x[i, j] = v, index_put_) and out of place
    idx = tuple(torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2)))
                for n in shape)
    want = x.index_put(idx, torch.tensor(value, dtype=dtype))
    assert_close = torch.testing.assert_close
    assert_close(X.index_put(idx, torch.tensor(value, dtype=dtype)).to_dense(), want)
    vals = torch.arange(1, 3, dtype=dtype)
    assert_close(X.index_put(idx, vals, accumulate=True).to_dense(), x.index_put(idx, vals, accumulate=True))
    hits = stored[idx]
    Y = X.clone()
    if value != 0 and not bool(hits.all()):
        with pytest.raises(RuntimeError, match="does not store"):
            Y[idx] = value
    else:
        Y[idx] = value
        assert torch.equal(Y.to_dense(), want) and Y.nnz == X.nnz


def test_fill_diagonal_and_writes_under_autograd():
    x = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 4.0], [5.0, 0.0, 6.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr")
    assert torch.equal(X.clone().fill_diagonal_(0).to_dense(), x.clone().fill_diagonal_(0))
    assert torch.equal(X.clone().fill_diagonal_(7).to_dense(), x.clone().fill_diagonal_(7))
    with pytest.raises(RuntimeError, match="does not store"):
        scorch.sparse_tensor(x[:, [1, 0, 2]], format="csr").fill_diagonal_(7)
    S = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    D = x.clone().requires_grad_()
    Y = S * 1.0
    Y[Y > 3] = 0.0
    w = torch.arange(9.0, dtype=F64).reshape(3, 3)
    (Y.to_dense() * w).sum().backward()
    Yd = D * 1.0
    Yd[Yd > 3] = 0.0
    (Yd * w).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), D.grad * (x != 0))


def test_index_put_out_of_place_grows_the_pattern_differentiably():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=F64)
    S = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    v = torch.tensor([5.0, 6.0], dtype=F64, requires_grad=True)
    out = S.index_put((torch.tensor([0, 1]), torch.tensor([1, 1])), v)
    assert isinstance(out, scorch.SparseTensor) and out.nnz == 3
    (out.to_dense() * torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)).sum().backward()
    assert torch.equal(S.grad.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64))
    assert torch.equal(v.grad, torch.tensor([2.0, 4.0], dtype=F64))


def test_writes_with_bad_masks_or_indices_say_what_is_wrong():
    X = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(RuntimeError, match=r"mask of shape \(2, 2\).*\(3, 3\)"):
        X.masked_fill_(torch.ones(2, 2, dtype=torch.bool), 0.0)
    with pytest.raises(RuntimeError, match=r"sparse mask.*\(3, 3\), got \(3, 1\)"):
        X.masked_fill_(scorch.sparse_tensor(torch.ones(3, 1, dtype=torch.bool), format="coo"), 0.0)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 3"):
        X[torch.tensor([0]), torch.tensor([5])] = 0.0
    with pytest.raises(RuntimeError, match="would write 1.0 at 4 position"):
        X[0:2] = 1.0                                 # 4 of the 6 positions are not stored


@pytest.mark.parametrize("make_view", [lambda y: y.t(), lambda y: y.unsqueeze(0), lambda y: y.permute(1, 0)])
def test_a_view_taken_before_an_in_place_change_refuses_a_stale_gradient(make_view):
    """A view shares the values array: it sees the change in its forward, and its backward,
    recorded before the change, raises torch's error instead of a gradient that misses it
    (torch would rebase a torch view; a scorch view is its own tensor)."""
    x = torch.tensor([[1.0, -2.0], [0.0, 3.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    Y = X * 1.0
    V = make_view(Y)
    Y.relu_()
    assert float(V.to_dense().min()) == 0.0                      # the view sees the change
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        V.to_dense().sum().backward()
    W = X * 1.0
    W.relu_()
    make_view(W).to_dense().sum().backward()                     # a view taken after: fine
    assert torch.equal(X.grad.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64))


def test_scaling_in_place_under_autograd_rebases_the_history():
    x = torch.tensor([[1.0, 0.0], [-2.0, 3.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    Y = X * 1.0
    Y.mul_(3.0)
    Y /= 2.0
    (Y.to_dense() * torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)).sum().backward()
    assert torch.equal(X.grad.to_dense(), torch.tensor([[1.5, 0.0], [4.5, 6.0]], dtype=F64))


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "div_"])
@pytest.mark.parametrize("partner", ["sparse same pattern", "sparse fewer entries", "dense"])
def test_in_place_by_a_tensor_under_autograd_rebases_the_history(op, partner):
    """``y op= other`` with grad in play: the values written in place (views see them) and
    both operands' gradients those of the out-of-place op; a result outside the pattern
    (adding a dense tensor) still refuses, naming the op."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, dtype=F64, generator=g) * (torch.rand(4, 5, generator=g) < 0.6)
    o = torch.rand(4, 5, dtype=F64, generator=g) + 0.5
    if partner != "dense":
        o = o * (x != 0) * (torch.rand(4, 5, generator=g) < (1.0 if partner == "sparse same pattern" else 0.5))
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    O = (scorch.sparse_tensor(o, format="csr") if partner != "dense" else o.clone()).requires_grad_()
    D, Od = x.clone().requires_grad_(), o.clone().requires_grad_()
    w = torch.rand(4, 5, dtype=F64, generator=g)
    Y = X * 2.0
    view = Y.t()
    call = (lambda a, b: getattr(a, op)(b + 1.0 if op == "div_" else b))
    if op in ("add_", "sub_") and partner == "dense":
        with pytest.raises(RuntimeError, match=f"{op}: the result is dense"):
            call(Y, O)
        return
    assert call(Y, O) is Y and Y.requires_grad
    want = call(D * 2.0, Od)
    torch.testing.assert_close(Y.to_dense(), want * (x != 0))
    torch.testing.assert_close(view.to_dense(), (want * (x != 0)).t())
    (Y.to_dense() * w).sum().backward()
    (want * (x != 0) * w).sum().backward()
    torch.testing.assert_close(X.grad.to_dense(), D.grad * (x != 0))
    og = O.grad.to_dense() if isinstance(O.grad, scorch.SparseTensor) else O.grad
    torch.testing.assert_close(og, Od.grad * ((o != 0) if partner != "dense" else 1.0))


def test_in_place_by_a_dense_tensor_changed_before_the_backward_raises_as_torch():
    X = scorch.sparse_tensor(torch.tensor([[1.0, 0.0], [-2.0, 3.0]], dtype=F64), format="csr", requires_grad=True)
    W = torch.full((2, 2), 5.0, dtype=F64, requires_grad=True)
    w = W * 1.0
    Y = X * 1.0
    Y.mul_(w)
    w.add_(1.0)                                   # the saved factor changes
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        Y.to_dense().sum().backward()


def test_in_place_by_a_tensor_on_a_leaf_raises_before_writing():
    x = torch.tensor([[1.0, 0.0], [-2.0, 3.0]], dtype=F64)
    X = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        X.mul_(torch.full((2, 2), 5.0, dtype=F64))
    assert torch.equal(X.to_dense(), x)
