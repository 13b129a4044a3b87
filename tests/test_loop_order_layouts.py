"""Dense arrays laid out in loop order where a sparse loop separates their dimensions.

- A dense output whose dimension order nests a variable looped below a sparse loop outside
  one looped above it (BigBird's ``probs @ v`` at batch 8: loops ``i, j, b, h, d``, output
  ``b, h, i, d``) is written in loop order and returned in dimension order, contiguous
  (``schedule.dense_layout``).
- A dense operand the innermost loop streams, nested that way (``q`` and ``k`` of the scores
  SDDMM), is copied to loop order for the call (``lower.facts.order_relayouts``,
  ``relayout.out_of_order``), on the general path, the Python runner and the C call alike.
- Kept transposes move blocks of values as wholes, or blocks then transposed
  (``kept_conversions.BlockMove``); an elementwise expression over one pattern writes its
  temporaries in place (``shared_pattern._evaluate``) and never into an operand.
Every result is checked against dense torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch import Format, kept_conversions
from scorch.tensor_compiler import relayout as relayout_mod
from scorch.tensor_type import SparseTensor

F64 = torch.float64
F32 = torch.float32


def _pattern(m, n, density, fmt, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g, dtype=dtype) * (torch.rand(m, n, generator=g) < density)
    return d, scorch.sparse_tensor(d, format=fmt)


def _scores(S, dense, b, h, d, dtype, seed):
    """Attention-like scores on S's pattern over dense (b, h) levels, and their dense form."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, dense.shape[0], d, generator=g, dtype=dtype)
    k = torch.randn(b, h, dense.shape[1], d, generator=g, dtype=dtype)
    P = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
    return P, torch.einsum("ij,bhid,bhjd->bhij", dense, q, k)


def _views(x: torch.Tensor):
    """x itself, x stored in (i, b, h, d) order, x stored in (b, i, h, d) order (the usual
    ``view(B, n, H, D).transpose(1, 2)``): the same values, three layouts."""
    return [x, x.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3),
            x.transpose(1, 2).contiguous().transpose(1, 2)]


# --- the output ---------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(1, 9), density=st.sampled_from([0.0, 0.3, 1.0]),
       fmt=st.sampled_from(["csr", "dcsr"]), b=st.integers(1, 3), h=st.integers(1, 3),
       d=st.integers(1, 5), e=st.integers(1, 6), dtype=st.sampled_from([F32, F64]),
       layout=st.integers(0, 2), seed=st.integers(0, 99))
def test_spmm_over_heads_matches_dense(m, n, density, fmt, b, h, d, e, dtype, layout, seed):
    dense, S = _pattern(m, n, density, fmt, seed, dtype)
    P, Pd = _scores(S, dense, b, h, d, dtype, seed + 1)
    v = _views(torch.randn(b, h, n, e, generator=torch.Generator().manual_seed(seed + 2), dtype=dtype))[layout]
    for _ in range(2):   # the first call plans (general path), the second takes the warm path
        out = P @ v if isinstance(P, SparseTensor) else torch.matmul(P, v)
        torch.testing.assert_close(out, Pd @ v)
        assert out.is_contiguous() and out.shape == (b, h, m, e)


def test_the_output_is_written_in_loop_order():
    dense, S = _pattern(12, 12, 0.3, "csr", 1)
    P, Pd = _scores(S, dense, 2, 3, 4, F64, 2)
    v = torch.randn(2, 3, 12, 5, dtype=F64)
    plan = scorch.explain("bhij,bhjd->bhid", P, v)
    assert plan.loop_order == ["i", "j", "b", "h", "d"]
    assert plan.schedule.output.layout == ("i", "b", "h", "d")
    assert "written in loop order i, b, h, d" in str(plan)
    out = scorch.einsum("bhij,bhjd->bhid", P, v)
    assert out.is_contiguous()
    torch.testing.assert_close(out, torch.einsum("bhij,bhjd->bhid", Pd, v))


def test_layout_choice():
    from scorch.tensor_compiler.cost_model import separated
    from scorch.tensor_compiler.schedule import dense_layout
    # a sparse loop j between i (above) and b, h (below): loop order
    assert separated(0, 2, (1,)) and not separated(0, 1, (1,)) and separated(1, 2, (1,), inclusive=True)
    dense, S = _pattern(6, 7, 0.5, "csr", 3)
    x = torch.randn(7, 4, dtype=F64)
    # SpMM into a transposed result: rows of k written in loop order, then transposed
    plan = scorch.explain("ij,jk->ki", S, x)
    assert plan.loop_order == ["i", "j", "k"] and plan.schedule.output.layout == ("i", "k")
    for _ in range(2):
        out = scorch.einsum("ij,jk->ki", S, x)
        assert out.is_contiguous()
        torch.testing.assert_close(out, (dense @ x).t())
    # a dense result of a transpose: no sparse loop between i and j, dimension order stays
    assert scorch.explain("ij->ji", S).schedule.output.layout == ()
    # the reduction of attention scores over j (loops i, j, b, h): a vector loop over b, h
    P, Pd = _scores(S, dense, 2, 3, 4, F64, 5)
    plan = scorch.explain("bhij->bhi", P)
    assert plan.loop_order == ["i", "j", "b", "h"] and plan.schedule.output.layout == ("i", "b", "h")
    torch.testing.assert_close(scorch.einsum("bhij->bhi", P), Pd.sum(-1))
    s = plan.schedule
    assert dense_layout(["i", "j", "k", "b"], s.accesses, ("b", "i", "k")) == ("i", "k", "b")
    assert dense_layout(["b", "i", "j", "k"], s.accesses, ("i", "b", "k")) == ()


@pytest.mark.parametrize("equation,shape,order,sparse_rank,layout", [
    # each stored entry adds into b rows of k: laid out (i, b, k), read and written at stride 1
    ("ij,bjk->ikb", (3, 9, 16), ["i", "b", "j", "k"], 2, ("i", "b", "k")),
    ("ij,jkl->ilk", (9, 3, 16), ["i", "k", "j", "l"], 2, ("i", "k", "l")),
    # A^T X written transposed into a dense result (the dense route computes the sparse
    # result so): each stored entry adds a row of k at the sparse loop's j (0.80 -> 0.27 ms
    # at 3000^2, 0.5 %, K = 32: the row was 32 writes 12 KB apart)
    ("ij,ik->kj", (8, 16), ["i", "j", "k"], 1, ("j", "k")),
])
def test_loop_orders_are_priced_with_the_output_in_loop_order(equation, shape, order, sparse_rank, layout):
    """Without pricing the layout, the cost model counted the output as strided and chose
    an order that walks each sparse row once per value of the innermost output variable
    but one (``ij,bjk->ikb`` as ``i, k, j, b``: 2.2 ms at 2000^2, 1 %, 3 x 16; now 0.16 ms)."""
    from scorch.tensor_compiler import cost_model
    dense, S = _pattern(8, 9, 0.3, "csr", 4)
    x = torch.randn(*shape, dtype=F64)
    dense_out = Format("d" * len(layout))
    plan = scorch.explain(equation, S, x, out_format=dense_out)
    assert plan.loop_order == order and plan.schedule.output.layout == layout
    assert cost_model.loop_order_layout(order, (sparse_rank,), equation.split("->")[1]) == layout
    assert cost_model.loop_order_layout(order, (), equation.split("->")[1]) == ()
    for _ in range(2):
        out = scorch.einsum(equation, S, x, out_format=dense_out)
        assert out.is_contiguous()
        torch.testing.assert_close(out, torch.einsum(equation, dense, x))
        torch.testing.assert_close(scorch.einsum(equation, S, x).to_dense(), torch.einsum(equation, dense, x))


def test_amax_of_scores_counts_stored_entries_without_a_tensor_of_ones():
    """amax over the pattern's columns: the implicit zeros of a fiber that stores fewer
    entries than its extent count (torch's meaning), found by ``sum stored(x)``."""
    dense, S = _pattern(9, 7, 0.5, "csr", 8)
    dense[0] = torch.rand(7, dtype=F64) + 0.5    # a full row: its maximum may be negative
    S = scorch.sparse_tensor(dense, format="csr")
    P, Pd = _scores(S, dense, 2, 3, 4, F64, 9)
    stored = (dense != 0).expand_as(Pd)
    for fn, fill in ((torch.amax, float("-inf")), (torch.amin, float("inf"))):
        want = fn(torch.where(stored, Pd, torch.zeros(())), dim=-1)
        torch.testing.assert_close(fn(P, dim=-1), want)
    torch.testing.assert_close(torch.amax(P, dim=(2, 3)), torch.amax(torch.where(stored, Pd, torch.zeros(())), dim=(2, 3)))


# --- operands ----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), density=st.sampled_from([0.0, 0.3, 1.0]),
       b=st.integers(1, 3), h=st.integers(1, 3), d=st.integers(1, 5),
       dtype=st.sampled_from([F32, F64]), lq=st.integers(0, 2), lk=st.integers(0, 2),
       seed=st.integers(0, 99))
def test_sddmm_operands_in_any_layout_match_dense(m, n, density, b, h, d, dtype, lq, lk, seed):
    dense, S = _pattern(m, n, density, "csr", seed, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    q = _views(torch.randn(b, h, m, d, generator=g, dtype=dtype))[lq]
    k = _views(torch.randn(b, h, n, d, generator=g, dtype=dtype))[lk]
    want = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k)
    for _ in range(2):
        out = scorch.einsum("ij,bhid,bhjd->bhij", S, q, k)
        torch.testing.assert_close(out.to_dense() if isinstance(out, SparseTensor) else out, want)


def test_operands_nested_against_the_loops_are_copied():
    from scorch.tensor_compiler.execute import ordered_relayout
    dense, S = _pattern(16, 16, 0.3, "csr", 4)
    q, k = torch.randn(2, 3, 16, 8, dtype=F64), torch.randn(2, 3, 16, 8, dtype=F64)
    plan = scorch.explain("ij,bhid,bhjd->bhij", S, q, k)
    assert "copied to loop order (i, b, h, d)" in str(plan)
    assert "copied to loop order (j, b, h, d)" in str(plan)
    # in loop order already: read in place
    qi = _views(q)[1]
    assert relayout_mod.out_of_order(q, ((2, 0), (2, 1)))
    assert not relayout_mod.out_of_order(qi, ((2, 0), (2, 1)))
    # size-1 dimensions do not count: one batch, one head
    assert not relayout_mod.out_of_order(q[:1, :1], ((2, 0), (2, 1)))
    plan_i = scorch.explain("ij,bhid,bhjd->bhij", S, qi, k)
    assert "operand 1 (d has stride 1): read in place" in str(plan_i)
    del ordered_relayout


def test_the_c_call_declines_operands_nested_against_the_loops(monkeypatch):
    """A plan with its output in loop order (``i, b, h, d``) and a streamed operand ``v``
    (``j, b, h, d``) whose ``b`` and ``h`` sit below the sparse ``j``: the warm calls read
    ``v`` in place when it is in loop order and copy it when it arrives nested the other
    way (the C call declines it, its Python runner copies)."""
    from scorch.tensor_compiler import api, execute, runner
    copies = []
    real = runner.relayout

    def spy(x, *args, **kwargs):
        if x.shape == (10, 2, 3, 5):
            copies.append(tuple(x.stride()))
        return real(x, *args, **kwargs)
    monkeypatch.setattr(runner, "relayout", spy)     # (the runner binds it when it is built)
    monkeypatch.setattr(execute, "relayout", spy)
    api.plan_cache_clear()
    dense, S = _pattern(10, 10, 0.4, "csr", 6)
    P, Pd = _scores(S, dense, 2, 3, 4, F64, 7)
    v = torch.randn(10, 2, 3, 5, dtype=F64)                       # (j, b, h, d): loop order
    vt = v.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)   # b outermost: against them
    want = torch.einsum("bhij,jbhd->ibhd", Pd, v)
    plan = scorch.explain("bhij,jbhd->ibhd", P, v)
    assert plan.loop_order == ["i", "j", "b", "h", "d"] and plan.schedule.output.layout == ()
    for x in (v, v, vt, vt):   # the general path once, then the warm calls
        torch.testing.assert_close(scorch.einsum("bhij,jbhd->ibhd", P, x), want)
    assert copies == [vt.stride(), vt.stride()]
    assert P._storage.values.numel() and copies


# --- kept transposes: block moves -----------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 40), nb=st.integers(1, 60), transpose=st.booleans(),
       dtype=st.sampled_from([F32, F64, torch.int64, torch.int16]), seed=st.integers(0, 99))
def test_block_moves_gather_like_indexing(k, nb, transpose, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(nb, generator=g)
    if transpose:   # the heads first: row h holds every block's h-th value
        perm = (order[None, :] * k + torch.arange(k)[:, None]).reshape(-1)
    else:
        perm = (order[:, None] * k + torch.arange(k)[None, :]).reshape(-1)
    values = (torch.randn(nb * k, generator=g) * 100).to(dtype)
    move = kept_conversions._block_move(perm)
    assert torch.equal(kept_conversions._gather(values, perm), values[perm])
    identity = torch.equal(order, torch.arange(nb))   # blocks of any size that divides
    if nb * k >= 4 and k >= 2 and nb >= 2 and not transpose and not identity:
        assert move.k >= k and move.k % k == 0 and not move.transpose
    if transpose and k >= 2 and nb >= 2 and move.k > 1:
        assert move.k == k or not move.transpose


def test_a_transposing_move_is_recognized():
    order = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    perm = (order[None, :] * 32 + torch.arange(32)[:, None]).reshape(-1)
    move = kept_conversions._block_move(perm)
    assert move.transpose and move.k == 32 and torch.equal(move.blocks, order)
    values = torch.randn(perm.numel())
    assert torch.equal(kept_conversions._gather(values, perm), values[perm])
    # an arbitrary permutation moves no blocks
    assert kept_conversions._block_move(torch.randperm(1000)).k == 1


def test_block_gather_checks_its_output():
    from scorch._runtime import convert
    src = torch.arange(12, dtype=F32)
    blocks = torch.tensor([2, 0, 1])
    out = torch.empty(12, dtype=F32)
    assert torch.equal(convert._k_gather_blocks(blocks, src, 4, out), src.view(3, 4)[blocks].reshape(-1))
    with pytest.raises(ValueError, match="out must be"):
        convert._k_gather_blocks(blocks, src, 4, torch.empty(8, dtype=F32))


def test_values_gradient_with_many_heads_matches_dense(monkeypatch):
    """v's gradient through attention with 16 heads (64-byte blocks): the output-first copy
    of the probabilities is gathered by blocks and transposed."""
    moves = []
    real = kept_conversions._block_move

    def spy(perm):
        moves.append(real(perm))
        return moves[-1]
    monkeypatch.setattr(kept_conversions, "_block_move", spy)
    dense, S = _pattern(20, 20, 0.3, "csr", 7, F32)
    gen = torch.Generator().manual_seed(8)
    q, k, v = [torch.randn(4, 4, 20, 8, generator=gen, requires_grad=True) for _ in range(3)]
    for _ in range(3):   # the kept permutation from the second step on
        for t in (q, k, v):
            t.grad = None
        out = torch.softmax(scorch.einsum("ij,bhid,bhjd->bhij", S, q, k), dim=-1) @ v
        out.pow(2).sum().backward()
        got = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        s = torch.einsum("ij,bhid,bhjd->bhij", dense, q, k).masked_fill(dense == 0, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, dim=-1))
        (p @ v).pow(2).sum().backward()
        for a, t in zip(got, (q, k, v)):
            torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-5)
    assert any(m.transpose and m.k == 16 for m in moves)


# --- one pattern, values only ------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 30), dtype=st.sampled_from([F32, F64]), seed=st.integers(0, 99),
       expr=st.sampled_from(["a*b-c", "-(a*b)+c", "a*a-a", "(a-b)*(b-c)", "2*a-b/3", "-a"]))
def test_values_only_expressions_never_write_an_operand(n, dtype, seed, expr):
    dense, A = _pattern(n, 7, 0.4, "csr", seed, dtype)
    B, C = A * 2.5, A * -1.5   # on A's arrays
    before = [t._storage.values.clone() for t in (A, B, C)]
    env = {"a": A, "b": B, "c": C}
    got = eval(expr, {}, env)
    want = eval(expr, {}, {"a": A.to_dense(), "b": B.to_dense(), "c": C.to_dense()})
    torch.testing.assert_close(got.to_dense(), want)
    for t, v in zip((A, B, C), before):
        assert torch.equal(t._storage.values, v)
