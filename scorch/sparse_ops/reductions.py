"""Sum-reductions on sparse tensors, each ONE ``scorch.einsum`` call that drops the reduced
indices (``"ijk->ik"``): ``sum``, ``mean`` (the sum over the count of the dense shape) and
``torch.sparse.sum``.

Result layouts: ``sum``/``mean`` give what format inference gives for the einsum (a dense
vector for a matrix reduced along one dimension; a sparse tensor where the result keeps a
sparse dimension of a higher-rank input); a full reduction is a 0-d dense tensor, as torch.
``torch.sparse.sum`` follows torch: a COO sparse tensor over the remaining dimensions, or a 0-d
dense tensor when every dimension is reduced. ``amax``/``amin`` need the compiler's max/min
reduction (not here yet).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple, Union

import torch

from .._dispatch import check_dense_size, register
from ..formats import Format
from ..gradients.values import values_of, with_dtype
from ..level_storage import Level, Storage, index_dtype_for
from ..tensor_cache import TensorKeyedCache, version
from ..tensor_type import SparseTensor, as_scorch, is_sparse_operand
from . import elementwise
from . import shape as _shape
from .dims import checked_dims
from . import einsum as _einsum_entry

__all__ = ["sum", "mean", "sparse_sum"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"

Dims = Union[None, int, Sequence[int]]

_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _reduced_dims(dim: Dims, rank: int, name: str) -> Tuple[int, ...]:
    if dim is None:
        return tuple(range(rank))
    if type(dim) is int and -rank <= dim < rank:   # the common case, without ABC checks
        return (dim % rank,)
    dims = [dim] if isinstance(dim, numbers.Integral) else list(dim)
    if not dims:   # torch: an empty dim list reduces every dimension
        return tuple(range(rank))
    return tuple(sorted(checked_dims(dims, rank, name)))


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """torch sums integers and bools in int64."""
    return dtype if (dtype.is_floating_point or dtype.is_complex) else torch.int64


def _in_dtype(t: SparseTensor, dtype: Optional[torch.dtype]) -> SparseTensor:
    values = t._storage.values
    target = dtype if dtype is not None else _accumulate_dtype(values.dtype)
    return t if values.dtype == target else with_dtype(t, target)   # differentiable


def _as_dtype(result: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    """The sum in the ``dtype`` asked for: einsum sums a lone integer operand in int64 (as
    torch's ``sum`` without a dtype), whatever dtype it was cast to first."""
    return result if dtype is None or result.dtype == dtype else result.to(dtype)


def _einsum_sum(t: SparseTensor, dims: Tuple[int, ...], out_format=None) -> torch.Tensor:
    rank = len(t._storage.shape)
    if rank > len(_LETTERS):
        raise RuntimeError(f"sum(): at most {len(_LETTERS)} dimensions are supported")
    letters = _LETTERS[:rank]
    out = "".join(v for d, v in enumerate(letters) if d not in dims)
    if out_format is not None and out:
        return _einsum_entry.einsum(f"{letters}->{out}", t, out_format=out_format)
    return _einsum_entry.einsum(f"{letters}->{out}", t)


#: a sum down to a sparse vector of at most this many positions, or of at most
#: ``DENSE_PASS_PER_ENTRY`` per stored entry, is accumulated in a dense array (see
#: ``_dense_pass_sum``); wider ones go through the compiler's sparse workspace
DENSE_PASS_LIMIT = 1 << 20
DENSE_PASS_PER_ENTRY = 8


def _dense_pass_sum(t: SparseTensor, dims: Tuple[int, ...]) -> Optional[SparseTensor]:
    """The sparse-vector result of a sum down to one dimension ``d`` stored by the
    operand's last level (CSR summed over rows: ``A.sum(0)``), from one dense
    accumulation pass: the compiler's kernel with a dense output (a scatter-add over the
    stored entries, no marks, touched list or sorted drain) into an array of the vector's
    extent, then compressed to the positions where stored entries fall (the convention of
    the sparse path: an entry there also where the sum is 0; ``_stored_positions``). None
    when this does not apply (another shape of reduction, a blocked or dense last level, an
    extent too large for a dense array)."""
    st = t._storage
    keep = [d for d in range(len(st.shape)) if d not in dims]
    if len(keep) != 1 or st.format.block is not None:
        return None
    last = st.levels[-1]
    kind = last.kind.output_kind()
    n = int(st.shape[keep[0]])
    if (last.dim != keep[0] or last.crd is None or last.kind.full or not kind.has_pos(None)
            or n > max(DENSE_PASS_LIMIT, DENSE_PASS_PER_ENTRY * st.values.numel())):
        return None
    dense = _einsum_sum(t, dims, out_format="d")
    idx = _stored_positions(last.crd, n)
    values = dense if idx.numel() == n else torch.index_select(dense, 0, idx)
    pos = torch.tensor([0, idx.numel()], dtype=idx.dtype)
    return SparseTensor(Storage(Format([kind]), (n,), [Level(kind, 0, n, pos, idx)], values, idx.dtype))


_POSITIONS = TensorKeyedCache()


def _stored_positions(crd: torch.Tensor, n: int) -> torch.Tensor:
    """The distinct coordinates of a level's ``crd`` array (ascending, in the index type an
    extent ``n`` needs): one count pass, kept for the array while its version counter is
    unchanged (a pattern is reused across calls: a weight summed every step while only its
    values change)."""
    idx = _POSITIONS.get(crd, stamp=version(crd))
    if idx is None:
        idx = (torch.bincount(crd, minlength=n) > 0).nonzero().flatten()
        idx = _POSITIONS.put(crd, idx.to(index_dtype_for((n,), idx.numel())), stamp=version(crd))
    return idx


def _keepdim(result: torch.Tensor, dims: Tuple[int, ...]) -> torch.Tensor:
    for d in dims:   # ascending, so each index is already the final position
        result = _shape.unsqueeze(result, d) if isinstance(result, SparseTensor) \
            else result.unsqueeze(d)
    return result


def sum(t: SparseTensor, dim: Dims = None, keepdim: bool = False,
        dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.sum`` over the stored entries."""
    t = as_scorch(t)
    rank = len(t._storage.shape)   # the storage's: each tensor attribute is a torch call
    dims = _reduced_dims(dim, rank, "sum")
    if len(dims) == rank and not keepdim:
        # every dimension: the sum of the stored values (dense-level fill is zeros), one
        # vectorized pass with no walk over the levels; under autograd torch's own sum of
        # the differentiable values (its gradient: ones on the pattern)
        values = values_of(t)
        return values.sum(dtype=dtype or _accumulate_dtype(values.dtype))
    t = _in_dtype(t, dtype)
    single = [d for d in dims if t._storage.shape[d] == 1]
    if single:
        # a sum over a size-1 dim moves no value: a squeeze (a view, or one pass over the
        # coordinates), not a reduction kernel (``A.unsqueeze(1).sum(1)`` of a 2M x 2M matrix
        # ran a workspace kernel, 50x a clone)
        rest = [d for d in dims if d not in single]
        if not keepdim:
            t = t.squeeze(tuple(single))
            rest = [d - len([o for o in single if o < d]) for d in rest]
        if not rest:
            return t.clone()
        dims = tuple(rest)
    result = None
    if not (_grad_enabled() and _any_requires_grad(t)):
        result = _dense_pass_sum(t, dims)
    if result is None:
        result = _einsum_sum(t, dims)
    result = _as_dtype(result, dtype)
    return _keepdim(result, dims) if keepdim else result


def mean(t: SparseTensor, dim: Dims = None, keepdim: bool = False,
         dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.mean``: the sum over the number of positions of the dense shape (unstored
    entries count as zeros)."""
    t = as_scorch(t)
    target = dtype if dtype is not None else t.dtype
    if not (target.is_floating_point or target.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either "
                           f"a floating point or complex dtype. Got: {target}")
    dims = _reduced_dims(dim, t.dim(), "mean")
    count = math.prod(t.shape[d] for d in dims)
    # float16 / bfloat16 summed in float32, as torch's CPU mean (a float16 sum of a few
    # 40000s overflows to inf; the mean itself fits)
    wide = torch.float32 if target in (torch.float16, torch.bfloat16) else target
    total = sum(t, dims, keepdim, wide)
    if isinstance(total, SparseTensor):
        if count == 0:      # 0 / 0 everywhere: dense by nature, NaN as torch's
            check_dense_size("mean", total.shape, total.dtype)
            return (total.to_dense() / count).to(target)
        out = elementwise.div(total, count)
    else:
        out = total / count
    return out if wide == target else out.to(target)


def sparse_sum(t: SparseTensor, dim: Dims = None, dtype: Optional[torch.dtype] = None
               ) -> torch.Tensor:
    """``torch.sparse.sum``: a COO sparse tensor over the dimensions not reduced; a full
    reduction is a 0-d dense tensor."""
    t = _in_dtype(as_scorch(t), dtype)
    dims = _reduced_dims(dim, t.dim(), "sparse.sum")
    if len(dims) == t.dim():
        return _as_dtype(_einsum_sum(t, dims), dtype)
    return _as_dtype(_einsum_sum(t, dims, out_format="coo"), dtype)


# --- registration --------------------------------------------------------------------------

@register(torch.sum, torch.Tensor.sum)
def _sum(t, dim=None, keepdim=False, *, dtype=None, out=None):
    if not is_sparse_operand(t):
        return NotImplemented
    if out is not None:
        raise RuntimeError("sum: out= is not supported with sparse operands")
    if isinstance(dim, torch.dtype):   # t.sum(torch.float64)
        dim, dtype = None, dim
    return sum(t, dim, keepdim, dtype)


@register(torch.mean, torch.Tensor.mean)
def _mean(t, dim=None, keepdim=False, *, dtype=None, out=None):
    if not is_sparse_operand(t):
        return NotImplemented
    if out is not None:
        raise RuntimeError("mean: out= is not supported with sparse operands")
    return mean(t, dim, keepdim, dtype)


@register(torch.sparse.sum, torch._sparse_sum)   # torch.sparse.sum calls torch._sparse_sum
def _sparse_sum(t, dim=None, dtype=None):
    if not is_sparse_operand(t):
        return NotImplemented
    return sparse_sum(t, dim, dtype)
