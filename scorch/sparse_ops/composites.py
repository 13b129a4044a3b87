"""Ops that are a few stored-value operations or other sparse ops, never a dense copy:
``clamp``/``clip``, ``nan_to_num``, ``isnan``/``isinf``/``signbit``, ``heaviside(x, 0)``,
``prelu``, ``lerp``, ``count_nonzero``, ``any``/``all``,
``vector_norm`` (``norm``, ``F.normalize``), ``tril``/``triu``, ``narrow`` (a slice), ``diff``
(slices and a subtraction), ``var``/``std`` (two passes over the stored values),
``flip``/``roll``/``repeat``/``expand`` (coordinates moved), ``matrix_power`` (sparse
products), ``equal``/``allclose``, ``nonzero``, ``argmax``/``argmin``, ``prod``, and the ops
whose ``f(0, other)`` is 0 on the stored values (``fmod``, ``remainder``, ``floor_divide``,
``div`` with a rounding mode, through ``elementwise.on_stored_values``).

Where ``f(0) == 0`` (``clamp`` with ``min <= 0 <= max``, ``nan_to_num``, ``isnan``) the op
runs on the values array and keeps the pattern; ``clamp`` that moves 0 is dense by nature
(a dense tensor of ``clamp(0)`` with the stored entries written in). Reductions over every
element read the stored values and count the implicit zeros. Each is differentiable in the
stored values where torch's op is (``gradients.values``: values out, pattern back in)."""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .._dispatch import check_dense_size, register
from ..gradients import fiber_ops
from ..gradients.values import from_coordinates, from_values, values_of
from ..formats import as_format
from ..tensor_type import SparseTensor, as_scorch, is_sparse_operand
from . import elementwise, inner_level, nonlinear, reductions
from .dims import checked_dim, checked_dims
from .nonlinear import _sparse
from . import shape as _shape
from ..broadcasting import broadcast_shapes

__all__ = ["clamp", "nan_to_num", "lerp", "count_nonzero", "vector_norm", "var", "tril", "triu"]


def _number(x) -> bool:
    return x is None or (isinstance(x, numbers.Real) and not isinstance(x, bool))


def _convert():
    from .._runtime import convert
    return convert


def _numel(t: SparseTensor) -> int:
    return math.prod(t.shape)


def clamp(t: SparseTensor, min=None, max=None) -> torch.Tensor:
    """Scalar bounds. Keeps ``t``'s pattern when ``clamp(0) == 0``; else dense by nature."""
    vals = torch.clamp(values_of(t), min, max)
    zero = torch.clamp(torch.zeros((), dtype=t.dtype), min, max)
    if zero == 0:
        return from_values(t._storage, vals)
    check_dense_size("clamp", t.shape, vals.dtype)
    out = torch.full(t.shape, float(zero), dtype=vals.dtype)
    if t.nnz:
        out = out.index_put(tuple(_convert().coords(t._storage)), vals)
    return out


def nan_to_num(t: SparseTensor, nan=0.0, posinf=None, neginf=None) -> SparseTensor:
    return from_values(t._storage, torch.nan_to_num(values_of(t), nan, posinf, neginf))


def lerp(start, end, weight) -> torch.Tensor:
    """torch's formula through the sparse ops (the union of the patterns where both are
    sparse): ``start + weight * (end - start)`` for a weight below 0.5, else ``end - (end -
    start) * (1 - weight)``, so the ends are exact (``lerp(1e8, 1, 1.0)`` is 1, not 0)."""
    diff = end - start
    if isinstance(weight, numbers.Real) or (isinstance(weight, torch.Tensor) and weight.numel() == 1
                                            and not is_sparse_operand(weight)):
        if float(weight) < 0.5:
            return start + weight * diff
        return end - diff * (1 - weight)
    return torch.where(weight < 0.5, start + weight * diff, end - diff * (1 - weight))


def count_nonzero(t: SparseTensor, dim=None) -> torch.Tensor:
    """Dense int64 counts, as torch: along a compressed level's rows a difference of a
    running count at ``pos``, otherwise the nonzero entries counted by their kept
    coordinates (CSR's columns: its ``crd`` as it is); O(entries + result) either way. A
    sum kernel into a sparse vector made dense had cost 26x scipy's time on a hypersparse
    2M x 2M matrix."""
    st = t._storage
    values = st.values
    if dim is None:
        return torch.count_nonzero(values)
    dims = checked_dims(dim, t.dim(), "count_nonzero")
    kept = [d for d in range(t.dim()) if d not in dims]
    if not kept or not dims:              # dim=[] counts over every dim, as torch
        return torch.count_nonzero(values)
    nonzero = values != 0
    every = bool(nonzero.all())
    if dims == [st.levels[-1].dim] and inner_level.dense_compressed(st):
        pos = st.levels[1].pos.to(torch.int64)
        if every:
            return pos.diff()
        running = torch.zeros(values.numel() + 1, dtype=torch.int64)
        torch.cumsum(nonzero, 0, out=running[1:])
        return running[pos[1:]] - running[pos[:-1]]
    shape = [t.shape[d] for d in kept]
    if kept == [st.levels[-1].dim] and inner_level.dense_compressed(st):
        key = st.levels[1].crd                        # CSR down its columns
    else:
        key = fiber_ops.fiber_numbers(_shape._coords_of(st), t.shape, kept)
    if every:
        return torch.bincount(key, minlength=math.prod(shape)).reshape(shape)
    counts = torch.zeros(math.prod(shape), dtype=torch.int64)
    return counts.index_add_(0, key, nonzero.to(torch.int64)).reshape(shape)


def _all_stored_nonzero(t: SparseTensor) -> bool:
    return int((t._storage.values != 0).sum()) == _numel(t)


def vector_norm(t: SparseTensor, ord=2, dim=None, keepdim: bool = False) -> torch.Tensor:
    """``ord`` > 0 (or 0: the count of nonzeros). Over every element: the norm of the stored
    values (the implicit zeros add nothing); along ``dim``: ``(sum |x|^ord)^(1/ord)``
    through the sparse ops (``amax(|x|)`` for inf)."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as "
                           f"input. Got {t.dtype}")
    if t.dtype.is_complex:        # the norm of the moduli (real), as torch
        t = from_values(t._storage, values_of(t).abs())
    reduced = range(t.dim()) if dim is None else \
        checked_dims(dim, t.dim(), "linalg.vector_norm")
    if ord == math.inf and math.prod(t.shape[d] for d in reduced) == 0:
        raise RuntimeError("linalg.vector_norm cannot compute the inf norm on an empty tensor "
                           "because the operation does not have an identity")
    if dim is None and not keepdim:
        if ord == 0:
            return count_nonzero(t).to(t.dtype)
        if ord < 0:
            return _negative_order_norm(t, float(ord), list(range(t.dim())), False)
        vals = values_of(t)
        if vals.numel() == 0:       # 0, in the graph (torch's inf norm of no values raises)
            return vals.sum()
        return torch.linalg.vector_norm(vals, ord)
    if ord < 0:
        return _negative_order_norm(t, float(ord), reduced, keepdim)
    dims = tuple(range(t.dim())) if dim is None else dim
    a = nonlinear.apply("abs", t)
    if ord == math.inf:   # dense, as every other order
        return _shape_dense(nonlinear.amax(a, dims, keepdim))
    if ord == 0:   # dense, as every other order (a sum into a sparse result for some formats)
        s = reductions.sum(from_values(t._storage, (values_of(t) != 0).to(t.dtype)), dims, keepdim)
        return s.to_dense() if isinstance(s, SparseTensor) else s
    if ord == 2:
        powered = nonlinear.apply("square", t)
    elif ord < 1:                 # |x|^p's derivative is inf * 0 at a stored 0: masked there
        powered = from_values(t._storage, _abs_pow(values_of(t), float(ord)))
    else:
        powered = nonlinear.apply("pow", a, float(ord))
    s = reductions.sum(powered, dims, keepdim)
    s = s.to_dense() if isinstance(s, SparseTensor) else s
    return _Root.apply(s, float(ord))


def _abs_pow(vals: torch.Tensor, p: float) -> torch.Tensor:
    """``|vals| ** p`` whose gradient is 0 at a 0 (torch's norm backward masks the zeros; the
    power's own derivative there is ``p * 0^(p-1) * sign(0) = inf * 0 = NaN`` for ``p < 1``):
    the power taken on 1 in place of each 0, its result replaced by 0 there, so no NaN
    reaches the backward (nor a second one)."""
    zero = vals == 0
    safe = torch.where(zero, torch.ones((), dtype=vals.dtype), vals)
    return torch.where(zero, torch.zeros((), dtype=vals.dtype), safe.abs().pow(p))


def var(t: SparseTensor, dim=None, correction: float = 1, keepdim: bool = False,
        name: str = "var", widened: bool = False) -> torch.Tensor:
    """Two passes as torch's (no cancellation): the mean, then the squared deviations of the
    stored entries scattered into their fibers, plus ``mean^2`` for each implicit zero;
    O(stored entries) torch ops on the values, differentiable through them. ``widened``:
    the result in the float64 it was summed in (``std`` takes the root there first)."""
    rank = t.dim()
    dims = reductions._reduced_dims(dim, rank, "var")
    kept = [d for d in range(rank) if d not in dims]
    n = math.prod(t.shape[d] for d in dims)
    kept_shape = [t.shape[d] for d in kept]
    if n - correction <= 0:
        warnings.warn(f"{name}(): degrees of freedom is <= 0. Correction should be strictly less "
                      f"than the reduction factor (input numel divided by output numel).")
    coords = _convert().coords(t._storage)
    fiber = torch.zeros(coords.shape[1], dtype=torch.int64)
    for d in kept:                                   # each stored entry's fiber, linearised
        fiber = fiber * t.shape[d] + coords[d]
    fibers = math.prod(kept_shape)
    # summed in float64 below float64, as torch's CPU var: a float32 running sum over 1e6
    # entries had 4.7e-4 relative error (torch 7.8e-9), and squares of 1e20 overflowed
    vals = values_of(t)
    work = torch.float64 if vals.dtype in (torch.float32, torch.float16, torch.bfloat16) else vals.dtype
    vals = vals.to(work)
    mean = torch.zeros(fibers, dtype=work).index_add(0, fiber, vals) / n
    deviation = (vals - mean[fiber]) ** 2
    squares = torch.zeros(fibers, dtype=deviation.dtype).index_add(0, fiber, deviation)
    implicit = n - torch.bincount(fiber, minlength=fibers)
    out = ((squares + implicit * mean ** 2) / max(n - correction, 0)).reshape(kept_shape)
    if not widened and t.dtype.is_floating_point:
        out = out.to(t.dtype)
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out


def _var_args(dim, unbiased, correction):
    if isinstance(dim, bool):                        # var(x, unbiased)
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


def _triangle(name: str, t: SparseTensor, diagonal: int) -> SparseTensor:
    """The stored entries on one side of a diagonal: a filter of the coordinates, O(nnz)."""
    if t.dim() < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    st = t._storage
    if inner_level.dense_compressed(st):
        # CSR / CSC: a mask over the second level's coordinates against each entry's row
        first, inner = st.levels
        parent = inner_level.entry_parents(inner.pos, st.nnz)
        rows, cols = (parent, inner.crd) if first.dim == 0 else (inner.crd, parent)
        offset = cols.to(torch.int64) - rows.to(torch.int64)
        return inner_level.keep_entries(t, offset <= diagonal if name == "tril" else offset >= diagonal)
    coords = _convert().coords(st)
    offset = coords[-1] - coords[-2]
    keep = offset <= diagonal if name == "tril" else offset >= diagonal
    idx = coords[:, keep]
    built = _convert().from_coords(idx, st.values[keep], st.shape, _shape.result_format(st.format))
    return from_coordinates(built, idx, values_of(t)[keep])


def _moved(t: SparseTensor, coords: torch.Tensor, values: torch.Tensor, shape) -> SparseTensor:
    """The entries ``values`` at new ``coords`` (unique), in ``t``'s format, differentiable
    in ``values``: an O(nnz log nnz) rebuild, never a dense copy."""
    fmt = _shape.result_format(t._storage.format)
    built = _convert().from_coords(coords, values.detach(), tuple(shape), fmt, sum_duplicates=False)
    return from_coordinates(built, coords, values)


def flip(t: SparseTensor, dims) -> SparseTensor:
    dims = set(checked_dims(dims, t.dim(), "flip"))
    direct = inner_level.flip_dense_compressed(t, dims)
    if direct is not None:
        return direct
    coords = _convert().coords(t._storage).clone()
    for d in dims:
        coords[d] = t.shape[d] - 1 - coords[d]
    return _moved(t, coords, values_of(t), t.shape)


def roll(t: SparseTensor, shifts, dims) -> SparseTensor:
    shifts = [shifts] if isinstance(shifts, numbers.Integral) else list(shifts)
    dims = [checked_dim(d, t.dim(), "roll") for d in
            ([dims] if isinstance(dims, numbers.Integral) else list(dims))]
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:"
                           f"{len(dims)}")
    coords = _convert().coords(t._storage).clone()
    for s, d in zip(shifts, dims):
        if t.shape[d]:
            coords[d] = (coords[d] + s) % t.shape[d]
    return _moved(t, coords, values_of(t), t.shape)


def repeat(t: SparseTensor, sizes) -> SparseTensor:
    """``t`` tiled ``sizes`` times (leading new dims as torch): each stored entry once per
    tile, at its coordinates plus the tile's offset."""
    sizes = list(sizes)
    if len(sizes) > t.dim():
        t = t.reshape((1,) * (len(sizes) - t.dim()) + tuple(t.shape))
    coords = _convert().coords(t._storage)
    shape = [n * r for n, r in zip(t.shape, sizes)]
    tiles = math.prod(sizes)
    nnz = coords.shape[1]
    tile = torch.arange(tiles, dtype=torch.int64)
    out = coords.repeat(1, tiles)
    for d in range(len(sizes) - 1, -1, -1):           # the tile's index along each dim
        out[d] += (tile % sizes[d]).repeat_interleave(nnz) * t.shape[d]
        tile = tile // sizes[d]
    return _moved(t, out, values_of(t).repeat(tiles), shape)


def tril(t: SparseTensor, diagonal: int = 0) -> SparseTensor:
    return _triangle("tril", t, diagonal)


def triu(t: SparseTensor, diagonal: int = 0) -> SparseTensor:
    return _triangle("triu", t, diagonal)


# --- registration -------------------------------------------------------------------------

@register(torch.clamp, torch.Tensor.clamp, torch.clip, torch.Tensor.clip)
def _clamp(x, min=None, max=None, *, out=None):
    # tensor bounds: maximum, then minimum (torch's rule: max wins where min > max); each is
    # sparse or dense as its operands make it
    if out is None and (isinstance(min, torch.Tensor) or isinstance(max, torch.Tensor)):
        x = x if min is None else torch.maximum(x, min)
        return x if max is None else torch.minimum(x, max)
    t = _sparse(x)
    if t is None or out is not None or not (_number(min) and _number(max)) or (min is None and max is None):
        return NotImplemented
    return clamp(t, min, max)


@register(torch.clamp_min, torch.Tensor.clamp_min)
def _clamp_min(x, min, *, out=None):
    return _clamp(x, min, None, out=out)


@register(torch.clamp_max, torch.Tensor.clamp_max)
def _clamp_max(x, max, *, out=None):
    return _clamp(x, None, max, out=out)


@register(torch.nan_to_num, torch.Tensor.nan_to_num)
def _nan_to_num(x, nan=0.0, posinf=None, neginf=None, *, out=None):
    t = _sparse(x)
    if t is None or out is not None or not t.dtype.is_floating_point or nan != 0:
        return NotImplemented          # nan=c != 0 leaves a stored NaN as c: still sparse, but rare
    return nan_to_num(t, nan, posinf, neginf)


def _special(op):
    @register(op)
    def handler(x, *, out=None):
        t = _sparse(x)
        if t is None or out is not None:
            return NotImplemented
        return from_values(t._storage, op(t._storage.values))   # False at 0: the pattern
    return handler


for _op in (torch.isnan, torch.isinf, torch.isposinf, torch.isneginf, torch.signbit,
            torch.Tensor.isnan, torch.Tensor.isinf, torch.Tensor.signbit):
    _special(_op)


@register(torch.heaviside, torch.Tensor.heaviside)
def _heaviside(x, values, *, out=None):
    """``heaviside(x, 0)`` is ``x > 0``: the pattern, 1 where the stored value is positive
    (NaN gives 0, as torch's). Other values: torch's op on the stored values where they are 0
    at the unstored positions, else dense by nature (``elementwise.on_stored_values``)."""
    t = _sparse(x)
    if t is None or out is not None or not isinstance(values, torch.Tensor) or isinstance(values, SparseTensor):
        return NotImplemented
    if values.numel() != 1 or values.dtype != t.dtype or bool(values.reshape(()) != 0) or values.dim() > t.dim():
        # values 0 where nothing is stored keep the pattern; else dense by nature
        return elementwise.on_stored_values(torch.heaviside, t, values, strict_zero=True)
    # through the differentiable values: the result is in the graph, and its backward
    # raises as torch's (heaviside has no derivative)
    return from_values(t._storage, torch.heaviside(values_of(t), values.reshape(())))


@register(F.prelu, torch.prelu)
def _prelu(x, weight):
    """``relu(x) - weight * relu(-x)`` (the weight along dimension 1, or one for all): the
    pattern of ``x``, differentiable in both."""
    t = _sparse(x)
    if t is None or isinstance(weight, SparseTensor) or not isinstance(weight, torch.Tensor):
        return NotImplemented
    if weight.numel() != 1:
        if t.dim() < 2 or weight.dim() != 1 or weight.numel() != t.shape[1]:
            raise RuntimeError(f"prelu: weight of {weight.numel()} entries does not match the "
                               f"{t.shape[1] if t.dim() > 1 else 1} channels of input {tuple(t.shape)}")
        weight = weight.reshape((1, -1) + (1,) * (t.dim() - 2))
    else:
        weight = weight.reshape(())
    return F.relu(t) - weight * F.relu(-t)


@register(torch.lerp, torch.Tensor.lerp)
def _lerp(start, end, weight, *, out=None):
    if out is not None or (_sparse(start) is None and _sparse(end) is None):
        return NotImplemented
    return lerp(as_scorch(start), as_scorch(end), as_scorch(weight))


@register(torch.count_nonzero, torch.Tensor.count_nonzero)
def _count_nonzero(x, dim=None):
    t = _sparse(x)
    return NotImplemented if t is None else count_nonzero(t, dim)


@register(torch.any, torch.Tensor.any)
def _any(x, dim=None, keepdim=False, *, out=None):
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    if dim is None and not keepdim:
        r = (t._storage.values != 0).any()
        return r.to(torch.uint8) if t.dtype == torch.uint8 else r
    return _any_all(t, "any", dim, keepdim)


@register(torch.all, torch.Tensor.all)
def _all(x, dim=None, keepdim=False, *, out=None):
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    if dim is None and not keepdim:
        r = torch.tensor(_all_stored_nonzero(t))
        return r.to(torch.uint8) if t.dtype == torch.uint8 else r
    return _any_all(t, "all", dim, keepdim)


def _any_all(t: SparseTensor, name: str, dim, keepdim: bool) -> torch.Tensor:
    """``any`` / ``all`` along ``dim`` from the nonzero counts of the fibers (dense over
    the kept dims, as torch; a fiber is all-nonzero when it stores every position)."""
    dims = list(range(t.dim())) if dim is None else checked_dims(dim, t.dim(), name)
    if not dims:      # dim=(): no reduction, each position's own test (dense, as torch's)
        check_dense_size(name, t.shape, torch.bool)
        r = t.to_dense() != 0
        return r.to(torch.uint8) if t.dtype == torch.uint8 else r
    counts = count_nonzero(t, dims)
    r = counts > 0 if name == "any" else counts == math.prod(t.shape[d] for d in dims)
    if keepdim:
        for d in sorted(dims):
            r = r.unsqueeze(d)
    return r.to(torch.uint8) if t.dtype == torch.uint8 else r




def _negative_order_norm(t: SparseTensor, ord: float, reduced, keepdim: bool) -> torch.Tensor:
    """``ord < 0``: ``(sum |x|^ord)^(1/ord)`` (``-inf``: the smallest ``|x|``) is 0 over any
    fiber holding a 0, so a fiber with an unstored position or a stored 0 gives 0 unless it
    stores a NaN (NaN, as torch: its sum of powers is NaN); the others follow from their
    stored values (``|x|^ord`` on the values, one sparse sum; taken as 0 at a stored 0, whose
    fiber is 0 anyway, so no ``inf * 0`` reaches the gradient: 0 there, as torch's)."""
    dims = tuple(reduced)
    size = math.prod(t.shape[d] for d in dims)
    if ord == -math.inf:
        return _shape_dense(nonlinear.amin(nonlinear.apply("abs", t), dims, keepdim))
    vals = values_of(t)
    powered = reductions.sum(from_values(t._storage, _abs_pow(vals, ord)), dims, keepdim)
    nonzero = (vals.detach() != 0).to(vals.dtype)
    count = reductions.sum(from_values(t._storage, nonzero), dims, keepdim)
    powered, count = _shape_dense(powered), _shape_dense(count)
    full = (count == size) | powered.isnan()
    root = torch.where(full, powered, torch.ones((), dtype=powered.dtype)).pow(1.0 / ord)
    return torch.where(full, root, torch.zeros((), dtype=root.dtype))


def _shape_dense(x):
    return x.to_dense() if isinstance(x, SparseTensor) else x


def _cast_for_norm(x, dtype):
    """The sparse input of a norm, cast to ``dtype`` first as torch does (None: keep; an
    integer ``dtype``: None, torch's error through the fallback)."""
    t = _sparse(x)
    if t is None or dtype is None:
        return t
    if not (dtype.is_floating_point or dtype.is_complex):
        return None
    return t.to(dtype)


@register(torch.linalg.vector_norm)
def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    t = _cast_for_norm(x, dtype)
    if t is None or out is not None or not isinstance(ord, numbers.Real):
        return NotImplemented
    return vector_norm(t, ord, dim, keepdim)


@register(torch.norm, torch.Tensor.norm)
def _norm(x, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    t = _cast_for_norm(x, dtype)
    if t is None or out is not None:
        return NotImplemented
    if p == "fro" or p is None:
        p = 2
    if p == "nuc":                     # the singular values: dense by nature
        return torch.linalg.matrix_norm(t, "nuc", dim if dim is not None else (-2, -1), keepdim)
    if not isinstance(p, numbers.Real):
        return NotImplemented
    return vector_norm(t, p, dim, keepdim)


@register(F.normalize)
def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    """``x / max(||x||_p along dim, eps)``: the norm through ``vector_norm``, the quotient
    on ``x``'s pattern (a sparse tensor divided by a dense one)."""
    t = _sparse(x)
    if t is None or out is not None or not isinstance(p, numbers.Real):
        return NotImplemented
    d = checked_dim(dim, t.dim(), "normalize")
    keep = [k for k in range(t.dim()) if k != d]
    if keep and fiber_ops.wide_groups(t._storage, keep) and t.dtype.is_floating_point and (
            p == math.inf or (p > 0 and math.isfinite(p))):
        # one slot per stored fiber, not a dense array over the kept dims
        key, slots = fiber_ops.entry_groups(t._storage, keep)
        vals = values_of(t)
        size = vals.abs()
        if p == math.inf:
            norm = size.new_zeros(slots).scatter_reduce(0, key, size, "amax")
        else:
            norm = size.new_zeros(slots).index_add(0, key, size ** p) ** (1.0 / p)
        return from_values(t._storage, vals / norm.clamp_min(eps)[key])
    return t / vector_norm(t, p, dim, keepdim=True).clamp_min(eps)


@register(torch.tril, torch.Tensor.tril)
def _tril(x, diagonal=0, *, out=None):
    t = _sparse(x)
    return NotImplemented if t is None or out is not None else tril(t, diagonal)


@register(torch.triu, torch.Tensor.triu)
def _triu(x, diagonal=0, *, out=None):
    t = _sparse(x)
    return NotImplemented if t is None or out is not None else triu(t, diagonal)


@register(torch.narrow, torch.Tensor.narrow)
def _narrow(x, dim, start, length):
    t = _sparse(x)
    if t is None or not all(isinstance(v, numbers.Integral) for v in (dim, start, length)):
        return NotImplemented
    d = checked_dim(dim, t.dim(), "narrow") if t.dim() else 0
    s = start % t.shape[d] if start < 0 else start
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if not 0 <= s <= t.shape[d] or s + length > t.shape[d]:
        raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size "
                           f"({t.shape[d]}) of dim {dim}")
    return _shape.getitem(t, (slice(None),) * d + (slice(s, s + length),))


@register(torch.diff, torch.Tensor.diff)
def _diff(x, n=1, dim=-1, prepend=None, append=None, *, out=None):
    """``x[1:] - x[:-1]`` along ``dim``, ``n`` times: slices and a sparse subtraction (the
    union of the two shifted patterns), differentiable. Bool: ``x[1:] != x[:-1]`` (torch's
    logical xor of neighbours; bools have no subtraction), sparse on the union too."""
    t = _sparse(x)
    if t is None or out is not None or prepend is not None or append is not None or t.dim() == 0:
        return NotImplemented
    d = checked_dim(dim, t.dim(), "diff")
    step = (lambda a, b: a != b) if t.dtype == torch.bool else (lambda a, b: a - b)
    for _ in range(n):
        if t.shape[d] == 0:
            break
        head = (slice(None),) * d
        t = step(_shape.getitem(t, head + (slice(1, None),)), _shape.getitem(t, head + (slice(None, -1),)))
    return t


def _renormed_values(v: torch.Tensor, key: torch.Tensor, slots: int, p: float,
                     maxnorm: float) -> torch.Tensor:
    """``renorm`` on stored values ``v`` whose slices are ``key`` (0 .. ``slots`` - 1): each
    times ``maxnorm / (norm + 1e-7)`` where its slice's ``p``-norm exceeds ``maxnorm``
    (torch's formula). Plain tensor ops only: this runs in the in-place op's backward too,
    where ``torch.autograd.grad`` with a sparse input has switched scorch's handlers off."""
    if p == math.inf:
        norm = v.abs().new_zeros(slots).scatter_reduce(0, key, v.abs(), "amax")
    else:
        norm = _Root.apply(v.new_zeros(slots).index_add(0, key, _abs_pow(v, p)), p)
    scale = torch.where(norm > maxnorm, maxnorm / (norm + 1e-7), torch.ones((), dtype=norm.dtype))
    return v * scale[key]


@register(torch.Tensor.renorm_)
def _renorm_(x, p, dim, maxnorm):
    """In place: ``renorm`` keeps the pattern (each stored value times its slice's factor),
    so the new values are written into the stored ones (``in_place.write_values``; under
    autograd rebased with the same map as what the backward differentiates). torch's
    argument checks run first, on a stand-in, before anything is written."""
    if not isinstance(x, SparseTensor) or not x.dtype.is_floating_point \
            or x._storage.format.block is not None:
        return NotImplemented
    torch.renorm(torch.zeros(tuple(min(n, 1) for n in x.shape), dtype=x.dtype), p, dim, maxnorm)
    from .in_place import write_values
    key, slots = fiber_ops.entry_groups(x._storage, [dim % x.dim()])

    def op(v):
        return _renormed_values(v, key, slots, float(p), float(maxnorm))
    with torch.no_grad():
        new = op(x._storage.values)
    return write_values(x, lambda v: v.copy_(new), op, "renorm_")


class _Root(torch.autograd.Function):
    """``v ** (1/p)`` with the backward torch's ``std`` and ``norm`` have: 0 where the root
    is 0 (the power's own would be ``inf * 0 = NaN`` there: a constant fiber, a fiber of
    stored zeros)."""

    @staticmethod
    def forward(ctx, v, p: float):
        r = v.sqrt() if p == 2 else v.pow(1.0 / p)
        ctx.save_for_backward(v, r)
        ctx.p = p
        return r

    @staticmethod
    def backward(ctx, g):
        v, r = ctx.saved_tensors
        return (g * r / (ctx.p * v)).masked_fill(r == 0, 0), None


def _moment(root: bool):
    def handler(x, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
        t = _sparse(x)
        if t is None or out is not None or not t.dtype.is_floating_point:
            return NotImplemented
        dim, correction = _var_args(dim, unbiased, correction)
        if not root:
            return var(t, dim, correction, keepdim, "var")
        return _Root.apply(var(t, dim, correction, keepdim, "std", widened=True), 2.0).to(t.dtype)
    return handler


register(torch.var, torch.Tensor.var)(_moment(False))
register(torch.std, torch.Tensor.std)(_moment(True))


@register(torch.flip, torch.Tensor.flip)
def _flip(x, *dims, **kwargs):
    dims = kwargs.pop("dims", dims[0] if len(dims) == 1 else dims)
    t = _sparse(x)
    if kwargs:
        return NotImplemented
    return NotImplemented if t is None or t.dim() == 0 else flip(t, dims)


@register(torch.roll, torch.Tensor.roll)
def _roll(x, shifts, dims=None):
    t = _sparse(x)
    if t is None or t.dim() == 0:
        return NotImplemented
    if dims is None:     # no dims: torch rolls the flattened tensor (a view of its entries)
        if not isinstance(shifts, numbers.Integral):
            shifts = tuple(shifts)
            if len(shifts) != 1:
                raise RuntimeError(f"roll: shifts must be a single int without dims, got "
                                   f"{len(shifts)}")
            shifts = shifts[0]
        return roll(_shape.flatten(t), (int(shifts),), (0,)).reshape(t.shape)
    return roll(t, shifts, dims)


@register(torch.Tensor.repeat)
def _repeat(x, *sizes):
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if len(sizes) == 1 and not isinstance(sizes[0], numbers.Integral):
        sizes = tuple(sizes[0])
    if len(sizes) < t.dim() or any(not isinstance(r, numbers.Integral) or r < 0 for r in sizes):
        return NotImplemented          # torch's errors, from the fallback
    return repeat(t, sizes)


@register(torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to)
def _expand(x, *sizes):
    """``expand`` / ``broadcast_to``: torch's view repeats an entry along each stretched
    dimension; a sparse result stores it there once per position (``repeat``), so memory
    follows the result's stored entries."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if len(sizes) == 1 and isinstance(sizes[0], torch.Tensor):      # expand_as
        sizes = tuple(sizes[0].shape)
    elif len(sizes) == 1 and not isinstance(sizes[0], numbers.Integral):
        sizes = tuple(sizes[0])
    lead = len(sizes) - t.dim()
    if lead < 0 or any(not isinstance(n, numbers.Integral) for n in sizes):
        return NotImplemented           # torch's errors, from the fallback
    target = [t.shape[d - lead] if n == -1 and d >= lead else n for d, n in enumerate(sizes)]
    factors = list(target[:lead])
    for d, n in enumerate(t.shape):
        want = target[lead + d]
        if want != n and n != 1:
            raise RuntimeError(f"expand: the expanded size {want} must match the existing size "
                               f"{n} at dimension {lead + d} of a tensor of shape {tuple(t.shape)}")
        factors.append(want if n == 1 else 1)
    if any(f < 0 for f in factors):
        return NotImplemented
    return repeat(t, factors) if any(f != 1 for f in factors) or lead else t


@register(torch.linalg.matrix_power, torch.matrix_power, torch.Tensor.matrix_power)
def _matrix_power(x, n, *, out=None):
    """``A ** n`` for a square sparse ``A`` (or a batch of them: ``@`` is then the batched
    product) and ``n >= 1``: repeated squaring, each product a sparse @ sparse kernel
    (SpGEMM); n = 0 is the identity, as a sparse tensor, in the graph (its gradient 0, as
    dense torch's). A negative power (an inverse) is dense by nature: the fallback's."""
    t = _sparse(x)
    if t is None or out is not None or not isinstance(n, numbers.Integral) or n < 0 or t.dim() < 2:
        return NotImplemented
    if t.shape[-1] != t.shape[-2]:
        raise RuntimeError(f"matrix_power: A must be a batch of square matrices, got shape {tuple(t.shape)}")
    if n == 0:
        return _identity_like(t)
    result, base = None, t
    while n:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if n:
            base = base @ base
    return result.clone() if result is t else result     # torch returns a new tensor for n = 1


class _OnesOf(torch.autograd.Function):
    """``count`` ones, with a zero gradient for ``values``: the identity ``A ** 0`` stays in
    ``A``'s graph, as dense torch's does (cut off, its ``.backward()`` raised)."""

    @staticmethod
    def forward(ctx, values, count):
        ctx.numel = values.numel()
        return torch.ones(count, dtype=values.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.new_zeros(ctx.numel), None


def _identity_like(t: SparseTensor) -> SparseTensor:
    """The identity of each of ``t``'s (batched) square matrices, from its coordinates (no
    n x n array), in ``t``'s format."""
    n, lead = t.shape[-1], tuple(t.shape[:-2])
    diag = torch.arange(n)
    coords = diag.expand(2, n)
    if lead:
        batch = torch.cartesian_prod(*[torch.arange(b) for b in lead]).reshape(-1, len(lead)).t()
        coords = torch.cat([batch.repeat_interleave(n, dim=1), diag.repeat(batch.shape[1]).expand(2, -1)])
    count = coords.shape[1]
    storage = _convert().from_coords(coords.contiguous(), torch.ones(count, dtype=t.dtype),
                                     tuple(t.shape), t._storage.format)
    if torch.is_grad_enabled() and t.requires_grad:
        return from_values(storage, _OnesOf.apply(values_of(t), count))
    return SparseTensor(storage)


@register(torch.equal)
def _equal(a, b):
    """Same shape and every entry equal: the stored entries of ``a != b`` (the union of the
    patterns with two sparse operands) hold no True."""
    if _sparse(a) is None and _sparse(b) is None:
        return NotImplemented
    a, b = as_scorch(a), as_scorch(b)
    if tuple(a.shape) != tuple(b.shape):
        return False
    if _sparse(a) is None or _sparse(b) is None:   # every position of the dense one counts
        return torch.equal(*(x.to_dense() if isinstance(x, SparseTensor) else x for x in (a, b)))
    ne = a != b
    return not bool((ne._storage.values if isinstance(ne, SparseTensor) else ne).any())


@register(torch.allclose, torch.Tensor.allclose)
def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``|a - b| <= atol + rtol |b|`` everywhere: for two sparse operands over the stored
    entries of the difference (an unstored position of both is 0 == 0); with a dense operand
    on the dense forms (every position counts). Non-finite values (inf == inf counts as
    close) and ``equal_nan`` go to the fallback."""
    if _sparse(a) is None and _sparse(b) is None:
        return NotImplemented
    a, b = as_scorch(a), as_scorch(b)
    vals = [x._storage.values if isinstance(x, SparseTensor) else x for x in (a, b)]
    if equal_nan or not all(bool(torch.isfinite(v).all()) for v in vals if v.is_floating_point()):
        return NotImplemented
    broadcast_shapes(tuple(a.shape), tuple(b.shape))
    if _sparse(a) is None or _sparse(b) is None:   # dense by nature: compare the dense forms
        return torch.allclose(*(x.detach().to_dense() if isinstance(x, SparseTensor) else x
                                for x in (a, b)), rtol=rtol, atol=atol)
    with torch.no_grad():
        gap = (a - b).abs() - rtol * b.abs()
    g = gap._storage.values if isinstance(gap, SparseTensor) else gap
    return bool((g <= atol).all())


# --- ops whose f(0, other) is 0: on the stored values (elementwise.on_stored_values) ---

@register(torch.fmod, torch.Tensor.fmod)
def _fmod(x, other, *, out=None):
    """``fmod(x, d)``: 0 at 0 for d != 0, so the stored values (``0 % 0`` is NaN: the fallback)."""
    return elementwise.on_stored_values(torch.fmod, x, other, out=out)


@register(torch.remainder, torch.Tensor.remainder, torch.Tensor.__mod__)
def _remainder(x, other, *, out=None):
    return elementwise.on_stored_values(torch.remainder, x, other, out=out)


@register(torch.floor_divide, torch.Tensor.floor_divide, torch.Tensor.__floordiv__)
def _floor_divide(x, other, *, out=None):
    return elementwise.on_stored_values(torch.floor_divide, x, other, out=out)


@register(torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere)
def _nonzero(x, *, out=None, as_tuple=False):
    """The coordinates of the stored entries whose value is not 0 (NaN counts), in row-major
    order as torch's: a filter of the coordinates, then a stable sort per dimension (last
    first) unless the format already keeps row-major order."""
    t = _sparse(x)
    if t is None or out is not None or t.dim() == 0:
        return NotImplemented
    st = t._storage
    coords = _convert().coords(st)
    coords = coords[:, st.values != 0]
    if not (tuple(st.format.mode_order) == tuple(range(t.dim())) and st.ordered
            and st.format.block is None):
        order = torch.arange(coords.shape[1])
        for d in reversed(range(t.dim())):
            order = order[torch.argsort(coords[d, order], stable=True)]
        coords = coords[:, order]
    return tuple(coords) if as_tuple else coords.t().contiguous()


# --- argmax / argmin: the first index of the extreme, the implicit zeros counted -------------

def _fibers(coords: torch.Tensor, shape, dim: int):
    """Each stored entry's fiber along ``dim`` (the row-major linear index over the other
    dims; argmax/argmin and prod), the other dims and their sizes."""
    rest = [k for k in range(len(shape)) if k != dim]
    fiber = torch.zeros(coords.shape[1], dtype=torch.int64)
    for k in rest:
        fiber = fiber * shape[k] + coords[k]
    return fiber, rest, [shape[k] for k in rest]


def arg_extreme(t: SparseTensor, dim: Optional[int], keepdim: bool, largest: bool) -> torch.Tensor:
    """``argmax`` / ``argmin`` as torch's: per fiber along ``dim`` (or over every element,
    row-major), the first index holding the extreme, NaN first; an unstored 0 wins where 0
    is the extreme. Cost follows the stored entries plus the dense result."""
    return arg_extreme_entries(t, dim, keepdim, largest)[0]


def arg_extreme_entries(t: SparseTensor, dim: Optional[int], keepdim: bool,
                        largest: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``arg_extreme``'s indices and, per fiber, the stored entry at that index (``nnz``
    where it is an unstored zero): ``max(dim)`` takes its values from there. The entries in
    (fiber, index) order (a sort, skipped where the storage is in that order already: CSR
    along its rows), segment reductions over their ranks (the first rank in a fiber that
    holds the extreme is its first index), and each fiber's first unstored index (where its
    sorted indices first skip one)."""
    shape = tuple(t.shape)
    st = t._storage
    vals = values_of(t).detach()
    if dim is not None and inner_level.dense_compressed(st) \
            and vals.dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        # CSR along its rows (CSC along its columns): one pass of the runtime over each row;
        # along the other dimension, first the entries' numbers transposed (one counting
        # sort), so the pass reads the values in that order and reports original entries
        from .._runtime.entries import segment_arg_extreme
        d, other = dim % 2, None
        if d != st.levels[1].dim:
            tagged = st.on_pattern(torch.arange(st.nnz, dtype=torch.int64))
            st = _convert().convert(tagged, as_format("csr" if d == 1 else "csc", 2))
            other, vals = st.values, vals[st.values]
        answer, entry = segment_arg_extreme(st.levels[1].pos, st.levels[1].crd, vals,
                                            shape[d], largest)
        if other is not None:
            entry = torch.cat([other, other.new_full((1,), other.numel())])[entry]
        if keepdim:
            answer, entry = answer.unsqueeze(d), entry.unsqueeze(d)
        return answer, entry
    coords = _convert().coords(st)
    if dim is None:
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        pos = (coords * torch.tensor(strides, dtype=torch.int64)[:, None]).sum(0) if coords.numel() \
            else torch.zeros(0, dtype=torch.int64)
        fiber = torch.zeros_like(pos)
        extent, nfib = math.prod(shape), 1
        out_shape = (1,) * len(shape) if keepdim else ()
    else:
        d = dim % len(shape)
        fiber, _, rest_shape = _fibers(coords, shape, d)
        pos, extent, nfib = coords[d], shape[d], math.prod(rest_shape)
        out_shape = tuple(1 if k == d else n for k, n in enumerate(shape)) if keepdim else tuple(rest_shape)
    nnz = pos.numel()
    key = fiber * extent + pos
    order = None
    if nnz > 1 and not bool((key[1:] >= key[:-1]).all()):
        order = torch.argsort(key)
        fiber, pos, vals = fiber[order], pos[order], vals[order]
    count = torch.bincount(fiber, minlength=nfib)
    start = torch.cumsum(count, 0) - count
    ranks = torch.arange(nnz, dtype=torch.int64)
    rank = ranks - start[fiber]
    # the first unstored index of each fiber: the first rank its sorted indices skip
    skips = pos != rank
    gap = count.clone().scatter_reduce_(0, fiber[skips], rank[skips], "amin")
    full = count == extent
    reduce = "amax" if largest else "amin"
    fill = float("-inf") if largest else float("inf")
    work = vals.to(torch.float64) if vals.dtype.is_floating_point else vals.to(torch.int64)
    best = torch.full((nfib,), fill if work.dtype.is_floating_point else
                      (torch.iinfo(torch.int64).min if largest else torch.iinfo(torch.int64).max),
                      dtype=work.dtype).scatter_reduce_(0, fiber, work, reduce)
    zero = torch.zeros((), dtype=work.dtype)
    extreme = torch.where(full, best, torch.maximum(best, zero) if largest else torch.minimum(best, zero))
    none = torch.full((nfib,), nnz, dtype=torch.int64)
    # sorted by index within a fiber, so its first matching rank is its first matching index
    first = none.clone().scatter_reduce_(0, fiber, torch.where(work == extreme[fiber], ranks, nnz), "amin")
    unstored = ~full & (extreme == 0)
    if work.dtype.is_floating_point:
        first_nan = none.clone().scatter_reduce_(0, fiber, torch.where(work.isnan(), ranks, nnz), "amin")
        nan = first_nan < nnz
        first = torch.where(nan, first_nan, first)
        unstored &= ~nan
    stored_pos = torch.cat([pos, pos.new_full((1,), extent)])[first]
    unstored &= gap < stored_pos
    answer = torch.where(unstored, gap, stored_pos)
    entry = first if order is None else torch.cat([order, order.new_full((1,), nnz)])[first]
    entry = torch.where(unstored, nnz, entry)
    return answer.reshape(out_shape), entry.reshape(out_shape)


def _arg_handler(largest: bool):
    def handler(x, dim=None, keepdim=False, *, out=None):
        t = _sparse(x)
        if (t is None or out is not None or t.dim() == 0 or t.dtype.is_complex or t.dtype == torch.bool
                or (dim is None and _numel(t) == 0) or (dim is not None and t.shape[dim] == 0)):
            return NotImplemented      # torch's errors (no elements, complex), from the fallback
        return arg_extreme(t, dim, keepdim, largest)
    return handler


register(torch.argmax, torch.Tensor.argmax)(_arg_handler(True))
register(torch.argmin, torch.Tensor.argmin)(_arg_handler(False))


# --- prod: a fiber's product is 0 unless every position is stored ---------------------------

def prod(t: SparseTensor, dim: Optional[int] = None, keepdim: bool = False,
         dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``prod`` as dense torch's: 0 wherever a fiber has an unstored position (times the
    stored product, so a stored NaN or inf still gives NaN), else the product of its stored
    values. Sparse over the remaining dims (the full fibers, and the NaN ones); all
    elements: a 0-d tensor. Differentiable in the stored values (torch's segment product)."""
    vals = values_of(t)
    integral = not (vals.dtype.is_floating_point or vals.dtype.is_complex)
    out_dt = dtype or (torch.int64 if integral else vals.dtype)
    vals = vals.to(out_dt)
    if dim is None:
        whole = vals.prod(dtype=out_dt)      # (an int32 prod of ints is int64 otherwise)
        return whole if t.nnz == _numel(t) else torch.where(torch.tensor(False), whole, whole.detach() * 0)
    d = checked_dim(dim, t.dim(), "prod")
    if t.shape[d] == 0:                   # empty fibers: each product is 1 (dense by nature)
        shape = [1 if k == d else n for k, n in enumerate(t.shape)] if keepdim else \
            [n for k, n in enumerate(t.shape) if k != d]
        check_dense_size("prod", shape, out_dt)
        ones = torch.ones(shape, dtype=out_dt)
        return ones + vals.sum() * 0 if vals.requires_grad else ones   # in the graph, as torch
    fiber, _, rest_shape = _fibers(_convert().coords(t._storage), tuple(t.shape), d)
    # the fibers that store something (no array as long as the other dims)
    present, slot, count = torch.unique(fiber, return_inverse=True, return_counts=True)
    product = torch.ones(present.numel(), dtype=out_dt).scatter_reduce(0, slot, vals, "prod")
    full = count == t.shape[d]
    value = torch.where(full, product, product.detach() * 0)
    keep = full | (value != value)
    kept, value = present[keep], value[keep]
    coords = []
    rem = kept.clone()
    for n in reversed(rest_shape):
        coords.insert(0, rem % n)
        rem = rem // n
    shape = list(rest_shape)
    if keepdim:
        coords.insert(d, torch.zeros_like(kept))
        shape.insert(d, 1)
    if not shape:                         # a 1-D tensor: the one fiber's product, 0-d
        return value.sum() if value.numel() else product.sum() * 0
    idx = torch.stack(coords) if coords else torch.zeros((0, kept.numel()), dtype=torch.int64)
    fmt = as_format("coo", len(shape))
    built = _convert().from_coords(idx, value.detach(), tuple(shape), fmt, sum_duplicates=False)
    return from_coordinates(built, idx, value)


@register(torch.prod, torch.Tensor.prod)
def _prod(x, dim=None, keepdim=False, *, dtype=None, out=None):
    t = _sparse(x)
    if t is None or out is not None or t.dim() == 0 or t.dtype.is_complex:
        return NotImplemented
    return prod(t, dim, keepdim, dtype)
