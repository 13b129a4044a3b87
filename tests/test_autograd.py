"""Autograd through generated kernels: gradcheck (float64) of einsums and index expressions
over several formats, in each operand; sparse gradients on the operand's pattern; the
sparse tensor's grad lifecycle; no silent detach; a 2-layer GCN matching dense training."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.autograd import gradcheck as _gradcheck

import scorch
from scorch.tensor_compiler.index_notation import Access, Assignment

FORMATS_2D = ["csr", "csc", "coo", "dcsr"]


def gradcheck(fn, inputs):
    """torch's gradcheck (float64) in fast mode: a random projection of the Jacobian,
    so the suite stays quick; the full Jacobian is checked for SpMM in csr."""
    return _gradcheck(fn, inputs, fast_mode=True)
F64 = torch.float64


def _sparse_parts(shape, density, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(shape, dtype=F64, generator=g) * (torch.rand(shape, generator=g) < density)
    s = scorch.sparse_tensor(d, format=fmt)
    return s.indices(), s.values().clone().requires_grad_()


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _of_values(idx, shape, fmt):
    return lambda v: scorch.sparse_tensor((idx, v), size=shape, format=fmt)


def _rand(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, dtype=F64, generator=g).requires_grad_()


@pytest.mark.parametrize("fmt", FORMATS_2D)
def test_gradcheck_spmm(fmt):
    idx, v = _sparse_parts((6, 5), 0.4, fmt)
    A = _of_values(idx, (6, 5), fmt)
    X = _rand(5, 3)
    assert gradcheck(lambda v, X: _dense(scorch.einsum("ij,jk->ik", A(v), X)), (v, X))
    if fmt == "csr":
        assert _gradcheck(lambda v, X: _dense(scorch.einsum("ij,jk->ik", A(v), X)), (v, X))


@pytest.mark.parametrize("fmt", FORMATS_2D)
def test_gradcheck_sddmm(fmt):
    idx, v = _sparse_parts((6, 5), 0.4, fmt)
    S = _of_values(idx, (6, 5), fmt)
    X, Y = _rand(6, 3), _rand(5, 3, seed=2)
    assert gradcheck(lambda v, X, Y: _dense(scorch.einsum("ij,ik,jk->ij", S(v), X, Y)), (v, X, Y))


@pytest.mark.parametrize("fmt", FORMATS_2D)
def test_gradcheck_spgemm(fmt):
    ia, va = _sparse_parts((6, 5), 0.4, fmt)
    ib, vb = _sparse_parts((5, 4), 0.4, fmt, seed=3)
    A, B = _of_values(ia, (6, 5), fmt), _of_values(ib, (5, 4), fmt)
    assert gradcheck(lambda va, vb: _dense(scorch.einsum("ij,jk->ik", A(va), B(vb))), (va, vb))


@pytest.mark.parametrize("fmt", ["coo", "csf"])
def test_gradcheck_mttkrp(fmt):
    idx, v = _sparse_parts((4, 5, 3), 0.3, fmt)
    T = _of_values(idx, (4, 5, 3), fmt)
    B, C = _rand(5, 2), _rand(3, 2, seed=2)
    assert gradcheck(lambda v, B, C: _dense(scorch.einsum("ijk,jr,kr->ir", T(v), B, C)), (v, B, C))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gradcheck_moe(fmt):
    idx, v = _sparse_parts((5, 3), 0.5, fmt)
    gate = _of_values(idx, (5, 3), fmt)
    x, W = _rand(5, 4), _rand(3, 4, 2, seed=2)
    assert gradcheck(lambda v, x, W: _dense(scorch.einsum("bd,ndh,bn->bh", x, W, gate(v))),
                     (v, x, W))


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr"])
def test_gradcheck_elementwise_compute(fmt):
    A_, B_ = Access(0, "ij"), Access(1, "ij")
    idx, v = _sparse_parts((4, 5), 0.5, fmt)
    A = _of_values(idx, (4, 5), fmt)
    D = _rand(4, 5)
    for asg in [Assignment("ij", A_ * B_), Assignment("ij", A_ - 0.5 * B_),
                Assignment("ij", -(A_ * B_) + A_ * A_), Assignment("i", A_ * B_)]:
        assert gradcheck(lambda v, D: _dense(scorch.gradients.compute(asg, A(v), D)), (v, D)), str(asg)


def test_gradcheck_compute_two_sparse_union():
    A_, B_ = Access(0, "ij"), Access(1, "ij")
    ia, va = _sparse_parts((4, 5), 0.5, "csr")
    ib, vb = _sparse_parts((4, 5), 0.5, "csr", seed=4)
    A, B = _of_values(ia, (4, 5), "csr"), _of_values(ib, (4, 5), "csr")
    assert gradcheck(lambda va, vb: _dense(scorch.gradients.compute(Assignment("ij", A_ + 2.0 * B_),
                                                                     A(va), B(vb))), (va, vb))


@pytest.mark.parametrize("eq,shapes", [
    ("ii->i", [(4, 4)]), ("ij->", [(3, 4)]), ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 1), (4, 5)]), ("bij,bjk->bik", [(1, 3, 4), (2, 4, 2)]), ("ij,ij->i", [(3, 4), (3, 4)]),
])
def test_gradcheck_einsum_forms_with_sparse_partner(eq, shapes):
    """Diagonals, implicit output, ellipsis and broadcast size-1 dims in a dense operand,
    with a sparse operand in the equation so the einsum runs through scorch."""
    # the last operand sparse (a fixed pattern), the others dense and checked
    dense = [_rand(*s, seed=k) for k, s in enumerate(shapes[:-1])]
    last = scorch.sparse_tensor(torch.rand(shapes[-1], dtype=F64) * (torch.rand(shapes[-1]) < 0.7),
                                format="coo")
    last.requires_grad_()
    lv = last.values().detach().clone().requires_grad_()
    idx = last.indices()

    def f(lv, *ds):
        s = scorch.sparse_tensor((idx, lv), size=shapes[-1], format="coo")
        return _dense(scorch.einsum(eq, *ds, s))
    if eq == "ii->i":
        assert gradcheck(lambda d: _dense(scorch.einsum(eq, d)), (dense[0] if dense else _rand(4, 4),))
        # a sparse operand's diagonal: the gradient lives on the stored diagonal entries
        assert gradcheck(lambda lv: _dense(scorch.einsum(
            eq, scorch.sparse_tensor((idx, lv), size=shapes[-1], format="coo"))), (lv,))
        return
    assert gradcheck(f, (lv, *dense))


def test_dense_diagonal_gradient():
    A = scorch.sparse_tensor(torch.eye(4, dtype=F64), format="csr")
    X = _rand(4, 4)
    out = _dense(scorch.einsum("ii,ij->j", X, A))
    out.sum().backward()
    expect = torch.diag(torch.ones(4, dtype=F64))
    assert torch.allclose(X.grad, expect)


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsc"])
def test_sparse_gradient_is_sddmm_on_the_pattern(fmt):
    from scorch.gradients import pattern
    A = scorch.sparse_tensor(torch.rand(50, 40) * (torch.rand(50, 40) < 0.1), format=fmt,
                             requires_grad=True)
    X = torch.rand(40, 8)
    out = _dense(scorch.einsum("ij,jk->ik", A, X))
    out.sum().backward()
    g = A.grad
    assert isinstance(g, scorch.SparseTensor) and g.format == A.format
    assert all(a is b for a, b in zip(pattern._arrays(g._storage), pattern._arrays(A._storage)))
    # the gradient einsum's plan: a pattern kernel (COO through its compressed twin)
    Q, perm = pattern.pattern_factor(A._storage, torch.float32)
    assert (perm is not None) == (fmt == "coo")
    plan = scorch.explain("ij,ik,jk->ij", scorch.SparseTensor(Q), torch.ones(50, 8), X)
    assert "values in access 0's pattern" in plan.source
    dense = (torch.ones(50, 8) @ X.t()) * (A.to_dense() != 0)
    assert torch.allclose(g.to_dense(), dense, atol=1e-5)


def test_grad_lifecycle():
    d = torch.rand(6, 5, dtype=F64) * (torch.rand(6, 5) < 0.5)
    A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    X = torch.rand(5, 3, dtype=F64)
    scorch.einsum("ij,jk->ik", A, X).sum().backward()
    first = A.grad.values().clone()
    scorch.einsum("ij,jk->ik", A, X).sum().backward()          # accumulation
    assert torch.allclose(A.grad.values(), 2 * first)
    assert A.grad.format == A.format and not A.grad.is_sparse   # a gradient on A's own pattern
    p = torch.nn.Parameter(A.detach())
    assert isinstance(p, scorch.SparseTensor) and p.requires_grad and p.format == A.format
    opt = torch.optim.SGD([p], lr=0.1)
    scorch.einsum("ij,jk->ik", p, X).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and float(p.grad.values().abs().sum()) == 0
    opt.zero_grad()
    assert p.grad is None
    with torch.no_grad():
        assert scorch.einsum("ij,jk->ik", A, X).grad_fn is None
    assert scorch.einsum("ij,jk->ik", A.detach(), X).grad_fn is None
    assert A.values().grad_fn is not None and A.to_dense().grad_fn is not None


def test_values_and_to_dense_are_differentiable():
    d = torch.rand(4, 3, dtype=F64) * (torch.rand(4, 3) < 0.6)
    A = scorch.sparse_tensor(d, format="dcsr", requires_grad=True)
    (A.to_dense() * torch.arange(12, dtype=F64).reshape(4, 3)).sum().backward()
    assert torch.allclose(A.grad.to_dense(), torch.arange(12, dtype=F64).reshape(4, 3) * (d != 0))
    A.grad = None
    (A.values() ** 2).sum().backward()
    assert torch.allclose(A.grad.values(), 2 * A.values().detach())


def test_coordinates_construction_sums_duplicates_and_gathers():
    idx = torch.tensor([[0, 1, 0], [2, 0, 2]])
    v = torch.tensor([1.0, 2.0, 3.0], dtype=F64, requires_grad=True)
    s = scorch.sparse_tensor((idx, v), size=(2, 3), format="csr")
    assert s.nnz == 2
    (s.to_dense() * torch.tensor([[1.0, 2, 3], [4, 5, 6]], dtype=F64)).sum().backward()
    assert torch.allclose(v.grad, torch.tensor([3.0, 4.0, 3.0], dtype=F64))


@pytest.mark.filterwarnings("ignore:.*_upsample_bilinear2d_aa.*dense copy")
def test_no_silent_detach():
    A = scorch.sparse_tensor(torch.rand(4, 4) * (torch.rand(4, 4) < 0.5), format="csr",
                             requires_grad=True)
    with pytest.raises(RuntimeError, match="'_upsample_bilinear2d_aa'.*requires grad"):
        F.interpolate(A[None, None], size=(1, 8), mode="bilinear", antialias=True)                            # no sparse backward: it says so
    with torch.no_grad():
        assert F.interpolate(A[None, None], size=(1, 8), mode="bilinear", antialias=True).grad_fn is None   # no graph wanted: it runs
    from scorch import tensor_compiler         # the compiler's own entries record no graph
    with pytest.raises(RuntimeError, match="records no autograd graph"):
        tensor_compiler.compute(Assignment("ij", Access(0, "ij") * 2.0), A)
    with pytest.raises(RuntimeError, match="records no autograd graph"):
        tensor_compiler.einsum("ij,jk->ik", A, torch.ones(4, 2))
    with pytest.raises(RuntimeError, match="records no autograd graph"):
        tensor_compiler.compute(Assignment("i", Access(0, "i")), torch.ones(3, requires_grad=True))
    X = torch.ones(4, 2, requires_grad=True)       # dense only: torch.einsum, graph intact
    assert tensor_compiler.einsum("ij,jk->ik", torch.ones(3, 4), X).grad_fn is not None
    with torch.no_grad():
        assert tensor_compiler.einsum("ij,jk->ik", A, X).shape == (4, 2)
    At = A.t()                                     # shape ops keep the graph
    assert At.grad_fn is not None
    _dense(scorch.einsum("ij,jk->ik", At, torch.ones(4, 2))).sum().backward()
    assert torch.allclose(A.grad.to_dense(), 2 * (A.to_dense() != 0).float())


def test_to_format_is_differentiable():
    d = torch.rand(5, 4, dtype=F64) * (torch.rand(5, 4) < 0.5)
    A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    w = torch.rand(5, 4, dtype=F64)
    (A.to_format("csc").to_dense() * w).sum().backward()
    assert A.grad.format == A.format
    assert torch.allclose(A.grad.to_dense(), w * (d != 0))


def test_transposed_pattern_is_kept():
    from scorch.gradients import pattern
    d = torch.rand(30, 20) * (torch.rand(30, 20) < 0.2)
    A = scorch.sparse_tensor(d, format="csr")
    before = pattern.reformat_cache_info()
    t1 = pattern.reformatted(A._storage, scorch.as_format("csc", 2))
    t2 = pattern.reformatted(A._storage, scorch.as_format("csc", 2))
    after = pattern.reformat_cache_info()
    assert after["misses"] == before["misses"] + 1 and after["hits"] == before["hits"] + 1
    assert torch.equal(scorch.SparseTensor(t2).to_dense(), d)
    assert t1.levels[1].crd is t2.levels[1].crd


def test_transposed_pattern_is_kept_for_an_equal_pattern_on_new_arrays():
    """A pattern rebuilt with the same contents on new arrays (an SDDMM's result every
    step) reuses the kept conversion; a different pattern of the same shape does not."""
    from scorch.gradients import pattern
    csc = scorch.as_format("csc", 2)
    d = torch.rand(30, 20) * (torch.rand(30, 20) < 0.2)
    pattern.reformatted(scorch.sparse_tensor(d, format="csr")._storage, csc)
    before = pattern.reformat_cache_info()
    B = scorch.sparse_tensor(d * 3, format="csr")                # equal pattern, new arrays
    t = pattern.reformatted(B._storage, csc)
    after = pattern.reformat_cache_info()
    assert after["content_hits"] == before["content_hits"] + 1 and after["misses"] == before["misses"]
    assert torch.equal(scorch.SparseTensor(t).to_dense(), d * 3)
    e = d.clone()
    e[0, 0], e[-1, -1] = (0.0, 1.0) if e[0, 0] else (1.0, 0.0)  # same shape, another pattern
    C = scorch.sparse_tensor(e, format="csr")
    t = pattern.reformatted(C._storage, csc)
    assert pattern.reformat_cache_info()["misses"] == after["misses"] + 1
    assert torch.equal(scorch.SparseTensor(t).to_dense(), e)


@settings(max_examples=15, deadline=None)
@given(m=st.integers(0, 6), n=st.integers(1, 6), k=st.integers(1, 4),
       density=st.sampled_from([0.0, 0.3, 1.0]), fmt=st.sampled_from(FORMATS_2D),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_spmm_gradients_match_dense(m, n, k, density, fmt, dtype):
    d = (torch.rand(m, n) * (torch.rand(m, n) < density)).to(dtype)
    A = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    X = torch.rand(n, k, dtype=dtype, requires_grad=True)
    G = torch.rand(m, k, dtype=dtype)
    (_dense(scorch.einsum("ij,jk->ik", A, X)) * G).sum().backward()
    Xd = X.detach().clone().requires_grad_()
    Ad = d.clone().requires_grad_()
    ((Ad @ Xd) * G).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert torch.allclose(X.grad, Xd.grad, atol=tol)
    assert A.grad.format == A.format
    assert torch.allclose(A.grad.to_dense(), Ad.grad * (A.to_dense() != 0), atol=tol)


def _gcn_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    n, f, h, c = 30, 8, 6, 3
    adj = (torch.rand(n, n, generator=g) < 0.15).double() + torch.eye(n, dtype=F64)
    adj = adj / adj.sum(1, keepdim=True)
    X = torch.rand(n, f, dtype=F64, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    W1 = torch.rand(f, h, dtype=F64, generator=g) - 0.5
    W2 = torch.rand(h, c, dtype=F64, generator=g) - 0.5
    return adj, X, y, W1, W2


def _train(A, X, y, W1, W2, steps=5):
    W1, W2 = torch.nn.Parameter(W1.clone()), torch.nn.Parameter(W2.clone())
    opt = torch.optim.Adam([W1, W2], lr=0.05)
    mm = (lambda a, b: _dense(scorch.einsum("ij,jk->ik", a, b))) if isinstance(A, scorch.SparseTensor) \
        else (lambda a, b: a @ b)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        H = torch.relu(mm(A, X @ W1))
        out = mm(A, H @ W2)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gcn_training_matches_dense(fmt):
    adj, X, y, W1, W2 = _gcn_data()
    A = scorch.sparse_tensor(adj, format=fmt)
    sparse_losses = _train(A, X, y, W1, W2)
    dense_losses = _train(adj, X, y, W1, W2)
    assert sparse_losses[-1] < sparse_losses[0]
    torch.testing.assert_close(torch.tensor(sparse_losses), torch.tensor(dense_losses),
                               rtol=1e-5, atol=0)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_double_backward_spmm(fmt):
    idx, v = _sparse_parts((5, 4), 0.5, fmt)
    A = _of_values(idx, (5, 4), fmt)
    X = _rand(4, 3)
    assert torch.autograd.gradgradcheck(
        lambda v, X: _dense(scorch.einsum("ij,jk->ik", A(v), X)) ** 2, (v, X), fast_mode=True)


_TORCH_LAYOUTS = {
    "coo": lambda d: d.to_sparse(),
    "coo_uncoalesced": lambda d: torch.sparse_coo_tensor(
        torch.cat([d.to_sparse().indices()] * 2, 1).flip(1),
        torch.cat([d.to_sparse().values()] * 2).flip(0) / 2, d.shape),
    "csr": lambda d: d.to_sparse_csr(),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", sorted(_TORCH_LAYOUTS))
def test_torch_sparse_operand_gets_its_gradient_in_its_layout(layout):
    """A torch COO/CSR tensor that requires grad, read by scorch: the gradient flows back to
    it in its own layout, on its pattern, equal to torch.sparse.mm's; it accumulates."""
    d = torch.rand(5, 4, dtype=F64) * (torch.rand(5, 4) < 0.5)
    X = torch.rand(4, 3, dtype=F64, requires_grad=True)
    W = torch.rand(5, 3, dtype=F64)
    S = _TORCH_LAYOUTS[layout](d).requires_grad_()
    (scorch.einsum("ij,jk->ik", S, X) * W).sum().backward()
    assert S.grad.layout == S.layout
    ref = d.to_sparse().requires_grad_()
    Xr = X.detach().clone().requires_grad_()
    (torch.sparse.mm(ref, Xr) * W).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), ref.grad.to_dense())
    torch.testing.assert_close(X.grad, Xr.grad)
    # an op with a scorch operand reads it too; the gradients add up
    B = scorch.sparse_tensor(d + 1.0, format="csr")
    (S * B).to_dense().sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), ref.grad.to_dense() + (d + 1.0) * (d != 0))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("make", [lambda d: d.to_sparse_csc(), lambda d: d.to_sparse_bsr((1, 2))],
                         ids=["csc", "bsr"])
def test_torch_sparse_operand_torch_cannot_differentiate_is_refused(make):
    S = make(torch.eye(4, dtype=F64)).requires_grad_()
    with pytest.raises(RuntimeError, match="operand 0 is a torch sparse_(csc|bsr) tensor that requires grad"):
        scorch.einsum("ij,jk->ik", S, torch.ones(4, 2, dtype=F64))
    with pytest.raises(RuntimeError, match="sparse_(csc|bsr) tensor that requires grad"):
        S * scorch.sparse_tensor(torch.eye(4, dtype=F64), format="csr")
    with torch.no_grad():   # no graph wanted: read as it is
        assert torch.equal(_dense(scorch.einsum("ij,jk->ik", S, torch.ones(4, 2, dtype=F64))),
                           torch.ones(4, 2, dtype=F64))


FORMATS_ANY = ["csr", "csc", "coo", "dcsr", "dcsc", scorch.Format("dd"), scorch.Format("cd", (1, 0)),
               scorch.Format("qq", (1, 0))]


@settings(max_examples=12, deadline=None)
@given(m=st.integers(0, 5), n=st.integers(1, 5), k=st.integers(1, 3),
       density=st.sampled_from([0.0, 0.4, 1.0]), fmt=st.sampled_from(FORMATS_ANY),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 99))
def test_sddmm_and_elementwise_gradients_match_dense(m, n, k, density, fmt, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(m, n, generator=g) * (torch.rand(m, n, generator=g) < density)).to(dtype)
    S = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    mask = torch.zeros(m, n, dtype=dtype)           # the stored entries (dense levels: all)
    mask[tuple(S.indices())] = 1
    X = torch.rand(m, k, dtype=dtype, generator=g, requires_grad=True)
    Y = torch.rand(n, k, dtype=dtype, generator=g, requires_grad=True)
    W = torch.rand(m, n, dtype=dtype, generator=g)
    out = _dense(scorch.einsum("ij,ik,jk->ij", S, X, Y))
    D = torch.rand(m, n, dtype=dtype, generator=g, requires_grad=True)
    A_, B_ = Access(0, "ij"), Access(1, "ij")
    out2 = _dense(scorch.gradients.compute(Assignment("ij", A_ * B_ - 2.0 * A_), S, D))
    ((out * W).sum() + (out2 * W).sum()).backward()
    Sd = d.clone().requires_grad_()
    Xd, Yd, Dd = (t.detach().clone().requires_grad_() for t in (X, Y, D))
    ref = Sd * (Xd @ Yd.t())
    ref2 = Sd * Dd - 2.0 * Sd
    ((ref * W).sum() + (ref2 * W).sum()).backward()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-12)
    assert S.grad.format == S.format and S.grad.nnz == S.nnz
    torch.testing.assert_close(S.grad.to_dense(), Sd.grad * mask, **tol)
    torch.testing.assert_close(X.grad, Xd.grad, **tol)
    torch.testing.assert_close(Y.grad, Yd.grad, **tol)
    torch.testing.assert_close(D.grad, Dd.grad * mask, **tol)


@pytest.mark.parametrize("eq,fmt", [("bij,bjk->bik", "coo"), ("...ij,...jk->...ik", "csf"),
                                    ("bij,bjk", "coo")])
def test_gradcheck_sparse_operand_broadcasts(eq, fmt):
    """A sparse operand's size-1 batch dimension broadcast against a dense operand: its
    gradient sums over the batch (a fresh index in the pattern factor)."""
    idx, v = _sparse_parts((1, 3, 4), 0.6, fmt)
    S = _of_values(idx, (1, 3, 4), fmt)
    X = _rand(2, 4, 2)
    assert gradcheck(lambda v, X: _dense(scorch.einsum(eq, S(v), X)), (v, X))


_REPEATED = {
    "einsum_same": lambda a: torch.einsum("ij,ij->ij", a, a),
    "einsum_spgemm": lambda a: torch.einsum("ij,jk->ik", a, a),
    "einsum_gram": lambda a: torch.einsum("ij,kj->ik", a, a),
    "einsum_diag": lambda a: torch.einsum("ii,ij->ij", a, a),
    "einsum_three": lambda a: torch.einsum("ij,jk,ik->ik", a, a, a),
    "compute_diag": lambda a: scorch.gradients.compute(
        Assignment("ij", Access(0, "ii") * Access(1, "ij")), a, a),
    "compute_transposed": lambda a: scorch.gradients.compute(
        Assignment("ij", Access(0, "ij") * Access(0, "ji") - Access(1, "ij")), a, a),
    "mul": lambda a: a * a, "matmul": lambda a: a @ a, "add": lambda a: a + a * a,
}


@settings(max_examples=12, deadline=None)
@given(form=st.sampled_from(sorted(_REPEATED)), n=st.integers(0, 5),
       density=st.sampled_from([0.0, 0.5, 1.0]),
       fmt=st.sampled_from(["csr", "coo", "dcsc", scorch.Format("dd"), "dense"]),
       dtype=st.sampled_from([torch.float32, F64]), seed=st.integers(0, 99))
def test_repeated_operand_gradients_add(form, n, density, fmt, dtype, seed):
    """One tensor in several operand places (``einsum("ij,ij->ij", A, A)``, ``A * A``,
    ``T(i,i) * T(i,j)`` with ``T`` twice): its gradient is the sum over the places, on its
    pattern for a sparse tensor; as dense torch."""
    g = torch.Generator().manual_seed(seed)
    d = ((torch.rand(n, n, generator=g) - 0.5) * (torch.rand(n, n, generator=g) < density)).to(dtype)
    fn = _REPEATED[form]
    A = d.clone().requires_grad_() if fmt == "dense" else \
        scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    ref = d.clone().requires_grad_()
    out, expect = _dense(fn(A)), _REPEATED_DENSE.get(form, fn)(ref)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, expect, **tol)
    w = torch.rand(out.shape, generator=g).to(dtype)
    (out * w).sum().backward()
    (expect * w).sum().backward()
    want = ref.grad
    if isinstance(A, scorch.SparseTensor):
        assert isinstance(A.grad, scorch.SparseTensor) and A.grad.format == A.format
        stored = torch.zeros(d.shape, dtype=torch.bool)
        if A.nnz:
            stored[tuple(A.indices())] = True
        want = torch.where(stored, ref.grad, torch.zeros((), dtype=dtype))
    torch.testing.assert_close(_dense(A.grad), want, **tol)


#: the torch oracle of the compute forms
_REPEATED_DENSE = {
    "compute_diag": lambda a: torch.diagonal(a)[:, None] * a,
    "compute_transposed": lambda a: a * a.t() - a,
}


def test_dense_operand_read_twice_warm_call():
    """``T(i,j) * T(j,i)`` with one dense ``T`` (a repeated operand's forward, and the
    gradient kernels of repeated sparse ones): the warm call re-lays ``T`` out for the
    transposed read only, as the first call does."""
    from scorch.tensor_compiler import compute as raw_compute
    asg = Assignment("ij", Access(0, "ij") * Access(0, "ji"))
    for step in range(3):
        t = torch.rand(5, 5, dtype=F64) + step
        torch.testing.assert_close(raw_compute(asg, t), t * t.t())
    T = torch.rand(5, 5, dtype=F64, requires_grad=True)
    for step in range(2):
        T.grad = None
        scorch.gradients.compute(asg, T).sum().backward()
        torch.testing.assert_close(T.grad, 2 * T.detach().t())


_SPMM_ROUTES = {
    "einsum": lambda A, X: scorch.einsum("ij,jk->ik", A, X),
    "matmul": lambda A, X: A @ X,
    "mm": lambda A, X: torch.mm(A, X),
    "sparse.mm": lambda A, X: torch.sparse.mm(A, X),
    "linear": lambda A, X: torch.nn.functional.linear(X.t(), A).t(),
}


@pytest.mark.parametrize("route", sorted(_SPMM_ROUTES))
@pytest.mark.parametrize("fmt", ["csr", "coo"])
@pytest.mark.parametrize("weight", [False, True], ids=["fixed", "trained"])
def test_training_steps_convert_the_sparse_operand_once(route, fmt, weight, monkeypatch):
    """After the first step, a training step through SpMM converts the sparse operand's
    pattern no more (no A^T, no compressed copy of a COO pattern built per step): every
    conversion of its level arrays is counted."""
    from scorch._runtime import convert as runtime
    d = torch.rand(40, 30) * (torch.rand(40, 30) < 0.2)
    A = scorch.sparse_tensor(d, format=fmt, requires_grad=weight)
    X = torch.rand(30, 4, requires_grad=True)
    fn = _SPMM_ROUTES[route]
    (_dense(fn(A, X)) ** 2).sum().backward()     # the first step converts what it needs
    anchors = {id(a) for lv in A._storage.levels for a in (lv.pos, lv.crd) if a is not None}
    seen = []
    real = runtime.convert

    def counting(st, fmt, *args, **kwargs):
        if any(id(a) in anchors for lv in st.levels for a in (lv.pos, lv.crd) if a is not None):
            seen.append(fmt)
        return real(st, fmt, *args, **kwargs)
    monkeypatch.setattr(runtime, "convert", counting)
    for step in range(2):
        with torch.no_grad():
            A.values().mul_(0.9)                 # an optimizer step: new values, same pattern
        (_dense(fn(A, X)) ** 2).sum().backward()
    assert seen == [], f"{route} on {fmt} converted the sparse operand per step: {seen}"
    Xd = X.detach().clone().requires_grad_()
    (((A.detach().to_dense()) @ Xd) ** 2).sum().backward()
    X.grad = None
    (_dense(fn(A, X)) ** 2).sum().backward()
    torch.testing.assert_close(X.grad, Xd.grad, rtol=1e-4, atol=1e-4)   # current values used


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_constructor_keeps_the_graph_of_a_sparse_input():
    """``scorch.sparse_tensor(x, format=, dtype=)`` of a sparse tensor in the graph (a
    SparseTensor, a torch COO/CSR tensor) re-formats and casts it differentiably."""
    d = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=F64)
    w = torch.arange(6.0, dtype=F64).reshape(2, 3)
    A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    B = scorch.sparse_tensor(A * 2.0, format="csc", dtype=torch.float32)
    assert B.format == scorch.as_format("csc", 2) and B.dtype == torch.float32
    (B.to_dense() * w.float()).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), 2 * w * (d != 0))
    C = scorch.sparse_tensor(A)
    assert C is not A and C.grad_fn is not None
    T = d.to_sparse_csr().requires_grad_()
    (scorch.sparse_tensor(T, format="coo").to_dense() * w).sum().backward()
    assert T.grad.layout == torch.sparse_csr
    torch.testing.assert_close(T.grad.to_dense(), w * (d != 0))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr", "csc"])
def test_to_torch_is_differentiable(fmt):
    """``A.to_torch()`` of a tensor that requires grad stays in the graph: torch's gradient
    of the torch tensor (sparse from torch.sparse.mm, or dense) comes back on A's pattern;
    scipy holds no graph, so ``to_scipy()`` refuses as torch's ``numpy()`` does."""
    d = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=F64)
    X = torch.rand(3, 2, dtype=F64)
    A = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    t = A.to_torch()
    out = torch.sparse.mm(t, X) if t.layout in (torch.sparse_coo, torch.sparse_csr) else t.to_dense() @ X
    out.sum().backward()
    assert A.grad.format == A.format
    torch.testing.assert_close(A.grad.to_dense(), (d != 0) * X.sum(1))
    with pytest.raises(RuntimeError, match="to_scipy.*requires grad"):
        A.to_scipy()
    assert A.detach().to_scipy().nnz == 3


def test_zero_gradients_without_memory_reach_no_kernel():
    """torch's backward formulas hand out "efficient zero tensors" (``sgn``'s gradient) whose
    data pointer is null; a kernel reading one crashed the process (found by a random op
    chain: ``sgn(A + D)`` then a sparse ``add``). Every entry now makes them real zeros."""
    d = torch.tensor([[[0.0, 0.0, -0.4], [0.0, 0.0, -0.2], [-0.9, 0.0, 0.0]]], dtype=F64)
    for fmt in ("coo", "csf"):
        S = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
        b = torch.sgn(torch.add(S, torch.rand(1, 3, 3, dtype=F64), alpha=-2))
        c = torch.add(b, scorch.sparse_tensor(d * 2, format="csf"), alpha=-2)
        c.mean(0).sum().backward()
        assert S.grad.nnz == S.nnz and float(S.grad.to_dense().abs().sum()) == 0.0
    z = torch._efficientzerotensor((3, 2))
    A = scorch.sparse_tensor(torch.eye(3), format="csr")
    for _ in range(3):                                  # the cold call, then the warm C path
        assert torch.equal(scorch.einsum("ij,jk->ik", A, z), torch.zeros(3, 2))
    assert scorch.sparse_tensor(torch._efficientzerotensor((2, 2)), format="csr").nnz == 0
    x = torch.rand(4, 5, requires_grad=True)           # dense dropout's backward of such a gradient
    torch.sgn(scorch.nn.functional.dropout(x, 0.5, True)).sum().backward()
    assert torch.equal(x.grad, torch.zeros(4, 5))


def test_broadcast_gradients_of_the_values_are_laid_out():
    """``A.values().sum()`` hands back one 1 expanded over every entry (a stride-0 view); a
    gradient storage holding it as its values read garbage (entries beyond the first came
    from unrelated memory). Gradient storages now hold contiguous values."""
    d = torch.tensor([[3.0, 0.0, 1.0], [0.0, 2.0, 0.0], [4.0, 0.0, 5.0]], dtype=F64)
    stored = (d != 0).to(F64)
    X = torch.rand(3, 2, dtype=F64)
    cases = [(lambda A: A.values().sum(), 1.0), (lambda A: A.sum(), 1.0),
             (lambda A: (A * 2).sum(), 2.0), (lambda A: A.values().mean(), 1.0 / 5)]
    for fmt in ("csr", "coo", "csf"):
        for loss, slope in cases:
            A = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
            loss(A).backward()
            assert A.grad._storage.values.is_contiguous()
            torch.testing.assert_close(A.grad.to_dense(), slope * stored)
            torch.testing.assert_close(A.grad @ X, (slope * stored) @ X)   # a kernel reads them


# --- session 30 --------------------------------------------------------------------------

def test_unique_stays_in_the_graph_as_torch():
    """torch's ``unique`` of a tensor that requires grad is in the graph (its backward raises);
    a sparse input's must not come back cut off from it."""
    a = torch.tensor([[1.5, 0, 2.0], [0, 1.5, 0]], dtype=torch.float64)
    S = scorch.sparse_tensor(a, format="csr").requires_grad_()
    for u in (torch.unique(S), S.unique(), torch.unique(S, return_counts=True)[0]):
        assert u.requires_grad and u.grad_fn is not None
        assert torch.equal(u.detach(), torch.tensor([0.0, 1.5, 2.0], dtype=torch.float64))
        with pytest.raises(RuntimeError, match="not implemented"):
            u.sum().backward()


def test_backward_with_create_graph_gives_a_differentiable_gradient():
    """``loss.backward(create_graph=True)`` (gradient penalties): the engine copies the sparse
    gradient into ``.grad`` (``new_empty_strided`` + ``copy_``) keeping its graph, and a
    penalty on it differentiates as dense torch with the gradient restricted to the pattern."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 4, dtype=torch.float64, generator=g) * (torch.rand(5, 4, generator=g) < 0.5)
    X = torch.randn(4, 3, dtype=torch.float64, generator=g)
    mask = w != 0
    W = scorch.sparse_tensor(w, format="csr").requires_grad_()
    ((W @ X).tanh() ** 2).sum().backward(create_graph=True)
    assert W.grad.requires_grad and isinstance(W.grad, scorch.SparseTensor)
    (W.grad * W.grad).sum().backward()
    Wd = w.clone().requires_grad_()
    first, = torch.autograd.grad(((Wd @ X).tanh() ** 2).sum(), Wd, create_graph=True)
    first = first * mask
    second, = torch.autograd.grad((first * first).sum(), Wd)
    torch.testing.assert_close(W.grad.to_dense().detach(), (first.detach() + second) * mask)


def test_empty_like_of_a_tensor_requiring_grad():
    S = scorch.sparse_tensor(torch.eye(3, dtype=torch.float64), format="csr").requires_grad_()
    e = torch.empty_like(S)
    assert not e.requires_grad and e.shape == S.shape


# --- torch's autograd tooling on sparse tensors (session 31) ------------------------------------

@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_gradcheck_takes_a_sparse_input_directly(fmt):
    """``torch.autograd.gradcheck(f, (A, X))`` with a sparse ``A``: checked on its stored
    values (the pattern's gradient), as API.md section 7 promises; sparse outputs too."""
    g = torch.Generator().manual_seed(3)
    d = torch.randn(4, 5, dtype=F64, generator=g) * (torch.rand(4, 5, generator=g) < 0.5)
    A = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    X = torch.randn(5, 3, dtype=F64, generator=g, requires_grad=True)
    Q = torch.randn(4, 2, dtype=F64, generator=g, requires_grad=True)
    K = torch.randn(5, 2, dtype=F64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda A, X: A @ X, (A, X))
    assert torch.autograd.gradcheck(lambda A, X: A @ X, (A, X), fast_mode=True)
    assert torch.autograd.gradcheck(lambda A, Q, K: scorch.einsum("ij,id,jd->ij", A, Q, K), (A, Q, K))
    assert torch.autograd.gradgradcheck(lambda A, X: (A @ X).tanh(), (A, X))
    assert torch.autograd.gradcheck(lambda A: torch.sparse.softmax(A, 1), (A,))


def test_gradcheck_still_catches_a_wrong_sparse_gradient():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return v * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3                       # wrong: should be 2

    A = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr", requires_grad=True)
    from torch.autograd.gradcheck import GradcheckError
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(lambda A: Wrong.apply(A.values()), (A,))


def test_hooks_and_retain_grad_on_a_sparse_intermediate():
    """A hook or ``retain_grad`` on a non-leaf sparse tensor sees the gradient that reaches
    it through any op (values-level and shape ops route around a tensor's own node unless
    someone observes it)."""
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=F64)
    Y = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=F64)
    for use in (lambda B: (B.t() @ torch.ones(2, 1, dtype=F64)).sum(), lambda B: (B * 2).sum(),
                lambda B: B.relu().values().sum(), lambda B: B[1].to_dense().sum(),
                lambda B: (B @ Y).sum()):
        A = scorch.sparse_tensor(d, format="csr", requires_grad=True)
        B = A * 1.5
        B.retain_grad()
        calls = []
        B.register_hook(lambda g: (calls.append(1), g * 0)[1])   # zeroes what reaches A
        use(B).backward()
        assert calls == [1] and B.grad is not None
        assert float(A.grad.to_dense().abs().max()) == 0.0


def test_forward_mode_ad_with_a_sparse_operand_raises_instead_of_dropping_the_tangent():
    import torch.autograd.forward_ad as fwAD
    A = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr")
    X = torch.randn(3, 2, dtype=F64)
    with fwAD.dual_level():
        Xd = fwAD.make_dual(X, torch.ones_like(X))
        for fn in (lambda: A @ Xd, lambda: A * Xd, lambda: Xd * A, lambda: torch.mm(A, Xd),
                   lambda: scorch.einsum("ij,jk->ik", A, Xd)):
            with pytest.raises(NotImplementedError, match="forward-mode AD"):
                fn()
        torch.testing.assert_close(A.to_dense() @ Xd, X)   # dense code is untouched
    torch.testing.assert_close(A @ X, X)                   # and outside the level


def test_anomaly_mode_checks_sparse_gradients_on_their_values():
    """``detect_anomaly`` tests each gradient with ATen's ``isnan`` / ``_is_any_true``: on
    a sparse gradient those read its stored values (they had taken the dense fallback, and
    raised past its limit); a NaN in one is still reported."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(50, 50, generator=g) * (torch.rand(50, 50, generator=g) < 0.3)
    d[:, 0] = 1.0
    W = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    x = torch.randn(4, 50, generator=g)
    scorch.set_dense_fallback_limit(0)
    try:
        with torch.autograd.detect_anomaly(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.nn.functional.linear(x, W).sum().backward()
            assert W.grad.nnz == W.nnz
            x[0, 0] = float("nan")
            with pytest.raises(RuntimeError, match="nan values"):
                (torch.nn.functional.linear(x, W) * 0).sum().backward()
    finally:
        scorch.set_dense_fallback_limit(None)
