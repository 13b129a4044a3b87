"""The runtime's moves of dense matrices that follow a sparse operand's entries
(``scorch/_runtime/dense_moves.pyx``): the non-zero rows compacted in place (``dense_route``'s
``cd`` results), and the columns a sparse batch touches gathered out of a weight and
scattered back (``sparse_ops/gathered_columns.py``), against torch's indexing."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scorch._runtime.dense_moves import compact_nonzero_rows, gather_columns, scatter_columns

SETTINGS = dict(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@settings(**SETTINGS)
@given(rows=st.integers(0, 30), width=st.integers(0, 9), keep=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                              torch.complex64, torch.complex128, torch.int8, torch.int32,
                              torch.int64, torch.bool]),
       seed=st.integers(0, 2**20))
def test_compact_nonzero_rows_is_ne_any(rows, width, keep, dtype, seed):
    """The in-place compaction behind ``compress_rows`` keeps the rows ``ne(0).any(1)`` keeps,
    in order: NaN and the smallest subnormal count, -0.0 and a dropped row do not, and an
    integer's sign bit alone (INT_MIN) is non-zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    x = x * (torch.rand(rows, 1, generator=g, dtype=torch.float64) < keep)
    x = x.to(dtype) if not dtype.is_complex else torch.complex(x, torch.zeros_like(x)).to(dtype)
    if rows >= 4 and width and dtype.is_floating_point:
        x[0].zero_(); x[0, -1] = -0.0
        x[1].zero_(); x[1, 0] = float("nan")
        x[2].zero_(); x[2, -1] = torch.finfo(dtype).tiny / 4 if dtype != torch.bfloat16 else 1e-40
    if rows >= 4 and width and dtype in (torch.int32, torch.int64):
        x[3].zero_(); x[3, 0] = torch.iinfo(dtype).min
    want_rows = x.ne(0).any(1).nonzero().view(-1) if width else torch.zeros(0, dtype=torch.int64)
    want = x[want_rows].clone()
    got_rows = compact_nonzero_rows(x)
    assert torch.equal(got_rows, want_rows)
    def raw(t):   # bytes: NaN and -0.0 compare as stored
        return t.contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(raw(x[:got_rows.numel()]), raw(want))



@settings(**SETTINGS)
@given(rows=st.integers(0, 40), width=st.integers(1, 3000), picked=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float32, torch.float64]), padded=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**20))
def test_gather_and_scatter_columns_are_indexing(rows, width, picked, dtype, padded, threads, seed):
    """``gather_columns`` is ``x[:, cols].t()`` (rows of any stride, many column chunks and
    row bands, ragged edges) and ``scatter_columns`` its adjoint, ``out[:, cols] = g.t()``."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, width + (5 if padded else 0), generator=g, dtype=dtype)
    x = base[:, :width]                       # padded: rows width + 5 apart
    cols = (torch.rand(width, generator=g) < picked).nonzero().view(-1)
    out = torch.empty(cols.numel(), rows, dtype=dtype)
    gather_columns(x, cols, out, threads)
    assert torch.equal(out, x[:, cols].t())
    back = torch.zeros(rows, width, dtype=dtype)
    scatter_columns(out, cols, back, threads)
    want = torch.zeros(rows, width, dtype=dtype)
    want[:, cols] = x[:, cols]
    assert torch.equal(back, want)


def test_gather_and_scatter_columns_refuse_bad_input():
    x = torch.randn(4, 10)
    with pytest.raises(IndexError, match="out of range for 10 columns"):
        gather_columns(x, torch.tensor([0, 10]), torch.empty(2, 4))
    with pytest.raises(ValueError, match="int64"):
        gather_columns(x, torch.tensor([0, 1], dtype=torch.int32), torch.empty(2, 4))
    with pytest.raises(ValueError, match="contiguous rows"):
        gather_columns(x.t(), torch.tensor([0]), torch.empty(1, 10))
    with pytest.raises(ValueError, match="out must be"):
        gather_columns(x, torch.tensor([0, 1]), torch.empty(4, 2))
    with pytest.raises(ValueError, match="g must be"):
        scatter_columns(torch.randn(3, 4), torch.tensor([0, 1]), torch.zeros(4, 10))
