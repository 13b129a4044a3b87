"""Property tests of the Cython conversion runtime against the numpy reference model.

Every storage the runtime builds must be *identical* (same pos/crd/values arrays, same
index dtype) to what ``tests/reference_storage.py`` builds, and must densify to the same
tensor; formats are drawn at random (any rank 1-4, any mix of level kinds, any mode order,
blocked 2-d formats), so no named-format special case can hide a gap.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorch.formats import Format
from scorch.level_storage import Level, Storage
from scorch._runtime import convert as C

from reference_storage import (reference_coords, reference_from_coords, reference_from_dense,
                               reference_to_dense)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool]


def assert_same_storage(got: Storage, want: Storage) -> None:
    assert got.format == want.format
    assert got.shape == want.shape
    assert got.index_dtype == want.index_dtype, (got.index_dtype, want.index_dtype)
    assert len(got.levels) == len(want.levels)
    for k, (a, b) in enumerate(zip(got.levels, want.levels)):
        assert (a.kind, a.dim, a.size, a.block_inner) == (b.kind, b.dim, b.size, b.block_inner), k
        for name in ("pos", "crd"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), f"level {k} {name}"
            if x is not None:
                assert x.dtype == y.dtype == want.index_dtype, f"level {k} {name} dtype"
                assert x.is_contiguous() and x.dim() == 1
                assert torch.equal(x, y), f"level {k} {name}: {x} != {y}"
    assert got.values.dtype == want.values.dtype
    same = torch.equal(got.values, want.values) or (
        got.values.is_floating_point() and got.values.shape == want.values.shape
        and torch.allclose(got.values, want.values, rtol=0, atol=0, equal_nan=True))
    assert same, f"values {got.values} != {want.values}"


@st.composite
def formats(draw, rank=None, allow_block=True):
    rank = rank if rank is not None else draw(st.integers(1, 4))
    levels = draw(st.text(alphabet="dcq", min_size=rank, max_size=rank))
    order = draw(st.permutations(range(rank)))
    block = None
    if allow_block and rank == 2 and draw(st.integers(0, 3)) == 0:
        block = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return Format(levels, order, block)


@st.composite
def shapes_for(draw, fmt):
    blk = fmt.block or (1,) * fmt.rank
    return tuple(draw(st.integers(0, 4 if fmt.rank <= 2 else 3)) * b for b in blk)


def random_dense(seed, shape, dtype, density):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < density
    if dtype == torch.bool:
        return mask
    vals = torch.randint(-5, 6, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        vals = vals + torch.rand(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.where(mask, vals, torch.zeros((), dtype=dtype))


densities = st.sampled_from([0.0, 0.15, 0.5, 1.0])


@settings(max_examples=150, **SETTINGS)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), density=densities, seed=st.integers(0, 2**31))
def test_from_dense_matches_reference(data, dtype, density, seed):
    fmt = data.draw(formats())
    shape = data.draw(shapes_for(fmt))
    x = random_dense(seed, shape, dtype, density)
    got = C.from_dense(x, fmt)
    want = reference_from_dense(x, fmt)
    assert_same_storage(got, want)
    assert torch.equal(C.to_dense(got), x)
    assert torch.equal(C.coords(got), torch.from_numpy(reference_coords(want)))


@settings(max_examples=120, **SETTINGS)
@given(rows=st.integers(0, 5), cols=st.integers(0, 70), dtype=st.sampled_from([torch.float32, torch.float64]),
       density=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), order=st.sampled_from([(0, 1), (1, 0)]),
       specials=st.booleans(), seed=st.integers(0, 2**31))
def test_from_dense_long_rows(rows, cols, dtype, density, order, specials, seed):
    """Rows long enough for the packed fill (pack_nonzeros.h: 8 / 4 elements at a time, and
    the scalar tail once fewer than a block of the row's slots remain), with NaN (stored)
    and -0.0 (not stored) among the elements."""
    x = random_dense(seed, (rows, cols), dtype, density)
    if specials and x.numel() >= 3:
        flat = x.view(-1)
        flat[0], flat[x.numel() // 2], flat[-1] = float("nan"), -0.0, 3.0
    fmt = Format("dc", order)
    got = C.from_dense(x, fmt)
    want = reference_from_dense(x, fmt)
    assert_same_storage(got, want)
    assert torch.equal(torch.nan_to_num(C.to_dense(got), nan=7.0), torch.nan_to_num(x, nan=7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_dense_packed_rows_on_two_threads(dtype):
    """Past the one-thread threshold the rows are packed in parallel: no row's block store
    may reach into the next row's slots."""
    x = random_dense(7, (301, 403), dtype, 0.3)
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = C.from_dense(x, Format("dc"))
    finally:
        torch.set_num_threads(prev)
    assert_same_storage(got, reference_from_dense(x, Format("dc")))


@settings(max_examples=200, **SETTINGS)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), density=densities, seed=st.integers(0, 2**31))
def test_convert_matches_reference(data, dtype, density, seed):
    src_fmt = data.draw(formats())
    shape = data.draw(shapes_for(src_fmt))
    blk = src_fmt.block
    dst_fmt = data.draw(formats(rank=src_fmt.rank, allow_block=False))
    if src_fmt.rank == 2 and data.draw(st.booleans()):
        # another block size that also divides the shape
        opts = [b for b in itertools.product(range(1, 4), repeat=2)
                if all(s % bb == 0 for s, bb in zip(shape, b))]
        dst_fmt = Format(dst_fmt.levels, dst_fmt.mode_order, data.draw(st.sampled_from(opts)))
    x = random_dense(seed, shape, dtype, density)
    src = C.from_dense(x, src_fmt)
    got = C.convert(src, dst_fmt)
    # stored zeros of the source (dense levels) are kept: the oracle gets every stored value
    want = reference_from_coords(C.coords(src).numpy(), src.values, shape, dst_fmt)
    assert_same_storage(got, want)
    assert torch.equal(C.to_dense(got), x)
    assert torch.equal(reference_to_dense(got), x)
    if dst_fmt == src_fmt:
        assert got is src


@settings(max_examples=150, **SETTINGS)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31),
       n=st.integers(0, 40))
def test_from_coords_duplicates_unsorted(data, dtype, seed, n):
    fmt = data.draw(formats())
    shape = data.draw(shapes_for(fmt))
    if 0 in shape:
        n = 0
    rng = np.random.default_rng(seed)
    # few distinct coordinates so that duplicates are common; random (unsorted) order
    base = np.stack([rng.integers(0, max(s, 1), size=max(1, n // 3)) for s in shape])
    idx = base[:, rng.integers(0, base.shape[1], size=n)] if n else np.zeros((len(shape), 0), np.int64)
    vals = torch.from_numpy(rng.normal(size=n)).to(dtype) if dtype != torch.bool \
        else torch.from_numpy(rng.random(n) < 0.5)
    if dtype in (torch.int32, torch.int64):
        vals = torch.from_numpy(rng.integers(-9, 10, size=n)).to(dtype)
    index_type = data.draw(st.sampled_from([np.int64, np.int32, "torch"]))
    indices = torch.from_numpy(idx) if index_type == "torch" else idx.astype(index_type)
    got = C.from_coords(indices, vals, shape, fmt)
    want = reference_from_coords(idx, vals, shape, fmt)
    assert_same_storage(got, want)
    dense = torch.zeros(shape, dtype=torch.float64)
    if n:
        dense.index_put_(tuple(torch.from_numpy(r) for r in idx), vals.to(torch.float64), accumulate=True)
    if dtype.is_floating_point:
        torch.testing.assert_close(C.to_dense(got).double(), dense, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(C.to_dense(got), dense.to(dtype) if dtype != torch.bool else dense != 0)


def _with_int64_arrays(s: Storage) -> Storage:
    levels = [Level(lv.kind, lv.dim, lv.size,
                    None if lv.pos is None else lv.pos.long(),
                    None if lv.crd is None else lv.crd.long(), lv.block_inner) for lv in s.levels]
    return Storage(s.format, s.shape, levels, s.values, torch.int64)


@settings(max_examples=60, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_int64_input_arrays_are_accepted(data, seed):
    src_fmt = data.draw(formats())
    shape = data.draw(shapes_for(src_fmt))
    dst_fmt = data.draw(formats(rank=src_fmt.rank, allow_block=False))
    x = random_dense(seed, shape, torch.float32, 0.3)
    src = _with_int64_arrays(C.from_dense(x, src_fmt))
    assert torch.equal(C.to_dense(src), x)
    assert torch.equal(C.coords(src), torch.from_numpy(reference_coords(src)))
    got = C.convert(src, dst_fmt)
    want = reference_from_coords(reference_coords(src), src.values, shape, dst_fmt)
    if dst_fmt != src_fmt:
        assert_same_storage(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
                                   torch.int8, torch.uint8, torch.int16])
def test_other_value_dtypes_round_trip(dtype):
    x = random_dense(3, (6, 5, 4), torch.float64, 0.3)
    x = (x * 3).to(dtype) if not dtype.is_complex else torch.complex(x, x.flip(0)).to(dtype)
    for fmt in (Format("dcc"), Format("qqq", (2, 0, 1)), Format("cdd", (1, 2, 0))):
        s = C.from_dense(x, fmt)
        assert s.dtype == dtype
        assert torch.equal(C.to_dense(s), x)
        assert torch.equal(C.to_dense(C.convert(s, Format("cdc", (2, 1, 0)))), x)
    # duplicates are summed in a type wide enough for the sum
    s = C.from_coords(torch.tensor([[0, 1, 0], [2, 2, 2]]), torch.ones(3, dtype=dtype), (2, 3),
                      Format("dc"))
    assert s.values.tolist() == torch.tensor([2, 1], dtype=dtype).tolist()


def test_strided_inputs():
    base = random_dense(7, (9, 12, 6), torch.float64, 0.4)
    views = [base.transpose(0, 2), base[::2, 1::3], base.permute(1, 2, 0)[:, 1:, :],
             base[3], base[:, 4, ::2], base.expand(2, 9, 12, 6)[:, ::3]]
    for x in views:
        for fmt in (Format("c" * x.dim()), Format("d" * (x.dim() - 1) + "c", tuple(reversed(range(x.dim())))),
                    Format("q" * x.dim())):
            got = C.from_dense(x, fmt)
            assert_same_storage(got, reference_from_dense(x.contiguous(), fmt))
            assert torch.equal(C.to_dense(got), x)


def test_large_matches_scipy():
    """Big enough for the parallel (multi-thread) counting-sort and scan paths."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(1)
    m, n, nnz = 3000, 2000, 200_000
    a = sp.random(m, n, density=nnz / (m * n), format="coo", random_state=rng, dtype=np.float32)
    # unsorted COO with duplicates
    r = np.concatenate([a.row, a.row[:5000]])
    c = np.concatenate([a.col, a.col[:5000]])
    v = np.concatenate([a.data, a.data[:5000]])
    perm = rng.permutation(len(r))
    r, c, v = r[perm], c[perm], v[perm]
    csr_ref = sp.coo_array((v, (r, c)), shape=(m, n)).tocsr()
    csr_ref.sum_duplicates()
    csr_ref.sort_indices()
    s = C.from_coords(np.stack([r, c]), torch.from_numpy(v), (m, n), Format("dc"))
    assert np.array_equal(s.levels[1].pos.numpy(), csr_ref.indptr)
    assert np.array_equal(s.levels[1].crd.numpy(), csr_ref.indices)
    np.testing.assert_allclose(s.values.numpy(), csr_ref.data, rtol=1e-6)
    csc = C.convert(s, Format("dc", (1, 0)))
    csc_ref = csr_ref.tocsc()
    csc_ref.sort_indices()
    assert np.array_equal(csc.levels[1].pos.numpy(), csc_ref.indptr)
    assert np.array_equal(csc.levels[1].crd.numpy(), csc_ref.indices)
    assert np.array_equal(csc.values.numpy(), csc_ref.data)
    dense = torch.from_numpy(csr_ref.toarray())
    assert_same_storage(C.from_dense(dense, Format("dc")), s)
    assert_same_storage(C.from_dense(dense.t(), Format("dc", (1, 0))),
                        C.convert(s, Format("dc", (0, 1))).__class__(
                            Format("dc", (1, 0)), (n, m), [Level(lv.kind, 1 - lv.dim, lv.size, lv.pos, lv.crd)
                                                           for lv in s.levels], s.values))
    coo = C.convert(s, Format("qq"))
    back = C.convert(coo, Format("dc"))
    assert_same_storage(back, s)
    assert back.values.data_ptr() == coo.values.data_ptr()  # sorted COO -> CSR shares values
    assert torch.equal(C.coords(csc), torch.from_numpy(reference_coords(csc)))
    assert torch.equal(C.to_dense(csc), dense)


def test_huge_dimensions_use_int64_and_comparison_sort():
    big = 3_000_000_000
    idx = torch.tensor([[5, big - 1, 5, 0], [7, 2, 7, big - 2]])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for fmt in (Format("qq"), Format("cc", (1, 0)), Format("qq", (1, 0))):
        s = C.from_coords(idx, vals, (big, big), fmt)
        assert s.index_dtype == torch.int64
        assert_same_storage(s, reference_from_coords(idx.numpy(), vals, (big, big), fmt))
    s = C.from_coords(idx, vals, (big, big), Format("qq"))
    t = C.convert(s, Format("cc", (1, 0)))
    assert_same_storage(t, reference_from_coords(idx.numpy(), vals, (big, big), Format("cc", (1, 0))))


def test_sum_duplicates_false():
    idx = torch.tensor([[0, 1, 1], [2, 0, 1]])
    s = C.from_coords(idx, torch.ones(3), (2, 3), Format("dc"), sum_duplicates=False)
    assert_same_storage(s, reference_from_coords(idx.numpy(), torch.ones(3), (2, 3), Format("dc")))
    with pytest.raises(ValueError, match="duplicate"):
        C.from_coords(torch.tensor([[1, 0, 1], [1, 0, 1]]), torch.ones(3), (2, 3), Format("dc"),
                      sum_duplicates=False)


@pytest.mark.parametrize("indices, values, size, match", [
    (torch.zeros(3, dtype=torch.long), torch.ones(3), (4, 4), "indices must be 2-d"),
    (torch.zeros((3, 2), dtype=torch.long), torch.ones(2), (4, 4), "indices has 3 rows"),
    (torch.zeros((2, 2)), torch.ones(2), (4, 4), "indices must have an integer dtype"),
    (torch.tensor([[0, 1], [0, 4]]), torch.ones(2), (4, 4), r"indices out of range in dimension 1: coordinate 4"),
    (torch.tensor([[0, -1], [0, 1]]), torch.ones(2), (4, 4), r"indices out of range in dimension 0: coordinate -1"),
    (torch.tensor([[0, 1], [0, 1]]), torch.ones(3), (4, 4), "values has 3 entries but indices has 2"),
    (torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 1), (4, 4), "values must be 1-d"),
    (torch.tensor([[0, 1], [0, 1]]), torch.ones(2), (4, -4), r"size\[1\] = -4 is negative"),
    (torch.tensor([[0, 1], [0, 1]]), torch.ones(2), (4, 2.5), r"size\[1\] = 2.5 is not an int"),
    (torch.tensor([[0, 1], [0, 1]]), torch.ones(2), (float("nan"), 4), r"size\[0\] is NaN"),
])
def test_from_coords_errors_name_the_argument(indices, values, size, match):
    with pytest.raises(ValueError, match=match):
        C.from_coords(indices, values, size, Format("dc"))


def test_other_errors():
    with pytest.raises(TypeError, match="values of dtype torch.float8_e4m3fn"):
        C.from_coords(torch.zeros((1, 1), dtype=torch.long), torch.zeros(1, dtype=torch.float8_e4m3fn),
                      (2,), Format("c"))
    with pytest.raises(ValueError, match="not divisible by the block size"):
        C.from_dense(torch.ones(5, 4), Format("dc", block=(2, 2)))
    with pytest.raises(ValueError, match="has 2 levels but the tensor has 3"):
        C.from_dense(torch.ones(2, 2, 2), Format("dc"))
    with pytest.raises(ValueError, match="has 2 levels but the tensor has 1"):
        C.convert(C.from_dense(torch.ones(3), Format("c")), Format("dc"))


@pytest.mark.parametrize("src_levels", ["dc", "cc"])
@pytest.mark.parametrize("dst_levels", ["dc", "cc", "dq", "cq", "dd", "cd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.complex128, torch.int8])
def test_transpose_path(src_levels, dst_levels, dtype):
    """2-level compressed sources converted to the other dimension order (the fused
    counting-sort transpose), for every value size it moves."""
    x = random_dense(11, (7, 9), torch.float64, 0.3)
    x[2] = 0  # an empty row and column
    x[:, 4] = 0
    x = x.to(dtype) if dtype != torch.bool else x != 0
    for order in [(0, 1), (1, 0)]:
        src = C.from_dense(x, Format(src_levels, order))
        dst_fmt = Format(dst_levels, order[::-1])
        got = C.convert(src, dst_fmt)
        if dtype in (torch.complex128, torch.int8):
            assert torch.equal(C.to_dense(got), x)
            continue
        assert_same_storage(got, reference_from_coords(reference_coords(src), src.values, x.shape, dst_fmt))


@pytest.mark.parametrize("key_dtype, out_dtype", [(torch.int32, torch.int32), (torch.int64, torch.int32),
                                                  (torch.int64, torch.int64), (torch.int32, torch.int64)])
def test_dense_root_row_pointer_any_team(key_dtype, out_dtype):
    """The one-pass row pointer of sorted keys (COO -> CSR): every team size must give
    searchsorted's answer, also when a chunk boundary falls inside a long row, chunks are
    empty, or rows are empty at the start, the end and in runs."""
    rng = np.random.default_rng(5)
    cases = [np.sort(rng.integers(0, 50, 1000)),                          # short rows, few gaps
             np.sort(rng.integers(10, 40, 997)),                           # empty rows at both ends
             np.repeat([3, 4, 40], [2, 900, 5]),                           # one row spans every chunk
             np.sort(np.concatenate([rng.integers(0, 5, 50), rng.integers(60, 64, 50)])),
             np.array([7]), np.array([0, 0, 0]), np.zeros(0, dtype=np.int64)]
    for keys in cases:
        s = 64
        want = np.searchsorted(keys, np.arange(s + 1), side="left")
        key = torch.from_numpy(keys.astype(np.int64)).to(key_dtype)
        for T in (1, 2, 3, 7, 64):
            got = C._k_dense_level(None, 1, key, s, out_dtype, threads=T)
            assert got.dtype == out_dtype
            assert np.array_equal(got.numpy(), want), (T, keys[:10])


def test_int64_coo_to_csr_large():
    """A sorted COO with int64 index arrays (as imported from torch) -> CSR: the row pointer is
    read from the int64 rows directly and the result has the usual (int32) index dtype."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(2)
    m, n, nnz = 300_000, 5000, 250_000
    rows = rng.integers(0, m // 3, nnz) * 3  # two of three rows empty
    a = sp.coo_array((rng.random(nnz, dtype=np.float32), (rows, rng.integers(0, n, nnz))), shape=(m, n)).tocsr()
    a.sum_duplicates()
    a.sort_indices()
    coo = a.tocoo()
    s = C.from_coords(np.stack([coo.row, coo.col]), torch.from_numpy(coo.data), (m, n), Format("qq"))
    for src in (s, _with_int64_arrays(s)):
        got = C.convert(src, Format("dc"))
        assert got.index_dtype == torch.int32
        assert np.array_equal(got.levels[1].pos.numpy(), a.indptr)
        assert np.array_equal(got.levels[1].crd.numpy(), a.indices)
        assert got.values.data_ptr() == src.values.data_ptr()


def _sorted_within_reference(keys) -> bool:
    last = {}
    for i in range(len(keys[0])):
        tail = tuple(int(k[i]) for k in keys[1:])
        g = int(keys[0][i])
        if g in last and tail < last[g]:
            return False
        last[g] = tail
    return True


@settings(max_examples=200, **SETTINGS)
@given(data=st.data(), seed=st.integers(0, 2**31), n=st.integers(0, 40),
       index_dtype=st.sampled_from([torch.int32, torch.int64]), swap=st.booleans())
def test_from_coords_groups_out_of_order(data, seed, n, index_dtype, swap):
    """Entries in level order inside each group of the first level's coordinate, the
    groups in any order (a flip, a roll, rows picked in any order), and sometimes two
    entries swapped: ``_k_sorted_within`` agrees with a plain check, and the storage (built
    with one counting pass where it says so) is the reference's."""
    fmt = data.draw(formats(allow_block=False))
    shape = data.draw(shapes_for(fmt))
    n = n if 0 not in shape else 0
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.integers(0, max(s, 1), size=n) for s in shape]) if n \
        else np.zeros((len(shape), 0), np.int64)
    keys = idx[list(fmt.mode_order)]
    order = np.lexsort(keys[::-1]) if n else np.zeros(0, np.int64)
    groups = rng.permutation(max(shape[fmt.mode_order[0]], 1))   # new place of each group
    order = order[np.argsort(groups[keys[0][order]], kind="stable")]
    if swap and n >= 2:
        i = rng.integers(0, n - 1)
        order[[i, i + 1]] = order[[i + 1, i]]
    idx = np.ascontiguousarray(idx[:, order])
    vals = torch.from_numpy(rng.normal(size=n))
    level_keys = [torch.from_numpy(idx[d]).to(index_dtype) for d in fmt.mode_order]
    if n:
        assert C._k_sorted_within(level_keys, shape[fmt.mode_order[0]]) == \
            _sorted_within_reference(level_keys)
    for sum_duplicates in (True, False):
        unique = n == 0 or len({tuple(c) for c in idx.T}) == n
        if not sum_duplicates and not unique:
            continue
        got = C.from_coords(torch.from_numpy(idx).to(index_dtype), vals, shape, fmt,
                            sum_duplicates=sum_duplicates)
        assert_same_storage(got, reference_from_coords(idx, vals, shape, fmt))


def test_sorted_within_groups():
    k = lambda *xs: torch.tensor(xs)    # noqa: E731
    assert C._k_sorted_within([k(1, 1, 0, 0), k(2, 5, 0, 3)], 2)          # rows 1, 0 swapped
    assert not C._k_sorted_within([k(1, 1, 0, 0), k(5, 2, 0, 3)], 2)      # 5 before 2 in row 1
    assert C._k_sorted_within([k(0, 1, 0), k(4, 0, 4), k(1, 0, 2)], 2)    # (4, 1) then (4, 2)
    assert not C._k_sorted_within([k(0, 1, 0), k(4, 0, 4), k(2, 0, 1)], 2)
    assert C._k_sorted_within([k(0, 0), k(3, 3)], 1)                      # ties keep their order


@pytest.mark.parametrize("levels, order", [("dc", (0, 1)), ("dc", (1, 0)), ("cc", (0, 1)),
                                           ("qq", (0, 1)), ("dcc", (2, 0, 1))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.bfloat16, torch.complex64])
def test_to_dense_big_results_are_zeroed_aligned_tensors(levels, order, dtype):
    """Past 2^18 elements the dense result comes from numpy's zeroed, huge-page memory
    (``allocate.zeros_output``): every unstored position must still read 0, the result must
    be an ordinary tensor (not a view of a byte buffer) aligned to a cache line like torch's."""
    from scorch.conversion import to_dense
    from scorch.tensor_compiler.allocate import EMPTY_NUMPY_MIN
    rng = np.random.default_rng(3)
    shape = (700, 600) if len(levels) == 2 else (30, 100, 90)
    assert np.prod(shape) >= EMPTY_NUMPY_MIN
    nnz = 5000
    idx = np.stack([rng.integers(0, s, nnz) for s in shape])
    vals = torch.from_numpy(rng.standard_normal(nnz).astype(np.float32) + 2).to(dtype)
    for _ in range(3):     # fresh and reused blocks of the allocator alike
        st = C.from_coords(idx, vals, shape, Format(levels, order))
        got = to_dense(st)
        want = reference_to_dense(st)
        assert got.dtype == dtype and tuple(got.shape) == shape and got.is_contiguous()
        assert not got._is_view() and got.data_ptr() % 64 == 0
        assert torch.equal(got, want.to(dtype))
        flat = got.view(-1)
        flat[0] = flat[0] == 0   # writable (0 <-> 1), and nothing else sees the write
        assert not torch.equal(to_dense(st), got)


def test_big_kernel_outputs_are_aligned_plain_tensors():
    """A product's big dense output comes from numpy (``allocate.empty_output``): it must start
    on a cache line, as torch's own tensors do (glibc's big blocks start 16 bytes past one, and
    a later kernel reading rows of it would split every vector load), and be no view."""
    import scorch
    from scorch.tensor_compiler.allocate import EMPTY_NUMPY_MIN, empty_output
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.complex128):
        outs = [empty_output((EMPTY_NUMPY_MIN + k * 4099,), dtype) for k in range(4)]
        assert all(o.data_ptr() % 64 == 0 and not o._is_view() and o.dtype == dtype for o in outs)
    g = torch.Generator().manual_seed(0)
    dense = torch.rand(3000, 400, generator=g) * (torch.rand(3000, 400, generator=g) < 0.01)
    A = scorch.sparse_tensor(dense, format="csr")
    X = torch.rand(400, 128, generator=g)
    Y = A @ X
    assert Y.numel() >= EMPTY_NUMPY_MIN and Y.data_ptr() % 64 == 0 and not Y._is_view()
    torch.testing.assert_close(Y, dense @ X, rtol=1e-5, atol=1e-5)
