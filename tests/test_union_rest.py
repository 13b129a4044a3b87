"""The union merge of two patterns (``A + C``, ``A - C``: lattice points over both rows, then
the rest of whichever row is left, ``lower/loops._merge``) equal to dense torch over the
row shapes that steer it: empty rows, one long row among short ones (arrow_spqr_46500), rows
where one side runs out early (a long rest), equal patterns (no rest) and disjoint ones, in
float32/float64, int32/int64 coordinates and csr/csc/coo/dcsr; and through the operators
``A + C`` / ``A - C`` on scorch tensors (the path the scipy benchmark times)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from compiler_helpers import check_storage, dense, sparse
import scorch
import scorch.tensor_compiler as C
from scorch.tensor_compiler.index_notation import Access, Assignment

A, B = Access(0, ("i", "j")), Access(1, ("i", "j"))
EXPRESSIONS = {"+": (A + B, lambda a, b: a + b), "-": (A - B, lambda a, b: a - b)}
KINDS = ["random", "long_row", "runs_out", "equal", "disjoint"]


def _pair(kind: str, m: int, n: int, density: float, dtype, seed: int):
    """Two m x n dense matrices whose patterns relate as ``kind`` says."""
    g = torch.Generator().manual_seed(seed)
    va, vb = (torch.randn(m, n, generator=g).to(dtype) + 0.5 for _ in range(2))
    ma = torch.rand(m, n, generator=g) < density
    mb = torch.rand(m, n, generator=g) < density
    if kind == "long_row" and m:
        r = int(torch.randint(m, (1,), generator=g))
        ma[r] = True                  # one full row of A against a sparse row of B
        mb[(r + 1) % m] = True        # and one of B elsewhere
    elif kind == "runs_out":
        # A's entries in the first columns, B's over all of them: A's row ends early and
        # B's rest is long (and the reverse on odd rows)
        cut = max(1, n // 4)
        ma[:, cut:] = False
        mb[1::2], ma[1::2] = ma[1::2].clone(), mb[1::2].clone()
    elif kind == "equal":
        mb = ma.clone()
    elif kind == "disjoint":
        mb = ~ma & (torch.rand(m, n, generator=g) < max(density, 0.5))
    if m > 2:
        ma[m // 2] = False            # an empty row in A ...
        mb[m // 3] = False            # ... and in B
    return va * ma, vb * mb


#: (format, value dtype, index dtype): each value of each in two kernels per op, not all 16
TYPES = [("csr", torch.float32, torch.int32), ("csr", torch.float64, torch.int64),
         ("csc", torch.float64, torch.int32), ("csc", torch.float32, torch.int64),
         ("coo", torch.float32, torch.int32), ("coo", torch.float64, torch.int64),
         ("dcsr", torch.float64, torch.int32), ("dcsr", torch.float32, torch.int64)]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), m=st.integers(0, 12), n=st.sampled_from([0, 1, 5, 17, 40, 70]),
       density=st.sampled_from([0.0, 0.1, 0.4, 1.0]), op=st.sampled_from(sorted(EXPRESSIONS)),
       types=st.sampled_from(TYPES), seed=st.integers(0, 2**16))
def test_union_equals_dense_torch(kind, m, n, density, op, types, seed):
    fmt, dtype, index_dtype = types
    a, b = _pair(kind, m, n, density, dtype, seed)
    expr, ref = EXPRESSIONS[op]
    r = C.compute(Assignment("ij", expr), sparse(a, fmt, index_dtype), sparse(b, fmt, index_dtype))
    check_storage(r)
    assert torch.equal(dense(r), ref(a, b))
    # every coordinate stored in either operand is in the union (a sum that cancels stays stored)
    assert r.values.numel() == int(((a != 0) | (b != 0)).sum())


@pytest.mark.parametrize("op", sorted(EXPRESSIONS))
@pytest.mark.parametrize("kind", KINDS)
def test_union_operators_on_scorch_tensors(kind, op):
    a, b = _pair(kind, 30, 70, 0.1, torch.float32, seed=len(kind))
    sa, sb = scorch.sparse_tensor(a, format="csr"), scorch.sparse_tensor(b, format="csr")
    r = sa + sb if op == "+" else sa - sb
    assert torch.equal(r.to_dense(), EXPRESSIONS[op][1](a, b))
