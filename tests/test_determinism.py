"""Repeatable bits: the same call at the same thread count gives the same result.

- ``dense.index_add_`` / ``dense.scatter_add_`` with a sparse source accumulate in the
  entries' order (``positions._in_place``), not through torch's ``index_put_(accumulate=True)``,
  whose CPU kernel adds float repeats in parallel with atomics (other bits every call at 2
  threads); they equal torch's own ops on the dense source.
- a changed ``torch.get_num_threads()`` is noticed before the plan lookup
  (``threads.check_requested`` / ``threads.checked``), so the first call at the new count runs
  a plan priced for it, as every later call does."""
import pytest
import torch as T0

import scorch
import scorch as torch
from scorch.tensor_compiler import api, threads


@pytest.fixture
def two_threads():
    before = T0.get_num_threads()
    T0.set_num_threads(2)
    yield
    T0.set_num_threads(before)


def _inputs(n=300, k=20000, w=8):
    g = T0.Generator().manual_seed(0)
    idx = T0.randint(0, n, (k,), generator=g)
    src = (T0.randn(k, w, generator=g) * 1000).relu()       # about half the entries stored
    base = T0.randn(n, w, generator=g)
    idx2 = T0.randint(0, n, (k, w), generator=g)
    return idx, idx2, src, scorch.sparse_tensor(src, format="csr"), base


def _distinct(results):
    return len({r.numpy().tobytes() for r in results})


def test_index_add_sparse_source_repeatable_equals_torch(two_threads):
    idx, _, src, S, base = _inputs()
    rs = [base.clone().index_add_(0, idx, S) for _ in range(4)]
    assert _distinct(rs) == 1
    assert T0.equal(rs[0], base.clone().index_add_(0, idx, src))
    rs = [base.clone().index_add_(0, idx, S, alpha=0.5) for _ in range(3)]
    assert _distinct(rs) == 1
    assert T0.equal(rs[0], base.clone().index_add_(0, idx, src, alpha=0.5))


def test_scatter_add_sparse_source_repeatable_equals_torch(two_threads):
    _, idx2, src, S, base = _inputs()
    rs = [base.clone().scatter_add_(0, idx2, S) for _ in range(4)]
    assert _distinct(rs) == 1
    assert T0.equal(rs[0], base.clone().scatter_add_(0, idx2, src))


def test_index_add_into_strided_self_and_autograd():
    g = T0.Generator().manual_seed(1)
    src = (T0.randn(40, 6, generator=g)).relu()
    idx = T0.randint(0, 6, (40,), generator=g)
    # a transposed (non-contiguous) self: written in place, as torch
    want = T0.zeros(6, 6).t().index_add_(1, idx, src.t())
    self = T0.zeros(6, 6).t()
    got = self.index_add_(1, idx, scorch.sparse_tensor(src.t().contiguous(), format="csr"))
    assert got is self and T0.equal(got, want)
    # gradients reach the dense self and the stored values, as torch's with a dense source
    b0 = T0.randn(6, 6, generator=g, requires_grad=True)
    v0 = src.clone().requires_grad_()
    (b0 * 1).index_add_(0, idx, v0).pow(2).sum().backward()
    b1 = b0.detach().clone().requires_grad_()
    S = scorch.sparse_tensor(src, format="coo").requires_grad_()
    (b1 * 1).index_add_(0, idx, S).pow(2).sum().backward()
    assert T0.allclose(b1.grad, b0.grad)
    dense_grad = S.grad.to_dense() if S.grad.layout != T0.strided else S.grad
    assert T0.allclose(dense_grad, v0.grad * (src != 0))


def _matrix():
    g = T0.Generator().manual_seed(2)
    m = (T0.rand(400, 400, generator=g) < 0.1) * T0.randn(400, 400, generator=g)
    return scorch.sparse_tensor(m, format="dcsr"), m


def test_thread_count_change_plans_before_the_call():
    """The call that notices a new thread count runs (and keeps) a plan made for it: the
    old code dropped the plans inside the kernel call, after its lookup."""
    A, _ = _matrix()
    before = T0.get_num_threads()
    try:
        T0.set_num_threads(1)
        A.t() @ A
        assert api.plan_cache_info()["plans"] >= 1
        T0.set_num_threads(2)
        A.t() @ A
        # planned at 2 threads on this call (the drop came first), so the plan is kept
        assert api.plan_cache_info()["plans"] >= 1
        assert getattr(threads._seen, "count", None) == 2
    finally:
        T0.set_num_threads(before)


def test_thread_count_sequence_same_bits():
    A, m = _matrix()
    before = T0.get_num_threads()
    got = {}
    try:
        torch.use_deterministic_algorithms(True)
        for T in (1, 2, 1, 2, 2):
            T0.set_num_threads(T)
            r = (A.t() @ A).to_dense()
            assert T0.allclose(r, m.t() @ m, atol=1e-4)
            got.setdefault(T, []).append(r)
            # the warm C path and the Python path (an out_format) both
            got[T].append(scorch.einsum("ji,jk->ik", A, A, out_format="coo").to_dense())
    finally:
        torch.use_deterministic_algorithms(False)
        T0.set_num_threads(before)
    for T, rs in got.items():
        assert _distinct(rs) == 1, T


def test_checked_dispatch_notices_first(monkeypatch):
    calls = []
    monkeypatch.setattr(threads, "_ON_CHANGE", [lambda: calls.append("drop")])
    d = threads.checked(lambda table, eq, ops: calls.append("lookup"))
    before = T0.get_num_threads()
    try:
        T0.set_num_threads(1)
        d({}, "", ())
        T0.set_num_threads(2)
        d({}, "", ())
    finally:
        T0.set_num_threads(before)
    assert calls[-2:] == ["drop", "lookup"]
