"""``A[:, j]`` and ``A[:, a:b]`` along a matrix's second stored level
(``scorch.sparse_ops.inner_filter``), over every 2-level format and mode order: equal to dense
torch, a valid storage, and no walk over every entry's coordinates where the format allows
the filter (a sparse second level; for a range, a dense first level or COO)."""
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
