"""The process pool of output blocks (workspace.h: BlockPool, exported by
scorch._runtime.workspace): every kernel module gives its freed output blocks to ONE pool
with one limit, whatever the number of distinct kernels (each module used to keep 64 MB of
its own: ~1 GB after 14 distinct COO ops), and results stay right while blocks are reused,
evicted and shared between threads."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import scorch
import scorch._runtime.workspace as ws

LIMIT = 1 << 20


def _pair(n, per_row, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    nnz = n * per_row
    m = sp.coo_matrix((rng.standard_normal(nnz).astype(dtype),
                       (rng.integers(0, n, nnz), rng.integers(0, n, nnz))), shape=(n, n)).tocsr()
    m.sum_duplicates()
    return scorch.from_scipy(m), torch.tensor(m.toarray())


# distinct kernels whose sparse outputs come from output buffers (workspace.h AppendBuffer)
OPS = [
    ("csr @ csr", "csr", lambda a, b: a @ b, lambda x, y: x @ y),
    ("csr @ csr.T", "csr", lambda a, b: a @ b.T, lambda x, y: x @ y.T),
    ("coo + coo", "coo", lambda a, b: a + b, lambda x, y: x + y),
    ("coo maximum", "coo", torch.maximum, torch.maximum),
    ("coo * coo", "coo", lambda a, b: a * b, lambda x, y: x * y),
]


def _operands(fmt, dtype, n=600, per_row=12):
    a, ad = _pair(n, per_row, 1, dtype)
    b, bd = _pair(n, per_row, 2, dtype)
    if fmt != "csr":
        a, b = a.to_format(fmt), b.to_format(fmt)
    return a, b, ad, bd


def _check(out, expected):
    torch.testing.assert_close(out.to_dense(), expected, rtol=1e-4, atol=1e-4)


@pytest.fixture
def small_limit():
    old = ws.pool_limit()
    ws.release_memory()
    ws.set_pool_limit(LIMIT)
    yield LIMIT
    ws.set_pool_limit(old)


def test_the_default_limit_is_process_wide_and_finite():
    assert 0 < ws.pool_limit() <= 256 << 20
    assert type(ws.BLOCK_POOL_V2).__name__ == "PyCapsule"


def test_every_kernel_shares_one_bounded_pool(small_limit):
    most = 0
    for dtype in (np.float32, np.float64):
        for name, fmt, op, ref in OPS:
            a, b, ad, bd = _operands(fmt, dtype)
            out = op(a, b)
            _check(out, ref(ad, bd))
            del out
            held = ws.pool_bytes()
            assert held <= small_limit, name
            most = max(most, held)
    # the kernel modules' freed blocks reached this module's pool: they have no pool of their own
    assert most > 0
    ws.release_memory()
    assert ws.pool_bytes() == 0


def test_a_kernel_called_again_reuses_its_blocks():
    ws.release_memory()
    a, ad = _pair(800, 10, 3)
    expected = ad @ ad
    _check(a @ a, expected)            # the result is freed at once: its blocks are kept
    kept = ws.pool_bytes()
    assert kept > 0
    out = a @ a                        # takes them back
    assert ws.pool_bytes() < kept
    _check(out, expected)


def test_limit_zero_keeps_nothing(small_limit):
    ws.set_pool_limit(0)
    a, b, ad, bd = _operands("coo", np.float32)
    for _ in range(3):
        _check(a + b, ad + bd)
        assert ws.pool_bytes() == 0


def test_threads_calling_kernels_at_once(small_limit):
    errors = []

    def work(name, fmt, op, ref):
        try:
            a, b, ad, bd = _operands(fmt, np.float32, n=400)
            expected = ref(ad, bd)
            for _ in range(8):
                _check(op(a, b), expected)
                assert ws.pool_bytes() <= small_limit
        except BaseException as e:      # noqa: BLE001 (reported by the main thread)
            errors.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=work, args=case) for case in OPS + OPS[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert ws.pool_bytes() <= small_limit


def test_env_var_sets_the_limit():
    code = "import scorch._runtime.workspace as w; print(w.pool_limit())"
    env = dict(os.environ, SCORCH_POOL_MB="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) == 3 << 20


def test_kernels_reach_the_pool_in_a_process_that_never_imported_it():
    """A user's process imports scorch, not scorch._runtime.workspace: loading the first
    kernel imports it (and a kernel module that finds it missing imports it itself), so
    output blocks go to that one pool, not to a pool of each kernel module's own (the
    capsule lookup alone found no submodule there, and every kernel module kept up to the
    limit for itself)."""
    code = "\n".join([
        "import sys, scipy.sparse as sp, numpy as np, scorch",
        "m = sp.random(400, 400, density=0.03, format='csr', dtype=np.float32, random_state=0)",
        "A = scorch.from_scipy(m)",
        "assert 'scorch._runtime.workspace' not in sys.modules",
        "for _ in range(3):",
        "    C = scorch.einsum('ij,jk->ik', A, A)",
        "    del C",
        "ws = sys.modules.get('scorch._runtime.workspace')",
        "print(ws is not None and ws.pool_bytes())",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stderr
    held = out.stdout.split()[-1]
    assert held not in ("False", "0"), held
