"""Products torch names that are einsums: ``outer``/``ger``, ``dot``/``inner``/``vdot``,
``tensordot``, ``kron``, ``trace`` and ``diagonal``. Each is ONE ``scorch.einsum`` (so one
generated kernel, differentiable, cost following the stored entries); ``kron`` adds the
reshape that interleaves its index pairs. Without these, torch decomposes them into aten
ops on our tensors (``outer`` into a broadcast ``mul``), which either densifies or refuses."""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple, Union

import torch

from .._dispatch import register
from ..tensor_type import as_scorch
from .comparison import _involves_sparse
from .dims import checked_dim
from .einsum import autocast_like, einsum

__all__ = ["outer", "dot", "inner", "tensordot", "kron", "trace", "diagonal"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _rank(name: str, what: str, x, rank: int) -> None:
    if x.dim() != rank:
        raise RuntimeError(f"{name}: {what} must be {rank}-D, got a {x.dim()}-D tensor of shape "
                           f"{tuple(x.shape)}")


def outer(a, b) -> torch.Tensor:
    a, b = as_scorch(a), as_scorch(b)
    _rank("outer", "the first operand", a, 1)
    _rank("outer", "the second operand", b, 1)
    return einsum("i,j->ij", a, b)


def dot(a, b) -> torch.Tensor:
    a, b = as_scorch(a), as_scorch(b)
    _rank("dot", "the first operand", a, 1)
    _rank("dot", "the second operand", b, 1)
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"dot: inconsistent tensor size, expected the operands to have the "
                           f"same number of elements, but got {a.shape[0]} and {b.shape[0]}")
    return einsum("i,i->", a, b)


def _tensordot_dims(a, b, dims) -> Tuple[Sequence[int], Sequence[int]]:
    if isinstance(dims, numbers.Integral):
        if not 0 <= dims <= min(a.dim(), b.dim()):
            raise RuntimeError(f"tensordot: dims = {dims} out of range for operands of rank "
                               f"{a.dim()} and {b.dim()}")
        return list(range(a.dim() - dims, a.dim())), list(range(dims))
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    da, db = dims
    da = [da] if isinstance(da, numbers.Integral) else list(da)
    db = [db] if isinstance(db, numbers.Integral) else list(db)
    if len(da) != len(db):
        raise RuntimeError(f"tensordot: both dimension lists must have the same length, got {da} and {db}")
    return [d % a.dim() for d in da], [d % b.dim() for d in db]


def tensordot(a, b, dims: Union[int, Sequence] = 2) -> torch.Tensor:
    a, b = as_scorch(a), as_scorch(b)
    da, db = _tensordot_dims(a, b, dims)
    sa = list(_LETTERS[:a.dim()])
    sb = list(_LETTERS[a.dim():a.dim() + b.dim()])
    for x, y in zip(da, db):            # a size-1 contracted dim broadcasts, as torch's
        if a.shape[x] == 1 and b.shape[y] != 1:
            a = a.expand(*[b.shape[y] if d == x else n for d, n in enumerate(a.shape)])
        elif b.shape[y] == 1 and a.shape[x] != 1:
            b = b.expand(*[a.shape[x] if d == y else n for d, n in enumerate(b.shape)])
    for x, y in zip(da, db):
        if a.shape[x] != b.shape[y]:
            raise RuntimeError(f"tensordot: contracted dimensions need the same size, got "
                               f"{a.shape[x]} (dim {x} of the first) and {b.shape[y]} (dim {y} "
                               f"of the second)")
        sb[y] = sa[x]
    out = [c for d, c in enumerate(sa) if d not in da] + [c for d, c in enumerate(sb) if d not in db]
    return einsum(f"{''.join(sa)},{''.join(sb)}->{''.join(out)}", a, b)


def kron(a, b) -> torch.Tensor:
    """``out[i*p + k, j*q + l] = a[i, j] * b[k, l]`` (any rank; the lower-rank operand gets
    leading size-1 dimensions, as torch): the einsum ``ij,kl->ikjl`` and a reshape that
    merges each pair."""
    a, b = as_scorch(a), as_scorch(b)
    rank = max(a.dim(), b.dim())
    if a.dim() < rank:
        a = a.reshape((1,) * (rank - a.dim()) + tuple(a.shape))
    if b.dim() < rank:
        b = b.reshape((1,) * (rank - b.dim()) + tuple(b.shape))
    sa, sb = _LETTERS[:rank], _LETTERS[rank:2 * rank]
    pairs = "".join(x + y for x, y in zip(sa, sb))
    r = einsum(f"{sa},{sb}->{pairs}", a, b)
    return r.reshape(tuple(x * y for x, y in zip(a.shape, b.shape)))


def _square(a):
    """The leading square block of a matrix, which holds its main diagonal."""
    n = min(a.shape)
    return a if a.shape[0] == a.shape[1] else a[:n, :n]


def trace(a) -> torch.Tensor:
    a = as_scorch(a)
    _rank("trace", "the operand", a, 2)
    return einsum("ii->", _square(a))


def diagonal(a, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Optional[torch.Tensor]:
    """The main diagonal of a matrix (``einsum("ii->i")``), a sparse vector in every format
    (inference made CSR's dense, so ``diag(diag(A))`` built a dense N x N matrix); other
    offsets or dimensions are left to the fallback (None)."""
    a = as_scorch(a)
    if a.dim() != 2 or offset != 0 or a.dtype == torch.bool:
        return None                   # (bool: no kernels; the entries' path takes it)
    if {checked_dim(dim1, 2, "diagonal"), checked_dim(dim2, 2, "diagonal")} != {0, 1}:
        return None
    return einsum("ii->i", _square(a), out_format="c")


# --- registration -------------------------------------------------------------------------

@register(torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger)
def _outer(a, b, *, out=None):
    if out is not None or not _involves_sparse(a, b):
        return NotImplemented
    return outer(a, b)


def inner(a, b) -> torch.Tensor:
    """``torch.inner``: the sum over the last dims, every other dim of ``a`` then of ``b``
    kept (``a @ b.T`` for matrices): one einsum."""
    a, b = as_scorch(a), as_scorch(b)
    if a.dim() == 0 or b.dim() == 0:
        return a * b
    if a.shape[-1] != b.shape[-1]:
        raise RuntimeError(f"inner() the last dimension must match on both input tensors but got "
                           f"shapes {list(a.shape)} and {list(b.shape)}")
    ra, rb = a.dim() - 1, b.dim() - 1
    if ra + rb + 1 > len(_LETTERS):
        raise RuntimeError(f"inner: {ra + rb + 1} indices exceed the einsum's {len(_LETTERS)} letters")
    left, right, k = _LETTERS[:ra], _LETTERS[ra:ra + rb], _LETTERS[ra + rb]
    return einsum(f"{left}{k},{right}{k}->{left}{right}", a, b)


@register(torch.dot, torch.Tensor.dot, torch.vdot, torch.Tensor.vdot)
def _dot(a, b, *, out=None):
    if out is not None or not _involves_sparse(a, b):
        return NotImplemented
    a, b = as_scorch(a), as_scorch(b)
    if a.dim() != 1 or b.dim() != 1 or a.dtype.is_complex or b.dtype.is_complex:
        return NotImplemented          # vdot's conjugate: the fallback
    return dot(a, b)


@register(torch.inner, torch.Tensor.inner)
def _inner(a, b, *, out=None):
    if out is not None or not _involves_sparse(a, b) or not isinstance(a, torch.Tensor) \
            or not isinstance(b, torch.Tensor) or a.dtype.is_complex or b.dtype.is_complex:
        return NotImplemented
    return autocast_like(torch.inner, inner, (a, b))   # dense torch's dtype under CPU autocast


@register(torch.tensordot)
def _tensordot(a, b, dims=2, out=None):
    if out is not None or not _involves_sparse(a, b):
        return NotImplemented
    return autocast_like(torch.tensordot, tensordot, (a, b, dims))


@register(torch.kron)
def _kron(a, b, *, out=None):
    if out is not None or not _involves_sparse(a, b):
        return NotImplemented
    return kron(a, b)


@register(torch.trace, torch.Tensor.trace)
def _trace(a):
    if not _involves_sparse(a):
        return NotImplemented
    if a.dtype == torch.bool:   # torch's own refusal (its trace has no bool kernel)
        raise NotImplementedError('"trace" not implemented for \'Bool\'')
    return trace(a)


@register(torch.diagonal, torch.Tensor.diagonal)
def _diagonal(a, offset=0, dim1=0, dim2=1):
    if not _involves_sparse(a):
        return NotImplemented
    r = diagonal(a, offset, dim1, dim2)
    if r is None:                     # another offset or rank: the entries on that diagonal
        from .layout_ops import diagonal_entries
        return diagonal_entries(as_scorch(a), offset, dim1, dim2)
    return r


@register(torch.diag, torch.Tensor.diag)
def _diag(a, diagonal=0, *, out=None):
    """torch.diag: a vector's diagonal matrix, or a matrix's ``diagonal``-th diagonal."""
    if out is not None or not _involves_sparse(a):
        return NotImplemented
    a = as_scorch(a)
    if a.dim() == 1:
        from .layout_ops import diag_embed
        return diag_embed(a, diagonal)
    return _diagonal(a, diagonal) if a.dim() == 2 else NotImplemented
