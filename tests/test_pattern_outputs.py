"""Results written on an operand's pattern, and transposes kept across calls.

- A broadcast SDDMM (``ij,bhid,bhjd->bhij``: BigBird's scores) stores the pattern's levels
  over dense ``b, h`` levels: the kernel writes each entry's block of values at the pattern's
  position, and the result shares the pattern's arrays (no coordinates, no assembly).
- ``stored(x)`` (1 at every stored entry of ``x``) keeps an expression on ``x``'s pattern
  with ``x`` as its only sparse operand: softmax's exponentials share ``x``'s arrays.
- A plan that reads a sparse operand transposed keeps the transpose (the converted pattern
  and a permutation) once it sees the same pattern again: later calls only gather values.
Every result is checked against dense torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import kept_conversions
from scorch.tensor_type import SparseTensor

F64 = torch.float64


def _pattern(m, n, density, fmt, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < density)
    return d, scorch.sparse_tensor(d, format=fmt)


def _shares_levels(result: SparseTensor, pattern: SparseTensor) -> bool:
    got = [a for lv in result._storage.levels for a in (lv.pos, lv.crd) if a is not None]
    want = [a for lv in pattern._storage.levels for a in (lv.pos, lv.crd) if a is not None]
    return len(want) > 0 and all(any(a is w for a in got) for w in want)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(1, 9), density=st.sampled_from([0.0, 0.3, 1.0]),
       fmt=st.sampled_from(["csr", "csc", "dcsr", "coo"]), b=st.integers(1, 3), h=st.integers(1, 3),
       d=st.integers(0, 5), dtype=st.sampled_from([torch.float32, F64]), seed=st.integers(0, 99))
def test_broadcast_sddmm_writes_on_the_pattern(m, n, density, fmt, b, h, d, dtype, seed):
    dense, S = _pattern(m, n, density, fmt, seed, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(b, h, m, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    out = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
    want = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k)
    got = out.to_dense() if isinstance(out, SparseTensor) else out
    torch.testing.assert_close(got, want)
    if fmt in ("csr", "dcsr") and d > 0 and S.nnz:
        # the pattern's levels, then b and h dense: every value block at the pattern's position
        assert _shares_levels(out, S)
        assert out._storage.values.numel() == S.nnz * b * h


def test_broadcast_sddmm_values_follow_the_pattern_positions():
    # a kernel that wrote each entry's (b, h) block at the pattern's position alone (no
    # b, h offset) would leave all but one head's values zero or overwritten
    dense, S = _pattern(6, 7, 0.4, "csr", 3)
    q, k = torch.randn(2, 3, 6, 4, dtype=F64), torch.randn(2, 3, 7, 4, dtype=F64)
    out = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
    assert _shares_levels(out, S)
    torch.testing.assert_close(out.to_dense(), torch.einsum("ij,bhid,bhjd->bhij", dense, q, k))


def test_broadcast_sddmm_gradients():
    dense, S = _pattern(5, 6, 0.5, "csr", 4)
    q = torch.randn(1, 2, 5, 3, dtype=F64, requires_grad=True)
    k = torch.randn(1, 2, 6, 3, dtype=F64, requires_grad=True)

    def f(q, k):
        return (scorch.einsum("ij,bhid,bhjd->bhij", S, q, k) * 1.5).to_dense()
    assert torch.autograd.gradcheck(f, (q, k))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_of_broadcast_scores_shares_their_arrays(log):
    dense, S = _pattern(8, 8, 0.4, "csr", 5)
    q, k = torch.randn(1, 2, 8, 4, dtype=F64), torch.randn(1, 2, 8, 4, dtype=F64)
    scores = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
    fn = torch.log_softmax if log else torch.softmax
    y = fn(scores, dim=-1)
    assert _shares_levels(y, S)
    full = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k).masked_fill(dense == 0, float("-inf"))
    want = fn(full, dim=-1)
    mask = (dense != 0).expand_as(want)
    torch.testing.assert_close(y.to_dense()[mask], want[mask])
    assert (y.to_dense()[~mask] == 0).all()


def test_a_transposed_operand_is_converted_once_then_gathered():
    _, A = _pattern(30, 30, 0.2, "csr", 6)
    dB, B = _pattern(30, 30, 0.2, "csr", 7)
    infos = []
    for _ in range(3):
        out = scorch.einsum("ij,ji->ij", A, B)       # B read as CSC
        infos.append(kept_conversions.reformat_cache_info())
        torch.testing.assert_close(out.to_dense(), A.to_dense() * B.to_dense().T)
    # the first call converts, the second keeps the permutation, the third only gathers
    assert infos[1]["misses"] == infos[0]["misses"] + 1
    assert infos[2]["hits"] == infos[1]["hits"] + 1
    assert infos[2]["misses"] == infos[1]["misses"]
    # new values on the same pattern (an optimizer step): gathered afresh
    with torch.no_grad():
        B.mul_(3.0)
    out = scorch.einsum("ij,ji->ij", A, B)
    torch.testing.assert_close(out.to_dense(), A.to_dense() * B.to_dense().T)
    torch.testing.assert_close(B.to_dense(), 3.0 * dB)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_of_broadcast_scores_gradients_match_dense(log):
    # the backward's kernels on the scores' pattern (softmax: y*g - y*s; log_softmax:
    # exp(y)*s on y's pattern, then g minus it) against dense masked attention
    dense, S = _pattern(9, 9, 0.4, "csr", 8)
    dense[torch.arange(9), torch.arange(9)] = 1.0      # no empty row (-inf everywhere)
    S = scorch.sparse_tensor(dense, format="csr")
    g = torch.Generator().manual_seed(9)
    q0, k0 = torch.randn(1, 2, 9, 4, generator=g, dtype=F64), torch.randn(1, 2, 9, 4, generator=g, dtype=F64)
    w = torch.randn(1, 2, 9, 9, generator=g, dtype=F64)
    mask = (dense != 0).expand_as(w)
    fn = torch.log_softmax if log else torch.softmax
    q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    y = fn(scorch.einsum("ij,bhid,bhjd->bhij", S, q, k), dim=-1)
    (y.to_dense() * w * mask).sum().backward()
    qd, kd = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    full = torch.einsum("ij,bhid,bhjd->bhij", dense, qd, kd).masked_fill(~mask, float("-inf"))
    (torch.where(mask, fn(full, dim=-1), 0.0) * w).sum().backward()
    torch.testing.assert_close(q.grad, qd.grad)
    torch.testing.assert_close(k.grad, kd.grad)


@pytest.mark.parametrize("k,aligned", [(4, True), (2, True), (4, False), (1, True)])
def test_gathers_through_a_permutation_by_blocks(k, aligned):
    # a transpose over dense heads moves each entry's k values together: gathered as blocks
    g = torch.Generator().manual_seed(k)
    rows = torch.randperm(50, generator=g)
    perm = (rows[:, None] * k + torch.arange(k)).reshape(-1)
    if not aligned:              # blocks that start off the k grid: gathered value by value
        perm = torch.roll(perm, 1)
    for dtype in (F64, torch.float32, torch.int16):
        values = (torch.randn(perm.numel() + 1, dtype=F64, generator=g) * 100).to(dtype)
        for v in (values[:-1], values[1:]):     # the second off a 16-byte alignment
            torch.testing.assert_close(kept_conversions._gather(v, perm), v[perm], rtol=0, atol=0)
    found, _ = kept_conversions._blocks(perm)
    assert found == (k if aligned and k > 1 else 1) or (aligned and found % k == 0)


def test_an_attention_training_step_converts_nothing_after_the_second():
    # scores on the pattern's arrays, softmax on theirs, every transpose the backward reads
    # kept: from the third step on, no conversion runs (only gathers of the current values)
    dense, S = _pattern(12, 12, 0.3, "csr", 10)
    dense[torch.arange(12), torch.arange(12)] = 1.0
    S = scorch.sparse_tensor(dense, format="csr")
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    infos = []
    for _ in range(4):
        for t in (q, k, v):
            t.grad = None
        probs = torch.softmax(scorch.einsum("ij,bhid,bhjd->bhij", S, q, k), dim=-1)
        (probs @ v).pow(2).sum().backward()
        infos.append(kept_conversions.reformat_cache_info())
    assert infos[3]["misses"] == infos[2]["misses"]
    assert infos[3]["hits"] > infos[2]["hits"]
    full = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k).masked_fill(dense == 0, float("-inf"))
    qd, kd, vd = (t.detach().clone().requires_grad_() for t in (q, k, v))
    full = torch.einsum("ij,bhid,bhjd->bhij", dense, qd, kd).masked_fill(dense == 0, float("-inf"))
    (torch.softmax(full, -1) @ vd).pow(2).sum().backward()
    for got, want in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_reductions_of_heads_under_a_pattern_are_laid_out_as_torchs(dim):
    # max / softmax sums are computed in the order the scores store their dimensions
    # (i, then b, h) and read back in dimension order: values as torch's, amax contiguous
    dense, S = _pattern(7, 6, 0.5, "csr", 12)
    q, k = torch.randn(2, 3, 7, 4, dtype=F64), torch.randn(2, 3, 6, 4, dtype=F64)
    scores = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
    full = scores.to_dense()
    got = torch.amax(scores, dim)
    if dim == 3:
        assert got.is_contiguous()
    else:     # the result keeps j, stored sparsely: sparse over the fibers storing an entry
        assert isinstance(got, SparseTensor)
        got = got.to_dense()
    torch.testing.assert_close(got, torch.amax(full, dim))
    mask = (dense != 0).expand_as(full)
    y = torch.softmax(scores, dim).to_dense()
    want = torch.softmax(full.masked_fill(~mask, float("-inf")), dim).nan_to_num(0.0)
    torch.testing.assert_close(y, torch.where(mask, want, 0.0))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_finishes_in_its_own_result(monkeypatch, log):
    """The backward's last step writes into the values of the result it has just computed
    (``fiber_ops._own_values``: no fresh array), and the gradient equals dense torch's."""
    from scorch.gradients import fiber_ops
    taken = []
    real = fiber_ops._own_values

    def spy(*args):
        taken.append(real(*args) is not None)
        return None if taken[-1] is False else real(*args)
    monkeypatch.setattr(fiber_ops, "_own_values", spy)
    dense, S = _pattern(9, 8, 0.5, "csr", 11)
    q = torch.randn(2, 3, 9, 4, dtype=F64, requires_grad=True)
    k = torch.randn(2, 3, 8, 4, dtype=F64)
    fn = torch.log_softmax if log else torch.softmax
    w = torch.randn(2, 3, 9, 8, dtype=F64)
    (fn(scorch.einsum("ij,bhid,bhjd->bhij", S, q, k), dim=-1).to_dense() * w).sum().backward()
    got, q.grad = q.grad, None
    s = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k).masked_fill(dense == 0, float("-inf"))
    p = torch.nan_to_num(fn(s, dim=-1), neginf=0.0) * (dense != 0)
    (p * w).sum().backward()
    torch.testing.assert_close(got, q.grad)
    assert taken == [True]


@pytest.mark.parametrize("mode_order", [(0, 1), (1, 0)])
def test_a_coo_result_on_the_operands_pattern_shares_its_arrays(mode_order):
    """COO's grouped coordinate levels visit every stored entry once, so a result on the
    operand's pattern (``A * d``, ``A > 0.5``, softmax) is written at its positions and
    shares its index arrays: no coordinates appended and assembled (2M entries, 1 thread:
    ``A * d`` 30 -> 11 ms, softmax 71 -> 42 ms)."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(40, 30, generator=g) * (torch.rand(40, 30, generator=g) < 0.2)
    A = scorch.sparse_tensor(a, format=scorch.Format("qq", mode_order=mode_order))
    d = torch.rand(40, 1, generator=g)
    for got, want in [(A * d, a * d), (A > 0.5, a > 0.5), (torch.sparse.softmax(A, 1), None)]:
        assert got._storage.levels[1].crd.data_ptr() == A._storage.levels[1].crd.data_ptr()
        if want is not None:
            assert torch.equal(got.to_dense(), want)
    soft = torch.sparse.softmax(A, 1).to_dense()
    dense = torch.where(a != 0, a, torch.tensor(float("-inf"))).softmax(1).nan_to_num()
    torch.testing.assert_close(soft, dense)
