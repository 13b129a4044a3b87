"""Max pooling's indices and ``F.max_unpool1d/2d/3d`` on sparse inputs.

torch's max pooling scans each window in order (its positions' flat indices in the input
plane, ascending) and keeps the first position that beats the running max (``val > max``),
or any NaN: the index is the first position holding the window's max, or its last NaN.
For a sparse input that position is a stored entry, or, where the max is 0 and the window
holds implicit zeros, possibly one of those. The indices are dense by nature (one per
output position); the work beyond filling them follows the windows that store an entry.

Unpooling writes each stored entry at its index in the output plane: a sparse result. torch
writes every input position in order, zeros too, so where a later position shares the
index the entry is overwritten (with a zero: not stored)."""
from __future__ import annotations

import math
from typing import List, Sequence

import torch

from .._dispatch import dense_fallback, register_aten
from ..level_storage import Storage
from ..constructors import sparse_tensor
from ..tensor_type import SparseTensor
from ..gradients.values import values_of
from . import layout_ops
from . import shape as _shape

__all__ = ["pool_tables", "adaptive_tables", "max_indices", "max_unpool", "linear_keys"]


def linear_keys(coords: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Row-major flat keys of ``coords`` (ndim x n) in ``shape``."""
    lin = torch.zeros(coords.shape[1], dtype=torch.int64)
    for d, size in enumerate(shape):
        lin = lin * int(size) + coords[d]
    return lin


def pool_tables(sizes, kernel, stride, padding, dilation, outs) -> List[torch.Tensor]:
    """Per spatial dim, the input position of (window, offset in it), -1 in the padding."""
    tables = []
    for size, k, step, pad, dil, out in zip(sizes, kernel, stride, padding, dilation, outs):
        t = (torch.arange(out) * step - pad)[:, None] + torch.arange(k) * dil
        tables.append(torch.where((t >= 0) & (t < size), t, -1))
    return tables


def adaptive_tables(starts: Sequence[torch.Tensor], widths: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The same for torch's adaptive windows (window ``o`` from ``starts[o]``, ``widths[o]``
    long; offsets up to the widest window)."""
    tables = []
    for start, width in zip(starts, widths):
        j = torch.arange(int(width.max()) if width.numel() else 0)
        tables.append(torch.where(j < width[:, None], start[:, None] + j, -1))
    return tables


def max_indices(U: Storage, P: Storage, out: torch.Tensor, at: torch.Tensor, counts: torch.Tensor,
                n: int, tables: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """torch's max-pooling indices (flat in each input plane of ``sizes``) for the windows of
    ``U`` (leading dims, ``n`` window dims, ``n`` offset dims), whose maxima ``out`` are
    stored on ``P`` (the windows that store an entry; ``counts`` stored entries of ``at``
    positions in the input). A window storing nothing points at its first position."""
    kept = len(U.shape) - n
    lead, shape = kept - n, U.shape[:kept]
    plane = math.prod(sizes)
    # a window storing nothing: its first position in the input (the smallest flat index)
    first = torch.zeros((), dtype=torch.int64)
    for k, t in enumerate(tables):
        f = torch.where(t >= 0, t, plane).amin(1) if t.shape[1] else torch.zeros(t.shape[0], dtype=torch.int64)
        first = first[..., None] * sizes[k] + f.reshape((1,) * k + (-1,))
    result = first.expand(tuple(shape)).contiguous()
    if P.nnz == 0:
        return result
    coords = layout_ops._coords(SparseTensor(U))
    pc = layout_ops._coords(SparseTensor(P))
    window = linear_keys(pc, shape)
    fiber = torch.searchsorted(window, linear_keys(coords[:kept], shape))
    at_input = torch.zeros(coords.shape[1], dtype=torch.int64)
    for k, t in enumerate(tables):
        at_input = at_input * sizes[k] + t[coords[lead + k], coords[kept + k]]
    vals, wmax = U.values, out[fiber]
    nan = torch.isnan(out)
    hit = (vals == wmax) & ~nan[fiber]
    idx = torch.full((P.nnz,), plane, dtype=torch.int64).scatter_reduce(0, fiber[hit], at_input[hit], "amin")
    if bool(nan.any()):   # the last NaN
        isn = torch.isnan(vals)
        last = torch.full((P.nnz,), -1, dtype=torch.int64).scatter_reduce(0, fiber[isn], at_input[isn], "amax")
        idx = torch.where(nan, last, idx)
    need = ((out == 0) & (counts < at)).nonzero().squeeze(1)
    if need.numel():      # the max is 0 and the window holds implicit zeros: the first of them
        grid = torch.zeros((need.numel(), 1), dtype=torch.int64)
        real = torch.ones((need.numel(), 1), dtype=torch.bool)
        for k, t in enumerate(tables):
            tk = t[pc[lead + k, need]]                                   # (windows, offsets)
            grid = (grid[:, :, None] * sizes[k] + tk[:, None, :]).flatten(1)
            real = (real[:, :, None] & (tk >= 0)[:, None, :]).flatten(1)
        keys, _ = torch.sort(fiber * plane + at_input)
        cand = need[:, None] * plane + grid
        where = torch.searchsorted(keys, cand).clamp(max=keys.numel() - 1)
        free = real & (keys[where] != cand)
        implicit = torch.where(free, grid, plane).amin(1)
        idx[need] = torch.minimum(idx[need], implicit)
    result.view(-1)[window] = idx
    return result


def max_unpool(x: SparseTensor, indices: torch.Tensor, sizes: Sequence[int]) -> SparseTensor:
    """Each stored entry of ``x`` written at its ``indices`` (flat in an output plane of
    ``sizes``); differentiable in ``x``'s values (the gradient gathers at the indices, an
    overwritten entry's too; where a zero overwrote it, no gradient is stored there)."""
    return _at_indices(x, indices, sizes, accumulate=False)


class _Overwritten(torch.autograd.Function):
    """The kept entries' values; the backward gives every entry the gradient at the output
    position it was written to (``slot``: a kept entry's own, -1 where nothing is stored)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, keep: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(slot)
        return values.index_select(0, keep)

    @staticmethod
    def backward(ctx, g):
        slot, = ctx.saved_tensors
        return torch.cat([g.new_zeros(1), g]).index_select(0, slot + 1), None, None


def _at_indices(x: SparseTensor, indices: torch.Tensor, sizes: Sequence[int], accumulate: bool) -> SparseTensor:
    """``x``'s stored entries moved to their ``indices`` in output planes of ``sizes``: summed
    where they meet (``accumulate``: max pooling's backward) or, as torch's unpooling, the
    last position of a plane writing an index wins (its zeros too)."""
    n = len(sizes)
    if indices.shape != x.shape:
        raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor "
                           f"({list(x.shape)}) but got indices tensor with shape: {list(indices.shape)}")
    if indices.dtype != torch.int64:
        raise RuntimeError(f"Expected indices to be of dtype int64, but got {indices.dtype}")
    lead = x.dim() - n
    plane = math.prod(sizes)
    shape = tuple(x.shape[:lead]) + tuple(sizes)
    if plane == 0:      # nothing to write (torch checks no index then)
        return _shape._build(torch.zeros((len(shape), 0), dtype=torch.int64), values_of(x)[:0], shape)
    flat = indices.reshape(-1)
    bad = ((flat < 0) | (flat >= plane)).nonzero()      # every index, as torch checks them
    if bad.numel():
        raise RuntimeError(f"Found an invalid max index: {int(flat[bad[0, 0]])} (output volumes are "
                           f"of size {'x'.join(str(s) for s in sizes)})")
    coords = layout_ops._coords(x)
    here = linear_keys(coords, x.shape)              # the stored entries' input positions
    written = torch.arange(flat.numel()) // max(math.prod(x.shape[lead:]), 1) * plane + flat
    values = values_of(x)
    if accumulate:
        keys, slot = torch.unique(written[here], return_inverse=True)
        values = values.new_zeros(keys.numel()).index_add(0, slot, values)
    else:
        # a stored entry stays where no later position of its plane writes the same index
        # (a pass over the dense indices)
        ordered, order = torch.sort(written, stable=True)
        last = order[(torch.searchsorted(ordered, written[here], right=True) - 1).clamp(min=0)]
        keep = (last == here).nonzero().squeeze(1)
        keys = written[here[keep]]
        # the gradient, as torch's, reaches an overwritten entry too: the one at its index
        mine, slot = written[here], torch.full((here.numel(),), -1, dtype=torch.int64)
        if keys.numel():
            by_key, at = torch.sort(keys)
            j = torch.searchsorted(by_key, mine).clamp(max=keys.numel() - 1)
            slot = torch.where(by_key[j] == mine, at[j], -1)
        values = _Overwritten.apply(values, keep, slot)
    out_coords = []
    rest = keys
    for size in reversed(shape):
        out_coords.insert(0, rest % size)
        rest = rest // size
    return _shape._build(torch.stack(out_coords), values, shape)


def _pool_backward(op, n: int):
    """aten's max-pooling backward: each stored gradient entry (every entry of a dense one)
    added at its index, a sparse result."""
    def handler(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
        if isinstance(indices, SparseTensor):
            return dense_fallback(op, (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                       indices), {})
        if not isinstance(grad_output, SparseTensor):
            grad_output = sparse_tensor(grad_output, format="coo")
        return _at_indices(grad_output, indices, tuple(self.shape[-n:]), accumulate=True)
    return handler


for _n, _op in {2: torch.ops.aten.max_pool2d_with_indices_backward.default,
                3: torch.ops.aten.max_pool3d_with_indices_backward.default}.items():
    register_aten(_op)(_pool_backward(_op, _n))
