"""Backward of every op of API section 4 on sparse operands, against dense torch: unary
functions (the derivative table), softmax/log_softmax over stored entries, amax/amin (ties
split as torch does), sum/mean, elementwise arithmetic with broadcasting, the matmul
family, shape ops (values move with their coordinates), a sparse diagonal; gradcheck
(float64) and double backward where torch has it for the dense op."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.autograd import gradcheck, gradgradcheck

import scorch
from scorch.tensor_compiler.functions import FUNCTIONS

F64 = torch.float64
FORMATS_2D = ["csr", "csc", "coo", "dcsr", "dcsc", scorch.Format("dd"),
              scorch.Format("cd", (1, 0))]
FORMATS_3D = ["coo", "csf", scorch.Format("dcc", (2, 0, 1))]
#: fewer formats where every draw is a new kernel (an elementwise op per format and dtype)
FORMATS_FEW = ["csr", "coo", "dcsc", scorch.Format("dd")]


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _random(shape, density, dtype, seed, values=None):
    g = torch.Generator().manual_seed(seed)
    if values is None:
        v = torch.rand(shape, generator=g) + 0.1
    else:   # few distinct values: ties for amax/amin
        v = torch.tensor(values, dtype=torch.float32)[torch.randint(len(values), shape, generator=g)]
    return (v * (torch.rand(shape, generator=g) < density)).to(dtype)


def _stored_mask(S):
    mask = torch.zeros(S.shape, dtype=torch.bool)
    if S.nnz:
        mask[tuple(S.indices())] = True
    return mask


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)


def check_against_dense(op, d, fmt, seed=0, others=()):
    """``op(S, *others)`` with S sparse (``d`` in ``fmt``) and ``op(d, *others)`` dense: the
    same result, and the same gradients (S's on its stored entries; the dense operands')."""
    S = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    D = d.clone().requires_grad_()
    xs = [o.detach().clone().requires_grad_() for o in others]
    xd = [o.detach().clone().requires_grad_() for o in others]
    out_s, out_d = _dense(op(S, *xs)), op(D, *xd)
    torch.testing.assert_close(out_s, out_d, **_tol(d.dtype))
    W = torch.rand(out_d.shape, dtype=out_d.dtype, generator=torch.Generator().manual_seed(seed))
    (out_s * W).sum().backward()
    (out_d * W).sum().backward()
    assert isinstance(S.grad, scorch.SparseTensor) and S.grad.format == S.format
    assert S.grad.nnz == S.nnz
    expect = torch.where(_stored_mask(S), D.grad, torch.zeros((), dtype=d.dtype))
    torch.testing.assert_close(S.grad.to_dense(), expect, **_tol(d.dtype))
    for a, b in zip(xs, xd):
        torch.testing.assert_close(a.grad, b.grad, **_tol(d.dtype))


def _parts(shape, fmt, density=0.5, seed=0, positive=False):
    """Coordinates and float64 values (requiring grad) of a random sparse tensor; a
    function of the values rebuilds it (gradcheck perturbs the values)."""
    d = _random(shape, density, F64, seed)
    if not positive:
        d = d - 0.6 * (d != 0)
    s = scorch.sparse_tensor(d, format=fmt)
    idx, v = s.indices(), s.values().clone().requires_grad_()
    return (lambda v: scorch.sparse_tensor((idx, v), size=shape, format=fmt)), idx, v


# --- unary functions ---------------------------------------------------------------------

def test_every_function_has_a_derivative():
    from scorch.gradients.derivatives import DERIVATIVES
    assert set(FUNCTIONS) <= set(DERIVATIVES)


@pytest.mark.parametrize("fn", sorted(f for f in FUNCTIONS if not FUNCTIONS[f].of_pattern))
def test_gradcheck_unary_function(fn):
    # (no dense level: its stored zeros sit on relu's and abs's kinks)
    fmt = FORMATS_2D[sorted(FUNCTIONS).index(fn) % 5]
    positive = fn in ("sqrt", "log", "pow")
    make, idx, v = _parts((4, 5), fmt, positive=positive)

    def f(v):
        s = make(v)
        if fn == "pow":
            r = s ** 1.5
        elif fn == "threshold":
            r = F.threshold(s, 0.1, 0.0)
        else:
            r = (getattr(torch, fn) if hasattr(torch, fn) else getattr(F, fn))(s)
        # the stored positions: log's unstored entries are -inf (no finite difference)
        return _dense(r)[tuple(idx)]
    assert gradcheck(f, (v,))


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(0, 3), (1, 4), (3, 1), (4, 5)]),
       density=st.sampled_from([0.0, 0.4, 1.0]), fmt=st.sampled_from(FORMATS_FEW),
       dtype=st.sampled_from([torch.float32, F64]),
       fn=st.sampled_from(["relu", "abs", "tanh", "sin", "square", "exp", "sigmoid", "cos",
                           "sign"]), seed=st.integers(0, 99))
def test_unary_gradients_match_dense(shape, density, fmt, dtype, fn, seed):
    d = _random(shape, density, dtype, seed) - 0.5
    d = d * (_random(shape, density, dtype, seed + 1) != 0)
    check_against_dense(lambda x: getattr(torch, fn)(x), d, fmt, seed)


def test_fused_expression_differentiates_as_one():
    """tanh(A * D) / E + sigmoid(A): one compute, gradients in A (sparse), D and E."""
    from scorch.tensor_compiler.index_notation import Access, Apply, Assignment
    make, idx, v = _parts((4, 5), "csr")
    D, E = torch.rand(4, 5, dtype=F64, requires_grad=True), (torch.rand(4, 5, dtype=F64) + 1).requires_grad_()
    A_, D_, E_ = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")
    asg = Assignment("ij", Apply("tanh", A_ * D_) / E_ + A_ * Apply("sigmoid", A_))
    assert gradcheck(lambda v, D, E: _dense(scorch.gradients.compute(asg, make(v), D, E)), (v, D, E))


# --- softmax / log_softmax ---------------------------------------------------------------

@pytest.mark.parametrize("fmt,shape", [("csr", (4, 5)), ("coo", (4, 5)), ("dcsc", (4, 5)),
                                       ("csf", (3, 4, 2))])
@pytest.mark.parametrize("log", [False, True])
def test_gradcheck_softmax(fmt, shape, log):
    make, idx, v = _parts(shape, fmt)
    fn = torch.sparse.log_softmax if log else torch.sparse.softmax
    for dim in range(len(shape)):
        assert gradcheck(lambda v: _dense(fn(make(v), dim)), (v,))


@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from([(0, 3), (1, 4), (3, 1), (4, 5), (3, 2, 4)]),
       density=st.sampled_from([0.0, 0.4, 1.0]), log=st.booleans(), seed=st.integers(0, 99),
       dtype=st.sampled_from([torch.float32, F64]), data=st.data())
def test_softmax_gradients_match_torch_sparse(shape, density, log, seed, dtype, data):
    fmt = data.draw(st.sampled_from(FORMATS_FEW if len(shape) == 2 else FORMATS_3D[:2]))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = _random(shape, density, dtype, seed)
    S = scorch.sparse_tensor(d, format=fmt, requires_grad=True)
    T = torch.sparse_coo_tensor(S.indices(), S.values().detach().clone(), shape).coalesce()
    T.requires_grad_()
    fn = torch.sparse.log_softmax if log else torch.sparse.softmax
    W = torch.rand(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    (_dense(fn(S, dim)) * W).sum().backward()
    # (torch's sparse softmax backward is wrong for a negative dim: give it dim % rank)
    (fn(T, dim % len(shape)).to_dense() * W).sum().backward()
    got = S.grad.to_dense()
    expect = T.grad.to_dense()
    torch.testing.assert_close(got, expect, **_tol(dtype))


def test_double_backward_softmax_and_unary():
    make, idx, v = _parts((4, 5), "csr")
    assert gradgradcheck(lambda v: _dense(torch.sparse.softmax(make(v), 1)), (v,))
    assert gradgradcheck(lambda v: _dense(torch.sparse.log_softmax(make(v), 1)), (v,))
    assert gradgradcheck(lambda v: _dense(torch.tanh(make(v))), (v,))


# --- amax / amin -------------------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(1, 4), (3, 1), (4, 5), (3, 2, 4)]),
       density=st.sampled_from([0.0, 0.5, 1.0]), reduce=st.sampled_from(["amax", "amin"]),
       keepdim=st.booleans(), seed=st.integers(0, 99), dtype=st.sampled_from([torch.float32, F64]),
       data=st.data())
def test_amax_amin_gradients_split_ties_like_torch(shape, density, reduce, keepdim, seed, dtype,
                                                   data):
    fmt = data.draw(st.sampled_from(FORMATS_FEW if len(shape) == 2 else FORMATS_3D[:2]))
    rank = len(shape)
    dim = data.draw(st.sampled_from([(), 0, -1, (0, rank - 1)]))
    d = _random(shape, density, dtype, seed, values=[-1.0, 0.0, 2.0])   # ties, zeros
    check_against_dense(lambda x: getattr(torch, reduce)(x, dim, keepdim), d, fmt, seed)


def test_gradcheck_amax():
    make, idx, v = _parts((4, 5), "csr")
    assert gradcheck(lambda v: make(v).amax(1), (v,))
    assert gradcheck(lambda v: make(v).amin((0, 1)), (v,))


# --- reductions, elementwise ---------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(shape=st.sampled_from([(0, 3), (1, 4), (4, 5), (3, 2, 4)]),
       density=st.sampled_from([0.0, 0.4, 1.0]), mean=st.booleans(), keepdim=st.booleans(),
       seed=st.integers(0, 99), dtype=st.sampled_from([torch.float32, F64]), data=st.data())
def test_sum_mean_gradients_match_dense(shape, density, mean, keepdim, seed, dtype, data):
    fmt = data.draw(st.sampled_from(FORMATS_FEW if len(shape) == 2 else FORMATS_3D[:2]))
    rank = len(shape)
    dim = data.draw(st.sampled_from([None, 0, (0, rank - 1), tuple(range(rank))]))
    if mean and 0 in shape:
        return   # a mean over nothing is NaN
    d = _random(shape, density, dtype, seed)
    fn = torch.mean if mean else torch.sum
    if dim is None:
        check_against_dense(lambda x: fn(x), d, fmt, seed)
    else:
        check_against_dense(lambda x: fn(x, dim, keepdim), d, fmt, seed)


_BINARY = {
    "add_dense": lambda x, y: x + y, "sub_dense": lambda x, y: y - 2 * x,
    "mul_dense": lambda x, y: x * y, "div_dense": lambda x, y: x / (y + 1),
    "mul_scalar": lambda x, y: 3 * x - x / 2 + (-x), "add_self": lambda x, y: x + x * x,
}


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(0, 3), (1, 4), (4, 5)]), density=st.sampled_from([0.0, 0.4, 1.0]),
       op=st.sampled_from(sorted(_BINARY)), fmt=st.sampled_from(FORMATS_FEW),
       other=st.sampled_from(["same", "row", "column", "scalar"]),
       dtype=st.sampled_from([torch.float32, F64]), seed=st.integers(0, 99))
def test_elementwise_gradients_match_dense(shape, density, op, fmt, other, dtype, seed):
    d = _random(shape, density, dtype, seed)
    oshape = {"same": shape, "row": (shape[1],), "column": (shape[0], 1), "scalar": ()}[other]
    y = torch.rand(oshape, dtype=dtype, generator=torch.Generator().manual_seed(seed + 1))
    check_against_dense(_BINARY[op], d, fmt, seed, (y,))


def test_type_promotion_keeps_the_graph():
    """A float32 sparse operand promoted to float64 (a product with a float64 tensor,
    ``sum(dtype=)``, ``softmax(dtype=)``): the cast is differentiable, never a detach."""
    d = _random((4, 5), 0.5, torch.float32, 4)
    Y = torch.rand(4, 5, dtype=F64)
    for op in (lambda x: x * Y, lambda x: x.sum(0, dtype=F64),
               lambda x: torch.sparse.softmax(x, 1, dtype=F64)):
        S = scorch.sparse_tensor(d, format="csr", requires_grad=True)
        out = _dense(op(S))
        assert out.dtype == F64
        out.sum().backward()
        assert S.grad is not None and S.grad.dtype == torch.float32 and S.grad.nnz == S.nnz
    D = d.clone().requires_grad_()
    (D * Y).sum().backward()
    S = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    (_dense(S * Y)).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), D.grad * (d != 0))


def test_sparse_operand_broadcast_in_elementwise():
    """A sparse row broadcast against a dense matrix: its gradient sums over the rows."""
    d = _random((1, 5), 0.6, F64, 3)
    check_against_dense(lambda x, y: x * y, d, "csr", 0, (torch.rand(4, 5, dtype=F64),))


# --- the matmul family ---------------------------------------------------------------------

_MATMUL = {
    "mm": ((4, 5), [(5, 3)], lambda a, b: a @ b),
    "rmm": ((4, 5), [(3, 4)], lambda a, b: b @ a),
    "mv": ((4, 5), [(5,)], lambda a, v: torch.mv(a, v)),
    "addmm": ((4, 5), [(4, 3), (5, 3)], lambda a, c, b: torch.addmm(c, a, b, beta=0.5, alpha=2)),
    "addmm_dense_mat1": ((5, 3), [(4, 3), (4, 5)], lambda a, c, m: torch.addmm(c, m, a)),
    "linear_weight": ((3, 5), [(2, 5), (3,)], lambda w, x, b: F.linear(x, w, b)),
    "linear_input": ((4, 5), [(3, 5)], lambda x, w: F.linear(x, w)),
    "bmm": ((2, 4, 5), [(2, 5, 3)], lambda a, b: torch.bmm(a, b)),
    "matmul_batch": ((2, 4, 5), [(5, 3)], lambda a, b: torch.matmul(a, b)),
    "matmul_broadcast": ((4, 5), [(2, 5, 3)], lambda a, b: torch.matmul(a, b)),
    "dense_batch_at_sparse": ((5, 3), [(2, 4, 5)], lambda a, b: b @ a),
}


@pytest.mark.parametrize("name", sorted(_MATMUL))
@pytest.mark.parametrize("density", [0.0, 0.5, 1.0])
def test_matmul_family_gradients_match_dense(name, density):
    shape, others, op = _MATMUL[name]
    fmt = "coo" if len(shape) == 3 else ["csr", "csc", "dcsr"][sorted(_MATMUL).index(name) % 3]
    d = _random(shape, density, F64, 7)
    xs = [torch.rand(s, dtype=F64, generator=torch.Generator().manual_seed(k)) for k, s in
          enumerate(others)]
    check_against_dense(op, d, fmt, 1, xs)


@pytest.mark.filterwarnings("error::UserWarning")   # no dense fallback on the way
def test_torch_sparse_mm_runs_sparse_and_differentiates():
    d = _random((4, 5), 0.5, F64, 5)
    X = torch.rand(5, 3, dtype=F64)
    S = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    Xs = X.clone().requires_grad_()
    out = torch.sparse.mm(S, Xs)
    D, Xd = d.clone().requires_grad_(), X.clone().requires_grad_()
    torch.testing.assert_close(out, D @ Xd)
    (out ** 2).sum().backward()
    ((D @ Xd) ** 2).sum().backward()
    torch.testing.assert_close(S.grad.to_dense(), D.grad * (d != 0))
    torch.testing.assert_close(Xs.grad, Xd.grad)


def test_double_backward_spmm_dense_operand():
    """SpMM is linear in X: torch's double backward exists for the dense op, and here."""
    S = scorch.sparse_tensor(_random((5, 4), 0.5, F64, 2), format="csr")
    X = torch.rand(4, 3, dtype=F64, requires_grad=True)
    assert gradgradcheck(lambda X: _dense(S @ X) ** 2, (X,))


# --- shape ops -----------------------------------------------------------------------------

_SHAPE = {
    "reshape": lambda x: x.reshape(x.shape[-1], -1), "view": lambda x: x.view(-1),
    "flatten": lambda x: x.flatten(), "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x.unsqueeze(0).squeeze(0), "t": lambda x: x.t(),
    "permute": lambda x: x.permute(1, 0), "transpose": lambda x: x.transpose(0, 1),
    "cat": lambda x: torch.cat([x, 2 * x], 0), "stack": lambda x: torch.stack([x, x * x], 1),
    "slice": lambda x: x[1:, ::2], "int": lambda x: x[-1], "tensor_index": lambda x: x[[0, -1, 0]],
    "mask": lambda x: x[:, torch.arange(x.shape[1]) % 2 == 0],
    "index_select": lambda x: x.index_select(1, torch.tensor([0, 2, 2, 1])),
    "none_ellipsis": lambda x: x[None, ..., 1:],
}


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(sorted(_SHAPE)), shape=st.sampled_from([(2, 3), (3, 4), (1, 5)]),
       density=st.sampled_from([0.0, 0.5, 1.0]), fmt=st.sampled_from(FORMATS_2D),
       dtype=st.sampled_from([torch.float32, F64]), seed=st.integers(0, 99))
def test_shape_op_gradients_match_dense(op, shape, density, fmt, dtype, seed):
    d = _random(shape, density, dtype, seed)
    check_against_dense(_SHAPE[op], d, fmt, seed)


@pytest.mark.parametrize("op", ["reshape", "cat", "slice", "tensor_index", "stack"])
def test_gradcheck_shape_ops(op):
    make, idx, v = _parts((3, 4), "csr")
    assert gradcheck(lambda v: _dense(_SHAPE[op](make(v))), (v,))


def test_shape_op_backward_moves_values_only():
    """A reshape's backward is a gather over stored entries: a 10^6 x 10^6 tensor with a
    handful of entries trains through reshape and indexing without a dense array."""
    n = 10 ** 6
    idx = torch.tensor([[0, 5, n - 1], [3, n - 2, 7]])
    v = torch.tensor([1.0, 2.0, 3.0], dtype=F64, requires_grad=True)
    S = scorch.sparse_tensor((idx, v), size=(n, n), format="csr")
    out = S.reshape(n * 1000, 1000)[5:].flatten()
    w = torch.tensor([1.0, 10.0, 100.0], dtype=F64)
    (out.values() * w[: out.nnz]).sum().backward()
    assert v.grad is not None and int((v.grad != 0).sum()) == out.nnz


# --- a sparse diagonal ---------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 5), density=st.sampled_from([0.0, 0.5, 1.0]),
       fmt=st.sampled_from(["csr", "coo", "csc", "dcsr"]), seed=st.integers(0, 99))
def test_sparse_diagonal_gradient(n, density, fmt, seed):
    d = _random((n, n), density, F64, seed)
    X = torch.rand(n, 3, dtype=F64)
    check_against_dense(lambda a, x: torch.einsum("ii,ij->j", a, x), d, fmt, seed, (X,))
    check_against_dense(lambda a: torch.einsum("ii->i", a), d, fmt, seed)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gradcheck_compute_with_a_sparse_diagonal(fmt):
    """``out(j) = T(i,i) * E(i,j)`` through compute: T's gradient on its diagonal entries."""
    from scorch.tensor_compiler.index_notation import Access, Assignment
    make, idx, v = _parts((4, 4), fmt, density=0.7)
    E = torch.rand(4, 3, dtype=F64, requires_grad=True)
    D = torch.rand(4, dtype=F64, requires_grad=True)
    for asg, dense in ((Assignment("j", Access(0, "ii") * Access(1, "ij")), E),
                       (Assignment("i", Access(0, "ii") * Access(1, "i")), D)):
        assert gradcheck(lambda v, x: _dense(scorch.gradients.compute(asg, make(v), x)), (v, dense))


def test_transposed_values_are_regathered_only_after_a_change():
    """The backward of ``A @ X`` reads A^T: its values are gathered once for a fixed A and
    again after an in-place update of A's values (an optimizer step)."""
    from scorch.gradients import pattern
    d = _random((30, 20), 0.2, torch.float32, 6)
    A = scorch.sparse_tensor(d, format="csr")
    csc = scorch.as_format("csc", 2)
    first = pattern.reformatted(A._storage, csc).values
    assert pattern.reformatted(A._storage, csc).values is first
    with torch.no_grad():
        A.values().mul_(2)
    again = pattern.reformatted(A._storage, csc)
    assert again.values is not first
    torch.testing.assert_close(scorch.SparseTensor(again).to_dense(), 2 * d)


# --- gradcheck over formats, shapes and densities (hypothesis) --------------------------------

_GRADCHECK_OPS = {
    # name: (ranks it takes, op of the sparse tensor and a dense partner of its shape)
    "mul_dense": ((2, 3), lambda s, y: s * y),
    "div_dense": ((2, 3), lambda s, y: s / (y + 1.0)),
    "add_sparse": ((2, 3), lambda s, y: s + 2.0 * s * s),
    "addcmul": ((2,), lambda s, y: torch.addcmul(s, s, y, value=0.5)),
    "where": ((2, 3), lambda s, y: torch.where(y > 0.5, s, 0.0) + torch.where(y > 0.5, 0.0, y * s)),
    "tanh_sigmoid": ((2, 3), lambda s, y: torch.tanh(s * y) + torch.sigmoid(s)),
    "sum_dim": ((2, 3), lambda s, y: s.sum(0) + s.sum(-1).sum()),
    "mean_keepdim": ((2, 3), lambda s, y: s.mean(-1, keepdim=True)),
    "sum_all": ((2, 3), lambda s, y: (s * y).sum()),
    "amax": ((2, 3), lambda s, y: s.amax(0)),
    "softmax": ((2, 3), lambda s, y: torch.sparse.softmax(s, 0)),
    "log_softmax": ((2, 3), lambda s, y: torch.sparse.log_softmax(s, -1)),
}
_FORMATS_BY_RANK = {2: FORMATS_2D, 3: FORMATS_3D}
_SHAPES_BY_RANK = {2: [(0, 3), (1, 4), (3, 1), (4, 5)], 3: [(1, 3, 2), (3, 2, 4)]}


@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from(sorted(_GRADCHECK_OPS)), density=st.sampled_from([0.0, 0.5, 1.0]),
       seed=st.integers(0, 99), data=st.data())
def test_gradcheck_over_formats(op, density, seed, data):
    """torch's gradcheck (float64) of elementwise ops, reductions and softmax in the sparse
    tensor's stored values and the dense partner, over formats, shapes and densities."""
    ranks, fn = _GRADCHECK_OPS[op]
    rank = data.draw(st.sampled_from(ranks))
    shape = data.draw(st.sampled_from([s for s in _SHAPES_BY_RANK[rank]
                                       if op != "amax" or 0 not in s]))   # torch raises there
    formats = _FORMATS_BY_RANK[rank]
    if op == "amax":   # stored zeros (dense levels) tie with the implicit ones: a kink
        formats = [f for f in formats if isinstance(f, str) and f != "csf"] or ["coo"]
    fmt = data.draw(st.sampled_from(formats))
    make, idx, v = _parts(shape, fmt, density=density, seed=seed, positive=op == "amax")
    y = torch.rand(shape, dtype=F64, generator=torch.Generator().manual_seed(seed + 1))
    y.requires_grad_()
    assert gradcheck(lambda v, y: _dense(fn(make(v), y)), (v, y), fast_mode=True)
