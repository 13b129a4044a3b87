"""In-place writes through the results of torch's view functions (``tensor_view.html``):
dense torch writes through to the input. Scorch's rows of a row-major tensor (``S[i]``,
``S[a:b]``, ``narrow(0, ...)``) share the input's values outside autograd, so writes go both
ways; every other such result is a copy, and an in-place write to it raises rather than
being lost (``tensor_type.refuse_write_to_copy``)."""
import pytest
import torch

import scorch

D = torch.tensor([[1.0, 0, 2, 0], [0, 3, 0, 0], [4, 0, 5, 6]])

ROW_VIEWS = {
    "S[1]": lambda S: S[1],
    "S[0:2]": lambda S: S[0:2],
    "S[-1]": lambda S: S[-1],
    "narrow(0, 1, 2)": lambda S: S.narrow(0, 1, 2),
    "S[1:, :]": lambda S: S[1:, :],
}

COPIES = {
    "S[:, 0]": lambda S: S[:, 0],
    "S[::2]": lambda S: S[::2],
    "select(1, 2)": lambda S: S.select(1, 2),
    "unbind()[0]": lambda S: S.unbind()[0],
    "split(1)[2]": lambda S: S.split(1)[2],
    "chunk(3, 1)[0]": lambda S: S.chunk(3, 1)[0],
    "S[1:, 2:]": lambda S: S[1:, 2:],
}


@pytest.mark.parametrize("fmt", ["csr", "coo"])
@pytest.mark.parametrize("name", list(ROW_VIEWS))
def test_rows_are_views_both_ways(fmt, name):
    take = ROW_VIEWS[name]
    S, dense = scorch.sparse_tensor(D, format=fmt), D.clone()
    take(S).mul_(10)
    take(dense).mul_(10)
    assert torch.equal(S.to_dense(), dense)
    row, row_dense = take(S), take(dense)
    S.add_(S)                                       # a write to the input shows in the row
    dense.add_(dense)
    assert torch.equal(row.to_dense(), row_dense)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("name", list(COPIES))
def test_a_write_to_a_copy_raises_naming_the_view(fmt, name):
    take = COPIES[name]
    S = scorch.sparse_tensor(D, format=fmt)
    part = take(S)
    if part._storage.values.untyped_storage().data_ptr() == S._storage.values.untyped_storage().data_ptr():
        part.mul_(2)                                # a view in this format: it must write through
        expect = D.clone()
        take(expect).mul_(2)
        assert torch.equal(S.to_dense(), expect)
        return
    with pytest.raises(RuntimeError, match="torch makes that a view, but here it is a copy"):
        part.mul_(2)
    with pytest.raises(RuntimeError, match="is a copy"):
        part.copy_(part * 3)
    mine = take(S).clone()
    mine.mul_(2)                                    # a clone is the user's own
    assert torch.equal(mine.to_dense(), take(D) * 2)
    assert torch.equal(S.to_dense(), D)


def test_an_advanced_index_is_a_copy_as_in_torch():
    S = scorch.sparse_tensor(D, format="csr")
    part = S[torch.tensor([0, 2])]
    part.mul_(2)
    assert torch.equal(part.to_dense(), D[[0, 2]] * 2)
    assert torch.equal(S.to_dense(), D)


def test_pruning_a_row_of_a_trained_weight():
    W = scorch.sparse_tensor(D, format="csr", requires_grad=True)
    with torch.no_grad():
        W[2].zero_()
    x = torch.randn(4, 5)
    (W @ x).pow(2).sum().backward()
    dense = (D * torch.tensor([[1.0], [1.0], [0.0]])).requires_grad_()
    (dense @ x).pow(2).sum().backward()
    assert torch.equal(W.detach().to_dense(), dense.detach())
    torch.testing.assert_close(W.grad.to_dense(), dense.grad * (D != 0))


def test_under_autograd_a_row_write_raises_instead_of_a_wrong_gradient():
    W = scorch.sparse_tensor(D, format="csr", requires_grad=True)
    with pytest.raises(RuntimeError, match="is a copy"):
        W[0].mul_(2)                                # a leaf: torch raises too
    C = W * 1
    with pytest.raises(RuntimeError, match="is a copy"):
        C[0].mul_(2)                                # autograd would not see the write
    assert torch.equal(W.detach().to_dense(), D)
