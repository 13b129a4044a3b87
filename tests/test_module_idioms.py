"""torch.nn module machinery with sparse parameters and inputs, as a PyTorch user writes it
(each found by a red-team sweep; each test fails on the old code): a dense copy of a sparse
parameter's values comes back on its pattern, stored zeros included (``copy_``,
``load_state_dict``, ``vector_to_parameters``); a gradient rescaled out of place stays a
gradient optimizers take; a module hook on a sparse leaf input."""
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import scorch


def _layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 6, generator=g) * (torch.rand(8, 6, generator=g) < 0.5)
    torch.manual_seed(seed)                          # the bias
    lin = torch.nn.Linear(6, 8)
    lin.weight = torch.nn.Parameter(scorch.sparse_tensor(w, format="csr"))
    return lin, int((w != 0).sum())


@pytest.mark.parametrize("how", ["copy_", "load_state_dict", "vector_to_parameters", "data"])
def test_dense_values_come_back_on_the_pattern_with_stored_zeros(how):
    lin, nnz = _layer()
    torch.nn.init.zeros_(lin.weight)                 # every stored value 0
    assert lin.weight.nnz == nnz
    dense = lin.weight.detach().to_dense()
    if how == "copy_":
        with torch.no_grad():
            lin.weight.copy_(dense)
    elif how == "load_state_dict":
        lin.load_state_dict({"weight": dense, "bias": lin.bias.detach().clone()})
    elif how == "vector_to_parameters":
        vector_to_parameters(parameters_to_vector(lin.parameters()), lin.parameters())
    else:
        lin.weight.data = dense
    assert lin.weight.nnz == nnz
    lin(torch.randn(4, 6)).sum().backward()
    assert lin.weight.grad.nnz == nnz                # every entry still trains


def test_dense_values_off_the_pattern_still_rebuild_it():
    lin, nnz = _layer()
    full = torch.ones(8, 6)
    with torch.no_grad():
        lin.weight.copy_(full)
    assert lin.weight.nnz == 48 and torch.equal(lin.weight.to_dense(), full)


@pytest.mark.parametrize("make", ["Adam", "AdamW", "RMSprop", "NAdam", "Adagrad-maximize"])
def test_a_gradient_rescaled_out_of_place_is_still_taken(make):
    results = []
    for scale_in_place in (False, True):
        lin, _ = _layer(1)
        name, _, option = make.partition("-")
        opt = getattr(torch.optim, name)(lin.parameters(), lr=0.1, **({"maximize": True} if option else {}))
        lin(torch.randn(4, 6, generator=torch.Generator().manual_seed(2))).sum().backward()
        if scale_in_place:
            lin.weight.grad.div_(4)
        else:
            lin.weight.grad = lin.weight.grad / 4        # gradient accumulation's normalisation
            assert not lin.weight.grad.is_sparse
        opt.step()
        results.append(lin.weight.detach().to_dense())
    torch.testing.assert_close(results[0], results[1])


def test_negated_and_scaled_gradients_keep_the_flag():
    lin, _ = _layer()
    lin(torch.randn(3, 6)).sum().backward()
    g = lin.weight.grad
    for h in (-g, g * 0.5, g / 4, g + g, torch.neg(g), g.mul(2)):
        assert not h.is_sparse
    assert lin.weight.is_sparse and (lin.weight.detach() * 2).is_sparse


def test_full_backward_hook_with_a_sparse_leaf_input():
    torch.manual_seed(0)
    x = torch.randn(5, 8) * (torch.rand(5, 8) < 0.4)
    H = torch.randn(8, 6)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, A, H):
            return torch.relu(A @ self.lin(H))
    m = Layer()
    seen = []
    m.register_full_backward_hook(lambda mod, gin, gout: seen.append(len(gin)))
    A = scorch.sparse_tensor(x, format="csr", requires_grad=True)
    m(A, H).sum().backward()
    ref = x.clone().requires_grad_()
    m(ref, H).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), ref.grad * (x != 0))
    assert seen
    assert A.view_as(A) is not A and A.reshape(A.shape) is not A


def test_vectorized_jacobian_says_what_is_unsupported():
    """``jacobian(vectorize=True)`` vmaps the backward (no transform on functorch's stack):
    the documented NotImplementedError, not "Cannot access data pointer"; vectorize=False
    works."""
    from torch.autograd.functional import jacobian
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    S = scorch.sparse_tensor(d, format="csr")
    x = torch.randn(3, 2, dtype=torch.float64)
    torch.testing.assert_close(jacobian(lambda X: S @ X, x), jacobian(lambda X: d @ X, x))
    with pytest.raises(NotImplementedError, match="vectorize=True"):
        jacobian(lambda X: S @ X, x, vectorize=True)


@pytest.mark.parametrize("make", ["Adamax", "RAdam"])
def test_foreach_optimizers_on_a_sparse_parameter(make):
    """Their foreach steps call ``_foreach_abs_`` / ``_foreach_reciprocal_`` on the state:
    on the pattern, the same update as the loop form."""
    results = []
    for foreach in (False, True):
        lin, _ = _layer(3)
        opt = getattr(torch.optim, make)(lin.parameters(), lr=0.1, foreach=foreach)
        for step in range(3):
            opt.zero_grad()
            lin(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).pow(2).sum().backward()
            opt.step()
        results.append(lin.weight.detach().to_dense())
    torch.testing.assert_close(results[0], results[1])


def test_gradient_clipping_with_foreach():
    """``clip_grad_value_`` / ``clip_grad_norm_`` with foreach=True: the loop form's result;
    the norm from the stored values (a 200k x 200k gradient is never made dense)."""
    from torch.nn.utils import clip_grad_norm_, clip_grad_value_
    got = []
    for foreach in (False, True):
        lin, _ = _layer(4)
        lin(torch.randn(4, 6, generator=torch.Generator().manual_seed(0))).pow(2).sum().backward()
        clip_grad_value_(lin.parameters(), 0.5, foreach=foreach)
        got.append(lin.weight.grad.to_dense())
    torch.testing.assert_close(got[0], got[1])
    assert got[0].abs().max() <= 0.5
    n = 200_000
    idx = torch.randint(0, n, (2, n), generator=torch.Generator().manual_seed(0))
    norms = []
    for foreach in (False, True):
        B = torch.nn.Parameter(scorch.sparse_tensor((idx, torch.ones(n)), size=(n, n), format="csr"))
        (B * B).sum().backward()
        norms.append(clip_grad_norm_([B], 1.0, foreach=foreach))
        assert B.grad.nnz == B.nnz
    torch.testing.assert_close(norms[0], norms[1])
    for ord_ in (1.0, float("inf"), 0.0):
        B.grad = None
        (B * B).sum().backward()
        want = torch.linalg.vector_norm(B.grad.values(), ord_)
        torch.testing.assert_close(torch._foreach_norm([B.grad], ord_)[0], want)


def test_clamping_a_sparse_tensor_in_place_past_zero_is_refused():
    S = scorch.sparse_tensor(torch.tensor([[1.0, 0.0], [0.0, -2.0]]))
    with pytest.raises(RuntimeError, match="unstored zeros"):
        torch._foreach_clamp_min_([S], 0.5)
    torch._foreach_clamp_max_([S], 0.5)                  # keeps 0 at 0: on the values
    assert torch.equal(S.to_dense(), torch.tensor([[0.5, 0.0], [0.0, -2.0]]))
    with pytest.raises(RuntimeError, match="unstored zeros inf"):
        S.reciprocal_()


def test_a_torch_coo_incoming_gradient():
    """``grad_outputs=`` / ``backward(gradient=)`` with a torch COO for a scorch sparse
    output: as the same gradient given dense or as a scorch tensor."""
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    g = torch.tensor([[2.0, 0.0, 2.0], [0.0, 2.0, 0.0]])
    for grad in (g, g.to_sparse(), scorch.sparse_tensor(g)):
        A = scorch.sparse_tensor(d, format="csr").requires_grad_()
        (got,) = torch.autograd.grad(A * 3, A, grad)
        assert torch.equal(got.to_dense(), torch.tensor([[6.0, 0.0, 6.0], [0.0, 6.0, 0.0]]))


def _linear_with(w: torch.Tensor, sparse: bool) -> torch.nn.Linear:
    """A Linear (seeded bias) holding ``w`` as its weight, as a CSR tensor or dense."""
    torch.manual_seed(0)
    m = torch.nn.Linear(w.shape[1], w.shape[0])
    m.weight = torch.nn.Parameter(scorch.sparse_tensor(w, format="csr") if sparse else w.clone())
    return m


@pytest.mark.parametrize("kind", ["utils", "parametrizations"])
@pytest.mark.parametrize("dim", [0, 1])
def test_weight_norm_of_a_sparse_weight(kind, dim):
    """``w = g * v / ||v||`` (norms over all dims but ``dim``) keeps ``v``'s pattern: values
    and the gradients of ``g`` and ``v`` are the dense module's (``v``'s on its pattern)."""
    from torch.nn.utils import parametrizations
    g = torch.Generator().manual_seed(dim)
    w = torch.randn(4, 6, generator=g) * (torch.rand(4, 6, generator=g) < 0.6)
    w[:, 0] = 1.0                                    # no all-zero slice in either dim
    w[0, :] = 1.0
    x = torch.randn(3, 6, generator=g)
    wrap = torch.nn.utils.weight_norm if kind == "utils" else parametrizations.weight_norm
    out, grads = [], []
    for sparse in (True, False):
        m = wrap(_linear_with(w, sparse), dim=dim)
        y = m(x)
        y.pow(2).sum().backward()
        out.append(y)
        params = dict(m.named_parameters())
        gname = "weight_g" if kind == "utils" else "parametrizations.weight.original0"
        vname = "weight_v" if kind == "utils" else "parametrizations.weight.original1"
        gv = params[vname].grad
        grads.append((params[gname].grad, gv.to_dense() if isinstance(gv, scorch.SparseTensor) else gv * (w != 0)))
    torch.testing.assert_close(out[0], out[1])
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_adagrad_initial_accumulator_on_the_pattern():
    """``Adagrad(initial_accumulator_value=0.1)`` makes its state with ``full_like`` in
    ``__init__``: on the parameter's pattern, the same steps as the dense parameter's on
    it; outside an optimizer a non-zero ``full_like`` stays dense."""
    results = []
    for sparse in (True, False):
        lin, _ = _layer(5)
        if not sparse:
            lin.weight = torch.nn.Parameter(lin.weight.detach().to_dense())
        opt = torch.optim.Adagrad(lin.parameters(), lr=0.1, initial_accumulator_value=0.1)
        for step in range(3):
            opt.zero_grad()
            lin(torch.randn(4, 6, generator=torch.Generator().manual_seed(step))).pow(2).sum().backward()
            if not sparse:
                lin.weight.grad *= (lin.weight.detach() != 0)   # on the pattern
            opt.step()
        results.append(lin.weight.detach().to_dense())
    torch.testing.assert_close(results[0], results[1] * (results[0] != 0))
    S = scorch.sparse_tensor(torch.eye(3))
    assert not isinstance(torch.full_like(S, 0.5), scorch.SparseTensor)


@pytest.mark.parametrize("kind", ["utils", "parametrizations"])
def test_spectral_norm_of_a_sparse_weight(kind):
    """``spectral_norm`` draws ``u, v`` with ``weight.new_empty(h).normal_()``: ``new_empty`` is
    dense (a pattern would refuse the fill), and ``W / sigma`` keeps the weight's pattern; no
    warning (``sigma`` requires grad)."""
    import warnings
    from torch.nn.utils import parametrizations
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 6, generator=g) * (torch.rand(5, 6, generator=g) < 0.6)
    x = torch.randn(3, 6, generator=g)
    wrap = torch.nn.utils.spectral_norm if kind == "utils" else parametrizations.spectral_norm
    out, grads = [], []
    for sparse in (True, False):
        m = _linear_with(w, sparse)
        torch.manual_seed(1)
        m = wrap(m)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = m(x)
            y.pow(2).sum().backward()
        if sparse:
            assert isinstance(m.weight, scorch.SparseTensor)
        out.append(y)
        orig = m.weight_orig if kind == "utils" else m.parametrizations.weight.original
        grads.append(orig.grad.to_dense() if sparse else orig.grad * (w != 0))
    torch.testing.assert_close(out[0], out[1])
    torch.testing.assert_close(grads[0], grads[1])
