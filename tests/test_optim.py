"""torch optimizers on sparse parameters: values updated in place, pattern kept, and the
same trajectory as dense training restricted to the pattern."""
import copy

import pytest
from hypothesis import given, settings, strategies as st
import torch

import scorch

F64 = torch.float64


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _problem(fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(8, 6, generator=g) < 0.4
    w0 = torch.rand(8, 6, dtype=F64, generator=g) * mask
    X = torch.rand(6, 4, dtype=F64, generator=g)
    T = torch.rand(8, 4, dtype=F64, generator=g)
    return mask, w0, X, T


OPTIMIZERS = [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.05)),
    ("adam_amsgrad", lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True, weight_decay=0.1)),
    ("adamw", lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
    ("adam_foreach", lambda p: torch.optim.Adam(p, lr=0.05, foreach=True)),
    ("sgd_foreach", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True)),
    # session 17: the other optimizers torch ships, where their steps are values-level ops
    ("rmsprop", lambda p: torch.optim.RMSprop(p, lr=0.01)),
    ("rmsprop_centered", lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True,
                                                       weight_decay=0.1)),
    ("rmsprop_foreach", lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=True)),
    ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1)),          # full_like(p, 0): its state
    ("adagrad_foreach", lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=True)),
    ("adamax", lambda p: torch.optim.Adamax(p, lr=0.05)),
    ("nadam", lambda p: torch.optim.NAdam(p, lr=0.05)),
    ("nadam_foreach", lambda p: torch.optim.NAdam(p, lr=0.05, foreach=True)),
    ("radam", lambda p: torch.optim.RAdam(p, lr=0.05)),
    ("asgd", lambda p: torch.optim.ASGD(p, lr=0.05)),
    ("asgd_foreach", lambda p: torch.optim.ASGD(p, lr=0.05, foreach=True)),
    # session 18: their state on the pattern inside the step (gradients/optimizer_step.py)
    ("adadelta", lambda p: torch.optim.Adadelta(p, lr=0.5, weight_decay=0.01)),
    ("adadelta_foreach", lambda p: torch.optim.Adadelta(p, lr=0.5, foreach=True)),
    ("rprop", lambda p: torch.optim.Rprop(p, lr=0.01)),
    ("rprop_foreach", lambda p: torch.optim.Rprop(p, lr=0.01, foreach=True)),
]


@pytest.mark.parametrize("name,make", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_optimizer_keeps_pattern_and_matches_dense(name, make, fmt):
    mask, w0, X, T = _problem(fmt)
    W = torch.nn.Parameter(scorch.sparse_tensor(w0, format=fmt))
    levels = [lv.crd for lv in W._storage.levels]
    Wd = torch.nn.Parameter(w0.clone())
    opt, opt_d = make([W]), make([Wd])
    for _ in range(4):
        for param, o, mm in ((W, opt, lambda a: _dense(scorch.einsum("ij,jk->ik", a, X))),
                             (Wd, opt_d, lambda a: a @ X)):
            o.zero_grad()
            loss = ((mm(param) - T) ** 2).sum()
            loss.backward()
            if param is Wd:
                param.grad.mul_(mask)          # dense training restricted to the pattern
            o.step()
    assert isinstance(W, scorch.SparseTensor) and W.format == scorch.as_format(fmt, 2)
    assert all(a is b for a, b in zip(levels, [lv.crd for lv in W._storage.levels]))
    torch.testing.assert_close(W.to_dense().detach(), (Wd * mask).detach(), rtol=1e-10, atol=1e-12)
    assert not torch.equal(W.detach().to_dense(), w0)


def test_values_level_ops_check_the_pattern():
    a = scorch.sparse_tensor(torch.eye(3), format="csr")
    b = scorch.sparse_tensor(torch.ones(3, 3), format="csr")
    with pytest.raises(RuntimeError, match="different sparsity pattern"):
        torch.ops.aten.mul_.Tensor(a, b)
    c = a + b                                  # out-of-place add of two patterns: the union
    assert isinstance(c, scorch.SparseTensor)
    assert torch.equal(c.to_dense(), torch.eye(3) + torch.ones(3, 3))
    z = torch.zeros_like(a)
    assert isinstance(z, scorch.SparseTensor) and z.nnz == a.nnz and float(z.values().abs().sum()) == 0
    a2 = scorch.sparse_tensor(torch.eye(3), format="csr")
    a2.add_(a, alpha=2.0)                      # same pattern (equal arrays): values add
    assert torch.equal(a2.to_dense(), 3 * torch.eye(3))


def test_gradient_accumulation_different_patterns():
    """Two gradients on different patterns add as their union (out-of-place add)."""
    a = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="coo")
    b = scorch.sparse_tensor(torch.tensor([[0, 1.0, 0], [0, 0, 0], [0, 0, 0]], dtype=F64), format="coo")
    torch.testing.assert_close((a - b).to_dense(), a.to_dense() - b.to_dense())


def test_values_level_semantics_end_with_the_step():
    """Inside a step (autograd off) ``S + eps`` stays on the pattern; before and after it, in a
    closure (autograd on) and after a step that raised, it is dense as everywhere else."""
    S = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr")
    seen = []

    class Probe(torch.optim.Optimizer):
        def __init__(self, params, fail=False):
            super().__init__(params, {})
            self.fail = fail

        @torch.no_grad()
        def step(self, closure=None):
            seen.append(type(S + 1.0).__name__)
            if closure is not None:
                with torch.enable_grad():
                    seen.append(type(closure()).__name__)
            if self.fail:
                raise ValueError("a step that fails")
    p = torch.nn.Parameter(torch.zeros(1))
    assert type(S + 1.0) is torch.Tensor
    Probe([p]).step(lambda: S + 1.0)
    assert seen == ["SparseTensor", "Tensor"]
    assert type(S + 1.0) is torch.Tensor
    with pytest.raises(ValueError):
        Probe([p], fail=True).step()
    with torch.no_grad():
        assert type(S + 1.0) is torch.Tensor          # the failed step left no mode behind


_OPTIMIZER_MAKERS = dict(OPTIMIZERS)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(_OPTIMIZER_MAKERS)), seed=st.integers(0, 10_000),
       density=st.sampled_from([0.0, 0.2, 0.6, 1.0]), fmt=st.sampled_from(["csr", "csc", "coo", "dcsr"]),
       steps=st.integers(1, 5))
def test_random_problems_train_as_dense_restricted_to_the_pattern(name, seed, density, fmt, steps):
    """Any optimizer above, any pattern (empty and full too), several steps: the sparse
    parameter equals dense training with its gradient masked, and keeps its pattern."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(5, 4, generator=g) < density
    w0 = (torch.rand(5, 4, dtype=F64, generator=g) + 0.1) * mask
    X = torch.rand(4, 3, dtype=F64, generator=g)
    T = torch.rand(5, 3, dtype=F64, generator=g)
    W = torch.nn.Parameter(scorch.sparse_tensor(w0, format=fmt))
    Wd = torch.nn.Parameter(w0.clone())
    opt, opt_d = _OPTIMIZER_MAKERS[name]([W]), _OPTIMIZER_MAKERS[name]([Wd])
    for _ in range(steps):
        for param, o, mm in ((W, opt, lambda a: _dense(scorch.einsum("ij,jk->ik", a, X))),
                             (Wd, opt_d, lambda a: a @ X)):
            o.zero_grad()
            ((mm(param) - T) ** 2).sum().backward()
            if param is Wd:
                param.grad.mul_(mask)
            o.step()
    assert W.nnz == int(mask.sum()) and isinstance(W, scorch.SparseTensor)
    torch.testing.assert_close(W.to_dense().detach(), (Wd * mask).detach(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["adam", "rmsprop", "adagrad"])
def test_step_square_roots_run_on_the_stored_values(name, monkeypatch):
    """An optimizer step's ``sqrt`` of a sparse state runs on its stored values with torch's
    own function, not through the compiler's elementwise path (which a step has no use
    for); the step still matches dense training on the pattern."""
    from scorch.sparse_ops import nonlinear
    make = dict(OPTIMIZERS)[name]
    mask, w0, X, T = _problem("csr", seed=3)
    W = torch.nn.Parameter(scorch.sparse_tensor(w0, format="csr"))
    Wd = torch.nn.Parameter(w0.clone())
    opt, opt_d = make([W]), make([Wd])

    def refuse(*args, **kwargs):
        raise AssertionError("an optimizer step's sqrt went through the compiler")
    for _ in range(3):
        for param, o in ((W, opt), (Wd, opt_d)):
            o.zero_grad()
            mm = _dense(scorch.einsum("ij,jk->ik", param, X)) if param is W else param @ X
            ((mm - T) ** 2).sum().backward()
            if param is Wd:
                param.grad.mul_(mask)
            with monkeypatch.context() as m:
                m.setattr(nonlinear, "differentiable_compute", refuse)
                o.step()
    torch.testing.assert_close(W.to_dense().detach(), (Wd * mask).detach(), rtol=1e-10, atol=1e-12)


# --- session 30: in-place values-level ops move the values' version counter ---------------

@pytest.mark.parametrize("name", ["adam", "adam_foreach", "sgd_momentum", "nadam_foreach",
                                  "adamw", "rmsprop"])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_dense_partner_gradient_reads_the_stepped_values(name, fmt):
    """``X.grad`` of ``A @ X`` reads A's values as A^T keeps them (``kept_conversions``): after
    a step wrote A's values with ``addcdiv_`` / ``lerp_`` / ``_foreach_*`` the kept copy must
    be refreshed, so each step's gradients equal dense training restricted to the pattern."""
    make = _OPTIMIZER_MAKERS_ALL[name]
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(7, 5, generator=g) < 0.5
    a = torch.randn(7, 5, dtype=F64, generator=g) * mask
    X0 = torch.randn(5, 3, dtype=F64, generator=g)
    y = torch.randint(0, 3, (7,), generator=g)
    A = torch.nn.Parameter(scorch.sparse_tensor(a, format=fmt))
    X = torch.nn.Parameter(X0.clone())
    Ad, Xd = torch.nn.Parameter(a.clone()), torch.nn.Parameter(X0.clone())
    opt, opt_d = make([A, X]), make([Ad, Xd])
    for _ in range(4):
        opt.zero_grad()
        opt_d.zero_grad()
        torch.nn.functional.cross_entropy(A @ X, y).backward()
        torch.nn.functional.cross_entropy(Ad @ Xd, y).backward()
        Ad.grad.mul_(mask)
        torch.testing.assert_close(X.grad, Xd.grad, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(A.grad.to_dense(), Ad.grad, rtol=1e-9, atol=1e-12)
        opt.step()
        opt_d.step()
    torch.testing.assert_close(A.detach().to_dense(), (Ad * mask).detach(), rtol=1e-9, atol=1e-12)


_OPTIMIZER_MAKERS_ALL = dict(OPTIMIZERS)

_IN_PLACE_UPDATES = {
    "lerp_": lambda E: E.lerp_(E * 3, 0.5),
    "addcmul_": lambda E: E.addcmul_(E, E, value=0.5),
    "addcdiv_": lambda E: E.addcdiv_(E, E.abs(), value=0.5),
    "sqrt_ of abs": lambda E: E.copy_(E.abs()).sqrt_(),
    "_foreach_lerp_": lambda E: torch._foreach_lerp_([E], [E * 3], 0.5),
    "_foreach_mul_": lambda E: torch._foreach_mul_([E], 2.0),
    "_foreach_add_": lambda E: torch._foreach_add_([E], [E]),
    "_foreach_addcdiv_": lambda E: torch._foreach_addcdiv_([E], [E], [E.abs()], 2.0),
}


@pytest.mark.parametrize("update", sorted(_IN_PLACE_UPDATES))
def test_in_place_values_update_refreshes_kept_conversions(update):
    """A CSC operand read as CSR by a kernel with a CSR partner is kept by the values'
    version; an in-place values-level op (an EMA's ``lerp_``) must move it, forward and
    backward."""
    g = torch.Generator().manual_seed(5)
    A = scorch.sparse_tensor(torch.randn(6, 5, dtype=F64, generator=g)
                             * (torch.rand(6, 5, generator=g) < 0.5), format="csr")
    w = torch.randn(6, 5, dtype=F64, generator=g) * (torch.rand(6, 5, generator=g) < 0.5)
    E = scorch.sparse_tensor(w, format="csc")
    Z = torch.randn(5, 3, dtype=F64, generator=g, requires_grad=True)
    with torch.no_grad():
        for _ in range(4):                   # seen again: the conversion is kept
            A + E
            A * E
    (E.t().t() @ Z).sum().backward()
    version = E._storage.values._version
    with torch.no_grad():
        _IN_PLACE_UPDATES[update](E)
    assert E._storage.values._version > version
    torch.testing.assert_close((A + E).to_dense(), A.to_dense() + E.to_dense())
    torch.testing.assert_close((A * E).to_dense(), A.to_dense() * E.to_dense())
    Z.grad = None
    (E @ Z).sum().backward()
    torch.testing.assert_close(Z.grad, E.to_dense().t() @ torch.ones(6, 3, dtype=F64))


def test_step_hooks_keep_the_dense_meaning():
    """The user's step pre- and post-hooks run in torch's step wrapper but not in the step:
    ``S + 1`` there is dense, as everywhere outside the step's own code."""
    S = scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr")
    W = torch.nn.Parameter(scorch.sparse_tensor(torch.eye(3, dtype=F64), format="csr"))
    seen = []
    opt = torch.optim.SGD([W], lr=0.1)
    opt.register_step_pre_hook(lambda *_: seen.append(S + 1.0))
    opt.register_step_post_hook(lambda *_: seen.append(S + 1.0))
    (W @ torch.ones(3, 2, dtype=F64)).sum().backward()
    with torch.no_grad():                  # hooks run with autograd off, as the step
        opt.step()
    assert len(seen) == 2
    for r in seen:
        assert type(r) is torch.Tensor
        torch.testing.assert_close(r, torch.eye(3, dtype=F64) + 1)
    assert not torch.equal(W.detach().to_dense(), torch.eye(3, dtype=F64))


def test_copy_into_a_detached_alias_reaches_the_parameter():
    """``p.data.copy_(src)`` / ``p.detach().copy_(src)`` (target networks, EMA, SWA's
    AveragedModel) write ``p``: in place where src's pattern equals p's in other arrays
    (a deepcopy, another module), by a new pattern on p and its aliases otherwise. Both
    had silently left p unchanged."""
    import copy
    from torch.optim.swa_utils import AveragedModel
    d = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]], dtype=F64)
    for alias in (lambda t: t.data, lambda t: t.detach()):
        p = torch.nn.Parameter(scorch.sparse_tensor(d, format="csr"))
        with torch.no_grad():
            alias(p).copy_(scorch.sparse_tensor(3 * d, format="csr"))    # own arrays
        assert torch.equal(p.detach().to_dense(), 3 * d) and p.requires_grad
        other = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.0, 5.0]], dtype=F64)
        with torch.no_grad():
            alias(p).copy_(scorch.sparse_tensor(other, format="coo"))    # another pattern
        assert torch.equal(p.detach().to_dense(), other)
    lin = torch.nn.Linear(3, 2, bias=False)
    lin.weight = torch.nn.Parameter(scorch.sparse_tensor(d, format="csr"))
    target, swa = copy.deepcopy(lin), AveragedModel(lin)
    dense = torch.nn.Linear(3, 2, bias=False)
    dense.weight = torch.nn.Parameter(d.clone())
    dense_swa = AveragedModel(dense)
    with torch.no_grad():
        for _ in range(3):
            lin.weight.mul_(0.5)
            dense.weight.mul_(0.5)
            swa.update_parameters(lin)
            dense_swa.update_parameters(dense)
        for tp, op in zip(target.parameters(), lin.parameters()):
            tp.data.copy_(op.data)
    assert torch.equal(target.weight.detach().to_dense(), lin.weight.detach().to_dense())
    assert torch.allclose(swa.module.weight.detach().to_dense(), dense_swa.module.weight.detach())


def test_grad_scaler_lbfgs_and_fused_refusal():
    """``torch.amp.GradScaler("cpu")`` unscales a sparse gradient's stored values (and finds
    an inf there); LBFGS steps a sparse parameter (its flat direction is 0 off the pattern);
    ``fused=True`` refuses with what to use instead. All three had failed inside torch
    with a message about in-place ops the user never called."""
    mask, w0, X, T = _problem("csr")
    W = torch.nn.Parameter(scorch.sparse_tensor(w0, format="csr"))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = torch.optim.SGD([W], lr=0.1)
    scaler.scale(((W @ X - T) ** 2).sum()).backward()
    scaled = W.grad.to_dense().clone()
    scaler.unscale_(opt)
    assert torch.allclose(W.grad.to_dense(), scaled / 1024.0)
    scaler.step(opt)
    scaler.update()
    W.grad._storage.values[0] = float("inf")
    found = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_([W.grad], found, torch.ones(1))
    assert found.item() == 1.0

    W = torch.nn.Parameter(scorch.sparse_tensor(w0, format="csr"))
    opt = torch.optim.LBFGS([W], lr=0.5, max_iter=5)

    def closure():
        opt.zero_grad()
        loss = ((W @ X - T) ** 2).sum()
        loss.backward()
        return loss
    first = closure().item()
    opt.step(closure)
    assert closure().item() < first and W.nnz == int(mask.sum())
    with pytest.raises(RuntimeError, match="outside the sparse tensor's pattern"):
        with torch.no_grad():
            W.add_(torch.ones(W.shape, dtype=W.dtype))
    opt = torch.optim.Adam([W], fused=True)
    closure()
    with pytest.raises(NotImplementedError, match="fused=False"):
        opt.step()


def test_state_from_an_old_pattern_says_how_to_reset_it():
    """A parameter whose pattern changed mid-training (pruning, ``p.data = ...``) meets
    optimizer state on the old pattern: the error says to reset that state, and after
    ``optimizer.state[p] = {}`` training goes on."""
    W = torch.nn.Parameter(scorch.sparse_tensor(torch.tensor([[1.0, 0], [2, 3]]), format="csr"))
    opt = torch.optim.Adam([W])
    x = torch.ones(2, 2)
    (W @ x).sum().backward()
    opt.step()
    opt.zero_grad()
    W.data = scorch.sparse_tensor(torch.tensor([[1.0, 0], [0, 3]]), format="csr")
    (W @ x).sum().backward()
    with pytest.raises(RuntimeError, match=r"optimizer\.state\[p\] = \{\}"):
        opt.step()
    opt.state[W] = {}
    opt.step()
    assert W.nnz == 2


@pytest.mark.parametrize("fmt", ["coo", "csc"])
def test_resuming_into_a_parameter_of_another_format(fmt):
    """An optimizer checkpoint saved from a CSR parameter, loaded for the same weight built
    as COO / CSC: load_state_dict casts dtype and device, not format; the step converts the
    state once (each update's first op raised that the pattern differed)."""
    g = torch.Generator().manual_seed(7)
    d = torch.randn(20, 15, generator=g) * (torch.rand(20, 15, generator=g) < 0.3)
    x = torch.randn(8, 15, generator=g)

    def step(W, opt):
        opt.zero_grad()
        (x @ W.t()).square().sum().backward()
        opt.step()

    W = torch.nn.Parameter(scorch.sparse_tensor(d, format="csr"))
    opt = torch.optim.Adam([W], lr=0.01)
    step(W, opt)
    saved = copy.deepcopy(opt.state_dict())
    W2 = torch.nn.Parameter(scorch.sparse_tensor(W.detach().to_dense(), format=fmt))
    opt2 = torch.optim.Adam([W2], lr=0.01)
    opt2.load_state_dict(saved)
    step(W, opt)
    step(W2, opt2)
    assert opt2.state[W2]["exp_avg"].format == W2.format
    torch.testing.assert_close(W2.detach().to_dense(), W.detach().to_dense(), rtol=1e-5, atol=1e-5)
