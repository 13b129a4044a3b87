"""Recurrent layers (``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` and their cells) with a sparse
weight or a sparse input. torch's fused kernels read every weight as dense strided memory, so
with a SparseTensor among the operands the layer runs here, step by step, each product through
``F.linear``: a sparse weight's SpMM forward and, for its gradient, an SDDMM on its pattern. A
layer's input projection is ONE product over all time steps; only the hidden products go step by
step. Gate order and formulas are torch's (documented on ``nn.LSTM`` / ``nn.GRU``), and
``PackedSequence`` inputs (the ``batch_sizes`` forms) run with each sequence's own length.

A padded input is the packed case whose batch sizes are all equal, so one driver serves both."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..tensor_type import SparseTensor

__all__ = ["recurrent_layers"]

Tensor = torch.Tensor
_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def _any_sparse(*groups) -> bool:
    for g in groups:
        items = g if isinstance(g, (list, tuple)) else (g,)
        if any(isinstance(t, SparseTensor) for t in items):
            return True
    return False


def _step(mode: str, projected: Tensor, h: Tensor, c: Optional[Tensor], w_hh: Tensor,
          b_hh: Optional[Tensor], w_hr: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """One time step: ``projected`` is ``x W_ih^T + b_ih`` for these rows."""
    hidden = F.linear(h, w_hh, b_hh)
    if mode == "lstm":
        i, f, g, o = (projected + hidden).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (F.linear(h, w_hr) if w_hr is not None else h), c
    if mode == "gru":
        x_r, x_z, x_n = projected.chunk(3, -1)
        h_r, h_z, h_n = hidden.chunk(3, -1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        return (1 - z) * n + z * h, None
    pre = projected + hidden
    return (torch.tanh(pre) if mode == "rnn_tanh" else torch.relu(pre)), None


def _rows(t: Optional[Tensor], n: int) -> Optional[Tensor]:
    return t if t is None or t.shape[0] == n else t[:n]


def _direction(mode: str, projected: Tensor, batch_sizes: List[int], h0: Tensor,
               c0: Optional[Tensor], weights: Sequence[Optional[Tensor]], reverse: bool):
    """One direction of one layer over packed rows: the outputs (packed, in time order) and the
    final state of every sequence (a sequence that ends early keeps its last state)."""
    w_hh, b_hh, w_hr = weights
    # one split, not a slice per step: each slice's backward would write a zero-filled
    # gradient of the whole projection (quadratic in the sequence length)
    steps = projected.split(batch_sizes)
    outputs: List[Optional[Tensor]] = [None] * len(batch_sizes)
    if not reverse:
        h, c = h0, c0
        for t, b in enumerate(batch_sizes):
            h_t, c_t = _step(mode, steps[t], _rows(h, b), _rows(c, b), w_hh, b_hh, w_hr)
            outputs[t] = h_t
            h, c = _kept(h_t, h, b), _kept(c_t, c, b)
        return torch.cat(outputs), h, c
    h = c = None
    for t in reversed(range(len(batch_sizes))):
        b = batch_sizes[t]
        h, c = _step(mode, steps[t], _joined(h, h0, b), _joined(c, c0, b), w_hh, b_hh, w_hr)
        outputs[t] = h
    return torch.cat(outputs), h, c             # (step 0 holds every sequence: h is whole)


def _kept(new: Optional[Tensor], old: Optional[Tensor], b: int) -> Optional[Tensor]:
    """Forward in time: the first ``b`` sequences' new state, the ended ones' kept."""
    return new if old is None or b == old.shape[0] else torch.cat([new, old[b:]])


def _joined(state: Optional[Tensor], initial: Optional[Tensor], b: int) -> Optional[Tensor]:
    """Backward in time: the running state of ``b`` sequences, those that start at this step
    (shorter ones, last in a packed batch) joining with their initial state."""
    if initial is None:
        return None
    if state is None:
        return _rows(initial, b)
    return state if b == state.shape[0] else torch.cat([state, initial[state.shape[0]:b]])


def recurrent_layers(mode: str, data: Tensor, batch_sizes: List[int], h0: Tensor,
                     c0: Optional[Tensor], params: Sequence[Tensor], has_biases: bool,
                     num_layers: int, dropout: float, train: bool, bidirectional: bool):
    """The stacked layers over packed ``data`` (rows of all sequences, time-major): the packed
    output of the last layer and the final ``h`` (and ``c``) of every layer and direction."""
    directions = 2 if bidirectional else 1
    per_cell = len(params) // (num_layers * directions)
    projection = per_cell == (5 if has_biases else 3)
    if mode != "lstm" and projection:
        raise ValueError(f"scorch: {mode} got {per_cell} weights per layer and direction")
    finals_h, finals_c = [], []
    layer_input = data
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            k = (layer * directions + d) * per_cell
            w_ih, w_hh = params[k], params[k + 1]
            b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
            w_hr = params[k + per_cell - 1] if projection else None
            projected = F.linear(layer_input, w_ih, b_ih)
            index = layer * directions + d
            out, h, c = _direction(mode, projected, batch_sizes, h0[index],
                                   None if c0 is None else c0[index], (w_hh, b_hh, w_hr),
                                   reverse=d == 1)
            outs.append(out)
            finals_h.append(h)
            finals_c.append(c)
        layer_input = outs[0] if directions == 1 else torch.cat(outs, -1)
        if dropout > 0 and train and layer < num_layers - 1:
            layer_input = F.dropout(layer_input, dropout, training=True)
    h_n = torch.stack(finals_h)
    return layer_input, h_n, (torch.stack(finals_c) if c0 is not None else None)


def _sizes(batch_sizes: Tensor) -> List[int]:
    return [int(b) for b in batch_sizes.tolist()]


def _layers_handler(mode: str):
    def handler(*args, **kwargs):
        packed = len(args) > 1 and isinstance(args[1], torch.Tensor) and \
            not isinstance(args[1], SparseTensor) and args[1].dim() == 1 and \
            not args[1].dtype.is_floating_point
        if kwargs:
            return NotImplemented
        if packed:
            data, batch_sizes, hx, params, has_biases, layers, dropout, train, bidir = args
            batch_first = False
        else:
            data, hx, params, has_biases, layers, dropout, train, bidir, batch_first = args
        if not _any_sparse(data, hx, params):
            return NotImplemented
        h0, c0 = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
        if packed:
            sizes = _sizes(batch_sizes)
            flat = data
        else:
            seq = data.transpose(0, 1) if batch_first else data
            steps, batch = seq.shape[0], seq.shape[1]
            sizes = [batch] * steps
            flat = seq.reshape(steps * batch, *seq.shape[2:])
        out, h_n, c_n = recurrent_layers(mode, flat, sizes, h0, c0, params, has_biases, layers,
                                         dropout, train, bidir)
        if not packed:
            out = out.reshape(steps, batch, out.shape[-1])
            if batch_first:
                out = out.transpose(0, 1)
        return (out, h_n, c_n) if mode == "lstm" else (out, h_n)
    return handler


for _mode in _MODES:
    register(getattr(torch, _mode))(_layers_handler(_mode))


def _cell_handler(mode: str):
    def handler(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
        if not _any_sparse(input, hx, w_ih, w_hh, b_ih, b_hh):
            return NotImplemented
        h, c = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
        h, c = _step(mode, F.linear(input, w_ih, b_ih), h, c, w_hh, b_hh, None)
        return (h, c) if mode == "lstm" else h
    return handler


for _mode in _MODES:
    register(getattr(torch, _mode + "_cell"))(_cell_handler(_mode))
