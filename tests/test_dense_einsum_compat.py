"""Dense ``scorch.einsum`` / ``scorch.tensor`` behave as torch's under ``import scorch as torch``:
the sublist form's letters and errors, forward-mode AD, torch.jit.script / trace, torch.compile,
and a dense call that goes straight to torch (no compiler, no shape reads)."""
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import scorch
from scorch.sparse_ops import einsum as einsum_module


def _dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


def _outcome(fn, *args):
    """The result, or the exception's type and message."""
    try:
        return fn(*args)
    except Exception as e:   # noqa: BLE001 (compared with torch's)
        return type(e), str(e)


def _same(got, want):
    if isinstance(want, tuple):
        assert got == want
    else:
        got = _dense(got)
        assert got.shape == want.shape and torch.allclose(got, want)


@pytest.fixture
def a():
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    x[x < 0] = 0
    return x


B = torch.randn(3, 4)

SUBLISTS = [
    lambda a, b: (a, [0, 26]),                      # implicit output: 'A' < 'a' as in torch
    lambda a, b: (a, [26, 0]),
    lambda a, b: (a, [0, 30], b, [30, 27]),
    lambda a, b: (a, [0, 1], b, [1, 2], [0, 2]),
    lambda a, b: (a, [0, 1], b, [1, 2], [2, 0]),
    lambda a, b: (a, [Ellipsis, 40]),
    lambda a, b: (a, [-1, 0]),                      # out of range: torch's ValueError
    lambda a, b: (a, [0, 52]),
]


@pytest.mark.parametrize("case", range(len(SUBLISTS)))
@pytest.mark.parametrize("form", ["dense", "scorch_csr", "torch_coo"])
def test_sublist_form_reads_subscripts_as_torch(a, case, form):
    operand = {"dense": a, "scorch_csr": scorch.sparse_tensor(a, format="csr"),
               "torch_coo": a.to_sparse()}[form]
    want = _outcome(torch.einsum, *SUBLISTS[case](a, B))
    got = _outcome(scorch.einsum, *SUBLISTS[case](operand, B))
    _same(got, want)


@pytest.mark.parametrize("args", [
    lambda a: (a,), lambda a: (), lambda a: (None, a), lambda a: (5, a), lambda a: ("ij",),
    lambda a: ("ij", []), lambda a: ("ij->j", [a]), lambda a: ("ij,kj", a, a),
])
def test_call_forms_and_errors_match_torch(a, args):
    _same(_outcome(scorch.einsum, *args(a)), _outcome(torch.einsum, *args(a)))


def test_dense_einsum_goes_straight_to_torch(a, monkeypatch):
    """Dense operands (plain tensors, Parameters, three operands, sublists) never reach
    scorch's compiler, and read no operand shape (the fast exit)."""
    def refuse():
        raise AssertionError("the compiler was reached")
    monkeypatch.setattr(einsum_module, "_compiler_module", None)
    monkeypatch.setattr(einsum_module, "_compiler", refuse)
    p = torch.nn.Parameter(torch.randn(3, 4))
    c = torch.randn(4, 2)
    for args in [("ij,jk->ik", a, p), ("ij,jk,kl->il", a, B, c), ("ij,jk", [a, B]),
                 (a, [0, 1], B, [1, 2]), ("ii->i", torch.randn(3, 3))]:
        got, want = scorch.einsum(*args), torch.einsum(*args)
        assert type(got) is torch.Tensor and torch.allclose(got, want)
    got = scorch.einsum("ij,jk->ik", a, p)
    got.sum().backward()
    g = p.grad.clone()
    p.grad = None
    torch.einsum("ij,jk->ik", a, p).sum().backward()
    assert torch.allclose(g, p.grad)


def test_a_torch_function_mode_sees_einsum(a):
    class Log(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))
    with Log() as log:
        got = scorch.einsum("ij,kj->ik", a, a)
    assert torch.einsum in log.seen and torch.allclose(got, a @ a.T)


W, X, T = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3, 4)


@pytest.mark.parametrize("how", ["dual", "jvp", "jacfwd", "jacobian"])
def test_forward_mode_ad_on_dense_einsum(how):
    def run(mod):
        if how == "dual":
            with fwAD.dual_level():
                return fwAD.unpack_dual(mod.einsum("ij,kj->ik", fwAD.make_dual(X, T), W)).tangent
        if how == "jvp":
            return torch.func.jvp(lambda v: mod.einsum("ij,kj->ik", v, W), (X,), (T,))[1]
        if how == "jacfwd":
            return torch.func.jacfwd(lambda v: mod.einsum("i,ki->k", v, W))(X[0])
        return torch.autograd.functional.jacobian(lambda v: mod.einsum("i,ki->k", v, W), X[0],
                                                  vectorize=True, strategy="forward-mode")
    got, want = run(scorch), run(torch)
    assert got is not None and torch.allclose(got, want)


def test_forward_mode_ad_with_a_sparse_operand_is_still_refused(a):
    s = scorch.sparse_tensor(a, format="csr")
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        scorch.einsum("ij,jk->ik", s, fwAD.make_dual(B, torch.ones_like(B)))


def test_torch_jit_script_compiles_scorch_einsum_and_tensor():
    torch_ = scorch      # the scripted source says torch.einsum / torch.tensor, as user code does

    def f(x):
        return torch_.einsum("ij,jk->ik", x, x) + torch_.tensor([1.0])
    scripted = torch.jit.script(f)
    x = torch.randn(3, 3)
    assert "aten::einsum" in str(scripted.graph) and "aten::tensor" in str(scripted.graph)
    assert torch.allclose(scripted(x), torch.einsum("ij,jk->ik", x, x) + 1)


@pytest.mark.parametrize("entry", [scorch.einsum, scorch.tensor_compiler.einsum])
def test_jit_trace_of_dense_einsum_warns_nothing(entry):
    def attn(q, k):
        return entry("bhid,bhjd->bhij", q, k).softmax(-1)
    q, k = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(attn, (q, k))
    q2, k2 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 5, 4)
    assert torch.allclose(traced(q2, k2), torch.einsum("bhid,bhjd->bhij", q2, k2).softmax(-1))


def test_sparse_einsum_with_a_broadcast_dense_operand_off_the_warm_path(a):
    """The Python path (sorted=False skips the C warm call) reads a dense operand's size-1
    extents after its dense-only return: a broadcast column still plans and computes right."""
    s = scorch.sparse_tensor(a, format="csr")
    col = torch.randn(2, 1)
    for args in [("ij,ik->ij", s, col), ("ij,ik->ij", a.to_sparse(), col)]:
        got = scorch.einsum(*args, sorted=False)
        assert torch.allclose(_dense(got), torch.einsum("ij,ik->ij", a, col))


def test_torch_compile_keeps_torch_tensor_in_the_graph():
    import torch._dynamo as dynamo

    def f(x):
        return x.sin() * scorch.tensor([2.0, 3.0]) + 1
    x = torch.randn(4, 2)
    dynamo.reset()
    try:
        got = torch.compile(f, fullgraph=True, backend="eager")(x)
    finally:
        dynamo.reset()
    assert torch.allclose(got, x.sin() * torch.tensor([2.0, 3.0]) + 1)


def test_torch_compile_with_a_format_keeps_the_eager_call():
    import torch._dynamo as dynamo

    def f(x):
        return scorch.tensor([[0.0, 2.0], [3.0, 0.0]], format="csr"), x + 1
    x = torch.randn(2)
    dynamo.reset()
    try:
        s, y = torch.compile(f, backend="eager")(x)
    finally:
        dynamo.reset()
    assert isinstance(s, scorch.SparseTensor)
    assert torch.equal(s.to_dense(), torch.tensor([[0.0, 2.0], [3.0, 0.0]]))
    assert torch.allclose(y, x + 1)
