"""Torch functions that are another handled op under another name, or a short composition of
handled ops: ``movedim``/``moveaxis`` (``permute``), ``conj``/``conj_physical`` (the
stored values), ``adjoint``/``.mH``/``.H`` (``transpose``, ``conj``), ``vstack``/``row_stack``/``hstack``/``dstack``/``column_stack`` (``cat``),
``ravel`` (``flatten``), ``tensor_split`` (``split``, ``narrow``), ``linalg.multi_dot`` and
``chain_matmul`` (``matmul`` in the cheapest order).

Registered here so that they stay sparse and differentiable: torch's own decompositions of
these functions reach ATen, where a sparse operand that requires grad has no backward."""
from __future__ import annotations

import numbers
from typing import List, Sequence

import torch

from .._dispatch import register
from ..gradients.values import from_values, values_of
from ..tensor_type import as_scorch, is_sparse_operand
from . import layout_ops
from .dims import checked_dims
from .nonlinear import _sparse

__all__: List[str] = []


def _as_dims(dims, rank: int, name: str) -> List[int]:
    return checked_dims(dims, rank, argument=name)


@register(torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def _movedim(x, source, destination):
    """``permute`` with ``source`` dims moved to ``destination``, the others in order."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    n = t.dim()
    src, dst = _as_dims(source, n, "source"), _as_dims(destination, n, "destination")
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(source)} "
                           f"dims) should contain the same number of dims as destination "
                           f"({list(destination)} dims)")
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise RuntimeError("movedim: repeated dim in `source` or `destination`")
    order = [-1] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(k for k in range(n) if k not in src)
    order = [o if o >= 0 else next(rest) for o in order]
    return t.permute(order)


@register(torch.adjoint, torch.Tensor.adjoint, torch.Tensor.mH.__get__)
def _adjoint(x):
    """The conjugate transpose of the last two dims (a complex tensor's values conjugated)."""
    t = _sparse(x)
    if t is None or t.dim() < 2:
        return NotImplemented              # torch's error
    return _conjugated(t.transpose(-2, -1))


def _conjugated(t):
    return _conj(t) if t.is_complex() else t


@register(torch.conj, torch.Tensor.conj, torch.conj_physical, torch.Tensor.conj_physical)
def _conj(x):
    """The conjugate on the stored values (a real tensor is its own, as torch returns it);
    materialized, where torch's is a lazy view."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if not t.is_complex():
        return t
    return from_values(t._storage, values_of(t).conj().resolve_conj())


@register(torch.Tensor.H.__get__)
def _H(x):
    t = _sparse(x)
    if t is None or t.dim() not in (0, 2):
        return NotImplemented              # torch's error
    return _conjugated(t if t.dim() == 0 else t.transpose(0, 1))


def _with_sparse(tensors) -> bool:
    return isinstance(tensors, (list, tuple)) and any(is_sparse_operand(x) for x in tensors)


def _reshaped(x, rank: int, where: str):
    """``x`` with size-1 dims added to reach ``rank`` (``atleast_2d``/``_3d``: ``where`` =
    "front" puts them first; "around": a vector ``(n,)`` becomes ``(1, n, 1)``; "column":
    ``(n,)`` becomes ``(n, 1)``)."""
    x = as_scorch(x)
    if x.dim() >= rank:
        return x
    if x.dim() == 0:
        return x.reshape((1,) * rank)
    if where == "column":
        return x.unsqueeze(1)
    if where == "around":                  # atleast_3d: (n,) -> (1, n, 1), (m, n) -> (m, n, 1)
        return x.unsqueeze(0).unsqueeze(2) if x.dim() == 1 else x.unsqueeze(2)
    while x.dim() < rank:
        x = x.unsqueeze(0)
    return x


def _stack_along(rank: int, where: str, dim_of):
    def handler(tensors, *, out=None):
        if not _with_sparse(tensors) or out is not None:
            return NotImplemented
        pieces = [_reshaped(x, rank, where) for x in tensors]
        return torch.cat(pieces, dim_of(pieces))
    return handler


register(torch.vstack, torch.row_stack)(_stack_along(2, "front", lambda p: 0))
register(torch.hstack)(_stack_along(1, "front", lambda p: 0 if p[0].dim() == 1 else 1))
register(torch.dstack)(_stack_along(3, "around", lambda p: 2))
register(torch.column_stack)(_stack_along(2, "column", lambda p: 1))


@register(torch.ravel, torch.Tensor.ravel)
def _ravel(x):
    t = _sparse(x)
    return NotImplemented if t is None else t.reshape(-1)


@register(torch.tensor_split, torch.Tensor.tensor_split)
def _tensor_split(x, indices_or_sections, dim=0):
    """Equal sections (the first ``n % k`` one longer) in one pass (``split``); split points
    as Python slices ``[:i0], [i0:i1], ..., [ik:]``, one ``narrow`` each."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    d = layout_ops._dim(dim, t.dim())
    n = t.shape[d]
    cut = indices_or_sections
    if isinstance(cut, torch.Tensor):
        if cut.dtype != torch.int64 or cut.dim() > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to have a "
                               "long dtype and to be a 0-D or 1-D tensor")
        cut = cut.item() if cut.dim() == 0 else cut.tolist()
    if isinstance(cut, numbers.Integral):
        if cut <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {cut}")
        k = int(cut)
        return layout_ops.split(t, [n // k + (1 if j < n % k else 0) for j in range(k)], d)
    bounds = [0] + [max(0, min(n, i + n if i < 0 else i)) for i in cut] + [n]
    return tuple(t.narrow(d, a, max(0, b - a)) for a, b in zip(bounds, bounds[1:]))


def _chain_order(shapes: Sequence[tuple]) -> list:
    """The cheapest parenthesisation of a chain of matrices (the textbook dynamic program on
    dense sizes, as torch's ``multi_dot``): a nested pair structure of operand numbers."""
    dims = [shapes[0][0]] + [s[1] for s in shapes]
    k = len(shapes)
    cost = [[0] * k for _ in range(k)]
    split = [[0] * k for _ in range(k)]
    for length in range(1, k):
        for i in range(k - length):
            j = i + length
            cost[i][j] = float("inf")
            for m in range(i, j):
                c = cost[i][m] + cost[m + 1][j] + dims[i] * dims[m + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, m

    def tree(i, j):
        return i if i == j else (tree(i, split[i][j]), tree(split[i][j] + 1, j))
    return tree(0, k - 1)


def _multiply(tree, operands):
    if isinstance(tree, int):
        return operands[tree]
    return torch.matmul(_multiply(tree[0], operands), _multiply(tree[1], operands))


@register(torch.linalg.multi_dot)
def _multi_dot(tensors, *, out=None):
    """The chain product through ``matmul`` (a first 1-D operand is a row, a last one a
    column, and their dims are dropped from the result, as torch's)."""
    if not _with_sparse(tensors) or out is not None or len(tensors) < 2:
        return NotImplemented
    ops = [as_scorch(x) for x in tensors]
    if any(x.dim() not in (1, 2) for x in ops) or any(x.dim() != 2 for x in ops[1:-1]):
        return NotImplemented              # torch's error
    shapes = [(1, x.shape[0]) if x.dim() == 1 and k == 0 else
              (x.shape[0], 1) if x.dim() == 1 else tuple(x.shape) for k, x in enumerate(ops)]
    for k in range(len(shapes) - 1):
        if shapes[k][1] != shapes[k + 1][0]:
            raise RuntimeError(f"multi_dot(): tensors {k} and {k + 1} with shapes "
                               f"{tuple(ops[k].shape)} and {tuple(ops[k + 1].shape)} cannot be "
                               f"multiplied")
    if len(ops) == 2:
        return torch.matmul(ops[0], ops[1])
    return _multiply(_chain_order(shapes), ops)


@register(torch.chain_matmul)
def _chain_matmul(*matrices, out=None):
    if not _with_sparse(matrices) or out is not None:
        return NotImplemented
    if len(matrices) == 1:
        return matrices[0]
    return _multi_dot(list(matrices))

