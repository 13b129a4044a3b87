"""nn.RNN / LSTM / GRU and their cells with sparse weights (or a sparse input) run step by step
through F.linear (``sparse_ops/recurrent.py``); torch's fused kernels would read the weights
as dense memory. Oracle: the same module with the dense weights."""
import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import scorch


def _pair(cls, fmt, seed, **kw):
    """A module with pruned dense weights and its copy holding them as sparse tensors."""
    torch.manual_seed(seed)
    dense = cls(4, 5, **kw)
    names = [n for n, _ in dense.named_parameters() if n.startswith("weight")]
    for n in names:
        w = getattr(dense, n).detach()
        setattr(dense, n, torch.nn.Parameter(w * (torch.rand_like(w) < 0.5)))
    sparse = copy.deepcopy(dense)
    for n in names:
        setattr(sparse, n, torch.nn.Parameter(scorch.sparse_tensor(getattr(dense, n).detach(), format=fmt)))
    return sparse, dense, names


def _check(sparse, dense, names, run):
    results = []
    for m in (sparse, dense):
        out, state = run(m)
        state = state if isinstance(state, tuple) else (state,)
        (out.pow(2).sum() + sum(s.pow(2).sum() for s in state)).backward()
        results.append((out, state, {n: getattr(m, n).grad for n in names}))
    (out_s, state_s, grad_s), (out_d, state_d, grad_d) = results
    torch.testing.assert_close(out_s, out_d)
    for a, b in zip(state_s, state_d):
        torch.testing.assert_close(a, b)
    for n in names:
        assert isinstance(grad_s[n], scorch.SparseTensor), n
        torch.testing.assert_close(grad_s[n].to_dense(), grad_d[n] * (getattr(dense, n) != 0))


_LAYERS = [(torch.nn.RNN, {}), (torch.nn.RNN, {"nonlinearity": "relu"}), (torch.nn.GRU, {}),
           (torch.nn.LSTM, {}), (torch.nn.LSTM, {"proj_size": 3})]


@settings(max_examples=25, deadline=None)
@given(which=st.integers(0, len(_LAYERS) - 1), layers=st.integers(1, 2), bidirectional=st.booleans(),
       bias=st.booleans(), batch_first=st.booleans(), packed=st.booleans(),
       fmt=st.sampled_from(["csr", "csc", "coo"]), seed=st.integers(0, 100))
def test_layers_equal_the_dense_module(which, layers, bidirectional, bias, batch_first, packed, fmt, seed):
    cls, kw = _LAYERS[which]
    sparse, dense, names = _pair(cls, fmt, seed, num_layers=layers, bidirectional=bidirectional,
                                 bias=bias, batch_first=batch_first, **kw)
    x = torch.randn((3, 6, 4) if batch_first else (6, 3, 4), generator=torch.Generator().manual_seed(seed))
    lengths = torch.tensor([6, 2, 4])

    def run(m):
        if not packed:
            return m(x)
        out, state = m(pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False))
        return pad_packed_sequence(out, batch_first=batch_first)[0], state

    _check(sparse, dense, names, run)


def test_initial_state_and_dropout_in_eval():
    sparse, dense, names = _pair(torch.nn.LSTM, "csr", 1, num_layers=2, dropout=0.3)
    sparse.eval(), dense.eval()
    x = torch.randn(4, 2, 4)
    h0, c0 = torch.randn(2, 2, 5), torch.randn(2, 2, 5)
    _check(sparse, dense, names, lambda m: m(x, (h0, c0)))


def test_a_sparse_input_sequence():
    sparse, dense, names = _pair(torch.nn.GRU, "csr", 2)
    x = torch.randn(5, 2, 4) * (torch.rand(5, 2, 4) < 0.4)
    out_s, h_s = sparse(scorch.sparse_tensor(x, format="coo"))
    out_d, h_d = dense(x)
    torch.testing.assert_close(out_s, out_d)
    torch.testing.assert_close(h_s, h_d)


@pytest.mark.parametrize("cls", [torch.nn.RNNCell, torch.nn.GRUCell, torch.nn.LSTMCell])
def test_cells(cls):
    sparse, dense, names = _pair(cls, "csr", 3)
    x = torch.randn(3, 4)

    def run(m):
        out = m(x)
        return (out[0], out[1:]) if isinstance(out, tuple) else (out, ())

    _check(sparse, dense, names, run)
