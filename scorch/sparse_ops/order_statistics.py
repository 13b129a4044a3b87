"""Order statistics of a sparse tensor: ``topk``, ``kthvalue``, ``median``/``nanmedian`` (all
elements, or along a dim), ``max``/``min`` along a dim and ``mode``, from the stored entries
alone.

A fiber along ``dim`` sorted in torch's order (NaN largest) is its stored entries that come
before 0, then every zero (its stored zeros, then its unstored positions), then the rest. So
the element of any rank follows from per-fiber counts: a stored entry by its rank among the
stored ones, or the m-th unstored position, found by one ``searchsorted`` over each stored
entry's count of unstored positions before it. Cost: sorts of the stored entries plus the
result (fibers x ranks), never a dense copy. Values are gathered from the differentiable
stored values, so the gradient goes to the picked stored entries as torch's index-based
backward does (an unstored zero picked gets none); ``median()`` over every element shares its
gradient evenly among the entries equal to it, as torch's."""
from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import torch

from .._dispatch import register
from ..gradients.values import values_of
from ..tensor_type import SparseTensor, with_values
from . import composites, nonlinear
from .dims import checked_dim
from .nonlinear import _sparse

__all__ = ["topk", "kthvalue", "median", "median_all", "extreme_along", "mode"]


def _convert():
    from .._runtime import convert
    return convert


_checked_dim = checked_dim


def _nonempty(name: str, t: SparseTensor, d: int) -> None:
    if t.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _sorting(keys: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts ``keys``; an O(n) check first, as the storage order is
    often already the one asked for (CSR's rows)."""
    if keys.numel() < 2 or bool((keys[1:] >= keys[:-1]).all()):
        return torch.arange(keys.numel(), dtype=torch.int64)
    return torch.argsort(keys)


class _Ranked:
    """The stored entries of every fiber in torch's sort order (NaN largest; ties by
    position), with the per-fiber counts that place the unstored zeros among them."""

    def __init__(self, fiber: torch.Tensor, pos: torch.Tensor, vals: torch.Tensor,
                 nfib: int, extent: int, descending: bool):
        nnz = pos.numel()
        self.nfib, self.extent, self.nnz = nfib, extent, nnz
        by_pos = _sorting(fiber * extent + pos)               # (fiber, position): unique keys
        fiber_p, pos_p = fiber[by_pos], pos[by_pos]
        self.count = torch.bincount(fiber, minlength=nfib)
        self.start = torch.cumsum(self.count, 0) - self.count
        # unstored positions before each stored one; nondecreasing within a fiber, in [0, extent]
        unstored_before = pos_p - (torch.arange(nnz, dtype=torch.int64) - self.start[fiber_p])
        self.gap_keys = fiber_p * (extent + 1) + unstored_before
        plain = vals.detach()[by_pos]
        order = torch.sort(plain, descending=descending, stable=True).indices
        order = order[torch.sort(fiber_p[order], stable=True).indices]
        ranked = by_pos[order]
        plain = vals.detach()[ranked]
        nan = plain.isnan()
        # the stored entries ranked before the unstored zeros: those up to and including 0
        before = ((plain >= 0) | nan) if descending else (plain <= 0)
        fiber_r = fiber[ranked]
        self.before = torch.bincount(fiber_r[before], minlength=nfib)
        self.nans = torch.bincount(fiber_r[nan], minlength=nfib)
        self.values = torch.cat([vals[ranked], vals.new_zeros(1)])     # a 0 for unstored picks
        self.positions = torch.cat([pos[ranked], pos.new_zeros(1)])

    def select(self, ranks: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Values and positions of the elements of ``ranks`` ([nfib, q], each in
        ``[0, extent)``) in every fiber's sorted order."""
        fibers = torch.arange(self.nfib, dtype=torch.int64)[:, None]
        start, before = self.start[:, None], self.before[:, None]
        unstored = self.extent - self.count[:, None]
        in_zeros = (ranks >= before) & (ranks < before + unstored)
        stored_rank = torch.where(ranks < before, ranks, ranks - unstored)
        source = torch.where(in_zeros, self.nnz, start + stored_rank)
        # the m-th unstored position: m plus the stored entries with at most m unstored before
        m = (ranks - before).clamp_min(0)
        passed = torch.searchsorted(self.gap_keys, fibers * (self.extent + 1) + m, right=True) - start
        positions = torch.where(in_zeros, m + passed, self.positions[source])
        return self.values[source], positions


def _along(t: SparseTensor, d: int, descending: bool):
    """The ranked fibers of ``t`` along ``d`` and the shape of the other dims."""
    coords = _convert().coords(t._storage)
    fiber, _, rest_shape = composites._fibers(coords, tuple(t.shape), d)
    ranked = _Ranked(fiber, coords[d], values_of(t), math.prod(rest_shape), t.shape[d], descending)
    return ranked, list(rest_shape)


def _place(x: torch.Tensor, rest_shape, d: int, keepdim: bool) -> torch.Tensor:
    """[nfib, 1] per-fiber results in torch's reduced shape."""
    x = x.reshape(rest_shape)
    return x.unsqueeze(d) if keepdim else x


def topk(t: SparseTensor, k: int, dim: int = -1, largest: bool = True):
    """The ``k`` largest (smallest) elements of each fiber, sorted, with their indices."""
    d = _checked_dim(dim, t.dim())
    if not 0 <= k <= t.shape[d]:
        raise RuntimeError("selected index k out of range")
    ranked, rest_shape = _along(t, d, largest)
    ranks = torch.arange(k, dtype=torch.int64).expand(ranked.nfib, k)
    values, indices = ranked.select(ranks)
    shape = rest_shape + [k]
    values = values.reshape(shape).movedim(-1, d).contiguous()
    indices = indices.reshape(shape).movedim(-1, d).contiguous()
    return torch.return_types.topk((values, indices))


def kthvalue(t: SparseTensor, k: int, dim: int = -1, keepdim: bool = False):
    """The ``k``-th smallest element (1-based, NaN largest) of each fiber and its index."""
    d = _checked_dim(dim, t.dim())
    _nonempty("kthvalue", t, d)
    if not 1 <= k <= t.shape[d]:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    ranked, rest_shape = _along(t, d, False)
    values, indices = ranked.select(torch.full((ranked.nfib, 1), k - 1, dtype=torch.int64))
    return torch.return_types.kthvalue((_place(values, rest_shape, d, keepdim),
                                        _place(indices, rest_shape, d, keepdim)))


def _median_rank(n, nans: torch.Tensor, ignore_nan: bool) -> torch.Tensor:
    """The ascending rank torch's lower median picks: NaN where a fiber holds one (its first
    NaN), or, ignoring NaN, the lower median of the rest (the first NaN if none is left)."""
    if ignore_nan:
        kept = n - nans
        return torch.where(kept > 0, (kept - 1) // 2, 0)
    return torch.where(nans > 0, n - nans, (n - 1) // 2)


def median(t: SparseTensor, dim: int, keepdim: bool = False, ignore_nan: bool = False):
    """``median``/``nanmedian`` along ``dim``: the lower median of each fiber and its index."""
    name = "nanmedian" if ignore_nan else "median"
    d = _checked_dim(dim, t.dim())
    _nonempty(name, t, d)
    ranked, rest_shape = _along(t, d, False)
    ranks = _median_rank(t.shape[d], ranked.nans, ignore_nan)[:, None]
    values, indices = ranked.select(ranks)
    result = torch.return_types.nanmedian if ignore_nan else torch.return_types.median
    return result((_place(values, rest_shape, d, keepdim), _place(indices, rest_shape, d, keepdim)))


class _EvenShare(torch.autograd.Function):
    """``median()``'s backward as torch's: the gradient shared evenly among the elements
    equal to the result (NaN: the NaNs), the unstored zeros' share lost."""

    @staticmethod
    def forward(ctx, vals: torch.Tensor, result: torch.Tensor, share: torch.Tensor):
        ctx.save_for_backward(share)
        return result.clone()

    @staticmethod
    def backward(ctx, g):
        share, = ctx.saved_tensors
        return g * share, None, None


def median_all(t: SparseTensor, ignore_nan: bool = False) -> torch.Tensor:
    """The lower median over every element (row-major), 0-d; NaN for no elements."""
    vals = values_of(t)
    numel = math.prod(t.shape)
    if numel == 0:
        return vals.sum() * float("nan")
    coords = _convert().coords(t._storage)
    strides = torch.tensor([math.prod(t.shape[k + 1:]) for k in range(t.dim())], dtype=torch.int64)
    pos = (coords * strides[:, None]).sum(0)
    ranked = _Ranked(torch.zeros_like(pos), pos, vals.detach(), 1, numel, False)
    rank = _median_rank(numel, ranked.nans, ignore_nan)[:, None]
    result = ranked.select(rank)[0].reshape(())
    if not vals.requires_grad:
        return result
    plain = vals.detach()
    equal = plain.isnan() if bool(result.isnan()) else plain == result
    ties = equal.sum() + (numel - t._storage.nnz if bool(result == 0) else 0)
    return _EvenShare.apply(vals, result, equal.to(vals.dtype) / ties)


def _flat(t: SparseTensor) -> _Ranked:
    """``t``'s elements (row-major) as one ranked fiber."""
    coords = _convert().coords(t._storage)
    strides = torch.tensor([math.prod(t.shape[k + 1:]) for k in range(t.dim())], dtype=torch.int64)
    pos = (coords * strides[:, None]).sum(0)
    return _Ranked(torch.zeros_like(pos), pos, values_of(t), 1, math.prod(t.shape), False)


def quantile(t: SparseTensor, q, dim: Optional[int] = None, keepdim: bool = False,
             interpolation: str = "linear", ignore_nan: bool = False) -> torch.Tensor:
    """``quantile`` / ``nanquantile`` as torch computes them on the sorted fibers (the
    implicit zeros counted): rank ``q * (n - 1)`` (``n`` the fiber's non-NaN count for
    nanquantile; a fiber holding NaN gives NaN for quantile), rounded as ``interpolation``
    says, and the two neighbouring order statistics interpolated (``lerp``). Each is a
    ``_Ranked.select`` gathered from the stored values, so the gradient splits between the
    two picked stored entries as torch's (an unstored zero picked gets none). Cost: sorts of
    the stored entries plus the dense result (fibers x quantiles)."""
    name = "nanquantile" if ignore_nan else "quantile"
    # torch's checks (dtypes, q's range and rank, interpolation, empty input, dim) on a stand-in
    getattr(torch, name)(torch.zeros(tuple(min(n, 1) for n in t.shape), dtype=t.dtype), q, dim,
                         keepdim, interpolation=interpolation)
    if dim is None:
        ranked, rest_shape, d = _flat(t), [], None
    else:
        d = _checked_dim(dim, t.dim())
        ranked, rest_shape = _along(t, d, False)
    n = ranked.extent
    if n > 2 ** 24:                  # torch's limit (ranks are computed in the input's dtype)
        raise RuntimeError("quantile() input tensor is too large")
    qs = q if isinstance(q, torch.Tensor) else torch.tensor(q, dtype=t.dtype)
    qs = qs.reshape(1, -1)                                   # [1, quantiles]
    if ignore_nan:
        ranks = qs * (n - ranked.nans[:, None] - 1)
        ranks = ranks.masked_fill(ranks < 0, 0)              # only NaNs: rank 0 (a NaN)
    else:
        ranks = (qs * (n - 1)).expand(ranked.nfib, -1)
        ranks = ranks.masked_fill((ranked.nans > 0)[:, None], n - 1)    # NaN: the last
    if interpolation in ("lower", "higher", "nearest"):
        ranks = {"lower": torch.floor, "higher": torch.ceil, "nearest": torch.round}[interpolation](ranks)
    below = ranks.to(torch.int64)
    values = ranked.select(below)[0]
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        values = values.lerp(ranked.select(ranks.ceil().to(torch.int64))[0], weights)
    if not isinstance(q, torch.Tensor) or q.dim() == 0:
        return _place(values, rest_shape, d, keepdim) if d is not None else \
            values.reshape([1] * t.dim() if keepdim else [])
    values = values.t()                                      # [quantiles, fibers]
    if d is None:
        return values.reshape([-1] + [1] * t.dim() if keepdim else [-1])
    values = values.reshape([-1] + rest_shape)
    return values.unsqueeze(d + 1) if keepdim else values


def extreme_along(t: SparseTensor, dim: int, keepdim: bool, largest: bool):
    """``max``/``min`` with a dim: torch's first-occurrence index (``arg_extreme``), and the
    value at it gathered from the stored values, so the gradient goes to that entry alone."""
    name = "max" if largest else "min"
    d = _checked_dim(dim, t.dim())
    _nonempty(name, t, d)
    indices, entry = composites.arg_extreme_entries(t, d, keepdim, largest)
    vals = values_of(t)
    values = torch.cat([vals, vals.new_zeros(1)])[entry]
    result = torch.return_types.max if largest else torch.return_types.min
    return result((values, indices))


def _lexsorted(*keys: torch.Tensor) -> torch.Tensor:
    """The permutation sorting by ``keys[0]``, then ``keys[1]``, ... (stable sorts from the
    last key to the first)."""
    order = torch.argsort(keys[-1], stable=True)
    for k in reversed(keys[:-1]):
        order = order[torch.argsort(k[order], stable=True)]
    return order


def mode(t: SparseTensor, dim: int = -1, keepdim: bool = False):
    """``torch.mode`` as torch computes it: per fiber, the most frequent value (the smallest
    of the most frequent on a tie) and the last index holding it, the implicit zeros counted.
    The candidates are each fiber's runs of equal stored non-zero values and its zeros
    (``extent`` minus the stored non-zeros, the last at the top of the fiber's first gap from
    its end); one lexicographic sort picks the winner. Cost: sorts of the stored entries plus
    the dense result. The value is gathered from the stored values, so the gradient reaches the
    picked entry as torch's index-based backward does (an unstored zero picked gets none)."""
    d = _checked_dim(dim, t.dim())
    _nonempty("mode", t, d)
    n = t.shape[d]
    coords = _convert().coords(t._storage)
    fiber, _, rest_shape = composites._fibers(coords, tuple(t.shape), d)
    nfib = math.prod(rest_shape)
    vals = values_of(t)
    plain = vals.detach()
    entry = (plain != 0).nonzero().squeeze(1)
    f, p, v = fiber[entry], coords[d][entry], plain[entry]
    # runs of one value in one fiber
    o = _lexsorted(f, v)
    fs, vs, ps, es = f[o], v[o], p[o], entry[o]
    new_run = torch.ones(fs.numel(), dtype=torch.bool)
    new_run[1:] = (fs[1:] != fs[:-1]) | (vs[1:] != vs[:-1])
    run = torch.cumsum(new_run, 0) - 1
    runs = int(run[-1]) + 1 if run.numel() else 0
    run_count = torch.bincount(run, minlength=runs)
    last = _lexsorted(run, -ps)[new_run]          # each run's entry at its highest position
    run_fiber, run_value, run_pos, run_entry = fs[new_run], vs[new_run], ps[last], es[last]
    # each fiber's zeros: how many, and the last position not holding a stored non-zero
    zeros = n - torch.bincount(f, minlength=nfib)
    o = _lexsorted(f, -p)
    fz, pz = f[o], p[o]
    start = torch.cumsum(torch.bincount(fz, minlength=nfib), 0) - torch.bincount(fz, minlength=nfib)
    rank = torch.arange(fz.numel(), dtype=torch.int64) - start[fz]
    top_full = torch.bincount(fz[pz == n - 1 - rank], minlength=nfib)   # a prefix of the descending list
    has_zero = (zeros > 0).nonzero().squeeze(1)
    zero_pos = (n - 1 - top_full)[has_zero]
    # a picked zero position may hold a stored zero: its entry, else the appended 0
    stored_zero = (plain == 0).nonzero().squeeze(1)
    zero_keys = fiber[stored_zero] * n + coords[d][stored_zero]
    zero_keys, by_key = torch.sort(zero_keys)
    want = has_zero * n + zero_pos
    at = torch.searchsorted(zero_keys, want).clamp_(max=max(zero_keys.numel() - 1, 0))
    hit = zero_keys[at] == want if zero_keys.numel() else torch.zeros_like(want, dtype=torch.bool)
    zero_entry = torch.where(hit, stored_zero[by_key][at] if zero_keys.numel() else want, plain.numel())
    # the winner: most frequent, then smallest value
    cand_fiber = torch.cat([run_fiber, has_zero])
    cand_count = torch.cat([run_count, zeros[has_zero]])
    cand_value = torch.cat([run_value, plain.new_zeros(has_zero.numel())])
    cand_pos = torch.cat([run_pos, zero_pos])
    cand_entry = torch.cat([run_entry, zero_entry])
    o = _lexsorted(cand_fiber, -cand_count, cand_value)
    first = torch.ones(o.numel(), dtype=torch.bool)
    first[1:] = cand_fiber[o][1:] != cand_fiber[o][:-1]
    won = o[first]                                  # one per fiber, in fiber order
    values = torch.cat([vals, vals.new_zeros(1)])[cand_entry[won]]
    return torch.return_types.mode((_place(values, rest_shape, d, keepdim),
                                    _place(cand_pos[won], rest_shape, d, keepdim)))


# --- registration -------------------------------------------------------------------------

def _ranked_sparse(x) -> Optional[SparseTensor]:
    """``x`` when it is a sparse tensor these ops rank (real, not bool, rank >= 1)."""
    t = _sparse(x)
    if t is None or t.dim() == 0 or t.dtype.is_complex or t.dtype == torch.bool:
        return None
    return t


def _integer(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@register(torch.topk, torch.Tensor.topk)
def _topk(x, k, dim=-1, largest=True, sorted=True, *, out=None):
    t = _ranked_sparse(x)
    if t is None or out is not None or not _integer(k) or not _integer(dim):
        return NotImplemented
    return topk(t, int(k), dim, bool(largest))


@register(torch.kthvalue, torch.Tensor.kthvalue)
def _kthvalue(x, k, dim=-1, keepdim=False, *, out=None):
    t = _ranked_sparse(x)
    if t is None or out is not None or not _integer(k) or not _integer(dim):
        return NotImplemented
    return kthvalue(t, int(k), dim, bool(keepdim))


@register(torch.mode, torch.Tensor.mode)
def _mode(x, dim=-1, keepdim=False, *, out=None):
    t = _ranked_sparse(x)
    if t is None or out is not None or not _integer(dim):
        return NotImplemented
    return mode(t, dim, bool(keepdim))


def _median_handler(ignore_nan: bool):
    def handler(x, dim=None, keepdim=False, *, out=None):
        t = _ranked_sparse(x)
        if t is None or out is not None:
            return NotImplemented
        if dim is None:
            if keepdim or (math.prod(t.shape) == 0 and not t.dtype.is_floating_point):
                return NotImplemented   # torch's error; its empty integer median is undefined
            return median_all(t, ignore_nan)
        if not _integer(dim):
            return NotImplemented
        return median(t, dim, bool(keepdim), ignore_nan)
    return handler


def _quantile_handler(ignore_nan: bool):
    def handler(x, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
        t = _ranked_sparse(x)
        if t is None or out is not None or isinstance(q, SparseTensor) \
                or not (dim is None or _integer(dim)):
            return NotImplemented
        return quantile(t, q, dim, bool(keepdim), interpolation, ignore_nan)
    return handler


register(torch.quantile, torch.Tensor.quantile)(_quantile_handler(False))
register(torch.nanquantile, torch.Tensor.nanquantile)(_quantile_handler(True))
register(torch.median, torch.Tensor.median)(_median_handler(False))
register(torch.nanmedian, torch.Tensor.nanmedian)(_median_handler(True))


def max_min_along(name: str, x, dim, keepdim=False, *, out=None):
    """``torch.max(x, dim, keepdim)`` / ``min``: called by ``composites``' ``max``/``min``
    handler for the forms with a dim."""
    b = _sparse(x)
    if b is not None and b.dtype == torch.bool and b.dim() and out is None and _integer(dim):
        # bool: ranked as 0 / 1 (torch's max of bools is any, min is all; first index)
        found = extreme_along(with_values(b, b._storage.values.to(torch.uint8)), dim,
                              bool(keepdim), name == "max")
        return type(found)((found.values.to(torch.bool), found.indices))
    t = _ranked_sparse(x)
    if t is None or out is not None or not _integer(dim):
        return NotImplemented
    return extreme_along(t, dim, bool(keepdim), name == "max")


def _extreme(name: str):
    """``max``/``min``: over every element here; ``max(x, other)`` is ``maximum``; with a dim
    (values and indices): ``max_min_along``."""
    def handler(x, *args, **kwargs):
        other = args[0] if args else kwargs.get("other")
        if isinstance(other, torch.Tensor) and len(args) + len(kwargs) == 1:
            return (torch.maximum if name == "max" else torch.minimum)(x, other)
        t = _sparse(x)
        if t is None:
            return NotImplemented
        if args or kwargs:
            return max_min_along(name, t, *args, **kwargs)
        if math.prod(t.shape) == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
        return (nonlinear.amax if name == "max" else nonlinear.amin)(t)
    return handler


register(torch.max, torch.Tensor.max)(_extreme("max"))
register(torch.min, torch.Tensor.min)(_extreme("min"))
