"""Bad arguments give torch's error (or a clearer one naming the argument), never a silently
different result: found by the sixth adversarial sweep (bad input and error messages)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch.tensor_compiler import build

D = torch.tensor([[0., 0., 0., 0., 9.],
                  [0., 0., 9., 0., 0.],
                  [9., 9., 0., 9., 0.]])


@pytest.mark.parametrize("op", [
    lambda a, row: a.clamp_(max=row), lambda a, row: a.clamp_max_(row),
    lambda a, row: a.clamp_(min=-row, max=row), lambda a, row: a.pow_(row / 5),
    lambda a, row: torch.clamp_(a, max=row)])
def test_in_place_with_a_tensor_argument_broadcasts_over_the_shape(op):
    """5 stored entries against a 5-wide bound: each entry gets its own column's bound, not
    the bound at its storage position."""
    row = torch.tensor([1., 2., 3., 4., 5.])
    A = scorch.sparse_tensor(D, format="csr")
    assert op(A, row) is A
    torch.testing.assert_close(A.to_dense(), op(D.clone(), row))


def test_in_place_with_a_full_tensor_argument_and_its_errors():
    d = torch.zeros(4, 5)
    d[0, :3], d[2, 1:] = 1.0, 2.0
    A = scorch.sparse_tensor(d, format="csr")
    bound = torch.rand(4, 5) + 0.5
    torch.testing.assert_close(A.clamp_(max=bound).to_dense(), d.clamp(max=bound))
    with pytest.raises(RuntimeError, match="does not broadcast"):
        A.clamp_(min=torch.zeros(3))
    with pytest.raises(RuntimeError, match="could not stay sparse"):
        A.clamp_(min=torch.ones(4, 5))         # moves the unstored zeros to 1


def test_in_place_with_a_tensor_argument_under_autograd():
    A = scorch.sparse_tensor(D, format="csr").requires_grad_()
    B = A * 1
    B.clamp_(max=torch.tensor([1., 1., 1., 1., 10.]))
    B.sum().backward()
    want = torch.zeros(3, 5)
    want[0, 4] = 1.0                           # 9 <= 10: passes; every other one is clamped
    torch.testing.assert_close(A.grad.to_dense(), want)


def test_uint8_index_is_a_mask_and_narrow_integers_are_refused():
    A = scorch.sparse_tensor(D, format="csr")
    m = torch.tensor([1, 0, 1], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = A[m]
    assert any("uint8" in str(w.message) for w in seen)
    torch.testing.assert_close(got.to_dense(), D[m.bool()])
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        A[torch.tensor([0, 1], dtype=torch.int16)]


def test_index_add_checks_the_source_shape():
    A = scorch.sparse_tensor(D, format="csr")
    for src in (torch.ones(2, 4), torch.ones(2, 1)):
        with pytest.raises(RuntimeError, match="source tensor shape must match"):
            A.index_add(0, torch.tensor([0, 1]), src)
    torch.testing.assert_close(A.index_add(0, torch.tensor([0, 1]), torch.ones(2, 5)).to_dense(),
                               D.index_add(0, torch.tensor([0, 1]), torch.ones(2, 5)))


@pytest.mark.parametrize("fn", [torch.sparse.softmax, torch.sparse.log_softmax])
def test_softmax_into_an_integer_dtype_is_refused(fn):
    A = scorch.sparse_tensor(D, format="csr")
    with pytest.raises(RuntimeError, match="floating point"):
        fn(A, 1, dtype=torch.int64)


@pytest.mark.parametrize("fmt", ["csc", "dcsc", scorch.Format("qq", mode_order=(1, 0))])
def test_is_coalesced_only_where_indices_are_row_major(fmt):
    S = scorch.sparse_tensor(D, format=fmt)
    assert not S.is_coalesced()
    C = S.coalesce()
    assert C.is_coalesced()
    key = C.indices()[0] * 5 + C.indices()[1]
    assert bool((key[1:] > key[:-1]).all())
    torch.testing.assert_close(C.to_dense(), D)
    R = scorch.sparse_tensor(D, format="csr")
    assert R.is_coalesced() and R.coalesce() is R


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("v", [float("nan"), float("inf"), float("-inf")])
def test_grid_sample_at_non_finite_coordinates(mode, padding, v):
    d = D + torch.eye(3, 5)
    g = torch.tensor([[[[v, 0.3], [0.1, v]]]])
    want = F.grid_sample(d[None, None], g, mode=mode, padding_mode=padding, align_corners=False)
    got = F.grid_sample(scorch.sparse_tensor(d, format="csr")[None, None], g, mode=mode,
                        padding_mode=padding, align_corners=False)
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, want, equal_nan=True)


def test_rms_norm_checks_the_weight():
    A = scorch.sparse_tensor(D, format="csr")
    for w in (torch.ones(4), torch.ones(6), torch.ones(2, 5)):
        with pytest.raises(RuntimeError, match="same shape as normalized_shape"):
            F.rms_norm(A, (5,), w)


@pytest.mark.parametrize("call, message", [
    (lambda x: F.conv1d(x, torch.ones(2, 4, 3), padding=-1), "negative padding"),
    (lambda x: F.conv1d(x, torch.ones(2, 4, 3), stride=0), "non-positive stride"),
    (lambda x: F.conv1d(x, torch.ones(2, 4, 3), dilation=0), "dilation should be greater than zero"),
    (lambda x: F.max_pool1d(x, 0), "kernel_size must be greater than zero"),
    (lambda x: F.max_pool1d(x, 2, padding=2), "at most half"),
    (lambda x: F.max_pool1d(x, 2, stride=0), "stride must be greater than zero"),
    (lambda x: F.max_pool1d(x, 2, dilation=0), "dilation must be greater than zero"),
    (lambda x: F.avg_pool1d(x, 2, stride=0), "stride should not be zero"),
    (lambda x: F.avg_pool1d(x, 2, padding=-1), "pad must be non-negative"),
    (lambda x: F.interpolate(x, size=0), "sizes should be greater than 0")])
def test_window_ops_check_their_arguments(call, message):
    x = scorch.sparse_tensor(torch.eye(4, 6)[None], format="coo")
    with pytest.raises(RuntimeError, match=message):
        call(x)


def test_adaptive_pool_to_nothing_and_embedding_padding_idx():
    x = scorch.sparse_tensor(torch.eye(4, 6)[None], format="coo")
    assert tuple(F.adaptive_avg_pool1d(x, 0).shape) == (1, 4, 0)
    w = scorch.sparse_tensor(torch.eye(5, 3), format="csr")
    with pytest.raises(AssertionError, match="Padding_idx"):
        F.embedding(torch.tensor([0, 1]), w, padding_idx=7)


def test_index_copy_refuses_a_negative_index_and_narrow_a_negative_length():
    A = scorch.sparse_tensor(torch.eye(4, 5), format="csr")
    with pytest.raises(IndexError, match="out of bounds"):
        A.index_copy(0, torch.tensor([0, -1]), torch.ones(2, 5))
    torch.testing.assert_close(A.index_fill(0, torch.tensor([-1]), 0.0).to_dense(),
                               torch.eye(4, 5).index_fill(0, torch.tensor([-1]), 0.0))
    with pytest.raises(RuntimeError, match="length must be non-negative"):
        A.narrow(1, 3, -1)


def test_zeros_like_on_another_device_is_refused():
    A = scorch.sparse_tensor(D, format="csr")
    with pytest.raises(RuntimeError, match="live on the CPU"):
        torch.zeros_like(A, device="meta")
    assert isinstance(torch.zeros_like(A, device="cpu"), scorch.SparseTensor)


@pytest.mark.parametrize("kwargs", [dict(block=(2.5, 2)), dict(block="22"), dict(block=(True, 2)),
                                    dict(mode_order=(1.5, 0.0)), dict(mode_order="10")])
def test_format_refuses_non_integer_arguments(kwargs):
    with pytest.raises(ValueError, match="sequence of ints"):
        scorch.Format("dc", **kwargs)


def test_environment_counts_are_checked_by_name(monkeypatch):
    env = dict(os.environ, SCORCH_PARALLEL_MIN_WORK="20k")
    r = subprocess.run([sys.executable, "-c", "import scorch"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "SCORCH_PARALLEL_MIN_WORK='20k'" in r.stderr
    monkeypatch.setenv(build.CACHE_MAX_ENV, "-3")
    assert build.cache_limit() == build.DEFAULT_CACHE_MAX_MB << 20
    monkeypatch.setenv(build.CACHE_MAX_ENV, "0")
    assert build.cache_limit() is None


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.RMSprop])
def test_a_dense_grad_of_a_sparse_parameter(opt_cls):
    """Zero off the pattern, a dense ``.grad`` is the gradient on the pattern; non-zero off
    it, the step refuses it naming the parameter."""
    p = torch.nn.Parameter(scorch.sparse_tensor(torch.eye(3), format="csr"))
    q = torch.nn.Parameter(torch.eye(3))
    p.grad, q.grad = torch.eye(3) * 2, torch.eye(3) * 2
    opt_cls([p], lr=0.1).step()
    opt_cls([q], lr=0.1).step()
    torch.testing.assert_close(p.detach().to_dense(), q.detach())
    assert p._storage.nnz == 3
    p.grad = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match="parameter 0 of group 0 is sparse"):
        opt_cls([p], lr=0.1).step()


def test_ops_under_inference_mode():
    """Inference tensors track no version counter: the caches stamped by one take a fresh
    stamp instead of raising (GCN's symmetrisation, sums, a torch layout read)."""
    d = torch.rand(30, 30) * (torch.rand(30, 30) < 0.2)
    with torch.inference_mode():
        A = scorch.sparse_tensor(d, format="csr")
        torch.testing.assert_close((A + A.t()).to_dense(), d + d.t())
        torch.testing.assert_close(A.sum(0).to_dense() if isinstance(A.sum(0), scorch.SparseTensor)
                                   else A.sum(0), d.sum(0))
        T = d.to_sparse_csr()
        torch.testing.assert_close(scorch.einsum("ij,jk->ik", T, torch.eye(30)), d)
        torch.testing.assert_close(scorch.sparse_tensor(T).to_dense(), d)
        C = scorch.sparse_tensor(d, format="coo")
        torch.testing.assert_close((C @ C).to_dense(), d @ d, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(A.sum(0).to_dense() if isinstance(A.sum(0), scorch.SparseTensor)
                                   else A.sum(0), d.sum(0))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_a_sparse_operand_changed_in_place_after_forward(fmt):
    """As for a dense operand: backward refuses a saved operand changed in place since the
    forward, and allow_mutation_on_saved_tensors gives the gradient at the saved values."""
    d = torch.rand(6, 5) * (torch.rand(6, 5) < 0.5) + torch.eye(6, 5)
    A = scorch.sparse_tensor(d, format=fmt)
    x = torch.randn(5, 3, requires_grad=True)
    y = (A @ x).square().sum()
    with torch.no_grad():
        A.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        A = scorch.sparse_tensor(d, format=fmt)
        x = torch.randn(5, 3, requires_grad=True)
        y = (A @ x).square().sum()
        A.mul_(2)
        y.backward()
    x2 = x.detach().clone().requires_grad_()
    (d @ x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
