"""Conversions between formats, for every registered level kind.

The Cython runtime (``scorch._runtime.convert``) decodes any storage (it only asks whether a
level keeps ``pos``) and builds the level kinds it knows (``kind.runtime``). A format with
another kind (a singleton level, say) is built by the kinds themselves: the runtime first
sorts and sums the entries into a coordinate format of the same mode order, then every level
assembles itself from those sorted coordinates (``level_kinds.assembly``). Everything else the
runtime offers is reached through this module unchanged."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .formats import Format
from .level_kinds.assembly import build_levels
from .level_storage import Level, Storage, index_dtype_for, materialized
from .tensor_compiler.allocate import zeros_output

__all__ = ["convert", "from_dense", "from_coords", "coords", "to_dense", "runtime_builds",
           "dense_dim", "hybrid_nnz", "hybrid_indices", "hybrid_values"]


_RUNTIME: list = []
_BUILDS: dict = {}   # Format -> runtime_builds(Format)
_DENSE_DIMS: dict = {}   # Format -> dense_dim(Format)


def _runtime():
    if not _RUNTIME:
        from ._runtime import convert as rt   # compiled at install time; imported on first use
        _RUNTIME.append(rt)
    return _RUNTIME[0]


def runtime_builds(fmt: Format) -> bool:
    """Whether the Cython runtime builds every level of ``fmt`` itself."""
    got = _BUILDS.get(fmt)
    if got is None:
        got = _BUILDS[fmt] = all(k.runtime for k in fmt.levels)
    return got


def _sorted_coordinates(fmt: Format) -> Format:
    if fmt.block is not None:
        raise ValueError(f"format {fmt!r}: blocked formats need level kinds the runtime builds")
    return Format("q" * fmt.rank, fmt.mode_order)


def _assemble(coo: Storage, fmt: Format) -> Storage:
    """``coo`` (sorted, unique, in ``fmt``'s mode order) rebuilt level by level in ``fmt``."""
    rt = _runtime()
    order = list(fmt.mode_order)
    coords = rt.coords(coo)[order].t().contiguous() if coo.nnz else torch.zeros(0, fmt.rank, dtype=torch.int64)
    sizes = [coo.shape[d] for d in order]
    built, values, count = build_levels(fmt.levels, coords, coo.values, sizes)
    idt = index_dtype_for(coo.shape, max(count, coo.nnz))
    levels = [Level(kind, d, s, None if pos is None else pos.to(idt), None if c is None else c.to(idt))
              for kind, d, s, (pos, c) in zip(fmt.levels, order, sizes, built)]
    return Storage(fmt, coo.shape, levels, values, idt)


def convert(st: Storage, fmt: Format) -> Storage:
    """``st`` in format ``fmt``, never through a dense copy."""
    if runtime_builds(fmt):
        return _runtime().convert(st, fmt)
    return _assemble(_runtime().convert(st, _sorted_coordinates(fmt)), fmt)


def from_dense(x: torch.Tensor, fmt: Format) -> Storage:
    x = materialized(x) if isinstance(x, torch.Tensor) else x
    if runtime_builds(fmt):
        return _runtime().from_dense(x, fmt)
    return _assemble(_runtime().from_dense(x, _sorted_coordinates(fmt)), fmt)


def from_coords(indices, values, shape: Sequence[int], fmt: Format, *args, **kwargs) -> Storage:
    if runtime_builds(fmt):
        return _runtime().from_coords(indices, values, shape, fmt, *args, **kwargs)
    coo = _runtime().from_coords(indices, values, shape, _sorted_coordinates(fmt), *args, **kwargs)
    return _assemble(coo, fmt)


def coords(st: Storage) -> torch.Tensor:
    return _runtime().coords(st)


# --- torch's hybrid meaning: sparse dims, then dense dims -----------------------------------
# torch's hybrid layouts (a COO whose values are (nnz, *dense), a CSR with dense dims) are the
# formats whose last levels are dense and store the last dims in order, after a sparse level
# (``qqd``, ``dcd``). torch's accessors count their index tuples, not the stored entries
# (``Storage.nnz``, which counts each tuple's dense fill): these give torch's answers.

def dense_dim(fmt: Format) -> int:
    """torch's ``dense_dim`` of a tensor stored in ``fmt``: its trailing dense levels when
    they store the trailing dims in order after at least one sparse level; 0 for any other
    format (blocked and all-dense ones included, every dim of which counts as sparse). Kept
    per format: ``values()`` asks on every call."""
    got = _DENSE_DIMS.get(fmt)
    if got is None:
        rank, got = fmt.rank, 0
        if fmt.block is None and not fmt.is_dense:
            while fmt.levels[rank - 1 - got].full and fmt.mode_order[rank - 1 - got] == rank - 1 - got:
                got += 1
        _DENSE_DIMS[fmt] = got
    return got


def hybrid_nnz(st: Storage) -> int:
    """torch's ``_nnz``: the index tuples of the sparse dims (``st.nnz`` without a dense dim)."""
    dense = dense_dim(st.format)
    if not dense:
        return st.nnz
    fill = math.prod(st.shape[st.ndim - dense:])
    if fill:
        return st.nnz // fill
    # a dense dim of size 0 stores no value: count the last sparse level's positions (one a
    # tuple): a level with coordinates lists them, a dense one (a permuted mode order puts
    # one there) has ``size`` under each position of the level above
    n = 1
    for lv in st.levels[:st.ndim - dense]:
        n = int(lv.crd.numel()) if lv.crd is not None else n * lv.size
    return n


def hybrid_indices(st: Storage) -> torch.Tensor:
    """torch's ``indices()``: (sparse dims, index tuples) in storage order, read from the
    sparse levels alone (no coordinate per dense-fill entry); ``coords(st)`` without one."""
    dense = dense_dim(st.format)
    if not dense:
        return coords(st)
    sparse = st.ndim - dense
    fmt = Format([k.letter for k in st.format.levels[:sparse]], st.format.mode_order[:sparse])
    part = Storage(fmt, st.shape[:sparse], st.levels[:sparse],
                   st.values.new_zeros(1).expand(hybrid_nnz(st)), st.index_dtype)
    return coords(part)


def hybrid_values(st: Storage, values: torch.Tensor) -> torch.Tensor:
    """``values`` (``st``'s, flat, in storage order) as torch's ``values()``: a view of shape
    (index tuples, *dense dims); unchanged without a dense dim."""
    dense = dense_dim(st.format)
    return values.reshape(hybrid_nnz(st), *st.shape[st.ndim - dense:]) if dense else values


def dense_on_pattern(st: Storage, dense: torch.Tensor) -> Optional[torch.Tensor]:
    """``dense``'s values at ``st``'s stored positions, where ``dense`` (of ``st``'s shape)
    holds nothing but zeros elsewhere; None where it holds a non-zero (NaN counts) off the
    pattern, or ``st`` is blocked. Why: a dense copy of a sparse tensor's own values comes
    back on its pattern (``copy_``, ``load_state_dict``, ``vector_to_parameters``), its
    stored zeros included: rebuilt from the non-zeros, a zero-initialized weight would lose
    every entry and never train again."""
    if st.format.block is not None or type(dense) not in (torch.Tensor, torch.nn.Parameter) \
            or dense.layout != torch.strided or dense.device.type != "cpu":
        return None
    if st.ndim == 0:
        return dense.reshape(1).expand(st.nnz)
    vals = dense[tuple(coords(st))]
    if int(torch.count_nonzero(dense)) != int(torch.count_nonzero(vals)):
        return None
    return vals


def to_dense(st: Storage) -> torch.Tensor:
    fmt = st.format
    if st.ndim == 0 or (fmt.block is None and fmt.is_dense):
        return _runtime().to_dense(st)
    return _runtime().to_dense(st, zeros_output(st.shape, st.dtype))


def __getattr__(name: str):
    return getattr(_runtime(), name)
