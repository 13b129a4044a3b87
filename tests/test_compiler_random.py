"""Hypothesis-driven random einsum over random formats, mode orders, densities and dtypes,
checked against torch.einsum on dense copies.

Compilation dominates the cost, so expressions repeat by design: a fixed pool of equations
(1-3 operands, orders 1-4) and a small pool of formats per rank; examples are derandomized
so every run compiles the same kernels (the session's shared SCORCH_CACHE_DIR then serves
them from disk)."""
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler_helpers import check_storage, dense, sparse
import scorch.tensor_compiler as C
from scorch.formats import Format
from scorch.level_storage import Storage


EQUATIONS = [
    "i->", "ij->ji", "ijk->ki", "ijkl->lj",
    "i,i->i", "i,j->ij", "ij,j->i", "ij,jk->ik", "ij,ij->ij", "ij,ji->i",
    "ijk,kj->ik", "ijk,ikl->jl", "ijkl,jl->ik", "bij,bjk->bik",
    "ij,ik,kj->ij", "ij,jk,kl->il", "i,ij,j->", "bd,ndh,bn->bh",
]
FORMATS = {
    1: [None, Format("c"), Format("q")],
    2: [None, Format("dc"), Format("dc", (1, 0)), Format("cc"), Format("qq"), Format("qq", (1, 0)), Format("cd")],
    3: [None, Format("dcc"), Format("qqq"), Format("cdc", (2, 0, 1))],
    4: [None, Format("qqqq"), Format("dcdc", (3, 1, 0, 2))],
}


@st.composite
def problems(draw):
    eq = draw(st.sampled_from(EQUATIONS))
    terms = eq.split("->")[0].split(",")
    letters = sorted(set("".join(terms)))
    sizes = {v: draw(st.sampled_from([1, 2, 3, 4, 5, 0])) if v in "ij" else draw(st.integers(1, 4))
             for v in letters}
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    dense_ops, ops = [], []
    for term in terms:
        shape = [sizes[v] for v in term]
        density = draw(st.sampled_from([0.0, 0.15, 0.5, 1.0]))
        x = torch.randn(shape, generator=g).to(dtype) * (torch.rand(shape, generator=g) < density)
        if draw(st.integers(0, 3)) == 0:  # any level kinds, any mode order
            r = len(term)
            kinds = "".join(draw(st.sampled_from("dcq")) for _ in range(r))
            fmt = Format(kinds, draw(st.permutations(range(r))))
        else:
            fmt = draw(st.sampled_from(FORMATS[len(term)]))
        dense_ops.append(x)
        ops.append(x if fmt is None else sparse(x, fmt))
    return eq, ops, dense_ops, dtype


@settings(max_examples=160, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_random_einsum_matches_torch(problem):
    eq, ops, dense_ops, dtype = problem
    got = C.einsum(eq, *ops)
    want = torch.einsum(eq, *dense_ops)
    if isinstance(got, Storage):
        check_storage(got)
        assert got.dtype == dtype
    got = dense(got)
    assert got.shape == want.shape
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got, want, **tol)


# ------------------------------------------------------------------ elementwise expressions
from scorch.tensor_compiler.index_notation import Access, Assignment  # noqa: E402

_A, _B, _D = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")
_ROW = Access(2, "i")
EXPRESSIONS = [
    (Assignment("ij", _A + _B), 2),
    (Assignment("ij", _A - 0.5 * _B), 2),
    (Assignment("ij", _A * _B + _D), 3),
    (Assignment("ij", (_A + _B) * _D), 3),
    (Assignment("ij", _A - _B * _D), 3),
    (Assignment("ij", -_A + _B), 2),
    (Assignment("i", _A * _B + _A), 2),       # sum over j of a union
    (Assignment("ij", _A * _B - _ROW), "row"),  # broadcast term of a difference
]
FORMATS2 = [None, Format("dc"), Format("dc", (1, 0)), Format("cc"), Format("qq"), Format("cd")]


@st.composite
def expressions(draw):
    asg, kind = draw(st.sampled_from(EXPRESSIONS))
    m, n = draw(st.integers(0, 5)), draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    nops = 3 if kind in (3, "row") else 2
    dense_ops, ops = [], []
    for t in range(nops):
        shape = (m,) if (kind == "row" and t == 2) else (m, n)
        density = draw(st.sampled_from([0.0, 0.2, 0.6, 1.0]))
        x = torch.randn(shape, generator=g).to(dtype) * (torch.rand(shape, generator=g) < density)
        fmts = FORMATS[1] if len(shape) == 1 else FORMATS2
        fmt = draw(st.sampled_from(fmts))
        dense_ops.append(x)
        ops.append(x if fmt is None else sparse(x, fmt))
    return asg, ops, dense_ops, dtype


def _eval_dense(e, ops):
    from scorch.tensor_compiler.index_notation import Add, Mul, Neg, Scalar, Sub
    if isinstance(e, Access):
        x = ops[e.tensor]
        return x if len(e.indices) == 2 else x[:, None]
    if isinstance(e, Scalar):
        return e.value
    if isinstance(e, Neg):
        return -_eval_dense(e.a, ops)
    a, b = _eval_dense(e.a, ops), _eval_dense(e.b, ops)
    return {Add: lambda: a + b, Sub: lambda: a - b, Mul: lambda: a * b}[type(e)]()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(expressions())
def test_random_elementwise_matches_dense(problem):
    asg, ops, dense_ops, dtype = problem
    got = C.compute(asg, *ops)
    want = _eval_dense(asg.rhs, dense_ops)
    if asg.output == ("i",):
        want = want.sum(1)
    if isinstance(got, Storage):
        check_storage(got)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dense(got), want.to(dtype), **tol)


# ------------------------------------------------------------------ blocked operands
BLOCKED = [Format("dc", block=(2, 2)), Format("dc", (1, 0), block=(2, 2)), Format("cc", block=(2, 1)),
           Format("dc", block=(1, 2))]
BLOCK_EQUATIONS = ["ij,jk->ik", "ij,j->i", "ij,ij->ij", "ij,ik,kj->ij", "ji,jk->ik", "ij->"]


@st.composite
def blocked_problems(draw):
    eq = draw(st.sampled_from(BLOCK_EQUATIONS))
    terms = eq.split("->")[0].split(",")
    sizes = {v: draw(st.sampled_from([2, 4, 6])) for v in sorted(set("".join(terms)))}
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dense_ops, ops = [], []
    for n, term in enumerate(terms):
        shape = [sizes[v] for v in term]
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = x * (torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.3, 1.0])))
        dense_ops.append(x)
        if n == 0:
            ops.append(sparse(x, draw(st.sampled_from(BLOCKED))))
        else:
            fmt = draw(st.sampled_from([None, None, Format("dc")] + (BLOCKED if len(term) == 2 else [])))
            ops.append(x if fmt is None or len(term) != 2 else sparse(x, fmt))
    return eq, ops, dense_ops


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(blocked_problems())
def test_random_blocked_einsum(problem):
    eq, ops, dense_ops = problem
    got = dense(C.einsum(eq, *ops))
    torch.testing.assert_close(got, torch.einsum(eq, *dense_ops))
