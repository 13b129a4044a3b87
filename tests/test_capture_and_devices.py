"""Graph capture other than torch.compile, default devices, determinism and training
helpers around scorch sparse tensors (session 36's eighth sweep). Where scorch cannot take
part (a trace would record an empty program, a meta default device would place its arrays
where its kernels cannot write) it refuses by name; elsewhere results are dense torch's."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch.gradients import pattern

warnings.filterwarnings("ignore", message=".*(Sparse CSR|dense copy|deterministic).*")


def _dense(m=6, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g) * (torch.rand(m, n, generator=g) < 0.5)


def _sparse(fmt="csr", seed=0):
    return scorch.sparse_tensor(_dense(seed=seed), format=fmt)


@pytest.mark.parametrize("call", [
    lambda A, x: A @ x, lambda A, x: A * 2, lambda A, x: A.to_dense(),
    lambda A, x: scorch.sparse_tensor(torch.eye(3), format="csr"),
    lambda A, x: scorch.sparse_tensor((torch.tensor([[0, 1], [1, 2]]), torch.tensor([1., 2.])), size=(3, 3)),
], ids=["matmul", "mul", "to_dense", "from_dense", "from_coords"])
def test_a_meta_default_device_is_refused_not_a_segfault(call):
    """Scorch's arrays would land on meta and its kernels write through null pointers."""
    A, x = _sparse(), torch.randn(5, 3)
    with torch.device("meta"):
        with pytest.raises(RuntimeError, match="default device set to meta"):
            call(A, x)
    torch.set_default_device("meta")
    try:
        with pytest.raises(RuntimeError, match="default device set to meta"):
            call(A, x)
    finally:
        torch.set_default_device(None)
    with torch.device("cpu"):          # a CPU default is fine
        torch.testing.assert_close(A @ x, _dense() @ x)


def test_scorch_dropout_of_a_dense_tensor_under_a_meta_default_is_torchs():
    with torch.device("meta"):
        out = scorch.nn.functional.dropout(torch.ones(4, 4, device="cpu"), 0.5, True)
    assert out.device.type == "cpu" and set(out.unique().tolist()) <= {0.0, 2.0}


def test_a_linear_bias_left_on_meta_raises_as_dense():
    """torch's CPU ``add_`` with a meta operand does nothing: the bias was dropped."""
    W = scorch.sparse_tensor(_dense(4, 5), format="csr")
    x = torch.randn(3, 5)
    bias = torch.ones(4, device="meta")
    with pytest.raises(RuntimeError, match="on device meta"):
        F.linear(x, torch.randn(4, 5), bias)          # dense torch's own
    with pytest.raises(RuntimeError, match="bias is on device meta"):
        F.linear(x, W, bias)


@pytest.mark.parametrize("capture", ["jit.trace", "make_fx"])
def test_traces_that_cannot_record_kernels_refuse(capture):
    """A trace records only the output's allocation: it replayed uninitialized memory."""
    A, x = _sparse(), torch.randn(5, 3)
    if capture == "jit.trace":
        run = lambda: torch.jit.trace(lambda y: A @ y, (x,), check_trace=False)
    else:
        from torch.fx.experimental.proxy_tensor import make_fx
        run = lambda: make_fx(lambda y: A @ y)(x)
    with pytest.raises(RuntimeError, match="torch.jit.trace / make_fx"):
        run()


def test_jit_trace_of_scorch_dropout_draws_a_mask_per_call():
    """The fast dropout's seed was recorded as a constant: one mask for every call."""
    m = scorch.nn.Dropout(0.5).train()
    traced = torch.jit.trace(m, (torch.ones(64, 64),), check_trace=False)
    a, b = traced(torch.ones(64, 64)), traced(torch.ones(64, 64))
    assert not torch.equal(a, b)


def test_a_scripted_function_names_torchscript():
    @torch.jit.script
    def f(a, x):
        return torch.mm(a, x)
    with pytest.raises((NotImplementedError, RuntimeError)) as e:
        f(_sparse(), torch.randn(5, 3))
    assert "TorchScript" in str(e.value) or "TorchScript" in repr(e.value.__cause__)


def test_set_is_not_mistaken_for_a_transform():
    with pytest.raises(RuntimeError) as e:
        _sparse().set_(torch.zeros(6, 5))
    assert "torch.func" not in str(e.value)


def test_deterministic_algorithms_keep_each_call_bitwise_equal():
    """A plan's switch to its kept transpose (the third call on a pattern) changes the
    order of the sums: not under torch.use_deterministic_algorithms."""
    d = torch.rand(300, 300, dtype=torch.float64) * (torch.rand(300, 300) < 0.05)
    B = scorch.sparse_tensor(d, format="csr")
    X = torch.randn(300, 32, dtype=torch.float64)
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        outs = [B.t() @ X for _ in range(5)]
    finally:
        torch.use_deterministic_algorithms(old)
    assert all(torch.equal(o, outs[0]) for o in outs)
    torch.testing.assert_close(outs[0], d.t() @ X)


def test_to_with_copy_stays_sparse():
    A = _sparse()
    for B in (A.to("cpu", copy=True), A.to(copy=True), A.to(torch.float32, copy=True)):
        assert isinstance(B, scorch.SparseTensor) and B.format == A.format
        assert torch.equal(B.to_dense(), A.to_dense())
        assert B._storage.values.data_ptr() != A._storage.values.data_ptr()
    big = scorch.sparse_tensor((torch.arange(4).repeat(2, 1), torch.ones(4)), size=(2_000_000, 2_000_000))
    assert isinstance(big.to("cpu", copy=True), scorch.SparseTensor)


def test_pin_memory_makes_no_dense_copy():
    big = scorch.sparse_tensor((torch.arange(4).repeat(2, 1), torch.ones(4)), size=(2_000_000, 2_000_000))
    try:
        torch.ones(2).pin_memory()
        dense_error = None
    except RuntimeError as e:
        dense_error = str(e)
    if dense_error is None:
        assert big.pin_memory() is big
    else:
        with pytest.raises(RuntimeError) as e:
            big.pin_memory()
        assert str(e.value) == dense_error


def test_patterns_equal_in_contents_are_compared_once():
    """An optimizer state holding its own copy of the parameter's pattern (clone, load,
    deepcopy) was compared in full by every op of every step."""
    A = _sparse()
    B = copy.deepcopy(A)
    calls = []
    real = pattern._equal_arrays

    def counting(*args):
        calls.append(1)
        return real(*args)
    pattern._equal_arrays = counting
    try:
        assert all(pattern.same_pattern(B._storage, A._storage) for _ in range(5))
    finally:
        pattern._equal_arrays = real
    assert len(calls) == 1
    with torch.no_grad():
        A._storage.levels[-1].crd[0] += 0       # written in place: compared again
    pattern._equal_arrays = counting
    try:
        pattern.same_pattern(B._storage, A._storage)
    finally:
        pattern._equal_arrays = real
    assert len(calls) == 2


# --- linear algebra (the eighth sweep's h4) -------------------------------------------------

@pytest.mark.parametrize("fmt", ["coo", "csr", "csc"])
def test_triangular_solves_do_not_densify_the_factor(fmt, monkeypatch):
    """torch's CSR triangular solve on the factor's arrays: a 200,000^2 factor took a
    DenseFallbackError (305 GB) where torch.sparse solves it in 0.07 s."""
    n = 300
    g = torch.Generator().manual_seed(3)
    d = (torch.rand(n, n, generator=g, dtype=torch.float64) * (torch.rand(n, n, generator=g) < 0.02)).tril()
    d += torch.eye(n, dtype=torch.float64)
    A = scorch.sparse_tensor(d, format=fmt)
    b = torch.randn(n, 3, generator=g, dtype=torch.float64)
    monkeypatch.setattr(scorch.SparseTensor, "to_dense", lambda *a, **k: pytest.fail("densified"))
    x = torch.linalg.solve_triangular(A, b, upper=False)
    y = torch.linalg.solve_triangular(A.t(), b.t(), upper=True, left=False)
    r = torch.triangular_solve(b, A, upper=False, transpose=True)
    monkeypatch.undo()
    torch.testing.assert_close(x, torch.linalg.solve_triangular(d, b, upper=False))
    torch.testing.assert_close(y, torch.linalg.solve_triangular(d.t(), b.t(), upper=True, left=False))
    torch.testing.assert_close(r.solution, torch.triangular_solve(b, d, upper=False, transpose=True).solution)
    L = scorch.sparse_tensor((torch.arange(200_000).repeat(2, 1), torch.full((200_000,), 2.0, dtype=torch.float64)),
                             size=(200_000, 200_000))
    assert torch.equal(torch.linalg.solve_triangular(L, torch.ones(200_000, 2, dtype=torch.float64), upper=False),
                       torch.full((200_000, 2), 0.5, dtype=torch.float64))


def test_triangular_solve_with_a_graph_still_differentiates():
    d = torch.rand(6, 6, dtype=torch.float64).tril() + torch.eye(6, dtype=torch.float64)
    A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    b = torch.randn(6, 2, dtype=torch.float64)
    torch.linalg.solve_triangular(A, b, upper=False).sum().backward()
    dd = d.clone().requires_grad_()
    torch.linalg.solve_triangular(dd, b, upper=False).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), dd.grad * (d != 0))


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_batched_matrix_power_stays_sparse(n):
    g = torch.Generator().manual_seed(1)
    d = torch.rand(3, 5, 5, generator=g) * (torch.rand(3, 5, 5, generator=g) < 0.4)
    S = scorch.sparse_tensor(d, format="coo")
    r = torch.linalg.matrix_power(S, n)
    assert isinstance(r, scorch.SparseTensor)
    torch.testing.assert_close(r.to_dense(), torch.linalg.matrix_power(d, n))


def test_matrix_power_zero_stays_in_the_graph():
    d = torch.rand(5, 5) * (torch.rand(5, 5) < 0.5)
    A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    r = torch.linalg.matrix_power(A, 0)
    assert r.requires_grad
    r.sum().backward()
    assert A.grad.to_dense().abs().sum() == 0
    torch.testing.assert_close(r.detach().to_dense(), torch.eye(5))


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "dcsr"])
def test_vector_norm_of_order_zero_is_dense_in_every_format(fmt):
    d = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    r = torch.linalg.vector_norm(scorch.sparse_tensor(d, format=fmt), 0, dim=0)
    assert type(r) is torch.Tensor and r.tolist() == [2.0, 0.0, 1.0]


@pytest.mark.parametrize("call", [lambda x: torch.linalg.matrix_norm(x, 1), lambda x: torch.linalg.matrix_norm(x, float("inf")),
                                  lambda x: torch.trace(x.bool()),
                                  lambda x: torch.linalg.cross(x.float()[:, :3].expand(2, 3), torch.ones(3))],
                         ids=["norm1", "norm_inf", "trace_bool", "cross_ranks"])
def test_dense_torchs_input_checks_hold_for_sparse_operands(call):
    d = torch.tensor([[1, 0, 2], [0, 3, 0]])
    with pytest.raises((RuntimeError, NotImplementedError)) as want:
        call(d)
    with pytest.raises(type(want.value), match=str(want.value)[:40].replace("(", r"\(").replace(")", r"\)")):
        call(scorch.sparse_tensor(d, format="csr"))


def test_the_profiler_attributes_kernel_time_to_a_scorch_range():
    """A kernel writes through raw pointers (no ATen op): under a profiler each einsum runs
    in a ``scorch::einsum <equation>`` range (the warm C calls step aside), where before only
    the output's ``aten::empty`` showed."""
    A, x = _sparse(), torch.randn(5, 3)
    A @ x
    with torch.profiler.profile() as prof:
        for _ in range(3):
            y = A @ x
            scorch.einsum("ij,jk->ik", A, x)
    events = {e.key: e.count for e in prof.key_averages()}
    assert events.get("scorch::einsum ij,jk->ik", 0) >= 6, events
    torch.testing.assert_close(y, _dense() @ x)
