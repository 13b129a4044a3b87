"""SpMV's call path: ``A @ x``, ``A.mv(x)``, ``torch.mv(A, x)`` and ``torch.matmul(A, x)``
go straight to einsum's warm C call where format inference already gives a dense result
(they used to request ``out_format="dense"``, which skips the warm call: ~10 us a call), and
take the checked path everywhere else. Dense torch is the oracle; torch's errors stay."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.sparse_ops import einsum as einsum_entry
from ops_helpers import FLOATS, KERNEL_FORMATS, assert_matches, dense_values, side, sparse

FAST = settings(max_examples=25, deadline=None)


@st.composite
def matrix_and_vector(draw):
    shape = (draw(side()), draw(side()))
    dtype = draw(st.sampled_from(FLOATS))
    x = draw(dense_values(shape, dtype))
    v = draw(dense_values((shape[1],), dtype, density=1.0))
    return x, sparse(x, draw(st.sampled_from(KERNEL_FORMATS[2]))), v


@FAST
@given(matrix_and_vector())
def test_every_spmv_spelling_matches_dense(case):
    x, A, v = case
    expected = x @ v
    for got in (A @ v, A.mv(v), torch.mv(A, v), torch.matmul(A, v), A.matmul(v)):
        assert_matches(got, expected, sparse=False)


@FAST
@given(matrix_and_vector())
def test_strided_vector(case):
    x, A, v = case
    w = torch.stack([v, -v], 1)[:, 1]     # stride 2: not what the warm call reads
    assert_matches(A @ w, x @ w, sparse=False)
    assert_matches(torch.mv(A, w), x @ w, sparse=False)


def _warm_hits() -> int:
    fc = einsum_entry._compiler()._DISPATCH[1]
    return fc.hits() if fc is not None else -1


@pytest.mark.parametrize("spelling", ["matmul", "mv", "method_mv"])
def test_warm_call_serves_csr_spmv(spelling):
    A = scorch.sparse_tensor(torch.tensor([[1.0, 0, 2], [0, 0, 3]]), format="csr")
    v = torch.tensor([1.0, 2.0, 3.0])
    call = {"matmul": lambda: A @ v, "mv": lambda: torch.mv(A, v),
            "method_mv": lambda: A.mv(v)}[spelling]
    call()
    before = _warm_hits()
    if before < 0:     # no C warm-call module on this machine: the result is still right
        assert torch.equal(call(), torch.tensor([7.0, 9.0]))
        return
    for _ in range(3):
        assert torch.equal(call(), torch.tensor([7.0, 9.0]))
    assert _warm_hits() == before + 3


def test_spmv_spellings_refuse_like_torch():
    A = scorch.sparse_tensor(torch.eye(3), format="csr")
    with pytest.raises(RuntimeError):
        A @ torch.ones(4)                       # inner sizes differ
    with pytest.raises(RuntimeError):
        torch.mv(A, torch.ones(4))
    with pytest.raises(RuntimeError):
        torch.mv(A, torch.ones(3, 2))           # mv wants a vector
    with pytest.raises(RuntimeError):
        A.mm(torch.ones(3))                     # mm wants a matrix
    with pytest.raises(RuntimeError):
        A @ torch.ones(3, dtype=torch.float64)  # dtypes differ


def test_spmv_keeps_gradients():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    A = scorch.sparse_tensor(x, format="csr").requires_grad_(True)
    v = torch.tensor([3.0, 4.0], requires_grad=True)
    (A @ v).sum().backward()
    torch.testing.assert_close(v.grad, x.t() @ torch.ones(2))
    torch.testing.assert_close(A.grad.to_dense(), torch.outer(torch.ones(2), v.detach()) * (x != 0))
