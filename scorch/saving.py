"""Saving and sharing sparse tensors: the checks a loaded tensor passes, torch.load with
``weights_only=True``, and ``share_memory_``.

A SparseTensor pickles as ``(tensor_type._load, (format, shape, level arrays, values,
requires_grad))`` (``SparseTensor.__reduce_ex__``), so ``torch.save``, ``pickle``,
``copy.deepcopy`` and module ``state_dict`` round trips keep the format. torch's default
``torch.load(weights_only=True)`` accepts only allow-listed callables: ``allow_in_weights_only_load``
adds scorch's rebuild function and ``Format`` (the level kinds travel as letters), once at
import. Since a checkpoint can come from anywhere, what it rebuilds is checked first
(``checked_storage``: every pointer array monotone and inside its child level, every
coordinate inside its dimension, one value per stored position), so a damaged file gives a
ValueError instead of a kernel reading out of bounds.

``share_memory_()`` moves every level array and the values into shared memory (torch's own
``share_memory_`` would look for the wrapper's storage, which it does not have).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from ._dispatch import register
from .formats import Format, LevelKind
from .level_storage import Level, Storage, level_kinds, level_sizes, run_heads

__all__ = ["checked_storage", "check_storage", "allow_in_weights_only_load"]

_D, _C, _Q = LevelKind.DENSE, LevelKind.COMPRESSED, LevelKind.COORDINATE


def _validate():
    from ._runtime import validate
    return validate


def checked_storage(fmt: Format, shape: Sequence[int], arrays: Iterable[tuple],
                    values: torch.Tensor, operand: str = "a loaded sparse tensor") -> Storage:
    """A Storage from pickled parts ``(letter, dim, size, pos, crd, block_inner)`` per
    level, after :func:`check_storage`."""
    if not isinstance(fmt, Format):
        raise ValueError(f"{operand}: format is {type(fmt).__name__}, not a scorch.Format")
    levels = []
    for item in arrays:
        if not isinstance(item, tuple) or len(item) != 6:
            raise ValueError(f"{operand}: malformed level record {item!r}")
        kind, dim, size, pos, crd, inner = item
        levels.append(Level(LevelKind(kind), int(dim), int(size), pos, crd, bool(inner)))
    st = Storage(fmt, shape, levels, values)
    check_storage(st, operand)
    return st


def check_storage(st: Storage, operand: str = "a sparse tensor") -> None:
    """Raise ValueError unless ``st`` satisfies the level-storage contract (see
    ``scorch.level_storage``) well enough for kernels to read it safely: O(nnz), through
    ``scorch._runtime.validate``."""
    fmt = st.format
    if len(st.shape) != fmt.rank:
        raise ValueError(f"{operand}: format {fmt} has {fmt.rank} levels but the shape "
                         f"{st.shape} has {len(st.shape)} dimensions")
    if any(s < 0 for s in st.shape):
        raise ValueError(f"{operand}: negative dimension in shape {st.shape}")
    if fmt.block is not None and any(s % b for s, b in zip(st.shape, fmt.block)):
        raise ValueError(f"{operand}: shape {st.shape} is not a multiple of the block {fmt.block}")
    kinds, sizes, heads = level_kinds(fmt), level_sizes(st.shape, fmt), run_heads(level_kinds(fmt))
    if len(st.levels) != len(kinds):
        raise ValueError(f"{operand}: {len(st.levels)} levels stored, format {fmt} has {len(kinds)}")
    if not isinstance(st.values, torch.Tensor) or st.values.dim() != 1:
        raise ValueError(f"{operand}: values must be a 1-d tensor")
    if st.values.device.type != "cpu":
        raise ValueError(f"{operand}: values are on {st.values.device}, not the CPU")
    from ._runtime import convert
    convert._check_values_dtype(st.values.dtype, f"values of {operand}")
    validate = _validate()
    index_dtypes = set()
    count = 1
    for k, (lv, kind, (dim, size, inner), head) in enumerate(zip(st.levels, kinds, sizes, heads)):
        where = f"level {k} of {operand}"
        if lv.kind is not kind or lv.dim != dim or lv.size != size or lv.block_inner != inner:
            raise ValueError(f"{where}: stored as ({lv.kind}, dim {lv.dim}, size {lv.size}), "
                             f"format {fmt} needs ({kind}, dim {dim}, size {size})")
        if kind is _D:
            if lv.pos is not None or lv.crd is not None:
                raise ValueError(f"{where}: a dense level has no pos/crd arrays")
            count *= size
            continue
        if lv.crd is None or (head and lv.pos is None) or (not head and lv.pos is not None):
            raise ValueError(f"{where}: a {kind} level needs "
                             f"{'pos and crd' if head else 'crd only'}")
        for a in (lv.pos, lv.crd):
            if a is not None:
                index_dtypes.add(a.dtype)
        if head:
            verdict = validate.compressed(lv.pos, lv.crd, count, size, 2**62, where)
            if kind is _C and verdict != validate.CANONICAL:
                raise ValueError(f"{where}: coordinates of a compressed level must be sorted "
                                 f"and unique in every segment")
            count = int(lv.pos[count])
        else:
            if lv.crd.dim() != 1 or lv.crd.numel() != count:
                raise ValueError(f"{where}: crd has {lv.crd.numel()} entries, expected {count}")
            validate.coordinates(lv.crd.reshape(1, -1), (size,), where, need_order=False)
    if len(index_dtypes) > 1:
        raise ValueError(f"{operand}: index arrays mix dtypes {sorted(map(str, index_dtypes))}")
    if st.values.numel() != count:
        raise ValueError(f"{operand}: {st.values.numel()} values for {count} stored positions")


def allow_in_weights_only_load(*callables: Any) -> None:
    """Let ``torch.load(weights_only=True)`` (torch's default) rebuild sparse tensors."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add([Format, *callables])


# --- shared memory ------------------------------------------------------------------

def _arrays(t) -> list:
    return t._storage.arrays()


@register(torch.Tensor.share_memory_)
def share_memory_(t):
    """Move every level array and the values to shared memory (in place, as torch does)."""
    moved = False
    for a in _arrays(t):
        if not a.is_shared():
            a.share_memory_()
            moved = True
    if moved:
        forget_array_addresses()
    return t


def forget_array_addresses() -> None:
    """Drop every Storage's cached array addresses (``plans.storage_pointers``). Moving an
    array in place (``share_memory_`` copies it to shared memory and frees the old buffer)
    leaves them pointing at freed memory, and any Storage may hold the moved array: views,
    and results on the same pattern, share index arrays. A scan of the live objects (~0.1 s
    in a large process) on this rare call costs nothing on the warm path of every kernel."""
    import gc
    for obj in gc.get_objects():
        if type(obj) is Storage:
            obj._ptrs = None


@register(torch.Tensor.is_shared)
def is_shared(t) -> bool:
    return all(a.is_shared() for a in _arrays(t))


@register(torch.Tensor.is_pinned)
def is_pinned(t, device=None) -> bool:
    return all(a.is_pinned() for a in _arrays(t))


@register(torch.Tensor.pin_memory)
def pin_memory(t, device=None):
    """No dense copy (torch's own went through the dense fallback: a DenseFallbackError for
    a 2M x 2M matrix): torch's error where no accelerator is present, as for a dense tensor;
    else the tensor as it is (pinned memory serves copies to an accelerator, and scorch
    sparse tensors stay on the CPU: a DataLoader's ``pin_memory=True`` passes them on)."""
    t._storage.values[:0].pin_memory()
    return t
