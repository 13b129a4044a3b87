"""Aliases and short compositions of handled ops (``scorch/sparse_ops/aliases.py``): each
equals dense torch on sparse operands of several ranks and formats, stays sparse, and never
reaches the dense fallback."""
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

F64 = torch.float64


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _check(fn, *operands):
    dense = [_dense(x) for x in operands]
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # the dense fallback warns: not here
        got = fn(*operands)
    want = fn(*dense)
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert isinstance(g, scorch.SparseTensor)
            torch.testing.assert_close(_dense(g), w)
        return
    torch.testing.assert_close(_dense(got), want)
    return got


@st.composite
def sparse_of_rank(draw, ranks=(1, 2, 3)):
    rank = draw(st.sampled_from(ranks))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    density = draw(st.sampled_from([0.0, 0.3, 1.0]))
    seed = draw(st.integers(0, 10_000))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=F64, generator=g) * (torch.rand(shape, generator=g) < density)
    letters = "".join(draw(st.lists(st.sampled_from("dcq"), min_size=rank, max_size=rank)))
    order = tuple(draw(st.permutations(range(rank))))
    fmt = "coo" if "q" in letters else scorch.Format(letters, mode_order=order)
    return scorch.sparse_tensor(x, format=fmt)


@settings(max_examples=40, deadline=None)
@given(s=sparse_of_rank(), data=st.data())
def test_movedim_and_ravel(s, data):
    n = s.dim()
    src = data.draw(st.integers(-n, n - 1))
    dst = data.draw(st.integers(-n, n - 1))
    got = _check(lambda t: torch.movedim(t, src, dst), s)
    assert isinstance(got, scorch.SparseTensor)
    _check(lambda t: t.moveaxis([0], [-1]), s)
    _check(torch.ravel, s)


@settings(max_examples=40, deadline=None)
@given(s=sparse_of_rank((2, 3)))
def test_adjoint_mH_and_H(s):
    _check(torch.adjoint, s)
    _check(lambda t: t.mH, s)
    if s.dim() == 2:
        _check(lambda t: t.H, s)


@settings(max_examples=40, deadline=None)
@given(s=sparse_of_rank((1, 2, 3)), dense_partner=st.booleans())
def test_stacks(s, dense_partner):
    other = _dense(s) * 2 if dense_partner else s * 2
    fns = [torch.vstack, torch.row_stack, torch.hstack, torch.dstack, torch.column_stack]
    for fn in fns:
        if fn is torch.column_stack and s.dim() > 2:
            continue
        _check(lambda a, b: fn([a, b]), s, other)


@settings(max_examples=40, deadline=None)
@given(s=sparse_of_rank((1, 2, 3)), data=st.data())
def test_tensor_split(s, data):
    d = data.draw(st.integers(0, s.dim() - 1))
    k = data.draw(st.integers(1, 5))
    _check(lambda t: torch.tensor_split(t, k, d), s)
    cuts = data.draw(st.lists(st.integers(-6, 6), max_size=4))
    _check(lambda t: t.tensor_split(cuts, d), s)
    _check(lambda t: torch.tensor_split(t, torch.tensor(cuts, dtype=torch.int64), d), s)


@pytest.mark.parametrize("shapes", [[(6, 5), (5, 3)], [(6, 5), (5, 40), (40, 2)],
                                    [(5,), (5, 4), (4, 7), (7,)], [(6, 5), (5, 2), (2, 9), (9, 3)]])
@pytest.mark.parametrize("sparse_at", [0, -1])
def test_multi_dot_and_chain_matmul(shapes, sparse_at):
    g = torch.Generator().manual_seed(1)
    ops = [torch.randn(s, dtype=F64, generator=g) for s in shapes]
    ops[sparse_at] = scorch.sparse_tensor(ops[sparse_at] * (torch.rand(shapes[sparse_at], generator=g) < 0.4),
                                          format="csr" if len(shapes[sparse_at]) == 2 else "coo")
    _check(lambda *xs: torch.linalg.multi_dot(list(xs)), *ops)
    if all(len(s) == 2 for s in shapes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # chain_matmul is deprecated in torch
            torch.testing.assert_close(_dense(torch.chain_matmul(*ops)),
                                       torch.linalg.multi_dot([_dense(x) for x in ops]))


def test_multi_dot_picks_the_cheap_order():
    from scorch.sparse_ops.aliases import _chain_order
    # (10 x 1000) (1000 x 1000) (1000 x 1): right to left is 1000x cheaper
    assert _chain_order([(10, 1000), (1000, 1000), (1000, 1)]) == (0, (1, 2))
    assert _chain_order([(1, 1000), (1000, 1000), (1000, 10)]) == ((0, 1), 2)


def test_pow_with_a_sparse_exponent_is_dense_as_torch():
    a = torch.tensor([[0.0, 2.0], [3.0, 0.0]], dtype=F64)
    b = torch.tensor([[0.0, 0.5], [0.0, 2.0]], dtype=F64)
    A, B = (scorch.sparse_tensor(x, format="csr") for x in (a, b))
    for got, want in [(torch.pow(A, B), torch.pow(a, b)), (torch.pow(a, B), torch.pow(a, b)),
                      (torch.pow(2.0, B), torch.pow(2.0, b))]:
        assert type(got) is torch.Tensor
        torch.testing.assert_close(got, want)
