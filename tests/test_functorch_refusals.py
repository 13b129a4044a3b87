"""Autograd beyond ``.backward()`` (session 36): torch.func transforms and forward-mode AD
with a sparse operand refuse clearly (never zeros or a dense off-pattern result), gradients
with respect to a sparse intermediate are right or refused, clone / detach under no_grad and
inference_mode behave as dense torch's, a multi-grad hook sees a sparse leaf once, and
zero-keeping functions of a complex sparse tensor stay in the graph."""
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.autograd.functional as AF
import torch.nn.functional as F
from torch import func as tf

import scorch

F64 = torch.float64
TRANSFORM = "torch.func transforms"


def _dense(seed=0, shape=(5, 4)):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(*shape, dtype=F64, generator=g) * (torch.rand(*shape, generator=g) < 0.5)
    d[0, 0] = 1.0
    return d


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --- torch.func transforms (bugs 1, 7, 8) ------------------------------------------------------

def _transform_cases():
    d = _dense()
    A = scorch.sparse_tensor(d, format="csr")
    x = torch.randn(4, dtype=F64)
    X = torch.randn(4, 3, dtype=F64)
    idx = torch.nonzero(d).t()
    vals = d[d != 0]
    Ar = scorch.sparse_tensor(d, format="csr").requires_grad_()
    return {
        "jacfwd": lambda: tf.jacfwd(lambda a: a @ x)(A),
        "hessian": lambda: tf.hessian(lambda a: (a @ x).pow(2).sum())(A),
        "jacfwd of relu": lambda: tf.jacfwd(lambda a: torch.relu(a).sum(0))(A),
        "grad": lambda: tf.grad(lambda a: (a @ X).pow(2).sum())(A),
        "vjp": lambda: tf.vjp(lambda a: a @ X, A),
        "jacrev": lambda: tf.jacrev(lambda a: a @ x)(A),
        "grad of a * 3": lambda: tf.grad(lambda a: (a * 3).sum())(A),
        "vmap build": lambda: tf.vmap(lambda v: scorch.sparse_tensor((idx, v), size=(5, 4)) @ X)(
            torch.stack([vals, vals])),
        "grad build": lambda: tf.grad(lambda v: (scorch.sparse_tensor((idx, v), size=(5, 4)) @ X)
                                      .sum())(vals),
        "jvp build": lambda: tf.jvp(lambda t: scorch.sparse_tensor(t, format="csr") @ X,
                                    (d,), (torch.ones_like(d),)),
        "jvp linear": lambda: tf.jvp(lambda a: F.linear(X.t(), a), (A,), (torch.ones_like(d),)),
        "jvp t @ v": lambda: tf.jvp(lambda a: a.t() @ torch.ones(5, dtype=F64), (A,),
                                    (torch.ones_like(d),)),
        "AF.jacobian sparse out": lambda: AF.jacobian(lambda t: A * t, x, vectorize=True),
        "AF.jacobian forward": lambda: AF.jacobian(lambda a: a @ x, A, vectorize=True,
                                                   strategy="forward-mode"),
        "AF.hessian": lambda: AF.hessian(lambda a: (a @ x).pow(2).sum(), A, vectorize=True),
        "is_grads_batched": lambda: torch.autograd.grad(
            Ar * 3.0, [Ar], grad_outputs=torch.randn(2, 5, 4, dtype=F64), is_grads_batched=True),
        "grad of constant to_dense": lambda: tf.grad(lambda t: (A.to_dense() * t).sum())(
            torch.randn(5, 4, dtype=F64)),
        "vmap": lambda: tf.vmap(lambda t: A @ t)(torch.randn(2, 4, dtype=F64)),
    }


@pytest.mark.parametrize("name", list(_transform_cases()))
def test_a_transform_with_a_sparse_tensor_refuses_naming_autograd_grad(name):
    with pytest.raises(NotImplementedError, match=TRANSFORM) as info:
        _transform_cases()[name]()
    assert "torch.autograd.grad" in str(info.value)


def test_large_grad_refuses_before_the_dense_fallback():
    n = 200_000
    idx = torch.stack([torch.arange(n), torch.arange(n)])
    B = scorch.sparse_tensor((idx, torch.ones(n, dtype=F64)), size=(n, n), format="csr")
    Y = torch.randn(n, 2, dtype=F64)
    with pytest.raises(NotImplementedError, match=TRANSFORM):
        tf.grad(lambda b: (b @ Y).sum())(B)


def test_reverse_mode_still_works_and_matches_dense():
    """What the refusal points at: autograd.grad and AF.jacobian (vectorize=False)."""
    d = _dense()
    x = torch.randn(4, dtype=F64)
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    g, = torch.autograd.grad((A @ x).pow(2).sum(), A)
    D = d.clone().requires_grad_()
    gd, = torch.autograd.grad((D @ x).pow(2).sum(), D)
    torch.testing.assert_close(g.to_dense(), gd * (d != 0))
    J = AF.jacobian(lambda t: (scorch.sparse_tensor(d, format="csr") @ t), x)
    torch.testing.assert_close(J, d)
    # functional_call without a transform is a plain call
    m = torch.nn.Linear(4, 5, bias=False, dtype=F64)
    out = tf.functional_call(m, {"weight": scorch.sparse_tensor(d, format="csr")}, (x,))
    torch.testing.assert_close(out, d @ x)


# --- forward-mode AD (bugs 2, 3) ----------------------------------------------------------------

@pytest.mark.parametrize("sparse_tangent", [False, True])
def test_make_dual_with_a_sparse_primal_refuses(sparse_tangent):
    d = _dense()
    A = scorch.sparse_tensor(d, format="csr")
    T = d * 2
    tan = scorch.sparse_tensor(T, format="csr") if sparse_tangent else T
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            fwAD.make_dual(A, tan)


def test_make_dual_with_a_sparse_tangent_refuses():
    d = _dense()
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            fwAD.make_dual(d, scorch.sparse_tensor(d, format="csr"))


def test_building_a_sparse_tensor_from_a_dual_refuses_as_torch():
    d = _dense()
    idx = torch.tensor([[0, 1, 2], [0, 1, 2]])
    with fwAD.dual_level():
        xd = fwAD.make_dual(d, torch.ones_like(d))
        with pytest.raises(NotImplementedError):
            xd.to_sparse()                                  # dense torch refuses too
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            scorch.sparse_tensor(xd, format="csr")
        v = fwAD.make_dual(torch.ones(3, dtype=F64), torch.tensor([1.0, 2.0, 3.0], dtype=F64))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            scorch.sparse_tensor((idx, v), size=(3, 3))
        # a plain (non-dual) tensor inside the level still builds
        S = scorch.sparse_tensor(d, format="csr")
        torch.testing.assert_close(S.to_dense(), d)


# --- gradient with respect to a sparse intermediate (bug 4) -------------------------------------

_CHAINS = {"relu": lambda M: torch.relu(M).sum(), "sin": lambda M: (M * 3).sin().sum(),
           "square": lambda M: (M * M).sum()}


@pytest.mark.parametrize("name", list(_CHAINS))
@pytest.mark.parametrize("how", ["allow_unused", "materialize", "backward_inputs", "plain"])
def test_grad_of_a_read_through_intermediate_refuses(name, how):
    d = _dense(1, (6, 6)) + torch.eye(6, dtype=F64)
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    M = A * 2.0
    out = _CHAINS[name](M)
    with pytest.raises(RuntimeError, match="retain_grad"):
        if how == "backward_inputs":
            out.backward(inputs=[M])
        else:
            torch.autograd.grad(out, [M], allow_unused=how != "plain",
                                materialize_grads=how == "materialize")


@pytest.mark.parametrize("name", list(_CHAINS))
def test_grad_of_an_intermediate_with_retain_grad_matches_dense(name):
    d = _dense(1, (6, 6)) + torch.eye(6, dtype=F64)
    Dd = d.clone().requires_grad_()
    Md = Dd * 2.0
    ref, = torch.autograd.grad(_CHAINS[name](Md), [Md])
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    M = A * 2.0
    M.retain_grad()
    g, = torch.autograd.grad(_CHAINS[name](M), [M], allow_unused=True)
    torch.testing.assert_close(g.to_dense(), ref * (d != 0))
    M2 = A * 2.0
    M2.retain_grad()
    _CHAINS[name](M2).backward(inputs=[M2])
    torch.testing.assert_close(M2.grad.to_dense(), ref * (d != 0))


def test_grad_of_an_intermediate_used_through_its_node_is_unaffected():
    d = _dense()
    X = torch.randn(4, 3, dtype=F64)
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    M = A * 2.0
    g, = torch.autograd.grad((M @ X).sum(), [M])
    torch.testing.assert_close(g.to_dense(), (torch.ones(5, 3, dtype=F64) @ X.t()) * (d != 0))


# --- clone / detach under no_grad and inference_mode (bugs 5, 6) --------------------------------

@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_clone_without_grad_mode_does_not_require_grad(ctx):
    d = _dense()
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    with ctx():
        C, C2 = A.clone(), torch.clone(A)
    assert not C.requires_grad and not C2.requires_grad
    torch.testing.assert_close(C.to_dense(), d)
    assert not (C @ torch.randn(4, 2, dtype=F64)).requires_grad


def test_clone_in_grad_mode_is_in_the_graph():
    d = _dense()
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    C = A.clone()
    assert C.requires_grad and not C.is_leaf
    W = torch.randn(5, 4, dtype=F64)
    (C.to_dense() * W).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), W * (d != 0))


def test_detach_and_state_dict_under_inference_mode():
    d = torch.eye(4)
    A = scorch.sparse_tensor(d, format="csr")
    Ar = scorch.sparse_tensor(d, format="csr").requires_grad_()
    m = torch.nn.Linear(4, 4)
    m.weight = torch.nn.Parameter(scorch.sparse_tensor(d, format="csr"))
    with torch.inference_mode():
        for t in (A.detach(), Ar.detach(), torch.detach(A)):
            assert not t.requires_grad
            torch.testing.assert_close(t.to_dense(), d)
        sd = m.state_dict()
        ps = [p.detach() for p in m.parameters()]
        made = scorch.sparse_tensor(d, format="csr")   # an inference tensor, detached too
        assert made.detach().is_inference()
    torch.testing.assert_close(sd["weight"].to_dense(), d)
    ps[0].values().mul_(3)                               # a detach shares the values
    torch.testing.assert_close(m.weight.to_dense(), 3 * d)


# --- register_multi_grad_hook (bug 7) -----------------------------------------------------------

def test_multi_grad_hook_with_a_sparse_leaf_fires_once_with_both():
    d = _dense(2, (6, 6)) + torch.eye(6, dtype=F64)
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    X = torch.randn(6, 3, dtype=F64, requires_grad=True)
    calls = []
    torch.autograd.graph.register_multi_grad_hook((A, X), lambda gs: calls.append(gs))
    (A @ X).pow(2).sum().backward()
    assert len(calls) == 1 and all(g is not None for g in calls[0])
    Dd = d.clone().requires_grad_()
    (Dd @ X.detach()).pow(2).sum().backward()
    torch.testing.assert_close(calls[0][0].to_dense(), Dd.grad * (d != 0))
    edge = torch.autograd.graph.get_gradient_edge(A)
    assert type(edge.node).__name__ == "AccumulateGrad"


def test_same_shape_views_of_a_leaf_keep_their_gradient():
    d = _dense()
    A = scorch.sparse_tensor(d, format="csr").requires_grad_()
    W = torch.randn(4, 5, dtype=F64)
    (A.view_as(A).t().to_dense() * W).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), W.t() * (d != 0))
    V = A.t()
    with torch.no_grad():
        A.values().mul_(2)                    # a change after the view: the backward refuses
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        V.to_dense().sum().backward()


# --- complex zero-keeping functions (h1 bug 6) --------------------------------------------------

_COMPLEX_FNS = {"abs": torch.abs, "sqrt": torch.sqrt, "square": torch.square, "sin": torch.sin,
                "tanh": torch.tanh, "pow2": lambda x: x ** 2, "pow3": lambda x: torch.pow(x, 3),
                "expm1": torch.expm1, "log1p": torch.log1p, "sinh": torch.sinh, "tan": torch.tan,
                "asin": torch.asin, "atan": torch.atan}


@pytest.mark.parametrize("name", list(_COMPLEX_FNS))
def test_complex_zero_keeping_function_is_differentiable(name):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 5, generator=g) * 0.5
    base[torch.rand(4, 5, generator=g) < 0.5] = 0
    z = (base + 0.5j * torch.randn(4, 5, generator=g) * (base != 0)).to(torch.complex128)
    f = _COMPLEX_FNS[name]
    S = scorch.sparse_tensor(z, format="csr").requires_grad_()
    r = f(S)
    assert r.requires_grad
    W = torch.randn(4, 5, dtype=F64, generator=g)
    (r.to_dense().abs() * W).sum().backward()
    D = z.clone().requires_grad_()
    (f(D).abs() * W).sum().backward()
    mask = z != 0
    torch.testing.assert_close(S.grad.to_dense()[mask], D.grad[mask])
