"""Sparse tensors across processes (API.md section 8): DataLoader batches stay sparse with
workers, a non-leaf that requires grad is refused at a process boundary (as torch refuses a
dense one), and a child forked while a kernel compiles can compile its own."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import scorch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _SparseSamples(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        idx = torch.tensor([[i, 0, 2999], [i + 1, 5, 2999]])
        return scorch.sparse_tensor((idx, torch.tensor([1.0, 2.0, 3.0])), size=(3000, 3000),
                                    format="csr")


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_of_sparse_samples_stay_sparse(workers):
    batch = next(iter(DataLoader(_SparseSamples(), batch_size=4, num_workers=workers)))
    assert isinstance(batch, scorch.SparseTensor) and tuple(batch.shape) == (4, 3000, 3000)
    assert batch.nnz == 12
    want = torch.stack([_SparseSamples()[i].to_dense() for i in range(4)])
    assert torch.equal(batch.to_dense(), want)


class _SamplesThatTrain(Dataset):
    """Rows of a sparse parameter: samples that require grad."""
    def __init__(self):
        self.weight = torch.nn.Parameter(scorch.sparse_tensor(torch.eye(4), format="csr"))

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.weight[i]


def test_a_worker_refuses_samples_that_require_grad_promptly():
    """The error reaches the main process (it used to wait forever on a batch the worker
    could not send)."""
    loader = DataLoader(_SamplesThatTrain(), batch_size=2, num_workers=1, timeout=120)
    with pytest.raises(RuntimeError, match="a sample requires grad"):
        next(iter(loader))


def test_a_non_leaf_that_requires_grad_is_refused_at_process_boundaries():
    from multiprocessing.reduction import ForkingPickler
    A = scorch.sparse_tensor(torch.eye(3), format="csr", requires_grad=True)
    B = A * 2
    with pytest.raises(RuntimeError, match="Cowardly refusing"):
        ForkingPickler.dumps(B)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(B)
    assert ForkingPickler.loads(ForkingPickler.dumps(B.detach())).nnz == 3   # data: fine
    assert copy.deepcopy(A).requires_grad                                    # a leaf: fine


FORK_DURING_COMPILE = textwrap.dedent(r"""
    import os, sys, threading
    import torch, scorch
    from scorch.tensor_compiler import build
    held = threading.Event(); release = threading.Event()

    def compiling():                # stands for a thread in the middle of a first compile
        with build._slow_lock:
            held.set()
            release.wait()
    t = threading.Thread(target=compiling); t.start(); held.wait()
    pid = os.fork()
    if pid == 0:                    # the child: its own compile must not wait for that thread
        torch.set_num_threads(1)
        A = scorch.sparse_tensor(torch.eye(5, dtype=torch.float64), format="dcsc")
        out = scorch.einsum("ij,jk->ik", A, torch.ones(5, 3, dtype=torch.float64))
        os._exit(0 if bool((out == 1).all()) else 3)
    release.set(); t.join()
    _, status = os.waitpid(pid, 0)
    print("child status", os.waitstatus_to_exitcode(status), flush=True)
""")


def test_a_child_forked_while_a_compile_holds_the_lock_compiles_its_own(tmp_path):
    env = dict(os.environ, SCORCH_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", FORK_DURING_COMPILE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert "child status 0" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


SHARE_AFTER_USE = textwrap.dedent("""
    import torch, scorch
    torch.manual_seed(0)
    W0 = torch.randn(500, 400) * (torch.rand(500, 400) < 0.02)
    x = torch.randn(16, 400)
    W = scorch.sparse_tensor(W0, format="csr")
    B = W * 2                                   # shares W's index arrays
    V = W.t()                                   # a view of W's arrays
    for _ in range(3):                          # warm: array addresses cached
        torch.nn.functional.linear(x, W); B @ x.t(); x @ V
    W.share_memory_()
    assert W.is_shared() and B._storage.levels[1].crd.is_shared()
    for _ in range(3):
        assert torch.allclose(torch.nn.functional.linear(x, W), x @ W0.t(), atol=1e-5)
        assert torch.allclose(B @ x.t(), 2 * W0 @ x.t(), atol=1e-5)
        assert torch.allclose(x @ V, x @ W0.t(), atol=1e-5)
    print("ok")
""")


def test_share_memory_after_a_product_keeps_every_alias_working():
    """``share_memory_`` moves the arrays (and frees the old buffers): every Storage's
    cached addresses are dropped, the tensor's own, its views' and those of results that
    share its index arrays (reading them had crashed the process with SIGSEGV)."""
    out = subprocess.run([sys.executable, "-c", SHARE_AFTER_USE], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
