"""Kernel calls from several Python threads at once: the thread-count start-up runs once,
an output buffer's failed allocation fails its own call and no other, and an optimizer step
that meets state of an older pattern says how to reset it."""
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest
import torch

import scorch
from scorch._runtime import convert
from scorch.tensor_compiler import threads


def test_first_parallel_calls_from_many_threads_start_the_load_estimate_once(monkeypatch):
    """The first reading of the load estimate releases the GIL (it reads /proc): a thread
    that came in meanwhile compared the clock with the not yet set start time (TypeError in
    the user's thread, and a lost gradient where that thread ran a backward)."""
    monkeypatch.setattr(threads, "_free_cores", None)
    monkeypatch.setattr(threads, "_load_known", False)
    monkeypatch.setattr(threads, "_load_known_at", None)
    monkeypatch.setattr(threads, "torch", types.SimpleNamespace(get_num_threads=lambda: 2))
    readings = []

    def slow_first_reading(T):
        readings.append(T)
        time.sleep(0.05)              # the GIL is released here, as os.read releases it
        return T
    monkeypatch.setattr(convert, "free_cores", slow_first_reading)
    n = 8
    barrier, errors, teams = threading.Barrier(n), [], []

    def first_call():
        barrier.wait()
        try:
            teams.append(threads.threads_for(threads.PARALLEL_MIN_WORK))
        except Exception as e:        # noqa: BLE001 (the race's TypeError)
            errors.append(repr(e))
    ts = [threading.Thread(target=first_call) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert teams == [1] * n           # no whole window measured yet: one thread
    assert readings == [2]            # the first window opened once


_OOM_RACE = textwrap.dedent("""
    import re, resource, threading
    import scorch as torch
    torch.manual_seed(0)
    ds = (torch.rand(300, 300) < 0.05).float() * torch.randn(300, 300)
    S = torch.sparse_tensor(ds, format="csr")
    ref = ds @ ds
    n = 20000                      # A @ B: n * n entries, 3.2 GB; the limit lets in 0.5
    i = torch.arange(n)
    zero = torch.zeros(n, dtype=torch.long)
    A = torch.sparse_tensor((torch.stack([i, zero]), torch.ones(n)), size=(n, n), format="csr")
    B = torch.sparse_tensor((torch.stack([zero, i]), torch.ones(n)), size=(n, n), format="csr")
    S @ S
    go, done = threading.Barrier(2), threading.Event()
    out, small = {}, {"ok": 0, "wrong": 0, "errors": []}

    def little():                  # the same kernel, small products, until the big one ends
        S @ S                      # this thread's allocator arena, before the limit
        go.wait()
        while not done.is_set():
            try:
                y = (S @ S).to_dense()
                small["ok" if torch.allclose(y, ref, atol=1e-4) else "wrong"] += 1
            except Exception as e:
                small["errors"].append(f"{type(e).__name__}: {e}")
    t = threading.Thread(target=little)
    t.start()
    vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10
    limit = vm + (1 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    go.wait()
    for _ in range(ROUNDS):        # each failure a chance for the other thread to see it
        try:
            C = A @ B
            out.setdefault("big", []).append(f"no error: nnz {C.nnz}")
        except Exception as e:
            out.setdefault("big", []).append(f"{type(e).__name__}: {e}")
    done.set()
    t.join()
    print("BIG", sorted(set(out["big"])))
    print("SMALL", small["ok"], small["wrong"], small["errors"][:2])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc")
def test_a_failed_output_allocation_fails_its_own_call_only(tmp_path):
    """One flag per kernel module made a small product in another thread raise MemoryError
    while a product too big for memory failed, and took the big call's own failure away
    (it then went on with buffers that had lost their entries)."""
    script = tmp_path / "oom_race.py"
    script.write_text(_OOM_RACE.replace("ROUNDS", "6"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines()
                 if line.startswith(("BIG", "SMALL")))
    assert lines["BIG"] == str(["MemoryError: out of memory while the kernel appended its output "
                                "entries: the result does not fit in memory"]), lines
    ok, wrong, errors = lines["SMALL"].split(" ", 2)
    assert (int(wrong), errors) == (0, "[]"), lines
    assert int(ok) > 0


def _pruned_step(optimizer, grow: bool):
    """One SGD step on a sparse weight, then its pattern changed (``p.data = ...``: pruned
    to fewer entries, or grown), then the next step's backward; returns the weight."""
    g = torch.Generator().manual_seed(3)
    d = torch.randn(20, 16, generator=g) * (torch.rand(20, 16, generator=g) < 0.5)
    W = scorch.sparse_tensor(d, format="csr").requires_grad_()
    opt = optimizer([W])
    x = torch.randn(16, 4, generator=g)
    opt.zero_grad()
    (W @ x).pow(2).sum().backward()
    opt.step()
    dense = W.detach().to_dense()
    new = dense + (dense == 0) * 0.5 if grow else dense * (dense.abs() > dense.abs()[dense != 0].median())
    W.data = scorch.sparse_tensor(new, format="csr")
    opt.zero_grad()
    (W @ x).pow(2).sum().backward()
    return W, opt


@pytest.mark.parametrize("grow", [False, True])
def test_sgd_momentum_of_an_older_pattern_says_to_reset_the_state(grow):
    """SGD's ``param.add_(momentum_buffer)`` after pruning (or ``buf.add_(grad)`` after
    growth) raised 'use the out-of-place form', which no user can do inside an optimizer."""
    W, opt = _pruned_step(lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), grow)
    with pytest.raises(RuntimeError, match=r"optimizer step.*momentum.*optimizer\.state\[p\] = \{\}"):
        opt.step()
    opt.state[W] = {}
    before = W.detach().to_dense()
    opt.step()
    assert W.nnz == int((before != 0).sum()) and not torch.equal(W.detach().to_dense(), before)


def test_outside_an_optimizer_step_the_error_still_names_the_out_of_place_form():
    A = scorch.sparse_tensor(torch.tensor([[1.0, 0], [0, 2]]), format="csr")
    B = scorch.sparse_tensor(torch.tensor([[1.0, 3], [0, 2]]), format="csr")
    with pytest.raises(RuntimeError, match="in-place ops keep the pattern\\); use the out-of-place form"):
        A.add_(B)
