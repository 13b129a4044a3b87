"""The C++ form of kernels (scorch/tensor_compiler/cxx_module.py): what it lowers, what it
refuses, and that a kernel built from it computes what its Cython build computes."""
import logging
import textwrap
import uuid
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

from compiler_helpers import dense, rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import build, cxx_module, threads as _threads
from scorch.tensor_compiler.cxx_module import Unsupported, _Expr


def expr(text, ptrs=(), int_values=False, want_bool=False, vectors=(), nogil=False):
    return _Expr(text, frozenset(ptrs), int_values, vectors=frozenset(vectors),
                 nogil=nogil).parse(want_bool)


def test_expressions_keep_cython_meaning():
    assert expr("<int64_t>a.t0_pos1[a.N_i] - 8") == "(((int64_t)a.t0_pos1[a.N_i]) - 8)"
    assert expr("(<scorch_vf*>(a.t1_vals + o1_1 + 0))[0]") == \
        "(((scorch_vf*)(((a.t1_vals + o1_1) + 0))))[0]"
    assert expr("x if f0 else 0") == "((f0) ? (x) : (0))"
    assert expr("panel in (4, 8)", want_bool=True) == "((panel == 4) || (panel == 8))"
    assert expr("(a > b and c) or d", want_bool=True) == "((((a > b) && c)) || d)"
    assert expr("(hi0 - lo0) * t // nchunks") == "((((hi0 - lo0)) * t) / nchunks)"
    assert expr("min(a, b, c)") == "scorch_min(scorch_min(a, b), c)"
    assert expr("deref(it) + inc(it)") == "((*(it)) + (++(it)))"
    assert expr("sizeof(double) * n") == "(sizeof(double) * n)"
    assert expr("sizeof(a.t0_crd1[0])") == "sizeof(a.t0_crd1[0])"
    assert expr("p.x + q.x", ptrs={"p"}) == "(p->x + q.x)"
    assert expr("True") == "1"
    assert expr("pk0_store.data() + pk0_store.size()", vectors={"pk0_store"}) == \
        "(pk0_store.data() + pk0_store.size())"          # a local vector's own methods
    # comparisons and logic joined by and/or are 0 or 1, as Cython's bint: fine as values
    assert expr("(a < b) and (c < d)") == "(((a < b)) && ((c < d)))"
    # in a nogil function no Python object can be: any method call is C++'s
    assert expr("crds[t].release(&nbytes)", nogil=True) == "crds[t].release((&nbytes))"
    assert expr("deref(oval).grow(wn)", nogil=True) == "(*(oval)).grow(wn)"
    # template functions, and bytes literals as C strings
    assert expr("dense_scratch[float](n + 1)") == "dense_scratch<float>((n + 1))"
    assert expr("f[int32_t, double](x)") == "f<int32_t, double>(x)"
    assert expr("pfns[pi](x)") == "pfns[pi](x)"                    # an element, not a type
    assert expr('e(r, b"k (%lld) too big", n)') == 'e(r, "k (%lld) too big", n)'


@pytest.mark.parametrize("text, kw", [
    ("a and b", {}),                      # Cython returns an operand here, not 0 / 1
    ("a < b < c", {}),                    # chained comparison
    ("x / y", {"int_values": True}),      # true division on integers
    ("a ** 2", {}),
    ("s.method()", {}),
    ("v.data()", {}),                     # not a local vector
    ("v.erase(0)", {"vectors": {"v"}}),   # not a method kernels use
    ("len(x)", {}),
    ("'text'", {}),                       # a Python string (bytes are C strings)
    ("b'a\\n'", {}),                       # escapes are left to Cython
    ("<object>x", {}),
    ("x is None", {}),
])
def test_expressions_outside_the_subset_are_refused(text, kw):
    with pytest.raises(Unsupported):
        expr(text, **kw)


PROBE = textwrap.dedent('''
    # cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
    # distutils: language = c++
    # scorch probe {tag} (a scorch comment line: part of the cache key, so a fresh build)
    from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t
    from libcpp.vector cimport vector
    from cython.parallel cimport prange
    cdef extern from *:
        """
        static inline int64_t twice(int64_t x) { return 2 * x; }
        """
        int64_t twice(int64_t) noexcept nogil

    cdef struct Args:
        int64_t n
        double* out   # results

    cdef int64_t last(Args* pa, int64_t lo, int64_t hi) noexcept nogil:
        cdef int64_t i = -1
        for i in range(lo, hi):
            pass
        return i

    cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:
        cdef Args a
        cdef int64_t i, j, t, k = 0
        a.n = args[0]
        a.out = <double*><size_t>args[1]
        a.out[0] = last(&a, 0, a.n)            # a range loop leaves its variable at the last value
        a.out[1] = last(&a, 5, 5)              # and untouched when it does not run
        for i in range(a.n):
            i = i + 100                        # the bound and the next value do not see this
            k += 1
        a.out[2] = k
        j = 0
        while True:
            j += 3
            if j > 10:
                break
            elif j == 6:
                continue
            else:
                k += j
        a.out[3] = k
        a.out[4] = 1.5 if a.n > 2 and panel in (1, 7) else -1.0
        a.out[5] = min(a.n, 3, twice(panel))
        a.out[6] = (a.n * 7) // 2
        with nogil:
            a.out[7] = <int32_t>(a.n - 9)
        if a.n > 2:
            for t in prange(a.n, nogil=True, schedule='dynamic', num_threads=nthreads):
                a.out[8 + t] = twice(t)
        return

    def kernel(list args, int nthreads, int panel=0):
        cdef int64_t values[2]
        cdef int i
        for i in range(2):
            values[i] = args[i]
        with nogil:
            kernel_c(values, nthreads, panel)
        return None

    cdef extern from "Python.h":
        object PyCapsule_New(void*, const char*, void*)

    KERNEL_C = PyCapsule_New(<void*>kernel_c, b"scorch.kernel_c", NULL)
''').lstrip()


def _run(mod, n, panel):
    out = torch.zeros(8 + max(n, 0), dtype=torch.float64)
    mod.kernel([n, out.data_ptr()], 2, panel)
    return out


def test_cxx_build_computes_what_the_cython_build_computes(monkeypatch):
    src = PROBE.replace("{tag}", uuid.uuid4().hex)     # never seen: compiled here
    cxx_module.to_cpp(src)                           # in the subset
    before = build.cache_info()["cxx_builds"]
    as_cxx = build.load_kernel(src, "probe_cxx")
    assert build.cache_info()["cxx_builds"] == before + 1
    monkeypatch.setenv(build.CXX_ENV, "0")
    as_cython = build.load_kernel(src, "probe_cython")
    assert build.cache_info()["cxx_builds"] == before + 1
    for n, panel in [(0, 0), (1, 7), (3, 1), (4, 7), (6, 2)]:
        want = _run(as_cython, n, panel)
        torch.testing.assert_close(_run(as_cxx, n, panel), want, rtol=0, atol=0)
    assert _run(as_cxx, 4, 7)[:8].tolist() == [3, -1, 4, 16, 1.5, 3, 14, -5]
    assert hasattr(as_cxx, "KERNEL_C")
    with pytest.raises(TypeError):
        as_cxx.kernel((1, 2), 1)                     # a list, as the Cython signature says
    with pytest.raises(IndexError):
        as_cxx.kernel([1], 1)


def test_sources_outside_the_subset_go_through_cython():
    with pytest.raises(Unsupported, match="no C entry"):
        cxx_module.to_cpp(PROBE.replace("{tag}", "x").replace("KERNEL_C = ", "OTHER = "))
    with pytest.raises(Unsupported):
        cxx_module.to_cpp(PROBE.replace("{tag}", "x").replace("k += 1", "raise ValueError()"))
    with pytest.raises(Unsupported):
        cxx_module.to_cpp(PROBE.replace("{tag}", "x").replace("from cython.parallel",
                                                        "import numpy as np\nfrom cython.parallel"))


def test_a_cxx_form_gcc_rejects_is_built_with_cython(monkeypatch, caplog):
    src = PROBE.replace("{tag}", uuid.uuid4().hex)
    monkeypatch.setattr(cxx_module, "to_cpp", lambda s: "this is not C++\n")
    before = build.cache_info()["cxx_fallbacks"]
    with caplog.at_level(logging.WARNING, logger="scorch"):
        mod = build.load_kernel(src, "probe_fallback")
    assert build.cache_info()["cxx_fallbacks"] == before + 1
    assert "did not compile" in caplog.text and "Cython instead" in caplog.text
    assert _run(mod, 4, 7)[:8].tolist() == [3, -1, 4, 16, 1.5, 3, 14, -5]


FORMATS = ["csr", "csc", "coo", "dcsr"]


@settings(max_examples=8, deadline=None)
@given(fmt=st.sampled_from(FORMATS), dtype=st.sampled_from([torch.float32, torch.float64]),
       form=st.sampled_from(["ij,jk->ik", "ij,j->i", "ij,ik,kj->ij", "ij->j", "ij,ij->i"]),
       density=st.sampled_from([0.0, 0.3, 1.0]))
def test_dense_output_kernels_build_as_cxx_and_match_torch(fmt, dtype, form, density):
    """Kernels with a C entry compile from their C++ form (never falling back) and agree
    with dense torch."""
    A = rand((7, 6), density, dtype=dtype)
    ops = {"ij,jk->ik": (torch.randn(6, 5, dtype=dtype),), "ij,j->i": (torch.randn(6, dtype=dtype),),
           "ij,ik,kj->ij": (torch.randn(7, 3, dtype=dtype), torch.randn(3, 6, dtype=dtype)),
           "ij->j": (), "ij,ij->i": (torch.randn(7, 6, dtype=dtype),)}[form]
    before = build.cache_info()["cxx_fallbacks"]
    got = C.einsum(form, sparse(A, fmt), *ops)
    assert build.cache_info()["cxx_fallbacks"] == before
    torch.testing.assert_close(dense(got), torch.einsum(form, A, *ops), rtol=1e-5, atol=1e-5)


SPARSE_FORMS = {   # sparse-output kernels: workspace (SpGEMM), rows, bound room, tuples
    "spgemm": ("ij,jk->ik", lambda a, b: (a, b.t().contiguous())),
    "intersection": ("ij,ij->ij", lambda a, b: (a, b)),
    "scaled": ("ij,j->ij", lambda a, b: (a, b[0])),
    "transpose": ("ij->ji", lambda a, b: (a,)),
}


@settings(max_examples=12, deadline=None)
@given(fmt=st.sampled_from(FORMATS), dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
       form=st.sampled_from(sorted(SPARSE_FORMS)), density=st.sampled_from([0.0, 0.3, 1.0]),
       threads=st.sampled_from([1, 2]))
def test_sparse_output_kernels_build_as_cxx_and_match_torch(fmt, dtype, form, density, threads):
    """Kernels that hand their output over (``kernel_result_c``) compile from their C++ form
    (never falling back) and agree with dense torch at 1 and 2 threads."""
    eq, operands = SPARSE_FORMS[form]
    a = rand((96, 20), density, dtype=torch.float64).to(dtype)   # 96 rows: 2 threads split them
    b = rand((96, 20), 0.3, dtype=torch.float64).to(dtype)
    ops = [sparse(x, fmt) if x.dim() == 2 else x for x in operands(a, b)]
    before = build.cache_info()["cxx_fallbacks"]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:     # every thread torch has, however small the problem (the gather runs in chunks)
        with mock.patch.object(_threads, "PARALLEL_MIN_WORK", 0), \
                mock.patch.object(_threads, "_load_known", True), \
                mock.patch.object(_threads, "_free_cores", lambda T: T):
            got = C.einsum(eq, *ops)
    finally:
        torch.set_num_threads(old)
    assert build.cache_info()["cxx_fallbacks"] == before
    want = torch.einsum(eq, *[x.double() for x in operands(a, b)])
    torch.testing.assert_close(dense(got).double(), want, rtol=1e-5, atol=1e-5)


def test_a_sparse_output_kernel_reports_errors_from_cxx():
    """Errors a kernel finds without the GIL reach Python as the exception they name."""
    a, b = sparse(rand((6, 5), 0.5), "csr"), sparse(rand((5, 4), 0.5), "csr")
    src = C.explain("ij,jk->ik", a, b).source
    assert "kernel_result_c" in cxx_module.to_cpp(src)
    before = build.cache_info()["cxx_builds"]
    mod = build.load_kernel(src + f"\n# scorch probe {uuid.uuid4().hex}\n", "probe_result")
    assert build.cache_info()["cxx_builds"] == before + 1
    zeros = torch.zeros(8, dtype=torch.int32)
    vals = torch.zeros(8)
    p = zeros.data_ptr()
    ptrs = [p, p, vals.data_ptr(), p, p, vals.data_ptr()]
    with pytest.raises(OverflowError, match=r"output dimension k \(2147483653\) does not fit"):
        mod.kernel([0, 0, 2 ** 31 + 5] + ptrs, 1)
    pos, crd, v = mod.kernel([3, 0, 4] + ptrs, 1)           # no entries: 3 empty rows
    assert pos.tolist() == [0, 0, 0, 0] and pos.dtype.name == "int32"
    assert crd.size == 0 and v.size == 0
