"""A result with one compressed level over dense ones (``S^T @ D`` as ``einsum("ij,ik->jk")``:
``cd``; the MoE expert gradient ``bd,bh,bn->ndh``: ``cdd``) is computed dense and its touched
rows kept when the dense array is at most the product's work (``dense_route``), else in the
workspace. Both give the dense oracle's tensor, in the same format."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch import tensor_compiler as C
from scorch.tensor_compiler import dense_route as route_mod, execute

from compiler_helpers import check_storage, dense, rand, sparse, topk_gate

SETTINGS = dict(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def routes(monkeypatch):
    """Counts the calls that took the dense route."""
    taken = []
    real = route_mod.DenseRoute.run

    def counting(self, ops, run_entry):
        taken.append(self.format)
        return real(self, ops, run_entry)
    monkeypatch.setattr(route_mod.DenseRoute, "run", counting)
    return taken


@settings(**SETTINGS)
@given(i=st.integers(1, 40), j=st.integers(1, 30), k=st.integers(1, 20),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), fmt=st.sampled_from(["csr", "csc", "coo"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**20))
def test_transposed_product_matches_dense(i, j, k, density, fmt, dtype, seed):
    s = rand((i, j), density, dtype, seed)
    d = torch.randn(i, k, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    got = C.einsum("ij,ik->jk", sparse(s, fmt), d)
    want = s.t() @ d
    if isinstance(got, torch.Tensor):   # an all-dense plan (no compressed output level)
        torch.testing.assert_close(got, want)
        return
    check_storage(got)
    torch.testing.assert_close(dense(got), want)


def test_route_taken_where_it_pays_and_format_kept(routes):
    s = rand((300, 40), 0.2, torch.float32, 1)
    d = torch.randn(300, 16)
    S = sparse(s, "csr")
    got = C.einsum("ij,ik->jk", S, d)
    assert routes == [got.format] and got.format.levels[0].is_sparse
    torch.testing.assert_close(dense(got), s.t() @ d)
    # a hypersparse operand (3 stored among 5000 columns): the workspace, same format
    h = torch.zeros(50, 5000)
    h[3, 7], h[10, 4000], h[49, 7] = 1.0, 2.0, -3.0
    routes.clear()
    got2 = C.einsum("ij,ik->jk", sparse(h, "csr"), torch.randn(50, 8))
    assert routes == [] and got2.format == got.format
    assert got2.levels[0].crd.tolist() == [7, 4000]


def test_cancelled_rows_are_the_same_tensor(routes):
    """Rows whose sums cancel to exactly 0 may be left out (dense route) or kept with
    zeros (workspace): the dense tensor is the same."""
    s = torch.tensor([[1.0, 2.0], [1.0, 0.0]])
    d = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    got = C.einsum("ij,ik->jk", sparse(s, "csr"), d)
    assert routes
    torch.testing.assert_close(dense(got), s.t() @ d)


def test_expert_gradient_cdd(routes):
    b, n, dd, h = 64, 4, 12, 24
    gate = topk_gate(b, n, 2)
    x, dy = torch.randn(b, dd), torch.randn(b, h)
    got = C.einsum("bd,bh,bn->ndh", x, dy, sparse(gate, "csr"))
    assert routes and got.format.levels[0].is_sparse
    assert not any(k.is_sparse for k in got.format.levels[1:])
    torch.testing.assert_close(dense(got), torch.einsum("bd,bh,bn->ndh", x, dy, gate))


def test_through_the_tensor_api():
    s = rand((120, 30), 0.1, torch.float32, 3)
    S = scorch.sparse_tensor(s, format="csr")
    d = torch.randn(120, 5)
    out = scorch.einsum("ij,ik->jk", S, d)
    torch.testing.assert_close(out.to_dense(), s.t() @ d)
    for _ in range(3):   # warm calls keep routing (no C runner takes the plan over)
        torch.testing.assert_close(scorch.einsum("ij,ik->jk", S, d).to_dense(), s.t() @ d)


def test_explain_names_the_route():
    s = rand((300, 40), 0.2, torch.float32, 1)
    text = str(C.explain("ij,ik->jk", sparse(s, "csr"), torch.randn(300, 16)))
    assert "dense route" in text


@settings(**SETTINGS)
@given(i=st.integers(1, 30), j=st.integers(1, 20), k=st.integers(1, 12), b=st.integers(1, 3),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       fmt=st.sampled_from(["coo", "dcsr", "csf", "ccd"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**20))
def test_spmm_with_sparse_rows_matches_dense(i, j, k, b, density, fmt, dtype, seed):
    """SpMM of an operand whose rows are sparse (COO, DCSR, CSF) gives a result with those
    rows sparse and dense columns (``qd``, ``cd``, ``ccd``): several sparse levels over
    dense ones take the route too."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(b, j, k, dtype=dtype, generator=g)
    if fmt in ("csf", "ccd"):
        s = torch.stack([rand((i, j), density, dtype, seed + n) for n in range(b)])
        S = scorch.sparse_tensor(s, format=fmt if fmt == "csf" else scorch.formats.Format("ccc"))
        got, want = scorch.einsum("bij,bjk->bik", S, d), torch.einsum("bij,bjk->bik", s, d)
    else:
        s = rand((i, j), density, dtype, seed)
        S = scorch.sparse_tensor(s, format=fmt)
        got, want = scorch.einsum("ij,jk->ik", S, d[0]), s @ d[0]
    if isinstance(got, scorch.SparseTensor):
        check_storage(got._storage)
        got = got.to_dense()
    torch.testing.assert_close(got, want)


def test_several_sparse_levels_take_the_route(routes):
    s = torch.stack([rand((60, 50), 0.2, torch.float32, n) for n in range(2)])
    s[1, 7] = 0   # an empty row
    S = scorch.sparse_tensor(s, format="csf")
    d = torch.randn(2, 50, 8)
    got = scorch.einsum("bij,bjk->bik", S, d)
    assert [f.level_string for f in routes] == ["ccd"]
    assert got._storage.format.level_string == "ccd"
    check_storage(got._storage)
    torch.testing.assert_close(got.to_dense(), torch.einsum("bij,bjk->bik", s, d))
    assert route_mod.sparse_prefix(scorch.formats.Format("ccd")) == 2
    assert route_mod.sparse_prefix(scorch.formats.Format("qd")) == 1
    assert route_mod.sparse_prefix(scorch.formats.Format("cdc")) == 0
    assert route_mod.sparse_prefix(scorch.formats.Format("csd")) == 0

