"""Saving and sharing (API.md section 8): torch.save / torch.load with torch's default
weights_only=True, pickle, deepcopy, module state_dict round trips with the format kept,
damaged checkpoints refused, share_memory_, and torch.distributed collectives (gloo, two
processes on 127.0.0.1)."""
import copy
import io
import os
import pickle
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given, settings, strategies as st

import scorch
from scorch import Format
from scorch.tensor_type import SparseTensor

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


@st.composite
def sparse_cases(draw):
    """A random tensor in a random format (any rank 1-3, any mode order, sizes 0 and 1
    included, empty to full)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    letters = "".join(draw(st.lists(st.sampled_from("dcq"), min_size=rank, max_size=rank)))
    order = draw(st.permutations(range(rank)))
    density = draw(st.sampled_from([0.0, 0.4, 1.0]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dense = (torch.randint(1, 9, shape, generator=g) * (torch.rand(shape, generator=g) < density)).to(dtype)
    return scorch.sparse_tensor(dense, format=Format(letters, order)), dense


def _same(a, dense, fmt):
    assert isinstance(a, SparseTensor) and a.format == fmt
    assert a.dtype == dense.dtype and torch.equal(a.to_dense(), dense)


@settings(max_examples=40, deadline=None)
@given(sparse_cases())
def test_save_load_pickle_deepcopy_keep_the_format(case):
    s, dense = case
    buf = io.BytesIO()
    torch.save(s, buf)
    buf.seek(0)
    _same(torch.load(buf), dense, s.format)             # default: weights_only=True
    buf.seek(0)
    _same(torch.load(buf, weights_only=True), dense, s.format)
    _same(pickle.loads(pickle.dumps(s)), dense, s.format)
    c = copy.deepcopy(s)
    _same(c, dense, s.format)
    if c.nnz:
        c.values().zero_()
        assert torch.equal(s.to_dense(), dense)         # a deep copy owns its arrays


def test_blocked_and_torch_imported_formats_round_trip():
    x = torch.arange(24.).reshape(4, 6) * (torch.arange(24).reshape(4, 6) % 3 == 0)
    for s in (scorch.sparse_tensor(x.to_sparse_bsr((2, 3))), scorch.sparse_tensor(x.to_sparse_csc()),
              scorch.sparse_tensor(x.to_sparse())):
        buf = io.BytesIO()
        torch.save(s, buf)
        buf.seek(0)
        _same(torch.load(buf), x, s.format)


class Holder(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.register_buffer("A", a)
        self.w = torch.nn.Parameter(torch.ones(3))


def test_module_state_dict_round_trip_keeps_formats():
    x = torch.tensor([[0., 1., 0.], [2., 0., 3.], [0., 0., 4.]])
    src = Holder(scorch.sparse_tensor(x, format="dcsc"))
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)
    assert state["A"].format == Format("cc", (1, 0))
    dst = Holder(scorch.sparse_tensor(torch.zeros(3, 3), format="csr"))
    dst.load_state_dict(state)
    assert dst.A.format == Format("dc") and torch.equal(dst.A.to_dense(), x)   # keeps its own format
    fresh = Holder(scorch.sparse_tensor(torch.zeros(3, 3), format="dcsc"))
    fresh.load_state_dict(state)
    _same(fresh.A, x, Format("cc", (1, 0)))


def _damaged_payload(field: str) -> bytes:
    s = scorch.sparse_tensor(torch.eye(3), format="csr")
    st_ = s._storage
    pos, crd = st_.levels[1].pos.clone(), st_.levels[1].crd.clone()
    values = st_.values
    if field == "crd":
        crd[1] = 7
    elif field == "pos":
        pos[2] = 9
    elif field == "values":
        values = values[:2]
    arrays = [("d", 0, 3, None, None, False), ("c", 1, 3, pos, crd, False)]
    from scorch.tensor_type import _load

    class Evil:
        def __reduce__(self):
            return (_load, (st_.format, st_.shape, arrays, values, False))
    buf = io.BytesIO()
    torch.save(Evil(), buf)
    return buf.getvalue()


@pytest.mark.parametrize("field,message", [
    ("crd", "index 7 out of range for size 3"), ("pos", "decreases|entries"),
    ("values", "2 values for 3 stored positions")])
def test_damaged_checkpoint_is_refused(field, message):
    with pytest.raises(ValueError, match=message):
        torch.load(io.BytesIO(_damaged_payload(field)))


def test_weights_only_still_refuses_other_globals():
    class NotAllowed:
        def __reduce__(self):
            return (os.getcwd, ())
    buf = io.BytesIO()
    torch.save(NotAllowed(), buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buf)


def _round_trips():
    def saved(t, weights_only):
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=weights_only)
    return [("deepcopy", copy.deepcopy), ("pickle", lambda t: pickle.loads(pickle.dumps(t))),
            ("torch.save", lambda t: saved(t, True)),
            ("torch.save (weights_only=False)", lambda t: saved(t, False))]


@pytest.mark.parametrize("how", [r[0] for r in _round_trips()])
def test_copies_of_a_sparse_parameter_stay_parameters(how):
    """As torch's: a copy of a Parameter is a Parameter (a deep-copied module's weight can be
    assigned back), with its requires_grad and the attributes set on the tensor."""
    copy_of = dict(_round_trips())[how]
    w = torch.tensor([[1., 0, 2], [0, 3, 0]])
    p = torch.nn.Parameter(scorch.sparse_tensor(w, format="csr"))
    q = copy_of(p)
    assert isinstance(q, torch.nn.Parameter) and isinstance(q, SparseTensor)
    assert q.requires_grad and q.format == p.format
    assert torch.equal(q.detach().to_dense(), w)
    s = scorch.sparse_tensor(w, format="csc")
    s.tag = "kept"
    r = copy_of(s)
    assert r.tag == "kept" and not isinstance(r, torch.nn.Parameter)
    m = torch.nn.Module()
    m.W = p
    m.W = copy.deepcopy(m).W            # a Parameter: assignable


def test_deepcopy_keeps_views_sharing_and_the_gradient():
    """``deepcopy({"S": S, "T": S.t()})`` copies the arrays once (the copies still share, as
    torch's deepcopy of a tensor and its view); a leaf's ``.grad`` is copied with it. (A view
    recorded by autograd is no leaf: deepcopy refuses it, as torch's.)"""
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    S = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    (S @ torch.ones(3, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy({"S": S, "T": S.t()})
    with torch.no_grad():
        T = S.t()
    d = copy.deepcopy({"S": S, "T": T})
    assert d["S"]._storage.values.data_ptr() == d["T"]._storage.values.data_ptr()
    assert d["S"]._storage.values.data_ptr() != S._storage.values.data_ptr()
    with torch.no_grad():
        d["S"].mul_(2)
    assert torch.equal(d["T"].to_dense(), 2 * x.t())
    assert torch.equal(S.detach().to_dense(), x)
    assert d["S"].grad is not None and d["S"].grad is not S.grad
    assert torch.equal(d["S"].grad.to_dense(), S.grad.to_dense())


def _double_values(q_in, q_out):
    t = q_in.get()
    t.values().mul_(2)
    q_out.put(bool(t.is_shared()))


def test_share_memory_and_a_worker_process_sees_the_same_values():
    s = scorch.sparse_tensor(torch.tensor([[0., 1.], [2., 0.]]), format="csr")
    assert not s.is_shared()
    assert s.share_memory_() is s and s.is_shared()
    assert all(a.is_shared() for a in s._storage.arrays())
    ctx = mp.get_context("fork")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_double_values, args=(q_in, q_out))
    p.start()
    q_in.put(s)
    assert q_out.get(timeout=60) is True
    p.join(timeout=60)
    assert p.exitcode == 0
    assert torch.equal(s.to_dense(), torch.tensor([[0., 2.], [4., 0.]]))


# --- torch.distributed, two processes -------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dist_worker(rank, world, port, errors):
    import datetime

    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        x = torch.tensor([[0., 1., 0.], [2., 0., 3.]])
        for fmt in ("csr", "coo", "dcsc"):
            s = scorch.sparse_tensor(x * (rank + 1), format=fmt)
            dist.all_reduce(s)
            assert s.format == Format(*{"csr": ("dc",), "coo": ("qq",), "dcsc": ("cc", (1, 0))}[fmt])
            assert torch.equal(s.to_dense(), x * 3), (fmt, s.to_dense())
        b = scorch.sparse_tensor(x * (rank + 5), format="csr")
        dist.broadcast(b, src=1)
        assert torch.equal(b.to_dense(), x * 6)
        g = scorch.sparse_tensor(x * (rank + 1), format="csr")
        outs = [g.clone() for _ in range(world)]
        dist.all_gather(outs, g)
        assert [torch.equal(o.to_dense(), x * (r + 1)) for r, o in enumerate(outs)] == [True, True]
        dense_outs = [torch.zeros(2, 3) for _ in range(world)]
        dist.all_gather(dense_outs, g)
        assert torch.equal(dense_outs[1], x * 2)
        # different patterns: the same clear error on every rank, and the group still works
        d = scorch.sparse_tensor(x if rank == 0 else x.t().contiguous().t() * (x > 1), format="csr")
        try:
            dist.all_reduce(d)
        except RuntimeError as exc:
            assert "same sparsity pattern" in str(exc) and "indices" in str(exc), str(exc)
        else:
            raise AssertionError("all_reduce of different patterns did not raise")
        try:
            dist.reduce_scatter(g.clone(), [g, g])
        except RuntimeError as exc:
            assert "not supported on a scorch SparseTensor" in str(exc), str(exc)
        else:
            raise AssertionError("reduce_scatter did not raise")
        objs = [None, None]
        dist.all_gather_object(objs, g)
        assert [o.format for o in objs] == [Format("dc")] * 2
        assert torch.equal(objs[1].to_dense(), x * 2)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((2,), 2.))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001  (reported to the parent)
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


def test_distributed_collectives_two_processes():
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_dist_worker, args=(r, 2, port, errors)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    assert not alive, f"workers did not finish in time: {messages}"
    assert [p.exitcode for p in procs] == [0, 0], messages
