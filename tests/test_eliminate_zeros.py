"""``scorch.eliminate_zeros(t)`` / ``t.eliminate_zeros()``: a new tensor in t's format and
index dtype without its stored zeros (a position of the lowest sparse level goes when
everything under it is zero; fibers left empty go from levels that list coordinates; dense
levels keep every coordinate). Oracles: dense torch for the values, the numpy model of level
storage (``reference_storage``) built from t's nonzero entries for the structure."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.autograd import gradcheck

import scorch
from scorch._runtime import validate
from scorch.formats import LevelKind
from scorch.gradients.values import from_values
from scorch.level_storage import Level, Storage
from scorch.tensor_type import with_values

from ops_helpers import any_format
from reference_storage import reference_from_coords

F64 = torch.float64
DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


def _in_index_dtype(S, index_dtype):
    """``S`` with its index arrays in ``index_dtype`` (the constructors pick int32)."""
    st = S._storage
    cast = [Level(lv.kind, lv.dim, lv.size, None if lv.pos is None else lv.pos.to(index_dtype),
                  None if lv.crd is None else lv.crd.to(index_dtype), lv.block_inner, lv.ordered)
            for lv in st.levels]
    return scorch.SparseTensor(Storage(st.format, st.shape, cast, st.values, index_dtype))


def with_stored_zeros(pattern, zeros, fmt, dtype=F64, index_dtype=torch.int32, seed=0):
    """A tensor in ``fmt`` storing the positions of ``pattern`` (bool, dense) with nonzero
    random values, then ``zeros`` (a fraction, or a bool per stored value) of them set to 0:
    stored zeros, as ``Q * (Q > t)`` leaves them."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(pattern.shape, generator=g, dtype=F64) + 0.5) * pattern
    S = scorch.sparse_tensor(x, format=fmt)
    v = S._storage.values.clone()     # flat (a hybrid's values() are not)
    drop = zeros if isinstance(zeros, torch.Tensor) else torch.rand(v.shape, generator=g) < zeros
    v[drop] = 0
    if dtype == torch.bool:
        v = v != 0
    elif dtype == torch.int64:
        v = (v * 10).to(torch.int64)        # stays nonzero where v is (v >= 0.5)
    else:
        v = v.to(dtype)
    return _in_index_dtype(with_values(S, v), index_dtype)


def expected_storage(T):
    """The numpy model's storage of T's nonzero entries in T's format: dense levels fill in
    every coordinate under a kept parent, exactly the rule of eliminate_zeros."""
    coords, vals = scorch.conversion.coords(T._storage), T._storage.values   # every stored entry's
    nz = vals if vals.dtype == torch.bool else vals != 0
    return reference_from_coords(coords[:, nz].numpy(), vals[nz], tuple(T.shape), T.format)


def check_eliminated(T, E):
    assert isinstance(E, scorch.SparseTensor) and E is not T
    assert E.format == T.format and E.index_dtype == T.index_dtype and E.dtype == T.dtype
    assert torch.equal(E.to_dense(), T.to_dense())
    ref = expected_storage(T)
    assert E.nnz == ref.nnz
    for got, want in zip(E._storage.levels, ref.levels):
        assert (got.kind, got.dim, got.size, got.block_inner) == \
            (want.kind, want.dim, want.size, want.block_inner)
        for a, b in ((got.pos, want.pos), (got.crd, want.crd)):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == T.index_dtype and a.is_contiguous()
                assert torch.equal(a.to(torch.int64), b.to(torch.int64))
        if got.pos is not None and got.kind is LevelKind.COMPRESSED:   # scorch's own validator
            parents = got.pos.numel() - 1
            assert validate.compressed(got.pos, got.crd, parents, got.size, got.crd.numel(),
                                       "result") == validate.CANONICAL
    assert torch.equal(E._storage.values, ref.values.to(E.dtype))
    if E.nnz:                  # values of its own: an in-place op on E never reaches T
        assert E._storage.values.data_ptr() != T._storage.values.data_ptr()


# every kind of format the brief names: compressed, coordinate, doubly compressed, CSF,
# dense levels under sparse ones, hybrid, blocked; plus any level kinds in any mode order
NAMED = [("csr", 2), ("csc", 2), ("coo", 2), ("dcsr", 2), ("dcsc", 2), ("csf", 3), ("coo", 3),
         (scorch.Format("dd"), 2), (scorch.Format("cd"), 2), (scorch.Format("dcd"), 3),
         (scorch.Format("qqd"), 3), (scorch.Format("dc", block=(2, 2)), 2),
         (scorch.Format("cc", block=(2, 3)), 2), (scorch.Format("ccc", (2, 0, 1)), 3)]


@st.composite
def cases(draw):
    if draw(st.booleans()):
        fmt, rank = draw(st.sampled_from(NAMED))
    else:
        rank = draw(st.integers(1, 3))
        fmt = draw(any_format(rank))
    fmt = scorch.formats.as_format(fmt, rank)
    block = fmt.block or (1,) * rank
    shape = tuple(draw(st.integers(0, 4)) * b for b in block)
    density = draw(st.sampled_from([0.0, 0.4, 1.0]))        # empty, sparse, every position
    zeros = draw(st.sampled_from([0.0, 0.5, 1.0]))          # none, half, all zero
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    pattern = torch.rand(shape, generator=g) < density
    return (pattern, zeros, fmt, draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from([torch.int32, torch.int64])), draw(st.integers(0, 99)))


@settings(max_examples=150, deadline=None)
@given(cases())
def test_matches_dense_and_reference_structure(case):
    pattern, zeros, fmt, dtype, index_dtype, seed = case
    T = with_stored_zeros(pattern, zeros, fmt, dtype, index_dtype, seed)
    before = T.to_dense().clone()
    E = scorch.eliminate_zeros(T)
    check_eliminated(T, E)
    check_eliminated(T, T.eliminate_zeros())
    assert torch.equal(T.to_dense(), before)                  # out of place
    if fmt.block is None and all(k.is_sparse for k in fmt.levels):
        assert E.nnz == int((T.to_dense() != 0).sum())       # no dense level: only nonzeros


def test_blocked_and_dense_sublevels_keep_a_block_with_one_nonzero():
    """A block (or a hybrid's dense row) goes only when all of it is zero."""
    x = torch.zeros(4, 4, dtype=F64)
    x[:2, :2] = 1.0
    x[2:, 2:] = 2.0
    S = scorch.sparse_tensor(x, format=scorch.Format("dc", block=(2, 2)))
    v = S.values().clone()
    v[:3] = 0            # first block: one nonzero left; second block all zero
    v[4:] = 0
    T = with_values(S, v)
    E = T.eliminate_zeros()
    assert E.nnz == 4 and torch.equal(E.to_dense(), T.to_dense())
    # hybrid "cd": a stored row whose dense part is all zero goes, one with a nonzero stays
    H = scorch.sparse_tensor(torch.tensor([[1., 2, 3], [0, 0, 0], [4, 5, 6]]), format="cd")
    H = with_values(H, torch.tensor([0., 0, 0, 0, 5, 0]))
    E = H.eliminate_zeros()
    assert E.nnz == 3 and E._storage.levels[0].crd.tolist() == [2]
    assert torch.equal(E.to_dense(), H.to_dense())


def test_empty_fibers_go_from_coordinate_levels_not_dense_ones():
    x = torch.tensor([[1., 2, 0], [0, 0, 3], [4, 0, 0]])
    zero_row1 = torch.tensor([False, False, True, False])      # stored order: (0,0) (0,1) (1,2) (2,0)
    for fmt, outer_crd in (("dcsr", [0, 2]), ("coo", [0, 0, 2])):
        T = with_values(scorch.sparse_tensor(x, format=fmt),
                        torch.where(zero_row1, 0.0, scorch.sparse_tensor(x, format=fmt).values()))
        E = T.eliminate_zeros()
        assert E._storage.levels[0].crd.tolist() == outer_crd
        assert torch.equal(E.to_dense(), T.to_dense())
    T = with_values(scorch.sparse_tensor(x, format="csr"), torch.tensor([1., 2, 0, 4]))
    E = T.eliminate_zeros()
    assert E._storage.levels[1].pos.tolist() == [0, 2, 2, 3]    # the dense row level keeps row 1


def test_nan_stays_negative_zero_goes_bool_false_goes():
    x = torch.tensor([[1., 2, 3, 4]])
    T = with_values(scorch.sparse_tensor(x, format="csr"), torch.tensor([float("nan"), -0.0, 0.0, 5.0]))
    E = T.eliminate_zeros()
    assert E._storage.levels[1].crd.tolist() == [0, 3] and torch.isnan(E.values()[0])
    B = with_values(scorch.sparse_tensor(x, format="coo"), torch.tensor([True, False, False, True]))
    assert B.eliminate_zeros().indices().tolist() == [[0, 0], [0, 3]]


def test_singleton_levels():
    """A singleton under a dense level keeps its one entry per row, zero or not; under a
    compressed level the row goes with it."""
    x = torch.tensor([[0., 1, 0], [2, 0, 0], [0, 0, 3]])
    for fmt, nnz in ((scorch.Format("ds"), 3), (scorch.Format("cs"), 2)):
        T = with_values(scorch.sparse_tensor(x, format=fmt), torch.tensor([1., 0, 3]))
        E = T.eliminate_zeros()
        assert E.nnz == nnz and torch.equal(E.to_dense(), T.to_dense())


def test_result_is_independent_of_the_input():
    """Nothing zero: a new tensor over t's index arrays (cheap) with values of its own, so an
    in-place op on the result leaves t as it was."""
    T = scorch.sparse_tensor(torch.tensor([[1., 0, 2], [0, 3, 0]]), format="csr")
    E = T.eliminate_zeros()
    assert E is not T and E._storage.levels[1].crd is T._storage.levels[1].crd
    assert E.values().data_ptr() != T.values().data_ptr()
    E.mul_(10)
    assert T.values().tolist() == [1., 2., 3.]
    T2 = with_values(T, torch.tensor([1., 0, 3]))
    E2 = T2.eliminate_zeros()
    E2.mul_(10)
    assert T2.values().tolist() == [1., 0., 3.]


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr", scorch.Format("dc", block=(2, 2)),
                                 scorch.Format("qqd")])
def test_gradcheck(fmt):
    """Differentiable in the values: a kept value's gradient goes to its position in t's
    pattern, a dropped one's is 0. The zeros come from a constant factor, so a perturbed
    value never crosses zero."""
    rank = 3 if fmt == scorch.Format("qqd") else 2
    g = torch.Generator().manual_seed(3)
    pattern = torch.rand((4,) * rank, generator=g) < 0.5
    S = with_stored_zeros(pattern, 0.0, fmt)
    factor = (torch.rand(S.nnz, generator=g) < 0.5).to(F64)
    # every stored value nonzero, a dense level's fill too: zeros come only from the factor
    v0 = (torch.rand(S.nnz, generator=g, dtype=F64) + 0.5).requires_grad_()

    def f(v):
        return scorch.eliminate_zeros(from_values(S._storage, v * factor)).to_dense()

    assert gradcheck(f, (v0,))
    # the sparse gradient: on S's pattern, zero where the entry was dropped
    A = from_values(S._storage, v0.detach().clone()).requires_grad_()
    E = scorch.eliminate_zeros(A * with_values(A.detach(), factor))
    (E.values() * 2).sum().backward()
    assert A.grad.nnz == A.nnz
    torch.testing.assert_close(A.grad._storage.values, 2 * (factor != 0).to(F64))


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr"])
def test_result_works_in_ops(fmt):
    g = torch.Generator().manual_seed(5)
    T = with_stored_zeros(torch.rand(6, 5, generator=g) < 0.5, 0.5, fmt)
    E = T.eliminate_zeros()
    D = T.to_dense()
    x = torch.rand(5, 3, dtype=F64, generator=g)
    torch.testing.assert_close(E @ x, D @ x)
    torch.testing.assert_close((E + E).to_dense(), 2 * D)
    assert torch.equal(E.to_torch().to_dense(), D)
    back = scorch.sparse_tensor(E.to_scipy().tocsr())
    assert torch.equal(back.to_dense(), D) and back.nnz == E.nnz == int((D != 0).sum())


def test_torch_sparse_layouts_in_and_out():
    d = torch.tensor([[0., 1, 0], [2, 0, 3]])
    c = d.to_sparse_coo()
    c = torch.sparse_coo_tensor(c.indices(), torch.tensor([0., 2, 0]), c.shape).coalesce()
    e = scorch.eliminate_zeros(c)
    assert e.layout == torch.sparse_coo and e._nnz() == 1 and torch.equal(e.to_dense(), c.to_dense())
    r = d.to_sparse_csr()
    r = torch.sparse_csr_tensor(r.crow_indices(), r.col_indices(), torch.tensor([1., 0, 3]), r.shape)
    e = scorch.eliminate_zeros(r)
    assert e.layout == torch.sparse_csr and e.col_indices().tolist() == [1, 2]
    assert e.crow_indices().tolist() == [0, 1, 2]


def test_dense_input_raises_naming_the_operand():
    with pytest.raises(TypeError, match=r"eliminate_zeros\(t\): t must be a sparse tensor.*dense"):
        scorch.eliminate_zeros(torch.ones(2, 2))
    with pytest.raises(TypeError, match="got an object of type list"):
        scorch.eliminate_zeros([1.0, 0.0])


def test_k_hop_propagation_stays_pruned():
    """``Q = A @ Q; Q = Q * (Q.abs() > t)`` keeps the pattern of the product (stored zeros);
    with eliminate_zeros every hop's pattern is only the entries above the threshold."""
    g = torch.Generator().manual_seed(7)
    n = 40
    A = scorch.sparse_tensor((torch.rand(n, n, generator=g) < 0.1) * torch.rand(n, n, generator=g, dtype=F64),
                             format="csr")
    Q0 = scorch.sparse_tensor(torch.eye(n, 4, dtype=F64), format="csr")
    thresh = 0.05
    Q, P, D = Q0, Q0, Q0.to_dense()
    for _ in range(4):
        D = A.to_dense() @ D
        D = D * (D.abs() > thresh)
        Q = A @ Q
        Q = (Q * (Q.abs() > thresh)).eliminate_zeros()
        P = A @ P
        P = P * (P.abs() > thresh)                      # without the prune
        torch.testing.assert_close(Q.to_dense(), D)
        torch.testing.assert_close(P.to_dense(), D)
        assert Q.nnz == int((D != 0).sum())            # bounded by the kept entries
    assert P.nnz > Q.nnz                                # the unpruned pattern grew
