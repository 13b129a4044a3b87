"""Ways into a sparse tensor: from dense torch / numpy, torch sparse layouts, scipy, and
coordinate lists."""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np
import torch

from . import interop
from .dynamo_rules import script_as_builtin, trace_instead
from .formats import FormatLike, as_format
from .tensor_type import SparseTensor, _TORCH_SPARSE_LAYOUTS, refuse_transformed_source

__all__ = ["sparse_tensor", "tensor", "from_scipy"]


_CONVERSION: list = []


def _convert():
    """``scorch.conversion``, imported on first use (an import statement per call costs ~1 us,
    and a training step converts its batch on every call)."""
    if not _CONVERSION:
        from . import conversion
        _CONVERSION.append(conversion)
    return _CONVERSION[0]


def _check_size(size: Any, name: str = "size") -> tuple:
    if isinstance(size, torch.Size):
        return tuple(size)
    if isinstance(size, numbers.Number):
        size = (size,)
    try:
        dims = list(size)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of non-negative ints, got {size!r}") from None
    out = []
    for d in dims:
        if isinstance(d, torch.Tensor) and d.numel() == 1:
            d = d.item()
        if isinstance(d, float) and math.isnan(d):
            raise ValueError(f"{name} contains NaN: {size!r}")
        if isinstance(d, bool) or not isinstance(d, (numbers.Integral, np.integer)) and not (
                isinstance(d, float) and d.is_integer()):
            raise ValueError(f"{name} must contain integers, got {d!r} in {size!r}")
        if d < 0:
            raise ValueError(f"{name} has a negative dimension {int(d)} in {size!r}")
        out.append(int(d))
    return tuple(out)


def _check_dtype(dtype: torch.dtype, name: str) -> None:
    _convert()._check_values_dtype(dtype, name)


def _check_dtype_arg(dtype: Any) -> None:
    """``dtype=`` must be a torch.dtype (torch itself rejects strings such as 'float32')."""
    if dtype is not None and not isinstance(dtype, torch.dtype):
        hint = f" (use torch.{dtype})" if isinstance(dtype, str) and \
            isinstance(getattr(torch, dtype, None), torch.dtype) else ""
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}{hint}")


def _number_tensor(x: Any, name: str, empty: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x`` (tensor, numpy array, nested list) as a tensor of numbers; strings, objects and
    ragged lists give a TypeError naming ``name``."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return interop.numpy_tensor(x, name)
    if isinstance(x, (list, tuple)) and not _holds_numbers(x):
        # empty: no value to type it (torch reads [] as float32, which indices cannot be)
        return torch.zeros(np.shape(x), dtype=empty or torch.get_default_dtype())
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name} must be numbers (a tensor, array or nested list of numbers), "
                        f"got {type(x).__name__}: {exc}") from None


def _holds_numbers(x) -> bool:
    """Whether a nested list holds any value (``[[], []]`` holds none: torch would type its
    tensor float32, which coordinates cannot be)."""
    return any(_holds_numbers(v) if isinstance(v, (list, tuple)) else True for v in x)


#: (format name or None, rank) -> its Format, resolved once (a training loop converts a
#: new batch every step)
_NAMED_FORMATS: dict = {}


def _named_format(format: FormatLike, rank: int):
    """``as_format`` for a dense input's ``format`` argument (default COO), kept per name."""
    if format is not None and not isinstance(format, str):
        return as_format(format, rank)
    fmt = _NAMED_FORMATS.get((format, rank))
    if fmt is None:
        fmt = _NAMED_FORMATS[(format, rank)] = as_format("coo" if format is None else format, rank)
    return fmt


def sparse_tensor(data: Any, size: Optional[Sequence[int]] = None, format: FormatLike = None,
                  dtype: Optional[torch.dtype] = None, requires_grad: bool = False
                  ) -> SparseTensor:
    """A scorch sparse tensor from a dense torch tensor or numpy array, a torch sparse tensor
    of any layout, a scipy.sparse matrix/array, or an ``(indices, values)`` pair.

    ``format`` defaults to COO for dense, numpy and coordinate input, and to the matching
    format (shared arrays, no copy) for torch sparse and scipy input. Duplicate coordinates
    are summed. ``size`` is required only for ``(indices, values)`` input, where it defaults
    to one more than the largest coordinate in each dimension. An ``(indices, values)`` pair
    is copied (sorted into the format's order), so a later write to ``values`` does not
    reach the result, unlike ``torch.sparse_coo_tensor``'s, which aliases it; write through
    ``A.values()`` instead."""
    _check_dtype_arg(dtype)
    # a transform's wrapped tensor or a dual tensor would lose its batch dim / tangent here
    refuse_transformed_source("scorch.sparse_tensor",
                              *(data if isinstance(data, tuple) else (data,)))
    st = None
    source = None   # the tensor the result is differentiable in (values / dense data)
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data, torch.Size) \
            and isinstance(data[1], torch.Tensor) and data[1].dim() > 1 \
            and not isinstance(data[1], SparseTensor):
        # hybrid: each coordinate holds a dense block of values (torch.sparse_coo_tensor's
        # reading); stored as torch's hybrid COO is read, dense trailing levels
        indices = _number_tensor(data[0], "indices", empty=torch.int64)
        if size is not None and len(_check_size(size)) != indices.shape[0] + data[1].dim() - 1:
            raise ValueError(
                f"size {tuple(size)}: values of shape {tuple(data[1].shape)} hold a dense block "
                f"of shape {tuple(data[1].shape[1:])} at each of the {indices.shape[0]}-d "
                f"coordinates, so size needs {indices.shape[0] + data[1].dim() - 1} dimensions")
        data = torch.sparse_coo_tensor(indices, data[1], size, check_invariants=True)
    if (isinstance(data, tuple) and len(data) == 3 and isinstance(data[1], torch.Tensor)
            and isinstance(data[0], torch.Tensor) and data[0].dim() == 2):
        raise TypeError("data: expected an (indices, values) pair, got a tuple of 3; pass the "
                        "size as size=")
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data, torch.Size):
        indices, values = data
        st = _from_coordinates(indices, values.detach() if isinstance(values, torch.Tensor)
                               else values, size, format, dtype)
        source = values
    elif isinstance(data, SparseTensor):
        st = data._storage
        source = data
    elif isinstance(data, torch.Tensor) and data.layout in _TORCH_SPARSE_LAYOUTS:
        st = interop.from_torch(data)
        source = data
    elif interop.is_scipy_sparse(data):
        st = interop.from_scipy(data)
    else:
        data = _number_tensor(data, "data")
    if st is None:
        if data.device.type != "cpu":
            raise ValueError(f"data: scorch sparse tensors live on the CPU, got {data.device}")
        if data.dim() == 0:
            raise ValueError("data: a 0-d tensor cannot be sparse")
        if size is not None and _check_size(size) != tuple(data.shape):
            raise ValueError(f"size {tuple(size)} disagrees with the data's shape {tuple(data.shape)}")
        if dtype is not None:
            data = data.to(dtype)
        _check_dtype(data.dtype, "data")
        fmt = _named_format(format, data.dim())
        st = _convert().from_dense(data.detach(), fmt)
        source = data
    else:
        _check_dtype(dtype or st.dtype, "data")
        if size is not None and _check_size(size) != tuple(st.shape):
            raise ValueError(f"size {tuple(size)} disagrees with the data's shape {tuple(st.shape)}")
        if format is not None:
            fmt = as_format(format, len(st.shape))
            if fmt != st.format:
                st = _convert().convert(st, fmt)
        if dtype is not None and dtype != st.dtype:
            from .tensor_type import with_values
            st = with_values(SparseTensor(st), st.values.to(dtype))._storage
    if not requires_grad and isinstance(source, torch.Tensor) and torch.is_grad_enabled() \
            and source.requires_grad:
        return _differentiable(st, data, source)
    return SparseTensor(st, requires_grad)


def _differentiable(st, data, source: torch.Tensor) -> SparseTensor:
    """The new tensor as a function of ``source`` (like torch.sparse_coo_tensor)."""
    from .gradients import values as grad_values
    if source.layout in _TORCH_SPARSE_LAYOUTS or isinstance(source, SparseTensor):
        # a sparse tensor in the graph: re-formatted and cast differentiably
        t = source if isinstance(source, SparseTensor) else grad_values.from_torch(source, "data")
        t = grad_values.with_dtype(t.to_format(st.format), st.dtype)
        if t is source:   # a new tensor, as for any other input
            t = grad_values.from_values(t._storage, grad_values.values_of(t))
        return t
    if isinstance(data, tuple):
        indices = data[0]
        if not isinstance(indices, torch.Tensor):
            indices = torch.as_tensor(indices)
        return grad_values.from_coordinates(st, indices, source)
    return grad_values.from_dense(st, source)


def _from_coordinates(indices, values, size, format, dtype):
    indices = _number_tensor(indices, "indices", empty=torch.int64)
    values = _number_tensor(values, "values")
    for name, t in (("indices", indices), ("values", values)):
        if t.device.type != "cpu":
            raise ValueError(f"{name}: scorch sparse tensors live on the CPU, got {t.device}")
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise ValueError(f"indices must be integers, got dtype {indices.dtype}")
    if indices.dim() == 1 and size is not None and len(_check_size(size)) == 1:
        indices = indices.reshape(1, -1)
    if indices.dim() != 2:
        raise ValueError(f"indices must be 2-d (ndim x nnz), got shape {tuple(indices.shape)}")
    if values.dim() != 1:
        raise ValueError(f"values must be 1-d, got shape {tuple(values.shape)}")
    if values.shape[0] != indices.shape[1]:
        raise ValueError(f"values has {values.shape[0]} entries but indices has "
                         f"{indices.shape[1]} coordinates")
    if size is None:
        if indices.shape[1] == 0:
            raise ValueError("size is required when indices is empty")
        size = tuple(int(m) + 1 for m in indices.max(dim=1).values)
    size = _check_size(size)
    if len(size) != indices.shape[0]:
        raise ValueError(f"indices has {indices.shape[0]} rows but size {size} has "
                         f"{len(size)} dimensions")
    if dtype is not None:
        values = values.to(dtype)
    _check_dtype(values.dtype, "values")
    fmt = as_format("coo" if format is None else format, len(size))
    return _convert().from_coords(indices, values, size, fmt)


def tensor(data: Any, *args, format: FormatLike = None, **kwargs) -> torch.Tensor:
    """``torch.tensor`` extended with ``format=``: with a format the result is sparse."""
    if format is None:
        return torch.tensor(data, *args, **kwargs)
    return _sparse_from_data(data, args, format, kwargs)


def _traced_tensor(data: Any, *args, format: FormatLike = None, **kwargs) -> torch.Tensor:
    """What Dynamo traces where user code calls ``scorch.tensor``: ``torch.tensor``, kept in
    the graph (scorch's code is opaque to Dynamo: ``dynamo_rules``); a ``format`` keeps the
    eager call (a graph break)."""
    if format is None:
        return torch.tensor(data, *args, **kwargs)
    return _sparse_from_data(data, args, format, kwargs)


trace_instead(tensor, _traced_tensor)
script_as_builtin(tensor, "aten::tensor")   # torch.jit.script: torch's tensor


def _sparse_from_data(data: Any, args: tuple, format: FormatLike, kwargs: dict) -> torch.Tensor:
    """``tensor(data, *args, format=format, **kwargs)`` with a format: a sparse tensor."""
    _check_dtype_arg(kwargs.get("dtype"))
    requires_grad = kwargs.pop("requires_grad", False)
    if interop.is_scipy_sparse(data) or (isinstance(data, torch.Tensor)
                                         and data.layout in _TORCH_SPARSE_LAYOUTS):
        return sparse_tensor(data, format=format, dtype=kwargs.get("dtype"),
                             requires_grad=requires_grad)
    dense = torch.tensor(data, *args, **kwargs)
    return sparse_tensor(dense, format=format, requires_grad=requires_grad)


def from_scipy(m) -> SparseTensor:
    """A sparse tensor sharing the scipy matrix's arrays where the layout is canonical."""
    return SparseTensor(interop.from_scipy(m))
