"""Dropping stored zeros: ``scorch.eliminate_zeros(t)`` and ``t.eliminate_zeros()``.

Ops keep their operand's pattern by design (``Q * (Q > t)``, ``torch.where(Q > t, Q, 0)``,
dropout, ``relu``, an in-place write of 0 leave stored zeros), so a thresholded propagation
(``Q = A @ Q; Q = Q * (Q.abs() > t)``) would grow its pattern every step. This is the explicit
prune, as scipy's ``eliminate_zeros`` and JAX's ``bcoo_eliminate_zeros``.

Nothing is zero (one test over the values): a new tensor over t's index arrays with its own
copy of the values. Otherwise, one bottom-up and one top-down sweep over the levels, each
vectorized over positions (no loop over entries or fibers, no dense copy):

* bottom-up: a value lives when it is not zero; a position lives when something alive is
  stored under it. A level with ``pos`` (compressed, the head of a coordinate run) keeps
  its live positions in one pass of the runtime (``entries.select_entries``: new ``pos`` over
  every old parent, new ``crd``, the kept positions), and a parent lives when its new segment
  is not empty; a dense level's position lives when any of its ``size`` children does; a
  level without ``pos`` (inside a coordinate run, a singleton) shares its parent's positions.
* top-down: a dense level keeps every coordinate under a kept parent; a level with ``pos``
  drops the bounds of its dropped parents' (now empty) segments; a level without ``pos``
  gathers the kept positions of its parent; the values are one gather at the last level's.

So a position of the lowest sparse level goes only when everything under it (its dense
sub-levels, its whole block) is zero, and a fiber left empty goes from every level that lists
coordinates (DCSR's rows, COO's, CSF's), never from a dense level. A level that drops nothing
keeps its arrays.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .. import tensor_type as _tensor_type
from .._runtime import entries
from ..gradients.values import from_values, values_of
from ..level_storage import Level, Storage
from ..tensor_type import SparseTensor, as_scorch, is_sparse_operand

__all__ = ["eliminate_zeros"]


def eliminate_zeros(t: torch.Tensor) -> torch.Tensor:
    """A copy of the sparse tensor ``t`` without its stored zeros.

    Out of place: unlike scipy's ``eliminate_zeros`` it does not modify ``t`` (as JAX's
    ``bcoo_eliminate_zeros``); the result is always a new tensor, in ``t``'s format and index
    dtype (its index arrays may be ``t``'s where nothing is dropped from a level; its values
    are its own, so an in-place op on it never changes ``t``). A torch sparse tensor (COO, CSR,
    CSC, BSR, BSC) gives one of the same layout.

    Kept: every stored entry whose value is not zero (``bool``: not ``False``; NaN is not zero
    and stays; ``-0.0`` is zero). Where the format stores dense levels under a sparse one
    (hybrid ``"qqd"``, ``"dcd"``) or blocks (``Format("dc", block=(b, b))``), a position of
    the lowest sparse level goes only when everything under it (its dense sub-levels, its
    whole block) is zero; then a fiber left empty goes from every level that lists
    coordinates (the outer level of DCSR, COO, CSF). Dense levels keep every coordinate, and
    a singleton level under a dense one keeps its one entry per parent, zero or not.

    Differentiable in ``t``'s values: the gradient of a kept value goes back to its position
    in ``t``'s pattern, 0 to a dropped one. Cost: one pass over the stored entries.

    A dense (strided) tensor raises a TypeError: it stores every position, so it has no
    stored zeros to drop (``scorch.sparse_tensor(x)`` stores only its nonzero entries).
    """
    if isinstance(t, SparseTensor):
        return _eliminate(t)
    if is_sparse_operand(t):             # torch's own sparse layouts: in and out as that layout
        return _eliminate(as_scorch(t)).to_torch()
    what = (f"a dense tensor (layout {t.layout})" if isinstance(t, torch.Tensor)
            else f"an object of type {type(t).__name__}")
    raise TypeError(
        f"scorch.eliminate_zeros(t): t must be a sparse tensor (scorch.SparseTensor or a torch "
        f"sparse layout), got {what}; a dense tensor stores every position, so it has no stored "
        f"zeros to drop (scorch.sparse_tensor(t) stores only its nonzero entries)")


def _eliminate(t: SparseTensor) -> SparseTensor:
    st = t._storage
    live = _nonzero(st.values)
    levels, take = (st.levels, None) if bool(live.all()) else _kept_levels(st, live)
    values = values_of(t)
    # values of its own even where nothing goes: an in-place op on the result must not reach t
    values = values.clone() if take is None else values.index_select(0, take)
    return from_values(Storage(st.format, st.shape, levels, values.detach(), st.index_dtype), values)


def _kept_levels(st: Storage, live: torch.Tensor) -> Tuple[List[Level], Optional[torch.Tensor]]:
    """Top-down: the levels holding the kept positions, and the kept positions of the last
    level (None: all of them)."""
    picked = _picked_entries(st, live)
    levels: List[Level] = []
    take_parent: Optional[torch.Tensor] = None   # the kept positions of the level above (None: all)
    for k, lv in enumerate(st.levels):
        if lv.kind.full:                 # every coordinate under a kept parent
            take = None if take_parent is None else (
                take_parent.unsqueeze(1) * lv.size + torch.arange(lv.size)).reshape(-1)
            levels.append(lv)
        elif lv.pos is not None:
            pos, crd, take = picked[k]
            if take_parent is not None:  # segments of dropped parents are empty: skip their bounds
                pos = pos.index_select(0, torch.cat([take_parent.new_zeros(1), take_parent + 1]))
            elif take.numel() == lv.crd.numel():
                pos, crd, take = lv.pos, lv.crd, None     # nothing dropped from this level
            levels.append(_with_arrays(lv, pos, crd))
        else:                            # inside a coordinate run, or a singleton: its parent's positions
            take = take_parent
            levels.append(lv if take is None else _with_arrays(lv, None, lv.crd.index_select(0, take)))
        take_parent = take
    return levels, take_parent


def _nonzero(values: torch.Tensor) -> torch.Tensor:
    """Which stored values are not zero: a bool value is its own test; ``!=`` keeps NaN and
    drops -0.0."""
    return values.contiguous() if values.dtype == torch.bool else values != 0


def _picked_entries(st: Storage, live: torch.Tensor) -> dict:
    """Bottom-up from ``live`` (the nonzero values): for each level with ``pos``, the runtime's
    one pass over its entries keeping those with something nonzero under them, ``(new_pos``
    over every old parent position, ``new_crd``, ``take``: the kept positions)``. A parent
    position lives when its new segment is not empty; a dense level's when any of its
    children does; a level without ``pos`` shares its parent's positions."""
    counts, c = [], 1                    # positions of each level
    for lv in st.levels:
        c = c * lv.size if lv.kind.full else (lv.crd.numel() if lv.pos is not None else c)
        counts.append(c)
    picked = {}
    top = min((k for k, lv in enumerate(st.levels) if lv.pos is not None), default=len(counts))
    for k in range(len(st.levels) - 1, top - 1, -1):     # (above the first pos: nothing to pick)
        lv = st.levels[k]
        if lv.kind.full:
            parents = counts[k - 1] if k else 1
            live = live.reshape(parents, lv.size).any(1) if lv.size else \
                torch.zeros(parents, dtype=torch.bool)
        elif lv.pos is not None:
            new_pos, new_crd, take = entries.select_entries(lv.pos, lv.crd, live)
            picked[k] = (new_pos, new_crd, take)
            if k > top:
                live = new_pos.diff() > 0
    return picked


def _with_arrays(lv: Level, pos: Optional[torch.Tensor], crd: torch.Tensor) -> Level:
    return Level(lv.kind, lv.dim, lv.size, pos, crd, lv.block_inner, lv.ordered)


# ``SparseTensor.eliminate_zeros`` (tensor_type cannot import this module: it imports that one)
_tensor_type._ELIMINATE_ZEROS[0] = eliminate_zeros
