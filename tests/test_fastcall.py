"""The C warm-call path (scorch/_runtime/fastcall.cpp): the same results as the Python
runner and dense torch, and a decline (to the Python path) for everything it does not cover
exactly."""
from pathlib import Path
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
import scorch.tensor_compiler as C
from scorch.tensor_compiler import fastcall, operands
from scorch.tensor_compiler.operands import as_operand
from scorch.tensor_compiler.planner import broadcast_key, unit_mask
from scorch.tensor_compiler.plans import storage_signature

FC = fastcall.load()
pytestmark = pytest.mark.skipif(FC is None, reason="the C warm-call module did not build here")


def _matrix(m, n, density, dtype, seed, fmt="csr"):
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(m, n, generator=g) * (torch.rand(m, n, generator=g) < density)).to(dtype)
    return d, scorch.sparse_tensor(d, format=fmt)


def _entry(eq, *ops):
    key = [eq, None]
    for x in ops:
        if isinstance(x, scorch.SparseTensor):
            key.append(storage_signature(x._storage))
        else:
            key += [x.dtype, x.dim() | unit_mask(x) << 8]   # rank, extents of 1 (as the key)
    storages = [x._storage if isinstance(x, scorch.SparseTensor) else x for x in ops]
    if any(isinstance(x, scorch.SparseTensor) and 1 in x.shape for x in ops):
        key.append(broadcast_key(eq, storages))   # as einsum_declined keys size-1 dimensions
    return C._fast[tuple(key)]


def _python_runner(entry):
    return getattr(entry.runner, "fallback", entry.runner)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(0, 30), k=st.sampled_from([1, 3, 16, 17, 40, 300]),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), dtype=st.sampled_from([torch.float32, torch.float64]),
       fmt=st.sampled_from(["csr", "csc", "coo"]), seed=st.integers(0, 2**16))
def test_matches_dense_torch_and_python_runner(m, n, k, density, dtype, fmt, seed):
    # fresh plans: under xdist an entry left by another test file in this worker was seen to
    # make the C path decline for m = 0 (results still right; open question in the issue note)
    C.plan_cache_clear()
    d, A = _matrix(m, n, density, dtype, seed, fmt)
    g = torch.Generator().manual_seed(seed + 1)
    x, X = torch.rand(n, generator=g, dtype=dtype), torch.rand(n, k, generator=g, dtype=dtype)
    for eq, B, ref in (("ij,j->i", x, d @ x), ("ij,jk->ik", X, d @ X)):
        scorch.einsum(eq, A, B)                      # first call: plan, kernel, runner
        warm = scorch.einsum(eq, A, B)              # second: the C path (dense outputs)
        if isinstance(warm, scorch.SparseTensor):   # CSC/COO: output format inferred sparse
            warm = warm.to_dense()
        torch.testing.assert_close(warm, ref)
        entry = _entry(eq, A, B)
        if isinstance(entry.runner, FC.Plan):
            fast = entry.runner.try_fast([A._storage, B])
            assert fast is not None
            torch.testing.assert_close(fast, _python_runner(entry)([A._storage, B]))


def test_warm_calls_are_served_in_c():
    d, A = _matrix(30, 20, 0.2, torch.float32, 1)
    x = torch.rand(20)
    scorch.einsum("ij,j->i", A, x)
    assert isinstance(_entry("ij,j->i", A, x).runner, FC.Plan)
    hits = C.plan_cache_info()["plan_hits"]
    for _ in range(3):
        torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), d @ x)
    assert C.plan_cache_info()["plan_hits"] == hits + 3
    before = FC.hits()
    torch.testing.assert_close(torch.einsum("ij,j->i", A, x), d @ x)   # through torch's dispatch
    torch.testing.assert_close(scorch.einsum("ij,j->i", A._storage, x), d @ x)   # a bare Storage
    assert FC.hits() >= before + 1


def test_declines_go_to_the_python_path():
    d, A = _matrix(12, 9, 0.4, torch.float64, 2)
    X = torch.rand(9, 5, dtype=torch.float64)
    scorch.einsum("ij,jk->ik", A, X)
    plan = _entry("ij,jk->ik", A, X).runner
    assert isinstance(plan, FC.Plan)
    Xt = X.t().contiguous().t()                  # k not unit-stride: re-laid out in Python
    assert plan.try_fast([A._storage, Xt]) is None
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, Xt), d @ X)
    Xb = X[:1].expand(9, 5)                       # stride 0 along j: still exact
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, Xb), d @ Xb)
    assert plan.try_fast([A._storage, X.float()]) is None          # another dtype
    assert plan.try_fast([A._storage, X[:4]]) is None              # sizes disagree
    assert plan.try_fast([A._storage]) is None                      # operand count
    with pytest.raises(ValueError, match="subscript j"):
        scorch.einsum("ij,jk->ik", A, torch.rand(4, 5, dtype=torch.float64))
    Xg = X.clone().requires_grad_()
    assert FC.dispatch(C._fast, "ij,jk->ik", (A, Xg)) is NotImplemented
    assert FC.dispatch(C._fast, "ij,jk->ik", (A, torch.nn.Parameter(X))) is NotImplemented
    assert FC.dispatch(C._fast, "ij,jk->ki", (A, X)) is NotImplemented   # no plan yet


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_pattern_outputs_are_served_in_c(fmt):
    """SDDMM's result on S's pattern: the C plan allocates the values, runs the kernel and
    has ``pattern_storage`` wrap them (the pattern's arrays shared, its signature kept); an
    empty reduction (K = 0 stores nothing) declines to the Python path."""
    d, S = _matrix(30, 20, 0.3, torch.float64, 6, fmt)
    B, Ct = torch.rand(30, 8, dtype=torch.float64), torch.rand(20, 8, dtype=torch.float64)
    want = d * (B @ Ct.t())
    scorch.einsum("ij,ik,kj->ij", S, B, Ct.t())
    plan = _entry("ij,ik,kj->ij", S, B, Ct.t()).runner
    assert isinstance(plan, FC.Plan)
    before = FC.hits()
    got = scorch.einsum("ij,ik,kj->ij", S, B, Ct.t())
    assert FC.hits() == before + 1
    assert isinstance(got, scorch.SparseTensor) and got._storage.shares_pattern(S._storage)
    torch.testing.assert_close(got.to_dense(), want)
    st = plan.try_fast([S._storage, B, Ct.t()])
    assert st._sig == S._storage._sig and st.levels is S._storage.levels
    torch.testing.assert_close(C.einsum("ij,ik,kj->ij", S._storage, B, Ct.t()).values, st.values)
    empty = torch.zeros(30, 0, dtype=torch.float64), torch.zeros(0, 20, dtype=torch.float64)
    assert plan.try_fast([S._storage, *empty]) is None
    torch.testing.assert_close(scorch.einsum("ij,ik,kj->ij", S, *empty).to_dense(), torch.zeros(30, 20, dtype=torch.float64))


def test_short_rows_variant_found_after_the_first_call():
    """The short-rows module is built by the general path on first need; the C plan picks
    it up from then on."""
    d, A = _matrix(200, 200, 0.01, torch.float32, 3)   # ~2 entries a row: short rows
    x = torch.rand(200)
    for _ in range(3):
        torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), d @ x)
    entry = _entry("ij,j->i", A, x)
    assert entry.short and isinstance(entry.runner, FC.Plan)
    assert entry.runner.try_fast([A._storage, x]) is not None


def test_panels_chosen_in_c():
    d, A = _matrix(64, 64, 0.3, torch.float32, 4)
    X = torch.rand(64, 256)
    for _ in range(2):
        torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, X), d @ X)
    assert _entry("ij,jk->ik", A, X).panels


def test_bad_spec_is_rejected():
    d, A = _matrix(8, 8, 0.5, torch.float32, 5)
    x = torch.rand(8)
    scorch.einsum("ij,j->i", A, x)
    entry = _entry("ij,j->i", A, x)
    kernel = next(iter(entry.kernels.values()))
    kernel = kernel[0] if isinstance(kernel, tuple) else kernel
    spec = {"operands": [(1, 0, None, 0)], "dims": [0, 0, 5], "unit": [], "args": [],
            "nvars": 1, "min_work": 1, "out_max": 10, "out_dtype": x, "out_vars": [0]}
    with pytest.raises(ValueError, match="dimension entry"):
        FC.Plan(kernel.KERNEL_C, None, print, print, print, (), print, spec)
    spec["dims"] = [0, 0, 0]
    spec["args"] = [(2, 0, 0)]   # a dense address of a sparse operand
    with pytest.raises(ValueError, match="argument entry"):
        FC.Plan(kernel.KERNEL_C, None, print, print, print, (), print, spec)


def test_switched_off_by_environment():
    code = ("import torch, scorch, scorch.tensor_compiler as C; A = scorch.sparse_tensor(torch.eye(4), "
            "format='csr'); x = torch.rand(4); scorch.einsum('ij,j->i', A, x); "
            "assert torch.equal(scorch.einsum('ij,j->i', A, x), x); "
            "e = next(iter(C._fast.values())); print(type(e.runner).__name__, C._DISPATCH[1])")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SCORCH_FASTCALL="0"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["function", "None"]


@pytest.mark.parametrize("dtype,short", [(torch.float32, True), (torch.float64, False)])
def test_short_rows_limit_by_dtype(dtype, short):
    """About 12 entries a row: float32 runs the scalar variant (rows shorter than one
    512-bit vector), float64 the vectorized loop (codegen.short_rows_limit)."""
    from scorch.tensor_compiler.codegen import short_rows_limit
    assert short_rows_limit(torch.float32) == 16 and short_rows_limit(torch.float64) == 6
    d, A = _matrix(300, 300, 0.04, dtype, 6)
    x = torch.rand(300, dtype=dtype)
    C.plan_cache_clear()
    for _ in range(2):
        torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), d @ x)
    assert bool(_entry("ij,j->i", A, x).short) == short


def test_cleared_plans_are_collected():
    """The C plan and its Python fallback refer to each other through the plan cache entry;
    the collector frees them once the cache lets go."""
    import gc
    import weakref
    d, A = _matrix(7, 5, 0.5, torch.float64, 8)
    x = torch.rand(5, dtype=torch.float64)
    scorch.einsum("ij,j->i", A, x)
    entry = _entry("ij,j->i", A, x)
    assert isinstance(entry.runner, FC.Plan)
    ref = weakref.ref(entry)
    del entry
    C.plan_cache_clear()
    gc.collect()
    assert ref() is None
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), d @ x)   # planned afresh


@pytest.mark.parametrize("layout", ["csr", "csc", "coo"])
def test_torch_sparse_operands_wrapped_once(layout):
    """A torch sparse operand's Storage (its arrays, not copied) is kept for the tensor: the
    next call reuses it, in-place changes of the values show through, an in-place op on the
    tensor (version bump) re-wraps it, and the tensor can still be freed (then the entry
    goes)."""
    import gc
    import weakref
    d, _ = _matrix(20, 15, 0.3, torch.float64, 9)
    T = {"csr": d.to_sparse_csr, "csc": d.to_sparse_csc, "coo": d.to_sparse}[layout]()
    x = torch.rand(15, dtype=torch.float64)

    def product():
        r = scorch.einsum("ij,j->i", T, x)
        return r.to_dense() if isinstance(r, scorch.SparseTensor) else r
    torch.testing.assert_close(product(), d @ x)
    st = as_operand(T)
    assert as_operand(T) is st and st.values.data_ptr() == T.values().data_ptr()
    T.values().mul_(3)
    torch.testing.assert_close(product(), 3 * d @ x)
    version = T._version
    T.mul_(2)   # in place on the tensor itself
    assert T._version != version and as_operand(T) is not st
    torch.testing.assert_close(product(), 6 * d @ x)
    ref, kept = weakref.ref(T), len(operands._TORCH_SPARSE)
    del T, st
    gc.collect()
    assert ref() is None and len(operands._TORCH_SPARSE) == kept - 1


def test_warm_calls_hit_when_the_first_call_went_straight_to_the_compiler():
    """A first call through ``tensor_compiler.einsum`` loads the C module before
    ``scorch.einsum`` names the SparseTensor type; warm calls must still be served (they
    declined every SparseTensor operand for the rest of the process). Fresh process: the
    order of first calls is the point."""
    import subprocess
    import sys
    code = (
        "import torch, scorch\n"
        "import scorch.tensor_compiler as C\n"
        "A = scorch.sparse_tensor(torch.tensor([[1.0, 0, 2], [0, 0, 3]]), format='csr')\n"
        "v = torch.tensor([1.0, 2.0, 3.0])\n"
        "C.einsum('ij,j->i', A, v)\n"
        "scorch.einsum('ij,j->i', A, v)\n"
        "fc = C.api._DISPATCH[1]\n"
        "h = fc.hits() if fc is not None else None\n"
        "for _ in range(3):\n"
        "    scorch.einsum('ij,j->i', A, v)\n"
        "print('NOFASTCALL' if fc is None else fc.hits() - h)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=str(Path(__file__).resolve().parent.parent))
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last in ("3", "NOFASTCALL"), out.stdout + out.stderr
