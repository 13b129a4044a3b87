"""Elementwise functions, amax/amin and softmax on sparse tensors through the compiler's
newer IR, against dense torch (softmax against torch.sparse.softmax on the same pattern)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import scorch

FORMATS2 = ["csr", "csc", "coo", "dcsr"]


def _matrix(shape, density, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype) * (torch.rand(shape, generator=g) < density)


def _dense(r):
    return r.to_dense() if isinstance(r, scorch.SparseTensor) else r


UNARY = {"relu": (torch.relu, True), "abs": (torch.abs, True), "tanh": (torch.tanh, True),
         "sin": (torch.sin, True), "sign": (torch.sign, True), "square": (torch.square, True),
         "exp": (torch.exp, False), "cos": (torch.cos, False), "sigmoid": (torch.sigmoid, False)}


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(UNARY)), fmt=st.sampled_from(["csr", "coo"]), m=st.integers(0, 6),
       n=st.integers(1, 5), density=st.sampled_from([0.0, 0.4, 1.0]),
       dtype=st.just(torch.float64), seed=st.integers(0, 99))
def test_unary_functions(name, fmt, m, n, density, dtype, seed):
    fn, sparse = UNARY[name]
    d = _matrix((m, n), density, dtype, seed)
    S = scorch.sparse_tensor(d, format=fmt)
    r = fn(S)
    assert isinstance(r, scorch.SparseTensor) == sparse
    if sparse:
        assert r.format == S.format or r.nnz == S.nnz
    torch.testing.assert_close(_dense(r), fn(d))


def test_method_and_functional_forms_and_pow():
    d = _matrix((5, 4), 0.5, torch.float64, 1)
    S = scorch.sparse_tensor(d, format="csr")
    torch.testing.assert_close(_dense(S.relu()), torch.relu(d))
    torch.testing.assert_close(_dense(F.relu(S)), torch.relu(d))
    torch.testing.assert_close(_dense(S ** 2), d ** 2)
    torch.testing.assert_close(_dense(torch.pow(S.abs(), 0.5)), d.abs() ** 0.5)
    torch.testing.assert_close(_dense(torch.sqrt(S.abs())), d.abs().sqrt())
    assert isinstance(S ** 0, torch.Tensor)   # 0 ** 0 == 1: dense
    torch.testing.assert_close(S ** 0, d ** 0)


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(FORMATS2), m=st.integers(1, 6), n=st.integers(1, 5),
       density=st.sampled_from([0.0, 0.3, 1.0]), dim=st.sampled_from([None, 0, 1, -1, (0, 1)]),
       keepdim=st.booleans(), seed=st.integers(0, 99), op=st.sampled_from(["amax", "amin"]))
def test_amax_amin_count_implicit_zeros(fmt, m, n, density, dim, keepdim, seed, op):
    d = _matrix((m, n), density, torch.float64, seed)
    S = scorch.sparse_tensor(d, format=fmt)
    f = getattr(torch, op)
    if dim is None:
        torch.testing.assert_close(f(S), f(d))
    else:
        torch.testing.assert_close(_dense(f(S, dim, keepdim)), f(d, dim, keepdim))


def test_amax_of_an_empty_dimension_raises_like_torch():
    S = scorch.sparse_tensor(torch.zeros(0, 3), format="csr")
    with pytest.raises(IndexError):
        torch.amax(S, 0)


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from([(5, 4), (3, 4, 2), (1, 6)]), density=st.sampled_from([0.0, 0.4, 1.0]),
       seed=st.integers(0, 99), log=st.booleans(), data=st.data())
def test_softmax_over_stored_entries(shape, density, seed, log, data):
    d = _matrix(shape, density, torch.float64, seed)
    rank = len(shape)
    dim = data.draw(st.integers(-rank, rank - 1))
    fmt = data.draw(st.sampled_from(["coo", "csf"] + (["csr", "csc", "dcsr"] if rank == 2 else [])))
    S = scorch.sparse_tensor(d, format=fmt)
    ref_fn = torch.sparse.log_softmax if log else torch.sparse.softmax
    want = ref_fn(d.to_sparse(), dim).to_dense()
    for call in ((torch.sparse.log_softmax if log else torch.sparse.softmax),
                 (F.log_softmax if log else F.softmax), (torch.log_softmax if log else torch.softmax)):
        got = call(S, dim)
        assert isinstance(got, scorch.SparseTensor) and got.nnz == S.nnz
        assert not torch.isnan(got.values()).any()
        torch.testing.assert_close(got.to_dense(), want)


def test_softmax_rows_sum_to_one_and_empty_rows_stay_empty():
    d = _matrix((6, 5), 0.5, torch.float32, 3)
    d[2] = 0
    P = torch.softmax(scorch.sparse_tensor(d, format="csr"), dim=1)
    sums = torch.zeros(6).index_add_(0, P.indices()[0], P.values())
    nonempty = (d != 0).any(1)
    torch.testing.assert_close(sums[nonempty], torch.ones(int(nonempty.sum())))
    assert sums[2] == 0


def test_no_silent_detach():
    """These ops have backward rules (tests/test_autograd_ops.py checks their values): the
    graph reaches the sparse input, never a detached result."""
    S = scorch.sparse_tensor(_matrix((4, 3), 0.5, torch.float64, 2), format="csr", requires_grad=True)
    for call in (torch.relu, torch.exp, lambda s: torch.amax(s, 1), lambda s: torch.sparse.softmax(s, 1)):
        out = call(S)
        assert out.grad_fn is not None
        S.grad = None
        (out.to_dense() if isinstance(out, scorch.SparseTensor) else out).sum().backward()
        assert isinstance(S.grad, scorch.SparseTensor) and S.grad.nnz == S.nnz
    with torch.no_grad():
        assert isinstance(torch.relu(S), scorch.SparseTensor)


@pytest.mark.parametrize("fmt", ["coo", "dcsr", "dcsc"])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_of_a_hypersparse_matrix_follows_its_entries(monkeypatch, fmt, log):
    """Past ``DENSE_FIBERS_LIMIT`` fibers (a 10^9 x 10^9 matrix with 300 entries) softmax
    and its backward keep their maxima and sums in one slot per stored fiber: the dense
    per-fiber arrays had needed 7.45 GiB. Values and gradient equal torch.sparse's on the
    same entries packed into a 40 x 40 matrix (same fibers, same order)."""
    g = torch.Generator().manual_seed(0)
    small = torch.randn(40, 40, dtype=torch.float64, generator=g)
    small[torch.rand(40, 40, generator=g) < 0.8] = 0
    idx = small.nonzero().t()
    n, scale = 10 ** 9, 24_000_000
    from scorch.sparse_ops import nonlinear
    monkeypatch.setattr(nonlinear, "_softmax_kernels", None)     # the dense-array path
    S = scorch.sparse_tensor((idx * scale, small[idx[0], idx[1]]), size=(n, n),
                             format=fmt, requires_grad=True)
    f = torch.sparse.log_softmax if log else torch.sparse.softmax
    for dim in (0, 1):
        S.grad = None
        y = f(S, dim)
        ref_in = small.to_sparse().requires_grad_()
        ref = f(ref_in, dim)
        w = torch.randn(idx.shape[1], dtype=torch.float64, generator=g)
        yi = y.indices() // scale
        order = torch.argsort(yi[0] * 40 + yi[1])
        want = ref.coalesce().values()
        assert torch.allclose(y.values()[order], want)
        (y.values()[order] * w).sum().backward()
        (want * w).sum().backward()
        gi = S.grad.indices() // scale
        gorder = torch.argsort(gi[0] * 40 + gi[1])
        assert torch.allclose(S.grad.values()[gorder], ref_in.grad.coalesce().values())


def test_softmax_by_fiber_groups_matches_the_kernels(monkeypatch):
    """The per-stored-fiber path (forced on small tensors) gives the kernels' values and
    gradients, in every dim of 2-D and 3-D tensors."""
    from scorch.gradients import fiber_ops
    g = torch.Generator().manual_seed(1)
    for shape, fmt in (((6, 7), "csr"), ((6, 7), "csc"), ((3, 4, 5), "coo")):
        x = torch.randn(*shape, dtype=torch.float64, generator=g)
        x[torch.rand(*shape, generator=g) < 0.5] = 0
        for dim in range(len(shape)):
            for log in (False, True):
                f = torch.sparse.log_softmax if log else torch.sparse.softmax
                outs = []
                for limit in (None, 0):
                    if limit == 0:
                        monkeypatch.setattr(fiber_ops, "DENSE_FIBERS_LIMIT", 0)
                        monkeypatch.setattr(fiber_ops, "DENSE_FIBERS_PER_ENTRY", 0)
                    S = scorch.sparse_tensor(x, format=fmt, requires_grad=True)
                    y = f(S, dim)
                    (y.to_dense() * torch.arange(x.numel(), dtype=x.dtype).reshape(shape)).sum().backward()
                    outs.append((y.to_dense(), S.grad.to_dense()))
                    monkeypatch.undo()
                assert torch.allclose(outs[0][0], outs[1][0])
                assert torch.allclose(outs[0][1], outs[1][1])
