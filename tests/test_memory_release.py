"""Memory given back once the user drops their tensors (session 33's leak sweep): the caches
behind kept conversions, relayout scratch and optimizer-step tracking must not hold a user's
operands, their arrays or their models after the last reference goes."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

import scorch
from scorch import kept_conversions
from scorch.tensor_compiler import relayout


def _coo(n=300, nnz=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (2, nnz), generator=g)
    return scorch.sparse_tensor((idx, torch.randn(nnz, generator=g)), size=(n, n))


def _refs(t):
    st = t._storage
    return [weakref.ref(a) for lv in st.levels for a in (lv.pos, lv.crd) if a is not None] + \
        [weakref.ref(st.values)]


@pytest.mark.parametrize("product", ["spgemm", "transposed", "backward", "einsum3"])
def test_coo_operands_of_products_are_freed(product, monkeypatch):
    """COO -> CSR keeps the column array, the kept conversion's anchor: the kept entry held
    its own key, and every COO operand of a product stayed in memory. (The few latest small
    patterns the content comparison keeps, a bounded set, are switched off here.)"""
    monkeypatch.setattr(kept_conversions, "_RECENT", {})
    monkeypatch.setattr(kept_conversions, "_RECENT_BYTES", 0)
    A, B = _coo(seed=1), _coo(seed=2)
    X = torch.randn(300, 4)
    refs = _refs(A) + _refs(B)
    if product == "spgemm":
        r = A @ B
    elif product == "transposed":
        r = A.t() @ B
    elif product == "backward":
        A.requires_grad_()
        (A @ X).sum().backward()
        r = A.grad
    else:
        r = scorch.einsum("ij,jk,kl->il", A, B, X)
    del A, B, r
    gc.collect()
    assert [w() is None for w in refs] == [True] * len(refs)


def test_big_patterns_are_not_kept_after_they_are_freed(monkeypatch):
    """The content-compared recent conversions hold at most _RECENT_BYTES: above it a pattern
    is freed with its tensor (four 6M-entry matrices stayed, 621 MB)."""
    monkeypatch.setattr(kept_conversions, "_RECENT", {})
    monkeypatch.setattr(kept_conversions, "_RECENT_BYTES", 10_000)
    A = _coo(nnz=5000).to_format("csr")
    X = torch.randn(300, 4)
    for _ in range(3):
        A.t() @ X
    refs = _refs(A)
    del A
    gc.collect()
    assert all(w() is None for w in refs)
    assert sum(e[3] for e in kept_conversions._RECENT.values()) <= 10_000


def test_relayout_scratch_past_the_bound_is_not_kept(monkeypatch):
    monkeypatch.setattr(relayout, "SCRATCH_MAX", 1 << 16)
    monkeypatch.setattr(relayout, "_local", threading.local())   # earlier tests' buffers
    A = _coo(n=200, nnz=500).to_format("csr")
    X = torch.randn(300, 200)           # X.t() is re-laid out: 240 KB > the bound
    torch.testing.assert_close(A @ X.t(), A.to_dense() @ X.t())
    bufs = getattr(relayout._local, "bufs", {})
    assert all(b.numel() * b.element_size() <= (1 << 16) for b in bufs.values())


def test_an_optimizer_step_that_raises_keeps_nothing_alive():
    """scorch's step pre-hook kept torch's wrapper frame (optimizer, parameters) until the
    post-hook, which a raising step never runs."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()

    def closure():
        raise ValueError("boom")
    with pytest.raises(ValueError):
        opt.step(closure)
    ref = weakref.ref(model.weight)
    del model, opt
    gc.collect()
    assert ref() is None
