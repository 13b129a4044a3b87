"""A sparse operand's gradient with its pattern handed over in the format the kernel reads it
in (``gradients.einsum_grad._pattern_as_read``, ``tensor_compiler.read_formats``): the MoE
gate gradient ``bn,bh,bd,ndh->bn`` runs expert-major, so a CSR (or COO) gate goes in as
CSC, the kernel writes at the pattern's positions and a kept permutation puts the values
back in the gate's order. Results against dense torch over shapes (0- and 1-sized dims),
empty / top-k / full gates, formats, dtypes and 1 or 2 threads."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.gradients import einsum_grad
from scorch.gradients import pattern as _pattern
from scorch.tensor_compiler import read_formats, threads
from scorch.tensor_compiler.tiling import l1_cache_bytes

MOE, GATE_GRAD = "bd,ndh,bn->bh", "bn,bh,bd,ndh->bn"


def _operands(b, n, k, d, h, fmt, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, E = torch.rand(b, d, generator=g, dtype=dtype), torch.rand(n, d, h, generator=g, dtype=dtype)
    dense = topk_gate(b, n, k, dtype, seed=seed)
    return x, E, dense, scorch.sparse_tensor(dense, format=fmt, requires_grad=True)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_the_gate_goes_in_as_the_kernel_reads_it(fmt):
    """The gradient einsum gets the pattern in the plan's read format (CSC), and its result
    is written on that pattern (shares its arrays): no appended entries, no search."""
    d = l1_cache_bytes() // (2 * 512 * 4) + 4     # E[n] over half an L1: 24 KB of 32 KiB
    x, E, dense, G = _operands(64, 8, 2, d, 512, fmt, torch.float32)
    dy = torch.rand(64, 512)
    want = read_formats(GATE_GRAD, scorch.sparse_tensor(dense, format="csr"), dy, x, E)[0]
    assert want is not None and want.mode_order == (1, 0)
    seen = []

    def spy(eq, *ops):
        R = scorch.einsum(eq, *ops)
        seen.append((ops[0]._storage, R._storage))
        return R

    plan = einsum_grad.gradient_plan(MOE, ((64, d), (8, d, 512), (64, 8)), 2, True)
    with torch.no_grad():
        got = einsum_grad.operand_gradient(plan, spy, dy, (x, E, G))
    (Q, R), = seen
    assert Q.format.mode_order == want.mode_order     # COO goes in as DCSC, CSR as CSC
    assert _pattern.shares_arrays(Q, R)
    mask = (dense != 0).to(dense.dtype)
    torch.testing.assert_close(got.to_dense(), torch.einsum(GATE_GRAD, mask, dy, x, E), rtol=1e-4, atol=1e-2)


@pytest.fixture
def two_threads(monkeypatch):
    """Kernels get every thread torch has (no load estimate), 2 of them."""
    monkeypatch.setattr(threads, "_load_known", True)
    monkeypatch.setattr(threads, "_free_cores", lambda T: T)
    old = torch.get_num_threads()
    yield lambda t: torch.set_num_threads(t)
    torch.set_num_threads(old)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.sampled_from([0, 1, 5, 40]), n=st.sampled_from([1, 3, 6]), k=st.sampled_from(["empty", "top", "full"]),
       dh=st.sampled_from([(4200, 1), (33, 129), (12, 520)]),
       dtype=st.sampled_from([torch.float32, torch.float64]), nthreads=st.sampled_from([1, 2]))
def test_moe_gate_gradient_equals_dense(two_threads, b, n, k, dh, dtype, nthreads):
    """Through autograd, the gate's gradient equals dense torch's on the gate's pattern, in
    the gate's format. Every drawn shape is read transposed (``E[n]``'s d x h block is more
    than half an L1), so every example takes the new form (a COO gate's, whose pattern
    factor has its own permutation to compose, is checked above)."""
    two_threads(nthreads)
    d, h = dh
    k = {"empty": 0, "top": min(2, n), "full": n}[k]
    x, E, dense, G = _operands(b, n, k, d, h, "csr", dtype, seed=b + n + d)
    y = scorch.einsum(MOE, x, E, G)
    y = y.to_dense() if isinstance(y, scorch.SparseTensor) else y
    dy = torch.rand(b, h, dtype=dtype)
    y.backward(dy)
    Gd = dense.clone().requires_grad_()
    torch.einsum(MOE, x, E, Gd).backward(dy)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert G.grad.format == G.format
    torch.testing.assert_close(G.grad.to_dense(), Gd.grad * (dense != 0), rtol=tol, atol=tol * d * h)
