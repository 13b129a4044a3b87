"""A dense matrix the kernel streams along one index and gathers along another, which a
sparse operand's last level drives: copied for the call as only the slices the sparse
operand stores, not re-laid out whole.

Why: ``einsum("ij,kj->ik", X, W)`` with ``X`` a CSR batch and ``W`` stored out x in reads a
row of ``W.t()`` (``out`` values) per stored ``X[i, j]``, so ``W.t()`` must be contiguous.
``relayout`` copies all of ``W`` per call, a vocabulary-sized embedding's worth for a batch
that touches a few hundred of its columns (80k x 256, 8 documents of 100 words: 16 ms, the
product itself ~0.2 ms). Here ``X``'s stored columns are renumbered ``0..ncols-1`` and only
those columns of ``W`` are copied (``dense_moves.gather_columns``): the same plan then runs
on the narrow pair, whose operands its warm call takes as they are. ``F.linear`` and
``X @ W.t()`` take the same copy with a gradient of their own (``sparse_ops/gathered_columns``).

Where the touched columns cover most of the matrix's cache lines, the gather reads as much
as the whole copy and is slower per byte, so it is taken only up to :data:`GATHER_MAX_LINES`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from .._runtime.dense_moves import gather_columns
from ..formats import LevelKind
from ..level_storage import Storage, _bare_storage
from .allocate import empty_output
from .plans import storage_signature
from .threads import threads_for

__all__ = ["NarrowedGather", "narrowed_gather", "touched_lines", "narrowed_columns",
           "GATHER_MAX_LINES"]

#: the largest fraction of a dense matrix's cache lines the touched columns may cover for
#: the gather to be taken: past it the copy reads as much as the whole transpose, which is
#: faster per byte (20k x 128 weight, 16 % of the columns touched: 1.47 against 0.83 ms)
GATHER_MAX_LINES = 0.5


def touched_lines(columns: int, width: int, element_size: int) -> float:
    """The expected fraction of a row's cache lines that ``columns`` of its ``width``
    columns, spread at random, touch."""
    per_line = max(1, 64 // element_size)
    return 1.0 - (1.0 - columns / width) ** per_line


def narrowed_columns(st: Storage):
    """The distinct coordinates of ``st``'s last level, sorted, and ``st`` with its last
    level renumbered into them (its extent the number of distinct ones). O(nnz log nnz); no
    array as long as the dimension. The order within each fiber is kept, so a sorted level
    stays sorted."""
    level = st.levels[-1]
    crd = level.crd[:st.nnz] if level.crd.numel() != st.nnz else level.crd
    cols, renumbered = torch.unique(crd, sorted=True, return_inverse=True)
    shape = list(st.shape)
    shape[level.dim] = cols.numel()
    levels = tuple(st.levels[:-1]) + (dataclasses.replace(level, size=cols.numel(),
                                                          crd=renumbered.to(crd.dtype)),)
    return cols.to(torch.int64), _bare_storage(st.format, tuple(shape), levels, st.values,
                                                st.index_dtype)


@dataclasses.dataclass(frozen=True)
class NarrowedGather:
    """Dense operand ``dense`` (2-D) is streamed along dimension ``stream`` and indexed
    along the other by the last level of sparse operand ``sparse``, an index nothing else
    reads."""
    sparse: int
    dense: int
    stream: int

    def columns(self, ops) -> Optional[tuple]:
        """``(cols, narrow)`` (``narrowed_columns`` of the sparse operand) where this call
        takes the narrow copy, else None: the dense operand already stride 1 along the
        streamed dimension, not a float matrix with its other dimension at stride 1, as
        many stored entries as columns (the whole copy then costs at most what the product
        reads; no sort), or the touched columns covering more than :data:`GATHER_MAX_LINES`
        of its lines."""
        x = ops[self.dense]
        d = self.stream
        if x.stride(d) == 1 or x.shape[d] <= 1:
            return None
        other = 1 - d
        if (x.stride(other) != 1 or x.dtype not in (torch.float32, torch.float64)
                or x.is_neg() or x.is_conj()):
            return None
        st = ops[self.sparse]
        width = x.shape[other]
        if st.nnz >= width:
            return None
        cols, narrow = narrowed_columns(st)
        if touched_lines(cols.numel(), width, x.element_size()) > GATHER_MAX_LINES:
            return None
        return cols, narrow

    def narrowed(self, ops) -> Optional[list]:
        """The operands with the pair narrowed for this call, or None (see ``columns``)."""
        found = self.columns(ops)
        if found is None:
            return None
        cols, narrow = found
        storage_signature(narrow)      # what the warm call compares
        x = ops[self.dense]
        other = 1 - self.stream
        # the matrix as rows x columns with contiguous rows (``gather_columns``' form)
        rows_major = x if other == 1 else x.t()
        moved = empty_output((cols.numel(), rows_major.shape[0]), x.dtype)
        gather_columns(rows_major, cols, moved, threads_for(moved.numel()))
        out = list(ops)
        out[self.sparse] = narrow
        out[self.dense] = moved.t() if other == 1 else moved
        return out

    def run(self, ops, run_entry: Callable, entry):
        ops = self.narrowed(ops)
        return None if ops is None else run_entry(entry, ops)


def narrowed_gather(entry) -> Optional[NarrowedGather]:
    """The narrowing for plan ``entry``, or None: a dense 2-D operand the plan re-lays out
    (``entry.relayout``), read once, whose other index ``j`` is read only by one sparse
    operand, as its own (untransposed) last level, compressed, and is not in the output."""
    s = entry.schedule
    if entry.split is not None:
        return None
    reads: dict = {}
    for ap in s.accesses:
        for v in ap.indices:
            reads.setdefault(v, set()).add(ap.id)
    output = set(s.assignment.output)
    for aid, (d, _perm, _inv) in entry.relayout.items():
        ap = s.accesses[aid]
        if len(ap.indices) != 2 or sum(1 for a in s.accesses if a.tensor == ap.tensor) != 1:
            continue
        j = ap.indices[1 - d]
        if j in output or j == ap.indices[d] or len(reads[j]) != 2:
            continue
        (sid,) = reads[j] - {aid}
        sp = s.accesses[sid]
        if not sp.sparse or sp.transposed or sum(1 for a in s.accesses if a.tensor == sp.tensor) != 1:
            continue
        fmt = sp.source_format
        if (fmt is None or fmt.block is not None or fmt.levels[-1] is not LevelKind.COMPRESSED
                or sp.indices[fmt.mode_order[-1]] != j or sp.indices.count(j) != 1):
            continue
        return NarrowedGather(sp.tensor, ap.tensor, d)
    return None
