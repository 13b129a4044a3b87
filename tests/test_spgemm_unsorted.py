"""``scorch.einsum(..., sorted=False)``: SpGEMM rows drained in insertion order (no sort,
scipy's contract: unique coordinates in any order). Oracle: dense torch. The result carries
the mark (``Level.ordered`` False), and every consumer that needs order reads its sorted
form: a further kernel (co-iteration merge, binary-search locate), conversions, torch
export; the default stays sorted."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch

FORMATS = ["csr", "dcsr", "coo", "csc", "dcsc"]


def random_matrix(rng, m: int, n: int, density: float, dtype: torch.dtype) -> torch.Tensor:
    keep = torch.from_numpy(rng.random((m, n)) < density)
    vals = torch.from_numpy(rng.standard_normal((m, n))).to(dtype)
    return torch.where(keep, vals, torch.zeros((), dtype=dtype))


def rows_sorted(st) -> bool:
    lv = st.levels[-1]
    pos, crd = lv.pos.long(), lv.crd.long()
    if crd.numel() < 2:
        return True
    first = torch.zeros(crd.numel(), dtype=torch.bool)
    first[pos[:-1][pos[:-1] < crd.numel()]] = True
    return bool((crd.diff() > 0)[~first[1:]].all())


def rows_unique(st) -> bool:
    lv = st.levels[-1]
    seg = torch.repeat_interleave(torch.arange(lv.pos.numel() - 1), lv.pos.long().diff())
    keys = seg * max(lv.size, 1) + lv.crd.long()
    return keys.unique().numel() == keys.numel()


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 6), inner=st.integers(0, 30), n=st.sampled_from([0, 1, 7, 300, 5000]),
       density_a=st.sampled_from([0.0, 0.2, 1.0]), density_b=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt_a=st.sampled_from(FORMATS), fmt_b=st.sampled_from(FORMATS), seed=st.integers(0, 2**16))
def test_unsorted_spgemm_equals_dense(m, inner, n, density_a, density_b, dtype, fmt_a, fmt_b, seed):
    rng = np.random.default_rng(seed)
    a = random_matrix(rng, m, inner, density_a, dtype)
    b = random_matrix(rng, inner, n, density_b, dtype)
    A = scorch.sparse_tensor(a, format=fmt_a)
    B = scorch.sparse_tensor(b, format=fmt_b)
    C = scorch.einsum("ij,jk->ik", A, B, sorted=False)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    expect = a @ b
    torch.testing.assert_close(C.to_dense(), expect, rtol=tol, atol=tol)
    st_ = C._storage
    if st_.levels and st_.levels[-1].pos is not None:
        assert rows_unique(st_)
    # every consumer that needs order gets it
    torch.testing.assert_close(scorch.einsum("ik,ik->ik", C, C).to_dense(), expect * expect,
                               rtol=tol, atol=tol)
    torch.testing.assert_close(C.to_format("csc").to_dense(), expect, rtol=tol, atol=tol)
    torch.testing.assert_close(C.to_torch().to_dense(), expect, rtol=tol, atol=tol)


def spread_product():
    """A 40 x 3000 @ 3000 x 3000 product whose rows are touched out of order (a random
    permutation as the right factor)."""
    rng = np.random.default_rng(7)
    a = sp.random(40, 3000, density=0.02, format="csr", random_state=rng)
    perm = sp.csr_array((np.ones(3000), (np.arange(3000), rng.permutation(3000))), shape=(3000, 3000))
    return a, perm


def test_unsorted_result_is_marked_and_really_unsorted():
    a, perm = spread_product()
    A, P = scorch.from_scipy(a), scorch.from_scipy(perm)
    C = scorch.einsum("ij,jk->ik", A, P, sorted=False)
    st_ = C._storage
    assert not st_.ordered and not st_.levels[-1].ordered
    assert not rows_sorted(st_)           # the drain skipped the sort
    assert rows_unique(st_)
    torch.testing.assert_close(C.to_dense(), torch.from_numpy((a @ perm).toarray()))
    # its sorted form is canonical, computed once and kept
    s1 = st_.with_sorted_coordinates()
    assert s1.ordered and rows_sorted(s1) and s1 is st_.with_sorted_coordinates()
    torch.testing.assert_close(scorch.SparseTensor(s1).to_dense(), C.to_dense())


def test_default_stays_sorted():
    a, perm = spread_product()
    C = scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(perm))
    assert C._storage.ordered and rows_sorted(C._storage)
    # and a sorted=False plan does not leak into the default call (plans keyed apart)
    scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(perm), sorted=False)
    C2 = scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(perm))
    assert C2._storage.ordered and rows_sorted(C2._storage)


def test_consumers_that_need_order_sort_first():
    """Merge co-iteration, binary-search locate (CSR operand in a dense-driven loop),
    SpMV, conversion to COO (which promises sorted tuples) and scipy export."""
    a, perm = spread_product()
    A, P = scorch.from_scipy(a), scorch.from_scipy(perm)
    C = scorch.einsum("ij,jk->ik", A, P, sorted=False)
    ref = torch.from_numpy((a @ perm).toarray())
    D = scorch.einsum("ij,jk->ik", A, P)                  # sorted, same values
    torch.testing.assert_close(scorch.einsum("ij,ij->ij", C, D).to_dense(), ref * ref)
    torch.testing.assert_close(scorch.einsum("ij,ji->ij", C, D.t()).to_dense(), ref * ref)
    x = torch.randn(3000, dtype=torch.float64)
    torch.testing.assert_close(scorch.einsum("ij,j->i", C, x), ref @ x)
    coo = C.to_format("coo")._storage
    keys = coo.levels[0].crd.long() * 3000 + coo.levels[1].crd.long()
    assert bool((keys.diff() > 0).all())
    torch.testing.assert_close(torch.from_numpy(C.to_scipy().toarray()), ref)
    # storage-order accessors pair coordinates with values as stored (unsorted)
    torch.testing.assert_close(torch.sparse_coo_tensor(C.indices(), C.values(), C.shape).to_dense(), ref)
    torch.testing.assert_close(C[3].to_dense(), ref[3])
    torch.testing.assert_close(C[2:10, 5:2000].to_dense(), ref[2:10, 5:2000])
    torch.testing.assert_close((C + C).to_dense(), 2 * ref)
    torch.testing.assert_close(C.t().to_dense(), ref.t())
    # chained: an unsorted result as the operand of another unsorted SpGEMM
    E = scorch.einsum("ij,jk->ik", C, P, sorted=False)
    torch.testing.assert_close(E.to_dense(), ref @ torch.from_numpy(perm.toarray()))


def test_views_and_copies_keep_the_unsorted_mark():
    """clone, unsqueeze and squeeze rebuild the levels over the same (unsorted) arrays: the
    mark must travel with them, or a later merge reads the rows as sorted (wrong sums)."""
    a, perm = spread_product()
    C = scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(perm), sorted=False)
    ref = torch.from_numpy((a @ perm).toarray())
    D = scorch.einsum("ij,jk->ik", scorch.from_scipy(a), scorch.from_scipy(perm))
    for name, view, want in [("clone", C.clone(), ref),
                             ("unsqueeze", C.unsqueeze(0), ref[None]),
                             ("squeeze", C.unsqueeze(0).squeeze(0), ref)]:
        assert not view._storage.ordered, name
        other = D.unsqueeze(0) if name == "unsqueeze" else D
        torch.testing.assert_close((view + other).to_dense(), 2 * want, msg=name)
        torch.testing.assert_close((view * other).to_dense(), want * want, msg=name)
