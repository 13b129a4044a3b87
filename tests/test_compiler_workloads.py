"""Workload-level guarantees: SDDMM memory follows nnz, MoE touches only the chosen expert."""
import json
import os
import subprocess
import sys
import textwrap

import torch

from compiler_helpers import dense, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import threads
from scorch.formats import as_format


_SDDMM_SCRIPT = textwrap.dedent(r"""
    import json, resource, sys
    import numpy as np, torch
    sys.path.insert(0, sys.argv[1])
    from reference_storage import reference_from_coords
    from scorch.formats import as_format
    import scorch.tensor_compiler as C
    n, k = 60000, 16
    torch.set_num_threads(2)
    rows = np.arange(n)
    cols = np.random.default_rng(0).integers(0, n, n)
    S = reference_from_coords(np.vstack([rows, cols]), torch.ones(n), (n, n), as_format("csr"))
    B = torch.randn(n, k); Cm = torch.randn(k, n)
    # warm-up on a tiny problem of the same formats: compiling in process costs memory too
    s = reference_from_coords(np.vstack([np.arange(4), np.arange(4)]), torch.ones(4), (4, 4), as_format("csr"))
    C.einsum("ij,ik,kj->ij", s, torch.randn(4, k), torch.randn(k, 4))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    R = C.einsum("ij,ik,kj->ij", S, B, Cm)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    want = (B[torch.from_numpy(rows)] * Cm[:, torch.from_numpy(cols)].T).sum(1)
    ok_struct = (R.format == S.format and torch.equal(R.levels[1].pos.long(), S.levels[1].pos.long())
                 and torch.equal(R.levels[1].crd.long(), S.levels[1].crd.long()))
    print(json.dumps({"before_kb": before, "after_kb": after, "nnz": R.nnz,
                      "struct": bool(ok_struct),
                      "err": float((R.values - want).abs().max())}))
""")


def test_sddmm_60k_memory_follows_nnz():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _SDDMM_SCRIPT, here], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["struct"], "SDDMM output must be sparse like S (same pos/crd)"
    assert r["nnz"] == 60000
    assert r["err"] < 1e-3
    # A dense 60k x 60k product would need 14.4 GB; the kernel's growth must stay within a
    # bound proportional to nnz (generous constant: 512 bytes per stored entry = 30 MB).
    grew_kb = r["after_kb"] - r["before_kb"]
    assert grew_kb < 60000 // 2, f"peak RSS grew by {grew_kb} KB"


def test_moe_gate_iterated_sparsely():
    B, D, N, H = 16, 8, 5, 6
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, D, generator=g, dtype=torch.float64)
    E = torch.randn(N, D, H, generator=g, dtype=torch.float64)
    choice = torch.randint(0, N, (B,), generator=g)
    gates = torch.nn.functional.one_hot(choice, N).to(torch.float64)
    gs = sparse(gates, "coo")
    plan = C.explain("bd,ndh,bn->bh", x, E, gs)
    assert plan.loop_order[:2] == ["b", "n"]
    # the expert loop runs over the gate's stored entries, never over all N experts
    assert "for c_n in range" not in plan.source
    gate_level = next(a for a in plan.schedule.accesses if a.tensor == 2).levels[1]
    assert gate_level.var == "n" and gate_level.kind.is_sparse
    assert f"for {gate_level.q} in range({gate_level.q}, {gate_level.hi})" in plan.source
    y = C.einsum("bd,ndh,bn->bh", x, E, gs)
    torch.testing.assert_close(dense(y), torch.einsum("bd,ndh,bn->bh", x, E, gates))
    # counter: poison every expert that no row chose; a kernel that touched one would give NaN
    E2 = E.clone()
    unused = sorted(set(range(N)) - set(choice.tolist()))
    E2[unused] = float("nan")
    y2 = dense(C.einsum("bd,ndh,bn->bh", x, E2, gs))
    assert not torch.isnan(y2).any()
    torch.testing.assert_close(y2, dense(y))


def test_moe_csr_gate_and_dense_output_override():
    B, D, N, H = 12, 4, 3, 5
    x = torch.randn(B, D, dtype=torch.float64)
    E = torch.randn(N, D, H, dtype=torch.float64)
    gates = torch.nn.functional.one_hot(torch.arange(B) % N, N).to(torch.float64)
    y = C.einsum("bd,ndh,bn->bh", x, E, sparse(gates, "csr"), out_format="dense")
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.einsum("bd,ndh,bn->bh", x, E, gates))


def test_parallel_chunks_match_serial(monkeypatch, request):
    """Large enough for several prange chunks: dense outputs, sparse outputs appended per
    chunk (direct, accumulator, workspace) must equal the one-thread result exactly."""
    from compiler_helpers import rand
    x, y = rand((300, 280), 0.4, seed=31), rand((280, 260), 0.4, seed=32)
    b, c = torch.randn(300, 8, dtype=torch.float64), torch.randn(8, 280, dtype=torch.float64)
    a, bb = sparse(x, "csr"), sparse(y, "csr")
    cases = [("ij,jk->ik", (a, y)), ("ij,jk->ik", (a, bb)), ("ij,ik,kj->ij", (a, b, c)),
             ("ij,ij->ij", (a, sparse(x * 2, "dcsr"))), ("ij,j->i", (sparse(x, "coo"), y[:, 0]))]
    request.addfinalizer(C.plan_cache_clear)   # no runner keeps the patched thread function
    for eq, ops in cases:
        monkeypatch.setattr(threads, "threads_for", lambda w: 1)
        C.plan_cache_clear()   # warm runners keep the thread function they were made with
        one = dense(C.einsum(eq, *ops))
        monkeypatch.setattr(threads, "threads_for", lambda w: 4)
        C.plan_cache_clear()
        many = dense(C.einsum(eq, *ops))
        torch.testing.assert_close(many, one, rtol=0, atol=0)
        want = torch.einsum(eq, *[dense(o) for o in ops])
        torch.testing.assert_close(many, want)
