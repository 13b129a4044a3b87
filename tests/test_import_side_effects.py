"""What ``import scorch`` does to the rest of the process: torch's modules stay torch's
(``import scorch.optim.lr_scheduler`` aliases, never re-executes torch's source), dense
optimizer steps are not walked by scorch's step hooks, ``__version__`` answers as torch,
and torch's CSR beta warning is not raised for tensors scorch builds for itself."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

import scorch
from scorch.gradients import optimizer_step


def _run(code: str, *flags: str, prelude: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


# --- import scorch.<aliased torch package>.<submodule> ------------------------------------

_NO_COPIES = """
def no_copies():
    # every scorch.* module that is torch's is the very module torch has under its name,
    # and no module named scorch.* was executed from torch's folder
    import os
    torch_dir = os.path.dirname(torch.__file__)
    for name, m in list(sys.modules.items()):
        if not name.startswith("scorch.") or m is None:
            continue
        if not m.__name__.startswith("scorch"):
            assert sys.modules[m.__name__] is m, name
        else:
            assert not (getattr(m, "__file__", None) or "").startswith(torch_dir), name
"""


def test_submodule_of_an_aliased_package_is_torchs_module():
    """One fresh process (imports are once per process): lr_scheduler, distributions, a
    torch submodule not loaded yet, scorch's own package, a pybind-backed module (executing
    ``torch.distributed.autograd`` twice aborted the interpreter)."""
    out = _ok(_run(prelude=_NO_COPIES, code="""
    import sys
    import torch, torch.optim.lr_scheduler, torch.distributions
    LRScheduler, Normal = torch.optim.lr_scheduler.LRScheduler, torch.distributions.Normal
    sched = torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), 1)
    import scorch
    import scorch.optim.lr_scheduler
    import scorch.distributions.normal
    import scorch.utils.data.dataloader
    from scorch.optim import swa_utils
    m = sys.modules
    assert m["scorch.optim.lr_scheduler"] is m["torch.optim.lr_scheduler"]
    assert torch.optim.lr_scheduler is m["torch.optim.lr_scheduler"]
    assert torch.optim.lr_scheduler.LRScheduler is LRScheduler
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)   # plain torch code
    assert scorch.distributions.normal.Normal is Normal
    n = scorch.distributions.normal.Normal(torch.zeros(2), torch.ones(2))
    assert torch.equal(torch.distributions.kl_divergence(n, Normal(torch.zeros(2), torch.ones(2))),
                       torch.zeros(2))
    assert scorch.utils.data.dataloader is torch.utils.data.dataloader
    assert swa_utils is torch.optim.swa_utils
    # torch's modules keep their own spec (reload, find_spec), not the alias's
    assert torch.optim.__spec__.name == "torch.optim"
    assert torch.optim.lr_scheduler.__spec__.name == "torch.optim.lr_scheduler"

    # a torch submodule first imported through scorch: loaded once, under torch's name
    assert "torch.nn.utils.prune" not in sys.modules
    import scorch.nn.utils.prune
    assert scorch.nn.utils.prune is m["torch.nn.utils.prune"] is torch.nn.utils.prune
    assert scorch.nn is not torch.nn                 # scorch's own package is still found first
    import scorch.nn.functional
    assert scorch.nn.functional.__name__ == "scorch.nn.functional"
    try:
        import scorch.optim.no_such_module
    except ModuleNotFoundError as e:
        assert "scorch.optim.no_such_module" in str(e)
    else:
        raise AssertionError("imported a module torch does not have")

    import scorch.distributed.autograd
    assert m["scorch.distributed.autograd"] is m["torch.distributed.autograd"]
    no_copies()
    print("ok")
    """))
    assert out.strip() == "ok"


# --- optimizer step hooks -----------------------------------------------------------------

@pytest.fixture
def walks(monkeypatch):
    seen = []
    real = optimizer_step._gradients_on_pattern

    def recording(optimizer):
        seen.append(type(optimizer).__name__)
        return real(optimizer)
    monkeypatch.setattr(optimizer_step, "_gradients_on_pattern", recording)
    return seen


def _sparse_param():
    W = torch.nn.Parameter(scorch.sparse_tensor(torch.eye(3), format="csr"))
    W.grad = scorch.sparse_tensor(torch.eye(3), format="csr")
    return W


def test_dense_step_does_not_walk_parameters(walks):
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(5)]
    for p in ps:
        p.grad = torch.ones(3)
    torch.optim.SGD(ps, lr=0.5).step()
    assert walks == []
    assert all(torch.equal(p, torch.full((3,), 0.5)) for p in ps)   # the step itself ran


@pytest.mark.parametrize("context", ["none", "torch.device", "add_param_group", "replaced"])
def test_sparse_parameter_is_always_seen(walks, context):
    """However the sparse parameter got into the optimizer, and with a TorchFunctionMode on,
    its step is handled (the check is not cached across param_groups changes)."""
    d = torch.nn.Parameter(torch.ones(3))
    d.grad = torch.ones(3)
    W = _sparse_param()
    if context in ("none", "torch.device"):
        opt = torch.optim.SGD([d, W], lr=0.5)
    else:
        opt = torch.optim.SGD([d], lr=0.5)
        opt.step()
        assert walks == []
        if context == "add_param_group":
            opt.add_param_group({"params": [W]})
        else:
            opt.param_groups[0]["params"][0] = W
    if context == "torch.device":
        with torch.device("cpu"):
            opt.step()
    else:
        opt.step()
    assert walks == ["SGD"]
    assert isinstance(W, scorch.SparseTensor)
    torch.testing.assert_close(W.to_dense(), 0.5 * torch.eye(3))


def test_dense_step_inside_a_step_keeps_the_outer_step_open():
    """A step entry is closed by its own post hook only: a dense optimizer stepped inside
    another's step leaves the outer step's values-level semantics on."""
    S = scorch.sparse_tensor(torch.eye(3), format="csr")
    inner = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    seen = []

    class Outer(torch.optim.Optimizer):
        @torch.no_grad()
        def step(self, closure=None):
            inner.step()
            seen.append(type(S + 1.0).__name__)
    Outer([torch.nn.Parameter(torch.zeros(1))], {}).step()
    assert seen == ["SparseTensor"]
    assert type(S + 1.0) is torch.Tensor
    assert not optimizer_step._frames()


# --- __version__ --------------------------------------------------------------------------

def test_version_answers_as_torch():
    from packaging import version
    assert scorch.__version__ == torch.__version__
    assert version.parse(scorch.__version__) == version.parse(torch.__version__)
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert scorch.scorch_version == pyproject["project"]["version"]


# --- torch's CSR beta warning -------------------------------------------------------------

_FACTOR = """
import warnings, scorch, torch
from scorch import interop
torch.manual_seed(0)
dense = torch.tril(torch.rand(6, 6)) + torch.eye(6)
L = scorch.sparse_tensor(dense, format="csr")
b = torch.randn(6, 2)
"""


def test_internal_torch_compressed_tensor_does_not_warn():
    """``python -W error``: a compressed tensor built for scorch's own use does not raise
    torch's beta warning (a fresh process: torch warns once per process)."""
    out = _ok(_run("""
    for fmt in ("csr", "csc", "bsr"):
        st = (L.to_sparse_bsr((2, 2)) if fmt == "bsr" else L.to_format(fmt))._storage
        t = interop.to_torch(st, internal=True)
        assert torch.equal(t.to_dense(), dense), fmt
    X = torch.triangular_solve(b, interop.to_torch(L._storage, internal=True), upper=False).solution
    torch.testing.assert_close(X, torch.linalg.solve_triangular(dense, b, upper=False))
    print("ok")
    """, "-W", "error", prelude=_FACTOR))
    assert out.strip() == "ok"


def test_user_to_torch_still_warns_as_torch():
    """The user asking for a torch CSR tensor gets torch's own warning, as torch's own
    constructor gives it."""
    out = _ok(_run(prelude=_FACTOR, code="""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = L.to_torch()
    assert t.layout == torch.sparse_csr
    print(any("beta state" in str(x.message) for x in w))
    """))
    assert out.strip() == "True"


def test_triangular_solve_with_sparse_factor_under_W_error():
    out = _ok(_run("""
    for call in (lambda: torch.linalg.solve_triangular(L, b, upper=False),
                 lambda: torch.triangular_solve(b, L, upper=False).solution):
        torch.testing.assert_close(call(), torch.linalg.solve_triangular(dense, b, upper=False))
    print("ok")
    """, "-W", "error", prelude=_FACTOR))
    assert out.strip() == "ok"
