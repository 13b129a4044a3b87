"""Malformed input never crashes the process: every bad input of issue 14 runs in a child
process, and the suite fails on any signal (SIGSEGV, SIGBUS, SIGABRT ...).

One child runs the cases in order, announcing each one; if it dies, the case it was
running is recorded as a crash and a new child resumes after it, so a crash costs one
restart and every case still runs. Cases marked ``raises`` must end in a clean exception
(ValueError, TypeError, RuntimeError or NotImplementedError); ``ok`` cases are valid input
that must give the right answer; ``any`` cases (front-end items handled elsewhere) only
must not crash. ``python -m pytest tests/test_malformed.py -rP`` shows the summary line
(cases run, clean errors, right answers, crashes)."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent('''
    import io, json, sys, traceback, warnings
    warnings.simplefilter("ignore")
    import numpy as np
    import scipy.sparse as sp
    import torch
    import scorch

    def csr(crow, col, vals, shape, layout=torch.sparse_csr_tensor):
        return layout(torch.tensor(crow), torch.tensor(col), torch.tensor(vals, dtype=torch.float32),
                      shape, check_invariants=False)

    def coo(indices, vals, shape, **kw):
        return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(vals, dtype=torch.float32),
                                       shape, check_invariants=False, **kw)

    def dense(x):
        return x.to_dense() if isinstance(x, scorch.SparseTensor) else x

    def scipy_with(m, **arrays):
        for k, v in arrays.items():
            setattr(m, k, v)
        return m

    def check(got, want):
        assert torch.allclose(dense(got).to(torch.float64), want.to(torch.float64)), (got, want)
''')

# (name, expectation, code)
CASES = [
    # torch COO
    ("coo negative index -> sparse_tensor", "raises",
     "scorch.sparse_tensor(coo([[0, -1], [0, 1]], [1., 2.], (3, 3)))"),
    ("coo negative index -> einsum", "raises",
     "scorch.einsum('ij,j->i', coo([[0, -1], [0, 1]], [1., 2.], (3, 3)), torch.ones(3))"),
    ("coo index beyond size -> einsum", "raises",
     "scorch.einsum('ij,j->i', coo([[0, 3], [0, 1]], [1., 2.], (3, 3)), torch.ones(3))"),
    ("coo flagged coalesced with index beyond size", "raises",
     "scorch.sparse_tensor(coo([[0, 1], [0, 9]], [1., 2.], (3, 3), is_coalesced=True))"),
    ("coo flagged coalesced, unsorted and repeated", "ok",
     "check(scorch.einsum('ij,j->i', coo([[2, 0, 2], [1, 1, 1]], [1., 2., 4.], (3, 3), is_coalesced=True), torch.ones(3)),"
     " torch.tensor([2., 0., 5.]))"),
    ("coo hybrid with index beyond size", "raises",
     "scorch.sparse_tensor(torch.sparse_coo_tensor(torch.tensor([[0, 4]]), torch.ones(2, 3), (3, 3), check_invariants=False))"),
    # torch CSR / CSC / BSR
    ("csr column out of range -> einsum spmv", "raises",
     "scorch.einsum('ij,j->i', csr([0, 1, 2], [0, 7], [1., 2.], (2, 5)), torch.ones(5))"),
    ("csr column out of range -> einsum spmm", "raises",
     "scorch.einsum('ij,jk->ik', csr([0, 1, 2], [0, 7], [1., 2.], (2, 5)), torch.ones(5, 3))"),
    ("csr negative column", "raises",
     "scorch.einsum('ij,j->i', csr([0, 1, 2], [0, -3], [1., 2.], (2, 5)), torch.ones(5))"),
    ("csr crow_indices beyond nnz", "raises",
     "scorch.einsum('ij,j->i', csr([0, 1, 9], [0, 1], [1., 2.], (2, 5)), torch.ones(5))"),
    ("csr decreasing crow_indices", "raises",
     "scorch.einsum('ij,j->i', csr([0, 2, 1, 2], [0, 1], [1., 2.], (3, 5)), torch.ones(5))"),
    ("csr crow_indices not starting at 0", "raises",
     "scorch.sparse_tensor(csr([1, 1, 2], [0, 1], [1., 2.], (2, 5)))"),
    ("csr unsorted columns (valid in torch)", "ok",
     "check(scorch.einsum('ij,jk->ik', csr([0, 2, 2], [3, 1], [1., 2.], (2, 5)), torch.arange(10.).reshape(5, 2)),"
     " torch.tensor([[10., 13.], [0., 0.]]))"),
    ("csr repeated column (summed)", "ok",
     "check(scorch.sparse_tensor(csr([0, 2], [1, 1], [1., 2.], (1, 3))), torch.tensor([[0., 3., 0.]]))"),
    ("csc row out of range", "raises",
     "scorch.einsum('ij,j->i', csr([0, 1, 2], [0, 4], [1., 2.], (4, 2), torch.sparse_csc_tensor), torch.ones(2))"),
    ("bsr block column out of range", "raises",
     "scorch.sparse_tensor(torch.sparse_bsr_tensor(torch.tensor([0, 1]), torch.tensor([3]), torch.ones(1, 2, 2), (2, 4), check_invariants=False))"),
    ("csr int32 indices out of range", "raises",
     "scorch.einsum('ij,j->i', torch.sparse_csr_tensor(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32), torch.ones(1), (1, 5), check_invariants=False), torch.ones(5))"),
    ("csr changed in place after a first use", "raises",
     "t = csr([0, 1, 2], [0, 1], [1., 2.], (2, 5)); scorch.einsum('ij,j->i', t, torch.ones(5));"
     " t.col_indices()[1] = 11; scorch.einsum('ij,j->i', t, torch.ones(5))"),
    ("empty csr (0 x 5)", "ok",
     "check(scorch.einsum('ij,j->i', torch.zeros(0, 5).to_sparse_csr(), torch.ones(5)), torch.zeros(0))"),
    # scipy
    ("scipy csr column >= ncols", "raises",
     "scorch.sparse_tensor(sp.csr_matrix((np.ones(2), np.array([0, 7]), np.array([0, 1, 2])), shape=(2, 5)))"),
    ("scipy csr negative column", "raises",
     "scorch.sparse_tensor(sp.csr_matrix((np.ones(2), np.array([0, -1]), np.array([0, 1, 2])), shape=(2, 5)))"),
    ("scipy csc row >= nrows", "raises",
     "scorch.sparse_tensor(sp.csc_array((np.ones(2), np.array([0, 2]), np.array([0, 1, 2])), shape=(2, 2)))"),
    ("scipy csr decreasing indptr", "raises",
     "scorch.sparse_tensor(scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 2, 1, 3])))"),
    ("scipy csr indptr beyond nnz", "raises",
     "scorch.sparse_tensor(scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 1, 2, 8])))"),
    ("scipy csr short indptr", "raises",
     "scorch.sparse_tensor(scipy_with(sp.csr_matrix(np.eye(3)), indptr=np.array([0, 3])))"),
    ("scipy coo column >= ncols", "raises",
     "scorch.sparse_tensor(scipy_with(sp.coo_matrix(np.eye(2)), col=np.array([0, 5], dtype=np.int32)))"),
    ("scipy coo negative row", "raises",
     "scorch.sparse_tensor(scipy_with(sp.coo_array(np.eye(2)), row=np.array([-1, 1], dtype=np.int32)))"),
    ("scipy csr float indices", "raises",
     "scorch.sparse_tensor(scipy_with(sp.csr_matrix(np.eye(2)), indices=np.array([0., 1.])))"),
    ("scipy csr unsorted (valid)", "ok",
     "m = sp.csr_matrix(np.array([[0., 1., 2.]])); m.indices[:] = m.indices[::-1].copy(); m.data[:] = m.data[::-1].copy();"
     " m.has_sorted_indices = False; check(scorch.sparse_tensor(m), torch.tensor([[0., 1., 2.]]))"),
    # constructors
    ("string values", "raises", "scorch.sparse_tensor((torch.tensor([[0, 1]]), ['a', 'b']), size=(3,))"),
    ("string dense data", "raises", "scorch.sparse_tensor(np.array([['a', 'b']]))"),
    ("dtype as a string", "raises", "scorch.sparse_tensor(torch.eye(3), dtype='float32')"),
    ("dtype as a string in scorch.tensor", "raises", "scorch.tensor([[1., 0.]], dtype='float32', format='csr')"),
    ("Format(None)", "raises", "scorch.Format(None)"),
    ("meta dense tensor -> sparse_tensor", "raises", "scorch.sparse_tensor(torch.empty(3, 3, device='meta'))"),
    ("meta indices -> sparse_tensor", "raises",
     "scorch.sparse_tensor((torch.zeros(1, 2, dtype=torch.long, device='meta'), torch.ones(2)), size=(3,))"),
    ("negative size", "raises", "scorch.sparse_tensor((torch.tensor([[0]]), torch.ones(1)), size=(-2,))"),
    ("NaN size", "raises", "scorch.sparse_tensor((torch.tensor([[0]]), torch.ones(1)), size=(float('nan'),))"),
    ("float indices", "raises", "scorch.sparse_tensor((torch.tensor([[0.5]]), torch.ones(1)), size=(3,))"),
    ("indices out of range with size", "raises", "scorch.sparse_tensor((torch.tensor([[5]]), torch.ones(1)), size=(3,))"),
    ("unknown format name", "raises", "scorch.sparse_tensor(torch.eye(2), format='crs')"),
    # saving
    ("damaged checkpoint (crd out of range)", "raises",
     "from scorch.tensor_type import _load\n"
     "s = scorch.sparse_tensor(torch.eye(3), format='csr'); st = s._storage\n"
     "crd = st.levels[1].crd.clone(); crd[1] = 99\n"
     "class Evil:\n"
     "    def __reduce__(self):\n"
     "        return (_load, (st.format, st.shape, [('d', 0, 3, None, None, False), ('c', 1, 3, st.levels[1].pos, crd, False)], st.values, False))\n"
     "b = io.BytesIO(); torch.save(Evil(), b); b.seek(0); torch.load(b)"),
    ("share_memory_ of a sparse tensor", "ok",
     "s = scorch.sparse_tensor(torch.eye(3), format='csr'); s.share_memory_(); assert s.is_shared(); check(s, torch.eye(3))"),
    # compiler front end: a clean error each
    ("einsum equation None", "raises", "scorch.einsum(None, scorch.sparse_tensor(torch.eye(2)))"),
    ("einsum equation int", "raises", "scorch.einsum(3, scorch.sparse_tensor(torch.eye(2)))"),
    ("einsum ii->i on 4 x 1", "raises", "scorch.einsum('ii->i', scorch.sparse_tensor(torch.ones(4, 1)))"),
    ("einsum with a meta operand", "raises",
     "scorch.einsum('ij,j->i', scorch.sparse_tensor(torch.eye(3)), torch.empty(3, device='meta'))"),
    ("einsum dtype string", "raises", "scorch.einsum('ij->i', scorch.sparse_tensor(torch.eye(3)), dtype='float32')"),
    ("out_format on a scalar output", "raises", "scorch.einsum('ij->', scorch.sparse_tensor(torch.eye(3)), out_format='csr')"),
    ("einsum size mismatch", "raises",
     "scorch.einsum('ij,jk->ik', scorch.sparse_tensor(torch.eye(3)), torch.ones(4, 2))"),
    ("einsum more operands than terms", "raises", "scorch.einsum('ij->ij', scorch.sparse_tensor(torch.eye(3)), torch.ones(3))"),
    ("block size not dividing the shape", "raises",
     "scorch.sparse_tensor(torch.eye(3), format=scorch.Format('dc', block=(2, 2)))"),
    ("singleton level with two entries in a row", "raises",
     "scorch.sparse_tensor(torch.ones(2, 2), format=scorch.Format('cs'))"),
    # the plan cache must not answer a broadcasting call with a plan made for size-1 dims
    # that did not broadcast (or the reverse), whatever the order of the calls
    ("size-1 dims, then the same dims broadcasting", "ok",
     "A = scorch.sparse_tensor(torch.tensor([[1.], [0.], [2.]]), format='csr')\n"
     "check(scorch.einsum('ij,ij->ij', A, torch.full((3, 1), 2.)), torch.tensor([[2.], [0.], [4.]]))\n"
     "check(scorch.einsum('ij,ij->ij', A, torch.ones(3, 4)), torch.tensor([[1.], [0.], [2.]]).expand(3, 4))"),
    ("broadcasting dims, then the same dims of size 1", "ok",
     "A = scorch.sparse_tensor(torch.tensor([[0., 3.]]), format='coo')\n"
     "check(scorch.einsum('ij,ij->ij', A, torch.ones(4, 2)), torch.tensor([[0., 3.]]).expand(4, 2))\n"
     "check(scorch.einsum('ij,ij->ij', A, torch.full((1, 2), 2.)), torch.tensor([[0., 6.]]))"),
    # the kernel cache: an unusable folder falls back to a private one (one warning)
    ("kernel cache folder is a file", "ok",
     "import os, tempfile; f = tempfile.NamedTemporaryFile(); os.environ['SCORCH_CACHE_DIR'] = f.name\n"
     "try:\n"
     "    check(scorch.einsum('ij,j->i', scorch.sparse_tensor(torch.eye(3), format='csr'), torch.ones(3)), torch.ones(3))\n"
     "    from scorch.tensor_compiler import build; assert f.name not in str(build.cache_dir())\n"
     "finally:\n"
     "    del os.environ['SCORCH_CACHE_DIR']"),
]

CHILD = PRELUDE + textwrap.dedent('''
    cases = json.loads(sys.argv[1])
    start = int(sys.argv[2])
    for i in range(start, len(cases)):
        name, expect, code = cases[i]
        print(json.dumps({"start": i}), flush=True)
        try:
            exec(compile(code, name, "exec"), dict(globals()))
            outcome = "ok"
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
            outcome = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        except AssertionError as exc:
            outcome = f"WRONG: {exc}"[:300]
        except BaseException as exc:  # noqa: BLE001
            outcome = f"UNCLEAN {type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps({"end": i, "outcome": outcome}), flush=True)
''')


def _run_all():
    """Outcome per case; a child that dies is restarted after the case it was running."""
    outcomes = {}
    payload = json.dumps(CASES)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    start = 0
    while start < len(CASES):
        proc = subprocess.run([sys.executable, "-c", CHILD, payload, str(start)], env=env,
                              capture_output=True, text=True, timeout=300)
        running = None
        for line in proc.stdout.splitlines():
            msg = json.loads(line) if line.startswith("{") else {}
            if "start" in msg:
                running = msg["start"]
            elif "end" in msg:
                outcomes[msg["end"]] = msg["outcome"]
                running = None
        if proc.returncode == 0:
            break
        if running is None:
            raise AssertionError(f"the child failed outside a case: {proc.stderr[-2000:]}")
        sig = -proc.returncode
        outcomes[running] = (f"CRASH signal {signal.Signals(sig).name}" if sig > 0
                             else f"CRASH exit {proc.returncode}: {proc.stderr[-300:]}")
        start = running + 1
    return outcomes


@pytest.fixture(scope="module")
def outcomes():
    return _run_all()


def summary(outcomes: dict) -> str:
    """One line: how many cases ran and how each kind of outcome counted."""
    kinds = {"ok": 0, "clean error": 0, "crash": 0, "unclean": 0, "wrong": 0}
    for got in outcomes.values():
        key = ("ok" if got == "ok" else "clean error" if got.startswith("raised") else
               "crash" if got.startswith("CRASH") else "wrong" if got.startswith("WRONG") else "unclean")
        kinds[key] += 1
    return (f"malformed-input suite: {len(outcomes)} of {len(CASES)} cases ran: "
            + ", ".join(f"{n} {k}" for k, n in kinds.items()))


def test_every_case_ran(outcomes):
    """Prints the summary line (shown with ``pytest -rP``)."""
    print(summary(outcomes))
    assert sorted(outcomes) == list(range(len(CASES)))


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_malformed_input(outcomes, index):
    name, expect, _ = CASES[index]
    got = outcomes[index]
    assert not got.startswith("CRASH"), f"{name}: {got}"
    assert not got.startswith("UNCLEAN"), f"{name}: {got}"
    if expect == "raises":
        assert got.startswith("raised"), f"{name}: expected a clean error, got {got}"
    elif expect == "ok":
        assert got == "ok", f"{name}: {got}"
