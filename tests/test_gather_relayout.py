"""A dense operand a sparse loop gathers below a loop over its other indices (the MoE expert
gradient ``n, d, b, h`` reads ``x[b, d]``: ``lower.facts.gather_relayouts``) is copied to
loop order once per call where that pays (``relayout.gather_pays``: enough stored entries;
``tiling.relaid_panel_narrower``: in a cache tile, only where the copy lets the panels
narrow to register-tiled widths); otherwise it is read with its strides. Oracle: dense
torch over layouts, formats, dtypes, 0/1-sized dims, empty and full gates, 1 and 2 threads;
``explain`` says which it does. Also: a guarded prefetch no longer stops the register tile
(the expert gradient's 32-float rows are jammed on AVX2 again)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.tensor_compiler import plans, tiling
from scorch.tensor_compiler.api import plan_cache_clear
from scorch.tensor_compiler.relayout import COPY_PER_READ, gather_pays
from scorch.tensor_compiler.target import use_target

EXPERT_GRAD = "bh,bd,bn->ndh"
HIDDEN_FIRST = "bh,bd,bn->nhd"     # loop order n, h, b, d: dy[b, h] is the gathered operand
SETTINGS = dict(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "row":
        return t
    if layout == "col":                      # b-fastest: stride 1 along the gathered b
        return t.t().contiguous().t()
    wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]                      # a strided view


def _entry(plan):
    return next(e for e in plans._plans.values() if e.schedule is plan.schedule)


def _relayout_lines(plan, operand: int):
    return [ln for ln in str(plan).splitlines() if ln.startswith(f"relayout:     operand {operand} (")]


@st.composite
def cases(draw):
    b = draw(st.sampled_from([0, 1, 9, 64]))
    d = draw(st.sampled_from([0, 1, 5, 33]))
    h = draw(st.sampled_from([1, 8, 40, 130]))
    n = draw(st.sampled_from([1, 4]))
    k = draw(st.integers(0, n))                       # 0: an empty gate, n: a full one
    sparse_rows = draw(st.sampled_from([None, 1]))    # a gate of one stored row: refused
    return (b, d, h, n, k, sparse_rows, draw(st.sampled_from([torch.float32, torch.float64])),
            draw(st.sampled_from(["csr", "csc", "coo"])), draw(st.sampled_from(["row", "col", "strided"])),
            draw(st.sampled_from([EXPERT_GRAD, HIDDEN_FIRST])), draw(st.sampled_from([1, 2])),
            draw(st.sampled_from([1 << 12, 1 << 20])), draw(st.integers(0, 3)))


@settings(**SETTINGS)
@given(cases())
def test_gathered_operand_in_any_layout_equals_dense(case):
    from scorch.tensor_compiler import threads as th
    b, d, h, n, k, sparse_rows, dtype, fmt, layout, eq, nthreads, l2, seed = case
    g = torch.Generator().manual_seed(seed)
    dy = _layout(torch.rand(b, h, generator=g, dtype=dtype), layout)
    x = _layout(torch.rand(b, d, generator=g, dtype=dtype), layout)
    dense = topk_gate(b, n, k, dtype, seed)
    if sparse_rows is not None:
        dense[sparse_rows:] = 0
    G = scorch.sparse_tensor(dense, format=fmt)
    old, known, free, real_l2 = torch.get_num_threads(), th._load_known, th._free_cores, tiling.l2_cache_bytes
    torch.set_num_threads(nthreads)
    th._load_known, th._free_cores = True, (lambda T: T)     # no load estimate: all threads
    tiling.l2_cache_bytes = lambda: l2
    try:
        want = torch.einsum(eq, dy, x, dense)
        for _ in range(3):                       # general path, then the warm runners
            got = scorch.einsum(eq, dy, x, G, out_format="ddd")
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            torch.testing.assert_close(torch.as_tensor(got), want, rtol=tol, atol=tol * max(b, 1))
    finally:
        torch.set_num_threads(old)
        th._load_known, th._free_cores = known, free
        tiling.l2_cache_bytes = real_l2


def test_gather_relayouts_name_the_gathered_operand():
    """The expert gradient gathers x (operand 1) along b below d; ``n, h, b, d`` gathers
    dy (operand 0) along b below h; the forward and SpMM-like forms gather nothing."""
    dy, x = torch.rand(16, 300), torch.rand(16, 64)
    G = scorch.sparse_tensor(topk_gate(16, 4, 2), format="csc")
    assert _entry(scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd")).gather_relayout == {1: (0, (1, 0), (1, 0))}
    assert _entry(scorch.explain(HIDDEN_FIRST, dy, x, G, out_format="ddd")).gather_relayout == {0: (0, (1, 0), (1, 0))}
    assert _entry(scorch.explain("bd,bn->nd", x, G, out_format="dd")).gather_relayout == {}
    fwd = scorch.explain("bd,ndh,bn->bh", x, torch.rand(4, 64, 300), scorch.sparse_tensor(topk_gate(16, 4, 2), format="csr"))
    assert _entry(fwd).gather_relayout == {}


def test_gather_pays_counts_the_stored_entries():
    # x 1024 x 784: each stored gate entry reads 784 values of it
    assert gather_pays(1024 * 784, 2048, 1024)
    assert gather_pays(1024 * 784, -(-1024 // COPY_PER_READ), 1024)
    assert not gather_pays(1024 * 784, 1024 // COPY_PER_READ - 1, 1024)
    assert not gather_pays(0, 5, 0)


def _moe(b=256, d=40, h=512, n=8, k=2, rows=None, fmt="csc"):
    g = torch.Generator().manual_seed(0)
    x, dy = torch.rand(b, d, generator=g), torch.rand(b, h, generator=g)
    dense = topk_gate(b, n, k, torch.float32, 0)
    if rows is not None:
        dense[rows:] = 0
    return dy, x, scorch.sparse_tensor(dense, format=fmt)


def test_explain_says_copied_read_in_place_or_refused():
    dy, x, G = _moe()
    with use_target("avx2"):
        copied = _relayout_lines(scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd"), 1)
        in_place = _relayout_lines(scorch.explain(EXPERT_GRAD, dy, x.t().contiguous().t(), G, out_format="ddd"), 1)
        few = _moe(rows=8)
        refused = _relayout_lines(scorch.explain(EXPERT_GRAD, few[0], few[1], few[2], out_format="ddd"), 1)
    assert copied == ["relayout:     operand 1 (b gathered by the sparse loop below d, stride 40): "
                      f"copied to loop order once per call, {256 * 40} entries; the kernel gathers {512 * 40}"]
    assert in_place == ["relayout:     operand 1 (b gathered by the sparse loop below d, stride 1): read in place"]
    assert len(refused) == 1 and "read with its strides (640 gathered; a copy would move 10240)" in refused[0]


def test_relayout_refused_where_the_panels_would_not_narrow():
    """AVX-512 with a 1 MiB L2 tiles the 128-wide panel the gathering passes take anyway:
    row-major x is kept (at an equal width the copy lost on AVX2)."""
    dy, x, G = _moe(d=784)
    real = tiling.l2_cache_bytes
    tiling.l2_cache_bytes = lambda: 1 << 20
    try:
        with use_target("avx512"):
            wide = _relayout_lines(scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd"), 1)
        with use_target("avx2"):
            narrow = _relayout_lines(scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd"), 1)
    finally:
        tiling.l2_cache_bytes = real
    assert len(wide) == 1 and wide[0].endswith("the panels would not narrow)")
    assert len(narrow) == 1 and "copied to loop order once per call" in narrow[0]


@pytest.mark.parametrize("layout", ["row", "col"])
def test_relaid_calls_take_register_tiled_panels(layout):
    """On every run path (general, Python runner, C plan) a call whose gathered operand is
    at stride 1 (copied, or given so) picks the panel width as if nothing gathered."""
    dy, x, G = _moe(d=64)
    x = _layout(x, layout)
    seen = []
    real = tiling.choose_cache_panel

    def spy(first, extent, nnz, block):
        seen.append(first[3])
        return real(first, extent, nnz, block)
    tiling.choose_cache_panel = spy
    try:
        with use_target("avx2"):
            plan_cache_clear()
            want = torch.einsum(EXPERT_GRAD, dy, x, G.to_dense())
            for _ in range(3):
                torch.testing.assert_close(scorch.einsum(EXPERT_GRAD, dy, x, G, out_format="ddd"), want,
                                           rtol=1e-4, atol=1e-3)
    finally:
        tiling.choose_cache_panel = real
        plan_cache_clear()
    assert seen and not any(seen)


@pytest.mark.parametrize("name,widths", [("avx2", (4, 8, 16, 32)), ("avx512", (4, 8, 16, 32, 64, 128))])
def test_prefetched_rows_are_still_register_tiled(name, widths):
    """The expert gradient's rows prefetch the gathered ``dy`` rows ahead
    (``KernelFacts.row_gathers``); the guarded prefetch must not stop the jam."""
    dy, x, G = _moe(b=16, d=64, h=300, n=4)
    with use_target(name):
        plan = scorch.explain(EXPERT_GRAD, dy, x, G, out_format="ddd")
        assert _entry(plan).tiled_panels == widths
    body = str(plan).split("run_chunk_w32  (when")[1].split("run_chunk")[0]
    assert "# tile" in body
