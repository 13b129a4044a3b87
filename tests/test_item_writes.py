"""``x[index] = value`` and ``index_put_`` on sparse tensors (``sparse_ops/item_writes.py``)
against dense torch: every index form ``x[index]`` reads, scalar / dense / sparse values.
A write that keeps the pattern equals torch's; one that would store a non-zero where ``x``
stores nothing raises (in-place ops keep the pattern)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch

F64 = torch.float64


def _pattern(shape, density, seed):
    g = torch.Generator().manual_seed(seed)
    d = torch.randint(1, 9, shape, generator=g).to(F64)
    d[torch.rand(shape, generator=g) > density] = 0
    return d


@st.composite
def _index_item(draw, size, first):
    kind = draw(st.sampled_from(["int", "slice", "step", "tensor", "none", "full"]))
    if kind == "int":
        return draw(st.integers(-size, size - 1))
    if kind == "slice":
        a = draw(st.integers(-size, size))
        return slice(a, draw(st.one_of(st.none(), st.integers(-size, size))))
    if kind == "step":
        return slice(draw(st.one_of(st.none(), st.integers(0, size))), None, draw(st.integers(1, 3)))
    if kind == "tensor":
        k = draw(st.integers(0, size))
        perm = torch.randperm(size, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
        return perm[:k] - (size if draw(st.booleans()) and k else 0)   # negative ones too
    if kind == "none":
        return None
    return slice(None)


@st.composite
def _case(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    fmt = draw(st.sampled_from({1: ["coo", "c"], 2: ["csr", "csc", "coo", "dcsr"],
                                3: ["coo", "csf"]}[rank]))
    density = draw(st.sampled_from([0.0, 0.4, 1.0]))
    d = _pattern(shape, density, draw(st.integers(0, 999)))
    form = draw(st.sampled_from(["items", "mask", "ellipsis"]))
    if form == "mask":
        k = draw(st.integers(1, rank))        # a bool mask over the leading k dims
        mask = torch.rand(shape[:k], generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))) < 0.5
        index = mask if k == 1 or draw(st.booleans()) else (mask,)
    else:
        items, n_tensors = [], 0
        for d_size in shape[:draw(st.integers(1, rank))]:
            ix = draw(_index_item(d_size, not items))
            if isinstance(ix, torch.Tensor):
                n_tensors += 1
                if n_tensors > 1:             # several index tensors must broadcast: one only
                    ix = slice(None)
            items.append(ix)
        if form == "ellipsis":
            items.insert(draw(st.integers(0, len(items))), Ellipsis)
        index = tuple(items) if len(items) > 1 or draw(st.booleans()) else items[0]
    value_kind = draw(st.sampled_from(["zero", "number", "dense", "dense_on_pattern", "sparse"]))
    return d, fmt, index, value_kind, draw(st.integers(0, 99))


def _value(kind, target_shape, stored_at, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "zero":
        return 0.0
    if kind == "number":
        return 2.5
    v = torch.randint(-3, 4, tuple(target_shape), generator=g).to(F64)
    if kind == "dense_on_pattern":
        return v * stored_at                     # non-zero only where x stores: never grows
    if kind == "sparse":
        return scorch.sparse_tensor(v * stored_at, format="coo") if len(target_shape) else v * stored_at
    if len(target_shape) and torch.rand(1, generator=g).item() < 0.5:
        return v[..., :1]                        # broadcast along the last dim
    return v


@settings(max_examples=300, deadline=None)
@given(_case())
def test_setitem_matches_dense_torch_or_refuses_to_grow(case):
    d, fmt, index, value_kind, seed = case
    X = scorch.sparse_tensor(d, format=fmt)
    stored = d != 0
    try:
        target = d[index]
    except (IndexError, RuntimeError) as e:      # an index torch refuses: so must scorch
        with pytest.raises(type(e)):
            X[index] = 0.0
        return
    value = _value(value_kind, target.shape, stored[index].to(F64), seed)
    want = d.clone()
    dense_value = value.to_dense() if isinstance(value, scorch.SparseTensor) else value
    want[index] = dense_value
    if bool(((want != 0) & ~stored).any()):
        with pytest.raises(RuntimeError, match="does not store"):
            X[index] = value
        return
    values_before = X.values()
    X[index] = value
    assert X.values() is values_before           # written in place
    torch.testing.assert_close(X.to_dense(), want)


@settings(max_examples=60, deadline=None)
@given(_case(), st.booleans())
def test_index_put_in_and_out_of_place(case, accumulate):
    d, fmt, index, value_kind, seed = case
    tensors = index if isinstance(index, tuple) else (index,)
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 for t in tensors):
        return                                    # index_put takes index tensors only
    X = scorch.sparse_tensor(d, format=fmt)
    value = torch.tensor(0.0, dtype=F64) if value_kind == "zero" else \
        (d[tensors] != 0).to(F64) * 1.5           # on the pattern: never grows
    want = d.index_put(tensors, value, accumulate=accumulate)
    torch.testing.assert_close(X.index_put(tensors, value, accumulate=accumulate).to_dense(), want)
    torch.testing.assert_close(X.to_dense(), d)  # out of place: X unchanged
    X.index_put_(tensors, value, accumulate=accumulate)
    torch.testing.assert_close(X.to_dense(), want)


def test_index_put_accumulates_repeated_positions():
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=F64)
    X = scorch.sparse_tensor(d, format="csr")
    idx = (torch.tensor([0, 0, 1]), torch.tensor([0, 0, 1]))
    X.index_put_(idx, torch.tensor([1.0, 2.0, 3.0], dtype=F64), accumulate=True)
    torch.testing.assert_close(X.to_dense(), torch.tensor([[4.0, 0.0], [0.0, 5.0]], dtype=F64))


def test_a_row_mask_selects_rows_not_columns():
    """``x[mask] = v`` with a mask over the leading dims (torch's indexing), where
    ``masked_fill_`` broadcasts a mask from the trailing dims."""
    d = torch.arange(1.0, 13.0, dtype=F64).reshape(4, 3)
    X = scorch.sparse_tensor(d, format="csr")
    X[torch.tensor([True, False, False, True])] = 0
    want = d.clone()
    want[torch.tensor([True, False, False, True])] = 0
    torch.testing.assert_close(X.to_dense(), want)


def test_setitem_with_a_value_that_requires_grad():
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 4.0]], dtype=F64)
    S = scorch.sparse_tensor(d, format="csr", requires_grad=True)
    v = torch.tensor([5.0, 0.0, 6.0], dtype=F64, requires_grad=True)
    X = S * 1.0                                   # a non-leaf: in-place writes allowed
    X[0] = v
    w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64)
    (X.to_dense() * w).sum().backward()
    assert torch.equal(v.grad, torch.tensor([1.0, 0.0, 3.0], dtype=F64))  # the stored places
    assert torch.equal(S.grad.to_dense(), torch.tensor([[0.0, 0.0, 0.0], [0.0, 5.0, 6.0]], dtype=F64))


def test_a_leaf_that_requires_grad_refuses_setitem():
    S = scorch.sparse_tensor(torch.eye(2, dtype=F64), format="csr", requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        S[0] = 0.0


def test_writes_on_a_blocked_tensor():
    d = torch.zeros(4, 4, dtype=F64)
    d[:2, :2] = torch.tensor([[1.0, 2.0], [0.0, 3.0]])
    X = scorch.sparse_tensor(d, format=scorch.Format("dc", block=(2, 2)))
    X[0] = 0.0
    X[1, 0] = 4.0                                 # a stored (explicit 0) position of the block
    want = d.clone()
    want[0] = 0.0
    want[1, 0] = 4.0
    torch.testing.assert_close(X.to_dense(), want)
    with pytest.raises(RuntimeError, match="does not store"):
        X[3, 3] = 1.0


def test_index_tensors_are_bounds_checked_only_where_something_is_selected():
    """As dense torch: an index tensor beside an empty slice selects nothing and is not
    checked (``X[..., 0:0, [1]]`` with an extent-1 last dimension); with a non-empty slice the
    same index raises (hypothesis found the empty case raising)."""
    X = torch.zeros(1, 2, 1, dtype=torch.float64)
    S = scorch.sparse_tensor(X, format="coo")
    assert S[..., 0:0, torch.tensor([1])].shape == X[..., 0:0, torch.tensor([1])].shape
    S[..., 0:0, torch.tensor([1])] = 0
    with pytest.raises(IndexError, match="out of bounds"):
        S[..., 0:1, torch.tensor([1])]
    assert torch.equal(S[..., 0:1, torch.tensor([-1])].to_dense(), X[..., 0:1, torch.tensor([-1])])
