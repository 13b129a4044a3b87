"""Ops along a matrix's second stored level (``scorch.sparse_ops.inner_level``): ``A[:, j]``
and ``A[:, a:b]`` over every 2-level format and mode order, and ``cat`` of CSR / CSC along
that level: equal to dense torch, a valid storage, and no walk over every entry's
coordinates where the format allows (a sparse second level; for a range, a dense first
level or COO; for cat, a dense first level over a compressed one)."""
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from ops_helpers import any_format, assert_matches, dense_values, side, sparse
from scorch.saving import check_storage
from scorch.sparse_ops import shape as shape_ops

FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _filterable(fmt: scorch.Format, is_range: bool) -> bool:
    first, inner = fmt.levels
    if inner.full:
        return False
    return not is_range or first.full or (first.letter == "q" and inner.letter == "q")


@FAST
@given(st.data())
def test_int_or_range_along_the_second_level(monkeypatch, data):
    shape = (data.draw(side(0, 5)), data.draw(side(0, 5)))
    x = data.draw(dense_values(shape, data.draw(st.sampled_from([torch.float64, torch.int64]))))
    named = data.draw(st.sampled_from(["csr", "csc", "coo", "dcsr", "dcsc", None]))
    s = sparse(x, named or data.draw(any_format(2)))
    fmt = s.format
    d1 = fmt.mode_order[1]
    n = shape[d1]
    if data.draw(st.booleans()) and n:
        ix = data.draw(st.integers(-n, n - 1))
        is_range = False
    else:
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        ix = slice(data.draw(bound), data.draw(bound), data.draw(st.sampled_from([None, 1])))
        is_range = True
    index = (slice(None), ix) if d1 == 1 else (ix, slice(None))
    walked = []
    real = shape_ops._convert
    monkeypatch.setattr(shape_ops, "_convert", lambda: walked.append(1) or real())
    got = s[index]
    if isinstance(got, scorch.SparseTensor):
        check_storage(got._storage, "the result")
    assert_matches(got, x[index], sparse=True)
    if _filterable(fmt, is_range):
        assert not walked, f"{fmt}: the general path walked every entry"
    monkeypatch.setattr(shape_ops, "_convert", real)


def test_a_range_of_columns_keeps_csr():
    x = torch.arange(1.0, 13.0).reshape(3, 4)
    got = sparse(x, "csr")[:, 1:3]
    check_storage(got._storage, "the result")
    assert got.format == scorch.Format("dc") and torch.equal(got.to_dense(), x[:, 1:3])
    assert torch.equal(got._storage.levels[1].pos, torch.tensor([0, 2, 4, 6], dtype=torch.int32))


def test_a_column_of_csr_under_autograd():
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 4.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    A = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    (A[:, 2].to_dense() * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert torch.equal(A.grad.to_dense(), torch.tensor([[0.0, 0, 1], [0, 0, 2], [0, 0, 0]],
                                                       dtype=torch.float64))
    A.grad = None
    A[:, 1:3].sum().backward()
    assert torch.equal(A.grad.to_dense(), torch.tensor([[0.0, 0, 1], [0, 1, 1], [0, 0, 0]],
                                                       dtype=torch.float64))


@FAST
@given(st.data())
def test_cat_along_the_second_level(monkeypatch, data):
    fmt = data.draw(st.sampled_from(["csr", "csc"]))
    d = 1 if fmt == "csr" else 0
    rows = data.draw(side(0, 4))
    xs = []
    for _ in range(data.draw(st.integers(1, 3))):
        shape = [rows, data.draw(side(0, 4))]
        if d == 0:
            shape.reverse()
        xs.append(data.draw(dense_values(tuple(shape), data.draw(st.sampled_from([torch.float64, torch.float32])))))
    ss = [sparse(x, fmt) for x in xs]
    walked = []
    real = shape_ops._coords
    monkeypatch.setattr(shape_ops, "_coords", lambda t: walked.append(1) or real(t))
    got = torch.cat(ss, d)
    monkeypatch.setattr(shape_ops, "_coords", real)
    check_storage(got._storage, "the result")
    assert_matches(got, torch.cat(xs, d), sparse=True)
    assert got.format == ss[0].format and not walked


def test_cat_along_the_second_level_carries_gradients():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 3.0, 4.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    A = scorch.sparse_tensor(a, format="csr", requires_grad=True)
    B = scorch.sparse_tensor(b, format="csr", requires_grad=True)
    w = torch.arange(10.0, dtype=torch.float64).reshape(2, 5)
    (torch.cat([A, B], 1).to_dense() * w).sum().backward()
    assert torch.equal(A.grad.to_dense(), w[:, :2] * (a != 0))
    assert torch.equal(B.grad.to_dense(), w[:, 2:] * (b != 0))


@FAST
@given(st.data())
def test_flip_and_triangles_of_csr_csc_move_level_arrays(monkeypatch, data):
    """``flip`` (any dims) and ``tril`` / ``triu`` of a CSR / CSC matrix: one gather or one
    mask over the level arrays (no coordinate walk, no rebuild), a valid storage in the
    same format, equal to dense torch, and differentiable in the stored values."""
    from scorch.sparse_ops import composites
    shape = (data.draw(side(0, 6)), data.draw(side(0, 6)))
    x = data.draw(dense_values(shape, data.draw(st.sampled_from([torch.float64, torch.int64]))))
    s = sparse(x, data.draw(st.sampled_from(["csr", "csc"])))
    dims = data.draw(st.lists(st.integers(-2, 1), min_size=1, max_size=2, unique_by=lambda d: d % 2))
    diagonal = data.draw(st.integers(-7, 7))
    walked = []
    real = composites._convert
    monkeypatch.setattr(composites, "_convert", lambda: walked.append(1) or real())
    for got, want in ((torch.flip(s, dims), torch.flip(x, dims)),
                      (torch.tril(s, diagonal), torch.tril(x, diagonal)),
                      (torch.triu(s, diagonal), torch.triu(x, diagonal))):
        check_storage(got._storage, "the result")
        assert got.format == s.format
        assert_matches(got, want, sparse=True)
    assert not walked
    monkeypatch.setattr(composites, "_convert", real)
    if x.dtype.is_floating_point:
        w = torch.randn(shape, dtype=x.dtype)
        for op in (lambda t: torch.flip(t, dims), lambda t: torch.tril(t, diagonal)):
            A = sparse(x, s.format).requires_grad_()
            (op(A).to_dense() * w).sum().backward()
            xd = x.clone().requires_grad_()
            (op(xd) * w).sum().backward()
            torch.testing.assert_close(A.grad.to_dense(), xd.grad * (x != 0))


@FAST
@given(st.data())
def test_index_lists_along_the_second_level(monkeypatch, data):
    """``A[:, index]`` of CSR / ``A[index]`` of CSC (and ``index_select``) for any 1-d index:
    equal to dense torch and a valid storage; an index without repeats (in order or not) is
    picked through a table over the level's coordinates, with no coordinate walk."""
    shape = (data.draw(side(0, 6)), data.draw(side(0, 6)))
    x = data.draw(dense_values(shape, data.draw(st.sampled_from([torch.float64, torch.int64]))))
    s = sparse(x, data.draw(st.sampled_from(["csr", "csc"])))
    d1 = s.format.mode_order[1]
    n = shape[d1]
    kind = data.draw(st.sampled_from(["increasing", "unique", "any"]))
    if kind in ("increasing", "unique"):
        index = sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else []
        if kind == "unique":
            index = data.draw(st.permutations(index))
    else:
        index = data.draw(st.lists(st.integers(-n, n - 1), max_size=7)) if n else []
    ix = torch.tensor(index, dtype=torch.int64)
    walked = []
    real = shape_ops._convert
    monkeypatch.setattr(shape_ops, "_convert", lambda: walked.append(1) or real())
    plain = ix % n if n else ix            # index_select takes no negative index
    for got, want in ((s.index_select(d1, plain), x.index_select(d1, plain)),
                      (s[(slice(None), ix) if d1 == 1 else ix], x[(slice(None), ix) if d1 == 1 else ix])):
        check_storage(got._storage, "the result")
        assert_matches(got, want, sparse=True)
    if kind != "any" and index:
        assert not walked
    if n:                                   # a 0-d index tensor is an int: no walk either
        walked.clear()
        j = torch.tensor(n - 1)
        got = s[(slice(None), j) if d1 == 1 else j]
        assert_matches(got, x[(slice(None), j) if d1 == 1 else j], sparse=True)
        assert not walked
    monkeypatch.setattr(shape_ops, "_convert", real)
