"""A CSR batch through a dense weight stored out x in (``F.linear(x, W)``, ``x @ W.t()``):
the kernel reads one weight row of ``out`` values per stored batch entry, so it needs
``W.t()`` contiguous; instead of re-laying out all of ``W`` per call, only the columns the
batch touches are gathered (``_runtime/dense_moves.pyx``), and the weight's gradient is
scattered back in its own layout."""
from __future__ import annotations

from typing import Optional

import torch

from .._runtime.dense_moves import gather_columns, scatter_columns
from ..formats import LevelKind
from ..tensor_compiler.allocate import empty_output, zeros_output
from ..tensor_compiler.narrowed_gather import GATHER_MAX_LINES, narrowed_columns, touched_lines
from ..tensor_compiler.threads import threads_for
from ..tensor_type import SparseTensor
from . import einsum as _einsum_entry

__all__ = ["gathered_columns_product", "GATHER_MAX_LINES", "GATHER_TRAINING_BYTES"]

#: a sparse batch reads a dense (out x in) weight through a copy of only the columns it
#: touches (``gathered_columns_product``) where those columns cover at most
#: ``narrowed_gather.GATHER_MAX_LINES`` of the weight's cache lines (the rule einsum's
#: narrowed gather follows), or where the weight trains and is at least this big: its
#: gradient then comes back in the weight's layout, where the general einsum's dense
#: gradient of a big weight costs 2.5x (80k x 256, 64 x 150 words: forward + backward
#: 45.7 -> 18.4 ms, forward equal)
GATHER_TRAINING_BYTES = 16 << 20


def gathered_columns_product(x, weight) -> Optional[torch.Tensor]:
    """``x @ weight.T`` for a CSR batch ``x`` (B x V) and a dense ``weight`` stored out x in
    (each input feature's column strided by V), through a copy of only the columns ``x``
    stores: ``weight.T[cols]`` (contiguous, ncols x out) against ``x`` with its columns
    renumbered ``0..ncols-1``. None where that does not apply (see below).

    Why: the kernel reads one weight row of ``out`` values per stored batch entry, so it
    needs ``weight.T`` contiguous; copied whole that is O(V x out) a call, a vocabulary-sized
    embedding's worth for a batch that touches a few thousand of its columns (80k x 256,
    8 documents of 100 words: 13.6 ms, the product itself ~0.2 ms; gathered 0.69 ms). The
    copy of the touched columns costs at most the product's own reads
    (``dense_moves.gather_columns``); where they touch most of the weight's cache lines it
    is taken only for a big weight that trains (:data:`GATHER_MAX_LINES`). The weight's gradient
    is dense, O(V x out), as torch's, scattered back in the weight's layout; a batch that needs
    its own gradient keeps the general path."""
    if type(x) is not SparseTensor or type(weight) not in (torch.Tensor, torch.nn.Parameter) \
            or x.requires_grad:
        return None
    st = x._storage
    fmt = st.format
    if (weight.dim() != 2 or len(st.shape) != 2 or weight.shape[0] < 2 or weight.stride(1) != 1
            or weight.is_complex() or fmt.block is not None or tuple(fmt.mode_order) != (0, 1)
            or tuple(fmt.levels) != (LevelKind.DENSE, LevelKind.COMPRESSED)):
        return None
    inputs = st.shape[1]
    if inputs == 0:
        return None
    cols, narrow = narrowed_columns(st)
    training = weight.requires_grad and torch.is_grad_enabled()
    if touched_lines(cols.numel(), inputs, weight.element_size()) > GATHER_MAX_LINES and not (
            training and weight.numel() * weight.element_size() >= GATHER_TRAINING_BYTES):
        return None
    return _einsum_entry.einsum("bj,jo->bo", SparseTensor(narrow), _gather_columns(weight, cols),
                                out_format="dense")


class _GatheredColumns(torch.autograd.Function):
    """``weight[:, cols].t()``, contiguous (ncols x out); its gradient is scattered back
    into a zeroed weight-shaped array in the weight's own layout."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cols)
        ctx.width = weight.shape[1]
        out = empty_output((cols.numel(), weight.shape[0]), weight.dtype)
        gather_columns(weight, cols, out, threads_for(out.numel()))
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cols, = ctx.saved_tensors
        dw = zeros_output((grad.shape[1], ctx.width), grad.dtype)
        scatter_columns(grad, cols, dw, threads_for(grad.numel()))
        return dw, None


def _gather_columns(weight: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    if weight.dtype in (torch.float32, torch.float64) and not (weight.is_neg() or weight.is_conj()):
        return _GatheredColumns.apply(weight, cols)
    return weight.t().index_select(0, cols)
