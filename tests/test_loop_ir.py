"""The lowering to the loop IR (``scorch.tensor_compiler.lower``) and its printer (``codegen``).

The lowering is asserted on the nodes it builds: loop kinds, store modes, the memset
decision, chunk-function variants, chunking and the output epilogue. Byte identity of the
printed sources with the generator before the loop IR was checked outside the suite (see
the commit); the golden sources (``test_compiler_golden.py``) hold it for three kernels.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from compiler_helpers import dense, rand, sparse
import scorch.tensor_compiler as tc
from scorch.formats import Format
from scorch.tensor_compiler import codegen
from scorch.tensor_compiler.index_notation import Access, Assignment
from scorch.tensor_compiler.loop_ir import (AddTo, AppendEntry, Assign, Call, DenseOutput, For,
                                            If, LevelCode, RowsOutput, TuplesOutput,
                                            While, walk)
from scorch.tensor_compiler.lower import kernel_facts, lower_kernel
from scorch.tensor_compiler.lower.facts import HW_GATHER_TARGETS, row_loop_tuning
from scorch.tensor_compiler.schedule import schedule
from scorch.tensor_compiler.target import use_target

CSR, CSC, DCSR, COO = Format("dc"), Format("dc", (1, 0)), Format("cc"), Format("qq")
A, B, X = Access(0, "ij"), Access(1, "ij"), Access(1, "j")
I32 = torch.int32


def _lower(asg, formats, out_format=None, dtype=torch.float64):
    s = schedule(asg, formats, out_format)
    idx = {ap.id: I32 for ap in s.accesses if ap.sparse}
    return s, lower_kernel(s, dtype, idx)


def _fn(k, name="run_chunk"):
    return next(f for f in k.chunk_functions if f.name == name)


def _nodes(k, kind, name="run_chunk"):
    return [n for n in walk(_fn(k, name).body) if isinstance(n, kind)]


def _loops(k, name="run_chunk"):
    """(loop variable or iterator, role) of every loop, outermost first."""
    return [(n.var if isinstance(n, For) else n.cond, n.role)
            for n in walk(_fn(k, name).body) if isinstance(n, (For, While))]


def _src(s, dtype=torch.float64):
    return codegen.generate(s, dtype, {ap.id: I32 for ap in s.accesses if ap.sparse})[0]


def test_spmv_rows_are_segments_and_the_accumulator_is_stored_once():
    s, k = _lower(Assignment("i", A * X), [CSR, None])
    assert _loops(k) == [("c_i", "dense"), ("q0_1", "segment")]
    rows = _nodes(k, For)[0]
    assert (rows.lo, rows.hi) == ("clo", "chi")              # the chunk's rows
    assert Assign("a.out_vals[oo_0]", "acc") in _nodes(k, Assign)
    assert not [n for n in _nodes(k, AddTo) if n.target.startswith("a.out_vals")]
    assert k.memset is None and kernel_facts(s, torch.float64, {}).store_all
    assert k.chunking.kind == "dense" and k.chunking.balance == "a.t0_pos1"
    assert isinstance(k.output, DenseOutput) and k.c_entry
    # plus the variant prefetching x ahead when x exceeds L2 (facts.PREFETCH_MIN_BYTES) and,
    # on targets with pipelined gathers, the gathered-dot row loops (lower/gather_rows.py)
    # and, where the cores gain from them (facts.row_loop_tuning), its stream form
    tg = kernel_facts(s, torch.float64, {}).target
    gathers = tg.name in HW_GATHER_TARGETS
    streams = ["run_chunk_gathers_streams"] if row_loop_tuning(tg).stream_requests else []
    assert [f.name for f in k.chunk_functions] == ["run_chunk", "run_chunk_prefetch"] + (
        ["run_chunk_gathers"] + streams if gathers else [])
    assert ("acc", "int64_t") not in _fn(k).locals and ("acc", "double") in _fn(k).locals


def test_spmv_over_columns_adds_into_a_zeroed_output():
    """CSC: the outer loop is the reduction, so every row is added to many times."""
    s, k = _lower(Assignment("i", A * X), [CSC, None], Format("d"))
    assert s.loop_order == ["j", "i"]
    assert _loops(k) == [("c_j", "dense"), ("q0_1", "segment")]
    stores = [n for n in _nodes(k, AddTo) if n.target.startswith("a.out_vals")]
    assert len(stores) == 1 and not kernel_facts(s, torch.float64, {}).store_all
    assert k.memset == "a.N_i"
    assert k.chunking.kind is None            # chunks would write the same rows


def test_spmm_register_rows_and_panels():
    with use_target("avx512"):   # the 64-byte target's widths (tests/test_target.py: the others)
        s, k = _lower(Assignment("ik", A * Access(1, "jk")), [CSR, None], dtype=torch.float32)
    names = [f.name for f in k.chunk_functions]
    assert names == ["run_chunk", "run_chunk_w4", "run_chunk_w8", "run_chunk_w16", "run_chunk_w32",
                     "run_chunk_w64", "run_chunk_w128"]
    # rows narrower than a zmm: one vector of the row's own size (32 bytes for 8 floats)
    assert ("wv0", "scorch_vf32") in _fn(k, "run_chunk_w8").locals
    assert _fn(k, "run_chunk_w32").select == "a.N_k == 32"
    assert k.vector_type == "scorch_vf"
    # run-time width: the output row is zeroed where it starts, then added to
    assert ("c_k", "zero") in _loops(k)
    # width 32 = two registers, zeroed, accumulated at the leaf, stored (assigned) once
    w32 = _fn(k, "run_chunk_w32")
    assert ("wv1", "scorch_vf") in w32.locals and ("wv2", "scorch_vf") not in w32.locals
    assert Assign("wv0", "scorch_vf_zero()") in _nodes(k, Assign, "run_chunk_w32")
    assert any(n.target.startswith("(<scorch_vf*>(a.out_vals") and n.expr == "wv1"
               for n in _nodes(k, Assign, "run_chunk_w32"))
    assert not [lp for lp in _loops(k, "run_chunk_w32") if lp[0] == "c_k"]   # no k loop
    assert k.memset is None
    assert s.tiled == ["k"]
    assert k.panels.widths == (4, 8, 16, 32, 64, 128) and "out_vals" in k.panels.shifted


def test_sddmm_writes_into_the_pattern_and_has_a_vector_dot():
    asg = Assignment("ij", A * Access(1, "ik") * Access(2, "kj"))
    s, k = _lower(asg, [CSR, None, None])
    assert s.output.mode == "acc" and s.output.pattern == 0
    assert _loops(k) == [("c_i", "dense"), ("q0_1", "segment"), ("c_k", "dense")]
    assert Assign("a.out_vals[q0_1]", "acc") in _nodes(k, Assign)
    assert not _nodes(k, AppendEntry)
    assert isinstance(k.output, DenseOutput) and k.memset is None
    dot = [n for n in _nodes(k, Assign, "run_chunk_w8") if n.target == "acc" and "hsum" in n.expr]
    assert len(dot) == 1


def test_spgemm_runtime_workspace_and_rows_assembly():
    s, k = _lower(Assignment("ik", A * Access(1, "jk")), [CSR, CSR])
    assert s.output.mode == "ws"
    assert [f.name for f in k.chunk_functions] == ["run_chunk", "run_chunk_scan", "run_chunk_map"]
    assert _fn(k, "run_chunk_map").select == "a.N_k > 4194304"
    # fibers marking >= 1/8 of the extent on average: adds only mark, the marks scanned
    # (multiplied out: the kernel divides nothing)
    assert _fn(k, "run_chunk_scan").select == (
        "8 * <double><int64_t>a.t0_pos1[a.N_i] * <double><int64_t>a.t1_pos1[a.N_j] >= "
        "a.N_k * max(<double>a.N_i, 1.0) * max(<double>a.N_j, 1.0)")
    scan_adds = [n.target for n in _nodes(k, Assign, "run_chunk_scan")]
    assert "wm[wkey]" in scan_adds and "wl[wc]" not in scan_adds and "wl[wc]" in [
        n.target for n in _nodes(k, Assign)]
    # the rows of B located by A's coordinates, prefetched 8 entries ahead (pos 16 ahead)
    assert Call("scorch_prefetch(a.t1_pos1 + a.t0_crd1[q0_1 + 16])") in _nodes(k, Call)
    assert Assign("psr", "a.t1_pos1[a.t0_crd1[q0_1 + 8]]") in _nodes(k, Assign)
    assert isinstance(k.output, RowsOutput) and k.output.dense_vars == ("i",)
    assert _loops(k) == [("c_i", "dense"), ("q0_1", "segment"), ("q1_1", "segment")]
    # A's value read once per entry (gcc would reload it after every store into the
    # workspace), then scattered along B's row
    assert Assign("x0_1", "a.t0_vals[q0_1]") in _nodes(k, Assign, "run_chunk_map")
    assert Call("ws.add(wkey, (x0_1 * a.t1_vals[q1_1]))") in _nodes(k, Call, "run_chunk_map")
    assert not _nodes(k, Call)[0].code.startswith("ws.add")       # dense scratch by default
    drain = [n for n in _nodes(k, If) if n.cond == "wn"]
    assert len(drain) == 1 and AddTo("a.out_pos[c_i + 1]", "wn") in drain[0].then
    assert k.ws_vars == ("k",) and not k.c_entry


def test_dense_and_map_workspaces():
    asg = Assignment("ik", A * Access(1, "jk"))
    s, k = _lower(asg, [CSR, CSR], Format("cd"))
    assert s.output.ws_dense and [f.name for f in k.chunk_functions] == ["run_chunk"]
    assert ("wi", "drain") in _loops(k)
    assert _fn(k).body[-2:] == (Call("free(wsv)"), Call("free(wsf)"))
    # int16 values have no runtime workspace: a std::map drained by its iterator
    s, k = _lower(asg, [CSR, CSR], Format("qq"), dtype=torch.int16)
    assert ("wit != ws.end()", "drain") in _loops(k)
    assert Call("ws.clear()") in _nodes(k, Call)
    assert isinstance(k.output, TuplesOutput) and k.output.levels == 2


def test_union_and_intersection_merges():
    s, k = _lower(Assignment("ij", A + B), [CSR, CSR])
    # TACO's lattice points: the two-way merge, then the rest of each operand copied
    assert [lp for lp in _loops(k) if lp[1] in ("merge", "rest")] == [
        ("q0_1 < h0_1 and q1_1 < h1_1", "merge"), ("q0_1", "rest"), ("q1_1", "rest")]
    merge = next(n for n in _nodes(k, While) if n.role == "merge")
    # the smallest coordinate selected without a branch, each iterator advanced by its flag
    assert Assign("c_j", "j1_1 if scorch_unpredictable(j1_1 < c_j, 1, 0.5) else c_j") in merge.body
    assert AddTo("q0_1", "f0_1") in merge.body and not [n for n in merge.body if isinstance(n, If)]
    # a union: each operand may be absent in the merge, its value guarded by its found flag;
    # in the rest loops the other operand is known absent (read as 0)
    appends = _nodes(k, AppendEntry)
    assert appends[0].value == ("((x0_1 if scorch_unpredictable(f0_1, 1, 0.5) else 0) + "
                                "(x1_1 if scorch_unpredictable(f1_1, 1, 0.5) else 0))")
    assert appends[1].value == "(a.t0_vals[q0_1] + 0)" and appends[2].value == "(0 + a.t1_vals[q1_1])"
    # rows written straight into the room a bound pass made, counted once per row
    assert all(a.local for a in appends) and k.output.bound
    # each row's room is its segments' lengths and the segments are indexed by the row, so a
    # chunk's room telescopes to pos[chi] - pos[clo] per operand: no walk over the rows
    bound = k.bound_function.body
    assert [n for n in walk(bound) if isinstance(n, AddTo)] == [AddTo("ok", (
        "(<int64_t>a.t0_pos1[chi] - a.t0_pos1[clo]) + (<int64_t>a.t1_pos1[chi] - a.t1_pos1[clo])"))]
    assert not [n for n in walk(bound) if isinstance(n, For)]
    # a sparse vector broadcast over the rows: its segment is not the row's, so the pass
    # adds each row's trip-count bound
    s, k = _lower(Assignment("ij", A + Access(1, "j")), [CSR, Format("c")])
    bound = k.bound_function.body
    assert [n for n in walk(bound) if isinstance(n, AddTo)] == [AddTo("ok", "(h0_1 - q0_1) + (h1_0 - q1_0)")]
    s, k = _lower(Assignment("ij", A * B), [CSR, CSR])
    assert [lp for lp in _loops(k) if lp[1] in ("merge", "rest")] == [("q0_1 < h0_1 and q1_1 < h1_1", "merge")]
    guard = [n for n in _nodes(k, If) if n.cond == "(f0_1 and f1_1)"]
    assert len(guard) == 1     # the body runs where both are present


def test_three_way_union_has_every_lattice_point():
    C3 = Access(2, "ij")
    s, k = _lower(Assignment("ij", A + B + C3), [CSR, CSR, CSR])
    conds = [lp[0] for lp in _loops(k) if lp[1] in ("merge", "rest")]
    assert conds == ["q0_1 < h0_1 and q1_1 < h1_1 and q2_1 < h2_1", "q0_1 < h0_1 and q1_1 < h1_1",
                     "q0_1 < h0_1 and q2_1 < h2_1", "q1_1 < h1_1 and q2_1 < h2_1", "q0_1", "q1_1", "q2_1"]
    # A * B + C: the product is one stream of matches (its seek loops aside), merged with C:
    # the stream with C, C alone, the product alone
    s, k = _lower(Assignment("ij", A * B + C3), [CSR, CSR, CSR])
    conds = [lp[0] for lp in _loops(k) if lp[1] in ("merge", "rest")]
    assert conds == ["q2_1 < h2_1 and q0_1 < h0_1 and q1_1 < h1_1", "q2_1", "q0_1 < h0_1 and q1_1 < h1_1"]
    # A * (B + C) is no sum of products: every lattice point with A
    s, k = _lower(Assignment("ij", A * (B + C3)), [CSR, CSR, CSR])
    conds = [lp[0] for lp in _loops(k) if lp[1] in ("merge", "rest")]
    assert conds == ["q0_1 < h0_1 and q1_1 < h1_1 and q2_1 < h2_1", "q0_1 < h0_1 and q1_1 < h1_1",
                     "q0_1 < h0_1 and q2_1 < h2_1"]


def test_a_dense_term_merges_iterators_into_a_dense_loop():
    s, k = _lower(Assignment("ij", A + Access(1, "ij")), [CSR, None], Format("dd"))
    assert _loops(k) == [("c_i", "dense"), ("c_j", "dense")]
    assert Assign("f0_1", "q0_1 < h0_1 and a.t0_crd1[q0_1] == c_j") in _nodes(k, Assign)


def test_coo_rows_are_grouped_runs():
    s, k = _lower(Assignment("i", A * X), [COO, None])
    assert _loops(k)[0] == ("q0_0 < h0_0", "group")
    group = _nodes(k, While)[0]
    assert LevelCode(("e0_0 = q0_0 + 1", "while e0_0 < h0_0 and a.t0_crd0[e0_0] == c_i:",
                      "    e0_0 += 1")) in group.body
    assert group.body[-2] == Assign("q0_0", "e0_0")            # past the run
    # coordinate tuples: a chunk stops after an outer step whose output could not grow
    assert group.body[-1] == If("deref(oval).call_failed()", (Call("return"),))
    assert ("c_j", "dense") not in _loops(k)                      # j iterates its segment


def test_diagonal_searches_the_bound_coordinate():
    s, k = _lower(Assignment("i", Access(0, "ii")), [DCSR])
    assert _loops(k) == [("q0_0", "segment"), ("q0_1 < h0_1 and a.t0_crd1[q0_1] < c_i", "search")]
    assert If("f0_1", (AppendEntry(("c_i",), "(a.t0_vals[q0_1] if f0_1 else 0)"),)) in _nodes(k, If)
    s, k = _lower(Assignment("i", Access(0, "ii")), [Format("dd")], Format("d"))
    assert Assign("p0_1", "p0_0 * a.N_i + c_i") in _nodes(k, Assign)    # located


def test_locals_are_declared_once_in_order_of_first_use():
    s, k = _lower(Assignment("ij", A + B), [CSR, CSR])
    names = [n for n, _ in _fn(k).locals]
    assert len(names) == len(set(names))
    assert names.index("c_i") < names.index("c_j") and "f1_1" in names


def test_printer_is_a_function_of_the_node():
    out = []
    codegen.print_stmts((For("c", "0", "n", (If("x", (AddTo("s", "1"),), (Call("f()"),)),), "dense"),
                         While("q < h", (Call("f(q)"),)), LevelCode(("a = 1", "    b = 2"))), 1, out.append)
    assert out == ["    for c in range(0, n):", "        if x:", "            s += 1", "        else:",
                   "            f()", "    while q < h:", "        f(q)", "    a = 1", "        b = 2"]
    out.clear()
    codegen.print_stmts((For("t", None, "n", (Assign("x", "t"),), "drain"),
                         AppendEntry(("c_i", "c_j"), "v", "c_i")), 0, out.append)
    assert out == ["for t in range(n):", "    x = t", "deref(ocrd).push_back(c_j)", "deref(oval).push_back(v)", "a.out_pos[c_i + 1] += 1"]


@pytest.mark.parametrize("asg, formats", [
    (Assignment("i", A * X), [CSR, None]),
    (Assignment("ik", A * Access(1, "jk")), [CSR, CSR]),
    (Assignment("ij", A - 0.5 * B), [CSR, COO]),
])
def test_generate_prints_the_lowered_kernel(asg, formats):
    s = schedule(asg, formats)
    idx = {ap.id: I32 for ap in s.accesses if ap.sparse}
    src, args = codegen.generate(s, torch.float32, idx)
    k = lower_kernel(s, torch.float32, idx)
    assert src == codegen.print_kernel(k) and args == list(k.args)
    assert lower_kernel(s, torch.float32, idx) == k          # lowering is deterministic
    short = codegen.generate(s, torch.float32, idx, scalar_inner=True)[0].split("\n")
    short_k = codegen.print_kernel(lower_kernel(s, torch.float32, idx, short_module=True)).split("\n")
    assert short[2] == f"# scorch-cflags: {codegen.SHORT_ROWS_CFLAGS}" and short[4:] == short_k[2:]


def test_row_loop_nothing_reads_is_flattened():
    # A.sum(0) over CSR into a dense vector: the row loop is never read below, so the two
    # loops are one loop over all stored positions (no per-row exit to mispredict)
    s, k = _lower(Assignment("j", A), [CSR], Format("d"))
    assert _loops(k) == [("q0_1", "segment")]
    assert _fn(k).body[:2] == (Assign("q0_1", "a.t0_pos1[0]"), Assign("h0_1", "a.t0_pos1[a.N_i]"))
    # the row is read: by the output (row sums), by a dense operand over it, by a sparse
    # output's rows: the row loop stays
    for asg, fmts, out in [(Assignment("i", A), [CSR], Format("d")),
                           (Assignment("j", A * Access(1, "i")), [CSR, None], Format("d")),
                           (Assignment("ij", A), [CSR], CSR)]:
        s, k = _lower(asg, fmts, out)
        assert ("c_i", "dense") in _loops(k), asg


@pytest.mark.parametrize("eq,kinds,mode", [
    ("ij->j", "dc", (0, 1)), ("ij,j->j", "dc", (0, 1)),     # flattened
    ("ij,i->j", "dc", (0, 1)), ("ij->i", "dc", (0, 1)), ("ij->j", "dc", (1, 0)),
    ("ij->j", "cc", (0, 1)), ("ij->j", "qq", (0, 1)), ("ij->j", "dd", (0, 1))])
@settings(max_examples=12, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.sampled_from([0.0, 0.3, 1.0]),
       st.sampled_from([torch.float32, torch.float64]), st.integers(0, 99))
def test_reductions_to_a_dense_output_match_dense_torch(eq, kinds, mode, m, n, density, dtype, seed):
    # the flattened row loop (CSR "ij->j") and every form it must leave alone, against torch
    x = rand((m, n), density, dtype=dtype, seed=seed)
    ops = [sparse(x, Format(kinds, mode))]
    dense_ops = [x]
    if "," in eq:
        v = torch.randn(n if eq.startswith("ij,j") else m, dtype=dtype)
        ops.append(v)
        dense_ops.append(v)
    r = tc.einsum(eq, *ops, out_format=Format("d"))
    torch.testing.assert_close(dense(r), torch.einsum(eq, *dense_ops), rtol=1e-4, atol=1e-4)
