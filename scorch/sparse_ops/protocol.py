"""Python-level protocol methods of ``torch.Tensor`` on a SparseTensor: ``reversed(A)`` and
``v in A`` (torch's own bodies call ``flip`` / ``eq`` below the handlers, where only the
dense fallback is); and the memory-level accessors a sparse tensor cannot serve, refused by name
(``__dlpack__``, ``apply_``, ``storage``, ``untyped_storage``; ``data_ptr`` is the values'): torch's own
read the wrapper's empty memory (a segfault, garbage values, an internal message). Under
torch.compile, whose fake-tensor conversion calls ``untyped_storage`` on a sparse input,
``library_ops._route`` lets torch's own run."""
from __future__ import annotations

import math
import numbers

import torch

from .._dispatch import register
from ..tensor_type import SparseTensor


def _described(t: SparseTensor) -> str:
    st = t._storage
    return f"a scorch sparse tensor ({st.format} {tuple(st.shape)}, {t.nnz} stored entries)"


def _no_single_memory(what: str):
    """A handler refusing ``what``: a sparse tensor's entries live in several arrays (its
    levels' positions and coordinates, its values), not one block of dense memory."""
    def handler(t, *args, **kwargs):
        if not isinstance(t, SparseTensor):
            return NotImplemented
        raise RuntimeError(f"{what}: {_described(t)} has no single dense memory block (its "
                           f"entries live in several arrays); use .to_dense() for its dense "
                           f"values, or .values() / .indices() for the stored entries")
    return handler


# (``__dlpack_device__`` first: torch's own asks ``is_pinned`` below the handlers, a dense copy)
register(torch.Tensor.__dlpack__, torch.Tensor.__dlpack_device__)(
    _no_single_memory("__dlpack__ (torch / numpy from_dlpack)"))
register(torch.Tensor.storage, torch.Tensor._typed_storage)(_no_single_memory("storage()"))
register(torch.Tensor.untyped_storage)(_no_single_memory("untyped_storage()"))


@register(torch.Tensor.data_ptr)
def _data_ptr(t):
    """The stored values' address. It was 0 for every sparse tensor, so code comparing
    addresses saw them all as aliases; torch itself reads it (``allow_mutation_on_saved_
    tensors`` keys saved tensors by it), so it answers rather than refuses: two sparse
    tensors share it exactly when they share their values."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    return t._storage.values.data_ptr()


@register(torch.Tensor.apply_)
def _apply_(t, fn):
    """torch's ``apply_`` walks the tensor's memory (a segfault here). ``fn`` would also apply
    at every unstored position (``fn(0)`` need not be 0): refused, as torch's ``map_`` is for
    subclasses."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    raise RuntimeError(f".apply_ is not supported for {_described(t)} (fn would apply at its "
                       f"unstored positions too): use .to_dense().apply_(fn), or "
                       f".values().apply_(fn) to map the stored values in place (the unstored "
                       f"entries stay 0)")


@register(torch.Tensor.__reversed__)
def _reversed(t):
    """``A.flip(0)``, as torch's ``__reversed__`` (a tensor, not an iterator: iterating it
    gives the rows from the last; a 0-d tensor is itself), with the sparse ``flip``."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    return t if t.dim() == 0 else torch.flip(t, (0,))


@register(torch.Tensor.__contains__)
def _contains(t, element):
    """``element in A``: ``(A == element).any()`` as torch's. A scalar is compared with the
    stored values alone (0 also matches an unstored position): O(stored entries), where
    ``A == 0`` would be dense by nature."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if isinstance(element, torch.Tensor) and element.dim() == 0 \
            and not isinstance(element, SparseTensor):
        element = element.item()
    if isinstance(element, numbers.Number):
        values = t._storage.values
        if bool((values == element).any()):
            return True
        return element == 0 and values.numel() < math.prod(t._storage.shape)
    if isinstance(element, torch.Tensor):
        return bool((element == t).any())
    raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in "
                       f"a {type(element)}.")


