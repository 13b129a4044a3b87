"""Cache blocking of dense loops under a sparse loop (paper Algorithm 3 generalised): the cost
model's ``restreamed_blocks`` term reads a sparse operand so that a dense block is re-read by
every stored entry instead of streamed per entry (the MoE gate expert-major), and
``schedule.CacheTile`` hoists the innermost dense loop's panel loop above the sparse loop so
that block's panel stays in L2. Plans are checked through ``explain``; results against dense
torch under hypothesis, with a tiny L2 so that the panels run on small shapes too."""
from contextlib import contextmanager

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.formats import as_format
from scorch.tensor_compiler import merge_lattice as ml
from scorch.tensor_compiler import tiling
from scorch.tensor_compiler.cost_model import OUTPUT_BLOCK_SHARE, OrderProblem, restreamed_blocks
from scorch.tensor_compiler.index_notation import parse_einsum

MOE = "bd,ndh,bn->bh"
EXPERT_GRAD = "bh,bd,bn->ndh"
GATE_GRAD = "bn,bh,bd,ndh->bn"


@contextmanager
def l2_bytes(n: int):
    """Pretend one core's L2 holds ``n`` bytes (panels on small shapes)."""
    real = tiling.l2_cache_bytes
    tiling.l2_cache_bytes = lambda: n
    try:
        yield
    finally:
        tiling.l2_cache_bytes = real


def _problem(eq: str, fmts, out_sparse: bool = False) -> OrderProblem:
    asg = parse_einsum(eq, [(3,) * len(t) for t in eq.split("->")[0].split(",")]).assignment
    ids = ml.access_ids(asg.rhs)
    return OrderProblem(asg, ids, fmts, ml.formula(asg.rhs, ids), out_sparse)


# ---------------------------------------------------------------- the cost term
def test_restreamed_blocks_counts_matrices_per_stored_entry():
    csr, csc = as_format("csr"), as_format("csc")
    fwd = _problem(MOE, [None, None, csr])
    assert restreamed_blocks(["b", "n", "d", "h"], fwd) == 1    # E[n] streamed per entry
    assert restreamed_blocks(["n", "b", "d", "h"], fwd) == 0    # E[n] serves column n
    grad = _problem(EXPERT_GRAD, [None, None, csc])
    # dE[n] read and written again per b (a tenth: never worth a transpose)
    assert restreamed_blocks(["n", "b", "d", "h"], grad) == pytest.approx(OUTPUT_BLOCK_SHARE)
    assert restreamed_blocks(["n", "d", "b", "h"], grad) == 0   # a register row over b
    # a dense loop above every level of the sparse operand walks all its entries again
    assert restreamed_blocks(["h", "b", "n", "d"], fwd) == 2    # and E[n] under b
    # SpMM and SDDMM stream a row per entry: never counted; sparse results are left alone
    assert restreamed_blocks(["i", "j", "k"], _problem("ij,jk->ik", [csr, None])) == 0
    assert restreamed_blocks(["i", "j", "k"], _problem("ij,ik,kj->ij", [csr, None, None], True)) == 0
    assert restreamed_blocks(["b", "n", "d", "h"], _problem(MOE, [None, None, csr], True)) == 0
    # a sparse result in the gate's variables counts the re-read expert
    gate = _problem(GATE_GRAD, [csr, None, None, None], True)
    assert restreamed_blocks(["b", "n", "d", "h"], gate) == 1
    assert restreamed_blocks(["n", "b", "d", "h"], gate) == 0


# ---------------------------------------------------------------- plans (explain)
def test_moe_forward_reads_the_gate_expert_major_in_cache_panels():
    x, E = torch.rand(16, 64), torch.rand(4, 64, 300)      # a 77 KB expert: more than L1
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr")
    plan = scorch.explain(MOE, x, E, G)
    assert plan.loop_order == ["n", "b", "d", "h"]
    assert [t[0] for t in plan.transposes] == [2]                     # the gate, csr -> csc
    assert plan.output_format.is_dense                                # still a dense result
    tile = plan.schedule.cache_tile
    assert (tile.var, tile.above, tile.block, tile.access) == ("h", "b", ("d",), 1)
    text = str(plan)
    assert "tile loop: for each panel of h" in text and "in parallel" in text
    # the widest register row of this target's panels (128 floats with 32 / 64-byte vectors,
    # 64 with SSE's 16 registers of 16 bytes)
    from scorch.tensor_compiler.target import current
    widest = current().row_widths("float")[-1]
    assert f"run_chunk_w{widest}" in plan.source and "pfns[pi]" in plan.source


def test_moe_forward_scales_each_register_row_by_its_gate_once():
    """The gate ``G[b,n]`` is fixed while a row sums over ``d``: it multiplies the row at its
    store (``output.row_factors``), not every term."""
    x, E = torch.rand(16, 64), torch.rand(4, 64, 300)
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr")
    src = scorch.explain(MOE, x, E, G).source
    body = src[src.index("cdef void run_chunk_w32"):src.index("cdef void run_chunk_w64")]
    loop = body[body.index("for c_d in"):]
    assert "* wv0" in body and "t2_vals" not in loop[:loop.index("(<scorch_vf*>(a.out_vals")]


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 40), n=st.integers(1, 6), d=st.integers(1, 20), h=st.sampled_from([8, 16, 32, 64, 128, 200]),
       k=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.float64]),
       extra=st.booleans(), seed=st.integers(0, 2**20))
def test_held_row_factors_match_dense(b, n, d, h, k, dtype, extra, seed):
    """Held factors (the gate, and a per-input scale indexed by ``b`` alone) against the dense
    oracle, over register widths and tails."""
    g = torch.Generator().manual_seed(seed)
    x, E = torch.randn(b, d, dtype=dtype, generator=g), torch.randn(n, d, h, dtype=dtype, generator=g)
    gate = topk_gate(b, n, min(k, n), dtype=dtype, seed=seed)
    G = scorch.sparse_tensor(gate, format="csr")
    if extra:
        s = torch.randn(b, dtype=dtype, generator=g)
        got = scorch.einsum("bd,ndh,bn,b->bh", x, E, G, s)
        want = torch.einsum("bd,ndh,bn,b->bh", x.double(), E.double(), gate.double(), s.double())
    else:
        got = scorch.einsum(MOE, x, E, G)
        want = torch.einsum(MOE, x.double(), E.double(), gate.double())
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))


def test_expert_gradient_accumulates_register_rows_over_the_inputs():
    dy, x = torch.rand(16, 300), torch.rand(16, 8)
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csc")
    plan = scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd")
    assert plan.loop_order == ["n", "d", "b", "h"] and not plan.transposes
    tile = plan.schedule.cache_tile
    assert (tile.var, tile.above, tile.block, tile.access) == ("h", "d", ("b",), 0)
    assert "tile loop" in str(plan)


def test_gate_gradient_reads_expert_major_and_keeps_the_gate_format():
    """A sparse result over exactly the one sparse operand's variables counts its operands'
    restreamed blocks too: the gate gradient runs expert-major and is converted back to the
    gate's format (a result in CSR for a CSR gate, never a CSC one)."""
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr")
    dy, x, E = torch.rand(16, 300), torch.rand(16, 64), torch.rand(4, 64, 300)
    plan = scorch.explain(GATE_GRAD, G, dy, x, E)
    assert plan.loop_order == ["n", "b", "d", "h"] and [t[0] for t in plan.transposes] == [0]
    assert plan.output_format == as_format("csr")
    got = scorch.einsum(GATE_GRAD, G, dy, x, E)
    assert isinstance(got, scorch.SparseTensor) and got.format == as_format("csr")
    # the forward over a COO gate has a sparse result over (b, h): left as it was
    coo = scorch.explain(MOE, x, E, scorch.sparse_tensor(topk_gate(16, 4, 2), format="coo"))
    # an expert that fits in L1 is re-read per input from there: the gate read as stored
    small = scorch.explain(MOE, x[:, :8], E[:, :8, :8], G)
    assert small.loop_order == ["b", "n", "d", "h"] and not small.transposes
    assert coo.loop_order == ["b", "n", "d", "h"] and not coo.transposes


def test_spmm_and_sddmm_keep_their_plans():
    A = scorch.sparse_tensor(topk_gate(20, 20, 5), format="csr")
    spmm = scorch.explain("ij,jk->ik", A, torch.rand(20, 300))
    assert spmm.loop_order == ["i", "j", "k"] and spmm.schedule.cache_tile is None
    assert "tile loop" not in str(spmm)
    sddmm = scorch.explain("ij,ik,kj->ij", A, torch.rand(20, 300), torch.rand(300, 20))
    assert sddmm.schedule.cache_tile is None


def test_choose_cache_panel_fits_half_the_l2():
    widths = (4, 8, 16, 32, 64, 128)             # the register widths (float32: 4 bytes)
    every = (4, widths, widths, False)           # every width register-tiled (AVX-512)
    with l2_bytes(1 << 20):
        assert tiling.choose_cache_panel(every, 512, 0, 784) == 128    # 392 KB of 512
        assert tiling.choose_cache_panel(every, 512, 0, 4096) == 32    # 512 KB of 512
        assert tiling.choose_cache_panel(every, 512, 0, 1 << 20) == 4  # none fits: narrowest
        assert tiling.choose_cache_panel(every, 128, 0, 784) == 0      # one register row
        assert tiling.choose_cache_panel((4, (), (), False), 512, 0, 784) == 0   # no register kernel
    with l2_bytes(1 << 30):
        assert tiling.choose_cache_panel(every, 512, 0, 784) == 128    # rows wider than 128


def test_choose_cache_panel_prefers_register_tiled_widths():
    """AVX2 (16 registers): a 64-float row's 8 accumulators leave no room for a second
    row, 32 floats take three (``tile_factor``): the narrower tiled panel wins, but only
    among the widths that fit; untiled kernels keep the widest fitting width."""
    widths, avx2 = (4, 8, 16, 32, 64, 128), (4, 8, 16, 32)
    with l2_bytes(1 << 19):                      # Zen 3: 256 KB for the panel
        assert tiling.choose_cache_panel((4, widths, avx2, False), 512, 0, 784) == 32
        assert tiling.choose_cache_panel((4, widths, (), False), 512, 0, 784) == 64    # no tile at all
        assert tiling.choose_cache_panel((4, widths, (128,), False), 512, 0, 784) == 64  # tiled, too big
        assert tiling.choose_cache_panel((4, widths, avx2, False), 512, 0, 1 << 20) == 4  # none fits
        assert tiling.choose_cache_panel((4, widths, avx2, False), 48, 0, 784) == 32
        assert tiling.choose_cache_panel((4, widths, avx2, False), 32, 0, 784) == 0    # one register row
        assert tiling.choose_cache_panel((8, widths, (16,), False), 512, 0, 784) == 16  # float64


def test_choose_cache_panel_takes_the_fewest_passes_when_a_pass_gathers():
    widths = (4, 8, 16, 32, 64, 128)
    with l2_bytes(1 << 12):                      # nothing fits: still the widest
        assert tiling.choose_cache_panel((4, widths, (4, 8), True), 512, 0, 1024) == 128
        assert tiling.choose_cache_panel((4, widths, (4, 8), True), 128, 0, 1024) == 0   # one row


def test_cache_tile_says_whether_its_passes_gather():
    """The expert gradient ``n, d, b, h`` reads ``x[b, d]`` per stored entry with ``d``
    above the sparse ``b``: every panel's pass gathers it again; the forward ``n, b, d, h``
    reads ``x[b, :]`` as rows."""
    dy, x = torch.rand(16, 300), torch.rand(16, 64)
    G = topk_gate(16, 4, 2)
    grad = scorch.explain(EXPERT_GRAD, dy, x, scorch.sparse_tensor(G, format="csc"), out_format="ddd")
    fwd = scorch.explain(MOE, x, torch.rand(4, 64, 300), scorch.sparse_tensor(G, format="csr"))
    assert grad.schedule.cache_tile.gathers and "each pass gathers" in str(grad.schedule.cache_tile)
    assert not fwd.schedule.cache_tile.gathers


@pytest.mark.parametrize("name", ["avx2", "avx512"])
def test_plans_know_their_register_tiled_widths(name):
    """``PlanEntry.tiled_panels`` are the widths whose chunk function the lowering jammed
    (read off the kernel, per target): on AVX2 up to 32 floats, on AVX-512 up to 128."""
    from scorch.tensor_compiler import plans
    from scorch.tensor_compiler.target import use_target
    x, E = torch.rand(16, 64), torch.rand(4, 64, 300)
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr")
    with use_target(name):
        plan = scorch.explain(MOE, x, E, G)
        entry = next(e for e in plans._plans.values() if e.schedule is plan.schedule)
    assert entry.tiled_panels == ((4, 8, 16, 32) if name == "avx2" else (4, 8, 16, 32, 64, 128))
    text = str(plan)
    for W in (32, 64, 128):     # explain's outline marks the jammed loop "# tile"
        body = text.split(f"run_chunk_w{W}  (when")[1].split("run_chunk")[0]
        assert ("# tile" in body) == (W in entry.tiled_panels)


# ---------------------------------------------------------------- results = dense torch
SETTINGS = dict(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def moe_cases(draw):
    b = draw(st.sampled_from([0, 1, 7, 40]))
    d = draw(st.sampled_from([1, 5, 33]))
    h = draw(st.sampled_from([1, 16, 130, 200]))
    n = draw(st.sampled_from([1, 3, 6]))
    k = draw(st.integers(0, n))                  # 0: an empty gate, n: a full one
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    fmt = draw(st.sampled_from(["csr", "csc", "coo", "dcsr"]))
    l2 = draw(st.sampled_from([1 << 12, 1 << 20]))
    return b, d, h, n, k, dtype, fmt, l2, draw(st.integers(0, 3))


def _close(got, want):
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    tol = 1e-4 if want.dtype == torch.float32 else 1e-10
    torch.testing.assert_close(torch.as_tensor(got), want, rtol=tol, atol=tol)


@settings(**SETTINGS)
@given(moe_cases())
def test_moe_einsum_and_its_gradient_kernels_equal_dense(case):
    _moe_kernels_equal_dense(*case)


def _moe_kernels_equal_dense(b, d, h, n, k, dtype, fmt, l2, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, d, generator=g, dtype=dtype)
    E = torch.rand(n, d, h, generator=g, dtype=dtype)
    dy = torch.rand(b, h, generator=g, dtype=dtype)
    dense = topk_gate(b, n, k, dtype, seed)
    G = scorch.sparse_tensor(dense, format=fmt)
    with l2_bytes(l2):
        _close(scorch.einsum(MOE, x, E, G), torch.einsum(MOE, x, E, dense))
        _close(scorch.einsum(MOE, x, E, G, out_format="dense"), torch.einsum(MOE, x, E, dense))
        _close(scorch.einsum(EXPERT_GRAD, dy, x, G, out_format="ddd"), torch.einsum(EXPERT_GRAD, dy, x, dense))
        _close(scorch.einsum(GATE_GRAD, G, dy, x, E), torch.einsum(GATE_GRAD, dense, dy, x, E))


@settings(**dict(SETTINGS, max_examples=12))
@given(moe_cases())
def test_moe_layer_gradients_equal_dense(case):
    """The MoE layer as the example writes it (a CSR gate built from coordinates and
    differentiable values): x, expert and gate-value gradients against dense torch."""
    b, d, h, n, k, dtype, _fmt, l2, seed = case
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, d, generator=g, dtype=dtype, requires_grad=True)
    E = torch.rand(n, d, h, generator=g, dtype=dtype, requires_grad=True)
    w = torch.rand(b, h, generator=g, dtype=dtype)
    dense = topk_gate(b, n, k, dtype, seed)
    idx = dense.nonzero().t()
    vals = dense[idx[0], idx[1]].clone().requires_grad_(True)
    with l2_bytes(l2):
        G = scorch.sparse_tensor((idx, vals), size=(b, n), format="csr")
        (scorch.einsum(MOE, x, E, G) * w).sum().backward()
    xd, Ed = x.detach().clone().requires_grad_(True), E.detach().clone().requires_grad_(True)
    Gd = dense.clone().requires_grad_(True)
    (torch.einsum(MOE, xd, Ed, Gd) * w).sum().backward()
    _close(E.grad, Ed.grad)
    _close(x.grad, xd.grad)
    _close(vals.grad, Gd.grad[idx[0], idx[1]])


@st.composite
def panel_rule_cases(draw):
    """Shapes where the panel rules pick narrow tiled panels (the forward, an L2 that
    holds a 64-wide panel of a 33-row block but not 128) or the widest (the expert
    gradient's gathering passes); 0- and 1-sized dims, empty and full gates."""
    b = draw(st.sampled_from([0, 1, 9, 300]))
    d = draw(st.sampled_from([0, 1, 33]))
    h = draw(st.sampled_from([1, 40, 130, 200]))
    n = draw(st.sampled_from([1, 4]))
    k = draw(st.integers(0, n))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    fmt = draw(st.sampled_from(["csr", "coo", "dcsc"]))
    l2 = draw(st.sampled_from([1 << 15, 1 << 17]))
    return b, d, h, n, k, dtype, fmt, l2, draw(st.sampled_from([1, 2])), draw(st.integers(0, 3))


@settings(**SETTINGS)
@given(panel_rule_cases())
def test_panel_rules_equal_dense(case):
    from scorch.tensor_compiler import threads as th
    *kernel_case, nthreads, seed = case
    old, known, free = torch.get_num_threads(), th._load_known, th._free_cores
    torch.set_num_threads(nthreads)
    th._load_known, th._free_cores = True, (lambda T: T)     # no load estimate: all threads
    try:
        _moe_kernels_equal_dense(*kernel_case, seed)
    finally:
        torch.set_num_threads(old)
        th._load_known, th._free_cores = known, free


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_panels_equal_dense(threads):
    """Panels run under prange when nothing below is split into chunks (the forward's
    outermost loop, n, is a reduction): big enough for the kernel to use 2 threads."""
    x, E = torch.rand(300, 64), torch.rand(4, 64, 520)
    dense = topk_gate(300, 4, 2)
    G = scorch.sparse_tensor(dense, format="csr")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with l2_bytes(1 << 16):
            _close(scorch.einsum(MOE, x, E, G), torch.einsum(MOE, x, E, dense))
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------- the re-read block's size class
def _spmm3(n: int, K: int, L: int):
    dense = topk_gate(n, n, 5)                         # 5 stored a row: no statistics (< 4096)
    return scorch.sparse_tensor(dense, format="csr"), dense, torch.rand(n, K, L)


def test_block_key_classes_the_block_no_sparse_operand_indexes():
    from scorch.tensor_compiler.planner import block_key, small_blocks
    A, _d, B = _spmm3(50, 8, 64)
    with l2_bytes(1 << 20):
        assert block_key("ij,jkl->ikl", [A._storage, B]) == (-1, 0)            # 8 x 64 x 4 B = 2 KB
        assert block_key("ij,jkl->ikl", [A._storage, torch.rand(50, 64, 128)]) == (-1, 1)  # 32 KB
        gate = scorch.sparse_tensor(topk_gate(4, 8, 2), format="csr")._storage
        # the MoE expert: d x h = 784 x 512 float32 (1.6 MB), whatever the batch
        assert block_key(MOE, [torch.rand(4, 784), torch.rand(8, 784, 512), gate]) == (-1, 2, -1)
        assert block_key("ij,jk->ik", [A._storage, torch.rand(50, 8)]) == ()   # no 3-d operand
    assert small_blocks((-1, 0, 1)) == frozenset({1})


def test_small_re_read_blocks_keep_the_plan_big_ones_are_hoisted():
    """``ij,jkl->ikl`` over CSR: a 2 KB block B[j] re-read per stored entry stays in L1, so
    A is read as stored (i, k, j, l); a 32 KB one makes the planner read A column-major so
    each block serves a whole column (j, i, k, l, A transposed). The warm path keys the
    two apart (the first plan is not reused for the second size)."""
    from scorch.tensor_compiler import api
    A, dense, small = _spmm3(300, 8, 64)
    big = torch.rand(300, 64, 128)
    with l2_bytes(1 << 20):
        p_small, p_big = scorch.explain("ij,jkl->ikl", A, small), scorch.explain("ij,jkl->ikl", A, big)
        assert p_small.loop_order == ["i", "k", "j", "l"] and not p_small.transposes
        assert p_big.loop_order == ["j", "i", "k", "l"] and [t[0] for t in p_big.transposes] == [0]
        for B in (small, big, small):
            _close(scorch.einsum("ij,jkl->ikl", A, B), torch.einsum("ij,jkl->ikl", dense, B))
    keys = [k for k in api._fast if k[0] == "ij,jkl->ikl" and k[-1] in ((-1, 0), (-1, 1))]
    assert {k[-1] for k in keys} == {(-1, 0), (-1, 1)}
    assert {api._fast[k].schedule.loop_order[0] for k in keys} == {"i", "j"}
