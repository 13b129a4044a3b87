"""torch.distributed collectives on SparseTensor (API.md section 8).

torch's collectives reach a tensor subclass as ATen ops of the ``c10d`` namespace
(``c10d::allreduce_`` ...), so they are handled here at that level, whatever front end
called them (``dist.all_reduce``, ``ProcessGroup.allreduce``, DDP):

* ``all_reduce``, ``reduce``, ``broadcast``: every rank must hold the same sparsity pattern
  (format, shape, index arrays); then the collective runs on the values array, in place.
  The pattern is compared first with one small collective (a fingerprint of the format,
  shape, dtype and an O(nnz) checksum of the index arrays, reduced with MAX over
  ``[f, -f]``), so every rank raises the same clear RuntimeError when they differ instead
  of reducing unrelated entries.
* ``all_gather``: output tensors that are SparseTensors of the same pattern receive the
  gathered values; dense outputs receive the gathered tensors densified.
* every other c10d collective raises a RuntimeError naming it (the dense fallback would
  otherwise run it on throw-away dense copies and silently change nothing).

Object collectives (``all_gather_object``, ``broadcast_object_list``) pickle the tensor
and need nothing here.
"""
from __future__ import annotations

import hashlib
from typing import List, Sequence

import torch

from ._dispatch import refusal, register_aten
from .level_storage import Storage
from .tensor_type import SparseTensor, with_values

__all__ = ["pattern_fingerprint"]

_c10d = torch.ops.c10d
_FINGERPRINT_LEN = 6


def _hash64(text: str) -> int:
    """A hash that is the same in every process (``hash()`` of a str is not)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")


def pattern_fingerprint(st: Storage) -> torch.Tensor:
    """int64[6] naming a storage's sparsity pattern: format, shape, value dtype, stored
    count and two checksums over all index arrays (O(nnz))."""
    s1 = torch.zeros((), dtype=torch.int64)
    s2 = torch.zeros((), dtype=torch.int64)
    for k, lv in enumerate(st.levels):
        for a in (lv.pos, lv.crd):
            if a is None:
                continue
            a = a.to(torch.int64)
            weight = torch.arange(a.numel(), dtype=torch.int64) * 2654435761 % 1000003 + k + 1
            s1 += (a * weight).sum()
            s2 += ((a + 7) * (a + 13) % 999983).sum()
    return torch.tensor([_hash64(repr(st.format)), _hash64(repr(st.shape)),
                         _hash64(str(st.dtype)), st.nnz, int(s1) & (2**62 - 1),
                         int(s2) & (2**62 - 1)], dtype=torch.int64)


def _unbox(process_group):
    return torch.distributed.ProcessGroup.unbox(process_group)


def _check_same_pattern(sparse: Sequence[SparseTensor], process_group, what: str) -> None:
    """Raise on every rank unless all ranks hold the same patterns (one MAX all-reduce)."""
    if not sparse:
        return
    f = torch.cat([pattern_fingerprint(t._storage) for t in sparse])
    both = torch.cat([f, -f])
    opts = torch.distributed.AllreduceOptions()
    opts.reduceOp = torch.distributed.ReduceOp.MAX
    _unbox(process_group).allreduce([both], opts).wait()
    n = f.numel()
    if not torch.equal(both[:n], -both[n:]):
        fields = ("format", "shape", "dtype", "stored entries", "indices", "indices")
        differ = sorted({fields[i % _FINGERPRINT_LEN] for i in range(n)
                         if both[i] != -both[n + i]})
        raise RuntimeError(
            f"torch.distributed.{what} on a scorch SparseTensor needs the same sparsity "
            f"pattern on every rank (it reduces the values array); the ranks differ in "
            f"{', '.join(differ)}. Convert to dense, or gather the tensors with "
            f"all_gather_object")


def _values_of(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    out = []
    for t in tensors:
        if isinstance(t, SparseTensor):
            v = t._storage.values
            if not v.is_contiguous():
                raise RuntimeError("collective on a SparseTensor whose values are not contiguous")
            out.append(v)
        else:
            out.append(t)
    return out


def _sparse(tensors) -> List[SparseTensor]:
    return [t for t in tensors if isinstance(t, SparseTensor)]


@register_aten(_c10d.allreduce_.default)
def _allreduce(tensors, process_group, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    _check_same_pattern(_sparse(tensors), process_group, "all_reduce")
    _, work = _c10d.allreduce_.default(_values_of(tensors), process_group, reduce_op,
                                       sparse_indices, async_op, timeout)
    return list(tensors), work


@register_aten(_c10d.reduce_.default)
def _reduce(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    _check_same_pattern(_sparse(tensors), process_group, "reduce")
    return _c10d.reduce_.default(_values_of(tensors), process_group, reduce_op, root_rank,
                                 root_tensor, async_op, timeout)


@register_aten(_c10d.broadcast_.default)
def _broadcast(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    _check_same_pattern(_sparse(tensors), process_group, "broadcast")
    _, work = _c10d.broadcast_.default(_values_of(tensors), process_group, root_rank,
                                       root_tensor, async_op, timeout)
    return list(tensors), work


@register_aten(_c10d.allgather_.default)
def _allgather(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    """Outputs of the input's pattern get the values; dense outputs get dense tensors."""
    inputs = _sparse(input_tensors)
    if len(inputs) != len(input_tensors):
        raise RuntimeError("torch.distributed.all_gather: mix of sparse and dense inputs")
    _check_same_pattern(inputs, process_group, "all_gather")
    mine = [pattern_fingerprint(t._storage) for t in inputs]
    buffers, finish = [], []
    for outs, src, fp in zip(output_tensors, inputs, mine):
        row = []
        for out in outs:
            if isinstance(out, SparseTensor):
                if not torch.equal(pattern_fingerprint(out._storage), fp):
                    raise RuntimeError(
                        "torch.distributed.all_gather: a sparse output tensor must have the "
                        "input's sparsity pattern (e.g. [t.clone() for _ in range(world)])")
                row.append(out._storage.values)
            elif isinstance(out, torch.Tensor) and out.layout == torch.strided:
                if tuple(out.shape) != tuple(src.shape):
                    raise RuntimeError(f"torch.distributed.all_gather: output of shape "
                                       f"{tuple(out.shape)} for an input of shape {tuple(src.shape)}")
                buf = torch.empty_like(src._storage.values)
                row.append(buf)
                finish.append((out, src, buf))
            else:
                raise RuntimeError("torch.distributed.all_gather: outputs must be SparseTensors "
                                   "of the input's pattern or dense tensors")
        buffers.append(row)
    work = _c10d.allgather_.default(buffers, _values_of(input_tensors), process_group,
                                    False if finish else async_op, timeout)[1]
    if finish:
        work.wait()
        for out, src, buf in finish:
            out.copy_(with_values(src, buf).to_dense())
    return [list(o) for o in output_tensors], work


def _unsupported(name: str):
    return refusal(RuntimeError,
                   f"torch.distributed: c10d.{name} is not supported on a scorch SparseTensor; "
                   f"all_reduce, reduce, broadcast and all_gather are (same sparsity pattern on "
                   f"every rank), or send its values() / use the object collectives")


for _name in ("allreduce_coalesced_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
              "reduce_scatter_", "_reduce_scatter_base_", "_allgather_base_", "gather_",
              "scatter_", "alltoall_", "alltoall_base_", "send", "recv_", "recv_any_source_",
              "reduce_scatter_tensor_coalesced_"):
    _op = getattr(_c10d, _name, None)
    if _op is not None:
        register_aten(_op.default)(_unsupported(_name))
