"""Unit tests per compiler layer: parsing, printer, format inference, schedule decisions,
lowering of each level-kind combination, caching and errors."""
import pytest
import torch

from compiler_helpers import check_storage, dense, rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import plans, threads as thread_policy
from scorch.tensor_compiler.tiling import choose_panel
from scorch.tensor_compiler import merge_lattice as ml
from scorch.tensor_compiler.format_inference import infer_output_kinds
from scorch.tensor_compiler.index_notation import Access, Assignment, Scalar, parse_einsum
from scorch.tensor_compiler.schedule import schedule
from scorch.formats import Format, LevelKind, as_format



# ---------------------------------------------------------------- parsing
def test_parse_explicit_and_implicit():
    s = parse_einsum("ij,jk->ik", [(2, 3), (3, 4)])
    assert s.assignment.output == ("i", "k")
    assert s.assignment.reduction == ("j",)
    assert s.sizes == {"i": 2, "j": 3, "k": 4}
    s = parse_einsum("bA,ba", [(2, 3), (2, 3)])  # torch: upper case before lower case
    assert s.assignment.output == ("A", "a")
    s = parse_einsum("ij,jk", [(2, 3), (3, 4)])
    assert s.assignment.output == ("i", "k")


def test_parse_ellipsis_and_broadcast():
    s = parse_einsum("...ij,...jk->...ik", [(5, 2, 3), (1, 3, 4)])
    assert s.assignment.output == ("_0", "i", "k")
    assert s.sizes["_0"] == 5
    assert s.broadcast[1] == (0,)
    s = parse_einsum("...ij,jk", [(7, 5, 2, 3), (3, 4)])
    assert s.assignment.output == ("_0", "_1", "i", "k")


def test_parse_errors_name_index_and_operands():
    with pytest.raises(ValueError, match=r"subscript j has size 4 for operand 1.*size 3 \(operand 0\)"):
        parse_einsum("ij,jk->ik", [(2, 3), (4, 4)])
    with pytest.raises(ValueError, match="number of subscripts"):
        parse_einsum("ijk,jk->i", [(2, 3), (3, 4)])
    with pytest.raises(ValueError, match="output subscript"):
        parse_einsum("ij->z", [(2, 3)])


def test_einsum_size_error_at_runtime():
    a = sparse(rand((3, 4)), "csr")
    with pytest.raises(ValueError, match="subscript j has size 5 for operand 1"):
        C.einsum("ij,jk->ik", a, torch.randn(5, 2, dtype=torch.float64))


def test_expression_printer():
    A, B = Access(0, "ij"), Access(1, "ij")
    asg = Assignment("ij", A - 0.5 * B)
    assert str(asg) == "out(i,j) = T0(i,j) - 0.5 * T1(i,j)"
    assert str(Assignment("ij", A - (B - A))) == "out(i,j) = T0(i,j) - (T1(i,j) - T0(i,j))"
    asg = Assignment("i", A * B + A)
    assert str(asg) == "out(i) = sum_j T0(i,j) * T1(i,j) + T0(i,j)"


# ---------------------------------------------------------------- merge lattice
def test_presence_formula():
    A, B, D = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")
    ids = ml.access_ids(A * B + D)
    f = ml.formula(A * B + D, ids)
    assert ml.dense_needed(f, [0, 1]) is True      # D present everywhere -> dense loop
    assert ml.dense_needed(ml.formula(A * B, ids), [0, 1]) is False
    assert ml.necessary(ml.formula(A * B, ids), [0, 1]) == [0, 1]
    assert ml.necessary(ml.formula(A + B, ids), [0, 1]) == []
    assert ml.to_code(ml.formula(A + B, ids), {0: "f0", 1: "f1"}.get) == "(f0 or f1)"


# ---------------------------------------------------------------- format inference
def _kinds(eq, fmts):
    s = parse_einsum(eq, [(3,) * len(t) for t in eq.split("->")[0].split(",")])

    def kind_of(acc, v):
        f = fmts[acc.tensor]
        return LevelKind.DENSE if f is None else f.kind_of_dim(acc.indices.index(v))
    return "".join(k.letter for k in infer_output_kinds(s.assignment.rhs, s.assignment.output, kind_of).values())


def test_format_inference_algorithm4():
    csr, dcsr, coo = as_format("csr"), as_format("dcsr"), as_format("coo", 2)
    assert _kinds("ij,jk->ik", [csr, None]) == "dd"          # SpMM: dense
    assert _kinds("ij,jk->ik", [csr, csr]) == "dc"           # SpGEMM: CSR
    assert _kinds("ij,ik,kj->ij", [csr, None, None]) == "dc"  # SDDMM: like S
    assert _kinds("ij,ij->ij", [coo, None]) == "qq"
    assert _kinds("bd,ndh,bn->bh", [None, None, coo]) == "qd"
    A, B, D = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")
    fm = [csr, dcsr, None]

    def kind_of(acc, v):
        f = fm[acc.tensor]
        return LevelKind.DENSE if f is None else f.kind_of_dim(acc.indices.index(v))
    got = infer_output_kinds(A + B, ("i", "j"), kind_of)
    assert [k.letter for k in got.values()] == ["d", "c"]     # paper D.3: CSR
    got = infer_output_kinds(A + D, ("i", "j"), kind_of)
    assert [k.letter for k in got.values()] == ["d", "d"]     # adding dense gives dense
    got = infer_output_kinds(A * D, ("i", "j"), kind_of)
    assert [k.letter for k in got.values()] == ["d", "c"]     # product with sparse stays sparse


# ---------------------------------------------------------------- schedule decisions
def _sched(eq, fmts, out=None):
    s = parse_einsum(eq, [(3,) * len(t) for t in eq.split("->")[0].split(",")])
    return schedule(s.assignment, fmts, out)


def test_schedule_spgemm_gustavson():
    s = _sched("ij,jk->ik", [as_format("csr"), as_format("csr")])
    assert s.loop_order == ["i", "j", "k"]
    assert s.output.mode == "ws" and s.output.ws_vars == ("k",)
    assert s.workspaces[0].startswith("k: sparse workspace (appended pairs")
    assert not any(a.transposed for a in s.accesses)


def test_schedule_spgemm_csr_csc_transposes_instead_of_inner_product():
    s = _sched("ij,jk->ik", [as_format("csr"), as_format("csc")])
    assert s.loop_order == ["i", "j", "k"]          # not the inner product i,k,j
    assert [a.transposed for a in s.accesses] == [False, True]
    assert s.accesses[1].format == as_format("csr")


def test_schedule_sddmm_fused_ijk():
    s = _sched("ij,ik,kj->ij", [as_format("csr"), None, None])
    assert s.loop_order == ["i", "j", "k"]
    assert s.output.format == as_format("csr") and s.output.mode == "acc"
    assert s.workspaces == []


def test_schedule_spmm_and_concordance():
    s = _sched("ij,jk->ik", [as_format("csr"), None])
    assert s.loop_order == ["i", "j", "k"] and s.output.dense
    s = _sched("ij,jk->ik", [as_format("csc"), None])   # concordant j,i,k: no transpose
    assert s.loop_order[:2] == ["j", "i"] and not s.accesses[0].transposed


def test_schedule_tiles_dense_loops_only_algorithm3():
    assert _sched("ij,jk->ik", [as_format("csr"), None]).tiled == ["k"]       # never j or i
    assert _sched("ij,ik,kj->ij", [as_format("csr"), None, None]).tiled == ["k"]
    assert _sched("ij,j->i", [as_format("csr"), None]).tiled == []
    assert _sched("ij,jk->ik", [as_format("csr"), as_format("csr")]).tiled == []
    assert _sched("ij,jk->ik", [None, None]).tiled == ["i", "j", "k"]


def test_schedule_moe_gate_sparse():
    s = _sched("bd,ndh,bn->bh", [None, None, as_format("coo", 2)])
    assert s.loop_order == ["b", "n", "d", "h"]


def test_schedule_conflicting_mode_orders_fewest_transposes():
    s = _sched("ij,ij,ij->ij", [as_format("csr"), as_format("csc"), as_format("csr")])
    assert [a.transposed for a in s.accesses] == [False, True, False]


def test_explain_shows_the_loop_ir():
    """``explain`` shows the lowered kernel itself (not a side copy): Gustavson SpGEMM's loops
    by role, the workspace it scatters into and drains, the rows assembly."""
    a = sparse(rand((6, 6), 0.5, seed=3), "csr")
    plan = C.explain("ij,jk->ik", a, a)
    text = str(plan)
    assert plan.loop_ir is not None and "loop IR:" in text
    outline = text[text.index("loop IR:"):]
    assert "# dense" in outline and "# segment" in outline
    assert "dense_ws_drain" in outline and "RowsOutput" in outline
    from scorch.tensor_compiler.codegen import print_kernel
    assert print_kernel(plan.loop_ir) == plan.source


# ---------------------------------------------------------------- lowering: level-kind combos
LEVELS2 = ["dc", "cc", "qq", "cd", "dd", "qc", "dq", "cq"]


@pytest.mark.parametrize("kinds", LEVELS2)
@pytest.mark.parametrize("mode", [(0, 1), (1, 0)])
def test_spmv_every_level_combination(kinds, mode):
    x = rand((7, 6), 0.4, seed=3)
    v = torch.randn(6, dtype=torch.float64)
    a = sparse(x, Format(kinds, mode))
    torch.testing.assert_close(dense(C.einsum("ij,j->i", a, v)), x @ v)


@pytest.mark.parametrize("ka,kb", [("dc", "dc"), ("cc", "qq"), ("qq", "dc"), ("dc", "dd"), ("cd", "cc")])
def test_elementwise_products_and_sums(ka, kb):
    x, y = rand((5, 6), 0.4, seed=1), rand((5, 6), 0.4, seed=2)
    a, b = sparse(x, Format(ka)), sparse(y, Format(kb))
    r = C.einsum("ij,ij->ij", a, b)
    torch.testing.assert_close(dense(r), x * y)
    A, B = Access(0, "ij"), Access(1, "ij")
    r = C.compute(Assignment("ij", A - 0.5 * B), a, b)
    if not isinstance(r, torch.Tensor):
        check_storage(r)
    torch.testing.assert_close(dense(r), x - 0.5 * y)
    r = C.compute(Assignment("ij", A + B), a, b)
    torch.testing.assert_close(dense(r), x + y)


def test_elementwise_with_dense_operand_is_dense():
    x = rand((5, 6), 0.4, seed=1)
    d = torch.randn(5, 6, dtype=torch.float64)
    a = sparse(x, "csr")
    A, D = Access(0, "ij"), Access(1, "ij")
    r = C.compute(Assignment("ij", A + D), a, d)
    assert isinstance(r, torch.Tensor)
    torch.testing.assert_close(r, x + d)
    r = C.compute(Assignment("ij", A * D), a, d)
    assert not isinstance(r, torch.Tensor) and r.format == as_format("csr")
    torch.testing.assert_close(dense(r), x * d)


def test_coo_three_level_grouping():
    x = rand((4, 3, 5), 0.5, seed=4)
    a = sparse(x, "coo")
    w = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(dense(C.einsum("ijk,k->ij", a, w)), x @ w)
    r = C.einsum("ijk->ijk", a)
    check_storage(r)
    assert r.format == as_format("coo", 3)
    torch.testing.assert_close(dense(r), x)


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_index_widths(idt):
    x = rand((6, 5), 0.5, seed=5)
    a = sparse(x, "csr", index_dtype=idt)
    assert a.index_dtype == idt
    b = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(C.einsum("ij,jk->ik", a, b), x @ b)


@pytest.mark.parametrize("dt", [torch.float32, torch.int64])
def test_value_dtypes(dt):
    x = (rand((6, 5), 0.5, seed=6) * 4).to(dt)
    b = (torch.randn(5, 3) * 4).to(dt)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), b)
    assert r.dtype == dt
    torch.testing.assert_close(r, torch.einsum("ij,jk->ik", x, b), rtol=1e-5, atol=1e-4)


def test_spgemm_sparse_output_structure():
    x, y = rand((8, 7), 0.3, seed=7), rand((7, 9), 0.3, seed=8)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), sparse(y, "csr"))
    assert r.format == as_format("csr")
    check_storage(r)
    torch.testing.assert_close(dense(r), x @ y)


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_spgemm_rows_assembly(idt, threads, monkeypatch, request):
    """CSR outputs are assembled row-wise (counts into pos, chunk buffers copied in order):
    rows of every length, empty rows, both index widths, one and several chunks."""
    monkeypatch.setattr(thread_policy, "PARALLEL_MIN_WORK", 0)
    C.plan_cache_clear()
    request.addfinalizer(C.plan_cache_clear)   # no runner keeps the patched threshold
    x, y = rand((300, 40), 0.08, seed=11), rand((40, 500), 0.1, seed=12)
    x[100:150] = 0   # a run of empty output rows
    x[7] = 1.0       # a dense row: its output row is read out by scanning marks
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        r = C.einsum("ij,jk->ik", sparse(x, "csr", index_dtype=idt), sparse(y, "csr", index_dtype=idt))
    finally:
        torch.set_num_threads(old)
    check_storage(r)
    assert r.format == as_format("csr") and r.index_dtype == torch.int32
    torch.testing.assert_close(dense(r), x @ y)
    src = C.explain("ij,jk->ik", sparse(x, "csr", index_dtype=idt), sparse(y, "csr", index_dtype=idt)).source
    assert "out_pos" in src and "dense_scratch" in src and "ocrd[0]" not in src


def test_spgemm_map_workspace_for_huge_extent():
    """A workspace extent over the dense-array limit runs the appended-pairs variant."""
    import numpy as np
    import scipy.sparse as sp
    from scorch.tensor_compiler.codegen import DENSE_WS_LIMIT
    n = DENSE_WS_LIMIT + 1000
    A = sp.random(30, 50, density=0.2, format="csr", random_state=1)
    rng = np.random.default_rng(2)   # ~840 entries (sp.random over 2e8 positions takes 17 s)
    rows = np.concatenate([rng.integers(0, 50, 840), [0, 0, 1]])
    cols = np.concatenate([rng.integers(0, n, 840), [0, n - 1, n // 2]])   # both ends of the extent
    B = sp.csr_matrix((rng.random(rows.size), (rows, cols)), shape=(50, n))
    B.sum_duplicates()
    B.sort_indices()
    from scorch.interop import from_scipy
    a, b = from_scipy(A), from_scipy(B)
    r = C.einsum("ij,jk->ik", a, b)
    check_storage(r)
    want = (A @ B).tocsr()
    want.sort_indices()
    pos, crd = r.levels[1].pos.numpy(), r.levels[1].crd.numpy()
    np.testing.assert_array_equal(pos, want.indptr)
    np.testing.assert_array_equal(crd, want.indices)
    np.testing.assert_allclose(r.values.numpy(), want.data)
    src = C.explain("ij,jk->ik", a, b).source
    assert "run_chunk_map" in src and f"> {DENSE_WS_LIMIT}" in src


def test_spgemm_spread_rows_radix_sorted():
    """Output rows of a few hundred coordinates spread over a wide extent are sorted by the
    workspace's radix sort (neither the mark scan nor insertion sort applies)."""
    import numpy as np
    import scipy.sparse as sp
    from scorch.interop import from_scipy
    A = sp.random(40, 30, density=0.9, format="csr", random_state=3)
    B = sp.random(30, 300_000, density=2e-5, format="csr", random_state=4)
    r = C.einsum("ij,jk->ik", from_scipy(A), from_scipy(B))
    want = (A @ B).tocsr()
    want.sort_indices()
    assert np.diff(want.indptr).max() > 64
    np.testing.assert_array_equal(r.levels[1].pos.numpy(), want.indptr)
    np.testing.assert_array_equal(r.levels[1].crd.numpy(), want.indices)
    np.testing.assert_allclose(r.values.numpy(), want.data)


def test_choose_panel_per_input():
    """Algorithm 3's tiled loop is cut into register-width panels only for rows wider than
    the register kernel and rows of at least PANEL_MIN_ROW entries (measured, see
    choose_panel)."""
    w = (16, 32, 64, 128)
    assert choose_panel(w, 128, 10**6, 10**5) == 0          # fits the registers: whole rows
    assert choose_panel(w, 256, 10**6, 10**5) == 128        # 10 entries a row: panels
    assert choose_panel(w, 256, 3 * 10**5, 10**5) == 0      # power-law, ~3 a row: whole rows
    assert choose_panel(w, 256, 397 * 10**3, 10**5) == 128  # mdual, ~4 a row: panels
    assert choose_panel((), 256, 10**6, 10) == 0


@pytest.mark.parametrize("dt,k", [(torch.float32, 256), (torch.float32, 300), (torch.float64, 100),
                                  (torch.float64, 128)])
def test_spmm_panels_match_dense(dt, k):
    x = rand((40, 30), 0.5, dtype=dt, seed=21)                  # ~15 entries a row: panels
    b = torch.randn(30, k, dtype=dt)
    a = sparse(x, "csr")
    s = C.explain("ij,jk->ik", a, b).schedule
    assert choose_panel(C.codegen.panel_widths(s, dt), k, int(a.values.numel()), 40) > 0
    for _ in range(2):   # general path, then the warm runner
        torch.testing.assert_close(C.einsum("ij,jk->ik", a, b), x @ b)


def test_rows_assembly_batched_and_sparse_outer():
    """Two dense levels over a compressed one (a batch of CSRs), and an outer loop that
    iterates a compressed level (DCSR operand) into a CSR output."""
    x, y = rand((3, 6, 5), 0.4, seed=13), rand((3, 5, 7), 0.4, seed=14)
    a, b = sparse(x, Format("dcc")), sparse(y, Format("dcc"))
    r = C.einsum("bik,bkj->bij", a, b, out_format=Format("ddc"))
    check_storage(r)
    assert r.format == Format("ddc")
    torch.testing.assert_close(dense(r), torch.einsum("bik,bkj->bij", x, y))
    assert "out_pos" in C.explain("bik,bkj->bij", a, b, out_format=Format("ddc")).source
    u, v = rand((9, 6), 0.2, seed=15), rand((6, 8), 0.5, seed=16)
    u[2:5] = 0
    r = C.einsum("ij,jk->ik", sparse(u, "dcsr"), sparse(v, "csr"), out_format="csr")
    check_storage(r)
    assert r.format == as_format("csr")
    torch.testing.assert_close(dense(r), u @ v)


def test_out_format_override():
    x, y = rand((8, 7), 0.3, seed=7), rand((7, 9), 0.3, seed=8)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), y, out_format="csr")
    assert r.format == as_format("csr")
    torch.testing.assert_close(dense(r), x @ y)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), sparse(y, "csr"), out_format="dense")
    assert isinstance(r, torch.Tensor)
    torch.testing.assert_close(r, x @ y)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), sparse(y, "csr"), out_format="csc")
    assert r.format == as_format("csc")
    torch.testing.assert_close(dense(r), x @ y)


def test_dense_only_is_torch_einsum():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert torch.equal(C.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", a, b))


def test_dense_diagonal_and_broadcast():
    x = rand((4, 4, 3), 0.6, seed=9)
    m = torch.randn(4, 4, dtype=torch.float64)
    a = sparse(x, "dcc")
    torch.testing.assert_close(dense(C.einsum("ijk,ii->jk", a, m)), torch.einsum("ijk,ii->jk", x, m))
    e = torch.randn(1, 3, dtype=torch.float64)  # size-1 dim of a dense operand broadcasts
    torch.testing.assert_close(dense(C.einsum("ijk,jk->ijk", a, e)), torch.einsum("ijk,jk->ijk", x, e))


@pytest.mark.parametrize("eq", ["ii->i", "iij->j", "iji->ij", "ii,ij->j"])
@pytest.mark.parametrize("kinds", ["dc", "cc", "qq"])
def test_sparse_diagonal(eq, kinds):
    x2, x3 = rand((4, 4), 0.7, seed=3), rand((4, 4, 4), 0.6, seed=2)
    xs = [x3 if len(t) == 3 else x2 for t in eq.split("->")[0].split(",")]
    ops = [sparse(x, Format(kinds + kinds[-1] * (x.dim() - 2))) for x in xs]
    torch.testing.assert_close(dense(C.einsum(eq, *ops)), torch.einsum(eq, *xs))


@pytest.mark.parametrize("kinds", ["dc", "qq"])
def test_sparse_size1_broadcast(kinds):
    a, b = rand((1, 5), 0.6, seed=4), rand((3, 5), 0.6, seed=5)
    r = C.einsum("ij,ij->ij", sparse(a, Format(kinds)), sparse(b, "csr"))
    torch.testing.assert_close(dense(r), a * b)
    r = C.einsum("...j,...j->...j", sparse(a, Format(kinds)), b)
    torch.testing.assert_close(dense(r), a * b)


def test_ellipsis_with_sparse_batch():
    x = rand((2, 4, 3), 0.5, seed=12)
    y = torch.randn(2, 3, 5, dtype=torch.float64)
    r = C.einsum("...ij,...jk->...ik", sparse(x, "dcc"), y)
    torch.testing.assert_close(dense(r), torch.einsum("...ij,...jk->...ik", x, y))


def test_plan_cache_warm_call_reuses_plan():
    x = rand((6, 5), 0.5, seed=10)
    b = torch.randn(5, 3, dtype=torch.float64)
    a = sparse(x, "csr")
    C.einsum("ij,jk->ik", a, b)
    hits = C.plan_cache_info()["plan_hits"]
    C.einsum("ij,jk->ik", sparse(rand((9, 5), 0.5, seed=11), "csr"), torch.randn(5, 4, dtype=torch.float64))
    assert C.plan_cache_info()["plan_hits"] == hits + 1



def test_compute_warm_runner_serves_every_statistics_class(monkeypatch):
    """``compute``'s plans are keyed by the operands' signatures: its warm runner takes only
    the signatures of its first call, so a matrix of another statistics class (at least
    ``STATS_MIN_NNZ`` entries) sharing the plan of a small one went down the general path on
    every call."""
    from scorch.tensor_compiler import execute
    from scorch.tensor_compiler.operand_stats import STATS_MIN_NNZ
    general = []
    run_general = execute.run_general
    monkeypatch.setattr(execute, "run_general", lambda e, ops: general.append(1) or run_general(e, ops))
    asg = Assignment("ij", Access(0, ("i", "j")) - Access(1, ("i", "j")))
    for n in (8, 2 * STATS_MIN_NNZ, 8):   # small, then a stats class of its own, then small again
        a, b = rand((n, 3), 0.9, seed=n), rand((n, 3), 0.9, seed=n + 1)
        sa, sb = sparse(a, "csr"), sparse(b, "csr")
        general.clear()
        for _ in range(3):
            r = C.compute(asg, sa, sb)
            check_storage(r)
            torch.testing.assert_close(dense(r), a - b)
        assert len(general) <= 1, n   # the first call of a new plan only

def test_explain_prints_algorithm1_trace():
    a = sparse(rand((6, 5)), "csr")
    text = str(C.explain("ij,jk->ik", a, sparse(rand((5, 4)), "csr")))
    assert "by sparsity:  j, i, k" in text
    assert "move j 0->1 [i,j,k]: net -102" in text and "applied" in text
    assert "move j 1->2 [i,k,j]: net +1102 (dense_loops +1000" in text


def test_explain_runs_nothing_and_reports():
    a, b = sparse(rand((6, 5)), "csr"), sparse(rand((5, 4)), "csr")
    p = C.explain("ij,jk->ik", a, b)
    assert p.loop_order == ["i", "j", "k"]
    assert p.workspaces[0].startswith("k: sparse workspace (appended pairs")
    assert p.tiled == []
    assert p.output_format == as_format("csr")
    assert "def kernel" in p.source and "SparseWorkspace[double]" in p.source
    text = str(p)
    assert "loop IR:" in text and "# segment" in text and "ws.drain" in text


def test_generated_source_uses_raw_pointers_not_memoryviews():
    p = C.explain("ij,jk->ik", sparse(rand((6, 5)), "csr"), torch.randn(5, 4, dtype=torch.float64))
    assert "[:]" not in p.source and "<double*><size_t>" in p.source
    assert "prange" in p.source and "nogil" in p.source


@pytest.mark.parametrize("fmt", [Format("dc", block=(2, 2)), Format("dc", (1, 0), block=(3, 2)),
                                 Format("cc", block=(2, 4))])
def test_blocked_operands(fmt):
    x = rand((6, 8), 0.3, seed=1)
    d = torch.randn(8, 3, dtype=torch.float64)
    s = sparse(x, fmt)
    torch.testing.assert_close(dense(C.einsum("ij,jk->ik", s, d)), x @ d)
    torch.testing.assert_close(dense(C.einsum("ij,ij->ij", s, sparse(x, "csr"))), x * x)


def test_blocked_output_format():
    x = rand((6, 8), 0.3, seed=1)
    d = torch.randn(8, 4, dtype=torch.float64)
    bsr = Format("dc", block=(2, 2))
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), d, out_format=bsr)
    assert r.format == bsr
    torch.testing.assert_close(dense(r), x @ d)


def test_three_operand_chain_and_outer_product():
    x, y = rand((5, 4), 0.5, seed=13), rand((4, 6), 0.5, seed=14)
    z = torch.randn(6, 3, dtype=torch.float64)
    r = C.einsum("ij,jk,kl->il", sparse(x, "csr"), sparse(y, "csc"), z)
    torch.testing.assert_close(dense(r), x @ y @ z)
    u, v = rand((5,), 0.5, seed=15), rand((4,), 0.5, seed=16)
    r = C.einsum("i,j->ij", sparse(u, Format("c")), sparse(v, Format("q")))
    torch.testing.assert_close(dense(r), torch.outer(u, v))


def test_empty_and_zero_sized():
    z = torch.zeros(4, 5, dtype=torch.float64)
    r = C.einsum("ij,jk->ik", sparse(z, "csr"), sparse(z.T.contiguous(), "csr"))
    assert r.nnz == 0
    torch.testing.assert_close(dense(r), torch.zeros(4, 4, dtype=torch.float64))
    e = torch.zeros(0, 3, dtype=torch.float64)
    torch.testing.assert_close(dense(C.einsum("ij,jk->ik", sparse(e, "csr"), torch.randn(3, 2, dtype=torch.float64))),
                               torch.zeros(0, 2, dtype=torch.float64))


def test_int64_indices_with_transpose():
    x, y = rand((6, 5), 0.5, seed=17), rand((5, 7), 0.5, seed=18)
    a = sparse(x, "csr", index_dtype=torch.int64)
    b = sparse(y, "csc", index_dtype=torch.int64)
    torch.testing.assert_close(dense(C.einsum("ij,jk->ik", a, b)), x @ y)


def test_mixed_dtypes_promote():
    x = rand((4, 5), 0.5, dtype=torch.float32, seed=19)
    d = torch.randn(5, 3, dtype=torch.float64)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), d)
    assert r.dtype == torch.float64
    torch.testing.assert_close(r, x.double() @ d)


def test_noncontiguous_dense_operands():
    x = rand((6, 5), 0.5, seed=20)
    d = torch.randn(3, 5, dtype=torch.float64).T  # transposed view
    torch.testing.assert_close(C.einsum("ij,jk->ik", sparse(x, "csr"), d), x @ d)
    big = torch.randn(6, 10, dtype=torch.float64)[:, ::2]  # strided view
    torch.testing.assert_close(dense(C.einsum("ij,ij->ij", sparse(x, "csr"), big)), x * big)


def test_sddmm_output_keeps_structure_of_s():
    s = rand((7, 9), 0.3, seed=21)
    b, c = torch.randn(7, 4, dtype=torch.float64), torch.randn(4, 9, dtype=torch.float64)
    S = sparse(s, "csr")
    r = C.einsum("ij,ik,kj->ij", S, b, c)
    assert r.format == S.format
    assert torch.equal(r.levels[1].pos.long(), S.levels[1].pos.long())
    assert torch.equal(r.levels[1].crd.long(), S.levels[1].crd.long())
    torch.testing.assert_close(dense(r), s * (b @ c))
    p = C.explain("ij,ik,kj->ij", S, b, c)
    assert p.loop_order == ["i", "j", "k"] and p.workspaces == []


def test_sddmm_and_sparse_times_dense_write_into_the_pattern_of_s():
    # the output is S's pattern: values written at S's positions, S's index arrays shared
    s = rand((7, 9), 0.3, seed=23)
    S = sparse(s, "csr")
    assert _sched("ij,ik,kj->ij", [as_format("csr"), None, None]).output.pattern == 0
    assert _sched("ij,ij->ij", [as_format("csr"), None]).output.pattern == 0
    assert _sched("ij,ij->ij", [as_format("csr"), as_format("csr")]).output.pattern == -1
    assert _sched("ij,jk->ik", [as_format("csr"), as_format("csr")]).output.pattern == -1
    for _ in range(2):                                  # general path, then warm fast path
        b, c = torch.randn(7, 5, dtype=torch.float64), torch.randn(5, 9, dtype=torch.float64)
        r = C.einsum("ij,ik,kj->ij", S, b, c)
        assert r.levels[1].crd is S.levels[1].crd and r.nnz == S.nnz
        torch.testing.assert_close(dense(r), s * (b @ c))
        d = torch.randn(7, 9, dtype=torch.float64)
        torch.testing.assert_close(dense(C.einsum("ij,ij->ij", S, d)), s * d)
        torch.testing.assert_close(dense(C.einsum("ij,ij->ij", S, -2.0 * d)), -2.0 * s * d)
    # an empty reduction stores nothing (as before): no pattern write
    r = C.einsum("ij,ik,kj->ij", S, torch.randn(7, 0, dtype=torch.float64),
                 torch.randn(0, 9, dtype=torch.float64))
    assert r.nnz == 0 and dense(r).shape == (7, 9)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dcsr"])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_spmm_compile_time_row_widths(fmt, dt):
    # K in the specialized widths runs the vector-register row kernels; others the generic
    # loop; rows with no stored entry are zero (assigned, or memset for sparse row loops)
    a = rand((9, 11), 0.3, dtype=dt, seed=31)
    a[3] = 0
    A = sparse(a, fmt)
    for K in (5, 8, 16, 32, 64, 128):
        x = torch.randn(11, K, dtype=dt)
        torch.testing.assert_close(dense(C.einsum("ij,jk->ik", A, x)), a @ x)
        v = torch.randn(K, dtype=dt)
        torch.testing.assert_close(dense(C.einsum("ij,jk,k->ik", A, x, v)), (a @ x) * v)
        torch.testing.assert_close(dense(C.einsum("ij,jk->ik", A, -2.0 * x + 1)), a @ (-2.0 * x + 1))
    if fmt == "csr":
        src = C.explain("ij,jk->ik", A, torch.randn(11, 16, dtype=dt)).source
        assert "run_chunk_w16" in src and "wv0 = wv0 + " in src and "memset(" not in src


@pytest.mark.parametrize("fmt", ["csr", "coo"])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_sddmm_compile_time_dot_widths(fmt, dt):
    # K in the specialized widths: vector products summed lane-wise, one horizontal sum
    s = rand((9, 11), 0.3, dtype=dt, seed=32)
    S = sparse(s, fmt)
    g = torch.Generator().manual_seed(33)

    def near(got, exact, magnitude, K):
        # summed in another order than the float64 reference: within K + 2 roundings of
        # the sum of the terms' magnitudes (a sum that cancels has a large relative error)
        bound = (K + 2) * torch.finfo(dt).eps * magnitude + 1e-30
        assert ((dense(got).double() - exact).abs() <= bound).all(), (got, exact)
    for K in (3, 8, 16, 32, 64, 128):
        b, c = torch.randn(9, K, dtype=dt, generator=g), torch.randn(K, 11, dtype=dt, generator=g)
        s64, b64, c64 = s.double(), b.double(), c.double()
        near(C.einsum("ij,ik,kj->ij", S, b, c), s64 * (b64 @ c64), s64.abs() * (b64.abs() @ c64.abs()), K)
        d = torch.randn(11, K, dtype=dt, generator=g)      # dense output, reduction innermost
        d64 = d.double()
        near(C.einsum("ij,ik,jk->i", S, b, d), (s64 * (b64 @ d64.T)).sum(1),
             (s64.abs() * (b64.abs() @ d64.abs().T)).sum(1), K)
    src = C.explain("ij,ik,kj->ij", S, b, c).source
    assert "_hsum(" in src and "run_chunk_w16" in src


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_relayout_tiled_transpose(dt):
    from scorch.tensor_compiler.relayout import relayout, transposed
    # (512, 40), (256, 33), (1024, 20): destination rows a multiple of 2 KB apart, the
    # tall narrow tile (ALIASED_TILE_R) with partial tiles in both directions
    for shape in [(3, 5), (8, 8), (4, 12), (16, 257), (130, 300), (1, 7), (600, 2100), (512, 40),
                  (256, 33), (1024, 20)]:
        x = torch.randn(shape, dtype=dt)
        wide = torch.randn(shape[0], shape[1] + 3, dtype=dt)[:, 2:shape[1] + 2]   # row stride > width
        for src in (x, x.t().contiguous().t(), wide, x[:, ::2]):
            for threads in (1, 2):
                y = relayout(src, (1, 0), (1, 0), lambda w: threads)
                assert y.stride(0) == 1 and torch.equal(y, src)
                # a transposed view made row-major in its own order (``W @ x.t()``: x^T)
                view = src.t()
                z = relayout(view, (0, 1), (0, 1), lambda w: threads)
                assert z.is_contiguous() and torch.equal(z, view)
                assert relayout(view, (1, 0), (1, 0), lambda w: threads).stride(0) == 1
                kept = transposed(src, lambda w: threads)   # the caller's own copy
                assert kept.is_contiguous() and torch.equal(kept, src.t())


def test_blocked_operand_read_natively():
    x = rand((6, 8), 0.3, seed=22)
    d = torch.randn(8, 3, dtype=torch.float64)
    bsr = sparse(x, Format("dc", block=(2, 4)))
    p = C.explain("ij,jk->ik", bsr, d)
    assert p.loop_order == ["i_o", "j_o", "i_i", "j_i", "k"]   # block grid, then inside blocks
    assert p.transposes == []
    torch.testing.assert_close(C.einsum("ij,jk->ik", bsr, d), x @ d)
    v = torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(C.einsum("ij,j->i", bsr, v), x @ v)
    bsc = sparse(x, Format("dc", (1, 0), block=(3, 2)))
    torch.testing.assert_close(dense(C.einsum("ij,jk->ik", bsc, d)), x @ d)  # CSC-like: sparse rows
    e = torch.randn(6, 2, dtype=torch.float64)
    torch.testing.assert_close(C.einsum("ji,jk->ik", bsc, e), x.T @ e)


def test_blocked_conflicting_inner_orders_fall_back():
    x = rand((4, 4), 0.5, seed=23)
    a = sparse(x, Format("dc", block=(2, 2)))
    r = C.einsum("ij,ji->i", a, a)
    torch.testing.assert_close(dense(r), torch.einsum("ij,ji->i", x, x))


def test_warm_fast_path_and_its_fallbacks():
    x = rand((6, 5), 0.5, seed=24)
    a = sparse(x, "csr")
    b = torch.randn(5, 3, dtype=torch.float64)
    C.einsum("ij,jk->ik", a, b)
    entry = next(e for k, e in plans._plans.items() if k[1] == "ij,jk->ik" and k[2][0][1] == a.format
                 and k[2][0][3] == torch.float64 and k[2][1][0] == "d")
    runner = getattr(entry.runner, "fallback", entry.runner)   # behind the C plan, if any
    assert runner is not None and "KERNEL(" in runner.source
    y = rand((9, 5), 0.3, seed=25)
    torch.testing.assert_close(C.einsum("ij,jk->ik", sparse(y, "csr"), b), y @ b)  # other shape
    torch.testing.assert_close(C.einsum("ij,jk->ik", a, b.T.contiguous().T), x @ b)  # non-unit stride
    torch.testing.assert_close(C.einsum("ij,jk->ik", a, b[:1].expand(5, 3)), x @ b[:1].expand(5, 3))
    with pytest.raises(ValueError, match="subscript j"):
        C.einsum("ij,jk->ik", a, torch.randn(4, 3, dtype=torch.float64))


def test_compute_checks_sizes_of_every_access():
    a = sparse(rand((3, 4), 0.5, seed=26), "csr")
    A, At = Access(0, "ij"), Access(0, "ji")
    with pytest.raises(ValueError, match=r"subscript j has size 3 for operand 0 \(access T0\(j,i\)\)"):
        C.compute(Assignment("ij", A * At), a)
    x = rand((4, 4), 0.5, seed=27)
    torch.testing.assert_close(dense(C.compute(Assignment("ij", A * At), sparse(x, "csr"))), x * x.T)


@pytest.mark.parametrize("ofmt", [Format("dc"), Format("cd", (1, 0)), Format("qq"), Format("qd"),
                                  Format("dq", (1, 0)), Format("cc", (1, 0)), Format("dd")])
def test_every_output_format(ofmt):
    x, y = rand((6, 5), 0.4, seed=28), rand((5, 7), 0.4, seed=29)
    r = C.einsum("ij,jk->ik", sparse(x, "csr"), sparse(y, "csr"), out_format=ofmt)
    if ofmt.is_dense:
        assert isinstance(r, torch.Tensor)
    else:
        assert r.format == ofmt
        check_storage(r)
    torch.testing.assert_close(dense(r), x @ y)


@pytest.mark.parametrize("ofmt", [Format("qqq"), Format("cqq", (2, 0, 1)), Format("dcd", (1, 2, 0))])
def test_every_output_format_rank3(ofmt):
    x = rand((3, 4, 5), 0.4, seed=30)
    w = torch.randn(5, dtype=torch.float64)
    r = C.einsum("ijk,k->ijk", sparse(x, "csf"), w, out_format=ofmt)
    assert r.format == ofmt
    check_storage(r)
    torch.testing.assert_close(dense(r), x * w)


def test_output_format_inferred_on_the_formats_read():
    """CSR x CSC reads B transposed to CSR, so the product is CSR (sparse), not dense
    because CSC happens to store its columns in a dense level."""
    import scorch
    g = torch.Generator().manual_seed(3)
    a = torch.rand(30, 20, generator=g) * (torch.rand(30, 20, generator=g) < 0.1)
    b = torch.rand(20, 25, generator=g) * (torch.rand(20, 25, generator=g) < 0.1)
    A, B = scorch.sparse_tensor(a, format="csr"), scorch.sparse_tensor(b, format="csc")
    plan = scorch.explain("ij,jk->ik", A, B)
    assert plan.loop_order == ["i", "j", "k"] and plan.output_format.is_sparse
    C = scorch.einsum("ij,jk->ik", A, B)
    assert C.format.is_sparse and torch.allclose(C.to_dense(), a @ b, atol=1e-5)
    X = A.to_format("csc")
    assert scorch.explain("ij,ij->ij", X, X).output_format == scorch.as_format("csc")
