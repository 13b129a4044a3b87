"""Shape ops on sparse tensors against dense torch, over any format (level kinds and mode
order): reshape/view/flatten/unflatten, unsqueeze/squeeze, t/T/mT/transpose/permute (also at
the ATen level), cat/stack, indexing and index_select. They move coordinates only, so no
kernel is compiled and any format can be drawn."""
import itertools
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from ops_helpers import any_format, assert_matches, dense_values, side, sparse

FAST = settings(max_examples=40, deadline=None)


@st.composite
def sparse_case(draw, min_rank=1, max_rank=4, dtypes=(torch.float64, torch.float32, torch.int64)):
    rank = draw(st.integers(min_rank, max_rank))
    shape = tuple(draw(side(0, 4)) for _ in range(rank))
    x = draw(dense_values(shape, draw(st.sampled_from(dtypes))))
    return x, sparse(x, draw(any_format(rank)))


@st.composite
def new_shape(draw, numel: int):
    """A random shape with ``numel`` positions (with a -1 sometimes)."""
    rank = draw(st.integers(1, 4))
    if numel == 0:
        dims = [draw(st.integers(0, 3)) for _ in range(rank)]
        dims[draw(st.integers(0, rank - 1))] = 0
        return tuple(dims)
    dims, rest = [], numel
    for _ in range(rank - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    if draw(st.booleans()):
        dims[draw(st.integers(0, rank - 1))] = -1
    return tuple(dims)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sparse_case(dtypes=(torch.float64, torch.int64)), st.data())
def test_reshape_of_row_major_storage_resplits_in_place(monkeypatch, case, data):
    """A storage in row-major order (levels in dimension order, ordered) reshapes with its
    entries where they are: a valid COO, equal to dense torch, no rebuild of the levels,
    and differentiable in the values."""
    from scorch.formats import as_format
    from scorch.saving import check_storage
    from scorch.sparse_ops import shape as shape_ops
    x, s = case
    shape = data.draw(new_shape(x.numel()))
    built = []
    real = shape_ops._build
    monkeypatch.setattr(shape_ops, "_build", lambda *a, **k: built.append(1) or real(*a, **k))
    got = s.reshape(shape)
    row_major = s.format.block is None and s.format.mode_order == tuple(range(x.dim()))
    assert got is not s                          # a view, a new tensor (as torch's)
    if isinstance(got, scorch.SparseTensor) and tuple(got.shape) == tuple(s.shape):
        assert got.format == s.format            # the same shape: the same storage's view
    elif isinstance(got, scorch.SparseTensor):
        check_storage(got._storage, "the result")
        if row_major:
            assert not built
            assert got.format == as_format("coo", got.dim())
    assert_matches(got, x.reshape(shape), sparse=True)
    if x.dtype.is_floating_point and row_major:
        A = sparse(x, s.format).requires_grad_()
        w = torch.randn(x.reshape(shape).shape, dtype=x.dtype)
        (A.reshape(shape).to_dense() * w).sum().backward()
        stored = torch.zeros(x.shape, dtype=x.dtype)
        stored[tuple(A.detach().indices())] = 1          # the pattern (a dense level stores zeros)
        assert torch.equal(A.grad.to_dense(), w.reshape(x.shape) * stored)


@FAST
@given(sparse_case(), st.data())
def test_reshape_view_flatten_unflatten(case, data):
    x, s = case
    shape = data.draw(new_shape(x.numel()))
    assert_matches(s.reshape(shape), x.reshape(shape), sparse=True)
    assert_matches(torch.reshape(s, shape), x.reshape(shape))
    assert_matches(s.view(*shape), x.view(*shape))
    assert_matches(s.flatten(), x.flatten())
    a = data.draw(st.integers(-x.dim(), x.dim() - 1))
    b = data.draw(st.integers(a % x.dim(), x.dim() - 1))
    assert_matches(torch.flatten(s, a, b), torch.flatten(x, a, b))
    d = data.draw(st.integers(0, x.dim() - 1))
    if x.shape[d] > 0:
        k = data.draw(st.sampled_from([f for f in range(1, x.shape[d] + 1) if x.shape[d] % f == 0]))
        assert_matches(s.unflatten(d, (k, -1)), x.unflatten(d, (k, -1)))


@FAST
@given(sparse_case(), st.data())
def test_unsqueeze_and_squeeze_all_forms(case, data):
    x, s = case
    d = data.draw(st.integers(-x.dim() - 1, x.dim()))
    u = s.unsqueeze(d)
    assert_matches(u, x.unsqueeze(d), sparse=True)
    assert u.values().data_ptr() == s.values().data_ptr()     # a view: no copy
    assert_matches(torch.unsqueeze(s, d).squeeze(d), x)
    assert_matches(u.squeeze(), x.unsqueeze(d).squeeze())
    assert_matches(torch.squeeze(u), x.unsqueeze(d).squeeze())
    e = data.draw(st.integers(-x.dim(), x.dim() - 1))
    assert_matches(s.squeeze(e), x.squeeze(e))                # a no-op unless size 1
    dims = tuple(data.draw(st.lists(st.integers(0, x.dim()), unique=True, max_size=3)))
    assert_matches(u.squeeze(dims), x.unsqueeze(d).squeeze(dims))


@FAST
@given(sparse_case(min_rank=2), st.data())
def test_transpose_permute_are_views_at_both_levels(case, data):
    x, s = case
    perm = data.draw(st.permutations(list(range(x.dim()))))
    a, b = data.draw(st.integers(-x.dim(), x.dim() - 1)), data.draw(st.integers(0, x.dim() - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no dense fallback anywhere
        for got, expected in [
                (s.permute(perm), x.permute(perm)), (s.transpose(a, b), x.transpose(a, b)),
                (s.mT, x.mT), (s.T if x.dim() == 2 else s.permute(*reversed(range(x.dim()))),
                               x.T if x.dim() == 2 else x.permute(*reversed(range(x.dim())))),
                (torch.ops.aten.permute.default(s, perm), x.permute(perm)),
                (torch.ops.aten.transpose.int(s, a, b), x.transpose(a, b))]:
            assert_matches(got, expected, sparse=True)
            assert got.values().data_ptr() == s.values().data_ptr()
        if x.dim() == 2:
            assert_matches(torch.ops.aten.t.default(s), x.t())
            assert_matches(s.t(), x.t())


@FAST
@given(st.data())
def test_cat_and_stack(data):
    rank = data.draw(st.integers(1, 3))
    base = [data.draw(side(0, 3)) for _ in range(rank)]
    dim = data.draw(st.integers(-rank, rank - 1))
    xs, ss = [], []
    for _ in range(data.draw(st.integers(1, 3))):
        shape = list(base)
        shape[dim] = data.draw(side(0, 3))
        x = data.draw(dense_values(tuple(shape)))
        xs.append(x)
        ss.append(sparse(x, data.draw(any_format(rank))))
    got = torch.cat(ss, dim)
    assert_matches(got, torch.cat(xs, dim), sparse=True)
    assert got.format.levels == ss[0].format.levels        # the first operand's format
    sdim = data.draw(st.integers(-rank - 1, rank))
    same = [sparse(xs[0], s.format) for s in ss]            # stack needs equal shapes
    assert_matches(torch.stack(same, sdim), torch.stack([xs[0]] * len(ss), sdim), sparse=True)
    # a dense operand makes the result dense (as torch)
    assert_matches(torch.cat([ss[0], xs[0]], dim), torch.cat([xs[0], xs[0]], dim), sparse=False)


@st.composite
def index_expr(draw, shape):
    """A torch index: ints (negative too), slices with positive steps and any start/stop,
    None, one Ellipsis, and either one 1-D index tensor or bool mask, several 1-D index
    tensors that broadcast (length L or 1), or one mask over the leading dimensions."""
    mode = draw(st.sampled_from(["single", "multi", "mask"]))
    length = draw(st.integers(0, 4))
    items, tensor_used = [], False
    start = 0
    if mode == "mask" and shape:
        m = draw(st.integers(1, len(shape)))
        items.append(draw(dense_values(shape[:m])) != 0)
        start = m
    for n in shape[start:]:
        kind = draw(st.sampled_from(["int", "slice", "slice", "none", "tensor", "mask"]))
        if kind == "int" and n > 0:
            items.append(draw(st.integers(-n, n - 1)))
        elif kind in ("tensor", "mask") and mode == "multi" and n > 0:
            k = draw(st.sampled_from([length, 1]))
            items.append(torch.tensor(draw(st.lists(st.integers(-n, n - 1), min_size=k,
                                                    max_size=k)), dtype=torch.int64))
        elif kind in ("tensor", "mask") and mode == "single" and not tensor_used:
            tensor_used = True
            if kind == "tensor" and n > 0:
                items.append(torch.tensor(draw(st.lists(st.integers(-n, n - 1), max_size=5)),
                                          dtype=torch.int64))
            else:
                items.append(torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                                          dtype=torch.bool))
        elif kind == "none":
            items.extend([None, slice(None)])
        else:
            bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
            items.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3]))))
    if items and draw(st.booleans()):   # replace a run of trailing full slices by ...
        cut = draw(st.integers(0, len(items)))
        if all(isinstance(i, slice) and i == slice(None) for i in items[cut:]):
            items = items[:cut] + [Ellipsis]
    return tuple(items)


@settings(max_examples=80, deadline=None)
@given(sparse_case(max_rank=3), st.data())
def test_indexing_matches_dense(case, data):
    x, s = case
    index = data.draw(index_expr(tuple(x.shape)))
    expected = x[index]
    got = s[index]
    assert_matches(got, expected, sparse=expected.dim() > 0)


@FAST
@given(sparse_case(max_rank=3), st.data())
def test_index_select_matches_dense(case, data):
    x, s = case
    d = data.draw(st.integers(-x.dim(), x.dim() - 1))
    n = x.shape[d]
    idx = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=6)) if n else [],
                       dtype=torch.int64)
    assert_matches(torch.index_select(s, d, idx), torch.index_select(x, d, idx), sparse=True)
    assert_matches(s.index_select(d, idx.int()), x.index_select(d, idx.int()))


def test_shape_errors_are_torchs():
    s = sparse(torch.eye(3), "csr")
    with pytest.raises(IndexError, match="out of bounds"):
        s[3]
    with pytest.raises(IndexError, match="out of bounds"):
        s[:, torch.tensor([0, 5])]
    with pytest.raises(ValueError, match="step"):
        s[::-1]
    with pytest.raises(RuntimeError, match="invalid"):
        s.reshape(4, 2)
    with pytest.raises(IndexError, match="too many"):
        s[0, 0, 0]
    with pytest.raises(RuntimeError, match="sizes of tensors must match"):
        torch.cat([s, sparse(torch.eye(2), "csr")])
    with pytest.raises(RuntimeError, match="t\\(\\) expects"):
        sparse(torch.ones(2, 2, 2), "coo").t()


def test_dimensions_beyond_int32_use_int64_coordinates():
    n = 3_000_000_000
    idx = torch.tensor([[0, 5, n - 1], [n - 2, 7, 1]])
    s = scorch.sparse_tensor((idx, torch.tensor([1.0, 2.0, 3.0])), size=(n, n), format="coo")
    flat = s.flatten()
    assert flat.shape == (n * n,)
    assert torch.equal(flat.indices()[0].sort().values,
                       (idx[0] * n + idx[1]).sort().values)
    back = flat.reshape(n, n)
    assert torch.equal(back.indices(), s.indices()) and torch.equal(back.values(), s.values())
    part = s[n - 10:, 1::2]
    assert part.shape == (10, n // 2) and part.nnz == 1
    assert torch.equal(part.indices(), torch.tensor([[9], [0]])) and float(part.values()[0]) == 3.0
    sel = s.index_select(1, torch.tensor([n - 2, 1]))
    assert torch.equal(sel.indices(), torch.tensor([[0, n - 1], [0, 1]]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sparse_case(min_rank=1, max_rank=3), st.data())
def test_points_and_row_first_indexing_skip_the_coordinate_filter(monkeypatch, case, data):
    """``A[i, j]`` (an int for every dim) is a search down the levels and ``A[i, cols]`` /
    ``A[a:b, j]`` take the first stored level's part first: neither lists every stored
    coordinate (the general path's filter), so ``A[5, 7]`` of a 1M-entry CSR matrix costs a
    row, not the matrix. Each result equals dense torch's, and its gradient too."""
    x, s = case
    if x.numel() == 0:
        return
    from scorch.sparse_ops import shape as shape_ops
    point = tuple(data.draw(st.integers(-n, n - 1)) for n in x.shape)
    first = s._storage.levels[0].dim if s._storage.levels else 0
    rest = tuple(slice(None) if d == first else data.draw(st.integers(0, n - 1))
                 for d, n in enumerate(x.shape))
    row_first = tuple(data.draw(st.integers(0, n - 1)) if d == first else i
                      for d, (i, n) in enumerate(zip(rest, x.shape)))
    blocked = s._storage.format.block is not None
    with monkeypatch.context() as m:
        if not blocked:
            m.setattr(shape_ops, "_convert", lambda: (_ for _ in ()).throw(
                AssertionError("the general path listed every coordinate")))
        got = s[point]
        assert got.dim() == 0 and got.dtype == x.dtype and got.item() == x[point].item()
        if x.dim() >= 2:
            assert_matches(s[row_first], x[row_first], sparse=x[row_first].dim() > 0)
    if x.dtype.is_floating_point:
        g = s.detach().clone().requires_grad_()
        (g[point] * 3).backward()
        grad = g.grad.to_dense()
        assert grad[point] == (3 if x[point] != 0 else grad[point]) and grad.sum() == grad[point]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["csr", "csc"]), st.integers(0, 6), st.integers(1, 6), st.data())
def test_stepped_slices_and_repeated_picks_follow_the_levels(monkeypatch, fmt, rows, cols, data):
    """``A[::k]``, ``A[:, ::k]`` and ``A[:, idx]`` with repeats of CSR / CSC gather segments
    or pick entries through a table (no listing of every coordinate, which had made them
    5-80x scipy's time); each equals dense torch's result, and its gradient too."""
    from scorch.sparse_ops import shape as shape_ops
    x = data.draw(dense_values((rows, cols), torch.float64))
    s = sparse(x, fmt)
    step = data.draw(st.integers(2, 4))
    a = data.draw(st.one_of(st.none(), st.integers(-7, 7)))
    b = data.draw(st.one_of(st.none(), st.integers(-7, 7)))
    repeats = torch.tensor(data.draw(st.lists(st.integers(0, cols - 1), min_size=1, max_size=8)))
    indices = [(slice(a, b, step),), (slice(None), slice(a, b, step)), (slice(None), repeats),
               (slice(a, b, step), repeats)]
    with monkeypatch.context() as m:
        m.setattr(shape_ops, "_convert", lambda: (_ for _ in ()).throw(
            AssertionError("the general path listed every coordinate")))
        for index in indices:
            assert_matches(s[index], x[index], sparse=True)
    g = s.detach().clone().requires_grad_()
    weight = torch.rand(x[:, repeats].shape, dtype=x.dtype)
    (g[:, repeats].to_dense() * weight).sum().backward()
    d = x.clone().requires_grad_()
    (d[:, repeats] * weight).sum().backward()
    assert torch.allclose(g.grad.to_dense(), d.grad * (x != 0))


@pytest.mark.parametrize("shape", [(0, 0, 0), (2, 0, 3), (3, 2, 0)])
def test_values_of_a_permuted_hybrid_with_an_empty_dense_dim(shape):
    """A dense dim of size 0 stores no value, so torch's index-tuple count is read from
    the last sparse level's positions, which a permuted mode order can make a dense level
    (it had read that level's coordinates, which a dense level has none of)."""
    x = torch.zeros(*shape, dtype=torch.float64)
    s = scorch.sparse_tensor(x, format=scorch.Format("cdd"))
    for perm in itertools.permutations(range(3)):
        p = s.permute(perm)
        assert p.values().numel() == 0
        assert p.indices().shape[1] == p.values().shape[0]
        assert torch.equal(p.to_dense(), x.permute(perm))
