"""The cost model with the operands' statistics (``operand_stats``, ``work_estimate``,
``loop_order.choose_by_estimate``): statistics computed once per pattern, a skewed and a
uniform matrix of the same shape and stored entries priced differently (and planned
differently where the heaviest row caps the parallel loop), transposes weighed by stored
entries, and ``explain`` showing the estimate it chose by. Results stay those of dense
torch whatever the plan."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch
from scorch.tensor_compiler.index_notation import parse_einsum
from scorch.tensor_compiler.operand_stats import SKEW_SPREAD, operand_stats, stats_class
from scorch.tensor_compiler.planner import stats_key
from scorch.tensor_compiler.schedule import schedule
from scorch.tensor_compiler.work_estimate import Statistics, estimate


def _distinct(k: int, n: int, g: torch.Generator) -> torch.Tensor:
    """k distinct integers drawn uniformly from [0, n) in random order (a randperm of n
    takes seconds for the 4e7 positions here)."""
    drawn = torch.empty(0, dtype=torch.long)
    while drawn.numel() < k:
        drawn = torch.cat([drawn, torch.randint(0, n, (2 * k,), generator=g)]).unique()
    return drawn[torch.randperm(drawn.numel(), generator=g)[:k]]


def matrix(m: int, n: int, nnz: int, hub: int, seed: int = 0, fmt: str = "csr",
           dtype=torch.float64):
    """An m x n matrix with exactly ``nnz`` entries, ``hub`` of them in row 0 and the rest
    spread uniformly over the other rows (hub = 0: uniform)."""
    g = torch.Generator().manual_seed(seed)
    hub_cols = torch.randperm(n, generator=g)[:hub]
    rest = _distinct(nnz - hub, (m - 1) * n, g)
    rows = torch.cat([torch.zeros(hub, dtype=torch.long), 1 + rest // n])
    cols = torch.cat([hub_cols, rest % n])
    vals = torch.rand(nnz, generator=g, dtype=torch.float64).to(dtype) + 0.5
    coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (m, n)).coalesce()
    return scorch.sparse_tensor(coo, format=fmt)


def test_statistics_of_skewed_and_uniform():
    U = matrix(2000, 20000, 20000, 0)._storage
    S = matrix(2000, 20000, 20000, 12000)._storage
    su, ss = operand_stats(U), operand_stats(S)
    assert su.nnz == ss.nnz == 20000 and su.shape == ss.shape
    assert su.segments.seg_max < 40 and not su.skewed
    assert ss.segments.seg_max == 12000 and ss.skewed and ss.row_spread >= SKEW_SPREAD
    assert ss.segments.seg_cv > 10 * su.segments.seg_cv
    assert 0 < su.distinct_last <= 20000 and su.levels[0].density == 1.0
    assert su.levels[1].density == pytest.approx(20000 / (2000 * 20000))
    # computed once per pattern: the same object from the cache, also for a storage on
    # the same arrays with other values
    assert operand_stats(U) is su
    again = scorch.tensor_compiler.api.Storage(U.format, U.shape, U.levels, U.values * 2)
    assert operand_stats(again) is su
    # the plan-key class tells them apart; tiny operands compute nothing
    assert stats_class(U) != stats_class(S)
    assert stats_class(matrix(10, 10, 20, 0)._storage) == (0, False)


def priced(A, B, threads: int, kept: bool = False):
    """The schedule of ``A @ B`` priced with statistics; ``kept``: as a call that sees the
    operands again prices it (``planner.reuse_entry``: transposes kept across calls)."""
    spec = parse_einsum("ij,jk->ik", [A.shape, B.shape])
    stats = Statistics({0: operand_stats(A), 1: operand_stats(B)},
                       {"i": A.shape[0], "j": A.shape[1], "k": B.shape[1]}, threads,
                       frozenset({0, 1}) if kept else frozenset())
    return schedule(spec.assignment, [A.format, B.format], None, None, stats)


def test_skew_changes_the_estimate_and_the_plan():
    """A @ B with A CSR and B CSC: one of them must be transposed. Uniform A: transpose the
    smaller B and run over A's rows. Skewed A (one row holds 60 % of its entries): a loop
    over A's rows reaches only 1 / 0.6 of 16 threads, so once the transposes are kept
    across calls, transposing A and running over B's columns is cheaper; on a first call
    the conversion of either operand outweighs the threads (``TRANSPOSE_PASSES``)."""
    B = matrix(20000, 2000, 18000, 0, seed=1, fmt="csc")._storage
    U = matrix(2000, 20000, 20000, 0)._storage
    S = matrix(2000, 20000, 20000, 12000)._storage
    su, ss = priced(U, B, 16, kept=True), priced(S, B, 16, kept=True)
    assert su.loop_order == ["i", "j", "k"]
    assert ss.loop_order == ["k", "j", "i"]
    chosen_u = {c.order: c.estimate for c in su.estimates}
    chosen_s = {c.order: c.estimate for c in ss.estimates}
    ijk = ("i", "j", "k")
    assert chosen_u[ijk].threads == 16 and chosen_s[ijk].threads < 2
    assert chosen_s[ijk].total > chosen_u[ijk].total
    assert su.estimates[0].chosen and ss.estimates[0].chosen
    # a first call converts: the smaller operand, whatever the threads
    assert priced(S, B, 16).loop_order == priced(U, B, 16).loop_order == ["i", "j", "k"]
    # at one thread nothing is capped: the same plan for both
    assert priced(S, B, 1, kept=True).loop_order == priced(U, B, 1, kept=True).loop_order == ["i", "j", "k"]


def test_transposes_weigh_stored_entries():
    """Which operand is transposed follows their stored entries."""
    small = matrix(3000, 3000, 6000, 0)._storage
    big = matrix(3000, 3000, 60000, 0, seed=2)._storage
    small_c = matrix(3000, 3000, 6000, 0, seed=3, fmt="csc")._storage
    big_c = matrix(3000, 3000, 60000, 0, seed=4, fmt="csc")._storage
    s1 = priced(big, small_c, 2)
    s2 = priced(small, big_c, 2)
    assert [ap.tensor for ap in s1.accesses if ap.transposed] == [1]
    assert [ap.tensor for ap in s2.accesses if ap.transposed] == [0]


def test_explain_shows_the_estimate():
    A = matrix(2000, 20000, 20000, 12000, fmt="csr")
    B = matrix(20000, 2000, 18000, 0, seed=1, fmt="csc")
    text = str(scorch.explain("ij,jk->ik", A, B))
    assert "statistics:   operand 0: nnz 20000" in text and "skewed" in text
    assert "estimate:" in text and "chosen" in text and "runner-up:" in text
    # tiny operands: no statistics, no estimate lines
    small = str(scorch.explain("ij,jk->ik", matrix(20, 20, 30, 0), matrix(20, 20, 30, 0, seed=1)))
    assert "estimate:" not in small
    # skewed and uniform operands of one format have plans of their own
    U = matrix(2000, 20000, 20000, 0)
    assert stats_key([A._storage, B._storage]) != stats_key([U._storage, B._storage])


@settings(max_examples=8, deadline=None)
@given(hub=st.sampled_from([0, 3000, 4500]), threads=st.sampled_from([1, 2]),
       dtype=st.sampled_from([torch.float32, torch.float64]), fa=st.sampled_from(["csr", "csc", "coo"]),
       fb=st.sampled_from(["csr", "csc", "dcsr"]), seed=st.integers(0, 100))
def test_results_equal_dense_whatever_the_plan(hub, threads, dtype, fa, fb, seed):
    A = matrix(300, 5000, 5000, hub, seed=seed, fmt=fa, dtype=dtype)
    B = matrix(5000, 40, 4500, 0, seed=seed + 1, fmt=fb, dtype=dtype)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        C = scorch.einsum("ij,jk->ik", A, B)
        y = scorch.einsum("ij,j->i", A, torch.ones(5000, dtype=dtype))
    finally:
        torch.set_num_threads(old)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(C.to_dense(), A.to_dense() @ B.to_dense(), rtol=tol, atol=tol)
    if isinstance(y, scorch.SparseTensor):     # CSC A: a scatter into a sparse vector
        y = y.to_dense()
    torch.testing.assert_close(y, A.to_dense().sum(1), rtol=tol, atol=tol)


def test_estimate_needs_statistics():
    A = matrix(50, 50, 100, 0)._storage
    spec = parse_einsum("ij,j->i", [A.shape, (50,)])
    s = schedule(spec.assignment, [A.format, None])
    assert s.estimates == [] and s.statistics is None
    from scorch.tensor_compiler.cost_model import OrderProblem
    from scorch.tensor_compiler import merge_lattice as ml
    ids = ml.access_ids(spec.assignment.rhs)
    p = OrderProblem(spec.assignment, ids, [A.format, None], ml.formula(spec.assignment.rhs, ids),
                     False, None)
    assert estimate(["i", "j"], p, 2) is None


@pytest.mark.parametrize("equation,fmt", [("ij,ik->jk", "csr"), ("ij,jk->ik", "csc")])
def test_a_dense_innermost_loop_is_priced_in_vectors(equation, fmt):
    """``A^T X`` (CSR) and ``A @ X`` (CSC) at 2 threads: counted value by value, ``k`` split
    over the threads above a scalar workspace add per stored entry looked cheaper than one
    thread adding rows of ``k`` (0.89 ms against 0.18 ms at 3000^2, 0.5 %, K = 32). Priced
    in vectors (``work_estimate.VECTOR_VISITS``), the row stays innermost."""
    A = matrix(3000, 3000, 45000, 0, fmt=fmt, dtype=torch.float32)
    X = torch.randn(3000, 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plan = scorch.explain(equation, A, X)
        assert plan.loop_order[-1] == "k", plan.loop_order
        for _ in range(2):
            got = scorch.einsum(equation, A, X)
            got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
            torch.testing.assert_close(got, torch.einsum(equation, A.to_dense(), X))
    finally:
        torch.set_num_threads(threads)


def test_an_output_major_candidate_is_priced():
    """Algorithm 1 keeps CSC's own order for ``A @ X`` over a batch (``j, i, b, k``: each
    stored entry scatters a block of the result). The estimate also prices the order with
    ``A`` read output-major (``loop_order.output_major_order``: as CSR, ``i`` first), whose
    rows accumulate in registers and whose outer loop runs in parallel: at 2 threads 0.55 ->
    0.23 ms (3000^2 at 0.5 %, 4 x 16)."""
    from scorch.tensor_compiler.loop_order import output_major_order
    A = matrix(3000, 3000, 45000, 0, fmt="csc", dtype=torch.float32)
    X = torch.randn(4, 3000, 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plan = scorch.explain("ij,bjk->bik", A, X)
        assert plan.loop_order[0] == "i", plan.loop_order
        assert any(p.order[0] == "i" for p in plan.schedule.estimates)
        for _ in range(2):
            got = scorch.einsum("ij,bjk->bik", A, X)
            got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
            torch.testing.assert_close(got, torch.einsum("ij,bjk->bik", A.to_dense(), X))
    finally:
        torch.set_num_threads(threads)
    # every operand already output-major: no candidate
    spec = parse_einsum("ij,jk->ik", [(5, 6), (6, 7)])
    C = matrix(5, 6, 10, 0)._storage
    from scorch.tensor_compiler import merge_lattice as ml
    from scorch.tensor_compiler.cost_model import OrderProblem
    ids = ml.access_ids(spec.assignment.rhs)
    p = OrderProblem(spec.assignment, ids, [C.format, None], ml.formula(spec.assignment.rhs, ids), False)
    assert output_major_order(p) is None


# --- session 30: products never accumulate the whole result in a workspace ----------------

@pytest.mark.parametrize("fa,fb", [("csc", "csr"), ("coo", "coo"), ("coo", "csr"), ("csr", "coo"),
                                   ("csc", "csc"), ("coo", "csc")])
def test_sparse_products_avoid_a_workspace_as_large_as_the_result(fa, fb):
    """CSC x CSR ran as an outer product into a 2-D workspace (a std::map past 4M positions:
    90x scipy) because the estimate priced its updates as a row's; a COO operand cannot be
    located by a coordinate, so it is read as CSR (kept). Each plan now has at most a
    one-dimensional workspace, and the result equals dense torch."""
    n, per_row = 3000, 6
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, n, (2, n * per_row), generator=g)
    val = torch.rand(n * per_row, generator=g, dtype=torch.float64)
    A = scorch.sparse_tensor((idx, val), size=(n, n), format=fa)
    B = scorch.sparse_tensor((idx.flip(0), val), size=(n, n), format=fb)
    plan = scorch.explain("ij,jk->ik", A, B)
    assert all(not w.startswith(("i,k", "k,i")) for w in plan.workspaces), plan.workspaces
    want = A.to_dense() @ B.to_dense()
    torch.testing.assert_close((A @ B).to_dense(), want)
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, B).to_dense(), want)


def test_hypersparse_coo_products_keep_compressed_levels():
    """A COO operand with far more rows than entries is read as DCSR, not CSR: no array as
    long as its rows (cost follows the stored entries)."""
    n = 1 << 24
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 2000, (2, 300), generator=g) * 4096
    A = scorch.sparse_tensor((idx, torch.rand(300, generator=g, dtype=torch.float64)),
                             size=(n, n), format="coo")
    plan = scorch.explain("ij,jk->ik", A, A)
    assert all(not w.startswith(("i,k", "k,i")) for w in plan.workspaces), plan.workspaces
    got = (A @ A).to_torch().coalesce()
    t = A.to_torch()
    want = torch.sparse.mm(t, t).coalesce()
    assert torch.equal(got.indices(), want.indices())
    torch.testing.assert_close(got.values(), want.values())


def test_plans_are_not_shared_across_extents_of_one():
    """A loop order priced for a 1-column operand (``k`` outermost costs nothing at K = 1)
    must not be reused for a wide one: the plan key holds which dense extents are 1
    (``planner.unit_mask``), in the Python and the C warm keys alike. Reused, ``A.t() @ X``
    at K = 64 made 64 passes over A (9-22 ms against 1-3)."""
    A = matrix(3000, 3000, 30000, 0)
    for eq in ("ji,jk->ik", "ij,ik->jk"):
        X1, X64 = torch.randn(3000, 1).double(), torch.randn(3000, 64).double()
        for _ in range(2):
            scorch.einsum(eq, A, X1)
        wide = scorch.explain(eq, A, X64)
        assert wide.loop_order[0] != "k", (eq, wide.loop_order)
        got = scorch.einsum(eq, A, X64)
        torch.testing.assert_close(got.to_dense() if isinstance(got, scorch.SparseTensor) else got,
                                   torch.einsum(eq, A.to_dense(), X64), rtol=1e-4, atol=1e-4)


def test_a_dense_reduction_of_one_does_not_buy_a_workspace():
    """A sparse weight's gradient at batch 1 (``oj,oa,ja->oj``): ``o, a, j`` drains a
    workspace per row and assembles a new pattern (1.9 ms at 1024^2, 10 %), ``o, j, a``
    writes onto the weight's pattern (0.4 ms); the drain is priced (ROW_WORKSPACE_VISITS)."""
    W = matrix(1024, 1024, 100_000, 0)
    plan = scorch.explain("oj,oa,ja->oj", W, torch.randn(1024, 1), torch.randn(1024, 1))
    assert plan.loop_order == ["o", "j", "a"] and not plan.workspaces
