"""SDDMM ``einsum("ij,ik,kj->ij", S, B, C)`` with the dense factor C in either layout: K x n
row-major (read along k with stride n: re-laid out once per call, counted in the call) or
the transpose of an n x K array (stride 1 along k: read in place). Oracle: dense torch over
formats, dtypes and shapes with 0- and 1-sized dimensions; ``explain`` says which it does."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scorch

FORMATS = ["csr", "csc", "coo", "dcsr", "dcsc"]


@settings(max_examples=30, deadline=None)
@given(m=st.sampled_from([0, 1, 5, 40]), n=st.sampled_from([0, 1, 7, 300]),
       K=st.sampled_from([1, 3, 16, 33, 128]), density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]), fmt=st.sampled_from(FORMATS),
       layout=st.sampled_from(["kn", "nk", "kn_strided"]), seed=st.integers(0, 2**16))
def test_sddmm_both_layouts_equal_dense(m, n, K, density, dtype, fmt, layout, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.where(torch.rand(m, n, generator=g) < density,
                    torch.randn(m, n, generator=g), torch.zeros(())).to(dtype)
    B = torch.randn(m, K, generator=g, dtype=dtype)
    if layout == "kn":
        C = torch.randn(K, n, generator=g, dtype=dtype)
    elif layout == "nk":
        C = torch.randn(n, K, generator=g, dtype=dtype).t()
    else:                                   # a strided view: every other column of a wider array
        C = torch.randn(K, 2 * n, generator=g, dtype=dtype)[:, ::2]
    S = scorch.sparse_tensor(s, format=fmt)
    out = scorch.einsum("ij,ik,kj->ij", S, B, C)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out.to_dense(), s * (B @ C), rtol=tol, atol=tol * max(K, 1))


def test_explain_names_the_layout_decision():
    g = torch.Generator().manual_seed(0)
    S = scorch.sparse_tensor(torch.where(torch.rand(600, 400, generator=g) < 0.05,
                                         torch.rand(600, 400, generator=g), torch.zeros(())),
                             format="csr")
    B = torch.rand(600, 128, generator=g)
    C_kn = torch.rand(128, 400, generator=g)
    C_nk = torch.rand(400, 128, generator=g).t()
    kn = str(scorch.explain("ij,ik,kj->ij", S, B, C_kn))
    nk = str(scorch.explain("ij,ik,kj->ij", S, B, C_nk))
    assert "relayout:     operand 2 (stride 400 along k, the innermost loop): copied to stride 1" in kn
    assert f"{128 * 400} entries" in kn
    assert "relayout:     operand 2 (k has stride 1): read in place" in nk
    # one plan for both layouts (the layout is a run-time property of the dense operand)
    assert kn.splitlines()[1] == nk.splitlines()[1] == "loop order:   i, j, k"
