"""scorch under torch.compile (issue 16): compiled functions that mix scorch sparse tensors
and dense tensors give the eager result, forward and backward, with the default backend
(inductor). Compiles are kept few and small: each test compiles one function once or twice."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import scorch
from scorch import library_ops
from scorch.nn import functional as F

DT = torch.float64


def _sparse(shape, density, fmt, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(*shape, generator=g, dtype=DT)
    d[torch.rand(*shape, generator=g) > density] = 0
    return d, scorch.sparse_tensor(d, format=fmt, requires_grad=requires_grad)


def _dense(*shape, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DT).requires_grad_(requires_grad)


def gcn_layer(A, X, W):
    return torch.relu(A @ (X @ W))


def attention(M, Q, K, V):
    scores = scorch.einsum("ij,id,jd->ij", M, Q, K) / Q.shape[1] ** 0.5   # SDDMM
    return scorch.sparse.softmax(scores, dim=1) @ V                       # SpMM


class SparseLinear(torch.nn.Module):
    """A layer whose weight is a scorch sparse parameter, compiled as a whole."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.nn.Parameter(torch.linspace(-1, 1, weight.shape[0], dtype=weight.dtype))

    def forward(self, x):
        return torch.tanh(F.linear(x, self.weight, self.bias))


def _grads(out, inputs):
    return torch.autograd.grad(out.square().sum(), inputs)


def _to_dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


def _check_same(compiled, eager, inputs):
    torch.testing.assert_close(compiled, eager)
    for gc, ge in zip(_grads(compiled, inputs), _grads(eager, inputs)):
        torch.testing.assert_close(_to_dense(gc), _to_dense(ge))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_gcn_layer_forward_backward(fmt):
    _, A = _sparse((7, 6), 0.4, fmt, seed=1)
    X, W = _dense(6, 5, seed=2), _dense(5, 3, seed=3)
    f = torch.compile(gcn_layer)
    _check_same(f(A, X, W), gcn_layer(A, X, W), [X, W])
    # another pattern of the same format: right too (a guard or a recompile, never stale)
    _, A2 = _sparse((7, 6), 0.7, fmt, seed=4)
    _check_same(f(A2, X, W), gcn_layer(A2, X, W), [X, W])


def test_gcn_layer_sparse_operand_gradient():
    _, A = _sparse((6, 6), 0.5, "csr", seed=5, requires_grad=True)
    X, W = _dense(6, 4, seed=6), _dense(4, 2, seed=7)
    f = torch.compile(gcn_layer)
    out, ref = f(A, X, W), gcn_layer(A, X, W)
    torch.testing.assert_close(out, ref)
    gA, gX = _grads(out, [A, X])
    rA, rX = _grads(ref, [A, X])
    assert isinstance(gA, scorch.SparseTensor) and gA.format == A.format and not gA.is_sparse
    torch.testing.assert_close(gA.to_dense(), rA.to_dense())
    torch.testing.assert_close(gX, rX)
    assert _graphs_and_breaks(gcn_layer, A, X, W) == (1, 0)


def test_attention_with_a_trained_sparse_mask():
    _, M = _sparse((5, 5), 0.6, "csr", seed=42, requires_grad=True)
    Q, K, V = (_dense(5, 3, seed=s) for s in (43, 44, 45))
    out = torch.compile(attention)(M, Q, K, V)
    _check_same(out, attention(M, Q, K, V), [M, Q, K, V])
    assert _graphs_and_breaks(attention, M, Q, K, V) == (1, 0)


def test_attention_sddmm_softmax_spmm():
    _, M = _sparse((6, 6), 0.5, "csr", seed=8)
    Q, K, V = (_dense(6, 4, seed=s) for s in (9, 10, 11))
    out = torch.compile(attention)(M, Q, K, V)
    _check_same(out, attention(M, Q, K, V), [Q, K, V])


def test_sparse_weight_linear_module_compiled_whole():
    _, Wt = _sparse((4, 6), 0.5, "csr", seed=12)
    eager = SparseLinear(Wt)
    compiled = torch.compile(eager)
    x = _dense(3, 6, seed=13, requires_grad=False)
    out, ref = compiled(x), eager(x)
    torch.testing.assert_close(out, ref)
    params = [eager.weight, eager.bias]
    for gc, ge in zip(_grads(out, params), _grads(ref, params)):
        assert type(gc) is type(ge)
        torch.testing.assert_close(_to_dense(gc), _to_dense(ge))
    assert _graphs_and_breaks(eager, x) == (1, 0)


def test_compiled_training_with_adam_matches_eager():
    """The sparse weight's compiled gradient is a gradient on its pattern (is_sparse
    False), so Adam takes it, and steps match the eager ones."""
    _, Wt = _sparse((4, 6), 0.5, "csr", seed=40)
    x = _dense(3, 6, seed=41, requires_grad=False)
    models = [SparseLinear(Wt.detach().clone()), SparseLinear(Wt.detach().clone())]
    runs = [torch.compile(models[0]), models[1]]
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in models]
    for _ in range(3):
        for run, opt in zip(runs, opts):
            opt.zero_grad()
            run(x).square().sum().backward()
            opt.step()
    assert isinstance(models[0].weight, scorch.SparseTensor)
    torch.testing.assert_close(models[0].weight.to_dense(), models[1].weight.to_dense())
    torch.testing.assert_close(models[0].bias, models[1].bias)



class TwoLayerGCN(torch.nn.Module):
    """examples/gcn.py's model in small: relu, dropout between the two sparse products."""

    def __init__(self, n_in, hidden, n_out, p):
        super().__init__()
        g = torch.Generator().manual_seed(51)
        self.w1 = torch.nn.Parameter(torch.randn(n_in, hidden, generator=g, dtype=DT))
        self.w2 = torch.nn.Parameter(torch.randn(hidden, n_out, generator=g, dtype=DT))
        self.p = p
        self.dropout = F.dropout

    def forward(self, A, X):
        h = self.dropout(torch.relu(A @ (X @ self.w1)), self.p, self.training)
        return A @ (h @ self.w2)


def test_gcn_with_dropout_compiled_with_the_documented_options_matches_eager():
    """docs/torch_compile.md's CPU options for a model with dropout (``cpp.simdlen`` 1:
    no vectorized bool-mask stores; ``fallback_random``: eager's dropout kernel) keep
    scorch in one graph, and with ``fallback_random`` the masks are eager torch's, seed for
    seed (Dynamo traces torch's dropout for scorch's ``F.dropout``, whose eager masks come
    from its own RNG: tests/test_nn_dropout.py)."""
    _, A = _sparse((9, 9), 0.4, "csr", seed=52)
    X = _dense(9, 5, seed=53, requires_grad=False)
    model = TwoLayerGCN(5, 16, 3, 0.5)
    compiled = torch.compile(model, options={"fallback_random": True, "cpp.simdlen": 1})
    params = list(model.parameters())
    results = []
    for run in (compiled, model):
        torch.manual_seed(54)
        if run is model:
            model.dropout = torch.nn.functional.dropout
        out = run(A, X)
        results.append((out, _grads(out, params)))
    model.dropout = F.dropout
    (out, grads), (ref, ref_grads) = results
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert _graphs_and_breaks(model, A, X) == (1, 0)
    with torch.no_grad():
        undropped = model.eval()(A, X)
    assert not torch.allclose(ref, undropped)   # dropout acted: equal masks are a real check


def test_backward_saves_no_dense_operand_it_does_not_read():
    """``A @ H``'s gradient for H reads A only: H (an activation in a GCN) is not saved;
    when A's values want a gradient too (an SDDMM with H), it is."""
    a, A = _sparse((5, 4), 0.5, "csr", seed=55)
    H = _dense(4, 3, seed=56)
    key, arrays = _op_args("ij,jk->ik", A, H)
    out = torch.ops.scorch.einsum(key, arrays)
    saved = out.grad_fn.saved_tensors
    assert saved[-1] is None and all(t is not None for t in saved[:-1])
    g, = torch.autograd.grad(out.square().sum(), [H])
    torch.testing.assert_close(g, a.T @ (2 * (a @ H.detach())))
    arrays[-2].requires_grad_(True)        # A's values
    out = torch.ops.scorch.einsum(key, arrays)
    assert all(t is not None for t in out.grad_fn.saved_tensors)
    gv, gh = torch.autograd.grad(out.sum(), [arrays[-2], H])
    torch.testing.assert_close(gh, a.T @ torch.ones(5, 3, dtype=DT))


# --- graph breaks: the registered operators keep scorch inside the graph ---------------------

def _graphs_and_breaks(fn, *args):
    e = torch._dynamo.explain(fn)(*args)
    return e.graph_count, e.graph_break_count


def test_gcn_and_attention_compile_to_one_graph():
    _, A = _sparse((7, 6), 0.4, "csr", seed=14)
    X, W = _dense(6, 5, seed=15), _dense(5, 3, seed=16)
    assert _graphs_and_breaks(gcn_layer, A, X, W) == (1, 0)
    _, M = _sparse((6, 6), 0.5, "csr", seed=17)
    Q, K, V = (_dense(6, 4, seed=s) for s in (18, 19, 20))
    assert _graphs_and_breaks(attention, M, Q, K, V) == (1, 0)


def _recording_backend():
    """An AOTAutograd backend that records the operators of the forward and backward graphs
    it is given (and runs them as they are)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    seen = {"forward": [], "backward": []}

    def recorder(which):
        def compiler(gm, example_inputs):
            seen[which].extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return make_boxed_func(gm.forward)
        return compiler
    return aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward")), seen


def test_one_graph_holds_the_scorch_operators():
    """What the compiled graph calls: torch.ops.scorch.*, not a Python fallback."""
    _, M = _sparse((6, 6), 0.5, "csr", seed=21)
    Q, K, V = (_dense(6, 4, seed=s) for s in (22, 23, 24))
    backend, seen = _recording_backend()
    out = torch.compile(attention, backend=backend)(M, Q, K, V)
    _check_same(out, attention(M, Q, K, V), [Q, K, V])
    forward, backward = (" ".join(seen[k]) for k in ("forward", "backward"))
    assert "scorch.einsum_on_pattern" in forward and "scorch.pattern_map" in forward
    assert "scorch.einsum" in forward                                   # the SpMM
    assert "scorch.pattern_map_backward" in backward and "scorch.einsum_backward" in backward



@pytest.mark.parametrize("a_requires_grad", [False, True])
def test_backward_graph_computes_only_the_gradients_asked_for(a_requires_grad):
    """A GCN layer's compiled backward: one gradient operator for ``X @ W`` and one more
    only when the adjacency's values want a gradient."""
    _, A = _sparse((6, 5), 0.5, "csr", seed=63, requires_grad=a_requires_grad)
    X, W = _dense(5, 4, seed=64), _dense(4, 2, seed=65)
    backend, seen = _recording_backend()
    out = torch.compile(gcn_layer, backend=backend)(A, X, W)
    out.sum().backward()
    assert seen["backward"].count("scorch.einsum_backward.default") == 1 + a_requires_grad

# --- the registered operators ----------------------------------------------------------------

def _op_args(equation, *operands):
    metas, arrays = library_ops.flatten_operands(operands)
    return library_ops._key(equation, None, metas, operands), arrays


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dcsr"])
def test_opcheck_einsum(fmt):
    _, A = _sparse((5, 4), 0.5, fmt, seed=25)
    X = _dense(4, 3, seed=26)
    key, arrays = _op_args("ij,jk->ik", A, X)
    arrays[-2].requires_grad_(True)        # A's values: its gradient is an SDDMM
    torch.library.opcheck(torch.ops.scorch.einsum.default, (key, arrays))


def test_opcheck_einsum_on_pattern_and_pattern_map():
    _, M = _sparse((6, 5), 0.5, "csr", seed=27)
    Q, K = _dense(6, 3, seed=28), _dense(5, 3, seed=29)
    key, arrays = _op_args("ij,id,jd->ij", M, Q, K)
    torch.library.opcheck(torch.ops.scorch.einsum_on_pattern.default, (key, arrays))
    key, arrays = _op_args("softmax:1", M)
    arrays[-1].requires_grad_(True)
    torch.library.opcheck(torch.ops.scorch.pattern_map.default, ("softmax:1", key, arrays))
    torch.library.opcheck(torch.ops.scorch.pattern_map.default, ("log_softmax:0", key, arrays))
    grad = torch.randn_like(arrays[-1])
    torch.library.opcheck(torch.ops.scorch.pattern_map_backward.default,
                          ("softmax:1", key, [a.detach() for a in arrays], grad))


def test_opcheck_einsum_backward():
    _, A = _sparse((5, 4), 0.5, "csr", seed=48)
    X = _dense(4, 3, seed=49, requires_grad=False)
    key, arrays = _op_args("ij,jk->ik", A, X)
    G = _dense(5, 3, seed=50, requires_grad=False)
    for n in (0, 1):   # the sparse operand's values, the dense operand
        torch.library.opcheck(torch.ops.scorch.einsum_backward.default, (key, n, G, arrays))


def test_operator_results_match_eager_scorch():
    a, A = _sparse((6, 5), 0.5, "csr", seed=30)
    X = _dense(5, 3, seed=31, requires_grad=False)
    key, arrays = _op_args("ij,jk->ik", A, X)
    torch.testing.assert_close(torch.ops.scorch.einsum(key, arrays), a @ X)
    key, arrays = _op_args("softmax:1", A)
    ref = scorch.sparse.softmax(A, dim=1)
    torch.testing.assert_close(torch.ops.scorch.pattern_map("softmax:1", key, arrays),
                               ref._storage.values)



def test_operator_results_never_alias_their_inputs():
    """torch.library's rule, kept cheaply: a result of its own passes as it is; an input,
    or a view of one, is copied."""
    x, other = _dense(3, 4, seed=57, requires_grad=False), _dense(3, 4, seed=58, requires_grad=False)
    assert library_ops._fresh(other, [x]) is other
    for aliased in (x, x.view(4, 3), x[1:]):
        out = library_ops._fresh(aliased, [x])
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(out, aliased)


def test_operator_reuses_a_sparse_operand_whose_arrays_are_unchanged():
    """A compiled graph passes the same sparse arrays call after call with new dense ones
    (a GCN's A @ H): the SparseTensor over them, with its warm caches, is reused; new
    arrays get a new one, and results stay right."""
    a, A = _sparse((5, 4), 0.5, "csr", seed=66)
    a2, A2 = _sparse((5, 4), 0.7, "csr", seed=67)
    H1, H2 = _dense(4, 3, seed=68, requires_grad=False), _dense(4, 3, seed=69, requires_grad=False)
    key, arrays = _op_args("ij,jk->ik", A, H1)
    first = library_ops._operands(key, _spec_metas(key), arrays)
    again = library_ops._operands(key, _spec_metas(key), arrays[:-1] + [H2])
    assert again[0] is first[0] and again[1] is H2
    _, arrays2 = _op_args("ij,jk->ik", A2, H2)
    other = library_ops._operands(key, _spec_metas(key), arrays2)
    assert other[0] is not first[0]
    torch.testing.assert_close(torch.ops.scorch.einsum(key, arrays[:-1] + [H2]), a @ H2)
    torch.testing.assert_close(torch.ops.scorch.einsum(key, arrays2), a2 @ H2)


def _spec_metas(key):
    return library_ops._spec(key)[2]

def test_keys_decode_in_a_fresh_registry(monkeypatch):
    """A graph from torch's disk cache carries keys this process never made."""
    _, A = _sparse((4, 4), 0.5, "csr", seed=32)
    X = _dense(4, 2, seed=33, requires_grad=False)
    key, arrays = _op_args("ij,jk->ik", A, X)
    expected = torch.ops.scorch.einsum(key, arrays)
    monkeypatch.setattr(library_ops, "_SPECS", {})
    torch.testing.assert_close(torch.ops.scorch.einsum(key, arrays), expected)
    with pytest.raises(RuntimeError, match="not a scorch operator key"):
        torch.ops.scorch.einsum("__import__('os')", arrays)


def test_sparse_tensor_in_and_out_of_one_graph():
    """A compiled graph takes a SparseTensor and returns one (flatten/unflatten)."""
    _, M = _sparse((6, 5), 0.5, "csr", seed=34)
    Q, K = _dense(6, 3, seed=35, requires_grad=False), _dense(5, 3, seed=36, requires_grad=False)

    def scaled_scores(M, Q, K):
        return scorch.einsum("ij,id,jd->ij", M, Q, K) * 2
    out, ref = torch.compile(scaled_scores)(M, Q, K), scaled_scores(M, Q, K)
    assert isinstance(out, scorch.SparseTensor) and out.format == M.format
    torch.testing.assert_close(out.to_dense(), ref.to_dense())
    assert _graphs_and_breaks(scaled_scores, M, Q, K) == (1, 0)



def test_new_pattern_results_written_as_calls_break_at_the_call_only():
    """A sparse result with a new pattern (a sum of two patterns, SpGEMM) runs eagerly; as a
    call, Dynamo resumes after it and compiles the rest into one graph (as an operator,
    ``A + B``, this torch runs the whole function eagerly: docs/torch_compile.md)."""
    a, A = _sparse((5, 5), 0.4, "csr", seed=59)
    b, B = _sparse((5, 5), 0.4, "csr", seed=60)
    X, W = _dense(5, 4, seed=61, requires_grad=False), _dense(4, 2, seed=62, requires_grad=False)

    def summed(A, B, X, W):
        return torch.relu(torch.add(A, B) @ (X @ W))

    def spgemm(A, B, X, W):
        return torch.relu(torch.mm(A, B) @ (X @ W))
    for f, ref in ((summed, torch.relu((a + b) @ (X @ W))), (spgemm, torch.relu(a @ b @ (X @ W)))):
        torch.testing.assert_close(torch.compile(f)(A, B, X, W), ref)
        assert _graphs_and_breaks(f, A, B, X, W) == (1, 0)

def test_unregistered_sparse_op_breaks_the_graph_and_stays_right():
    """An op with no registered operator (sparse + sparse: a new pattern) runs eagerly."""
    a, A = _sparse((5, 5), 0.4, "csr", seed=37)
    b, B = _sparse((5, 5), 0.4, "csr", seed=38)
    X = _dense(5, 2, seed=39, requires_grad=False)

    def f(A, B, X):
        return torch.relu((A + B) @ X)
    torch.testing.assert_close(torch.compile(f)(A, B, X), torch.relu((a + b) @ X))


# --- the operators over formats, shapes, densities and dtypes (no compile: cheap) ----------

_FORMATS = ["csr", "csc", "coo", "dcsr", "dcsc", "dense"]


def _random_sparse(draw, shape, dtype):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    density = draw(st.sampled_from([0.0, 0.3, 1.0]))
    d = torch.rand(*shape, generator=g, dtype=dtype)
    d[torch.rand(*shape, generator=g) >= density] = 0
    return d, scorch.sparse_tensor(d, format=draw(st.sampled_from(_FORMATS)))


def _fake_matches(op, args, real):
    """The fake implementation gives the real result's shape and dtype."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = [a if not isinstance(a, list) else [mode.from_tensor(t) for t in a]
                     for a in args]
        fake = op(*fake_args)
    assert tuple(fake.shape) == tuple(real.shape) and fake.dtype == real.dtype


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_einsum_operators_match_dense_torch(data):
    draw = data.draw
    m, k, n = (draw(st.integers(0, 5)) for _ in range(3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    a, A = _random_sparse(draw, (m, k), dtype)
    X = torch.randn(k, n, dtype=dtype).requires_grad_(True)
    key, arrays = _op_args("ij,jk->ik", A, X)
    out = torch.ops.scorch.einsum(key, arrays)
    torch.testing.assert_close(out, a @ X)
    _fake_matches(torch.ops.scorch.einsum, (key, arrays), out)
    G = torch.randn(m, n, dtype=dtype)
    gX, = torch.autograd.grad(out, X, G)
    torch.testing.assert_close(gX, a.t() @ G)
    gA = torch.ops.scorch.einsum_backward(key, 0, G, arrays)
    mask = A.to_dense() != 0
    dense_gA = (G @ X.detach().t())
    stored = scorch.sparse_tensor(a, format=A.format)   # same pattern as A
    torch.testing.assert_close(
        scorch.tensor_type.with_values(stored, gA).to_dense() * mask, dense_gA * mask)


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_pattern_operators_match_dense_torch(data):
    draw = data.draw
    m, n, d = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    mask, M = _random_sparse(draw, (m, n), dtype)
    if M.format == scorch.as_format("dense", 2):
        return
    Q, K = torch.randn(m, d, dtype=dtype), torch.randn(n, d, dtype=dtype)
    key, arrays = _op_args("ij,id,jd->ij", M, Q, K)
    facts = library_ops._spec(key)[3]
    ref = mask * (Q @ K.t())
    if facts[0] == "pattern":
        vals = torch.ops.scorch.einsum_on_pattern(key, arrays)
        _fake_matches(torch.ops.scorch.einsum_on_pattern, (key, arrays), vals)
        got = scorch.tensor_type.with_values(M, vals).to_dense()
        torch.testing.assert_close(got, ref)
    dim = draw(st.sampled_from([0, 1]))
    name = f"{draw(st.sampled_from(['softmax', 'log_softmax']))}:{dim}"
    key, arrays = _op_args(name, M)
    vals = torch.ops.scorch.pattern_map(name, key, arrays)
    _fake_matches(torch.ops.scorch.pattern_map, (name, key, arrays), vals)
    fn = scorch.sparse.softmax if name.startswith("softmax") else scorch.sparse.log_softmax
    torch.testing.assert_close(vals, fn(M, dim=dim)._storage.values)


def test_elementwise_chain_on_one_pattern_fuses_in_the_graph():
    """``A * 2 + B - C`` over tensors derived in the graph from one pattern: aten ops on the
    stored values inside the graph (inductor fuses them into one loop), then the SpMM."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    _, A = _sparse((6, 5), 0.5, "csr", seed=46)
    X = _dense(5, 2, seed=47, requires_grad=False)

    def f(A, X):
        B = A * 3.0
        return (A * 2 + B - (-A) * 0.5) @ X
    seen = []

    def record(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)
    out = torch.compile(f, backend=aot_autograd(fw_compiler=record))(A, X)
    torch.testing.assert_close(out, f(A, X))
    assert seen.count("scorch.einsum.default") == 1 and "aten.add.Tensor" in seen
    assert _graphs_and_breaks(f, A, X) == (1, 0)
    torch.testing.assert_close(torch.compile(f)(A, X), f(A, X))   # inductor


def test_to_dense_in_the_graph_with_its_gradient():
    _, A = _sparse((5, 4), 0.5, "coo", seed=51, requires_grad=True)
    X = _dense(4, 3, seed=52)

    def f(A, X):
        return A.to_dense() @ X + A.to_dense().sum()
    out = torch.compile(f)(A, X)
    _check_same(out, f(A, X), [A, X])
    assert _graphs_and_breaks(f, A, X) == (1, 0)
    key, arrays = _op_args("to_dense", A.detach())
    torch.library.opcheck(torch.ops.scorch.to_dense.default,
                          (key, arrays[:-1] + [arrays[-1].clone().requires_grad_(True)]))


def test_conversions_under_compile_break_the_graph_and_stay_right():
    a, A = _sparse((4, 5), 0.5, "csr", seed=53)

    def f(A):
        return A.to_format("csc").indices().sum() + A.to_torch().to_dense().sum()
    torch.testing.assert_close(torch.compile(f)(A), f(A))


def _sddmm(M, Q, K):
    return scorch.einsum("ij,id,jd->ij", M, Q, K)


def _sddmm_softmax(M, Q, K):
    return scorch.sparse.softmax(_sddmm(M, Q, K), dim=1)


@pytest.mark.parametrize("fn", [_sddmm, _sddmm_softmax])
def test_a_returned_sparse_result_keeps_its_gradient(fn):
    """A compiled function that returns an SDDMM (or its sparse softmax) hands back a result
    that requires grad, whose backward reaches every input as the eager one does."""
    _, M = _sparse((9, 8), 0.4, "csr", seed=41, requires_grad=True)
    Q, K = _dense(9, 3, seed=42), _dense(8, 3, seed=43)
    out, ref = torch.compile(fn)(M, Q, K), fn(M, Q, K)
    assert isinstance(out, scorch.SparseTensor) and out.requires_grad
    torch.testing.assert_close(out.to_dense(), ref.to_dense())
    got = torch.autograd.grad(out.values().square().sum(), [M, Q, K])
    want = torch.autograd.grad(ref.values().square().sum(), [M, Q, K])
    for g, w in zip(got, want):
        torch.testing.assert_close(_to_dense(g), _to_dense(w))
    # the gradient arriving through to_dense (another eager path into the compiled backward)
    out = torch.compile(fn)(M, Q, K)
    got = torch.autograd.grad((out.to_dense() * 3).sum(), [Q])
    want = torch.autograd.grad((fn(M, Q, K).to_dense() * 3).sum(), [Q])
    torch.testing.assert_close(got[0], want[0])


def _scale_values(A, X):
    A.values().mul_(2)
    return A @ X


def _clip_values(A, X):
    v = A.values()
    v[v > 0.5] = 0
    return A.to_dense() + X


@pytest.mark.parametrize("fn", [_scale_values, _clip_values])
def test_in_place_change_of_values_is_written_back(fn):
    """``A.values()`` changed in place inside a compiled function changes ``A``, as in eager
    mode (the graph's write-back of a mutated input is a same-pattern ``copy_``)."""
    d, A = _sparse((8, 8), 0.4, "csr", seed=44)
    X = _dense(8, 8, seed=45, requires_grad=False)
    _, A_eager = _sparse((8, 8), 0.4, "csr", seed=44)
    out, ref = torch.compile(fn)(A, X), fn(A_eager, X)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(A.values(), A_eager.values())
    assert not torch.equal(A.to_dense(), d)


def test_same_pattern_copy_writes_the_values_in_place():
    """A sparse ``copy_`` from a tensor on the same pattern writes the stored values (views
    sharing them see the change); another pattern takes the source's pattern."""
    _, A = _sparse((5, 4), 0.5, "csr", seed=46)
    view = A.t()
    B = A * 3
    A.copy_(B)
    torch.testing.assert_close(A.to_dense(), B.to_dense())
    torch.testing.assert_close(view.to_dense(), B.to_dense().t())
    d, C = _sparse((5, 4), 0.8, "csr", seed=47)
    A.copy_(C)
    torch.testing.assert_close(A.to_dense(), d)


def test_a_big_sparse_operand_compiles_to_one_graph():
    """At 4096 stored entries and more the planner reads operand statistics: under tracing
    the operands are fake (no data), so the plan is made without them, not abandoned (the
    whole function used to run eagerly, silently, from that size on)."""
    d, A = _sparse((300, 300), 0.06, "csr", seed=90)
    assert A._storage.nnz >= 4096
    X, W = _dense(300, 8, seed=91), _dense(8, 4, seed=92)
    assert _graphs_and_breaks(gcn_layer, A, X, W) == (1, 0)
    torch.testing.assert_close(torch.compile(gcn_layer)(A, X, W), gcn_layer(d, X, W))


def test_compiled_calls_keep_no_dense_operand_alive():
    """The operator's last-call reuse holds its sparse operands, a bounded number of keys,
    and never the dense ones (every shape's features used to stay alive)."""
    import gc
    import weakref
    refs = []
    for n in range(5, 5 + library_ops._LAST_KEYS + 4):
        _, A = _sparse((n, n), 0.5, "csr", seed=n)
        H = _dense(n, 3, seed=n, requires_grad=False)
        key, arrays = _op_args("ij,jk->ik", A, H)
        library_ops._operands(key, _spec_metas(key), arrays)
        refs.append(weakref.ref(H))
        del H, arrays
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert len(library_ops._LAST_OPERANDS) <= library_ops._LAST_KEYS
