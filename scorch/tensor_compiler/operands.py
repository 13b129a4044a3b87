"""Operand binding: what the kernels read. Dense torch tensors stay as they are (read through
strides); scorch Storages and SparseTensors give their Storage; torch's own sparse layouts are
wrapped once per tensor. Also the storage-level steps a plan may need before a kernel runs:
re-formatting (transposes, unblocking) and value casts."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..formats import Format
from ..level_storage import Level, Storage, materialized
from ..tensor_cache import TensorKeyedCache, version

__all__ = ["as_operand", "torch_sparse_storage", "convert_storage", "unblocked", "cast_storage"]


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def as_operand(x: Any, n: Optional[int] = None):
    """A dense strided CPU tensor, or a Storage (``n``: the operand's number, for messages)."""
    if isinstance(x, Storage):
        return x
    st = getattr(x, "_storage", None)
    if isinstance(st, Storage):
        return st
    name = "an operand" if n is None else f"operand {n}"
    if isinstance(x, torch.Tensor):
        if not x.is_cpu:
            raise ValueError(f"einsum(): {name} is on device {x.device}; scorch kernels run on "
                             f"CPU tensors (move it with .cpu())")
        if x.layout != torch.strided:
            return torch_sparse_storage(x)
        if (type(x).__torch_dispatch__ is not _PLAIN_DISPATCH
                and not type(x).__module__.startswith("torch._subclasses")):   # (compile's fakes)
            # a wrapper subclass (torch.masked's MaskedTensor, ...): its memory is not its value
            raise TypeError(f"einsum(): {name} is a {type(x).__name__}, a tensor subclass with "
                            f"its own __torch_dispatch__, whose memory scorch cannot read; pass "
                            f"a plain tensor")
        return materialized(x.detach() if x.requires_grad else x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"einsum(): {name} of type {type(x).__name__} is not a tensor")
    return torch.tensor(x)


#: a torch sparse tensor -> the Storage over its arrays, stamped with its version counter
_TORCH_SPARSE = TensorKeyedCache()


def _unlinked(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The same memory as ``t`` through a tensor that refers to the memory only, not to
    ``t`` (views of a sparse tensor's arrays keep the sparse tensor alive)."""
    if t is None:
        return None
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.size(),
                                              t.stride())


def torch_sparse_storage(x: torch.Tensor) -> Storage:
    """The Storage over one of torch's sparse layouts (its arrays, not copied). Wrapping costs
    ~20 us of Python, so the wrap is kept for the tensor's lifetime while it shares the
    tensor's value array (in-place changes of the values then show through) and the tensor's
    version counter is unchanged (an in-place op on the tensor may have replaced its arrays).
    The kept Storage refers to the arrays' memory only, so the tensor can still be freed.
    Only the wrap is kept: the arrays are ``untracked`` (the tensors given to torch's
    constructor write them unseen), so nothing derived from their contents is reused
    unchecked; a copy made of them (an uncoalesced COO's) is made each call."""
    stamp = version(x)   # (read before the wrap: a write during it must miss next time)
    hit = _TORCH_SPARSE.get(x, stamp=stamp)
    if hit is not None:
        return hit
    from ..interop import from_torch, torch_arrays
    st = from_torch(x)
    # kept only where every array is read in place (a copy of any, an uncoalesced COO's or
    # strided index arrays made contiguous, would miss a write to the original)
    mine = {a.data_ptr() for a in (st.values, *(y for lv in st.levels for y in (lv.pos, lv.crd)))
            if a is not None}
    if all(a.data_ptr() in mine for a in torch_arrays(x)):
        st = Storage(st.format, st.shape,
                     [Level(lv.kind, lv.dim, lv.size, _unlinked(lv.pos), _unlinked(lv.crd),
                            lv.block_inner) for lv in st.levels],
                     _unlinked(st.values), st.index_dtype)
        _TORCH_SPARSE.put(x, st, stamp=stamp)
    return st


def convert_storage(st: Storage, fmt: Format) -> Storage:
    """Re-format a storage (transposes, unblocking, requested output formats) through the
    runtime's ``convert``."""
    from ..conversion import convert
    return convert(st, fmt)


def unblocked(st: Storage) -> Storage:
    return convert_storage(st, Format(st.format.levels, st.format.mode_order))


def cast_storage(st: Storage, dtype: torch.dtype) -> Storage:
    v = st.values
    if v.dtype == dtype and v.is_contiguous() and not v.requires_grad:
        return st
    return Storage(st.format, st.shape, st.levels, v.detach().to(dtype).contiguous(), st.index_dtype)
