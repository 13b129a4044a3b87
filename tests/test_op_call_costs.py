"""Work an op call must not do: import torch's symbolic-shape machinery (sympy, ~0.2 s on the
first elementwise op of a process, ~7 us on every later one, through
``torch.broadcast_shapes``), or map each input entry to its stored position (a sort and a
search, 4x the build) when nothing will take a gradient through the values."""
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.broadcasting import broadcast_shapes
from scorch.gradients import pattern as grad_pattern

SIZES = st.sampled_from([-1, 0, 1, 1, 2, 3])
SHAPES = st.one_of(st.lists(SIZES, max_size=4).map(tuple), SIZES)


@settings(max_examples=300, deadline=None)
@given(st.lists(SHAPES, max_size=4))
def test_broadcast_shapes_is_torchs(shapes):
    try:
        want, want_error = torch.broadcast_shapes(*shapes), None
    except (RuntimeError, ValueError) as e:
        want, want_error = None, (type(e), str(e))
    try:
        got, got_error = broadcast_shapes(*shapes), None
    except (RuntimeError, ValueError) as e:
        got, got_error = None, (type(e), str(e))
    assert got_error == want_error
    assert got == want and (got is None or type(got) is torch.Size)


def test_elementwise_ops_do_not_import_sympy():
    code = ("import sys, torch, scorch\n"
            "s = scorch.sparse_tensor(torch.eye(3), format='csr')\n"
            "x = torch.ones(3, 3)\n"
            "r = [s > 0, s + x, s * x, torch.where(s > 0, s, x), s.masked_fill(s > 0, 2.0)]\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


OPS = {
    "tril": lambda t: torch.tril(t, 1),
    "triu": lambda t: torch.triu(t),
    "flip": lambda t: torch.flip(t, [0]),
    "roll": lambda t: torch.roll(t, 2, 1),
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_untracked_results_skip_the_position_map(monkeypatch, name, fmt):
    x = torch.randn(6, 7)
    x[x.abs() < 0.6] = 0
    calls = []
    real = grad_pattern.positions_in_pattern
    monkeypatch.setattr(grad_pattern, "positions_in_pattern",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    got = OPS[name](scorch.sparse_tensor(x, format=fmt))
    assert torch.equal(got.to_dense(), OPS[name](x))
    assert calls == []
    A = scorch.sparse_tensor(x, format=fmt, requires_grad=True)
    w = torch.randn(6, 7)
    (OPS[name](A).to_dense() * w).sum().backward()
    xd = x.clone().requires_grad_()
    (OPS[name](xd) * w).sum().backward()
    assert torch.allclose(A.grad.to_dense(), xd.grad * (x != 0))
