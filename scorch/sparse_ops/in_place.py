"""In-place elementwise functions that keep 0 at 0 (``x.relu_()``, ``x.abs_()``,
``x.clamp_(-1, 1)``, ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``, ...): torch's own
in-place op on the stored values, so the pattern and every view of it stay, and the values
come out exactly as the dense op's. One that moves 0 (``sigmoid_``, ``clamp_(min=1)``) could
not keep the tensor sparse and raises, naming the op.

Under autograd the tensor's history is rebased as torch's in-place ops do (``mark_dirty``):
the backward is the out-of-place op's derivative at the values before the change (kept for
it), and a tensor that an earlier op saved for its backward raises torch's "modified by an
inplace operation" error when that backward runs (the values' version counter moved).

Writes at positions (``masked_fill_``, ``fill_diagonal_``; ``x[index] = v`` and
``index_put_`` in ``item_writes``) set stored values in place the same way; a non-zero value
at a position the tensor does not store would grow the pattern, so it raises (the
out-of-place ``index_put`` grows it)."""
from __future__ import annotations

import numbers
from typing import Callable

import torch
import torch.nn.functional as F

from .._dispatch import register
from ..gradients.optimizer_step import values_level
from ..gradients.values import from_values, grad_values, mark_gradient, values_of
from ..tensor_type import SparseTensor, refuse_write_to_copy
from ..broadcasting import broadcast_shapes

__all__ = ["run_in_place", "write_values", "record_in_place"]

Op = Callable[[torch.Tensor], torch.Tensor]


class _InPlace(torch.autograd.Function):
    """``mutate`` on ``s``'s values, recorded as an in-place op of ``s``. ``before`` is a copy
    of the values before the change made outside (with their history), so a gradient built
    with ``create_graph`` stays a function of them: a gradient penalty or a Hessian-vector
    product through the in-place op gets its second-order terms."""
    @staticmethod
    def forward(ctx, s: SparseTensor, before: torch.Tensor, mutate: Op, op: Op) -> SparseTensor:
        ctx.save_for_backward(before)
        ctx.op, ctx.pattern = op, s._storage.pattern_only()
        mutate(s._storage.values)
        ctx.mark_dirty(s)
        return s

    @staticmethod
    def backward(ctx, g):
        before, = ctx.saved_tensors
        wanted = grad_values(ctx.pattern, g)
        create = torch.is_grad_enabled()          # (backward(create_graph=True))
        with torch.enable_grad():
            v = before if create and before.requires_grad else before.detach().requires_grad_()
            out = ctx.op(v)
            grad, = torch.autograd.grad(out, v, wanted.to(out.dtype), allow_unused=True,
                                        create_graph=create)
        if grad is None:                  # a piecewise-constant op (floor_, sign_): no gradient
            grad = torch.zeros_like(before)
        return mark_gradient(from_values(ctx.pattern, grad)), None, None, None


def _values_before(s: SparseTensor) -> torch.Tensor:
    """``s``'s values as they are, copied, with their history (``_InPlace``'s ``before``)."""
    return values_of(s).clone()


def run_in_place(name: str, s: SparseTensor, mutate: Op, op: Op) -> SparseTensor:
    """``mutate`` (torch's in-place op) on ``s``'s stored values when ``op`` (its
    out-of-place form) keeps 0 at 0; ``s`` itself is returned, as torch's in-place ops do."""
    refuse_write_to_copy(s, name)
    values = s._storage.values
    zero = op(torch.zeros(1, dtype=values.dtype))
    if not bool((zero == 0).all()) and not values_level():   # an optimizer step: on the values
        raise RuntimeError(
            f"scorch: in-place '{name}' maps 0 to {zero.item()}, so its result could not stay "
            f"sparse; use the out-of-place form (a dense result) or .to_dense() first")
    return write_values(s, mutate, op, name)


def write_values(s: SparseTensor, mutate: Op, op: Op, name: str = "") -> SparseTensor:
    """``mutate`` on ``s``'s stored values in place; under autograd, rebased (``_InPlace``)
    with ``op`` (the same map out of place) as what the backward differentiates."""
    refuse_write_to_copy(s, name)
    if torch.is_grad_enabled() and s.requires_grad:
        return _InPlace.apply(s, _values_before(s), mutate, op)
    mutate(s._storage.values)
    return s


class _InPlaceWith(torch.autograd.Function):
    """``s op= other`` (``add_``/``sub_``/``mul_``/``div_`` by a tensor) under autograd: the
    result of ``op`` out of place is written into ``s``'s values (``store``: it must lie on
    ``s``'s pattern) and ``s``'s history rebased (``mark_dirty``). The backward replays ``op``
    on the values before the change and on ``other``, saved as torch saves tensors (a later
    in-place change of a dense ``other`` raises torch's "modified by an inplace operation")."""
    @staticmethod
    def forward(ctx, s: SparseTensor, before: torch.Tensor, other, op: Callable,
                store: Callable) -> SparseTensor:
        dense_other = isinstance(other, torch.Tensor) and not isinstance(other, SparseTensor)
        ctx.save_for_backward(before, *((other,) if dense_other else ()))
        ctx.op, ctx.pattern, ctx.other = op, s._storage.pattern_only(), None if dense_other else other
        store(s, op(s, other))
        ctx.mark_dirty(s)
        return s

    @staticmethod
    def backward(ctx, g):
        before, *saved = ctx.saved_tensors
        P, other = ctx.pattern, (saved[0] if saved else ctx.other)
        wanted = grad_values(P, g)
        tracked = isinstance(other, torch.Tensor) and other.requires_grad
        create = torch.is_grad_enabled()          # (backward(create_graph=True)): see _InPlace
        if create and tracked and before.requires_grad:
            # the values before the change may depend on ``other`` (``C = A * B; C.mul_(B)``):
            # a derivative taken through both at once would count that path twice
            raise NotImplementedError(
                "scorch: a gradient with create_graph=True through an in-place op of a sparse "
                "tensor with another tensor that requires grad (s.mul_(t), s.add_(t), ...) is "
                "not supported; write the op out of place (s = s * t)")
        with torch.enable_grad():
            v = before if create and before.requires_grad else before.detach().requires_grad_()
            o = other.detach().requires_grad_() if tracked else other
            out = grad_values(P, ctx.op(from_values(P, v), o))    # the result on s's pattern
            grads = torch.autograd.grad(out, [v, o] if tracked else [v], wanted.to(out.dtype),
                                        allow_unused=True, create_graph=create)
        gs = grads[0] if grads[0] is not None else torch.zeros_like(before)
        go = grads[1] if tracked else None
        return mark_gradient(from_values(P, gs)), None, go, None, None


def record_in_place(s: SparseTensor, other, op: Callable, store: Callable,
                    name: str = "") -> SparseTensor:
    """``store(s, op(s, other))`` recorded by autograd as an in-place op of ``s`` (see
    ``_InPlaceWith``). A leaf that requires grad raises torch's error before anything is
    written (autograd would notice only after the write)."""
    refuse_write_to_copy(s, name)
    if s.is_leaf and s.requires_grad:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    return _InPlaceWith.apply(s, _values_before(s), other, op, store)


def _at_stored(name: str, x: SparseTensor, pure: Callable, args: tuple, kwargs: dict):
    """The tensor arguments of ``x.<name>(..., T, ...)`` (bounds, exponents) as their values
    at ``x``'s stored positions, in storage order, so torch's op on the values array pairs
    each stored entry with its own element of ``T`` (broadcast to ``x``'s shape, as torch's
    in-place op requires). The op must keep 0 at 0 at every position of ``T``, not only at
    the stored ones: one that moves a zero off the pattern raises, as ``run_in_place``
    does for a scalar."""
    shape = tuple(x.shape)
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.dim():
            try:
                fits = broadcast_shapes(tuple(a.shape), shape) == shape
            except RuntimeError:
                fits = False
            if not fits:
                raise RuntimeError(f"{name}: the argument of shape {list(a.shape)} does not "
                                   f"broadcast to the sparse tensor's shape {list(shape)}")
    st = x._storage
    if not values_level():
        zero = pure(torch.zeros((), dtype=st.values.dtype), *args, **kwargs)
        if not bool((zero == 0).all()):
            raise RuntimeError(
                f"scorch: in-place '{name}' maps 0 to a non-zero where its argument says so, "
                f"so its result could not stay sparse; use the out-of-place form or .to_dense() first")
    from .positions import values_at_coordinates
    where = _stored_coords(x)

    def stored(a):
        if not (isinstance(a, torch.Tensor) and a.dim()):
            return a
        if isinstance(a, SparseTensor):     # a sparse argument of x's own shape: its values there
            if tuple(a.shape) != shape:
                raise RuntimeError(f"{name}: a sparse argument must have the sparse tensor's "
                                   f"shape {list(shape)}, got {list(a.shape)}")
            return values_at_coordinates(a, where).detach()
        return a.expand(shape)[tuple(where)]
    return tuple(stored(a) for a in args), {k: stored(a) for k, a in kwargs.items()}


def _method(name: str):
    """``Tensor.<name>_(*args)`` (and ``torch.<name>_`` where torch has it, and the augmented
    assignment that is the same op: ``**=``, ``//=``, ``%=``, ``&=``, ``<<=``, ``>>=``)."""
    in_place, pure = getattr(torch.Tensor, name + "_"), getattr(torch.Tensor, name)

    def handler(x, *args, **kwargs):
        if not isinstance(x, SparseTensor) or x._storage.format.block is not None:
            return NotImplemented
        if any(isinstance(a, torch.Tensor) and a.dim() for a in (*args, *kwargs.values())):
            args, kwargs = _at_stored(name + "_", x, pure, args, kwargs)
        return run_in_place(name + "_", x, lambda v: in_place(v, *args, **kwargs),
                            lambda v: pure(v, *args, **kwargs))
    fns = [in_place] + ([getattr(torch, name + "_")] if hasattr(torch, name + "_") else [])
    fns += [getattr(torch.Tensor, d) for d in _AUGMENTED.get(name, ())]
    register(*fns)(handler)
    return fns


#: the augmented assignments torch sends to ``__torch_function__`` as functions of their own
#: (``S **= 2`` arrives as ``Tensor.__ipow__``, not ``Tensor.pow_``)
_AUGMENTED = {"pow": ("__ipow__",), "floor_divide": ("__ifloordiv__",), "remainder": ("__imod__",),
              "bitwise_and": ("__iand__",), "bitwise_left_shift": ("__ilshift__",),
              "bitwise_right_shift": ("__irshift__",)}

#: Tensor methods whose in-place form runs on the stored values (the zero check decides per
#: call: ``clamp_(-1, 1)`` runs, ``clamp_(1)`` raises; ``floor_divide_(2)``, ``remainder_(3)``
#: keep the pattern as ``S // 2`` and ``S % 3`` do, ``floor_divide_(0)`` raises)
METHODS = ("relu", "abs", "absolute", "sqrt", "sin", "tanh", "sign", "sgn", "square", "expm1",
           "log1p", "erf", "erfinv", "atan", "arctan", "floor", "ceil", "trunc", "fix", "frac",
           "asin", "arcsin", "asinh", "arcsinh", "atanh", "arctanh", "sinh", "tan", "deg2rad",
           "rad2deg", "round", "neg", "negative", "clamp", "clip", "clamp_min", "clamp_max",
           "nan_to_num", "pow", "sigmoid", "exp", "cos", "log", "floor_divide", "remainder",
           "fmod", "bitwise_and", "bitwise_left_shift", "bitwise_right_shift")
REGISTERED = [fn for name in METHODS for fn in _method(name)]


@register(torch.Tensor.fill_, torch.fill_)
def _fill_(x, value):
    """``fill_(0)`` is ``zero_`` (the stored values set to 0, the pattern kept); another value
    would fill the unstored positions too, so it raises (``run_in_place``'s zero check),
    except in an optimizer step, whose state lives on the pattern."""
    v = _scalar(value)
    if not isinstance(x, SparseTensor) or v is None or (
            isinstance(value, torch.Tensor) and value.requires_grad):
        return NotImplemented
    everywhere = torch.ones((), dtype=torch.bool)
    # the out-of-place form as a function of the values (masked_fill: a zero derivative)
    return run_in_place("fill_", x, lambda t: t.fill_(v), lambda t: t.masked_fill(everywhere, v))


def _functional(name: str):
    """``F.<name>_(x, ...)``: F.<name>(x, ..., inplace=True)."""
    pure = getattr(F, name)

    def handler(x, *args, **kwargs):
        if not isinstance(x, SparseTensor):
            return NotImplemented
        return in_place_functional(name, pure, x, args, kwargs)
    register(getattr(F, name + "_"))(handler)
    return getattr(F, name + "_")


def in_place_functional(name: str, pure, x: SparseTensor, args, kwargs) -> SparseTensor:
    """``pure(x, *args, inplace=True, **kwargs)`` of torch.nn.functional on a sparse ``x``."""
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    return run_in_place(name + "_", x, lambda v: pure(v, *args, inplace=True, **kwargs),
                        lambda v: pure(v, *args, **kwargs))


# (not rrelu: its training slopes are random, so the backward could not recompute them)
REGISTERED += [_functional(n) for n in ("relu", "leaky_relu", "elu", "hardtanh", "threshold",
                                        "celu", "selu")]


# --- writes at positions: masked_fill_, x[...] = v, index_put_, fill_diagonal_ ---------------

def _stored_coords(s: SparseTensor) -> torch.Tensor:
    from .._runtime import convert
    return convert.coords(s._storage)


def _scalar(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 and value.dim() == 0 else None
    return value if isinstance(value, numbers.Number) else None


def write_at(name: str, s: SparseTensor, chosen: torch.Tensor, wanted: int, value,
             accumulate: bool = False) -> SparseTensor:
    """Set (or add to) the stored values where ``chosen`` (one bool per stored entry) to
    ``value``, in place. ``wanted`` positions were asked for; where some are not stored, only
    a 0 (which they already read) can be written: anything else would grow the pattern, so
    it raises, naming the op."""
    hit = int(chosen.sum())
    if hit < wanted and value != 0 and not values_level():   # an optimizer step: stored ones
        raise RuntimeError(
            f"scorch: in-place '{name}' would write {value} at {wanted - hit} position(s) the sparse "
            f"tensor does not store (in-place ops keep the pattern); use the out-of-place form "
            f"(e.g. x.index_put(...), torch.where) or write 0")
    fill = torch.tensor(value, dtype=s.dtype)
    if accumulate:
        return write_values(s, lambda v: v.add_(torch.where(chosen, fill, torch.zeros((), dtype=v.dtype))),
                      lambda v: v + torch.where(chosen, fill, torch.zeros((), dtype=v.dtype)))
    return write_values(s, lambda v: v.masked_fill_(chosen, fill), lambda v: v.masked_fill(chosen, fill))


def _mask_at_stored(s: SparseTensor, mask: torch.Tensor):
    """``mask`` (bool, broadcastable to ``s`` without growing it; else an error naming both
    shapes) at ``s``'s stored entries, and how many positions it selects in all."""
    if isinstance(mask, SparseTensor):
        if tuple(mask.shape) != tuple(s.shape):
            raise RuntimeError(f"masked_fill_: a sparse mask must have the sparse tensor's shape "
                               f"{tuple(s.shape)}, got {tuple(mask.shape)}")
        from .positions import values_at_coordinates
        return values_at_coordinates(mask, _stored_coords(s)).bool(), int(mask._storage.values.bool().sum())
    try:
        fits = broadcast_shapes(mask.shape, s.shape) == s.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"masked_fill_: the mask of shape {tuple(mask.shape)} does not broadcast "
                           f"to the sparse tensor's shape {tuple(s.shape)}")
    full = mask.expand(s.shape)
    return full[tuple(_stored_coords(s))], int(full.sum())


@register(torch.Tensor.masked_fill_)
def _masked_fill_(x, mask, value):
    v = _scalar(value)
    if not isinstance(x, SparseTensor) or v is None or not isinstance(mask, torch.Tensor) \
            or mask.dtype != torch.bool:
        return NotImplemented
    chosen, wanted = _mask_at_stored(x, mask)
    return write_at("masked_fill_", x, chosen, wanted, v)


@register(torch.Tensor.fill_diagonal_)
def _fill_diagonal_(x, fill_value, wrap=False):
    v = _scalar(fill_value)
    if not isinstance(x, SparseTensor) or v is None or wrap or x.dim() < 2:
        return NotImplemented
    c = _stored_coords(x)
    chosen = (c == c[:1]).all(0)
    return write_at("fill_diagonal_", x, chosen, min(x.shape), v)
