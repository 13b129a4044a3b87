"""Rows a fixed-width kernel re-reads at a stride are copied into one contiguous buffer
(``lower.pack_rows``): the gathered rows of a segment re-run per iteration of a loop above
it (the MoE expert gradient's ``dy[b, panel]``, loop order ``n, d, b, h``) and the panel of
a block re-read per stored entry (the MoE forward's ``E[n, :, panel]``, ``n, b, d, h``;
copied only where its rows are not contiguous already). Oracle: dense torch over 0/1-sized
dims, empty and full gates, float32/64, csr/coo (csc/coo for the gradient), 1 and 2 threads,
panels and whole rows;
``explain`` shows the copy loops (``# pack``), and kernels without such a re-read have none."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from compiler_helpers import topk_gate
from scorch.tensor_compiler import tiling
from scorch.tensor_compiler.target import use_target

FORWARD, EXPERT_GRAD = "bd,ndh,bn->bh", "bh,bd,bn->ndh"
SETTINGS = dict(max_examples=15, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _variant(plan, name: str) -> str:
    return str(plan).split(f"{name}  (when")[1].split("run_chunk")[0]


@st.composite
def cases(draw):
    b = draw(st.sampled_from([0, 1, 9, 40]))
    d = draw(st.sampled_from([0, 1, 7]))
    h = draw(st.sampled_from([1, 32, 40]))      # 32: whole rows of one width; 40: panels
    n = draw(st.sampled_from([1, 3]))
    k = draw(st.integers(0, n))                 # 0: an empty gate, n: a full one
    eq = draw(st.sampled_from([FORWARD, EXPERT_GRAD]))
    fmt = draw(st.sampled_from(["csr", "coo"] if eq == FORWARD else ["csc", "coo"]))
    return (b, d, h, n, k, draw(st.sampled_from([torch.float32, torch.float64])), fmt, eq,
            draw(st.sampled_from([1, 2])), draw(st.integers(0, 3)))


@settings(**SETTINGS)
@given(cases())
def test_packed_rows_equal_dense(case):
    from scorch.tensor_compiler import threads as th
    b, d, h, n, k, dtype, fmt, eq, nthreads, seed = case
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, d, generator=g, dtype=dtype)
    dense = topk_gate(b, n, k, dtype, seed)
    G = scorch.sparse_tensor(dense, format=fmt)
    if eq == FORWARD:
        ops = (x, torch.rand(n, d, h, generator=g, dtype=dtype), G)
        dense_ops = ops[:2] + (dense,)
    else:
        ops = (torch.rand(b, h, generator=g, dtype=dtype), x, G)
        dense_ops = ops[:2] + (dense,)
    old, known, free, l1 = torch.get_num_threads(), th._load_known, th._free_cores, tiling.l1_cache_bytes
    torch.set_num_threads(nthreads)
    th._load_known, th._free_cores = True, (lambda T: T)     # no load estimate: all threads
    # these small blocks planned as the MoE's (re-read per entry: the expert-major plans)
    tiling.l1_cache_bytes = lambda: 256
    try:
        want = torch.einsum(eq, *dense_ops)
        kw = {"out_format": "dd" if eq == FORWARD else "ddd"}
        if b > 1 and d * h * x.element_size() > 128 and (eq == FORWARD or fmt == "csc"):
            assert "# pack" in str(scorch.explain(eq, *ops, **kw))
        for _ in range(2):                       # general path, then the warm runner
            got = scorch.einsum(eq, *ops, **kw)
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            torch.testing.assert_close(torch.as_tensor(got), want, rtol=tol, atol=tol * max(b, d, 1))
    finally:
        torch.set_num_threads(old)
        th._load_known, th._free_cores, tiling.l1_cache_bytes = known, free, l1


def test_moe_kernels_pack_what_they_re_read():
    """The expert gradient copies the segment's gathered dy rows once per expert (before
    the jammed d loop and its rest, shared); the forward copies E[n]'s panel where the
    panel is narrower than the row, else reads the block in place."""
    x, dy = torch.rand(64, 40), torch.rand(64, 300)
    E = torch.rand(4, 40, 300)
    with use_target("avx2"):
        grad = scorch.explain(EXPERT_GRAD, dy, x, scorch.sparse_tensor(topk_gate(64, 4, 2), format="csc"),
                              out_format="ddd")
        fwd = scorch.explain(FORWARD, x, E, scorch.sparse_tensor(topk_gate(64, 4, 2), format="csr"))
    body = _variant(grad, "run_chunk_w32")
    # the copy (each row scaled by its gate value: its own loop) comes before the tile
    assert body.count("# pack") == 2 and body.index("# pack") < body.index("# tile")
    assert "wv3_u2" in body and "wv0_u3" not in body          # 3 rows of 4 vectors (tile_factor)
    # each loop twice: as rewritten where the rows were copied, then as written
    copied, in_place = body.split("# tile")[1], body.split("# tile")[2]
    # where copied, the gate value rides in the rows: one multiply a term, not two
    assert "pk0 + o0_2" in copied and "a.t2_vals[q2_1]" not in copied
    assert "pk0_scale = a.t2_vals[pk0_q]" in grad.source and "pk0_scale * a.t0_vals[" in grad.source
    # rows past PACK_MAX_BYTES: the loop as written, reading (and prefetching) them in place
    assert "a.t0_vals + o0_2" in in_place and "a.t2_vals[q2_1]" in in_place
    assert "if q2_1 < pfe:" in grad.source
    body = _variant(fwd, "run_chunk_w32")
    assert body.count("# pack") == 1 and "if a.t1_st_d != 32 and" in body and "pk0 + o1_2" in body


def test_no_pack_without_a_re_read():
    """SpMM's segment differs per row and SDDMM has no dense loop below its sparse one:
    nothing is copied (their golden sources are unchanged)."""
    A = scorch.sparse_tensor(torch.rand(30, 30) * (torch.rand(30, 30) < 0.2), format="csr")
    with use_target("avx2"):
        spmm = str(scorch.explain("ij,jk->ik", A, torch.rand(30, 300)))
        sddmm = str(scorch.explain("ij,ik,jk->ij", A, torch.rand(30, 64), torch.rand(30, 64)))
    assert "# pack" not in spmm and "# pack" not in sddmm


def test_rows_past_the_cap_are_read_in_place(monkeypatch):
    """Past ``PACK_MAX_BYTES`` a copy (one buffer per thread) is skipped at run time and
    the kernel reads the rows where they are (prefetching the gathered ones, as before)."""
    from scorch.tensor_compiler.api import plan_cache_clear
    from scorch.tensor_compiler.lower import pack_rows
    monkeypatch.setattr(pack_rows, "PACK_MAX_BYTES", 0)
    plan_cache_clear()
    try:
        x, dy, E = torch.rand(64, 40), torch.rand(64, 300), torch.rand(4, 40, 300)
        dense = topk_gate(64, 4, 2)
        with use_target("avx2"):
            grad = scorch.einsum(EXPERT_GRAD, dy, x, scorch.sparse_tensor(dense, format="csc"), out_format="ddd")
            fwd = scorch.einsum(FORWARD, x, E, scorch.sparse_tensor(dense, format="csr"))
            src = scorch.explain(FORWARD, x, E, scorch.sparse_tensor(dense, format="csr")).source
        assert "<= 0" in src
        torch.testing.assert_close(torch.as_tensor(grad), torch.einsum(EXPERT_GRAD, dy, x, dense), rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(torch.as_tensor(fwd), torch.einsum(FORWARD, x, E, dense), rtol=1e-4, atol=1e-3)
    finally:
        plan_cache_clear()


def test_segment_factor_only_where_every_term_is_linear():
    """The gate value is folded into the copied rows only where each term that reads a
    row multiplies it by the value exactly once (``pack_rows._segment_factor``)."""
    from scorch.tensor_compiler.loop_ir import AddTo, Assign, For
    from scorch.tensor_compiler.lower.pack_rows import _segment_factor

    row, g = "(<scorch_vf*>(a.t0_vals + o0_2 + 0))[0]", "a.t2_vals[q]"

    def seg(*stmts):
        return For("q", "q", "h", (Assign("c_b", "a.t2_crd1[q]"), Assign("o0_2", "c_b * a.t0_st_b")) + stmts,
                   "segment")

    ok = [Assign("wv0", f"wv0 + ((a.t1_vals[o1] * {g}) * {row})"),
          AddTo("acc", f"scorch_vf_hsum(({g} * {row}) + ((a.t1_vals[o1] * {g}) * {row.replace('+ 0', '+ 8')}))")]
    for st in ok:
        assert _segment_factor(seg(st), "a.t0_vals + o0_2") == g
    bad = [Assign("wv0", f"wv0 + (({g} * {g}) * {row})"),              # the value twice
           Assign("wv0", f"wv0 + ({g} * a.t1_vals[o1]) + {row}"),      # not a factor of the row's term
           Assign("wv0", f"wv0 + ({g} * ({row} + a.t1_vals[o1]))"),    # the row inside a sum
           Assign("wv0", f"wv0 * {g} + {row}"),                        # not an accumulation
           Assign("t", g)]                                             # the value kept elsewhere
    for st in bad:
        assert _segment_factor(seg(st, Assign("wv1", f"wv1 + ({g} * {row})")), "a.t0_vals + o0_2") is None
