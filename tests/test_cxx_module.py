"""The C++ form of kernels (scorch/tensor_compiler/cxx_module.py): what it lowers, what it
refuses, and that a kernel built from it computes what its Cython build computes."""
import logging
import textwrap
import uuid

import pytest
import torch
from hypothesis import given, settings, strategies as st

from compiler_helpers import dense, rand, sparse
import scorch.tensor_compiler as C
from scorch.tensor_compiler import build, cxx_module
from scorch.tensor_compiler.cxx_module import Unsupported, _Expr


def expr(text, ptrs=(), int_values=False, want_bool=False, vectors=()):
    return _Expr(text, frozenset(ptrs), int_values, vectors=frozenset(vectors)).parse(want_bool)


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


@pytest.mark.parametrize("text, kw", [
    ("a and b", {}),                      # Cython returns an operand here, not 0 / 1
    ("a < b < c", {}),                    # chained comparison
    ("x / y", {"int_values": True}),      # true division on integers
    ("a ** 2", {}),
    ("s.method()", {}),
    ("v.data()", {}),                     # not a local vector
    ("v.erase(0)", {"vectors": {"v"}}),   # not a method kernels use
    ("len(x)", {}),
    ("'text'", {}),
    ("<object>x", {}),
    ("x is None", {}),
])
def test_expressions_outside_the_subset_are_refused(text, kw):
    with pytest.raises(Unsupported):
        expr(text, **kw)


PROBE = textwrap.dedent('''
    # cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
    # distutils: language = c++
    # probe {tag}
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
    eq, a, b = "ij,jk->ik", sparse(rand((6, 5), 0.5), "csr"), sparse(rand((5, 4), 0.5), "csr")
    with pytest.raises(Unsupported, match="no C entry"):
        cxx_module.to_cpp(C.explain(eq, a, b).source)          # SpGEMM: a sparse output
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
