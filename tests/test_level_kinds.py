"""Level kinds as capability objects, and the singleton kind added through them alone: its
module (``scorch/level_kinds/singleton_level.py``) and one registration line. Every result is
checked against dense torch."""
from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import Format
from scorch.level_kinds import LevelKind, compressed, coordinate, dense, registered, singleton
from scorch.tensor_compiler.levels import level_plans


def test_capabilities_are_declared():
    assert dense.full and dense.locate and dense.insert and not dense.is_sparse
    assert compressed.iterate and compressed.append and not compressed.locate
    assert compressed.has_pos(None) and compressed.has_pos(dense)
    assert coordinate.has_pos(None) and not coordinate.has_pos(coordinate)
    assert not coordinate.unique_before(coordinate) and coordinate.unique_before(None)
    assert not singleton.has_pos(dense) and not singleton.has_pos(compressed)
    assert singleton.unique_before(None) and not singleton.runtime
    assert singleton.output_kind() is compressed and coordinate.output_kind() is coordinate
    assert set(registered()) >= {dense, compressed, coordinate, singleton}


def test_kinds_are_registered_singletons():
    assert LevelKind("s") is singleton and LevelKind("singleton") is singleton
    assert scorch.singleton is singleton and LevelKind.SINGLETON is singleton
    assert pickle.loads(pickle.dumps(singleton)) is singleton
    assert Format("ds").levels == (dense, singleton)
    with pytest.raises(ValueError, match="unknown level kind 'x'.*singleton"):
        Format("dx")


def test_level_plans_follow_capabilities():
    """COO's column level iterates the range its grouped row level hands down; a singleton
    under an ungrouped level iterates one entry per parent position."""
    qq = level_plans(0, (coordinate, coordinate), ("i", "j"))
    assert qq[0].has_pos and qq[0].grouped and not qq[1].has_pos and qq[1].from_range
    ds = level_plans(0, (dense, singleton), ("i", "j"))
    assert not ds[1].has_pos and not ds[1].grouped and not ds[1].from_range and ds[1].iterates
    qqs = level_plans(0, (coordinate, coordinate, singleton), ("i", "j", "k"))
    assert qqs[1].from_range and not qqs[1].grouped and not qqs[2].from_range


def one_per_row(m: int, n: int, seed: int, empty_rows: float = 0.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(m, n, dtype=dtype)
    if n:
        cols = torch.randint(0, n, (m,), generator=g)
        keep = torch.rand(m, generator=g) >= empty_rows
        rows = torch.arange(m)[keep]
        x[rows, cols[keep]] = torch.randn(int(keep.sum()), generator=g, dtype=dtype)
    return x


FORMATS = {"ds": Format("ds"), "cs": Format("cs"), "qs": Format("qs")}


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 12), n=st.integers(1, 9), k=st.integers(1, 5), seed=st.integers(0, 999),
       name=st.sampled_from(["ds", "cs", "qs"]), dtype=st.just(torch.float64))
def test_singleton_einsums_match_dense(m, n, k, seed, name, dtype):
    x = one_per_row(m, n, seed, empty_rows=0.0 if name == "ds" else 0.3, dtype=dtype)
    S = scorch.sparse_tensor(x, format=FORMATS[name])
    assert S.format == FORMATS[name] and S._storage.levels[1].pos is None
    g = torch.Generator().manual_seed(seed + 1)
    v = torch.randn(n, generator=g, dtype=dtype)
    X = torch.randn(n, k, generator=g, dtype=dtype)
    B = torch.randn(m, k, generator=g, dtype=dtype)
    Ct = torch.randn(k, n, generator=g, dtype=dtype)
    Y = torch.randn(m, n, generator=g, dtype=dtype)
    csr = scorch.sparse_tensor(Y * (torch.rand(m, n, generator=g) < 0.5), format="csr")

    def dense_of(r):
        return r.to_dense() if isinstance(r, scorch.SparseTensor) else r
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    cases = [("ij,j->i", (S, v), (x, v)), ("ij,jk->ik", (S, X), (x, X)),
             ("ij,ik,kj->ij", (S, B, Ct), (x, B, Ct)), ("ij,ij->ij", (S, Y), (x, Y)),
             ("ij,ij->ij", (S, csr), (x, csr.to_dense())), ("ij->i", (S,), (x,)),
             ("ji,jk->ik", (S, B), (x, B)), ("ij,kj->ik", (S, S), (x, x))]
    for eq, ops, dense_ops in cases:
        torch.testing.assert_close(dense_of(scorch.einsum(eq, *ops)), torch.einsum(eq, *dense_ops), **tol)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 10), n=st.integers(1, 8), seed=st.integers(0, 999),
       target=st.sampled_from(["csr", "csc", "coo", "dcsr", "dense"]))
def test_singleton_conversions_round_trip(m, n, seed, target):
    x = one_per_row(m, n, seed, empty_rows=0.4)
    S = scorch.sparse_tensor(x, format="cs")
    T = S.to_format(target) if target != "dense" else None
    if T is not None:
        torch.testing.assert_close(T.to_dense(), x)
        back = T.to_format("cs")
        assert back.format == Format("cs")
        torch.testing.assert_close(back.to_dense(), x)
    torch.testing.assert_close(S.to_dense(), x)
    torch.testing.assert_close(S.indices(), x.to_sparse().indices())


def test_singleton_column_mode_order_and_sum_of_two():
    x = one_per_row(7, 5, 3)
    S = scorch.sparse_tensor(x, format="ds")
    T = scorch.sparse_tensor(x.T.contiguous(), format=Format("ds", mode_order=(1, 0)))
    torch.testing.assert_close(T.to_dense(), x.T)
    U = scorch.einsum("ij,ij->ij", S, S)  # a product keeps one entry per row
    torch.testing.assert_close(U.to_dense(), x * x)
    both = scorch.tensor_compiler.compute(
        scorch.tensor_compiler.Assignment("ij", scorch.tensor_compiler.Access(0, "ij")
                                          + scorch.tensor_compiler.Access(1, "ij")),
        S, scorch.sparse_tensor(one_per_row(7, 5, 4), format="ds"))
    assert both.format.levels[1] is compressed   # a union may hold two entries a row
    torch.testing.assert_close(scorch.tensor_type.SparseTensor(both).to_dense(),
                               x + one_per_row(7, 5, 4))


def test_moe_gate_in_singleton_format():
    """A one-hot top-1 gate stores one expert per row: ``Format("ds")`` keeps one int per row."""
    B, D, N, H = 6, 4, 3, 5
    g = torch.Generator().manual_seed(0)
    x, E = torch.randn(B, D, generator=g), torch.randn(N, D, H, generator=g)
    gate = torch.nn.functional.one_hot(torch.randint(0, N, (B,), generator=g), N).float()
    G = scorch.sparse_tensor(gate, format="ds")
    assert G._storage.levels[1].crd.numel() == B
    torch.testing.assert_close(scorch.einsum("bd,ndh,bn->bh", x, E, G),
                               torch.einsum("bd,ndh,bn->bh", x, E, gate))


def test_singleton_output_format():
    x = one_per_row(6, 4, 5)
    D = torch.randn(6, 4)
    S = scorch.sparse_tensor(x, format="ds")
    out = scorch.einsum("ij,ij->ij", S, D, out_format="ds")
    assert out.format == Format("ds")
    torch.testing.assert_close(out.to_dense(), x * D)
    two = scorch.sparse_tensor(torch.ones(3, 2), format="csr")
    with pytest.raises(ValueError, match="singleton level stores exactly one entry per parent"):
        scorch.einsum("ij,ij->ij", two, torch.ones(3, 2), out_format="ds")


@pytest.mark.parametrize("levels", ["ds", "cs"])
def test_results_of_a_singleton_format_stay_valid(levels):
    """Ops that change how many entries a row holds (a triangle, a concatenation, a column
    pick with repeats, a split, a tile, a column slice) give a compressed level where the
    input had a singleton (its one-entry-per-row rule would not hold); kernels then read
    every result right. They had kept the singleton format: wrong sums, reads past the
    arrays and a segfault."""
    x = torch.tensor([[1.0, 0, 0], [0, 0, 2.0], [0, -3.0, 0], [4.0, 0, 0]], dtype=torch.float64)
    ops = {
        "tril": lambda a: a.tril(-1), "triu": lambda a: a.triu(1),
        "cat": lambda a: torch.cat([a, a], 1), "hstack": lambda a: torch.hstack([a, a]),
        "pick": lambda a: a[:, [0, 0, 2]], "index_select": lambda a: a.index_select(1, torch.tensor([2, 2])),
        "split": lambda a: torch.split(a, 2, 1)[1], "tile": lambda a: a.repeat(1, 2),
        "slice": lambda a: a[:, :1], "narrow": lambda a: a.narrow(1, 1, 2),
    }
    v = torch.arange(1.0, 7.0, dtype=torch.float64)
    for name, op in ops.items():
        A = scorch.sparse_tensor(x, format=scorch.Format(levels))
        got, want = op(A), op(x)
        assert torch.equal(got.to_dense(), want), name
        assert torch.equal(got.sum(1), want.sum(1)), name
        assert torch.allclose(got @ v[:want.shape[1]], want @ v[:want.shape[1]]), name
