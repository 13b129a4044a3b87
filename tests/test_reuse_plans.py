"""Plans for operands seen again (``planner.reuse_entry``): where a transposed loop order
pays only once the transpose is kept across calls (``kept_conversions``), the first calls
on a pattern run the order without it and a call that sees the pattern again
(``kept_conversions.REUSED_AFTER``) switches to the transposed one. Also the estimate's
pricing of where the result accumulates (``work_estimate.UPDATE_VISITS``) and the
candidates with the reductions inside (``loop_order.reductions_inside``). Results are
those of dense torch on every call, in the same format whichever plan ran."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch
from scorch import kept_conversions
from scorch.tensor_compiler import merge_lattice as ml
from scorch.tensor_compiler.cost_model import OrderProblem
from scorch.tensor_compiler.index_notation import parse_einsum
from scorch.tensor_compiler.loop_order import reductions_inside
from scorch.tensor_compiler.operand_stats import operand_stats
from scorch.tensor_compiler.work_estimate import UPDATE_VISITS, VECTOR_VISITS, Statistics, estimate


def sparse(m: int, n: int, density: float, fmt: str, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(m, n, generator=g, dtype=torch.float64).to(dtype) + 0.5
    d = torch.where(torch.rand(m, n, generator=g) < density, d, torch.zeros((), dtype=dtype))
    return d, scorch.sparse_tensor(d, format=fmt)


def dense_of(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


def with_threads(n, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def problem(equation: str, A, other, kept: bool = False) -> OrderProblem:
    spec = parse_einsum(equation, [A.shape, other.shape])
    asg = spec.assignment
    ids = ml.access_ids(asg.rhs)
    sizes = {v: s for idx, x in zip(spec.operand_indices, (A, other)) for v, s in zip(idx, x.shape)}
    stats = Statistics({0: operand_stats(A._storage)}, sizes, 1, frozenset({0}) if kept else frozenset())
    return OrderProblem(asg, ids, [A._storage.format, None], ml.formula(asg.rhs, ids), False,
                        **stats.problem_fields(ids))


def test_updates_count_where_the_result_accumulates():
    """CSC ``A @ X``: ``j, i, k`` reads and writes a row of the result per stored entry,
    ``i, j, k`` (A transposed) sums each row in registers and writes it once; a reduction
    innermost (``ij,ik,jk->i``) sums in a register whatever is above it."""
    _, A = sparse(300, 300, 0.05, "csc")
    nnz, K = A._storage.nnz, 32
    p = problem("ij,jk->ik", A, torch.zeros(300, K))
    scatter, rows = estimate(["j", "i", "k"], p), estimate(["i", "j", "k"], p)
    assert scatter.updates == pytest.approx(UPDATE_VISITS * nnz * K / VECTOR_VISITS)
    assert rows.updates == pytest.approx(UPDATE_VISITS * 300 * K / VECTOR_VISITS)
    assert scatter.work == pytest.approx(rows.work)
    # a reduction innermost: one update per stored entry (j, i, k) or per row (i, j, k)
    q = problem("ij,ik->i", A, torch.zeros(300, K))
    assert estimate(["j", "i", "k"], q).updates == pytest.approx(UPDATE_VISITS * nnz)
    assert estimate(["i", "j", "k"], q).updates == pytest.approx(UPDATE_VISITS * 300)
    # no reduction: each result written once in every order, nothing to tell apart
    r = problem("ij,jk->ijk", A, torch.zeros(300, 4))
    assert estimate(["j", "i", "k"], r).updates == 0


def test_kept_transposes_are_priced_as_a_gather():
    _, A = sparse(300, 300, 0.05, "csc")
    X = torch.zeros(300, 32)
    first = estimate(["i", "j", "k"], problem("ij,jk->ik", A, X))
    again = estimate(["i", "j", "k"], problem("ij,jk->ik", A, X, kept=True))
    assert first.transposes > 0 and again.transposes == pytest.approx(first.transposes / 10)
    assert estimate(["j", "i", "k"], problem("ij,jk->ik", A, X, kept=True)).transposes == 0


def test_reductions_inside_keep_the_outer_output_loops_in_order():
    _, A = sparse(300, 300, 0.05, "csr")
    p = problem("ij,bjk->ikb", A, torch.zeros(4, 300, 16))
    cands = reductions_inside(["i", "k", "j", "b"], p)
    assert ["i", "b", "j", "k"] in cands and ["k", "b", "j", "i"] in cands
    assert all(c[-2] == "j" for c in cands) and ["b", "i", "j", "k"] not in cands
    assert reductions_inside(["i", "b", "j", "k"], p) == [["b", "k", "j", "i"], ["i", "k", "j", "b"]]
    assert reductions_inside([], p) == []
    # no reduction: nothing to move
    q = problem("ij,jk->ijk", A, torch.zeros(300, 4))
    assert reductions_inside(["i", "j", "k"], q) == []


def test_seen_again_counts_a_pattern_not_a_tensor():
    _, A = sparse(50, 50, 0.1, "csr", seed=3)
    st = A._storage
    assert [kept_conversions.seen_again(st) for _ in range(kept_conversions.REUSED_AFTER)] == \
        [False] * kept_conversions.REUSED_AFTER
    assert kept_conversions.seen_again(st)
    # the same arrays with other values (an optimizer step): the same pattern
    other = type(st)(st.format, st.shape, st.levels, st.values * 2)
    assert kept_conversions.seen_again(other)
    # a new pattern (new arrays, equal contents) starts over
    _, B = sparse(50, 50, 0.1, "csr", seed=3)
    assert not kept_conversions.seen_again(B._storage)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_reused_csc_operand_switches_to_its_kept_transpose(threads):
    """CSC ``A @ X`` (3000^2, 0.5 %, K = 32): the first calls scatter (``j, i, k``), the call
    that sees the pattern again converts it once (kept) and sums rows in registers
    (``i, j, k``); later calls reuse the conversion. At 1 thread 0.090 -> 0.052 ms."""
    Ad, A = sparse(3000, 3000, 0.005, "csc", seed=10 + threads)   # (a pattern of its own)
    X = torch.randn(3000, 32)

    def run():
        plan = scorch.explain("ij,jk->ik", A, X, out_format="dense")
        assert plan.reused is not None and plan.reused.loop_order == ["i", "j", "k"]
        assert plan.loop_order == ["j", "i", "k"]
        assert "on reuse:     loop order i, j, k" in str(plan)
        want = Ad @ X
        misses = []
        for call in range(kept_conversions.REUSED_AFTER + 3):
            before = kept_conversions.reformat_cache_info()["misses"]
            torch.testing.assert_close(A @ X, want, rtol=1e-4, atol=1e-4)
            misses.append(kept_conversions.reformat_cache_info()["misses"] - before)
        # converted and kept once, on the call that sees the pattern again
        assert misses == [0] * kept_conversions.REUSED_AFTER + [1, 0, 0]
        # the reuse plan's calls take a warm runner (reading the kept conversion), which
        # hands back the same converted Storage while the values stay
        from scorch.tensor_compiler.plans import _plans
        reused = [e.reuse for e in _plans.values() if e.reuse is not None and e.reuse.kernels]
        assert reused and all(e.runner is not None for e in reused)
        fmt = plan.reused.transposes[0][2]
        assert kept_conversions.reformatted(A._storage, fmt) is kept_conversions.reformatted(A._storage, fmt)
        # new values on the same pattern (an optimizer step): the kept conversion gathers them
        A._storage.values.mul_(-2)
        torch.testing.assert_close(A @ X, -2 * want, rtol=1e-4, atol=1e-4)
    with_threads(threads, run)


def test_the_result_format_stays_across_the_switch():
    """A sparse result's format is inferred from the loop order (Algorithm 4); the reuse
    plan keeps the first plan's (``ij,bjk->ikb`` over CSC: ``cdd`` in order i, k, b)."""
    Ad, A = sparse(3000, 3000, 0.005, "csc", seed=2)
    B = torch.randn(4, 3000, 16)
    plan = with_threads(1, lambda: scorch.explain("ij,bjk->ikb", A, B))
    assert plan.reused is not None and plan.reused.loop_order == ["i", "b", "j", "k"]
    assert plan.reused.output_format == plan.output_format
    want = torch.einsum("ij,bjk->ikb", Ad, B)
    formats = set()
    for _ in range(kept_conversions.REUSED_AFTER + 2):
        got = with_threads(1, lambda: scorch.einsum("ij,bjk->ikb", A, B))
        formats.add(got.format)
        torch.testing.assert_close(got.to_dense(), want, rtol=1e-4, atol=1e-4)
    assert len(formats) == 1


EQUATIONS = {
    "ij,jk->ik": lambda n, g, dt: torch.randn(n, 8, generator=g, dtype=dt),
    "ij,ik->jk": lambda n, g, dt: torch.randn(n, 8, generator=g, dtype=dt),
    "ij,bjk->bik": lambda n, g, dt: torch.randn(3, n, 8, generator=g, dtype=dt),
    "ij,bjk->ikb": lambda n, g, dt: torch.randn(3, n, 8, generator=g, dtype=dt),
    "ij,jbk->ibk": lambda n, g, dt: torch.randn(n, 3, 8, generator=g, dtype=dt),
    "ij,jk->ki": lambda n, g, dt: torch.randn(n, 5, generator=g, dtype=dt),
}


@settings(max_examples=30, deadline=None)
@given(equation=st.sampled_from(sorted(EQUATIONS)), fmt=st.sampled_from(["csc", "csr", "coo", "dcsc"]),
       shape=st.sampled_from([(600, 600), (900, 500), (70, 70), (0, 40), (40, 1)]),
       density=st.sampled_from([0.0, 0.02, 0.3, 1.0]), dtype=st.sampled_from([torch.float32, torch.float64]),
       dense_out=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 50))
def test_every_call_equals_dense(equation, fmt, shape, density, dtype, dense_out, threads, seed):
    """Whichever plan a call runs (first, or reuse with the kept transpose), the result is
    dense torch's, in one format for every call; shapes with an empty dimension, empty and
    fully dense operands, every format the reuse can transpose."""
    m, n = shape
    Ad, A = sparse(m, n, density, fmt, seed, dtype)
    other = EQUATIONS[equation](m if equation.startswith("ij,ik") else n, torch.Generator().manual_seed(seed), dtype)
    want = torch.einsum(equation, Ad, other)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    kinds = set()
    for _ in range(kept_conversions.REUSED_AFTER + 2):
        got = with_threads(threads, lambda: scorch.einsum(equation, A, other, out_format="dense" if dense_out else None))
        kinds.add(got.format if isinstance(got, scorch.SparseTensor) else "dense")
        torch.testing.assert_close(dense_of(got), want, rtol=tol, atol=tol)
    assert len(kinds) == 1


def test_a_torch_buffer_refilled_in_place_is_not_read_through_its_old_transpose():
    """Fixed fan-out sampling keeps one torch CSR tensor and refills it with ``copy_``: torch
    writes the same index arrays in place, and scorch reads them without a copy. The
    transposed pattern kept for the old contents (the gradient's partner) must not be reused
    for the new ones: the arrays' version counters moved."""
    def pattern(seed):
        g = torch.Generator().manual_seed(seed)
        d = torch.zeros(200, 150)
        d.view(-1)[torch.randperm(200 * 150, generator=g)[:3000]] = torch.rand(3000, generator=g) + 0.1
        return d
    X, G = torch.randn(150, 8), torch.randn(200, 8)
    buffer = pattern(1).to_sparse_csr()
    for step in (1, 2, 3):
        d = pattern(step)
        if step > 1:
            buffer.copy_(d.to_sparse_csr())
        for _ in range(2):
            x = X.clone().requires_grad_()
            ((scorch.sparse_tensor(buffer) @ x) * G).sum().backward()
            torch.testing.assert_close(x.grad, d.t() @ G)


def test_plans_are_made_again_for_a_new_thread_count():
    """A plan is priced for the thread count it was made at (the cost model divides the
    parallel work by it): after ``torch.set_num_threads`` the next calls plan again."""
    from scorch.tensor_compiler import api, plans
    saved = torch.get_num_threads()
    d, A = sparse(3000, 3000, 0.002, "csr", seed=5)
    Y = torch.randn(3000, 32)
    try:
        torch.set_num_threads(1)
        for _ in range(2):
            torch.testing.assert_close(A.t() @ Y, d.t() @ Y, rtol=1e-4, atol=1e-4)
        first = set(map(id, plans._plans.values()))
        torch.set_num_threads(2)
        for _ in range(3):
            torch.testing.assert_close(A.t() @ Y, d.t() @ Y, rtol=1e-4, atol=1e-4)
        assert plans._plans and not (set(map(id, plans._plans.values())) & first)
    finally:
        torch.set_num_threads(saved)
        api.plan_cache_clear()
