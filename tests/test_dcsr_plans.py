"""SpGEMM over doubly-compressed operands (DCSR / DCSC): the planner must not pick the
order whose kernel merges each row of one operand with the whole stored-row list of the
other, restarted per row (O(rows x n): ``work_estimate.RESTARTED_MERGE_VISITS``), at any
thread count; results equal dense torch."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch as real_torch

import scorch

EQS = {"A @ A": "ij,jk->ik", "A.t() @ A": "ji,jk->ik", "A @ A.t()": "ij,kj->ik"}


def _mesh(n, seed, per_row=4):
    r = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    m = sp.csr_matrix((r.standard_normal(per_row * n).astype(np.float32),
                       (rows, r.integers(0, n, per_row * n))), shape=(n, n))
    m.sum_duplicates()
    m.sort_indices()
    return m


def _restarted_merge(order, eq):
    """Whether ``order`` reads the second operand's top level (a compressed DCSR / DCSC
    level) below another loop while co-iterating it: the plan of bug 4."""
    lhs = eq.split("->")[0].split(",")
    contracted = (set(lhs[0]) & set(lhs[1])).pop()
    return order[0] != contracted


@pytest.mark.parametrize("fmt", ["dcsr", "dcsc"])
@pytest.mark.parametrize("name", list(EQS))
@pytest.mark.parametrize("threads", [1, 2])
def test_plan_is_not_restarted_merge(fmt, name, threads):
    m = _mesh(1 << 13, seed=threads)
    A = scorch.sparse_tensor(m, format=fmt)
    old = scorch.get_num_threads()
    scorch.set_num_threads(threads)
    try:
        k = scorch.explain(EQS[name], A, A)
    finally:
        scorch.set_num_threads(old)
    assert not _restarted_merge(k.loop_order, EQS[name]), (fmt, name, k.loop_order)
    est = k.schedule.estimates
    merge = [e for e in est if _restarted_merge(list(e.order), EQS[name])]
    for e in merge:   # the merge plan is priced above the chosen one
        assert e.estimate.total > est[0].estimate.total


@pytest.mark.parametrize("fmt", ["dcsr", "dcsc"])
def test_values_equal_dense(fmt):
    m = _mesh(300, seed=7)
    A = scorch.sparse_tensor(m, format=fmt)
    D = real_torch.tensor(m.toarray())
    for got, want in ((A @ A, D @ D), (A.t() @ A, D.t() @ D), (A @ A.t(), D @ D.t())):
        np.testing.assert_allclose(got.to_dense().numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
