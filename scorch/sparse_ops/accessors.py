"""torch's sparse accessors on a SparseTensor: ``values``, ``indices``, ``to_dense``, ``_nnz``,
torch's layout accessors (``crow_indices``, ``col_indices``, ``ccol_indices``, ``row_indices``,
``coalesce``, ``to_sparse_csr``/``csc``/``coo``, ``sparse_mask``);
and dtype casts (``to``, ``double``, ``float``, ...) of a sparse tensor that requires grad,
whose gradient is the cast back of the stored values' gradient, on the same pattern."""
from __future__ import annotations

from typing import Optional

import torch

from .._dispatch import register
from ..formats import Format, as_format
from ..gradients.values import from_values, values_of
from ..conversion import coords, dense_dim, hybrid_nnz
from ..tensor_type import SparseTensor, as_scorch, with_values
from .positions import values_at_coordinates


# torch's hybrid meaning (``conversion.dense_dim``): a format with trailing dense levels
# (``qqd``, ``dcd``) answers as torch's hybrid COO / CSR, values (index tuples, *dense dims)

@register(torch.Tensor.values, torch.Tensor._values)
def _values(t):
    return t.values() if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor.indices, torch.Tensor._indices)
def _indices(t):
    if not isinstance(t, SparseTensor):
        return NotImplemented
    return t.indices()


@register(torch.Tensor.to_dense)
def _to_dense(t, dtype=None, *, masked_grad=None):
    return t.to_dense(dtype) if isinstance(t, SparseTensor) else NotImplemented


@register(torch.Tensor._nnz)
def _nnz(t):
    """torch's: the index tuples (``t.nnz``, scorch's, counts the dense dims' fill too)."""
    return hybrid_nnz(t._storage) if isinstance(t, SparseTensor) else NotImplemented


# --- torch.sparse's layout accessors, for code written against torch's CSR/CSC/COO ---------

def _compressed_arrays(t: SparseTensor, name: str, fmt: str):
    """(pos, crd) of a 2-D tensor stored as ``fmt`` (csr / csc), or of torch's hybrid of one
    (then dense dims: ``dcd``); anything else says which format it is and how to get the
    layout asked for."""
    base = as_format(fmt, 2)
    dense = dense_dim(t.format)
    if t.dim() != 2 + dense or t.format != Format(
            "dc" + "d" * dense, base.mode_order + tuple(range(2, t.dim()))):
        raise RuntimeError(f"{name}(): expected a {fmt.upper()} tensor, got a scorch tensor of "
                           f"format {t.format} and shape {tuple(t.shape)}; convert it with "
                           f".to_format('{fmt}') first")
    lv = t._storage.levels[1]
    return lv.pos, lv.crd


def _accessor(name: str, fmt: str, which: int):
    @register(getattr(torch.Tensor, name))
    def handler(t):
        if not isinstance(t, SparseTensor):
            return NotImplemented
        return _compressed_arrays(t, name, fmt)[which]
    return handler


_accessor("crow_indices", "csr", 0)
_accessor("col_indices", "csr", 1)
_accessor("ccol_indices", "csc", 0)
_accessor("row_indices", "csc", 1)


def _row_major(t: SparseTensor) -> bool:
    """Whether ``t.indices()`` come in torch's coalesced order: scorch tensors never hold
    duplicate coordinates, and a format that stores its dimensions in order (not CSC, not a
    transposed COO, not blocked) keeps its coordinates row-major sorted."""
    st = t._storage
    fmt = st.format
    return fmt.block is None and tuple(fmt.mode_order) == tuple(range(st.ndim)) and st.ordered


@register(torch.Tensor.coalesce)
def _coalesce(t):
    """Itself where its indices are already row-major sorted (``is_coalesced``); else the
    same tensor as COO in row-major order, as torch's ``coalesce`` of a transposed COO."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    return t if _row_major(t) else t.to_format("coo")


@register(torch.Tensor.is_coalesced)
def _is_coalesced(t):
    return _row_major(t) if isinstance(t, SparseTensor) else NotImplemented


def _to_layout(fmt: str, layout):
    def handler(t, dense_dim=None):
        if not isinstance(t, SparseTensor):
            return NotImplemented
        if dense_dim:                  # hybrid: trailing dense levels
            return t.to_format(_hybrid(layout, t.dim(), int(dense_dim)))
        return t.to_format(fmt)        # stays a scorch tensor (differentiable)
    return handler


register(torch.Tensor.to_sparse_csr)(_to_layout("csr", torch.sparse_csr))
register(torch.Tensor.to_sparse_csc)(_to_layout("csc", torch.sparse_csc))
register(torch.Tensor.to_sparse_coo)(_to_layout("coo", torch.sparse_coo))

#: torch's sparse layouts as scorch formats (block sizes added for BSR / BSC)
_LAYOUT_FORMATS = {torch.sparse_coo: "coo", torch.sparse_csr: "csr", torch.sparse_csc: "csc",
                   torch.sparse_bsr: "dc", torch.sparse_bsc: "dc"}


def _blocked(layout, blocksize) -> Format:
    block = (int(blocksize),) * 2 if isinstance(blocksize, int) else tuple(int(b) for b in blocksize)
    if layout is torch.sparse_bsr:
        return Format("dc", block=block)
    return Format("dc", mode_order=(1, 0), block=block)


@register(torch.Tensor.to_sparse)
def _to_sparse(t, *args, layout=None, blocksize=None, dense_dim=None, sparse_dim=None):
    """``to_sparse()`` (COO), ``to_sparse(sparse_dim)`` with every dim sparse, and
    ``to_sparse(layout=..., blocksize=...)``: the matching scorch format."""
    if not isinstance(t, SparseTensor):
        return NotImplemented
    if sparse_dim is not None:
        args = (sparse_dim, *args)
    if len(args) > 1:
        return NotImplemented
    layout = layout or torch.sparse_coo
    if layout is torch.strided:
        return t.to_dense()
    if args and int(args[0]) != t.dim() or dense_dim:
        # fewer sparse dims than dims (hybrid): the trailing ones as dense levels
        dense = t.dim() - int(args[0]) if args else int(dense_dim)
        return t.to_format(_hybrid(layout, t.dim(), dense))
    if layout in (torch.sparse_bsr, torch.sparse_bsc):
        if blocksize is None:
            raise RuntimeError(f"to_sparse: {layout} needs a blocksize")
        return t.to_format(_blocked(layout, blocksize))
    if layout not in _LAYOUT_FORMATS:
        raise RuntimeError(f"to_sparse: unsupported layout {layout}")
    return t.to_format(_LAYOUT_FORMATS[layout])


def _hybrid(layout, rank: int, dense: int) -> Format:
    """The scorch format of torch's hybrid ``layout`` with ``dense`` trailing dense dims:
    COO's coordinate levels, or CSR's / CSC's two levels, then dense levels (scorch reports
    torch's hybrid meaning: ``sparse_dim``, ``dense_dim``, ``values()``)."""
    sparse = rank - dense
    if dense < 0 or sparse < 1:
        raise RuntimeError(f"to_sparse: {dense} dense dims do not fit a {rank}-d tensor")
    if layout is torch.sparse_coo:
        return Format("q" * sparse + "d" * dense)
    if layout in (torch.sparse_csr, torch.sparse_csc) and sparse == 2:
        order = (0, 1) if layout is torch.sparse_csr else (1, 0)
        return Format("dc" + "d" * dense, mode_order=order + tuple(range(2, rank)))
    raise RuntimeError(f"to_sparse: {layout} with {dense} dense dims of a {rank}-d tensor is not "
                       f"supported (batched compressed layouts are not)")


def _to_blocked(layout):
    def handler(t, blocksize, dense_dim=None):
        if not isinstance(t, SparseTensor) or dense_dim:
            return NotImplemented
        return t.to_format(_blocked(layout, blocksize))
    return handler


register(torch.Tensor.to_sparse_bsr)(_to_blocked(torch.sparse_bsr))
register(torch.Tensor.to_sparse_bsc)(_to_blocked(torch.sparse_bsc))


@register(torch.Tensor.sparse_mask)
def _sparse_mask(x, mask):
    """``x`` (dense) at ``mask``'s stored entries, on ``mask``'s pattern, differentiable in
    ``x``: one kernel ``stored(mask) * x`` that walks the mask and writes on its arrays
    (gathering ``x`` at the mask's coordinates built them first: 31 -> ~4 ms for 1.6M
    entries; torch's COO takes ~18)."""
    if isinstance(x, SparseTensor):
        return _sparse_sparse_mask(x, mask)
    if not isinstance(mask, SparseTensor):
        return NotImplemented
    if tuple(x.shape) != tuple(mask.shape):
        raise RuntimeError(f"sparse_mask(): expected the dense tensor and the mask to have the same "
                           f"shape, got {tuple(x.shape)} and {tuple(mask.shape)}")
    if mask.dim() and mask._storage.format.block is None:
        from ..gradients import compute
        r = compute(_masked_assignment(mask.dim()), mask.detach(), x)
        if isinstance(r, SparseTensor) and r._storage.shares_pattern(mask._storage):
            vals = values_of(r)
            return from_values(mask._storage, vals if vals.dtype == x.dtype else vals.to(x.dtype))
    # a 0-d or blocked mask, or a result the compiler did not write on the mask's arrays:
    # x gathered at the mask's coordinates (O(stored entries))
    at = coords(mask._storage)      # one coordinate per stored entry (dense fill included)
    return from_values(mask._storage, x[tuple(at)] if at.shape[1] else x.new_zeros(0))


def _sparse_sparse_mask(x: SparseTensor, mask) -> SparseTensor:
    """``x.sparse_mask(mask)`` for a sparse ``x``, as torch's COO: ``mask``'s pattern with
    ``x``'s value at each of its positions (0 where ``x`` stores none); a binary search per
    mask entry, differentiable in ``x``'s values."""
    m = as_scorch(mask)
    if not isinstance(m, SparseTensor):
        raise TypeError(f"sparse_mask(): the mask must be a sparse tensor, got {type(mask).__name__}")
    if tuple(x.shape) != tuple(m.shape):
        raise RuntimeError(f"sparse_mask(): expected self and the mask to have the same shape, "
                           f"got {tuple(x.shape)} and {tuple(m.shape)}")
    if m._storage.format.block is not None:
        m = m.to_format("coo")
    return from_values(m._storage, values_at_coordinates(x, coords(m._storage)).to(x.dtype))


def _masked_assignment(rank: int):
    """``out = stored(T0) * T1`` over ``rank`` dimensions, one object per rank."""
    from ..tensor_compiler import Access, Assignment, kept_assignment
    from ..tensor_compiler.index_notation import Apply, Mul
    v = "abcdefghijklmnopqrstuvwxyz"[:rank]
    return kept_assignment(("sparse_mask", rank),
                           lambda: Assignment(v, Mul(Apply("stored", Access(0, v)), Access(1, v))))


# --- casts that autograd records ---------------------------------------------------------
# Below __torch_function__ a cast is ATen's _to_copy, whose recorded backward casts the
# gradient with the input's tensor options: a SparseTensor's layout reads as strided, so the
# gradient would come back dense. Casting the stored values instead keeps it on the pattern.

def _tracked(t) -> bool:
    return isinstance(t, SparseTensor) and torch.is_grad_enabled() and t.requires_grad


def _cast(t: SparseTensor, dtype: Optional[torch.dtype], copy: bool):
    if dtype is None or dtype == t.dtype:
        if not copy:
            return t                       # torch returns the tensor itself
        dtype = t.dtype
    return from_values(t._storage, values_of(t).to(dtype, copy=copy))


def _parse_to(args, kwargs):
    """(device, dtype, copy) of a ``Tensor.to`` call, or None for a form not read here."""
    kwargs = dict(kwargs)
    copy = bool(kwargs.pop("copy", False))
    if len(args) >= 2 and isinstance(args[-1], bool) and isinstance(args[-2], bool):
        copy, args = args[-1], args[:-1]   # to(dtype, non_blocking, copy)
    try:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    except (TypeError, RuntimeError):
        return None
    return device, dtype, copy


@register(torch.Tensor.to)
def _to(t, *args, **kwargs):
    if not _tracked(t):
        return NotImplemented
    parsed = _parse_to(args, kwargs)
    if parsed is None or (parsed[0] is not None and parsed[0].type != "cpu"):
        return NotImplemented              # torch's (or scorch's CPU-only) error
    return _cast(t, parsed[1], parsed[2])


def _fixed_cast(method, dtype: torch.dtype):
    @register(method)
    def handler(t, memory_format=None):
        return _cast(t, dtype, False) if _tracked(t) else NotImplemented
    return handler


for _method, _dtype in ((torch.Tensor.double, torch.float64), (torch.Tensor.float, torch.float32),
                        (torch.Tensor.half, torch.float16), (torch.Tensor.bfloat16, torch.bfloat16)):
    _fixed_cast(_method, _dtype)


@register(torch.Tensor.type_as)
def _type_as(t, other):
    """``t.to(other)``, as torch's ``type_as``: the sparse tensor cast (torch's own composite
    reached ATen's ``_to_copy`` with a strided layout, a dense copy of any size)."""
    if not isinstance(t, SparseTensor) or not isinstance(other, torch.Tensor):
        return NotImplemented
    return t.to(other.device, other.dtype)


@register(torch.Tensor.data.__set__)
def _set_data(self, value):
    """``t.data = value``: a sparse ``t`` takes ``value``'s pattern and values (cast to its
    dtype, stored in its format; a dense ``value`` that is 0 off ``t``'s pattern keeps that
    pattern, stored zeros included, else its nonzeros), as torch's
    ``set_data`` swaps what a tensor holds without autograd seeing it
    (``vector_to_parameters``, EMA copies). A dense tensor cannot hold a sparse one's data
    (torch refuses its own sparse layouts so too): assign the module attribute instead."""
    if not isinstance(self, SparseTensor):
        raise RuntimeError(
            "data set to a tensor of an incompatible type: a dense tensor cannot take a scorch "
            "sparse tensor's data (assign the module attribute instead: module.weight = "
            "torch.nn.Parameter(sparse))")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"data must be a Tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(self.shape):
        raise RuntimeError(f"data of shape {tuple(value.shape)} for a sparse tensor of shape "
                           f"{tuple(self.shape)} (a sparse tensor cannot change its shape)")
    from ..constructors import sparse_tensor
    from ..conversion import dense_on_pattern
    with torch.no_grad():
        kept = None if isinstance(value, SparseTensor) else dense_on_pattern(self._storage, value.detach())
        if kept is not None:   # 0 off the pattern: the pattern stays, its stored zeros too
            new = with_values(self, kept.to(self.dtype).contiguous())
        else:
            new = sparse_tensor(value.detach(), format=self._storage.format, dtype=self.dtype)
    self._storage = new._storage
    torch.autograd.graph.increment_version(self._storage.values)
