"""torch's other names for ops scorch already runs sparse, each mapped onto it: the ``*_copy``
forms of the views (``view_copy``, ``permute_copy``, ... : the view, then a copy of the result),
``unsafe_split`` / ``unsafe_chunk``, ``linalg.diagonal``, ``fliplr`` / ``flipud`` / ``rot90``
(``flip`` and a transpose), ``fft.fftshift`` / ``ifftshift`` of a real tensor (``roll``),
``pixel_shuffle`` / ``pixel_unshuffle`` / ``channel_shuffle`` (a reshape, a permute, a
reshape), ``linalg.vecdot`` (a sparse product and a sum), ``addr`` / ``addbmm`` (the product
as one einsum, then ``beta * input + alpha * product``), ``F.bilinear`` (one einsum),
``Tensor.item`` and the ATen ``expand`` / ``cat`` that torch's composite functions
(``broadcast_tensors``, ``meshgrid``, ``gradient``) reach. Without these the call would
decompose into ATen ops on dense copies. Each is differentiable as the ops it maps to."""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch
import torch.nn.functional as F

from .._dispatch import register, register_aten
from ..tensor_type import SparseTensor
from . import composites
from . import shape as _shape
from .comparison import _involves_sparse
from .dims import checked_dim
from .einsum import einsum
from .nonlinear import _sparse

aten = torch.ops.aten

__all__: list = []


def _copied(result):
    """A fresh copy of a view's result (a tuple of pieces: each)."""
    if isinstance(result, (tuple, list)):
        return type(result)(_copied(r) for r in result)
    return result.clone() if isinstance(result, torch.Tensor) else result


def _as_copy(view):
    def handler(x, *args, out=None, **kwargs):
        if _sparse(x) is None or out is not None:
            return NotImplemented
        return _copied(view(_sparse(x), *args, **kwargs))
    return handler


_COPIES = {
    torch.expand_copy: lambda t, size, implicit=False: t.expand(*size),
    torch.permute_copy: lambda t, dims: t.permute(*dims),
    torch.t_copy: lambda t: t.t(),
    torch.transpose_copy: lambda t, dim0, dim1: t.transpose(dim0, dim1),
    torch.squeeze_copy: lambda t, dim=None: t.squeeze() if dim is None else t.squeeze(dim),
    torch.unsqueeze_copy: lambda t, dim: t.unsqueeze(dim),
    torch.unbind_copy: lambda t, dim=0: t.unbind(dim),
    torch.unfold_copy: lambda t, dimension, size, step: t.unfold(dimension, size, step),
    torch.view_copy: lambda t, size: t.reshape(*size) if not isinstance(size, torch.dtype) else NotImplemented,
    torch.diagonal_copy: lambda t, offset=0, dim1=0, dim2=1: torch.diagonal(t, offset, dim1, dim2),
    torch.split_with_sizes_copy: lambda t, split_sizes, dim=0: t.split_with_sizes(split_sizes, dim),
    torch.split_copy: lambda t, split_size, dim=0: t.split(split_size, dim),
    torch.narrow_copy: lambda t, dim, start, length: t.narrow(dim, start, length),
    torch.Tensor.narrow_copy: lambda t, dim, start, length: t.narrow(dim, start, length),
    torch.select_copy: lambda t, dim, index: t.select(dim, index),
    torch.slice_copy: lambda t, dim=0, start=None, end=None, step=1: t[(slice(None),) * checked_dim(dim, t.dim()) + (slice(start, end, step),)],
    torch.alias_copy: lambda t: t,
    torch.detach_copy: lambda t: t.detach(),
    torch.unsafe_split: lambda t, split_size, dim=0: t.split(split_size, dim),
    torch.Tensor.unsafe_split: lambda t, split_size, dim=0: t.split(split_size, dim),
    torch.unsafe_split_with_sizes: lambda t, split_sizes, dim=0: t.split_with_sizes(split_sizes, dim),
    torch.unsafe_chunk: lambda t, chunks, dim=0: t.chunk(chunks, dim),
    torch.Tensor.unsafe_chunk: lambda t, chunks, dim=0: t.chunk(chunks, dim),
}
for _fn, _view in _COPIES.items():
    register(_fn)(_as_copy(_view))


@register(torch.linalg.diagonal)
def _linalg_diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    t = _sparse(A)
    return NotImplemented if t is None else torch.diagonal(t, offset, dim1, dim2)


@register(torch.fliplr, torch.Tensor.fliplr)
def _fliplr(x):
    t = _sparse(x)
    if t is None or t.dim() < 2:
        return NotImplemented              # torch's error
    return torch.flip(t, (1,))


@register(torch.flipud, torch.Tensor.flipud)
def _flipud(x):
    t = _sparse(x)
    if t is None or t.dim() < 1:
        return NotImplemented
    return torch.flip(t, (0,))


@register(torch.rot90, torch.Tensor.rot90)
def _rot90(x, k=1, dims=(0, 1)):
    """torch's rotation: ``flip`` of one dim and a transpose (two flips for ``k = 2``)."""
    t = _sparse(x)
    if t is None or len(dims) != 2 or t.dim() < 2:
        return NotImplemented              # torch's errors
    a, b = (checked_dim(d, t.dim()) for d in dims)
    if a == b:
        return NotImplemented
    k %= 4
    if k == 1:
        return torch.flip(t, (b,)).transpose(a, b)
    if k == 2:
        return torch.flip(t, (a, b))
    if k == 3:
        return torch.flip(t, (a,)).transpose(a, b)
    return t.clone()


def _shift(inverse: bool):
    def handler(x, dim=None):
        t = _sparse(x)
        if t is None or t.dtype.is_complex or t.dim() == 0:
            return NotImplemented
        dims = list(range(t.dim())) if dim is None else [dim] if isinstance(dim, numbers.Integral) else list(dim)
        shifts = [(t.shape[d] + 1) // 2 if inverse else t.shape[d] // 2 for d in dims]
        return torch.roll(t, shifts, dims)
    return handler


register(torch.fft.fftshift)(_shift(False))
register(torch.fft.ifftshift)(_shift(True))


@register(F.pixel_shuffle, torch.pixel_shuffle)
def _pixel_shuffle(x, upscale_factor):
    t = _sparse(x)
    r = int(upscale_factor)
    if t is None or t.dim() < 3 or t.shape[-3] % (r * r):
        return NotImplemented              # torch's errors
    *lead, c, h, w = t.shape
    n = len(lead)
    y = t.reshape(*lead, c // (r * r), r, r, h, w)
    y = y.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@register(F.pixel_unshuffle, torch.pixel_unshuffle)
def _pixel_unshuffle(x, downscale_factor):
    t = _sparse(x)
    r = int(downscale_factor)
    if t is None or t.dim() < 3 or t.shape[-2] % r or t.shape[-1] % r:
        return NotImplemented
    *lead, c, h, w = t.shape
    n = len(lead)
    y = t.reshape(*lead, c, h // r, r, w // r, r)
    y = y.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return y.reshape(*lead, c * r * r, h // r, w // r)


@register(F.channel_shuffle, torch.channel_shuffle, torch.native_channel_shuffle)
def _channel_shuffle(x, groups):
    t = _sparse(x)
    g = int(groups)
    if t is None or t.dim() < 3 or g <= 0 or t.shape[1] % g:
        return NotImplemented
    n, c, *rest = t.shape
    return t.reshape(n, g, c // g, *rest).transpose(1, 2).reshape(n, c, *rest)


@register(torch.linalg.vecdot)
def _vecdot(x, y, *, dim=-1, out=None):
    if out is not None or not _involves_sparse(x, y) or not isinstance(x, torch.Tensor) \
            or not isinstance(y, torch.Tensor) or x.dtype.is_complex or y.dtype.is_complex:
        return NotImplemented
    return (x * y).sum(dim)


def _scaled_sum(input, product, beta, alpha):
    """``beta * input + alpha * product`` as torch's ``addmm`` family: ``beta = 0`` ignores
    ``input`` (its NaNs too)."""
    product = product if alpha == 1 else product * alpha
    if beta == 0:
        return product + torch.zeros((), dtype=product.dtype)   # a new tensor, as torch
    return (input if beta == 1 else input * beta) + product


@register(torch.addr, torch.Tensor.addr)
def _addr(input, vec1, vec2, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves_sparse(input, vec1, vec2):
        return NotImplemented
    if vec1.dim() != 1 or vec2.dim() != 1:
        return NotImplemented              # torch's error
    return _scaled_sum(input, einsum("i,j->ij", vec1, vec2), beta, alpha)


@register(torch.addbmm, torch.Tensor.addbmm)
def _addbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves_sparse(input, batch1, batch2):
        return NotImplemented
    if batch1.dim() != 3 or batch2.dim() != 3:
        return NotImplemented
    return _scaled_sum(input, einsum("bij,bjk->ik", batch1, batch2), beta, alpha)


@register(F.bilinear)
def _bilinear(input1, input2, weight, bias=None):
    """``y[..., o] = x1[..., i] W[o, i, j] x2[..., j] + b[o]``: one einsum."""
    if not _involves_sparse(input1, input2, weight) or input1.dim() < 1 or weight.dim() != 3:
        return NotImplemented
    lead = "abcdefgh"[:input1.dim() - 1]
    y = einsum(f"{lead}i,oij,{lead}j->{lead}o", input1, weight, input2)
    return y if bias is None else y + bias


@register(torch.Tensor.item)
def _item(x):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if math.prod(t.shape) != 1:
        raise RuntimeError(f"a Tensor with {math.prod(t.shape)} elements cannot be converted to Scalar")
    return t._storage.values.sum().item() if t.nnz else torch.zeros((), dtype=t.dtype).item()


@register(torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.__array__)
def _to_numpy(x, *args, **kwargs):
    """numpy arrays and lists are dense: say how to get one (torch's sparse tensors refuse
    too, with "Use Tensor.to_dense() first")."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    raise RuntimeError(f"a scorch sparse tensor ({t._storage.format} {tuple(t.shape)}, "
                       f"{t.nnz} stored entries) has no numpy / list form: use "
                       f".to_dense().numpy() or .to_dense().tolist() for its dense values, "
                       f".to_scipy() for a scipy.sparse matrix, or .values() / .indices() "
                       f"for the stored entries")


@register_aten(aten.expand.default)
def _aten_expand(t, size, implicit=False):
    # the sparse implementations themselves: below ATen, ``t.expand`` would come back here
    out = composites._expand(t, *size)
    if out is NotImplemented:
        raise RuntimeError(f"expand: cannot expand a tensor of shape {tuple(t.shape)} to {list(size)}")
    return SparseTensor(out._storage) if out is t else out


@register_aten(aten.cat.default)
def _aten_cat(tensors: Sequence[torch.Tensor], dim: int = 0):
    return _shape.cat(list(tensors), dim)
