"""The compiler's front end on inputs a real program produces by mistake: clear errors that
name the operand and the problem, torch's rules, and plans that do not depend on the order
of earlier calls."""
from __future__ import annotations

import pytest
import torch

import scorch
import scorch.tensor_compiler as C
from scorch.tensor_compiler.frontend import bind_sizes


def _sparse(m=6, n=5, seed=0, fmt="csr"):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g) * (torch.rand(m, n, generator=g) < 0.5)
    return d, scorch.sparse_tensor(d, format=fmt)


@pytest.mark.parametrize("equation", [None, 3, b"ij,jk->ik"])
def test_equation_must_be_a_string(equation):
    _, A = _sparse()
    with pytest.raises(TypeError, match=r"equation.*must be (a )?str"):
        scorch.einsum(equation, A, torch.ones(5, 2))
    with pytest.raises(TypeError, match=r"equation.*must be (a )?str"):
        C.einsum(equation, A, torch.ones(5, 2))


@pytest.mark.parametrize("bad", ["x", None, [1.0, 2.0]])
def test_operand_that_is_not_a_tensor(bad):
    _, A = _sparse()
    with pytest.raises(TypeError, match="operand 1 of type"):
        C.einsum("ij,jk->ik", A, bad)


def test_operand_on_another_device_is_refused_warm_and_cold():
    d, A = _sparse()
    X = torch.randn(5, 3)
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, X), d @ X)   # plan and warm path
    with pytest.raises(ValueError, match="operand 1 is on device meta"):
        scorch.einsum("ij,jk->ik", A, torch.randn(5, 3, device="meta"))
    # dense-only calls stay torch's, meta included
    assert scorch.einsum("ij,jk->ik", torch.ones(2, 3, device="meta"),
                         torch.ones(3, 4, device="meta")).device.type == "meta"


def test_repeated_subscript_needs_equal_sizes_like_torch():
    x = torch.ones(4, 1)
    with pytest.raises(RuntimeError):
        torch.einsum("ii->i", x)
    with pytest.raises(ValueError, match="subscript i is repeated for operand 0 but the sizes don't match, 4 != 1"):
        scorch.einsum("ii->i", scorch.sparse_tensor(x, format="csr"))
    with pytest.raises(ValueError, match="repeated"):
        bind_sizes([("i", "i")], [(4, 1)])


def test_out_format_on_a_scalar_result_raises():
    _, A = _sparse()
    with pytest.raises(ValueError, match="0-d \\(scalar\\)"):
        scorch.einsum("ij->", A, out_format="csr")


@pytest.mark.parametrize("first_broadcasts", [False, True])
def test_plan_does_not_depend_on_earlier_calls_with_size_one_dims(first_broadcasts):
    """A sparse operand with a size-1 dimension: whether that dimension broadcasts is part
    of the plan, so the answer does not depend on which call came first."""
    C.plan_cache_clear()
    d, A = _sparse(1, 5, seed=3)
    same, wide = torch.randn(1, 5), torch.randn(4, 5)
    calls = [(A, same, d * same), (A, wide, d * wide)]
    if first_broadcasts:
        calls.reverse()
    for S, D, want in calls * 2:
        got = scorch.einsum("ij,ij->ij", S, D)
        got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
        torch.testing.assert_close(got, want)


def test_size_mismatch_names_both_operands():
    _, A = _sparse()
    with pytest.raises(ValueError, match="subscript j has size 4 for operand 1 which does not "
                                         "broadcast with previously seen size 5 \\(operand 0\\)"):
        scorch.einsum("ij,jk->ik", A, torch.ones(4, 2))


def test_broadcast_dense_operand_is_not_materialized_at_full_size():
    """A dense operand broadcast along a dimension the kernel does not stream is read with
    stride 0 (a row against a 2M x 2M matrix must not become 2M x 2M)."""
    from scorch.tensor_compiler import Access, Assignment, compute
    from scorch.tensor_type import SparseTensor
    n = 2_000_000
    idx = torch.tensor([[0, 5, n - 1], [3, n - 2, 7]])
    S = scorch.sparse_tensor((idx, torch.tensor([1.0, 2.0, 3.0])), size=(n, n), format="csr")
    row = torch.rand(1, n)
    A, B = Access(0, "ij"), Access(1, "ij")
    for D in (row,):
        r = SparseTensor(compute(Assignment("ij", A * B), S, D))
        want = torch.tensor([1.0, 2.0, 3.0]) * D.expand(n, n)[idx[0], idx[1]]
        torch.testing.assert_close(r.values(), want)
