"""Selecting and concatenating along the dimension a format stores first
(``scorch.sparse_ops.outer_level``), over any level kinds and mode orders: equal to dense
torch, a valid storage (``saving.check_storage``), and never the general path's walk over
every stored coordinate, so the cost follows the entries selected or moved."""
import io

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from ops_helpers import any_format, assert_matches, dense_values, side, sparse
from scorch.saving import check_storage
from scorch.sparse_ops import shape as shape_ops

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def no_coordinate_walk(monkeypatch):
    """The general getitem / cat read every entry's coordinates: make that fail."""
    def refuse(*args, **kwargs):
        raise AssertionError("the general path walked every stored coordinate")
    monkeypatch.setattr(shape_ops, "_coords", refuse)
    monkeypatch.setattr(shape_ops, "_convert", lambda: type("C", (), {"coords": refuse}))


@st.composite
def outer_case(draw, min_rank=1):
    rank = draw(st.integers(min_rank, 3))
    shape = tuple(draw(side(0, 5)) for _ in range(rank))
    x = draw(dense_values(shape, draw(st.sampled_from([torch.float64, torch.float32, torch.int64]))))
    return x, sparse(x, draw(any_format(rank)))


def _valid(t):
    if isinstance(t, scorch.SparseTensor):
        check_storage(t._storage, "the result")


@FAST
@given(outer_case(), st.data())
def test_range_along_the_first_level(no_coordinate_walk, case, data):
    x, s = case
    d0 = s.format.mode_order[0]
    n = x.shape[d0]
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    index = (slice(None),) * d0 + (slice(data.draw(bound), data.draw(bound),
                                         data.draw(st.sampled_from([None, 1]))),)
    got = s[index]
    _valid(got)   # first: a malformed storage could crash the dense copy
    assert_matches(got, x[index], sparse=True)
    assert got.format == s.format


@FAST
@given(outer_case(min_rank=2), st.data())
def test_int_along_the_first_level(monkeypatch, case, data):
    x, s = case
    d0 = s.format.mode_order[0]
    n = x.shape[d0]
    if n == 0:
        return
    i = data.draw(st.integers(-n, n - 1))
    as_tensor = data.draw(st.booleans())
    index = (slice(None),) * d0 + ((torch.tensor(i) if as_tensor else i),)
    from scorch.sparse_ops import outer_level
    taken = []
    real = outer_level.select_outer
    monkeypatch.setattr(shape_ops, "select_outer",
                        lambda t, items: taken.append(real(t, items)) or taken[-1])
    got = s[index]
    _valid(got)
    assert_matches(got, x[index], sparse=True)
    # declined only for an unstored slice under a dense level (the general path's zeros)
    if taken[0] is None:
        assert s.format.levels[1].full and not bool((x.select(d0, i) != 0).any())
    assert torch.equal(s.select(d0, i).to_dense(), x.select(d0, i))


@FAST
@given(outer_case(), st.data())
def test_index_along_the_first_level(no_coordinate_walk, case, data):
    """``index_select`` and ``t[index]`` along the first stored dimension (a minibatch of
    rows): any order, repeats; negatives in ``t[index]`` (``index_select`` refuses them, as
    torch's)."""
    x, s = case
    d0 = s.format.mode_order[0]
    n = x.shape[d0]
    picks = data.draw(st.lists(st.integers(-n, n - 1), max_size=6)) if n else []
    index = torch.tensor(picks, dtype=torch.int64)
    index = torch.where(index < 0, index + n, index)
    got = s.index_select(d0, index)
    _valid(got)
    expected = x.index_select(d0, index)
    assert_matches(got, expected, sparse=True)
    assert got.format == s.format
    by_item = s[(slice(None),) * d0 + (picks,)]
    _valid(by_item)
    assert_matches(by_item, x[(slice(None),) * d0 + (picks,)], sparse=True)


@FAST
@given(st.data())
def test_cat_along_the_first_level(no_coordinate_walk, data):
    rank = data.draw(st.integers(1, 3))
    fmt = data.draw(any_format(rank))
    d0 = fmt.mode_order[0]
    base = [data.draw(side(0, 3)) for _ in range(rank)]
    xs = []
    for _ in range(data.draw(st.integers(1, 3))):
        shape = list(base)
        shape[d0] = data.draw(side(0, 3))
        xs.append(data.draw(dense_values(tuple(shape))))
    got = torch.cat([sparse(x, fmt) for x in xs], d0)
    _valid(got)
    assert_matches(got, torch.cat(xs, d0), sparse=True)
    assert got.format == fmt


def test_selection_and_cat_carry_gradients():
    x = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0], [0.0, 0.0, 4.0]], dtype=torch.float64)
    s = sparse(x, "csr").requires_grad_()
    w = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    (s[1:3].to_dense() * w).sum().backward()
    assert torch.equal(s.grad.to_dense(), torch.tensor([[0.0, 0, 0], [0, 0, 2], [0, 0, 5]],
                                                       dtype=torch.float64))
    a = sparse(x, "csr").requires_grad_()
    b = sparse(2 * x, "csr").requires_grad_()
    (torch.cat([a, b]).to_dense() * torch.arange(18.0, dtype=torch.float64).reshape(6, 3)).sum().backward()
    assert torch.equal(a.grad.to_dense(), (torch.arange(9.0, dtype=torch.float64).reshape(3, 3)) * (x != 0))
    assert torch.equal(b.grad.to_dense(), (torch.arange(9.0, 18.0, dtype=torch.float64).reshape(3, 3)) * (x != 0))


def test_cat_mixes_dtypes_and_keeps_int32_indices():
    a = sparse(torch.eye(3), "csr")
    b = sparse(torch.eye(3, dtype=torch.float64), "csr")
    got = torch.cat([a, b])
    assert got.dtype == torch.float64 and got.index_dtype == torch.int32
    assert torch.equal(got.to_dense(), torch.cat([torch.eye(3, dtype=torch.float64)] * 2))


def test_a_row_of_a_large_matrix_reads_that_row():
    """One row out of 2M entries: the selection's index arrays are that row's, copied (a
    view would keep the whole matrix's arrays); its values are a view, as a dense row is (an
    in-place write reaches the matrix), and torch.save writes only the row's."""
    n = 200_000
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (2, 2_000_000), generator=g)
    s = scorch.sparse_tensor((idx, torch.rand(2_000_000, generator=g)), size=(n, n), format="csr")
    row = s[123]
    crd = s._storage.levels[1].crd
    lo = int(s._storage.levels[1].pos[123])
    hi = int(s._storage.levels[1].pos[124])
    assert torch.equal(row._storage.levels[0].crd, crd[lo:hi])
    assert row._storage.levels[0].crd.data_ptr() != crd[lo:].data_ptr()
    assert row._storage.levels[0].crd.untyped_storage().nbytes() == (hi - lo) * crd.element_size()
    assert row.values().data_ptr() == s.values()[lo:].data_ptr()
    buffer = io.BytesIO()
    torch.save(row, buffer)
    assert buffer.tell() < 100_000 + (hi - lo) * 16
    dense_row = torch.zeros(n)
    mask = idx[0] == 123
    dense_row.index_put_((idx[1][mask],), torch.ones(int(mask.sum())), accumulate=True)
    assert torch.equal(row.to_dense() != 0, dense_row != 0)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_row_minibatch_of_csr_copies_segments(index_dtype):
    """Rows picked from CSR (repeats, any order) come from one segment-by-segment copy of
    their coordinates and values (``entries.gather_segment_entries``); with a gradient
    needed, the values go through an index autograd records instead."""
    from scorch._runtime import entries
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 40, generator=g, dtype=torch.float64) * (torch.rand(50, 40, generator=g) < 0.2)
    s = scorch.sparse_tensor(x, format="csr")
    if index_dtype == torch.int64:
        s = scorch.from_scipy(s.to_scipy().astype("float64"))
        st = s._storage
        lv = [l for l in st.levels]
        s = scorch.SparseTensor(type(st)(st.format, st.shape, [lv[0], type(lv[1])(
            lv[1].kind, lv[1].dim, lv[1].size, lv[1].pos.long(), lv[1].crd.long())], st.values,
            torch.int64))
    index = torch.tensor([7, 3, 3, 49, 0, 12])
    got = s.index_select(0, index)
    _valid(got)
    assert got._storage.index_dtype == s._storage.index_dtype
    torch.testing.assert_close(got.to_dense(), x[index])
    pos, crd, vals = entries.gather_segment_entries(s._storage.levels[1].pos, s._storage.levels[1].crd,
                                                    s._storage.values, index)
    torch.testing.assert_close(pos, got._storage.levels[1].pos)
    torch.testing.assert_close(vals, got._storage.values)
    w = s.detach().requires_grad_()
    (w.index_select(0, index).to_dense() * torch.arange(40.0, dtype=torch.float64)).sum().backward()
    want = torch.zeros(50, 40, dtype=torch.float64).index_add_(
        0, index, torch.arange(40.0, dtype=torch.float64).expand(6, 40)) * (x != 0)
    torch.testing.assert_close(w.grad.to_dense(), want)
