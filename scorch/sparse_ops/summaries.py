"""Summaries of a sparse tensor built from other sparse ops or from its stored values plus a
count of its implicit zeros, never a dense copy: ``std_mean`` / ``var_mean``, ``aminmax``,
``linalg.norm`` (vector norms and the Frobenius norm), ``dist``, ``F.cosine_similarity``,
``histc`` / ``bincount`` / ``unique`` (the stored values, and the implicit zeros counted
once as a group)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..tensor_type import SparseTensor
from .nonlinear import _sparse

__all__ = ["implicit_zeros"]


def implicit_zeros(t: SparseTensor) -> int:
    """How many positions of ``t`` store nothing (each reads as 0)."""
    return math.prod(t.shape) - t.nnz


def _dense(x):
    return x.to_dense() if isinstance(x, SparseTensor) else x


def _with_mean(spread):
    def handler(x, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
        t = _sparse(x)
        if t is None or out is not None:
            return NotImplemented
        kw = {"keepdim": keepdim} if dim is not None else {}
        if correction is not None:
            kw["correction"] = correction
        elif unbiased is not None:
            kw["unbiased"] = unbiased
        args = (dim,) if dim is not None else ()
        mean = torch.mean(t, *args, keepdim=keepdim) if dim is not None else torch.mean(t)
        return spread(t, *args, **kw), mean
    return handler


register(torch.std_mean)(_with_mean(torch.std))
register(torch.var_mean)(_with_mean(torch.var))


@register(torch.aminmax, torch.Tensor.aminmax)
def _aminmax(x, *, dim=None, keepdim=False, out=None):
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    if dim is None:
        lo, hi = torch.amin(t), torch.amax(t)
    else:
        lo, hi = torch.amin(t, dim, keepdim), torch.amax(t, dim, keepdim)
    return torch.return_types.aminmax((_dense(lo), _dense(hi)))


@register(torch.linalg.norm)
def _linalg_norm(x, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """Vector norms (``dim`` an int, or a 1-D tensor) and the Frobenius norm (``ord`` None or
    ``"fro"`` over every element or two dims) are ``vector_norm``; the spectral and nuclear
    norms (an SVD) and the max-row/column-sum norms are the fallback's."""
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    whole = dim is None and (ord is None or (ord == "fro" and t.dim() == 2) or t.dim() == 1)
    pair = isinstance(dim, (tuple, list)) and len(dim) == 2 and ord in (None, "fro")
    single = isinstance(dim, int) or (isinstance(dim, (tuple, list)) and len(dim) == 1)
    if not (whole or pair or (single and not isinstance(ord, str))):
        return NotImplemented
    p = 2 if ord in (None, "fro") else ord
    return torch.linalg.vector_norm(t, p, dim=dim, keepdim=keepdim, dtype=dtype)


@register(torch.dist, torch.Tensor.dist)
def _dist(x, y, p=2):
    """``vector_norm(x - y, p)``: sparse when both are (the union), else over a dense difference."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return NotImplemented
    return torch.linalg.vector_norm(x - y, p)


@register(F.cosine_similarity, torch.cosine_similarity)
def _cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))`` along ``dim``, torch's formula;
    the product is sparse (the intersection with a sparse operand), the norms follow the
    stored entries."""
    if not (isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor)):
        return NotImplemented
    if x1.dim() != x2.dim() or not (x1.dtype.is_floating_point and x2.dtype.is_floating_point):
        return NotImplemented
    n1 = _dense(torch.linalg.vector_norm(x1, 2, dim=dim, keepdim=True)).clamp_min(eps)
    n2 = _dense(torch.linalg.vector_norm(x2, 2, dim=dim, keepdim=True)).clamp_min(eps)
    dot = _dense(torch.sum(x1 * x2, dim, keepdim=True))
    return (dot / (n1 * n2)).squeeze(dim)


@register(torch.histc, torch.Tensor.histc)
def _histc(x, bins=100, min=0, max=0, *, out=None):
    """The stored values' histogram plus the implicit zeros in 0's bin, over torch's range
    (the data's min and max, counting 0 when something is unstored)."""
    t = _sparse(x)
    if t is None or out is not None or not t.dtype.is_floating_point:
        return NotImplemented
    vals = t._storage.values.detach()
    zeros = implicit_zeros(t)
    lo, hi = float(min), float(max)
    if lo == 0 and hi == 0:
        if not bool(vals.isfinite().all()):
            return NotImplemented              # torch's error about the range, from the fallback
        lo = float(vals.min()) if vals.numel() else 0.0
        hi = float(vals.max()) if vals.numel() else 0.0
        if zeros:
            lo, hi = lo if lo < 0 else 0.0, hi if hi > 0 else 0.0
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = torch.histc(vals, bins, lo, hi)
    if zeros:
        one = torch.histc(torch.zeros(1, dtype=vals.dtype), bins, lo, hi)
        counts = counts + one * zeros
    return counts


@register(torch.bincount, torch.Tensor.bincount)
def _bincount(x, weights=None, minlength=0):
    t = _sparse(x)
    if t is None or weights is not None or t.dim() != 1:
        return NotImplemented
    counts = torch.bincount(t._storage.values, minlength=max(minlength, 1))
    counts[0] += implicit_zeros(t)
    return counts if (minlength or t.numel()) else counts[:0]


@register(torch.unique, torch.Tensor.unique)
def _unique(x, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct stored values, and 0 when something is unstored; ``return_counts`` adds
    the implicit zeros to 0's count. ``return_inverse`` is as large as the dense tensor: the
    fallback's (bounded by the dense limit)."""
    t = _sparse(x)
    if t is None or return_inverse or dim is not None:
        return NotImplemented
    vals = t._storage.values.detach()
    zeros = implicit_zeros(t)
    if zeros:
        vals = torch.cat([vals, torch.zeros(1, dtype=vals.dtype)])
    if not return_counts:
        return torch.unique(vals, sorted=True)
    values, counts = torch.unique(vals, sorted=True, return_counts=True)
    if zeros:
        counts[values == 0] += zeros - 1
    return values, counts
