"""``scorch.explain`` shows the plan ``scorch.einsum`` runs: the same operand preparation
(a dense operand's broadcast size-1 dimensions dropped, the casts of bool and integer-sum
operands, torch.einsum for dense-only calls) and the same errors; ``out_format`` honoured or
refused clearly; and a C++ compiler that fails for the environment's reasons is not
reported as a bug of scorch's C++ lowering (``build._built_as_cxx``)."""
import logging
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import scorch
from scorch import Format
from scorch.tensor_compiler import api, build


def _run_capturing_kernels(monkeypatch, fn):
    """``fn()`` with a fresh plan table, and the sources of the kernels it loaded."""
    api.plan_cache_clear()          # in-process plans only: every kernel is loaded again
    loaded = []
    real = build.load_kernel

    def load(source, name_hint="kernel"):
        loaded.append(source)
        return real(source, name_hint)
    monkeypatch.setattr(build, "load_kernel", load)
    return fn(), loaded


def _csr(dense):
    return scorch.sparse_tensor(dense, format="csr")


def _matrix(m=6, n=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(m, n, generator=g) < 0.4) * torch.randn(m, n, generator=g)).to(dtype)


@pytest.mark.parametrize("shape, kept", [((6, 1), "T1(i)"), ((1, 7), "T1(j)")])
def test_explain_shows_the_kernel_that_runs_for_a_broadcast_dense_operand(monkeypatch, shape, kept):
    a, d = _matrix(), torch.randn(shape, dtype=torch.float64)
    plan = scorch.explain("ij,ij->ij", _csr(a), d)
    result, loaded = _run_capturing_kernels(monkeypatch, lambda: scorch.einsum("ij,ij->ij", _csr(a), d))
    assert plan.source in loaded
    assert f"= T0(i,j) * {kept}" in plan.source
    torch.testing.assert_close(result.to_dense(), a * d)


@pytest.mark.parametrize("equation", ["ij,jk->ik", "ij,ij->ij"])
def test_explain_shows_the_kernel_that_builds_a_dcsr_output(monkeypatch, equation):
    """A DCSR output's upper levels are built in the kernel (``result_chain_levels``): the
    source explain shows is that kernel's, not the one without the chain epilogue."""
    a, b = _matrix(7, 7, 1), _matrix(7, 7, 2)
    A, B = (scorch.sparse_tensor(x, format="dcsr") for x in (a, b))
    plan = scorch.explain(equation, A, B)
    result, loaded = _run_capturing_kernels(monkeypatch, lambda: scorch.einsum(equation, A, B))
    assert plan.source in loaded and "result_chain_levels(" in plan.source
    torch.testing.assert_close(result.to_dense(), torch.einsum(equation, a, b))


@pytest.mark.parametrize("equation, make, want", [
    ("ij,jk->ik", lambda a: (a > 0, (a > 0).T.contiguous()),
     lambda x, y: (x.int() @ y.int()) > 0),                               # bool, contracted
    ("ij,ij->ij", lambda a: (a > 0, a < 0.5), lambda x, y: x & y),        # bool, a product
    ("ij->i", lambda a: ((a * 50).to(torch.int8),), lambda x: x.sum(1)),  # int8 sum: int64
    ("ij->j", lambda a: ((a * 9000).to(torch.int16),), lambda x: x.sum(0)),
])
def test_explain_shows_the_kernel_of_the_cast_operands(monkeypatch, equation, make, want):
    dense = make(_matrix())
    ops = [_csr(x) for x in dense]
    plan = scorch.explain(equation, *ops)
    result, loaded = _run_capturing_kernels(monkeypatch, lambda: scorch.einsum(equation, *ops))
    assert plan.source in loaded
    expected = want(*dense)
    got = result.to_dense() if isinstance(result, scorch.SparseTensor) else result
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)
    if dense[0].dtype in (torch.int8, torch.int16):
        assert "int64_t* t0_vals" in plan.source


def test_explain_of_dense_operands_says_torch_einsum_runs(monkeypatch):
    d, e = torch.randn(4, 5), torch.randn(5, 3)
    plan = scorch.explain("ij,jk->ik", d, e)
    result, loaded = _run_capturing_kernels(monkeypatch, lambda: scorch.einsum("ij,jk->ik", d, e))
    assert loaded == [] and plan.loop_order == [] and plan.output_format.is_dense
    assert "torch.einsum" in plan.source
    torch.testing.assert_close(result, d @ e)
    # with an out_format scorch compiles it, and says so
    assert scorch.explain("ij,jk->ik", d, e, out_format="csr").loop_order


@pytest.mark.parametrize("bad, kind, words", [
    ([1, 2], TypeError, "operand 1 of type list"),
    (torch.randn(3, 4), ValueError, "operand 1"),
    (torch.randn(7, 2, device="meta"), ValueError, "operand 1 is on device meta"),
])
def test_explain_raises_what_einsum_raises(bad, kind, words):
    a = _csr(_matrix())
    with pytest.raises(kind, match=words) as from_einsum:
        scorch.einsum("ij,jk->ik", a, bad)
    with pytest.raises(kind, match=words) as from_explain:
        scorch.explain("ij,jk->ik", a, bad)
    assert str(from_explain.value) == str(from_einsum.value)


@pytest.mark.parametrize("equation, other", [("ij,jk->ik", (7, 4)), ("ij,ij->ij", (6, 7))])
def test_a_dense_out_format_keeps_its_mode_order(equation, other):
    a, b = _matrix(), torch.randn(other, dtype=torch.float64)
    fmt = Format("dd", mode_order=(1, 0))
    got = scorch.einsum(equation, _csr(a), b, out_format=fmt)
    assert got.t().is_contiguous() and not got.is_contiguous()       # column-major
    torch.testing.assert_close(got, torch.einsum(equation, a, b))
    assert scorch.explain(equation, _csr(a), b, out_format=fmt).output_format == fmt
    row_major = scorch.einsum(equation, _csr(a), b, out_format="dd")
    assert row_major.is_contiguous()
    torch.testing.assert_close(row_major, torch.einsum(equation, a, b))


@pytest.mark.parametrize("levels", ["ds", "cs"])
def test_a_result_that_does_not_fit_a_singleton_out_format_names_it(levels):
    a = _csr(torch.ones(3, 2))
    with pytest.raises(ValueError, match=rf"einsum\(\): the result does not fit out_format="
                                         rf"Format\('{levels}'\)"):
        scorch.einsum("ij,ij->ij", a, torch.ones(3, 2), out_format=levels)
    one = torch.tensor([[0.0, 2.0], [3.0, 0.0], [0.0, -1.0]])          # one entry per row
    got = scorch.einsum("ij,ij->ij", _csr(one), torch.full((3, 2), 2.0), out_format=levels)
    assert got.format == Format(levels)
    torch.testing.assert_close(got.to_dense(), one * 2)


# ---------------------------------------------------------------- a failing C++ compiler

def _failing_compiler(tmp_path):
    cc = tmp_path / "cc.sh"
    cc.write_text("#!/bin/sh\n"
                  f"case \"$*\" in *-shared*) echo kernel >> {tmp_path}/calls ;; esac\n"
                  "echo 'cc: fatal error: cannot write output: quota exceeded' >&2\nexit 1\n")
    cc.chmod(0o755)
    return str(cc)


def test_a_compiler_failing_for_the_environment_fails_once_unreported(tmp_path):
    """CC and CXX fail without reading the source: one kernel compile, its CompileError
    (naming the .pyx and the compiler's words), no 'Please report', no fallback counted."""
    cc = _failing_compiler(tmp_path)
    prog = textwrap.dedent('''
        import torch, scorch
        from scorch.tensor_compiler.build import CompileError
        T = scorch.sparse_tensor((torch.rand(5, 6, 7) < 0.3).double(), format="csf")
        try:
            scorch.einsum("ijk,kl->ijl", T, torch.randn(7, 3, dtype=torch.float64))
        except CompileError as e:
            print("CompileError:", e)
        print("cxx_fallbacks:", scorch.cache_info()["cxx_fallbacks"])
    ''') + f"# {uuid.uuid4().hex}\n"
    env = dict(os.environ, CC=cc, CXX=cc, SCORCH_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "CompileError:" in out.stdout, out.stdout + out.stderr[-2000:]
    assert ".pyx" in out.stdout and "quota exceeded" in out.stdout
    assert "cxx_fallbacks: 0" in out.stdout
    assert "Please report" not in out.stderr
    assert (tmp_path / "calls").read_text().split() == ["kernel"]


def _cxx_route(monkeypatch, tmp_path, message):
    """``build`` set up so that the C++ form's compile raises CompileError(``message``)
    and a Cython build does whatever ``_cc_with_pch`` does (patched by the caller)."""
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build._cxx, "to_cpp", lambda source: "int x;\n")
    monkeypatch.setattr(build, "_pch", lambda cdir, cpp: None)
    monkeypatch.setattr(build, "_cythonize", lambda *a, **k: None)
    calls = []

    def cc(source, c_file, *args, **kw):
        calls.append(c_file.name)
        raise build.CompileError(message.format(c_file=c_file), pyx_path="k.pyx", stage="cc")
    monkeypatch.setattr(build, "_cc_with_pch", cc)
    return calls


def test_the_cxx_route_tells_the_environment_from_the_lowering(monkeypatch, tmp_path):
    calls = _cxx_route(monkeypatch, tmp_path, "g++ failed (exit 1) on kernel k.pyx "
                       "(generated C: {c_file}):\ng++: fatal error: cannot execute 'cc1plus'")
    work = tmp_path / "work"
    work.mkdir()
    args = ("src", "k", work / "k.pyx", work / "k.so", tmp_path, work)
    monkeypatch.setenv("CC", "g++")
    monkeypatch.setenv("CXX", "g++")
    with pytest.raises(build.CompileError, match="cc1plus"):        # Cython would run it too
        build._built_as_cxx(*args, [])
    monkeypatch.setenv("CC", "gcc")
    rejected: list = []
    assert build._built_as_cxx(*args, rejected) is False and rejected == []   # gcc may work
    # diagnostics located in the lowered C++: the lowering is suspect (reported by _build
    # once Cython's form has built)
    build_errors = build.cache_info()["cxx_fallbacks"]
    calls.clear()
    monkeypatch.setattr(build, "_cc_with_pch", lambda source, c_file, *a, **k: (_ for _ in ()).throw(
        build.CompileError(f"{c_file}:3:1: error: 'x' does not name a type")))
    assert build._built_as_cxx(*args, rejected) is False and len(rejected) == 1
    assert build.cache_info()["cxx_fallbacks"] == build_errors


def test_a_cxx_form_whose_cython_build_fails_too_is_not_reported(monkeypatch, tmp_path, caplog):
    """The lowered C++ rejected with located diagnostics, then Cython's C rejected as well:
    the compiler's setup is at fault, so the CompileError is raised and nothing is reported
    as a lowering bug."""
    calls = _cxx_route(monkeypatch, tmp_path, "{c_file}:1:10: fatal error: Python.h: No such file")
    before = build.cache_info()["cxx_fallbacks"]
    with caplog.at_level(logging.WARNING, logger="scorch"), \
            pytest.raises(build.CompileError, match="Python.h"):
        build.load_kernel(f"# scorch probe {uuid.uuid4().hex}\n", "probe_env")
    assert len(calls) == 2 and calls[0].endswith("_lowered.cpp")   # C++ form, then Cython's
    assert build.cache_info()["cxx_fallbacks"] == before
    assert "Please report" not in caplog.text


def test_explain_says_when_a_shared_pattern_runs_without_its_kernel(monkeypatch):
    """A sparse operand times a scalar (a (1, 1) dense operand) runs as values only
    (shared_pattern.py): no kernel loads, and the plan says so."""
    a, d = _matrix(), torch.randn(1, 1, dtype=torch.float64)
    plan = scorch.explain("ij,ij->ij", _csr(a), d)
    result, loaded = _run_capturing_kernels(monkeypatch, lambda: scorch.einsum("ij,ij->ij", _csr(a), d))
    assert loaded == [] and any("values only" in w for w in plan.workspaces)
    torch.testing.assert_close(result.to_dense(), a * d)
