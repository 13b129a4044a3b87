"""Dense dropout (scorch.nn.dropout) under torch's program tools: torch.fx, torch.func,
forward-mode AD, TorchScript, jit tracing, pickling and copies, batched gradients; and the
size below which torch's own dropout is faster. The ``fast`` fixture lets the fast mask take
any size, so a test of a small input shows the tool (not the size) sending it to torch."""
import copy
import io
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, grad, jvp, vmap

import scorch
from scorch.nn import dropout as D

tF = torch.nn.functional
sF = scorch.nn.functional
FAST = "_DropoutFunctionBackward"


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(D, "MIN_NUMEL", 0)
    monkeypatch.setattr(D, "MIN_NUMEL_GRAD", 0)


def _net(nn):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Dropout(0.5), nn.Linear(5, 1))


class MyDropout(scorch.nn.Dropout):      # a user's subclass (module level: picklable)
    pass


# -- torch.fx ------------------------------------------------------------------------------

def test_fx_records_the_module_as_a_leaf_and_reads_training_when_run(fast):
    model = _net(scorch.nn)
    gm = torch.fx.symbolic_trace(model)
    ref = torch.fx.symbolic_trace(_net(torch.nn))
    ops = lambda g: [(n.op, n.target) for n in g.graph.nodes]
    assert ops(gm) == ops(ref) and ("call_module", "1") in ops(gm)
    assert gm.get_submodule("1") is model[1]
    x = torch.randn(3, 6)
    h = torch.randn(3, 5, requires_grad=True)
    assert type(gm.get_submodule("1")(h).grad_fn).__name__ == FAST   # scorch's mask in training
    torch.manual_seed(10)
    assert not torch.equal(gm(x), gm(x))
    gm.eval()
    model.eval()
    y = gm(x)
    assert torch.equal(y, model(x)) and torch.equal(y, gm(x))   # eval: no dropout, deterministic


def test_fx_of_the_function_records_torchs_dropout(fast):
    gm = torch.fx.symbolic_trace(lambda x: sF.dropout(x, 0.3, True))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [tF.dropout]


# -- pickling and copies ---------------------------------------------------------------------

def test_a_saved_model_is_torchs_and_loads_without_scorch(tmp_path):
    model = _net(scorch.nn)
    model[1].inplace = True
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"scorch" not in buf.getvalue()
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert type(loaded[1]) is torch.nn.Dropout
    assert (loaded[1].p, loaded[1].inplace, loaded[1].training) == (0.5, True, True)
    x = torch.randn(4, 6)
    torch.testing.assert_close(loaded.eval()(x), model.eval()(x))
    path = tmp_path / "model.pt"
    path.write_bytes(buf.getvalue())
    code = (f"import sys, torch; m = torch.load({str(path)!r}, weights_only=False); "
            "print('scorch' in sys.modules, type(m[1]).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "torch.nn.modules.dropout"], out.stderr


def test_copies_keep_the_class_and_a_subclass_pickles_as_itself():
    m = scorch.nn.Dropout(0.3, inplace=True).eval()
    for c in (copy.copy(m), copy.deepcopy(m)):
        assert type(c) is scorch.nn.Dropout and (c.p, c.inplace, c.training) == (0.3, True, False)
    model = _net(scorch.nn)
    twin = copy.deepcopy(model)
    assert type(twin[1]) is scorch.nn.Dropout and twin[0].weight is not model[0].weight
    assert torch.equal(twin[0].weight, model[0].weight)
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
        assert type(pickle.loads(pickle.dumps(m, protocol))) is torch.nn.Dropout
        assert type(pickle.loads(pickle.dumps(MyDropout(0.2), protocol))) is MyDropout


# -- torch.func and forward-mode AD: torch's dropout, so torch's masks for the same seed -------

def _loss(model):
    def loss(params, xi):
        return functional_call(model, params, (xi.unsqueeze(0),)).sum()
    return loss


def test_func_grad_and_per_sample_grads_equal_torchs(fast):
    x = torch.randn(4, 6)
    results = []
    for nn in (scorch.nn, torch.nn):
        model = _net(nn)
        params = {k: v.detach() for k, v in model.named_parameters()}
        torch.manual_seed(1)
        g = grad(_loss(model))(params, x[0])
        torch.manual_seed(2)
        per_sample = vmap(grad(_loss(model)), in_dims=(None, 0), randomness="different")(params, x)
        results.append((g, per_sample))
    for (g, ps), (rg, rps) in zip(*[[(r[0][k], r[1][k]) for k in r[0]] for r in results]):
        assert torch.equal(g, rg) and torch.equal(ps, rps)


@pytest.mark.parametrize("randomness", ["same", "different"])
def test_vmap_of_dropout_equals_torchs(fast, randomness):
    x = torch.ones(4, 16)
    torch.manual_seed(3)
    got = vmap(lambda v: sF.dropout(v, 0.5), randomness=randomness)(x)
    torch.manual_seed(3)
    want = vmap(lambda v: tF.dropout(v, 0.5), randomness=randomness)(x)
    assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="randomness"):     # torch's default refusal
        vmap(lambda v: sF.dropout(v, 0.5))(x)


def test_forward_mode_ad_equals_torchs(fast):
    x, t = torch.randn(3, 4), torch.ones(3, 4)
    outs = []
    for F in (sF, tF):
        torch.manual_seed(4)
        with fwAD.dual_level():
            y = F.dropout(fwAD.make_dual(x, t), 0.5)
            outs.append(fwAD.unpack_dual(y))
        torch.manual_seed(5)
        outs.append(jvp(lambda v: F.dropout(v, 0.5), (x,), (t,)))
    (a, b, c, d) = outs
    assert torch.equal(a.primal, c.primal) and torch.equal(a.tangent, c.tangent)
    assert torch.equal(b[0], d[0]) and torch.equal(b[1], d[1])


# -- the fast backward ---------------------------------------------------------------------

def test_batched_gradients_and_vectorized_jacobians_through_the_fast_mask(fast):
    x = torch.ones(3, 4, requires_grad=True)
    y = sF.dropout(x, 0.5)
    assert type(y.grad_fn).__name__ == FAST
    basis = torch.eye(12).reshape(12, 3, 4)
    g, = torch.autograd.grad(y, x, basis, is_grads_batched=True)
    torch.testing.assert_close(g, basis * y.detach())           # y is the scaled mask (x = 1)

    def f(v):
        torch.manual_seed(6)
        return sF.dropout(v, 0.5)
    J = torch.autograd.functional.jacobian(f, torch.ones(3, 4), vectorize=True)
    torch.testing.assert_close(J.reshape(12, 12), torch.diag(f(torch.ones(3, 4)).reshape(-1)))


def test_gradcheck_double_backward_and_a_zero_gradient_on_the_fast_mask(fast):
    x = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)

    def fixed_mask(t):
        torch.manual_seed(7)
        y = sF.dropout(t, 0.4)
        assert type(y.grad_fn).__name__ == FAST
        return y
    assert torch.autograd.gradcheck(fixed_mask, (x,))
    assert torch.autograd.gradgradcheck(fixed_mask, (x,))
    x = torch.rand(4, 5, requires_grad=True)
    torch.sgn(sF.dropout(x, 0.5)).sum().backward()               # sgn's memoryless zeros
    assert torch.equal(x.grad, torch.zeros(4, 5))


# -- TorchScript and jit tracing -----------------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = scorch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x)))


def test_torchscript_compiles_the_module_and_the_function(fast):
    net = _Net()
    scripted = torch.jit.script(net)
    assert type(net.drop) is scorch.nn.Dropout                   # the eager model is untouched
    x = torch.randn(64, 4)
    h = torch.relu(net.lin(x))
    y = scripted(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], 2 * h[kept])
    assert torch.equal(scripted.eval()(x), h)

    def f(x, training: bool):
        return sF.dropout(x, 0.25, training, inplace=False)

    def g(x, training: bool):
        return tF.dropout(x, 0.25, training, inplace=False)
    sf, sg = torch.jit.script(f), torch.jit.script(g)
    x = torch.randn(8, 8)
    assert torch.equal(sf(x, False), x)
    torch.manual_seed(8)
    a = sf(x, True)
    torch.manual_seed(8)
    assert torch.equal(a, sg(x, True))                           # torch's op, torch's mask


def test_jit_trace_gives_no_tracer_warning(fast):
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(scorch.nn.Dropout(0.5), (torch.ones(8, 8),), check_trace=False)
    assert not torch.equal(traced(torch.ones(8, 8)), traced(torch.ones(8, 8)))


# -- the size threshold --------------------------------------------------------------------

def test_small_inputs_take_torchs_dropout_and_large_ones_the_fast_mask():
    small = torch.randn(D.MIN_NUMEL_GRAD - 1, requires_grad=True)
    large = torch.randn(D.MIN_NUMEL_GRAD, requires_grad=True)
    assert type(sF.dropout(large, 0.1).grad_fn).__name__ == FAST
    assert type(scorch.nn.Dropout(0.1)(large).grad_fn).__name__ == FAST
    for x in (small, small.detach()[:D.MIN_NUMEL - 1]):
        torch.manual_seed(9)
        got = sF.dropout(x, 0.1)
        torch.manual_seed(9)
        assert torch.equal(got, tF.dropout(x, 0.1))             # torch's own, mask for mask
    assert type(sF.dropout(small, 0.1).grad_fn).__name__ != FAST
    x = torch.ones(D.MIN_NUMEL)                                  # no grad: the lower threshold
    torch.manual_seed(9)
    got = sF.dropout(x, 0.5)
    torch.manual_seed(9)
    assert not torch.equal(got, tF.dropout(x, 0.5))             # scorch's own mask
