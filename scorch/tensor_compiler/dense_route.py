"""A sparse result whose sparse levels sit over dense levels (``cd``, ``cdd``; CSF's and
COO's SpMM results ``ccd``, ``qd``), computed into a dense array and compressed afterwards.

Why: format inference gives ``S^T @ D`` (``einsum("ij,ik->jk", S, D)``) a result with a
compressed ``j`` and a dense ``k``, and the MoE's expert gradient ``bd,bh,bn->ndh`` one with a
compressed ``n``. The reduction loop (``i``, ``b``) then runs outside the output's loops, so
the schedule accumulates into a workspace over the whole result, element by element, and
sorts the touched keys when it drains: 5-10x the time of the same product into a dense
array (20000 x 20000 ``S`` at 0.1 %, K = 32: 62 ms against 6 ms; the MoE gradient: 1.7 s
against ~40 ms). The rows of such a result are dense anyway, so the dense plan runs instead
and the rows it touched are kept (the numerically non-zero ones: the same tensor).

It pays where the dense array is not much larger than the work the product does anyway:
every stored entry of a sparse operand that indexes the compressed level's variable meets
every combination of the output variables it does not index, so the dense array's size is
bounded by that work (``pays``). A result with few touched rows among many (a hypersparse
``S``) keeps the workspace."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .._runtime.dense_moves import compact_nonzero_rows
from ..formats import Format, LevelKind
from ..level_kinds.assembly import build_levels
from ..level_storage import Level, Storage, index_dtype_for
from .loop_order import NoValidOrder

__all__ = ["DenseRoute", "dense_route"]


class DenseRoute:
    """The dense plan of an expression whose workspace plan writes ``fmt`` (one compressed
    level, then dense ones), and when to take it."""

    def __init__(self, dense_entry, fmt: Format, out_dims: Sequence[tuple], witnesses: Sequence[tuple]):
        self.dense_entry = dense_entry
        self.format = fmt
        self.out_dims = tuple(out_dims)     # per output variable: (operand, dimension) giving its extent
        self.witnesses = tuple(witnesses)   # (sparse operand, the out_dims of the output variables it lacks)

    def pays(self, ops) -> bool:
        """Whether the dense array is at most the work of the product: for each sparse
        operand ``P`` over the compressed level's variable, ``nnz(P)`` times the extents
        of the output variables ``P`` does not index (the smallest: an intersection does
        no more than its sparsest operand)."""
        size = math.prod(ops[n].shape[d] for n, d in self.out_dims)
        return size <= min(ops[n].nnz * math.prod(ops[m].shape[d] for m, d in free)
                           for n, free in self.witnesses)

    def run(self, ops, run_entry) -> Storage:
        """The result in ``self.format``: the dense plan's array, its touched rows kept."""
        return compress_rows(run_entry(self.dense_entry, ops), self.format)


def dense_route(entry, make_dense) -> Optional[DenseRoute]:
    """The route for a workspace plan ``entry`` whose result has one compressed level over
    dense ones (a sum; sorted), with ``make_dense()`` building the dense plan; None for
    every other plan."""
    s = entry.schedule
    out = s.output
    fmt = out.format
    if (out.dense or out.mode != "ws" or out.final_format is not None or out.unsorted
            or s.assignment.reduce != "sum" or entry.split is not None or fmt is None
            or fmt.block is not None or fmt.rank < 2 or sparse_prefix(fmt) == 0):
        return None
    top = out.level_vars[0]
    where = {}
    for n, idx in enumerate(entry.operand_indices):
        for d, v in enumerate(idx):
            where.setdefault(v, (n, d))
    output = tuple(s.assignment.output)
    if any(v not in where for v in output):
        return None
    sparse = {ap.tensor for ap in s.accesses if ap.sparse}
    witnesses = [(n, tuple(where[v] for v in output if v not in idx))
                 for n, idx in enumerate(entry.operand_indices) if n in sparse and top in idx]
    if not witnesses:
        return None
    try:
        dense_entry = make_dense()
    except (NoValidOrder, NotImplementedError):   # no dense plan: the workspace only
        return None
    return DenseRoute(dense_entry, fmt, [where[v] for v in output], witnesses)


#: the level kinds a sparse prefix of a routed result may have (built from sorted, unique
#: coordinates; a singleton level promises one entry per parent, which a dense array cannot)
_PREFIX_KINDS = (LevelKind.COMPRESSED, LevelKind.COORDINATE)


def sparse_prefix(fmt: Format) -> int:
    """How many sparse levels ``fmt`` stores above its dense ones (``cd``, ``cdd``: 1; CSF's
    SpMM result ``ccd`` or COO's ``qd``: 2 and 1), or 0 when it is not that shape."""
    k = 0
    while k < len(fmt.levels) and fmt.levels[k] in _PREFIX_KINDS:
        k += 1
    if k == 0 or k == len(fmt.levels) or any(kind is not LevelKind.DENSE for kind in fmt.levels[k:]):
        return 0
    return k


def compress_rows(dense: torch.Tensor, fmt: Format) -> Storage:
    """``dense`` as a storage of ``fmt`` (sparse levels, then dense ones: ``sparse_prefix``):
    the sparse levels keep the coordinates whose dense block holds a non-zero (NaN counts).
    The kept blocks move to the front of the array in place (``dense`` is this call's own),
    which then holds the values: ``einsum("ji,jk->ik", csr, H)``, 20,000^2 at 0.05 %, K = 32,
    2.2 -> 0.72 ms (through ``ne(0).any(1)`` and a gather: ~1.5 ms of it)."""
    y = dense.permute(fmt.mode_order)
    k = sparse_prefix(fmt)
    lead = y.shape[:k]
    n0 = math.prod(lead)
    flat = y.reshape(n0, math.prod(y.shape[k:]))
    if not flat.is_contiguous():
        flat = flat.contiguous()
    rows = compact_nonzero_rows(flat)   # in place: the dense array is this call's own
    vals = flat[:rows.numel()].reshape(-1)
    if rows.numel() < n0 // 2:   # most of the array dropped: do not keep it alive
        vals = vals.clone()
    idt = index_dtype_for(tuple(dense.shape), max(vals.numel(), n0))
    sizes = [dense.shape[d] for d in fmt.mode_order]
    if k == 1:
        levels = [Level(fmt.levels[0], fmt.mode_order[0], sizes[0],
                        torch.tensor([0, rows.numel()], dtype=idt), rows.to(idt))]
    else:   # the kept blocks' coordinates, row-major: sorted and unique
        coords = torch.empty(rows.numel(), k, dtype=torch.int64)
        rest = rows
        for d in range(k - 1, -1, -1):
            coords[:, d] = rest % lead[d]
            rest = rest // lead[d]
        built, _, _ = build_levels(fmt.levels[:k], coords, torch.empty(rows.numel()), sizes[:k])
        levels = [Level(kind, fmt.mode_order[d], sizes[d], None if pos is None else pos.to(idt),
                        None if crd is None else crd.to(idt))
                  for d, (kind, (pos, crd)) in enumerate(zip(fmt.levels[:k], built))]
    levels += [Level(LevelKind.DENSE, d, s) for d, s in zip(fmt.mode_order[k:], sizes[k:])]
    return Storage(fmt, tuple(dense.shape), levels, vals.contiguous(), idt)
