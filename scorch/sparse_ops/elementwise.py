"""Elementwise arithmetic on sparse operands with the compiler's existing nodes: ``add``/``sub``
(with ``alpha``), ``mul``, division by a scalar (a product with its reciprocal), ``neg``, the
operators ``+ - * /`` and the in-place forms ``add_``/``sub_``/``mul_``/``div_``.

Each call is ONE generated kernel: ``tensor_compiler.compute(Assignment(out, expr), ...)``.
Broadcasting follows torch: operands are aligned from the right; an operand with a size-1
dimension that must stretch is first squeezed there (a sparse operand's coordinates move,
its values do not; a dense operand is reshaped, a view) and is simply not indexed by that
variable, so the kernel never stretches anything. Scalars (Python numbers, 0-d tensors) enter
as 0-d operands, so one kernel serves every value. The result format comes from format inference: a product with a sparse
operand is sparse, a sum is sparse only when both terms are.

Division by a dense tensor is the compiler's ``Div`` on the numerator's pattern; division by a
sparse tensor (``A / B``, ``2 / A``) is dense by nature (x / 0 where the divisor stores
nothing) and runs as one kernel computed everywhere; rounding modes are the dense fallback's.
"""
from __future__ import annotations

import math
import numbers
from typing import List, Tuple

import torch

from .._dispatch import check_dense_size, register
from ..gradients.optimizer_step import values_level
from ..gradients.optim_ops import STALE_STATE_HINT, check_scalar_step
from ..gradients.pattern import same_pattern
from ..gradients.values import from_values, values_of, with_dtype
from .. import tensor_type as _tensor_type
from ..level_storage import Storage
from ..tensor_type import (SparseTensor, as_scorch, is_sparse_operand, make_pending, numpy_as_tensor,
                           refuse_write_to_copy, with_values)
from . import shape as _shape
from .fusion import Pending, consumer_follows, fused, pending_of, register_dispatch_frames
from ..broadcasting import broadcast_shapes

__all__ = ["add", "sub", "mul", "div", "divide_by_sparse", "neg", "addcmul", "addcdiv", "bool_as_uint8", "as_bool"]

_LETTERS = "ijklmnopqrstuvwxyzabcdefgh"

_compiler_module = None
_compute_fn = None


def _compiler():
    """The compiler package, imported on first use (importing it costs ~0.5 s)."""
    global _compiler_module
    if _compiler_module is None:
        from .einsum import _compiler as load
        _compiler_module = load()
    return _compiler_module


def _compute():
    """``compute(assignment, *operands, out_format=)``: the differentiable one of
    ``scorch.gradients`` where that package exists, else the compiler's own."""
    global _compute_fn
    if _compute_fn is None:
        try:
            from ..gradients import compute as differentiable
        except ImportError:
            differentiable = None
        _compute_fn = differentiable or _compiler().compute
    return _compute_fn


# the expression of each op over its accesses (x, y: operands; s: a 0-d scalar operand)
_EXPRESSIONS = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "add_alpha": lambda x, y, s: x + s * y,
    "sub_alpha": lambda x, y, s: x - s * y,
    "mul": lambda x, y: x * y,
    "neg": lambda x: -x,
    "div": lambda x, y: x / y,   # the compiler's Div: computed on the numerator's pattern
    # fused forms: one kernel for the whole expression (s: the 0-d ``value``)
    "addcmul": lambda c, x, y, s: c + s * x * y,
    "addcdiv": lambda c, x, y, s: c + s * x / y,
}


def _is_scalar(x) -> bool:
    return isinstance(x, (numbers.Number, bool)) and not isinstance(x, torch.Tensor)


def _stand_in(x):
    """What torch.result_type needs to know of an operand (no data)."""
    if _is_scalar(x):
        return x
    return torch.empty((1,) if x.dim() else (), dtype=x.dtype)


def _promotion_kind(x):
    """What torch's type promotion reads of an operand: a number's Python type, a tensor's
    dtype and whether it is 0-d (a 0-d tensor ranks below a dimensioned one)."""
    if _is_scalar(x):
        return type(x)
    return x.dtype, x.dim() > 0


_RESULT_TYPES: dict = {}   # (kind, kind, default dtype) -> torch.result_type of such operands


def result_dtype(a, b, true_division: bool = False) -> torch.dtype:
    # the default dtype is part of the key: an integer tensor with a Python float promotes
    # to it (``torch.set_default_dtype(torch.float64)`` makes ``int_S + 0.5`` float64)
    key = (_promotion_kind(a), _promotion_kind(b), torch.get_default_dtype())
    dt = _RESULT_TYPES.get(key)
    if dt is None:
        dt = _RESULT_TYPES[key] = torch.result_type(_stand_in(a), _stand_in(b))
    if true_division and not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    return dt


def _cast(x, dtype: torch.dtype):
    """The operand in the result dtype: scalars become 0-d tensors (kernel arguments, not
    constants baked into the kernel), sparse values are cast, dense tensors converted."""
    if _is_scalar(x):
        if isinstance(x, int) and not (dtype.is_floating_point or dtype.is_complex):
            # an int out of the dtype's range wraps around, as dense torch casts a number
            # operand (``int8_t + 1000`` adds -24); ``torch.tensor(1000, dtype=int8)`` raises
            return torch.tensor(x, dtype=torch.int64).to(dtype)
        return torch.tensor(x, dtype=dtype)
    if isinstance(x, SparseTensor):
        return with_dtype(x, dtype)   # differentiable
    return x if x.dtype == dtype else x.to(dtype)


def _shape_of(x) -> Tuple[int, ...]:
    if _is_scalar(x):
        return ()
    return x._storage.shape if isinstance(x, SparseTensor) else tuple(x.shape)


def _wrap(result):
    return SparseTensor(result) if isinstance(result, Storage) else result


def _build(terms, op, compute=None, key=None) -> torch.Tensor:
    """Run the expression ``_EXPRESSIONS[op]`` (or ``op`` itself: a function of the accesses)
    over ``terms`` (operands already in the result dtype) with torch's broadcasting; returns
    the kernel's result. ``compute``: the compiler entry (default: the differentiable one).
    ``key``: what names a callable ``op``'s expression, so that its plan is remembered (a
    string ``op`` names itself)."""
    if key is None and isinstance(op, str):
        key = op
    if key is not None:
        # one plan (and Assignment object) per op and kind and sizes of the terms
        # (``tensor_compiler.kept_assignment``: ``A * D`` of a small matrix 55 -> 15 us)
        memo = ("elementwise", key, *[(isinstance(t, SparseTensor), _shape_of(t)) for t in terms])
        hit = _compiler().kept_assignment(memo, lambda: _plan_build(terms, op))
    else:
        hit = _plan_build(terms, op)
    shape, stretches, assignment, out_format = hit
    operands = [x if not stretch else
                (_shape.squeeze_dims(x, stretch) if isinstance(x, SparseTensor)
                 else x.reshape([n for d, n in enumerate(x.shape) if d not in stretch]))
                for x, stretch in zip(terms, stretches)]
    result = _wrap((compute or _compute())(assignment, *operands, out_format=out_format))
    if tuple(result.shape) != shape:
        raise RuntimeError(f"elementwise: kernel gave shape {tuple(result.shape)}, expected {shape}")
    return result


def _plan_build(terms, op):
    """``_build``'s plan for these terms: (shape, stretched dims per term, assignment,
    output format)."""
    shape = tuple(broadcast_shapes(*[_shape_of(t) for t in terms]))
    rank = len(shape)
    if rank > len(_LETTERS):
        raise RuntimeError(f"elementwise ops support at most {len(_LETTERS)} dimensions")
    out_vars = _LETTERS[:rank]
    stretches: List[list] = []
    accesses: list = []
    ir = _compiler().index_notation
    partial_sparse = False   # a sparse operand that does not index every output dimension
    for n, x in enumerate(terms):
        sizes = _shape_of(x)
        r = len(sizes)
        vars_ = list(out_vars[rank - r:])
        # a size-1 dimension that broadcasts is dropped from the operand and not indexed:
        # the kernel then never stretches anything (a stretched dense operand would be
        # materialized at the full size by the compiler's relayout)
        stretch = [d for d in range(r) if sizes[d] == 1 and shape[rank - r + d] != 1]
        if stretch:
            vars_ = [v for d, v in enumerate(vars_) if d not in stretch]
        if isinstance(x, SparseTensor):
            partial_sparse |= len(vars_) < rank
        stretches.append(stretch)
        accesses.append(ir.Access(n, vars_))
    rhs = (_EXPRESSIONS[op] if isinstance(op, str) else op)(*accesses)
    missing = [v for v in out_vars if v not in rhs.vars()]
    if missing:
        raise RuntimeError(f"elementwise: output dimension {missing} is indexed by no operand")
    out_format = None
    if op == "mul" and partial_sparse:
        # a product with a sparse operand is sparse; where the sparse operand is broadcast,
        # format inference alone would make the stretched dimensions dense
        out_format = "coo"
    return shape, stretches, ir.Assignment(out_vars, rhs), out_format




def _same_shape(a, b, op: str):
    """Two scorch sparse tensors of one shape and dtype (the common case): the kernel straight
    away, with the Assignment ``_build`` would make, without its broadcasting and type
    promotion work (~50 us a call: more than scipy.sparse takes on a small matrix); else None."""
    if type(a) is not SparseTensor or type(b) is not SparseTensor:
        return None
    sa, sb = a._storage, b._storage
    rank = len(sa.shape)
    if sa.shape != sb.shape or sa.values.dtype != sb.values.dtype or not 0 < rank <= len(_LETTERS) \
            or sa.values.dtype == torch.bool:   # bool + and * are or / and (_bool_op)
        return None
    def build():
        ir = _compiler().index_notation
        v = _LETTERS[:rank]
        return ir.Assignment(v, _EXPRESSIONS[op](ir.Access(0, v), ir.Access(1, v)))
    asg = _compiler().kept_assignment(("same shape", op, rank), build)
    if _grad_enabled() and _any_requires_grad(a, b):
        return _wrap(_compute()(asg, a, b))
    if consumer_follows((a, b), sa.values.numel() + sb.values.numel(), product=op == "mul"):
        # ``A * B + A``: deferred, the next operator runs ONE kernel
        return make_pending(a.shape, a.dtype, Pending((a,) if a is b else (a, b),
                                                      (op, 0, 0 if a is b else 1)))
    return _wrap(_compiler().compute(asg, sa, sb))


_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _prepare(*xs, true_division: bool = False):
    xs = tuple(as_scorch(x) for x in xs)
    dt = result_dtype(xs[0], xs[1], true_division) if len(xs) > 1 else xs[0].dtype
    return dt, tuple(_cast(x, dt) for x in xs)


def bool_as_uint8(x):
    """A bool operand as uint8 (the same bytes, 0/1; kernels have no bool type): no copy."""
    if _is_scalar(x):
        return torch.tensor(int(x), dtype=torch.uint8)
    if isinstance(x, SparseTensor):
        return with_values(x, x._storage.values.view(torch.uint8))
    return x.view(torch.uint8)


def as_bool(r) -> torch.Tensor:
    """A kernel's 0/1 result stored as torch.bool."""
    if isinstance(r, SparseTensor):
        v = r._storage.values
        return with_values(r, v.view(torch.bool) if v.dtype == torch.uint8 else v != 0)
    return r.view(torch.bool) if r.dtype == torch.uint8 else r != 0


def _bool_op(a, b, expression) -> torch.Tensor:
    """torch's bool arithmetic (``+`` is or, ``*`` is and) on 0/1 uint8 values: the kernel
    result is 0/1 again and is viewed back as bool."""
    return as_bool(_build((bool_as_uint8(as_scorch(a)), bool_as_uint8(as_scorch(b))),
                          expression))


def _bool_or(x, y):
    ir = _compiler().index_notation
    return ir.Gt(x + y, ir.Scalar(0))


def _in_optimizer_step(op, a, b, **kwargs):
    """In an optimizer step (``gradients.optimizer_step``) a sparse tensor with a scalar, or
    two sparse tensors of one pattern, act on the stored values: the state lives on the
    pattern, and torch's op on the values serves every dtype (the kernels have no float16:
    NAdam's ``grad.add(param, alpha=wd)``, Rprop's ``grad.mul(prev)``). None otherwise."""
    sa, sb = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if not (sa and (sb or _scalar_like(b)) or sb and _scalar_like(a)) or not values_level():
        return None
    if sa and sb:
        if not same_pattern(a._storage, b._storage):
            return None
        return with_values(a, op(a._storage.values, b._storage.values, **kwargs))
    if sa:
        return with_values(a, op(a._storage.values, b, **kwargs))
    v = b._storage.values
    return with_values(b, op(torch.as_tensor(a, dtype=v.dtype), v, **kwargs))


def _check_grown_dense(name: str, a, b, dt) -> None:
    """A sparse operand with a scalar or a broadcast dense one (``A + 1``, ``A + row``) gives
    a dense result larger than any dense operand: bounded by the dense limit, as the ops
    dense by nature are. A dense operand of the result's size is the user's already."""
    if is_sparse_operand(a) and is_sparse_operand(b):
        return
    shape = broadcast_shapes(_shape_of(a), _shape_of(b))
    dense = [x for x in (a, b) if isinstance(x, torch.Tensor) and not is_sparse_operand(x)]
    if max((x.numel() for x in dense), default=1) < math.prod(shape):
        check_dense_size(name, shape, dt)


def add(a, b, alpha=1) -> torch.Tensor:
    """``a + alpha * b``: sparse when both are sparse (union of patterns), else dense."""
    if not (is_sparse_operand(a) or is_sparse_operand(b)):
        return torch.add(a, b, alpha=alpha)
    stepped = _in_optimizer_step(torch.add, a, b, alpha=alpha)
    if stepped is not None:
        return stepped
    if alpha == 1:
        if pending_of(a) is not None or pending_of(b) is not None:
            r = fused("add", a, b)
            if r is not None:
                return r
        fast = _same_shape(a, b, "add")
        if fast is not None:
            return fast
    dt, (a, b) = _prepare(a, b)
    _check_grown_dense("add", a, b, dt)
    if dt == torch.bool and alpha == 1:
        return _bool_op(a, b, _bool_or)
    if alpha == 1:
        return _build((a, b), "add")
    return _build((a, b, _cast(alpha, dt)), "add_alpha")


def sub(a, b, alpha=1) -> torch.Tensor:
    """``a - alpha * b``."""
    if not (is_sparse_operand(a) or is_sparse_operand(b)):
        return torch.sub(a, b, alpha=alpha)
    if any(isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool)
           for x in (a, b)):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")
    stepped = _in_optimizer_step(torch.sub, a, b, alpha=alpha)
    if stepped is not None:
        return stepped
    if alpha == 1:
        if pending_of(a) is not None or pending_of(b) is not None:
            r = fused("sub", a, b)
            if r is not None:
                return r
        fast = _same_shape(a, b, "sub")
        if fast is not None:
            return fast
    dt, (a, b) = _prepare(a, b)
    _check_grown_dense("sub", a, b, dt)
    if alpha == 1:
        return _build((a, b), "sub")
    return _build((a, b, _cast(alpha, dt)), "sub_alpha")


def mul(a, b) -> torch.Tensor:
    """``a * b``: sparse when either is sparse (intersection of patterns)."""
    if not (is_sparse_operand(a) or is_sparse_operand(b)):
        return torch.mul(a, b)
    stepped = _in_optimizer_step(torch.mul, a, b)
    if stepped is not None:
        return stepped
    if pending_of(a) is not None or pending_of(b) is not None:
        r = fused("mul", a, b)
        if r is not None:
            return r
    fast = _same_shape(a, b, "mul")
    if fast is not None:
        return fast
    dt, (a, b) = _prepare(a, b)
    if dt == torch.bool:
        return _bool_op(a, b, "mul")
    return _build((a, b), "mul")


def div(a, divisor) -> torch.Tensor:
    """``a / divisor``: a scalar divisor (a Python number or a 0-d tensor) multiplies by its
    reciprocal, a dense tensor divisor is the compiler's division; both keep ``a``'s pattern
    (a 0 / 0 where ``a`` stores nothing stays 0, as in torch.sparse and JAX sparse). As torch's sparse layouts do,
    division by zero changes only the stored entries (inf/nan there; unstored stay 0).
    A sparse divisor gives a dense result (:func:`divide_by_sparse`), except a sparse
    divisor broadcast along a dimension of a sparse ``a`` (``A / A.sum(1, keepdim=True)``),
    read as the dense vector it is (:func:`_broadcast_divisor`)."""
    stepped = _in_optimizer_step(torch.div, a, divisor)
    if stepped is not None:
        return stepped
    if not _scalar_like(divisor):
        if is_sparse_operand(divisor):
            divisor = _broadcast_divisor(a, divisor)
            if is_sparse_operand(divisor):
                return divide_by_sparse(a, divisor)
        dt = result_dtype(as_scorch(a), divisor, true_division=True)
        return _build((_cast(as_scorch(a), dt), _cast(divisor, dt)), "div")
    dt = result_dtype(as_scorch(a), divisor, true_division=True)
    if _is_scalar(divisor):
        recip = torch.tensor(1.0 / divisor if divisor != 0 else float("inf"), dtype=dt)
        tiny = dt.is_floating_point and divisor != 0 and abs(divisor) < _tiniest_divisor(dt)
    else:
        d = divisor.reshape(()).to(dt)
        recip = torch.reciprocal(d)
        tiny = dt.is_floating_point and 0 < abs(float(d.detach())) < _tiniest_divisor(dt)
    if tiny:
        # a divisor so small its reciprocal overflows (1e-39 in float32): torch's division
        # of the stored values (x * (1 / 1e-39) would be inf where x / 1e-39 is finite)
        return on_stored_values(torch.div, _cast(as_scorch(a), dt), divisor)
    return mul(_cast(as_scorch(a), dt), recip)


def _tiniest_divisor(dt: torch.dtype) -> float:
    """The least magnitude whose reciprocal ``dt`` holds."""
    return 1.0 / torch.finfo(dt).max


def _broadcast_divisor(a, divisor):
    """A sparse ``divisor`` that broadcasts along a dimension of a sparse ``a`` (a degree
    vector: ``A / A.sum(1, keepdim=True)``) as a dense tensor (differentiably), so the
    division keeps ``a``'s pattern as a dense divisor's does: whether ``sum(keepdim=True)``
    came back dense or sparse depends on the format (CSR's ``sum(1)`` is dense, COO's is
    sparse), and the same line of code raised or gave NaN rows for the other formats.
    Bounded: at most max(2^20, 8 per stored entry of ``a``) elements; else unchanged."""
    if not isinstance(a, SparseTensor) or not isinstance(divisor, SparseTensor):
        return divisor
    a_shape, d_shape = tuple(a.shape), tuple(divisor.shape)
    if len(d_shape) > len(a_shape) or broadcast_shapes(a_shape, d_shape) != a_shape or \
            (1,) * (len(a_shape) - len(d_shape)) + d_shape == a_shape or \
            2 * divisor.numel() > a.numel() or \
            divisor.numel() > max(1 << 20, 8 * a._storage.nnz):
        return divisor
    return divisor.to_dense()


def divide_by_sparse(a, divisor) -> torch.Tensor:
    """``a / divisor`` with a sparse divisor, as dense torch divides: ``x / 0`` wherever the
    divisor stores nothing (+-inf, NaN where ``a`` is 0 there too), so the result is dense
    by nature (allocated under the dense limit). ONE kernel over every position:
    ``where(1, a / divisor, 1)`` with a 0-d operand ``1`` is an expression the compiler
    computes everywhere, reading an absent entry as 0. No backward yet."""
    a, divisor = as_scorch(a), as_scorch(divisor)
    if _grad_enabled() and _any_requires_grad(a, divisor):
        raise RuntimeError("scorch: 'div' by a sparse tensor that requires grad (or of one) "
                           "has no backward yet; call it under torch.no_grad() or on .detach()")
    dt = result_dtype(a, divisor, true_division=True)
    shape = broadcast_shapes(_shape_of(a), _shape_of(divisor))
    check_dense_size("div", shape, dt)
    ir = _compiler().index_notation
    one = torch.tensor(1, dtype=dt)
    with torch.no_grad():
        return _build((_cast(a, dt), _cast(divisor, dt), one),
                      lambda x, y, o: ir.Where(o, x / y, o), _compiler().compute)


def neg(a) -> torch.Tensor:
    if pending_of(a) is not None:
        r = fused("neg", a)
        if r is not None:
            return r
    a = as_scorch(a)
    return _build((a,), "neg")


def _addc(op: str, c, x, y, value) -> torch.Tensor:
    """``c + value * x (*|/) y`` as ONE kernel (torch's dtype rules: the three tensors
    promote together; ``value`` is cast to their type, so integers truncate 0.5 to 0 as
    torch's do)."""
    c, x, y = as_scorch(c), as_scorch(x), as_scorch(y)
    dt = torch.result_type(_stand_in(c), _stand_in(x))
    dt = torch.promote_types(dt, torch.result_type(_stand_in(y), _stand_in(c)) if isinstance(y, torch.Tensor)
                             else result_dtype(y, c))
    if isinstance(value, numbers.Number) and not (dt.is_floating_point or dt.is_complex):
        value = int(value)
    return _build((_cast(c, dt), _cast(x, dt), _cast(y, dt), _cast(value, dt)), op)


def addcmul(c, x, y, value=1) -> torch.Tensor:
    """``c + value * x * y``: sparse when ``c`` is sparse and so is ``x`` or ``y``."""
    return _addc("addcmul", c, x, y, value)


def addcdiv(c, x, y, value=1) -> torch.Tensor:
    """``c + value * x / y`` (``y`` dense: a sparse denominator is x / 0, dense by nature)."""
    return _addc("addcdiv", c, x, y, value)


def _scalar_like(x) -> bool:
    return _is_scalar(x) or (isinstance(x, torch.Tensor) and not is_sparse_operand(x)
                             and x.dim() == 0)


# --- in-place forms --------------------------------------------------------------------------

def _level_keys(st: Storage) -> torch.Tensor:
    """Each stored entry's coordinates linearised in level order: ascending in storage order
    (levels store coordinates sorted), so positions can be found by binary search."""
    c = _shape._coords_of(st)
    key = torch.zeros(c.shape[1], dtype=torch.int64)
    for lv in st.levels:
        key = key * st.shape[lv.dim] + c[lv.dim]
    return key


def _same_structure(sa: Storage, sb: Storage) -> bool:
    for la, lb in zip(sa.levels, sb.levels):
        for x, y in ((la.pos, lb.pos), (la.crd, lb.crd)):
            if (x is None) != (y is None):
                return False
            if x is not None and x is not y and not torch.equal(x, y.to(x.dtype)):
                return False
    return True


def _store_in_place(name: str, self, result) -> torch.Tensor:
    """Write ``result`` into ``self`` when its entries lie on self's pattern (self's values
    array is updated in place, so views and optimizers see it; self's entries the result
    does not store become zeros); otherwise a clear error."""
    refuse_write_to_copy(self, name)
    if not torch.can_cast(result.dtype, self.dtype):
        raise RuntimeError(f"{name}: result type {result.dtype} can't be cast to the desired "
                           f"output type {self.dtype}")
    if not isinstance(self, SparseTensor):
        self.copy_(result.to_dense() if isinstance(result, SparseTensor) else result)
        return self
    if tuple(result.shape) != tuple(self.shape):
        raise RuntimeError(f"{name}: the result of shape {tuple(result.shape)} does not fit the "
                           f"sparse tensor of shape {tuple(self.shape)}")
    st = self._storage
    if not isinstance(result, SparseTensor):
        # a dense result (a dense operand) fits when it is 0 off the pattern: an update
        # that leaves the unstored positions alone (LBFGS adds a flat direction made of
        # gradients on the pattern); its cost is the dense operand's, which exists already
        if st.format.block is not None:
            picked, outside = None, "some"
        else:
            picked = result[tuple(_shape._coords_of(st))] if st.nnz else result.new_zeros(0)
            outside = int(torch.count_nonzero(result)) - int(torch.count_nonzero(picked))
        if outside:
            raise RuntimeError(f"{name}: the result is dense (e.g. adding a dense tensor or a "
                               f"scalar) and nonzero at {outside} positions outside the sparse "
                               f"tensor's pattern, so it cannot be stored in it in place"
                               + _pattern_remedy())
        st.values.copy_(picked.to(st.values.dtype))
        return self
    rs = result.to_format(st.format)._storage
    values = st.values
    if rs.nnz == st.nnz and _same_structure(st, rs):
        values.copy_(rs.values)
        return self
    if st.format.block is not None:
        raise RuntimeError(f"{name}: the result's pattern differs from the blocked sparse "
                           f"tensor's; in-place ops keep the pattern" + _pattern_remedy())
    own, theirs = _level_keys(st), _level_keys(rs)
    at = torch.searchsorted(own, theirs)
    inside = at < own.numel()
    if not bool(inside.all()) or not torch.equal(own[at], theirs):
        raise RuntimeError(f"{name}: the result stores entries outside the sparse tensor's "
                           f"pattern (in-place ops keep the pattern)" + _pattern_remedy())
    fresh = torch.zeros_like(values)
    fresh[at] = rs.values.to(values.dtype)
    values.copy_(fresh)
    return self


def _pattern_remedy() -> str:
    """How an error for an in-place result off the pattern ends: use the out-of-place form,
    except in an optimizer step (``values_level``), where the operand off the pattern is the
    optimizer's state from an older pattern (SGD's ``param.add_(momentum_buffer)`` after
    pruning) and the user writes no op to change: reset that state."""
    return ". " + STALE_STATE_HINT if values_level() else "; use the out-of-place form"


def _in_place(name: str, self, other, op) -> torch.Tensor:
    """``self = op(self, other)`` written into ``self`` (``_store_in_place``); a sparse
    ``self`` with grad in play is recorded by autograd as an in-place op
    (``in_place.record_in_place``: its history rebased, the backward the out-of-place op's)."""
    if isinstance(self, SparseTensor) and _grad_enabled() and _any_requires_grad(self, other):
        from .in_place import record_in_place
        return record_in_place(self, other, op, lambda s, r: _store_in_place(name, s, r), name)
    return _store_in_place(name, self, op(_operand(self, other), other))


def _operand(self, other):
    """``self`` as the out-of-place op's operand: a dense ``self`` that autograd records is
    cloned first, as the op may save it for its backward and copy_ then overwrites it."""
    if not isinstance(self, SparseTensor) and _grad_enabled() and _any_requires_grad(self, other):
        return self.clone()
    return self


def add_(self, other, alpha=1):
    return _in_place("add_", self, other, lambda a, b: add(a, b, alpha))


def sub_(self, other, alpha=1):
    return _in_place("sub_", self, other, lambda a, b: sub(a, b, alpha))


def _constant_scalar(other) -> bool:
    return _scalar_like(other) and not (isinstance(other, torch.Tensor) and other.requires_grad)


def mul_(self, other):
    if isinstance(self, SparseTensor) and _constant_scalar(other):
        # the stored values scaled in place (torch raises for a float into an int tensor);
        # under autograd the history is rebased, as for the in-place functions
        from .in_place import write_values
        return write_values(self, lambda v: v.mul_(other), lambda v: v * other)
    return _in_place("mul_", self, other, mul)


def div_(self, other):
    if isinstance(self, SparseTensor) and is_sparse_operand(other):
        # x / 0 wherever the divisor stores nothing: dense by nature (the out-of-place
        # ``A / B``), so it cannot be written into the pattern unless the divisor covers
        # every position the dividend leaves unstored
        other = as_scorch(other)
        if _divisor_gaps(self, other):
            raise RuntimeError(
                f"div_: the sparse divisor stores {other.nnz} of {math.prod(other.shape)} "
                f"positions, so x / 0 (inf, or NaN where both are 0) lands outside the sparse "
                f"tensor's pattern; in-place ops keep the pattern, use the out-of-place form "
                f"(dense by nature)")
        return _in_place("div_", self, other, div)
    if not _scalar_like(other) and not isinstance(self, SparseTensor):
        # a dense tensor divided by a sparse one (dense by nature): not here
        return NotImplemented
    if not (self.dtype.is_floating_point or self.dtype.is_complex):
        raise RuntimeError(f"div_: result type Float can't be cast to the desired output type "
                           f"{self.dtype}")
    if isinstance(self, SparseTensor) and _constant_scalar(other):
        from .in_place import write_values           # as mul_; x / 0 changes the stored entries only
        return write_values(self, lambda v: v.div_(other), lambda v: v / other)
    return _in_place("div_", self, other, div)


def _divisor_gaps(self: SparseTensor, divisor: SparseTensor) -> bool:
    """Whether ``self / divisor`` certainly divides by 0 at a position ``self`` does not
    store: the (broadcast) divisor stores fewer entries than ``self`` leaves unstored."""
    total = math.prod(self.shape)
    stored = divisor.nnz * (total // max(math.prod(divisor.shape), 1))
    return stored < total - self.nnz


def _scalar_add_(name: str, self: SparseTensor, other, alpha, sign: int) -> SparseTensor:
    """``self += sign * alpha * other`` for a constant scalar ``other`` (a number or a dense
    0-d tensor) outside an optimizer step. A non-zero step lands on every unstored position
    too, so the result leaves the pattern: it raises (as adding a dense tensor does) unless
    ``self`` stores every position; a zero step changes nothing. Either way on the stored
    values, so every dtype works."""
    check_scalar_step(name, self, (other.item() if isinstance(other, torch.Tensor) else other)
                      * alpha * sign)
    from .in_place import write_values
    mutate = getattr(torch.Tensor, name)
    return write_values(self, lambda v: mutate(v, other, alpha=alpha),
                        lambda v: getattr(torch, name.rstrip("_"))(v, other, alpha=alpha))


def _values_level_in_place(self, other) -> bool:
    """In an optimizer step, an in-place op of a sparse tensor with a scalar or with a sparse
    tensor of its own pattern acts on the stored values: torch's own path takes it to the
    ATen values-level handlers (``gradients.optim_ops``), which serve every dtype (the
    kernels have no float16: SGD's ``param.add_(grad, alpha=-lr)``)."""
    if not isinstance(self, SparseTensor) or not (
            _scalar_like(other) or isinstance(other, SparseTensor)) or not values_level():
        return False
    return not isinstance(other, SparseTensor) or same_pattern(self._storage, other._storage)


# --- registration ----------------------------------------------------------------------------

def _involves_sparse(*xs) -> bool:
    return any(is_sparse_operand(x) for x in xs)


def _no_out(name: str, out) -> None:
    if out is not None:
        raise RuntimeError(f"{name}: out= is not supported with sparse operands")


@register(torch.add, torch.Tensor.add, torch.Tensor.__add__)
def _add(a, b, *, alpha=1, out=None):
    if not _involves_sparse(a, b):
        return NotImplemented
    _no_out("add", out)
    return add(a, b, alpha)


@register(torch.Tensor.__radd__)
def _radd(a, b):
    return add(b, a) if _involves_sparse(a, b) else NotImplemented


@register(torch.sub, torch.subtract, torch.Tensor.sub, torch.Tensor.subtract, torch.Tensor.__sub__)
def _sub(a, b, *, alpha=1, out=None):
    if not _involves_sparse(a, b):
        return NotImplemented
    _no_out("sub", out)
    return sub(a, b, alpha)


@register(torch.Tensor.__rsub__, torch.rsub)
def _rsub(a, b, *, alpha=1):
    # torch.rsub(a, b, alpha) = b - alpha * a
    if not _involves_sparse(a, b):
        return NotImplemented
    if alpha == 1:
        return sub(b, a)
    return sub(b, mul(a, alpha))


@register(torch.mul, torch.multiply, torch.Tensor.mul, torch.Tensor.multiply,
          torch.Tensor.__mul__)
def _mul(a, b, *, out=None):
    if not _involves_sparse(a, b):
        return NotImplemented
    _no_out("mul", out)
    return mul(a, b)


@register(torch.Tensor.__rmul__)
def _rmul(a, b):
    return mul(b, a) if _involves_sparse(a, b) else NotImplemented


# --- ops whose f(0, other) is 0 for a number: computed on the stored values --------------

def _other_at_stored(t: SparseTensor, other):
    """``other`` (a number, or a dense tensor broadcastable to ``t`` without growing it) at
    ``t``'s stored coordinates; None when it would grow the result or is sparse."""
    if isinstance(other, numbers.Number) and not isinstance(other, bool):
        return other
    if (not isinstance(other, torch.Tensor) or isinstance(other, SparseTensor)
            or other.layout != torch.strided):
        return None
    if other.dim() == 0:
        return other
    try:
        if broadcast_shapes(t.shape, other.shape) != t.shape:
            return None
    except RuntimeError:
        return None
    from .._runtime import convert
    return other.expand(t.shape)[tuple(convert.coords(t._storage))]


def _keeps_zero(op, other, strict: bool, dtype: torch.dtype = torch.float64) -> bool:
    """``op(0, other)`` is 0 for a number. A dense ``other``: ``strict``, at every one of its
    entries (``heaviside``, a polynomial of degree ``n``); else its zeros where nothing is
    stored stay 0 (a division by a dense tensor, as torch.sparse). ``dtype``: the sparse
    operand's (``heaviside`` wants both of one type; an integer one is kept for the bitwise
    ops, which float64 lacks: ``x // 0`` of an integer 0 raises torch's error, as the dense
    op would)."""
    zero = torch.zeros((), dtype=dtype if dtype.is_floating_point or (
        not dtype.is_complex and dtype != torch.bool) else torch.float64)
    with torch.no_grad():
        if isinstance(other, torch.Tensor) and other.dim() > 0:
            if not strict:
                return True
            return bool((op(zero, other) == 0).all())
        return bool(op(zero, other) == 0)


def on_stored_values(op, x, other, *, strict_zero: bool = False, **kwargs):
    """``op(x, other)`` for a sparse ``x`` where ``op(0, other)`` is 0 (``fmod``,
    ``remainder``, ``floor_divide``, ``div`` with a rounding mode, ``xlog1py``): torch's op on
    the stored values (its rounding exactly), the pattern kept, differentiable as torch's op
    is. A dense ``other`` that broadcasts ``x`` to a larger shape expands ``x`` first (its
    stored entries repeated). Where ``op(0, other)`` is not 0 (``_keeps_zero``) the result is
    dense by nature: torch's op on the dense copy. NotImplemented (the fallback) for a sparse
    ``other``."""
    x, other = as_scorch(x), numpy_as_tensor(other)
    if (not isinstance(x, SparseTensor) or kwargs.pop("out", None) is not None
            or x.dtype.is_complex):
        return NotImplemented
    if isinstance(other, torch.Tensor) and not isinstance(other, SparseTensor) and other.dim() > 0:
        try:
            shape = broadcast_shapes(x.shape, other.shape)
        except RuntimeError:
            return NotImplemented          # torch's error, from the fallback
        if shape != x.shape:
            x = x.expand(shape)
    at = _other_at_stored(x, other)
    if at is None:
        return NotImplemented
    if not _keeps_zero(lambda a, b: op(a, b, **kwargs), other, strict_zero, x.dtype):
        check_dense_size(getattr(op, "__name__", "op"), x.shape, x.dtype)
        return op(x.to_dense(), other, **kwargs)   # differentiable: the gradient returns to the pattern
    return from_values(x._storage, op(values_of(x), at, **kwargs))


@register(torch.div, torch.divide, torch.true_divide, torch.Tensor.div, torch.Tensor.divide,
          torch.Tensor.true_divide, torch.Tensor.__truediv__)
def _div(a, b, *, rounding_mode=None, out=None):
    # a sparse dividend over a scalar or dense divisor stays sparse; division by a sparse
    # tensor is a dense kernel (dense by nature); a rounding mode: torch's division on the
    # stored values (on_stored_values; a sparse divisor: the fallback's)
    if out is not None or not _involves_sparse(a, b):
        return NotImplemented
    if rounding_mode is not None:
        return on_stored_values(torch.div, a, b, rounding_mode=rounding_mode)
    return div(a, b)


@register(torch.Tensor.__rtruediv__)
def _rdiv(a, b):
    # ``b / a`` with ``b`` a number or a dense tensor: division by a sparse tensor
    return div(b, a) if is_sparse_operand(a) else NotImplemented


@register(torch.neg, torch.negative, torch.Tensor.neg, torch.Tensor.negative,
          torch.Tensor.__neg__)
def _neg(a, *, out=None):
    if not is_sparse_operand(a):
        return NotImplemented
    _no_out("neg", out)
    return neg(a)


@register(torch.addcmul, torch.Tensor.addcmul)
def _addcmul(c, x, y, *, value=1, out=None):
    if not _involves_sparse(c, x, y):
        return NotImplemented
    _no_out("addcmul", out)
    return addcmul(c, x, y, value)


@register(torch.addcdiv, torch.Tensor.addcdiv)
def _addcdiv(c, x, y, *, value=1, out=None):
    # a sparse denominator is dense by nature; integer division: torch's own error
    if not _involves_sparse(c, x, y) or is_sparse_operand(y) or not all(
            t.dtype.is_floating_point for t in (c, x, y) if isinstance(t, torch.Tensor)):
        return NotImplemented
    _no_out("addcdiv", out)
    return addcdiv(c, x, y, value)


# In an optimizer step an in-place op with a scalar or a same-pattern operand goes to the
# stored values (``_values_level_in_place``: optimizers add eps to their state); outside
# one a non-zero scalar added in place leaves the pattern (``_scalar_add_``).
@register(torch.Tensor.add_, torch.Tensor.__iadd__)
def _add_(self, other, *, alpha=1):
    if not _involves_sparse(self, other) or _values_level_in_place(self, other):
        return NotImplemented
    if isinstance(self, SparseTensor) and _constant_scalar(other):
        return _scalar_add_("add_", self, other, alpha, 1)
    return add_(self, other, alpha)


@register(torch.Tensor.sub_, torch.Tensor.subtract_, torch.Tensor.__isub__)
def _sub_(self, other, *, alpha=1):
    if not _involves_sparse(self, other) or _values_level_in_place(self, other):
        return NotImplemented
    if isinstance(self, SparseTensor) and _constant_scalar(other):
        return _scalar_add_("sub_", self, other, alpha, -1)
    return sub_(self, other, alpha)


@register(torch.Tensor.mul_, torch.Tensor.multiply_, torch.Tensor.__imul__)
def _mul_(self, other):
    if not _involves_sparse(self, other) or _values_level_in_place(self, other):
        return NotImplemented
    return mul_(self, other)


@register(torch.Tensor.div_, torch.Tensor.divide_, torch.Tensor.true_divide_,
          torch.Tensor.__itruediv__)
def _div_(self, other, *, rounding_mode=None):
    if not isinstance(self, SparseTensor) or (
            rounding_mode is None and _values_level_in_place(self, other)):
        return NotImplemented
    if rounding_mode is not None:
        # ``floor`` / ``trunc`` of 0 / x is 0: on the pattern, as the out-of-place form
        def rounded(a, b):
            return on_stored_values(torch.div, a, b, rounding_mode=rounding_mode)
        if _constant_scalar(other):
            from .in_place import write_values
            return write_values(self, lambda v: v.div_(other, rounding_mode=rounding_mode),
                                lambda v: torch.div(v, other, rounding_mode=rounding_mode))
        return _in_place("div_", self, other, rounded)
    return div_(self, other)


# the frames between an operator (``A * B``) and the deferral check, and the operators that
# may defer: see scorch.sparse_ops.fusion
register_dispatch_frames(
    (_same_shape, add, sub, mul, neg, _add, _radd, _sub, _rsub, _mul, _rmul, _neg,
     _tensor_type._direct, _tensor_type._or_handler, _tensor_type._run_handler),
    operators=(SparseTensor.__mul__, SparseTensor.__rmul__, SparseTensor.__add__,
               SparseTensor.__sub__, SparseTensor.__neg__),
    dunders=(torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.__add__,
             torch.Tensor.__radd__, torch.Tensor.__sub__, torch.Tensor.__rsub__,
             torch.Tensor.__neg__))
