"""A dense matrix the kernel streams along one index and gathers along another that only a
sparse operand's last level drives (``einsum("ij,kj->ik", X, W)``, ``W`` out x in) is copied
narrow: only the slices the sparse operand stores (``narrowed_gather``), not re-laid out
whole. The result is the dense oracle's either way; the copy follows the stored entries."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch.tensor_compiler import narrowed_gather as ng_mod, relayout as relayout_mod
from scorch.tensor_compiler.api import plan_cache_clear

from compiler_helpers import dense, rand

SETTINGS = dict(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def moves(monkeypatch):
    """Counts the narrow copies and the whole re-layouts, in entries."""
    seen = {"narrow": [], "whole": []}
    real_gather, real_relayout = ng_mod.gather_columns, relayout_mod.relayout

    def gather(x, cols, out, threads=1):
        seen["narrow"].append(out.numel())
        return real_gather(x, cols, out, threads)

    def whole(x, *args, **kwargs):
        seen["whole"].append(x.numel())
        return real_relayout(x, *args, **kwargs)
    monkeypatch.setattr(ng_mod, "gather_columns", gather)
    for mod in ("scorch.tensor_compiler.execute", "scorch.tensor_compiler.runner"):
        monkeypatch.setattr(f"{mod}.relayout", whole)
    plan_cache_clear()     # warm runners hold the function they were built with
    yield seen
    plan_cache_clear()


def _value(x):
    if isinstance(x, scorch.SparseTensor):
        return x.to_dense()
    return dense(x)


@settings(**SETTINGS)
@given(rows=st.integers(1, 12), width=st.integers(1, 3000), out=st.integers(1, 20),
       density=st.sampled_from([0.0, 0.0005, 0.01, 0.3, 1.0]),
       fmt=st.sampled_from(["csr", "dcsr", "coo", "csc"]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       form=st.sampled_from(["ij,kj->ik", "ij,jk->ik", "ij,kj->ki"]), seed=st.integers(0, 2**20))
def test_matches_dense(rows, width, out, density, fmt, dtype, form, seed):
    x = rand((rows, width), density, dtype, seed)
    w = torch.randn(out, width, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    weight = w.t() if form == "ij,jk->ik" else w        # stride 1 along j either way
    got = scorch.einsum(form, scorch.sparse_tensor(x, format=fmt), weight)
    want = x @ w.t()
    tol = 1e-4 if dtype == torch.float32 else 1e-10    # sums of up to 3000 products
    torch.testing.assert_close(_value(got), want.t() if form.endswith("ki") else want,
                               rtol=tol, atol=tol)


def test_copy_follows_the_stored_entries(moves):
    """8 rows of 100 stored columns against an 80,000-column matrix: the copy moves the
    touched columns only (at most 800 x 256 entries), never the 20M of the whole matrix."""
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(8, 80_000)
    x[torch.arange(8).repeat_interleave(100), torch.randint(0, 80_000, (800,), generator=gen)] = 1.0
    w = torch.randn(256, 80_000, generator=gen)
    X = scorch.sparse_tensor(x, format="csr")
    for _ in range(3):      # the first call plans, later ones take the warm runner
        torch.testing.assert_close(scorch.einsum("ij,kj->ik", X, w), x @ w.t())
    assert moves["whole"] == [] and len(moves["narrow"]) == 3
    assert max(moves["narrow"]) <= 800 * 256
    plan = scorch.explain("ij,kj->ik", X, w)
    assert any("narrowed_gather" in r for r in plan.relayouts), plan.relayouts


def test_gradient_of_the_dense_operand(moves):
    x = rand((6, 4000), 0.002, torch.float32, 3)
    w = torch.randn(7, 4000, requires_grad=True)
    scale = torch.arange(7.0)
    (scorch.einsum("ij,kj->ik", scorch.sparse_tensor(x, format="csr"), w) * scale).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    ((x @ w2.t()) * scale).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    assert moves["narrow"] and not moves["whole"]


def test_three_dimensional_sparse_operand():
    x = rand((3, 4, 5000), 0.001, torch.float32, 5)
    w = torch.randn(9, 5000)
    X = scorch.sparse_tensor(x, format="csf")
    torch.testing.assert_close(_value(scorch.einsum("bij,kj->bik", X, w)),
                               torch.einsum("bij,kj->bik", x, w))
    plan = scorch.explain("bij,kj->bik", X, w)
    assert any("narrowed_gather" in r for r in plan.relayouts), plan.relayouts


def test_whole_copy_where_the_columns_cover_the_matrix(moves):
    """A batch touching most columns, or as many stored entries as columns: the plain
    re-layout (the narrow copy would read as much, slower per byte)."""
    x = rand((40, 300), 0.5, torch.float32, 7)
    w = torch.randn(16, 300)
    torch.testing.assert_close(_value(scorch.einsum("ij,kj->ik", scorch.sparse_tensor(x, format="csr"), w)), x @ w.t())
    assert moves["narrow"] == [] and moves["whole"]


def test_not_taken_where_the_index_is_read_elsewhere(moves):
    """``j`` also in the output, or in a second dense operand: nothing to narrow."""
    x = rand((5, 3000), 0.002, torch.float32, 9)
    w = torch.randn(6, 3000)
    v = torch.randn(3000)
    X = scorch.sparse_tensor(x, format="csr")
    torch.testing.assert_close(_value(scorch.einsum("ij,kj,j->ik", X, w, v)), (x * v) @ w.t())
    torch.testing.assert_close(_value(scorch.einsum("ij,kj->ijk", X, w)),
                               torch.einsum("ij,kj->ijk", x, w))
    assert moves["narrow"] == []


def test_touched_lines():
    assert ng_mod.touched_lines(0, 100, 4) == 0.0
    assert ng_mod.touched_lines(100, 100, 4) == 1.0
    # 1 % of float32 columns touch ~15 % of the 16-column lines
    assert 0.14 < ng_mod.touched_lines(1, 100, 4) < 0.15
