"""The merge forms the lowering picks for a sum of products (``A * B + C``: each product one
stream of matches, merged with the other streams; ``merge_lattice.conjunct_groups``,
``lower/loops._stream_merge``): equal to dense torch over shapes (0 and 1 sized included),
densities (empty, sparse, full), float32/float64, formats and mode orders, int32 and int64
coordinates, and the formulas that are not such sums (which keep the lattice points)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from compiler_helpers import check_storage, dense, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import api, merge_lattice as ml
from scorch.tensor_compiler.codegen import print_kernel
from scorch.tensor_compiler.lower import lower_kernel
from scorch.tensor_compiler.index_notation import Access, Assignment

A, B, Cc, D = (Access(k, ("i", "j")) for k in range(4))
V = lambda i: ("var", i)   # noqa: E731


def test_conjunct_groups_finds_sums_of_products():
    ab_c = ("or", ("and", V(0), V(1)), V(2))
    assert ml.conjunct_groups(ab_c, [0, 1, 2], lambda i: True) == [(2,), (0, 1)]
    ab_cd = ("or", ("and", V(0), V(1)), ("and", V(2), V(3)))
    assert ml.conjunct_groups(ab_cd, [0, 1, 2, 3], lambda i: True) == [(0, 1), (2, 3)]
    abc_d = ("or", ("and", ("and", V(0), V(1)), V(2)), V(3))
    assert ml.conjunct_groups(abc_d, [0, 1, 2, 3], lambda i: True) == [(3,), (0, 1, 2)]
    # not a sum of disjoint products, a plain union or intersection: the lattice points
    assert ml.conjunct_groups(("and", V(0), ("or", V(1), V(2))), [0, 1, 2], lambda i: True) is None
    assert ml.conjunct_groups(("or", V(0), V(1)), [0, 1], lambda i: True) is None
    assert ml.conjunct_groups(("and", V(0), V(1)), [0, 1], lambda i: True) is None
    # an access that is not an iterator here counts as it stands (present / absent)
    assert ml.conjunct_groups(ab_c, [0, 1], lambda i: False) is None


# (expression over A, B, C, D, its dense twin, formats of A..D, dtype, index dtype):
# a small fixed set, each one kernel compiled once
CASES = [
    (A * B + Cc, lambda a, b, c, d: a * b + c, ("csr",) * 4, torch.float32, None),
    (A * B - Cc, lambda a, b, c, d: a * b - c, ("csc",) * 4, torch.float64, None),
    (Cc + A * B, lambda a, b, c, d: c + a * b, ("dcsr",) * 4, torch.float64, None),
    (A * B + Cc * D, lambda a, b, c, d: a * b + c * d, ("csr",) * 4, torch.float64, None),
    (A * B * D + Cc, lambda a, b, c, d: a * b * d + c, ("csr",) * 4, torch.float32, None),
    (-(A * B) + Cc, lambda a, b, c, d: -(a * b) + c, ("coo",) * 4, torch.float64, None),
    (A * B + Cc, lambda a, b, c, d: a * b + c, ("csr",) * 4, torch.float64, torch.int64),
    (A * (B + Cc), lambda a, b, c, d: a * (b + c), ("csr",) * 4, torch.float64, None),
    (A + B + Cc, lambda a, b, c, d: a + b + c, ("csr",) * 4, torch.float32, None),
]


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(range(len(CASES))), st.booleans())
def test_sum_of_products_equals_dense_torch(data, case, shared_pattern):
    expr, twin, fmts, dtype, index_dtype = CASES[case]
    m, n = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 9))
    xs = []
    for _ in range(4):
        density = data.draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        values = torch.rand(m, n, generator=g, dtype=dtype) * 2 - 1
        xs.append(values * (torch.rand(m, n, generator=g) < density))
    if shared_pattern:   # B on A's pattern: every entry of A a match
        xs[1] = (xs[0] * 3 - 1) * (xs[0] != 0)
    ops = [sparse(x, f, index_dtype=index_dtype) for x, f in zip(xs, fmts)]
    got = C.compute(Assignment("ij", expr), *ops)
    check_storage(got)    # sorted, unique coordinates per segment
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(dense(got), twin(*xs), rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["csf", "coo"])
def test_rank3_sum_of_products(fmt):
    """The streams at every level of a rank-3 nest (a product inside a sum at each loop)."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.rand(4, 5, 6, generator=g, dtype=torch.float64)
          * (torch.rand(4, 5, 6, generator=g) < d) for d in (0.5, 0.6, 0.3)]
    a, b, c = (Access(k, ("i", "j", "k")) for k in range(3))
    got = C.compute(Assignment("ijk", a * b + c), *(sparse(x, fmt) for x in xs))
    torch.testing.assert_close(dense(got), xs[0] * xs[1] + xs[2])


def test_stream_merge_in_the_generated_kernel():
    """``A * B + C`` lowers to one seek loop per product and three merge points (the
    product with C, the product alone, C alone), not the five lattice points."""
    asg = Assignment("ij", A * B + Cc)
    ops = [sparse(torch.eye(5, dtype=torch.float64), "csr") for _ in range(3)]
    C.compute(asg, *ops)
    entry = next(v[3] for v in api._EXPR_FAST.values() if v[0] is asg)
    index_dtypes = {k: torch.int32 for k in range(3)}
    src = print_kernel(lower_kernel(entry.schedule, entry.value_dtype, index_dtypes))
    body = src[src.index("cdef int64_t run_chunk"):src.index("cdef int64_t run_bound")]
    assert body.count("!= a.t1_crd1[q1_1]") == 3      # the seek: first, after C's merge, alone
    assert "q0_1 < h0_1 and q1_1 < h1_1 and q2_1 < h2_1" not in body   # no 3-way point
    # the bound pass: C's row and the product's shorter segment, not all three rows
    bound = src[src.index("cdef int64_t run_bound"):src.index("def kernel")]
    assert "(h2_1 - q2_1) + min(h0_1 - q0_1, h1_1 - q1_1)" in bound
