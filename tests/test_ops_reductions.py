"""sum / mean / torch.sparse.sum on sparse tensors against dense torch: all dims, int dims,
tuples, negative dims, keepdim, dtype, empty and full tensors, ranks 1-3."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from ops_helpers import assert_matches, dense_values, side, sparse

FAST = settings(max_examples=30, deadline=None)

# each (rank, dims, format, dtype) is its own kernel: a few formats keep the suite fast (the
# compiler's own tests cover reductions over every format)
FORMATS = {1: ["coo"], 2: ["csr", "coo"], 3: ["coo"]}


@st.composite
def reduction_case(draw, dtypes=(torch.float64, torch.float32), max_rank=3):
    rank = draw(st.integers(1, max_rank))
    shape = tuple(draw(side()) for _ in range(rank))
    dtype = draw(st.sampled_from(dtypes))
    x = draw(dense_values(shape, dtype))
    fmt = draw(st.sampled_from(FORMATS[rank]))
    form = draw(st.sampled_from(["all", "int", "tuple"]))
    if form == "all":
        dim = None
    elif form == "int":
        dim = draw(st.integers(-rank, rank - 1))
    else:
        dim = tuple(draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                                  unique_by=lambda d: d % rank)))
    return x, sparse(x, fmt), dim


@FAST
@given(reduction_case(dtypes=(torch.float64,)), st.booleans())
def test_sum_matches_dense(case, keepdim):
    x, s, dim = case
    if dim is None:
        assert_matches(s.sum(), x.sum(), sparse=False)
        assert_matches(torch.sum(s), x.sum())
    else:
        assert_matches(torch.sum(s, dim, keepdim=keepdim), torch.sum(x, dim, keepdim=keepdim))
        assert_matches(s.sum(dim=dim, keepdim=keepdim), x.sum(dim=dim, keepdim=keepdim))


@settings(max_examples=10, deadline=None)
@given(reduction_case(dtypes=(torch.int64, torch.float32), max_rank=2))
def test_sum_dtype_and_integer_accumulation(case):
    x, s, dim = case
    # integers sum in int64 (as torch); dtype= casts before summing
    assert_matches(s.sum(dim) if dim is not None else s.sum(), x.sum(dim) if dim is not None else x.sum())
    assert_matches(s.sum(dtype=torch.float64), x.sum(dtype=torch.float64))


@FAST
@given(reduction_case(dtypes=(torch.float64,)), st.booleans())
def test_mean_matches_dense(case, keepdim):
    x, s, dim = case
    dims = range(x.dim()) if dim is None else [d % x.dim() for d in
                                                ((dim,) if isinstance(dim, int) else dim)]
    if any(x.shape[d] == 0 for d in dims):
        return  # a mean over nothing is NaN everywhere: not a sparse result (tested below)
    if dim is None:
        assert_matches(s.mean(), x.mean())
    else:
        assert_matches(torch.mean(s, dim, keepdim=keepdim), torch.mean(x, dim, keepdim=keepdim))


def test_mean_errors_and_dtype():
    s = sparse(torch.tensor([[1, 0], [0, 3]]), "csr")
    with pytest.raises(RuntimeError, match="mean"):
        s.mean()
    assert_matches(s.mean(dtype=torch.float64), torch.tensor([[1, 0], [0, 3.]]).double().mean())


@FAST
@given(reduction_case(dtypes=(torch.float64,)))
def test_torch_sparse_sum_follows_torch(case):
    x, s, dim = case
    expected = torch.sparse.sum(x.to_sparse(), dim) if dim is not None else \
        torch.sparse.sum(x.to_sparse())
    got = torch.sparse.sum(s, dim) if dim is not None else torch.sparse.sum(s)
    full = dim is None or len({d % x.dim() for d in ((dim,) if isinstance(dim, int) else dim)}) \
        == x.dim()
    if full:   # a full reduction is a 0-d dense tensor
        assert_matches(got, expected, sparse=False)
    else:      # else a sparse tensor over the remaining dims (torch: COO)
        assert isinstance(got, scorch.SparseTensor) and got.format.name == "coo"
        assert_matches(got, expected.to_dense(), sparse=True)
    assert_matches(scorch.sparse.sum(s, dtype=torch.float32), torch.sparse.sum(
        x.to_sparse(), dtype=torch.float32))


def test_reductions_reject_bad_dims():
    s = sparse(torch.eye(3).double(), "csr")
    with pytest.raises(IndexError, match="out of range"):
        s.sum(2)
    with pytest.raises(RuntimeError, match="multiple times"):
        s.sum((0, -2))
    with pytest.raises(IndexError, match="out of range"):
        torch.sparse.sum(s, 5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(["csr", "coo", "csc"]), st.sampled_from([torch.float32, torch.float64, torch.int64]))
def test_sum_down_to_a_sparse_vector_keeps_every_stored_position(data, fmt, dtype):
    """A matrix summed over its outer level (CSR ``sum(0)``, CSC ``sum(1)``): a dense
    accumulation pass, compressed to the positions where entries are stored, also where
    they cancel (the convention of the sparse path)."""
    m, n = data.draw(side(0, 6)), data.draw(side(0, 6))
    x = data.draw(dense_values((m, n), dtype))
    dim = 1 if fmt == "csc" else 0
    if m >= 2 and n >= 1 and data.draw(st.booleans()):   # a column that sums to 0
        x[0, 0], x[1, 0] = 1, -1
    s = sparse(x, fmt)
    got = s.sum(dim)
    assert_matches(got, x.sum(dim), sparse=True)
    # an entry wherever a stored entry falls (the last level's distinct coordinates)
    assert got.nnz == len(set(s._storage.levels[-1].crd.tolist()))


def test_sum_positions_follow_changes_of_the_index_array():
    """The stored positions are kept for the index array while its version is unchanged."""
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    s = sparse(x, "csr")
    assert s.sum(0).indices().tolist() == [[0, 2]]
    s._storage.levels[-1].crd[0] = 1          # move an entry: a new version of the array
    assert s.sum(0).indices().tolist() == [[1, 2]]
    assert torch.equal(s.sum(0).to_dense(), torch.tensor([0.0, 1.0, 5.0]))


def test_mean_over_an_empty_dimension_is_nan_as_torch():
    """0 / 0 at every position: dense by nature, NaN as dense torch (it raised before; found by
    a random op chain), and in the graph."""
    for shape, dim in (((0, 3, 2), 0), ((0, 3, 2), (0, 1)), ((4, 0), 1)):
        x = torch.zeros(shape, dtype=torch.float64)
        X = scorch.sparse_tensor(x, format="coo", requires_grad=True)
        got, want = X.mean(dim), x.mean(dim)
        assert type(got) is torch.Tensor and got.shape == want.shape
        assert torch.isnan(got).all() and got.requires_grad
        got.sum().backward()
        assert X.grad.nnz == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.data())
def test_count_nonzero_and_full_extremes_with_stored_zeros(rank, data):
    """``count_nonzero`` counts by coordinates (no kernel) and ``amax()`` / ``amin()`` over
    everything reduce the values: a stored zero is not counted, an unstored one takes part
    in the extreme, in every format of each rank."""
    shape = tuple(data.draw(side()) for _ in range(rank))
    x = data.draw(dense_values(shape, data.draw(st.sampled_from([torch.float64, torch.int64]))))
    fmt = data.draw(st.sampled_from({1: ["coo", "c"], 2: ["csr", "csc", "coo", "dcsr", "dense"],
                                     3: ["coo", "csf"]}[rank]))
    s = sparse(x, fmt)
    if s.nnz and data.draw(st.booleans()):
        s._storage.values[data.draw(st.integers(0, s.nnz - 1))] = 0   # a stored zero
    x = s.to_dense()
    dims = [None] + list(range(-rank, rank)) + ([(0, rank - 1)] if rank > 1 else [])
    for dim in dims:
        got, want = torch.count_nonzero(s, dim), torch.count_nonzero(x, dim)
        assert got.dtype == want.dtype and torch.equal(got, want)
    if x.numel():
        for f in (torch.amax, torch.amin):
            got, want = f(s), f(x)
            assert got.dtype == want.dtype and torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.sampled_from([torch.float32, torch.uint8, torch.bool, torch.int64]),
       st.booleans(), st.data())
def test_any_all_along_dims(rank, dtype, keepdim, data):
    """``any`` / ``all`` along dims from the fibers' nonzero counts (no dense fallback: its
    limit is 0 here), torch's dtypes (uint8 in, uint8 out) and shapes."""
    shape = tuple(data.draw(side()) for _ in range(rank))
    x = data.draw(dense_values(shape, dtype))
    s = sparse(x, data.draw(st.sampled_from({1: ["coo"], 2: ["csr", "csc", "coo"],
                                             3: ["coo"]}[rank])))
    dims = list(range(-rank, rank)) + ([(0, rank - 1)] if rank > 1 else [])
    scorch.set_dense_fallback_limit(0)
    try:
        for f in (torch.any, torch.all, torch.Tensor.any, torch.Tensor.all):
            got, want = f(s), f(x)
            assert got.dtype == want.dtype and torch.equal(got, want)
            for dim in dims:
                got, want = f(s, dim, keepdim=keepdim), f(x, dim, keepdim=keepdim)
                assert got.dtype == want.dtype and torch.equal(got, want)
    finally:
        scorch.set_dense_fallback_limit(None)


def test_nanmean_along_dims_stays_sparse():
    """``nanmean`` along dims of a tensor whose sum stays sparse divides by the extent and
    corrects only the fibers holding NaNs (the count ``extent - nans`` is dense by nature:
    it had taken the dense fallback); each result equals dense torch's."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, 5, dtype=torch.float64, generator=g)
    x[x < 0.5] = 0
    x[x > 0.9] = float("nan")
    s = sparse(x, "coo")
    for dim in (0, 1, 2, (0, 1), (1, 2)):
        for keepdim in (False, True):
            got = torch.nanmean(s, dim, keepdim=keepdim)
            got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
            assert torch.allclose(got, torch.nanmean(x, dim, keepdim=keepdim), equal_nan=True)
    n = 10 ** 6
    huge = scorch.sparse_tensor((torch.tensor([[0, 5, 9], [1, 2, 3], [4, 4, 4]]),
                                 torch.tensor([1.0, float("nan"), 3.0])), size=(n, n, n),
                                format="coo")
    scorch.set_dense_fallback_limit(0)
    try:
        r = torch.nanmean(huge, 0)
    finally:
        scorch.set_dense_fallback_limit(None)
    assert isinstance(r, scorch.SparseTensor) and r.nnz == 3
