"""Comparisons, ``where`` and the logical ops on sparse operands, each ONE generated kernel
over the compiler's ``Compare``/``Where`` nodes (``tensor_compiler/index_notation.py``).

Whether a result is sparse is decided by the compiler from the expression (the presence
formula of ``merge_lattice.zero_analysis``), never here: ``A != 0`` and ``A < B`` (both
sparse) keep 0 where nothing is stored, ``A == 0`` does not. A scalar operand enters the
kernel as a 0-d tensor (one kernel for every value), so the compiler cannot see its value;
where ``0 op s`` is false the comparison is written ``where(A, A op s, 0)`` (equal wherever
``A`` is 0, stored or not), which keeps ``A``'s pattern. A scalar 0 in ``where`` or
``masked_fill`` enters as the constant 0, so ``where(A > 0, A, 0)`` stays on ``A``'s pattern.

Kernels compute in the operands' promoted type (a bool operand as uint8, the same bytes) and
give 1 or 0; results are stored as ``torch.bool``. A result that is dense by nature
(``A == 0``, ``where(mask, x, 1)``) is allocated only under the dense limit of ``_dispatch``.

``maximum``/``minimum`` are selections too: ``where(a > b or a != a, a, b)`` (NaN wins, as in
torch), so two sparse operands give the union of their patterns (``max(a, 0)`` where only
one stores) and a dense operand a dense result.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, List, Optional

import torch

from .._dispatch import check_dense_size, register
from ..compiler_access import compiler
from ..gradients.optimizer_step import values_level
from ..gradients.pattern import same_pattern
from ..tensor_type import SparseTensor, as_scorch, is_sparse_operand, with_values
from .elementwise import (_build, _cast, _is_scalar, _scalar_like, _shape_of, as_bool, bool_as_uint8,
                          on_stored_values, result_dtype)
from ..broadcasting import broadcast_shapes

__all__ = ["compare", "where", "masked_fill", "logical", "extremum"]


def _ir():
    return compiler().index_notation


def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    """Kernels have no bool type: bool values run as uint8 (same size, 0/1)."""
    if dt.is_complex:
        raise RuntimeError(f"comparisons of sparse tensors do not support {dt}: compare the "
                           f"real parts (.real) or convert with .float()")
    return torch.uint8 if dt == torch.bool else dt


def _in(x, dt: torch.dtype):
    """``x`` in the kernel dtype: bool arrays reinterpreted as uint8 (no copy)."""
    x = as_scorch(x)
    if isinstance(x, torch.Tensor) and x.dtype == torch.bool and dt == torch.uint8:
        return bool_as_uint8(x)
    return _cast(x, dt)


def _scalar_value(x) -> Optional[float]:
    """The value of a Python number or a dense 0-d tensor; None for anything else."""
    if _is_scalar(x):
        return x
    if _scalar_like(x):
        return x.item()
    return None


def _dense_size_check(name: str, terms, dt: torch.dtype) -> None:
    shape = broadcast_shapes(*[_shape_of(t) for t in terms])
    check_dense_size(name, shape, dt)


def _run(name: str, terms: List[object], expr: Callable, dense_by_nature: bool, dt,
         differentiable: bool = False, key=None):
    """One kernel over ``terms`` (None entries: the constant 0); the expression gets one
    access per tensor term and ``Scalar(0)`` for each None. ``differentiable``: through the
    differentiable ``compute`` (``where``: its backward is the same expression's gradient,
    ``scorch.gradients.expr_grad``), else without autograd (bool results). ``key``: what
    names ``expr`` (with the None entries), so ``elementwise._build`` keeps its plan."""
    ir = _ir()
    tensors = [t for t in terms if t is not None]
    if dense_by_nature:
        _dense_size_check(name, tensors, dt)

    def rhs(*accesses):
        it = iter(accesses)
        return expr(*[ir.Scalar(0) if t is None else next(it) for t in terms])
    if key is not None:
        key = ("comparison", key, tuple(t is None for t in terms))
    if differentiable and torch.is_grad_enabled() and torch._C._any_requires_grad(*tensors):
        return _build(tensors, rhs, key=key)
    with torch.no_grad():
        return _build(tensors, rhs, compiler().compute, key=key)


def compare(op: str, a, b) -> torch.Tensor:
    """``torch.<op>(a, b)`` (lt, le, gt, ge, eq, ne) with a sparse operand, as torch.bool."""
    a, b = as_scorch(a), as_scorch(b)
    if values_level() and (isinstance(a, SparseTensor) and _scalar_value(b) is not None
                           or isinstance(b, SparseTensor) and _scalar_value(a) is not None):
        # in an optimizer step: on the stored values (gradients.optimizer_step)
        t, other = (a, b) if isinstance(a, SparseTensor) else (b, a)
        v = t._storage.values
        s = torch.as_tensor(_scalar_value(other), dtype=v.dtype)
        return with_values(t, getattr(torch, op)(v, s) if t is a else getattr(torch, op)(s, v))
    dt = _compute_dtype(result_dtype(a, b))
    node = _ir().COMPARISONS[op]
    sa, sb = _scalar_value(a), _scalar_value(b)
    x, y = _in(a, dt), _in(b, dt)
    if sb is not None or sa is not None:
        # a tensor against a scalar: sparse iff "0 op s" is false (then equal to
        # where(T, T op s, 0) wherever T is 0, stored or not)
        keeps = not (node.holds(0, sb) if sb is not None else node.holds(sa, 0))
        tensor_first = sb is not None
        if keeps:
            expr = ((lambda t, s: _ir().Where(t, node(t, s), _ir().Scalar(0))) if tensor_first
                    else (lambda s, t: _ir().Where(t, node(s, t), _ir().Scalar(0))))
        else:
            expr = node
        r = _run(op, [x, y], expr, not keeps, dt, key=(op, keeps, tensor_first))
    else:
        dense = not (is_sparse_operand(a) and is_sparse_operand(b)) or node.holds(0, 0)
        r = _run(op, [x, y], node, dense, dt, key=op)
    return as_bool(r)


def _term(x, dt):
    """A value operand of where: the constant 0 (None) for a zero scalar that needs no
    gradient, else a tensor."""
    s = None if isinstance(x, torch.Tensor) and x.requires_grad else _scalar_value(x)
    return None if s is not None and s == 0 else _in(x, dt)


def where(cond, x, y, name: str = "where") -> torch.Tensor:
    """``torch.where(cond, x, y)`` with a sparse operand: sparse where the result is 0 where
    the sparse operands store nothing (``where(A > 0, A, 0)``, ``where(mask, A, B)``)."""
    cond, x, y = as_scorch(cond), as_scorch(x), as_scorch(y)
    if isinstance(cond, torch.Tensor) and cond.dtype != torch.bool:
        raise RuntimeError(f"{name}: expected condition to be a boolean tensor, but got a "
                           f"tensor with dtype {cond.dtype}")
    stepped = _on_values_in_optimizer_step(torch.where, cond, x, y)
    if stepped is not None:
        return stepped
    out_dt = result_dtype(x, y)
    dt = _compute_dtype(out_dt)
    terms = [_in(cond, dt), _term(x, dt), _term(y, dt)]
    zy = terms[2] is None or is_sparse_operand(y)
    dense = not (is_sparse_operand(cond) or is_sparse_operand(x)) or not zy
    r = _run(name, terms, _ir().Where, dense, dt, differentiable=out_dt != torch.bool,
             key="where")
    if out_dt == torch.bool:
        return as_bool(r)
    return r


def _on_values_in_optimizer_step(fn, *operands):
    """In an optimizer step, ``fn`` of sparse operands of one pattern and scalars acts on the
    stored values, for every dtype (Rprop's ``where(sign.eq(etaminus), 0, grad)``, Adamax's
    ``maximum(exp_inf, grad.abs().add_(eps), out=exp_inf)``); None otherwise."""
    sparse = [t for t in operands if isinstance(t, SparseTensor)]
    if not sparse or not all(isinstance(t, SparseTensor) or _scalar_value(t) is not None
                             for t in operands) or not values_level():
        return None
    P = sparse[0]._storage
    if not all(same_pattern(P, t._storage) for t in sparse[1:]):
        return None
    return with_values(sparse[0], fn(*[t._storage.values if isinstance(t, SparseTensor) else t
                                       for t in operands]))


def masked_fill(t, mask, value) -> torch.Tensor:
    """``t.masked_fill(mask, value)``: ``where(mask, value, t)``, in ``t``'s dtype."""
    if not _scalar_like(value):
        raise RuntimeError("masked_fill only supports a 0-dimensional value tensor")
    if not (isinstance(value, torch.Tensor) and value.requires_grad):
        value = torch.tensor(_scalar_value(value), dtype=t.dtype)
    r = where(mask, value, t, "masked_fill")
    return r if r.dtype == t.dtype else r.to(t.dtype)


_LOGICAL = {
    # nonzero tests combined; each keeps 0 where both operands are 0 (or: 0 unless one is)
    "and": lambda ir, x, y: ir.Mul(ir.Ne(x, ir.Scalar(0)), ir.Ne(y, ir.Scalar(0))),
    "or": lambda ir, x, y: ir.Gt(ir.Ne(x, ir.Scalar(0)) + ir.Ne(y, ir.Scalar(0)), ir.Scalar(0)),
    "xor": lambda ir, x, y: ir.Ne(ir.Ne(x, ir.Scalar(0)), ir.Ne(y, ir.Scalar(0))),
}


def logical(op: str, a, b) -> torch.Tensor:
    """``torch.logical_<op>(a, b)`` (and, or, xor) as torch.bool; for bool operands also
    ``&``, ``|``, ``^``. Sparse: the intersection (and) or union (or, xor) of the patterns
    when both are sparse."""
    a, b = as_scorch(a), as_scorch(b)
    dt = _compute_dtype(result_dtype(a, b))
    ir = _ir()
    sparse_a, sparse_b = is_sparse_operand(a), is_sparse_operand(b)
    dense = not (sparse_a and sparse_b) and not (op == "and" and (sparse_a or sparse_b))
    return as_bool(_run(f"logical_{op}", [_in(a, dt), _in(b, dt)],
                         lambda x, y: _LOGICAL[op](ir, x, y), dense, dt, key=("logical", op)))


# --- registration ----------------------------------------------------------------------------

def _involves_sparse(*xs) -> bool:
    return any(is_sparse_operand(x) for x in xs)


def _operand(x) -> bool:
    return isinstance(x, torch.Tensor) or (isinstance(x, numbers.Number) and not isinstance(x, complex))


def _comparison(op: str, *torch_functions):
    @register(*torch_functions)
    def handler(a, b, *, out=None):
        if out is not None or not _involves_sparse(a, b) or not (_operand(a) and _operand(b)):
            return NotImplemented
        return compare(op, a, b)
    return handler


for _op, _fns in {
        "lt": (torch.lt, torch.less, torch.Tensor.lt, torch.Tensor.less, torch.Tensor.__lt__),
        "le": (torch.le, torch.less_equal, torch.Tensor.le, torch.Tensor.less_equal,
               torch.Tensor.__le__),
        "gt": (torch.gt, torch.greater, torch.Tensor.gt, torch.Tensor.greater, torch.Tensor.__gt__),
        "ge": (torch.ge, torch.greater_equal, torch.Tensor.ge, torch.Tensor.greater_equal,
               torch.Tensor.__ge__),
        "eq": (torch.eq, torch.Tensor.eq, torch.Tensor.__eq__),
        "ne": (torch.ne, torch.not_equal, torch.Tensor.ne, torch.Tensor.not_equal,
               torch.Tensor.__ne__)}.items():
    _comparison(_op, *_fns)


def extremum(op: str, a, b) -> torch.Tensor:
    """``torch.maximum`` / ``minimum`` / ``fmax`` / ``fmin`` with a sparse operand: ONE kernel
    of ``where(a > b, a, where(a < b, b, tie))`` (``<`` and ``>`` swapped for the minima). The
    tie branch is taken at ties and where either is NaN: ``a + (b - a)/2`` for maximum/minimum
    (NaN from either side, as torch; the gradient splits a tie evenly), ``where(a != a, b,
    a)`` for fmax/fmin (a NaN loses to a number; the gradient goes to ``a`` at ties, as
    torch's). Sparse with both operands sparse (the union of their patterns), else dense by
    nature; differentiable in both."""
    a, b = as_scorch(a), as_scorch(b)
    stepped = _on_values_in_optimizer_step(getattr(torch, op), a, b)
    if stepped is not None:
        return stepped
    out_dt = result_dtype(a, b)
    dt = _compute_dtype(out_dt)
    ir = _ir()
    wins, loses = (ir.Gt, ir.Lt) if op in ("maximum", "fmax") else (ir.Lt, ir.Gt)
    half = ir.Scalar(0.5)
    dense = not (is_sparse_operand(a) and is_sparse_operand(b))
    if dt.is_floating_point:
        if op in ("maximum", "minimum"):
            def tie(x, y):
                # x + (y - x) / 2: exact at a finite tie, where x / 2 + y / 2 overflowed at
                # +-max (the compiler regroups it as (x + y) / 2) and halved the least
                # subnormal to 0; an infinite tie makes y - x NaN: the halves then. Each
                # side's gradient is a half, as torch's. A NaN on either side: x + y (NaN),
                # each side's gradient whole, as torch's (NaN == NaN is false there)
                gap = y - x
                both = x + y
                return ir.Where(ir.Ne(x, x), both, ir.Where(ir.Ne(y, y), both, ir.Where(
                    ir.Ne(gap, gap), x * half + y * half, x + gap * half)))
        else:
            def tie(x, y):
                return ir.Where(ir.Ne(x, x), y, x)

        def expr(x, y):
            return ir.Where(wins(x, y), x, ir.Where(loses(x, y), y, tie(x, y)))
    else:       # no NaN, no gradient: the winner or, at a tie, either
        def expr(x, y):
            return ir.Where(wins(x, y), x, y)
    r = _run(op, [_in(a, dt), _in(b, dt)], expr, dense, dt, differentiable=dt.is_floating_point,
             key=("extreme", op, dt.is_floating_point))
    return as_bool(r) if out_dt == torch.bool else r


for _name, _fns in (("maximum", (torch.maximum, torch.Tensor.maximum)),
                    ("minimum", (torch.minimum, torch.Tensor.minimum)),
                    ("fmax", (torch.fmax, torch.Tensor.fmax)), ("fmin", (torch.fmin, torch.Tensor.fmin))):
    def _make(name, fns):
        @register(*fns)
        def _extremum(a, b, *, out=None):
            if out is not None or not _involves_sparse(a, b) or _is_scalar(a) or _is_scalar(b):
                return NotImplemented
            return extremum(name, a, b)
    _make(_name, _fns)


@register(torch.where)
def _where(*args, out=None, **kwargs):
    if "condition" in kwargs:
        args = (kwargs.pop("condition"),) + args
    if not args:
        return NotImplemented                          # torch's error
    cond, args = args[0], args[1:]
    args = args + tuple(kwargs.pop(k) for k in ("input", "other") if k in kwargs)
    if not args and not kwargs and out is None and isinstance(cond, SparseTensor):
        return torch.nonzero(cond, as_tuple=True)     # where(x): the nonzero coordinates
    if len(args) != 2 or out is not None or kwargs or not _involves_sparse(cond, *args):
        return NotImplemented
    return where(cond, args[0], args[1])


@register(torch.Tensor.where)
def _tensor_where(self, condition, other):
    """``x.where(cond, y)`` is ``torch.where(cond, x, y)``."""
    if not _involves_sparse(self, condition, other):
        return NotImplemented
    return where(condition, self, other)


@register(torch.masked_fill, torch.Tensor.masked_fill)
def _masked_fill(t, mask, value):
    if not _involves_sparse(t, mask) or not _scalar_like(value):
        return NotImplemented
    return masked_fill(t, mask, value)


def _logical(op: str, *torch_functions, bool_only: bool = False):
    @register(*torch_functions)
    def handler(a, b, *, out=None):
        if out is not None or not _involves_sparse(a, b) or not (_operand(a) and _operand(b)):
            return NotImplemented
        if bool_only and not all(isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool)
                                 for x in (a, b)):
            return NotImplemented   # integer bitwise ops: the fallback
        return logical(op, a, b)
    return handler


for _op in ("and", "or", "xor"):
    _logical(_op, getattr(torch, f"logical_{_op}"), getattr(torch.Tensor, f"logical_{_op}"))


def _integral(x) -> bool:
    """An integer (or bool) number or tensor: what torch's bitwise ops take."""
    if isinstance(x, torch.Tensor):
        return not (x.dtype.is_floating_point or x.dtype.is_complex)
    return isinstance(x, numbers.Integral)


def bitwise_on_pattern(fn, x, other):
    """``fn(x, other)`` for the integer bitwise ops with ``fn(0, y) == 0`` for every ``y``
    (``&``, ``<<``, ``>>``): torch's op on the stored values of the sparse ``x``, so the
    pattern is kept and the cost follows the stored entries. ``other``: a number or a dense
    tensor (``elementwise.on_stored_values``: broadcast, read at the stored coordinates), or
    a sparse tensor of ``x``'s shape, read there (0 where it stores nothing); anything else
    (a broadcast sparse one): NotImplemented, the fallback."""
    x, other = as_scorch(x), as_scorch(other)
    if not isinstance(other, SparseTensor):
        return on_stored_values(fn, x, other)
    if tuple(other.shape) != tuple(x.shape):
        return NotImplemented
    if same_pattern(x._storage, other._storage):
        at = other._storage.values
    else:
        from .positions import values_at_coordinates
        from .._runtime import convert
        at = values_at_coordinates(other, convert.coords(x._storage))
    return with_values(x, fn(x._storage.values, at))


def _bitwise(fn, *torch_functions, bool_op: Optional[str] = None, commutes: bool = False):
    """Register ``fn`` (an integer bitwise op keeping 0 at 0) for integer operands, the sparse
    one first (``commutes``: either; ``6 & S`` too); on bool operands it is the logical op
    ``bool_op`` (its kernel, a bool result)."""
    @register(*torch_functions)
    def handler(a, b, *, out=None):
        if out is not None or not _involves_sparse(a, b) or not (_operand(a) and _operand(b)):
            return NotImplemented
        if bool_op is not None and all(isinstance(x, bool) or (isinstance(x, torch.Tensor)
                                                                and x.dtype == torch.bool)
                                       for x in (a, b)):
            return logical(bool_op, a, b)
        if not (_integral(a) and _integral(b)):
            return NotImplemented                    # torch's error, from the fallback
        if not is_sparse_operand(a):
            if not commutes:
                return NotImplemented                # ``3 << S``: 3 where S is 0, dense by nature
            a, b = b, a
        return bitwise_on_pattern(fn, a, b)
    return handler


_bitwise(torch.bitwise_and, torch.bitwise_and, torch.Tensor.bitwise_and, torch.Tensor.__and__,
         torch.Tensor.__rand__, bool_op="and", commutes=True)
_bitwise(torch.bitwise_left_shift, torch.bitwise_left_shift, torch.Tensor.bitwise_left_shift,
         torch.Tensor.__lshift__)
_bitwise(torch.bitwise_right_shift, torch.bitwise_right_shift, torch.Tensor.bitwise_right_shift,
         torch.Tensor.__rshift__)
_logical("or", torch.bitwise_or, torch.Tensor.bitwise_or, torch.Tensor.__or__, bool_only=True)
_logical("xor", torch.bitwise_xor, torch.Tensor.bitwise_xor, torch.Tensor.__xor__, bool_only=True)


@register(torch.logical_not, torch.Tensor.logical_not)
def _logical_not(a, *, out=None):
    """``not A`` is true where nothing is stored: dense by nature, ``A == 0``."""
    if out is not None or not is_sparse_operand(a):
        return NotImplemented
    return compare("eq", a, 0)


def _test_values(x) -> torch.Tensor:
    """The distinct values a test set holds: a sparse one's stored values, and 0 when it has
    an unstored position."""
    t = as_scorch(x)
    if not isinstance(t, SparseTensor):
        return x.reshape(-1)
    vals = t._storage.values
    if t.nnz < math.prod(t.shape):
        vals = torch.cat([vals, vals.new_zeros(1)])
    return vals


@register(torch.isin)
def _isin(elements, test_elements, *, assume_unique=False, invert=False, out=None):
    """A sparse ``elements``: ``isin`` of the stored values, the pattern kept, when 0 is not in
    the test set (``invert``: when it is); otherwise dense by nature. A sparse test set: its
    stored values, plus 0 if it has an unstored position."""
    if out is not None or not _involves_sparse(elements, test_elements):
        return NotImplemented
    if not isinstance(elements, torch.Tensor) or not isinstance(test_elements, torch.Tensor):
        return NotImplemented
    test = _test_values(test_elements)
    e = as_scorch(elements)
    if not isinstance(e, SparseTensor):
        return torch.isin(elements, test, assume_unique=assume_unique, invert=invert)
    zero_hit = bool(torch.isin(torch.zeros(1, dtype=e.dtype), test, invert=invert).item())
    if zero_hit:                           # every unstored position is True: dense by nature
        check_dense_size("isin", e.shape, torch.bool)
        return torch.isin(e.to_dense(), test, invert=invert)
    from ..gradients.values import from_values
    return from_values(e._storage, torch.isin(e._storage.values, test, invert=invert))
