"""Graph-learning idioms as PyG / DGL users write them, in every format: each stays sparse
and equals dense torch (or torch.sparse's convention, where documented)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

FORMATS = ["csr", "csc", "coo", "dcsr"]


def _graph(n: int, density: float, seed: int, isolated: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, n, generator=g) * (torch.rand(n, n, generator=g) < density)
    a.fill_diagonal_(0.5)
    if isolated:
        a[n // 2] = 0                              # an isolated node: an empty row
    return a


@pytest.mark.parametrize("fmt", FORMATS)
def test_removing_self_loops_stays_sparse(fmt):
    """``A - diag(diag(A))``: CSR's diagonal was a dense vector, so ``diag`` of it built a
    dense N x N matrix."""
    a = _graph(12, 0.3, 1)
    A = scorch.sparse_tensor(a, format=fmt)
    d = torch.diag(A)
    assert isinstance(d, scorch.SparseTensor)
    assert isinstance(A.diagonal(), scorch.SparseTensor)
    out = A - torch.diag(d)
    assert isinstance(out, scorch.SparseTensor)
    assert torch.equal(out.to_dense(), a - torch.diag(torch.diag(a)))


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(FORMATS), dim=st.sampled_from([0, 1]), n=st.integers(2, 9),
       density=st.sampled_from([0.0, 0.3, 1.0]), seed=st.integers(0, 50))
def test_degree_normalisation_is_the_same_in_every_format(fmt, dim, n, density, seed):
    """``A / A.sum(dim, keepdim=True)``: ``sum(keepdim=True)`` comes back dense or sparse by
    format; the division reads a broadcast sparse divisor as the dense vector it is, so
    every format keeps A's pattern (an empty row stays 0, as dividing by a dense degree)."""
    a = _graph(n, density, seed)
    A = scorch.sparse_tensor(a, format=fmt, requires_grad=True)
    out = A / A.sum(dim, keepdim=True)
    assert isinstance(out, scorch.SparseTensor)
    expect = torch.where(a != 0, a / a.sum(dim, keepdim=True), torch.zeros(()))
    torch.testing.assert_close(out.to_dense(), expect)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    (out @ x).pow(2).sum().backward()
    # the oracle in float64: a column of one entry has gradient 0 exactly, which float32
    # leaves as a rounding residue (1.5e-5 against entries of 10) on either side
    d = a.double().requires_grad_()
    degree = d.sum(dim, keepdim=True)
    degree = torch.where(degree == 0, torch.ones((), dtype=d.dtype), degree)   # (no 0 / 0 in the oracle)
    dense_out = torch.where(a != 0, d / degree, torch.zeros((), dtype=d.dtype))
    (dense_out @ x.double()).pow(2).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), (d.grad * (a != 0)).float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_subgraph_by_an_outer_index(fmt):
    """``A[idx[:, None], idx]`` (a node subset's subgraph) is rows then columns, not a
    lookup per position of the k x k grid (NotreDame k = 4096: 1.8 s -> ~30 ms)."""
    a = _graph(20, 0.3, 2)
    A = scorch.sparse_tensor(a, format=fmt, requires_grad=True)
    idx = torch.tensor([3, 17, 3, 0, 19, 8])
    for rows, cols in [(idx[:, None], idx), (idx[:, None], idx[None, :]), (idx[:4, None], idx[1:])]:
        out = A[rows, cols]
        assert isinstance(out, scorch.SparseTensor)
        assert torch.equal(out.to_dense(), a[rows, cols])
    A[idx[:, None], idx].sum().backward()
    d = a.clone().requires_grad_()
    d[idx[:, None], idx].sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), d.grad * (a != 0))


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_learnable_edge_weights_from_a_shuffled_edge_list(fmt):
    """Positions of 100k edges (with repeats) found by one sort (``pattern._positions_by_sorting``)."""
    g = torch.Generator().manual_seed(3)
    n, m = 3000, 100_000
    edges = torch.randint(0, n, (2, m), generator=g)
    w = torch.rand(m, generator=g, requires_grad=True)
    A = scorch.sparse_tensor((edges, w), size=(n, n), format=fmt)
    x = torch.randn(n, 4, generator=g)
    (A @ x).pow(2).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    dense = torch.zeros(n, n).index_put((edges[0], edges[1]), w2, accumulate=True)
    (dense @ x).pow(2).sum().backward()
    torch.testing.assert_close(A.detach().to_dense(), dense.detach())
    # float32 sums of different orders (MKL's dense product on an Intel Xeon: 1.2e-5 apart)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode_order", [(0, 1), (1, 0)])
def test_picking_columns_of_coo(mode_order):
    """``A[:, idx]`` / ``A[idx]`` of COO: a table lookup per stored entry
    (``inner_level._pick_coo_columns``), any order of the index; repeats take the general
    path; gradients on the pattern."""
    a = _graph(15, 0.3, 4, isolated=False)
    A = scorch.sparse_tensor(a, format=scorch.Format("qq", mode_order=mode_order), requires_grad=True)
    d = a.clone().requires_grad_()
    for idx in [torch.tensor([0, 5, 14]), torch.tensor([14, 0, 7, 3]), torch.tensor([], dtype=torch.long),
                [4, 2], torch.tensor([3, 3, 1]), torch.tensor([2, 9], dtype=torch.int32)]:
        for take in (lambda x: x[:, idx], lambda x: x[idx]):
            out = take(A)
            assert torch.equal(out.to_dense(), take(a)), idx
            take(A).sum().backward()
            take(d).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), d.grad * (a != 0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dim", [0, 1])
def test_degree_gradient_is_written_on_the_pattern(fmt, dim, monkeypatch):
    """The gradient of ``A.sum(dim)`` (a sparse vector where the summed-over level is the
    inner one) reads the vector densely at each stored entry (``pattern._located``), so the
    kernel writes onto A's pattern: no positions searched afterwards (CSR ``sum(0)`` at 4M
    entries had 14x the memory and 28x the time of ``sum(1)``)."""
    from scorch.gradients import pattern
    a = _graph(30, 0.2, 5)
    A = scorch.sparse_tensor(a, format=fmt, requires_grad=True)
    w = torch.randn(30, generator=torch.Generator().manual_seed(dim))
    searched = []
    monkeypatch.setattr(pattern, "positions_in_pattern",
                        lambda *args: searched.append(1) or (_ for _ in ()).throw(AssertionError("searched")))
    (A.sum(dim) * w).sum().backward()
    assert not searched
    d = a.clone().requires_grad_()
    (d.sum(dim) * w).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), d.grad * (a != 0))
