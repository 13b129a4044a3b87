"""Summaries of a sparse tensor built from other sparse ops or from its stored values plus a
count of its implicit zeros, never a dense copy: ``std_mean`` / ``var_mean``, ``aminmax``,
``linalg.norm`` / ``linalg.matrix_norm`` (vector norms, Frobenius, the max row / column
sums; the SVD norms are dense by nature), ``dist``, ``F.cosine_similarity``,
``histc`` / ``bincount`` / ``unique`` (the stored values, and the implicit zeros counted
once as a group), ``sum_to_size``, ``bernoulli`` of sparse probabilities."""
from __future__ import annotations

import math
import numbers
import warnings

import torch
import torch.nn.functional as F

from .._dispatch import check_dense_size, register
from ..tensor_type import SparseTensor
from .dims import checked_dim, checked_dims
from .nonlinear import _sparse
from ..broadcasting import broadcast_shapes

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
        if isinstance(dim, bool):        # the overload std_mean(input, unbiased)
            dim, unbiased = None, dim
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


#: torch's names of the integer scalar types (its error messages')
_SCALAR_NAMES = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                 torch.uint8: "Byte", torch.bool: "Bool"}


def matrix_norm(t: SparseTensor, ord, dim=(-2, -1), keepdim: bool = False, dtype=None) -> torch.Tensor:
    """Frobenius: ``vector_norm`` over the two dims; the max column / row sum norms (``1``,
    ``inf``; ``-1``, ``-inf`` with the min): sums of ``|x|`` then ``amax``/``amin``, from the
    stored entries; the spectral and nuclear norms need an SVD: dense by nature."""
    d0, d1 = checked_dims(dim, t.dim(), "linalg.matrix_norm")
    if not (t.dtype.is_floating_point or t.dtype.is_complex):   # torch's check, every order
        raise RuntimeError(f"linalg.matrix_norm: Expected a floating point or complex tensor as "
                           f"input. Got {_SCALAR_NAMES.get(t.dtype, t.dtype)}")
    if ord == "fro":
        return torch.linalg.vector_norm(t, 2, dim=(d0, d1), keepdim=keepdim, dtype=dtype)
    if ord in (1, -1, math.inf, -math.inf):
        inner, outer = (d0, d1) if ord in (1, -1) else (d1, d0)   # 1: sum a column (over d0)
        pick = torch.amax if ord > 0 else torch.amin
        sums = torch.sum(torch.abs(t if dtype is None else t.to(dtype)), inner, keepdim=True)
        if t.shape[outer] == 0 and ord > 0:
            # torch: the largest of no sums is 0 (the smallest raises, as amin)
            out = torch.zeros(sums.shape[:outer] + (1,) + sums.shape[outer + 1:], dtype=sums.dtype)
        else:
            out = _dense(pick(sums, outer, keepdim=True))     # the sums stay sparse: no O(extent) array
        return out if keepdim else out.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    check_dense_size("matrix_norm", t.shape, t.dtype)
    return torch.linalg.matrix_norm(t.to_dense(), ord, dim=(d0, d1), keepdim=keepdim, dtype=dtype)


@register(torch.linalg.matrix_norm)
def _matrix_norm(x, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    t = _sparse(x)
    if t is None or out is not None or t.dim() < 2:
        return NotImplemented
    return matrix_norm(t, ord, dim, keepdim, dtype)


@register(torch.linalg.norm)
def _linalg_norm(x, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """Vector norms (``dim`` an int, or a 1-D input) and the Frobenius norm over every element
    are ``vector_norm``; a matrix ``ord`` (two dims, or a 2-D input) is ``matrix_norm``."""
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None and (ord is None or t.dim() == 1):
        return torch.linalg.vector_norm(t, 2 if ord is None else ord, keepdim=keepdim, dtype=dtype)
    if dim is None and t.dim() == 2:
        dim = (0, 1)
    if dim is None or len(dim) not in (1, 2):
        return NotImplemented                  # torch's error
    if len(dim) == 1:
        if isinstance(ord, str):
            return NotImplemented
        return torch.linalg.vector_norm(t, 2 if ord is None else ord, dim=dim, keepdim=keepdim, dtype=dtype)
    return matrix_norm(t, "fro" if ord is None else ord, dim, keepdim, dtype)


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
    fallback's (bounded by the dense limit). In the graph as torch's (whose backward raises)."""
    from ..gradients.values import values_of
    t = _sparse(x)
    if t is None or return_inverse or dim is not None:
        return NotImplemented
    vals = values_of(t)
    zeros = implicit_zeros(t)
    if zeros:
        vals = torch.cat([vals, torch.zeros(1, dtype=vals.dtype)])
    if not return_counts:
        return torch.unique(vals, sorted=True)
    values, counts = torch.unique(vals, sorted=True, return_counts=True)
    if zeros:
        counts[values == 0] += zeros - 1
    return values, counts


@register(torch.Tensor.sum_to_size)
def _sum_to_size(x, *size):
    """The sum over the dims that ``size`` broadcasts (leading ones, and size-1 ones), as
    torch's: ``sum`` keeping those dims, then the leading ones dropped."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    if broadcast_shapes(size, t.shape) != t.shape:
        raise RuntimeError(f"size {list(size)} is not expandable to size {list(t.shape)}")
    lead = t.dim() - len(size)
    dims = list(range(lead)) + [lead + k for k, n in enumerate(size) if n == 1 and t.shape[lead + k] != 1]
    if not dims:
        return t
    out = torch.sum(t, dims, keepdim=True)
    return out.reshape(size)


@register(torch.bernoulli, torch.Tensor.bernoulli)
def _bernoulli(x, *args, generator=None, out=None, **kwargs):
    """``bernoulli(p)`` with a sparse ``p``: a draw per stored probability (0 where nothing is
    stored, as probability 0 gives); a scalar ``p`` draws at every position: the fallback's."""
    t = _sparse(x)
    if t is None or args or kwargs or out is not None:
        return NotImplemented
    from ..gradients.values import from_values, values_of
    return from_values(t._storage, torch.bernoulli(values_of(t), generator=generator))


def covariance(t: SparseTensor, correction: int = 1, fweights=None, aweights=None) -> torch.Tensor:
    """``torch.cov`` of the rows of ``t`` (variables x observations; 1-D: one variable) from
    its stored entries: ``(X W X^T - w_sum a a^T) / norm`` with ``a = X w / w_sum`` (torch's
    weights and normalisation), the product one sparse einsum. Dense by nature (variables x
    variables). Expanding the centred product never centres (densifies) ``X`` but cancels
    where a variable's mean is large next to its spread: float32 and narrower inputs are
    therefore summed in float64 (2000 observations around 1000 with spread 0.1: 0.448
    against 0.0104 in float32; float64 inputs keep their own precision)."""
    from .einsum import einsum
    x = t.reshape(1, -1) if t.dim() == 1 else t
    if x.dim() != 2:
        raise ValueError(f"cov(): expected input to have two or fewer dimensions but got an input with {t.dim()} dimensions")
    n = x.shape[1]
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    w = None
    if fweights is not None:
        w = fweights.to(dtype)
    if aweights is not None:
        w = aweights.to(dtype) if w is None else w * aweights.to(dtype)
    out_dtype = dtype
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        dtype = torch.float64
        w = None if w is None else w.to(dtype)
    xs = x if x.dtype == dtype else x.to(dtype)
    if w is None:
        w_sum = torch.tensor(float(n), dtype=dtype)
        avg = _dense(torch.sum(xs, 1)) / w_sum
        product = _dense(einsum("ik,jk->ij", xs, xs))
    else:
        w_sum = w.sum()
        avg = _dense(einsum("ik,k->i", xs, w)) / w_sum
        product = _dense(einsum("ik,k,jk->ij", xs, w, xs))
    if aweights is None:
        norm = w_sum - correction
    else:
        norm = w_sum - correction * (w * aweights.to(dtype)).sum() / w_sum
    norm = norm.clamp_min(0)
    c = ((product - w_sum * avg[:, None] * avg[None, :]) / norm).to(out_dtype)
    return c.reshape(()) if x.shape[0] == 1 else c         # one variable: a scalar, as torch


@register(torch.cov, torch.Tensor.cov)
def _cov(x, *, correction=1, fweights=None, aweights=None):
    t = _sparse(x)
    if t is None or t.dtype.is_complex or any(isinstance(w, SparseTensor) for w in (fweights, aweights)):
        return NotImplemented
    with warnings.catch_warnings():   # torch's checks (the stand-in's degrees of freedom are not t's)
        warnings.simplefilter("ignore")
        torch.cov(torch.zeros(tuple(min(s, 1) for s in t.shape), dtype=t.dtype), correction=correction)
    n = t.shape[-1] if t.dim() else 1
    if fweights is None and aweights is None and n - correction <= 0:
        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less "
                      "than the number of observations.", UserWarning)
    return covariance(t, correction, fweights, aweights)


@register(torch.corrcoef, torch.Tensor.corrcoef)
def _corrcoef(x):
    """torch's formula on the covariance: divided by both standard deviations, clipped to
    [-1, 1]."""
    t = _sparse(x)
    if t is None or t.dtype.is_complex:
        return NotImplemented
    c = covariance(t)
    if c.dim() == 0:
        return c / c
    std = c.diagonal().sqrt()
    return (c / std[:, None] / std[None, :]).clip(-1, 1)


def trapezoid(t: SparseTensor, x=None, dx=None, dim: int = -1) -> torch.Tensor:
    """``torch.trapezoid``: a weighted sum along ``dim``, each position weighted by half the
    spacing on either side (``dx``, or the differences of ``x``): one sparse product with the
    (dense) weights and a sparse sum, never a dense copy of ``t``."""
    d = checked_dim(dim, t.dim(), "trapezoid")
    n = t.shape[d]
    if n == 0:
        shape = [s for k, s in enumerate(t.shape) if k != d]
        return torch.zeros(shape, dtype=t.dtype if t.dtype.is_floating_point else torch.get_default_dtype())
    if x is None:               # even spacing: dx * (sum - (first + last) / 2), no O(n) weights
        step = 1.0 if dx is None else float(dx)
        dtype = t.dtype if t.dtype.is_floating_point else torch.get_default_dtype()
        tt = t if t.dtype == dtype else t.to(dtype)
        ends = _dense(torch.select(tt, d, 0)) + _dense(torch.select(tt, d, n - 1))
        return (_dense(torch.sum(tt, d)) - ends * 0.5) * step
    if x.dim() == 1:
        if x.shape[0] != n:
            raise RuntimeError("trapezoid: There must be one `x` value for each sample point")
        gaps = x.diff()
    else:
        gaps = x.diff(dim=d)
    pad = [0] * (2 * (gaps.dim() - (d if gaps.dim() > 1 else 0) - 1))
    left = F.pad(gaps, pad + [1, 0]) if gaps.dim() > 1 else F.pad(gaps, (1, 0))
    right = F.pad(gaps, pad + [0, 1]) if gaps.dim() > 1 else F.pad(gaps, (0, 1))
    weight = (left + right) / 2
    if weight.dim() == 1:
        weight = weight.reshape([n if k == d else 1 for k in range(t.dim())])
    dtype = torch.promote_types(t.dtype, weight.dtype) if t.dtype.is_floating_point else torch.get_default_dtype()
    return _dense(torch.sum(t * weight.to(dtype), d))


def _trapezoid_handler(x_keyword: str):
    def handler(y, x=None, *args, dx=None, dim=-1):
        t = _sparse(y)
        if t is None or t.dim() == 0 or isinstance(x, SparseTensor):
            return NotImplemented
        if args:                             # trapz(y, dx, dim) / trapezoid(y, x, dim)
            dim = args[0]
        if isinstance(x, numbers.Number):    # trapz(y, dx=...) given positionally
            x, dx = None, x
        return trapezoid(t, x, dx, dim)
    return handler


register(torch.trapezoid)(_trapezoid_handler("x"))
register(torch.trapz)(_trapezoid_handler("x"))
