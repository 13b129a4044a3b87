"""Backward rules of the per-fiber ops on a sparse tensor: ``softmax`` / ``log_softmax``
over stored entries (``torch.sparse.softmax``) and ``amax`` / ``amin``.

The forward kernels live in ``sparse_ops/nonlinear.py``; it hands them here as callables
(this package never imports the op layer). Each backward works on stored entries only:

* softmax: ``grad_x = y * (g - sum_fiber(g * y))``; log_softmax: ``grad_x = g -
  exp(y) * sum_fiber(g)`` - kernels of the same compiler on ``y``'s pattern, made with
  the differentiable ``compute``, so double backward works; the result goes back to the
  input's pattern by value order when the two patterns are equal (always for softmax);
* amax/amin: torch's rule, the gradient split evenly among the entries equal to the
  extreme, counting a fiber's implicit zeros when the extreme is 0 (they take their share,
  which belongs to no stored value) - vectorized gathers and ``index_add`` over the stored
  coordinates, O(nnz + size of the result).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence, Tuple

import torch

from ..level_storage import Storage
from ..tensor_compiler.api import kept_assignment
from ..tensor_compiler.index_notation import Access, Add, Apply, Assignment, Mul, Neg, Sub
from ..tensor_type import SparseTensor
from . import pattern as _pattern
from .einsum_grad import dense_to_pattern
from .functions import compute, needs_graph
from .values import from_values, grad_values, mark_gradient, values_of

__all__ = ["softmax", "extreme", "softmax_by_groups", "wide_fibers", "wide_groups", "entry_groups", "fiber_numbers"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _on_pattern(P: Storage, g) -> SparseTensor:
    """``g`` (a gradient of a tensor with pattern ``P``: sparse or dense) as a SparseTensor
    sharing ``P``'s arrays, differentiable in ``g``."""
    return from_values(P, grad_values(P, g).to(P.dtype))


def kept_in_storage_order(st: Storage, reduced: Sequence[int]) -> Tuple[int, ...]:
    """The dimensions a reduction over ``reduced`` keeps, in the order ``st``'s levels
    store them: a dense result laid out so does its adds in the order the kernel's loops
    visit it. In dimension order, attention sums over 'dcdd' (i, j, b, h) wrote b x h
    values N_i apart for every stored entry, 4 KB-aliased in L1 (95 ms against 18 for the
    same max at 8 x 4 heads, n = 2048). The compiler would lay such a result out in loop
    order itself (``schedule.dense_layout``) but hands it back copied to dimension order,
    as a user expects; these sums and maxima only feed the next kernel, which reads them
    in loop order, so they stay a view (no copy there, none back in the consumer)."""
    order = st.format.mode_order if st.format.block is None else range(len(st.shape))
    return tuple(d for d in order if d not in reduced)


def to_dimension_order(r, kept: Tuple[int, ...]):
    """A dense result over ``kept`` (in that order) as a view in dimension order."""
    if not isinstance(r, torch.Tensor) or isinstance(r, SparseTensor) or list(kept) == sorted(kept):
        return r
    return r.permute([kept.index(d) for d in sorted(kept)])


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: SparseTensor, dim: int, log: bool, run: Callable) -> SparseTensor:
        y = run(t)
        ctx.dim, ctx.log, ctx.pattern = dim, log, t._storage.pattern_only()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        if not isinstance(y, SparseTensor):   # a dense result (e.g. no stored entry)
            y = dense_to_pattern(ctx.pattern, y)
        Ys = y._storage
        G = _on_pattern(Ys, g)
        if wide_fibers(Ys, ctx.dim):
            gx = _softmax_backward_by_groups(Ys, y, G, ctx.dim, ctx.log)
            return mark_gradient(_on_input_pattern(ctx.pattern, gx)), None, None, None
        kept = kept_in_storage_order(Ys, (ctx.dim,))
        steps, dense = _softmax_backward(len(Ys.shape), ctx.dim, ctx.log, kept)
        sums, scaled, grad = steps
        if ctx.log:
            s = to_dimension_order(compute(sums, G, out_format=dense), kept)
            es = compute(scaled, y, s)
            out = _own_values(es, G)
            if out is not None:   # g - exp(y) * s, into es's values
                torch.sub(G._storage.values, out, out=out)
                gx = es
            else:
                gx = compute(grad, es, G)
        else:
            s = to_dimension_order(compute(sums, y, G, out_format=dense), kept)
            nys = compute(scaled, y, G, s)
            out = _own_values(nys, y, G)
            if out is not None:   # y * g - y * s, into -(y * s)'s values
                torch.addcmul(out, y._storage.values, G._storage.values, out=out)
                gx = nys
            else:
                gx = compute(grad, y, G, s, nys)
        return mark_gradient(_on_input_pattern(ctx.pattern, gx)), None, None, None


def _own_values(fresh, *others):
    """The values of ``fresh`` (a result the backward just computed: nobody else holds it)
    to finish the gradient in place, where it and ``others`` are on one set of level arrays
    with one dtype and no graph is being built; else None. A fresh array for the last step
    costs more than its arithmetic at attention sizes: 8.5M values (BigBird example, batch
    32 x 4 heads, n = 512) 34 ms at 2 threads, mostly first-touch page faults."""
    if torch.is_grad_enabled() or not isinstance(fresh, SparseTensor):
        return None
    st = fresh._storage
    for x in others:
        if not isinstance(x, SparseTensor) or not st.shares_pattern(x._storage) \
                or x._storage.values.dtype != st.values.dtype:
            return None
    values = st.values
    return values if values.is_contiguous() and values.dim() == 1 else None


def _softmax_backward(rank: int, dim: int, log: bool, kept: Tuple[int, ...]):
    """The backward's assignments and the sums' format, one object each per kind of call
    (``tensor_compiler.kept_assignment``); the sums are written over ``kept`` in that
    order (``kept_in_storage_order``), read back in dimension order."""
    def build():
        v = _LETTERS[:rank]
        keep = "".join(c for d, c in enumerate(v) if d != dim)
        laid = "".join(v[d] for d in kept)
        dense = "d" * len(keep) if keep else None
        Yv, Gv, Sk = Access(0, v), Access(1, v), Access(2, keep)
        if log:
            # g - exp(y) * s as two kernels: exp(y) * s on y's pattern (``stored(y)``: y its
            # only sparse operand, written on its arrays), then g minus that (two operands
            # on one pattern: values only); in one expression with a tensor of ones on the
            # pattern, three sparse operands co-iterated into an assembled result (200 ->
            # 60 ms for BigBird's forward and backward at n = 4096)
            steps = (Assignment(laid, Access(0, v)),
                     Assignment(v, Mul(Apply("stored", Yv), Mul(Apply("exp", Yv), Access(1, keep)))),
                     Assignment(v, Sub(Access(1, v), Access(0, v))))
        else:
            # y * g - y * s, not y * (g - s): the product with the dense s alone is a kernel
            # that writes on y's pattern (shared arrays); g - s would be a union with a dense
            # operand, assembled entry by entry (140-300 ms against 5 ms at BigBird's n = 4096).
            # -(y * s) then y * g added to it (in place: ``_own_values``)
            steps = (Assignment(laid, Mul(Yv, Gv)), Assignment(v, Neg(Mul(Yv, Sk))),
                     Assignment(v, Add(Mul(Yv, Gv), Access(3, v))))
        return steps, dense
    return kept_assignment(("softmax backward", rank, dim, log, kept), build)


def _on_input_pattern(P: Storage, gx) -> SparseTensor:
    """The input's gradient ``gx`` (computed on the result's pattern) on the input's
    pattern ``P``. softmax keeps every stored entry, so the two patterns are equal, usually
    on distinct index arrays (the kernels build their own): then the values carry
    over in storage order, without locating each entry in ``P`` (a sort and a search over
    the coordinates: 290 ms of a 670 ms BigBird step at n = 4096)."""
    if isinstance(gx, SparseTensor) and _pattern.same_pattern(P, gx._storage):
        return from_values(P, grad_values(gx._storage, gx).to(P.dtype))
    return _on_pattern(P, gx)


#: a fiber op's per-fiber sums and maxima go into a dense array over the kept dimensions
#: while that has at most ``DENSE_FIBERS_LIMIT`` positions or ``DENSE_FIBERS_PER_ENTRY``
#: per stored entry; past that (a 10M-row DCSR matrix with 1000 entries), into one slot
#: per stored fiber (``fiber_groups``)
DENSE_FIBERS_LIMIT = 1 << 20
DENSE_FIBERS_PER_ENTRY = 8


def wide_groups(st: Storage, keep: Sequence[int]) -> bool:
    """Whether the positions over the dims ``keep`` are too many for a dense array of them
    (one slot per fiber of the other dims)."""
    kept = math.prod(int(st.shape[d]) for d in keep)
    return kept > max(DENSE_FIBERS_LIMIT, DENSE_FIBERS_PER_ENTRY * st.nnz)


def wide_fibers(st: Storage, dim: int) -> bool:
    """Whether the fibers along ``dim`` are too many for a dense array of them."""
    return wide_groups(st, [d for d in range(st.ndim) if d != dim])


def entry_groups(st: Storage, keep: Sequence[int]) -> Tuple[torch.Tensor, int]:
    """Each stored entry's coordinates over the dims ``keep`` as a group number (int64,
    0 .. groups - 1) and the number of groups: the stored ones only, O(nnz log nnz)."""
    fiber = fiber_numbers(_pattern._convert().coords(st), st.shape, keep)
    groups, inverse = torch.unique(fiber, return_inverse=True)
    return inverse, groups.numel()


def fiber_groups(st: Storage, dim: int) -> Tuple[torch.Tensor, int]:
    """Each stored entry's fiber along ``dim`` as a group number (``entry_groups``)."""
    return entry_groups(st, [d for d in range(st.ndim) if d != dim])


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, groups: int) -> torch.Tensor:
    return values.new_zeros(groups).index_add(0, inverse, values)


def softmax_by_groups(t: SparseTensor, dim: int, log: bool) -> SparseTensor:
    """softmax / log_softmax along ``dim`` with the fibers' maxima and sums in one slot per
    stored fiber (``wide_fibers``): memory follows the stored entries, not the kept dims."""
    st = t._storage
    inverse, groups = fiber_groups(st, dim)
    v = st.values
    m = v.new_full((groups,), -math.inf).scatter_reduce(0, inverse, v, "amax")
    shifted = v - m.index_select(0, inverse)
    e = torch.exp(shifted)
    s = _group_sum(e, inverse, groups).index_select(0, inverse)
    return from_values(st, shifted - torch.log(s) if log else e / s)


def _softmax_backward_by_groups(Ys: Storage, y: SparseTensor, G: SparseTensor, dim: int,
                                log: bool) -> SparseTensor:
    inverse, groups = fiber_groups(Ys, dim)
    yv, gv = values_of(y), values_of(G)
    if log:
        gx = gv - torch.exp(yv) * _group_sum(gv, inverse, groups).index_select(0, inverse)
    else:
        gx = yv * (gv - _group_sum(yv * gv, inverse, groups).index_select(0, inverse))
    return from_values(Ys, gx)


def softmax(t: SparseTensor, dim: int, log: bool, run: Callable[[SparseTensor], SparseTensor]):
    """``run(t)`` (the forward kernels of softmax or log_softmax along ``dim``),
    differentiable in ``t``'s stored values when the graph is wanted."""
    if needs_graph((t,)):
        return _Softmax.apply(t, dim, log, run)
    return run(t)


def fiber_numbers(coords: torch.Tensor, shape: Sequence[int], keep: Sequence[int]) -> torch.Tensor:
    """Each stored entry's fiber: its kept coordinates, row-major over the kept dims."""
    lin = torch.zeros(coords.shape[1], dtype=torch.int64)
    for d in keep:
        lin = lin * int(shape[d]) + coords[d]
    return lin


class _Extreme(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: SparseTensor, dims: Tuple[int, ...], run: Callable) -> torch.Tensor:
        m = run(t)
        ctx.pattern, ctx.dims = t._storage, dims
        ctx.save_for_backward(m)
        return m

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        m, = ctx.saved_tensors
        P, dims = ctx.pattern, ctx.dims
        keep = [d for d in range(P.ndim) if d not in dims]
        coords = _pattern._convert().coords(P)
        fiber = fiber_numbers(coords, P.shape, keep)
        m_flat, g_flat = m.reshape(-1), g.reshape(-1)
        tie = P.values == m_flat[fiber]
        ties = torch.zeros(m_flat.numel(), dtype=m.dtype).index_add_(0, fiber, tie.to(m.dtype))
        stored = torch.zeros(m_flat.numel(), dtype=m.dtype).index_add_(
            0, fiber, torch.ones(P.nnz, dtype=m.dtype))
        extent = math.prod(int(P.shape[d]) for d in dims)
        count = ties + torch.where(m_flat == 0, extent - stored, torch.zeros((), dtype=m.dtype))
        share = (g_flat / count.clamp(min=1))[fiber]
        vals = torch.where(tie, share, torch.zeros((), dtype=share.dtype))
        return mark_gradient(from_values(P, vals.to(P.dtype))), None, None


def extreme(t: SparseTensor, dims: Tuple[int, ...], run: Callable[[SparseTensor], torch.Tensor]):
    """``run(t)`` (amax or amin over ``dims``, without keepdim: dense over the kept dims),
    differentiable in ``t``'s stored values when the graph is wanted."""
    if needs_graph((t,)):
        return _Extreme.apply(t, dims, run)
    return run(t)
