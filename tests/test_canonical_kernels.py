"""Kernels named by loop depth (``tensor_compiler.canonical``): the same einsum written with
other letters compiles no second module, and its arguments still bind to the caller's
variables. Oracle: dense torch."""
from __future__ import annotations

import pytest
import torch

from compiler_helpers import dense, rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import build
from scorch.tensor_compiler.canonical import canonical_schedule, caller_args
from scorch.tensor_compiler.plans import _plans

RENAMED = [
    # (equation, the same with other letters, operand shapes after the sparse one)
    ("ij,jk->ik", "nm,md->nd", [(20, 6)]),
    ("ij,ik->jk", "ba,bc->ac", [(30, 5)]),          # a reduction outside the rows (scatter)
    ("ij,ik,jk->ij", "qp,qr,pr->qp", [(30, 4), (20, 4)]),   # SDDMM
    ("ij,j->i", "xy,y->x", [(20,)]),
]


def _module(eq, *ops):
    C.einsum(eq, *ops, out_format="dense")
    entry = next(e for k, e in reversed(list(_plans.items())) if k[1] == eq)
    (mod, args, src), = entry.kernels.values()
    return mod, src


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("eq,renamed,shapes", RENAMED)
def test_renamed_einsums_share_one_module(eq, renamed, shapes, fmt):
    # planned afresh for both: a plan cached by an earlier test for another operand of the
    # same statistics class may have chosen another order (then another kernel, rightly)
    C.plan_cache_clear()
    a = rand((30, 20), 0.2, dtype=torch.float32, seed=4)
    A = sparse(a, fmt)
    ops = [torch.randn(*s) for s in shapes]
    mod, src = _module(eq, A, *ops)
    before = build.cache_info()["misses"]
    mod2, src2 = _module(renamed, A, *ops)
    assert src2 == src and mod2 is mod
    assert build.cache_info()["misses"] == before
    want = torch.einsum(eq, a, *ops)
    for e in (eq, renamed):
        torch.testing.assert_close(dense(C.einsum(e, A, *ops, out_format="dense")), want,
                                   rtol=1e-5, atol=1e-5)


def test_depth_names_and_the_arguments_map_back():
    """A loop order that is not the letters' order (CSC ``A @ X``: j, i, k) is named by
    depth in the kernel; its size and stride arguments name the caller's variables."""
    A = sparse(rand((30, 20), 0.2, dtype=torch.float32, seed=5), "csc")
    plan = C.explain("ab,bc->ac", A, torch.randn(20, 6), out_format="dense")
    s = plan.schedule
    renamed, back = canonical_schedule(s)
    assert renamed.loop_order == ["i", "j", "k"][:len(s.loop_order)]
    assert [back[v] for v in renamed.loop_order] == list(s.loop_order)
    assert all(ap.indices == tuple({v: k for k, v in back.items()}[x] for x in orig.indices)
               for ap, orig in zip(renamed.accesses, s.accesses))
    args = caller_args([("N_i", "int64_t", ("size", "i")), ("t1_st_j", "int64_t", ("stride", 1, "j")),
                        ("out_st_k", "int64_t", ("ostride", "k")), ("t0_pos1", "int32_t*", ("pos", 0, 1))],
                       back)
    assert [w for _, _, w in args] == [("size", back["i"]), ("stride", 1, back["j"]),
                                       ("ostride", back["k"]), ("pos", 0, 1)]
