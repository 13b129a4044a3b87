"""Shape and layout ops that move stored coordinates (never a dense copy), beside ``shape``'s
views and indexing: ``select``, ``unbind`` / ``split`` / ``chunk`` (every piece in one pass
over the entries), ``tile``, ``F.pad`` with 0 or by ``reflect`` / ``replicate`` / ``circular``,
``block_diag``, ``diag_embed`` / ``diagflat`` / ``diag`` of a vector, ``diagonal`` at any
offset and dims,
``unfold`` (windows: each entry in each window covering it), ``cartesian_prod``,
``new_zeros`` (sparse, storing nothing; ``new_ones`` / ``new_full`` / ``new_empty``: dense, as
an empty tensor is one the caller fills in place, which a pattern would refuse) and
the torch.sparse queries
``sparse_dim`` / ``dense_dim``. Each result is differentiable in the stored values (the
coordinates move, the values are gathered)."""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from .._dispatch import check_dense_size, register
from ..conversion import dense_dim
from ..formats import as_format
from ..gradients.values import values_of
from ..tensor_type import SparseTensor
from . import shape as _shape
from .dims import checked_dim
from .nonlinear import _sparse

__all__ = ["unbind", "pad_with_zeros", "block_diag", "diag_embed", "diagonal_entries", "unfold",
           "cartesian_prod"]


def _coords(t: SparseTensor) -> torch.Tensor:
    from .._runtime import convert
    return convert.coords(t._storage)


_dim = checked_dim


@register(torch.select, torch.Tensor.select)
def _select(x, dim, index):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    d = _dim(dim, t.dim())
    return _shape.getitem(t, (slice(None),) * d + (int(index),))


def _pieces(t: SparseTensor, d: int, sizes: List[int], drop: bool) -> tuple:
    """``t`` cut along ``d`` into consecutive pieces of ``sizes`` in one pass over the
    entries (each entry's piece by a binary search, a stable sort by piece, one split), not
    one scan of every entry per piece; ``drop``: the pieces lose dim ``d`` (``unbind``)."""
    coords, values = _coords(t), values_of(t)
    extent = torch.tensor(sizes, dtype=torch.int64)
    ends = torch.cumsum(extent, 0)
    piece = torch.searchsorted(ends, coords[d], right=True)
    order = torch.argsort(piece, stable=True)
    counts = torch.bincount(piece, minlength=len(sizes)).tolist()
    moved = coords.clone()
    moved[d] -= (ends - extent)[piece]
    fmt = _shape._unblocked(t._storage.format)
    keep = list(range(t.dim()))
    if drop:
        fmt = _shape._drop_dims_format(fmt, [d])
        if fmt is not None and fmt.is_dense:     # the dropped level held the sparsity: dense levels would
            # store every position
            fmt = as_format("coo", t.dim() - 1)
        keep.remove(d)
    parts = zip(moved[keep][:, order].split(counts, 1), values[order].split(counts), sizes)
    return tuple(_shape._build(c, v, [k if j == d else t.shape[j] for j in keep], fmt)
                 for c, v, k in parts)


def unbind(t: SparseTensor, dim: int = 0) -> tuple:
    """The slices along ``dim``, one pass over the entries (``_pieces``)."""
    d = _dim(dim, t.dim())
    return _pieces(t, d, [1] * t.shape[d], drop=True)


@register(torch.unbind, torch.Tensor.unbind)
def _unbind(x, dim=0):
    t = _sparse(x)
    return NotImplemented if t is None else unbind(t, dim)


def split(t: SparseTensor, sizes, dim: int = 0) -> tuple:
    """``torch.split``: slices of ``sizes`` (an int: equal pieces, the last shorter), one pass
    over the entries (``_pieces``)."""
    d = _dim(dim, t.dim())
    n = t.shape[d]
    if isinstance(sizes, numbers.Integral) or (isinstance(sizes, torch.Tensor) and sizes.dim() == 0):
        step = int(sizes)
        if step <= 0 and n:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
        sizes = [min(step, n - k) for k in range(0, n, step)] if n else [0]
    sizes = [int(k) for k in sizes]
    if sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                           f"size at dimension {d}), but got split_sizes={sizes}")
    return _pieces(t, d, sizes, drop=False)


@register(torch.split, torch.Tensor.split, torch.Tensor.split_with_sizes, torch.split_with_sizes)
def _split(x, split_size_or_sections, dim=0):
    t = _sparse(x)
    return NotImplemented if t is None else split(t, split_size_or_sections, dim)


@register(torch.chunk, torch.Tensor.chunk)
def _chunk(x, chunks, dim=0):
    t = _sparse(x)
    if t is None or chunks <= 0:
        return NotImplemented            # torch's error
    n = t.shape[_dim(dim, t.dim())]
    if n == 0:                           # torch: `chunks` empty pieces
        return tuple(torch.narrow(t, dim, 0, 0) for _ in range(chunks))
    return split(t, -(-n // chunks), dim)


@register(torch.tile, torch.Tensor.tile)
def _tile(x, *dims):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)) else dims
    dims = (1,) * (t.dim() - len(dims)) + tuple(dims)
    return t.repeat(*dims)


def pad_with_zeros(t: SparseTensor, pads: Sequence[int]) -> torch.Tensor:
    """``F.pad`` with 0: each dim from the last grows by (before, after) (negative: cropped)."""
    if len(pads) % 2 or len(pads) // 2 > t.dim():
        raise ValueError(f"Padding length must be divisible by 2 and at most twice the input's "
                         f"dimensions ({t.dim()}), got {len(pads)}")
    coords, values = _coords(t).clone(), values_of(t)
    shape = list(t.shape)
    keep = torch.ones(coords.shape[1], dtype=torch.bool)
    for k in range(len(pads) // 2):
        d = t.dim() - 1 - k
        before, after = int(pads[2 * k]), int(pads[2 * k + 1])
        shape[d] += before + after
        if shape[d] < 0:
            raise RuntimeError(f"pad: the padded size of dimension {d} would be {shape[d]}")
        coords[d] += before
        keep &= (coords[d] >= 0) & (coords[d] < shape[d])
    return _shape._build(coords[:, keep], values[keep], shape, _shape._unblocked(t._storage.format))


def _mode_sources(size: int, before: int, after: int, mode: str, c: torch.Tensor):
    """For padding one dim by ``mode``: (the stored entries each padded position copies,
    their new coordinates), the original entries included. Each output position has one
    source: ``reflect`` mirrors without the edge, ``replicate`` repeats the edge,
    ``circular`` wraps around."""
    picks, places = [torch.arange(c.numel())], [c + before]
    if mode == "reflect":
        left = ((c >= 1) & (c <= before)).nonzero().squeeze(1)
        right = ((c >= size - 1 - after) & (c <= size - 2)).nonzero().squeeze(1)
        picks += [left, right]
        places += [before - c[left], before + size + (size - 2 - c[right])]
    elif mode == "replicate":
        for edge, count, first in ((0, before, 0), (size - 1, after, before + size)):
            at = (c == edge).nonzero().squeeze(1)
            picks.append(at.repeat_interleave(count))
            places.append((first + torch.arange(count)).repeat(at.numel()))
    else:                                  # circular
        left = (c >= size - before).nonzero().squeeze(1)
        right = (c < after).nonzero().squeeze(1)
        picks += [left, right]
        places += [c[left] - (size - before), before + size + c[right]]
    return torch.cat(picks), torch.cat(places)


def pad_by_mode(t: SparseTensor, pads: Sequence[int], mode: str) -> SparseTensor:
    """``F.pad`` with ``reflect``, ``replicate`` or ``circular``: each padded position copies
    one stored entry (or none), so the result stores each entry once plus its copies and
    its gradient sums over them."""
    coords, values = _coords(t), values_of(t)
    src = torch.arange(coords.shape[1])
    shape = list(t.shape)
    for k in range(len(pads) // 2):
        d = t.dim() - 1 - k
        before, after = int(pads[2 * k]), int(pads[2 * k + 1])
        pick, place = _mode_sources(shape[d], max(before, 0), max(after, 0), mode, coords[d])
        # a negative pad crops what the padding of the other side made (``replicate``,
        # ``reflect``: torch pads from the whole input, then crops)
        padded = shape[d] + max(before, 0) + max(after, 0)
        inside = (place >= -min(before, 0)) & (place < padded + min(after, 0))
        pick, place = pick[inside], place[inside] + min(before, 0)
        coords = coords[:, pick].clone()
        coords[d] = place
        src = src[pick]
        shape[d] += before + after
    return _shape._build(coords, values[src], shape, _shape._unblocked(t._storage.format))


def _mode_pad_ok(t: SparseTensor, pad, mode: str) -> bool:
    """The pads torch accepts for ``mode`` (anything else: torch's own error, or circular
    padding's negative-pad cropping, in the fallback)."""
    k = len(pad) // 2
    if len(pad) % 2 or not 1 <= k <= 3 or t.dim() not in (k + 1, k + 2):
        return False
    for j in range(k):
        size, before, after = t.shape[t.dim() - 1 - j], int(pad[2 * j]), int(pad[2 * j + 1])
        if size == 0 or size + before + after < 0 or ((before < 0 or after < 0) and mode == "circular"):
            return False
        if mode == "reflect" and (before >= size or after >= size):
            return False
        if mode == "circular" and (before > size or after > size):
            return False
    return True


@register(F.pad)
def _pad(x, pad, mode="constant", value=None):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if mode in ("reflect", "replicate", "circular"):
        if not _mode_pad_ok(t, pad, mode):
            return NotImplemented          # torch's error, or negative pads: the fallback's
        return pad_by_mode(t, pad, mode)
    if mode != "constant":
        return NotImplemented
    if value not in (None, 0):             # a non-zero fill is dense by nature
        check_dense_size("pad", t.shape, t.dtype)
        return F.pad(t.to_dense(), pad, mode, value)
    return pad_with_zeros(t, pad)


@register(torch.constant_pad_nd)
def _constant_pad_nd(x, pad, value=0):
    return _pad(x, pad, "constant", value)


@register(torch.fill)
def _fill(x, value):
    """Every position ``value``: 0 gives an empty sparse tensor of the same format (nothing
    stored), another value a dense tensor (dense by nature)."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    v = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    if isinstance(v, numbers.Number) and v == 0:
        return _empty_like_format(t, t.shape, None)
    check_dense_size("fill", t.shape, t.dtype)
    return torch.full(tuple(t.shape), v, dtype=t.dtype)


def _as_matrix(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1, -1) if x.dim() == 1 else x.reshape(1, 1) if x.dim() == 0 else x


def block_diag(tensors: Sequence[torch.Tensor]) -> SparseTensor:
    """The blocks on the diagonal (0-d and 1-D ones as one row, as torch), sparse in COO: a
    sparse block brings its stored entries, a dense block all of its entries (so a dense
    block's gradient is whole)."""
    mats = [_as_matrix(x) for x in tensors]
    if any(m.dim() != 2 for m in mats):
        raise RuntimeError("torch.block_diag: Input tensors must have 2 or fewer dimensions")
    dtype = mats[0].dtype
    for m in mats[1:]:
        dtype = torch.promote_types(dtype, m.dtype)
    rows, cols, vals = [], [], []
    r0 = c0 = 0
    for m in mats:
        if isinstance(m, SparseTensor):
            c, v = _coords(m), values_of(m)
        else:
            c = torch.stack(torch.meshgrid(torch.arange(m.shape[0]), torch.arange(m.shape[1]),
                                           indexing="ij")).reshape(2, -1)
            v = m.reshape(-1)
        rows.append(c[0] + r0)
        cols.append(c[1] + c0)
        vals.append(v.to(dtype))
        r0, c0 = r0 + m.shape[0], c0 + m.shape[1]
    coords = torch.stack([torch.cat(rows), torch.cat(cols)])
    return _shape._build(coords, torch.cat(vals), (r0, c0))


@register(torch.block_diag)
def _block_diag(*tensors):
    if not any(isinstance(x, SparseTensor) for x in tensors):
        return NotImplemented
    return block_diag(tensors)


def diag_embed(t: SparseTensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> SparseTensor:
    """The last dim's entries on the ``offset`` diagonal of new dims ``dim1``, ``dim2``."""
    rank = t.dim() + 1
    d1, d2 = _dim(dim1, rank), _dim(dim2, rank)
    if d1 == d2:
        raise RuntimeError("diagonal dimensions cannot be identical")
    coords, values = _coords(t), values_of(t)
    n = t.shape[-1] + abs(offset)
    i = coords[-1]
    row, col = (i, i + offset) if offset >= 0 else (i - offset, i)
    rest = list(coords[:-1])
    rest_shape = list(t.shape[:-1])
    out: List[torch.Tensor] = []
    shape: List[int] = []
    for d in range(rank):
        if d == d1:
            out.append(row)
            shape.append(n)
        elif d == d2:
            out.append(col)
            shape.append(n)
        else:
            out.append(rest.pop(0))
            shape.append(rest_shape.pop(0))
    return _shape._build(torch.stack(out), values, shape)


def diagonal_entries(t: SparseTensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> SparseTensor:
    """``torch.diagonal``: the entries with ``c[dim2] - c[dim1] == offset``, the other dims
    first and the diagonal's position last, as torch."""
    rank = t.dim()
    d1, d2 = _dim(dim1, rank), _dim(dim2, rank)
    if d1 == d2:
        raise RuntimeError("diagonal dimensions cannot be identical")
    n1, n2 = t.shape[d1], t.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    coords, values = _coords(t), values_of(t)
    on = coords[d2] - coords[d1] == offset
    rest = [k for k in range(rank) if k not in (d1, d2)]
    position = coords[d1] if offset >= 0 else coords[d2]
    out = torch.cat([coords[rest][:, on], position[on][None]])
    return _shape._build(out, values[on], [t.shape[k] for k in rest] + [length])


@register(torch.diag_embed, torch.Tensor.diag_embed)
def _diag_embed(x, offset=0, dim1=-2, dim2=-1):
    t = _sparse(x)
    return NotImplemented if t is None or t.dim() == 0 else diag_embed(t, offset, dim1, dim2)


@register(torch.diagflat, torch.Tensor.diagflat)
def _diagflat(x, offset=0):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    return diag_embed(t.reshape(-1), offset)


def unfold(t: SparseTensor, dim: int, size: int, step: int) -> SparseTensor:
    """``Tensor.unfold``: the windows of ``size`` every ``step`` along ``dim`` (that dim
    becomes the window number, a new last dim the position in the window). Each stored
    entry lands in each window that covers it, at most ``ceil(size / step)`` of them: one
    vectorized pass per such window rank, never a loop over windows."""
    d = _dim(dim, t.dim()) if t.dim() else 0
    n = t.shape[d] if t.dim() else 1
    if size < 0 or size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    windows = (n - size) // step + 1
    coords, values = _coords(t), values_of(t)
    c = coords[d]
    last = torch.div(c, step, rounding_mode="floor")      # the last window starting at or before c
    out_coords, picks = [], []
    for k in range(-(-size // step)):                      # window ranks an entry can be in
        w = last - k
        offset = c - w * step
        pick = ((w >= 0) & (w < windows) & (offset < size)).nonzero().squeeze(1)
        moved = coords[:, pick].clone()
        moved[d] = w[pick]
        out_coords.append(torch.cat([moved, offset[pick][None]]))
        picks.append(pick)
    shape = list(t.shape)
    shape[d] = windows
    pick = torch.cat(picks) if picks else torch.zeros(0, dtype=torch.int64)
    moved = torch.cat(out_coords, 1) if out_coords else torch.zeros((t.dim() + 1, 0), dtype=torch.int64)
    return _shape._build(moved, values[pick], shape + [size])


@register(torch.Tensor.unfold)
def _unfold(x, dimension, size, step):
    t = _sparse(x)
    if t is None or t.dim() == 0:
        return NotImplemented
    return unfold(t, dimension, int(size), int(step))


def cartesian_prod(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cartesian_prod`` of 1-D tensors: row ``r`` holds one entry of each, in
    row-major order of their positions. Column ``j`` stores an entry where tensor ``j`` does:
    its stored entries each repeated over every combination of the others' positions (the
    result's stored entries, no more); a dense tensor brings all its positions."""
    if any(x.dim() != 1 for x in tensors):
        raise RuntimeError("Expect a 1D vector, but got shape "
                           f"{next(list(x.shape) for x in tensors if x.dim() != 1)}")
    if len(tensors) == 1:
        return tensors[0]
    dtype = tensors[0].dtype
    if any(x.dtype != dtype for x in tensors):
        raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    sizes = [x.shape[0] for x in tensors]
    total = math.prod(sizes)
    rows, cols, vals = [], [], []
    for j, x in enumerate(tensors):
        t = _sparse(x)
        if t is None:
            index, v = torch.arange(sizes[j], dtype=torch.int64), x
        else:
            index, v = _coords(t)[0], values_of(t)
        before, after = math.prod(sizes[:j]), math.prod(sizes[j + 1:])
        row = (torch.arange(before, dtype=torch.int64)[:, None, None] * (sizes[j] * after)
               + index[None, :, None] * after + torch.arange(after, dtype=torch.int64)[None, None, :])
        rows.append(row.reshape(-1))
        cols.append(torch.full((row.numel(),), j, dtype=torch.int64))
        vals.append(v[None, :, None].expand(before, v.numel(), after).reshape(-1))
    coords = torch.stack([torch.cat(rows), torch.cat(cols)])
    return _shape._build(coords, torch.cat(vals), (total, len(tensors)))


@register(torch.cartesian_prod)
def _cartesian_prod(*tensors):
    if not any(isinstance(x, SparseTensor) for x in tensors):
        return NotImplemented
    return cartesian_prod(tensors)


def _empty_like_format(t: SparseTensor, size, dtype) -> SparseTensor:
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
    fmt = _shape._unblocked(t._storage.format) if len(size) == t.dim() else as_format("coo", len(size))
    coords = torch.zeros((len(size), 0), dtype=torch.int64)
    return _shape._build(coords, torch.zeros(0, dtype=dtype or t.dtype), size, fmt)


def _new_sparse(x, *size, dtype=None, device=None, requires_grad=False, layout=None,
                pin_memory=False):
    t = _sparse(x)
    if t is None or (device is not None and torch.device(device).type != "cpu") or \
            layout not in (None, x.layout):
        return NotImplemented
    out = _empty_like_format(t, size, dtype)
    return out.requires_grad_(requires_grad) if requires_grad else out


register(torch.Tensor.new_zeros)(_new_sparse)


def _new_dense(method):
    """``new_ones``, ``new_full``, ``new_tensor``, ``new_empty`` of a sparse tensor: a dense tensor that only
    takes its dtype (and device) from it; no dense copy of it is made."""
    def handler(x, *args, **kwargs):
        t = _sparse(x)
        if t is None:
            return NotImplemented
        return method(torch.empty(0, dtype=t.dtype), *args, **kwargs)
    return handler


for _method in (torch.Tensor.new_ones, torch.Tensor.new_full, torch.Tensor.new_tensor,
                torch.Tensor.new_empty):
    register(_method)(_new_dense(_method))


@register(torch.Tensor.sparse_dim)
def _sparse_dim(x):
    # every dimension is a sparse one (blocks are stored, not dense dims), but the trailing
    # dense levels of torch's hybrid layouts (``qqd``, ``dcd``: ``conversion.dense_dim``)
    return x.dim() - dense_dim(x.format)


@register(torch.Tensor.dense_dim)
def _dense_dim(x):
    return dense_dim(x.format)


def repeat_interleave(t: SparseTensor, repeats, dim: Optional[int] = None) -> SparseTensor:
    """``repeat_interleave``: slice ``c`` along ``dim`` (the flattened tensor without one)
    repeated ``repeats[c]`` times, in place: each stored entry copied once per repeat of its
    slice, at ``start[c] + j``. Cost follows the result's stored entries."""
    if dim is None:
        t, dim = t.reshape(-1), 0
    d = _dim(dim, t.dim())
    n = t.shape[d]
    reps = torch.as_tensor(repeats, dtype=torch.int64).reshape(-1)
    if reps.numel() not in (1, n):
        raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                           f"{reps.numel()} and input.size({d}) = {n}")
    if bool((reps < 0).any()):
        raise RuntimeError("repeats can not be negative")
    coords, values = _coords(t), values_of(t)
    if reps.numel() == 1:                  # one count for every slice: no array as long as the dim
        r = int(reps)
        count = torch.full((coords.shape[1],), r, dtype=torch.int64)
        first = coords[d] * r
        total = n * r
    else:
        start = torch.cumsum(reps, 0) - reps
        count, first, total = reps[coords[d]], start[coords[d]], int(reps.sum())
    entry = torch.repeat_interleave(torch.arange(coords.shape[1]), count)
    within = torch.arange(entry.numel()) - (torch.cumsum(count, 0) - count)[entry]
    moved = coords[:, entry].clone()
    moved[d] = first[entry] + within
    shape = list(t.shape)
    shape[d] = total
    return _shape._build(moved, values[entry], shape)


@register(torch.repeat_interleave, torch.Tensor.repeat_interleave)
def _repeat_interleave(x, repeats=None, dim=None, *, output_size=None):
    t = _sparse(x)
    if t is None or repeats is None or isinstance(repeats, SparseTensor):
        return NotImplemented          # repeat_interleave(repeats): an index vector, torch's
    return repeat_interleave(t, repeats, dim)


def combinations(t: SparseTensor, r: int = 2, with_replacement: bool = False) -> SparseTensor:
    """``torch.combinations`` of a 1-D tensor: the rows are the position combinations (their
    count is the result's size); an entry is stored where its position is."""
    n = t.shape[0]
    picks = torch.combinations(torch.arange(n), r, with_replacement)   # (combos, r) positions
    if picks.dim() == 1:
        picks = picks.reshape(-1, max(r, 1)) if picks.numel() else picks.reshape(0, r)
    entry_at = torch.full((n,), -1, dtype=torch.int64)
    coords, values = _coords(t), values_of(t)
    entry_at[coords[0]] = torch.arange(coords.shape[1])
    e = entry_at[picks]
    where = (e >= 0).nonzero().t()
    return _shape._build(where, values[e[e >= 0]], tuple(picks.shape))


@register(torch.combinations)
def _combinations(x, r=2, with_replacement=False):
    t = _sparse(x)
    if t is None or t.dim() != 1 or r <= 0:
        return NotImplemented          # torch's errors (and r = 0: an empty tensor)
    return combinations(t, int(r), bool(with_replacement))
