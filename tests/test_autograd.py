"""Autograd through generated kernels: gradcheck (float64) of einsums and index expressions
over several formats, in each operand; sparse gradients on the operand's pattern; the
sparse tensor's grad lifecycle; no silent detach; a 2-layer GCN matching dense training."""
import pytest
import torch
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


@pytest.mark.filterwarnings("ignore:.*cumsum.*dense copy")
def test_no_silent_detach():
    A = scorch.sparse_tensor(torch.rand(4, 4) * (torch.rand(4, 4) < 0.5), format="csr",
                             requires_grad=True)
    with pytest.raises(RuntimeError, match="'cumsum'.*requires grad"):
        torch.cumsum(A, 0)                          # no sparse backward: it says so
    with torch.no_grad():
        assert torch.cumsum(A, 0).grad_fn is None   # no graph wanted: it runs
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


def test_backward_steps_reuse_the_transposed_pattern():
    from scorch.gradients import pattern
    d = torch.rand(40, 30) * (torch.rand(40, 30) < 0.2)
    A = scorch.sparse_tensor(d, format="csr")
    X = torch.rand(30, 4, requires_grad=True)
    misses = []
    for step in range(3):
        X.grad = None
        with torch.no_grad():
            A.values().mul_(1.5)                      # new values, same pattern
        (_dense(scorch.einsum("ij,jk->ik", A, X)) ** 2).sum().backward()
        misses.append(pattern.reformat_cache_info()["misses"])
        Xd = X.detach().clone().requires_grad_()
        ((A.to_dense() @ Xd) ** 2).sum().backward()
        assert torch.allclose(X.grad, Xd.grad, rtol=1e-4, atol=1e-4)   # current values used
    assert misses[1] == misses[0] and misses[2] == misses[0]


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_double_backward_spmm(fmt):
    idx, v = _sparse_parts((5, 4), 0.5, fmt)
    A = _of_values(idx, (5, 4), fmt)
    X = _rand(4, 3)
    assert torch.autograd.gradgradcheck(
        lambda v, X: _dense(scorch.einsum("ij,jk->ik", A(v), X)) ** 2, (v, X), fast_mode=True)


def test_torch_sparse_operand_requiring_grad_is_refused():
    A = torch.eye(3).to_sparse().requires_grad_()
    with pytest.raises(NotImplementedError, match="scorch.sparse_tensor"):
        scorch.einsum("ij,jk->ik", A, torch.ones(3, 2, requires_grad=True))


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
