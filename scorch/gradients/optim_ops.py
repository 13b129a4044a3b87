"""Values-level ATen ops for sparse tensors of one pattern: what gradient accumulation
(``grad += new_grad``) and torch optimizers (SGD, Adam, AdamW: ``zeros_like``, ``add_``,
``mul_``, ``lerp_``, ``addcmul_``, ``addcdiv_``, ``sqrt``, ``div``, ``maximum`` and their
``_foreach_`` forms) call on a sparse parameter, its gradient and its state.

Every sparse operand must have the same pattern (checked cheaply: the same level arrays, or
equal ones); then the op runs on the value arrays and the result keeps the pattern. An
in-place op updates the stored values and never changes the pattern (``p.add_(eps)`` adds
to stored entries only, as the optimizer state lives on the pattern). Out-of-place ``add``
and ``sub`` of two different patterns take the union through the compiler; any other
mismatch is a RuntimeError naming the op.
"""
from __future__ import annotations

import math
import sys

from typing import Any, List

import torch

from .._dispatch import check_dense_size, dense_fallback, refusal, register_aten
from ..level_storage import Storage
from ..tensor_type import SparseTensor
from . import pattern as _pattern
from .optimizer_step import values_level

aten = torch.ops.aten

__all__: List[str] = []


def _pattern_of(name: str, args) -> Storage:
    for a in args:
        if isinstance(a, SparseTensor):
            return a._storage
    raise RuntimeError(f"scorch: {name}: no sparse operand")


class _NotOnePattern(RuntimeError):
    """An operand the values-level op cannot take: a dense tensor, another pattern."""


#: what an operand of another pattern means inside an optimizer step, and what to do: the
#: out-of-place form a pattern error otherwise suggests is not the user's to choose there
STALE_STATE_HINT = ("In an optimizer step this is state kept from before the parameter's "
                    "pattern changed (pruning, p.data = ...; e.g. SGD's momentum buffer, "
                    "Adam's moments): reset it, optimizer.state[p] = {}, or build a new "
                    "optimizer")


def _values(name: str, P: Storage, x: Any, k: int):
    """Operand ``k`` as the value-array op sees it."""
    if isinstance(x, SparseTensor):
        st = x._storage
        if not _pattern.same_pattern(P, st):
            raise _NotOnePattern(
                f"scorch: {name}: operand {k} has a different sparsity pattern than the first "
                f"sparse operand (values-level ops need one pattern; convert or union first). "
                + STALE_STATE_HINT)
        return st.values
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.numel() != 1:
        raise _NotOnePattern(
            f"scorch: {name}: operand {k} is a dense tensor of shape {tuple(x.shape)}; mixing a "
            f"sparse tensor with a dense one in '{name}' is not supported (use .to_dense())")
    return x.reshape(()) if isinstance(x, torch.Tensor) and x.dim() > 0 else x


def check_scalar_step(name: str, s: SparseTensor, step) -> None:
    """Adding the number ``step`` to every position of ``s`` in place leaves its pattern
    unless ``step`` is 0 or ``s`` stores every position: raise then, as for a dense operand
    (the torch-level ``add_`` / ``sub_`` in ``sparse_ops.elementwise``, and ATen's below
    ``__torch_function__`` here)."""
    unstored = math.prod(s.shape) - s._storage.nnz
    if step != 0 and unstored:            # (NaN != 0: NaN everywhere, as dense torch)
        raise RuntimeError(
            f"{name}: adding the scalar {step} to a sparse tensor changes its {unstored} "
            f"unstored positions too, so the result cannot be stored in its pattern in place "
            f"(in-place ops keep the pattern); use the out-of-place form (a dense result)")


def _is_number(x) -> bool:
    """A number or a dense one-element tensor: what a values-level op adds to every value."""
    if isinstance(x, torch.Tensor):
        return not isinstance(x, SparseTensor) and x.numel() == 1
    return isinstance(x, (int, float, bool))


#: the bound each clamp keeps 0 at 0 with (on the stored values only, the unstored zeros stay)
_CLAMP_KEEPS_ZERO = {"clamp_min_": lambda b: b <= 0, "clamp_max_": lambda b: b >= 0}


def _values_op(op, inplace: bool):
    name = op.__name__.split(".")[0]
    keeps_zero = _CLAMP_KEEPS_ZERO.get(name)

    def handler(*args, **kwargs):
        P = _pattern_of(name, args)
        if name == "reciprocal_" and not values_level():
            # an optimizer's state lives on the pattern (RAdam's foreach step); elsewhere
            # 1 / 0 would be inf at every unstored position
            raise RuntimeError("scorch: in-place 'reciprocal_' of a sparse tensor would make its "
                               "unstored zeros inf; use torch.reciprocal (dense by nature)")
        if keeps_zero is not None and isinstance(args[0], SparseTensor) and len(args) > 1 \
                and not keeps_zero(float(args[1])) and not values_level():
            # (in an optimizer step the state lives on the pattern: any bound)
            raise RuntimeError(
                f"scorch: in-place '{name}' with bound {float(args[1])} would turn the sparse "
                f"tensor's unstored zeros into that bound; clamp a dense copy (.to_dense()) "
                f"or use a bound on the other side of 0")
        if name in ("add_", "sub_") and len(args) > 1 and isinstance(args[0], SparseTensor) \
                and _is_number(args[1]) and not values_level():
            # outside an optimizer step a scalar added in place reaches every position (the
            # torch-level add_ raises first; this is torch code below it, ``_foreach_add_``)
            value = args[1].item() if isinstance(args[1], torch.Tensor) else args[1]
            step = value * kwargs.get("alpha", 1)
            check_scalar_step(name, args[0], step if name == "add_" else -step)
        try:
            vals = [_values(name, P, a, k) for k, a in enumerate(args)]
            kw = {k: (_values(name, P, v, k) if isinstance(v, torch.Tensor) else v)
                  for k, v in kwargs.items() if k != "memory_format"}
        except _NotOnePattern:
            if name in ("add_", "sub_") and _accumulating(args) and not values_level():
                # autograd adding a gradient into a leaf's .grad of another pattern or format
                # (pruned since, ``zero_grad(set_to_none=False)``): the buffer takes the union
                scale = float(kwargs.get("alpha", 1)) * (1.0 if name == "add_" else -1.0)
                args[0]._storage = _union_add(args[0], args[1], scale)._storage
                return args[0]
            if values_level() or (inplace and isinstance(args[0], SparseTensor)):
                raise     # an optimizer's state, a sparse tensor written in place: one pattern
            # out of place, reached from inside a torch function scorch has no handler for
            # (``torch.trapezoid`` -> ``mul`` by a dense tensor), or a dense tensor written in
            # place (``X /= A``, ``X.addcmul_(A, Y)``): the dense fallback's
            return dense_fallback(op, args, kwargs)
        out = op(*vals, **kw)
        if inplace:
            return args[0]
        if isinstance(out, torch.Tensor) and out.dim() == 1 and out.numel() == P.nnz:
            return SparseTensor(_pattern.with_pattern_values(P, out))
        return out
    handler.__name__ = f"sparse_{name}"
    return handler


_INPLACE = [aten.add_.Tensor, aten.add_.Scalar, aten.sub_.Tensor, aten.sub_.Scalar,
            aten.mul_.Tensor, aten.mul_.Scalar, aten.div_.Tensor, aten.div_.Scalar,
            aten.addcmul_.default, aten.addcdiv_.default, aten.lerp_.Scalar, aten.lerp_.Tensor,
            aten.sqrt_.default, aten.neg_.default, aten.zero_.default, aten.clamp_min_.default,
            aten.clamp_max_.default, aten.abs_.default, aten.sign_.default,
            aten.reciprocal_.default]
# out-of-place: zero-preserving on one pattern (values-level = the dense result's stored part)
_OUT_OF_PLACE = [aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar,
                 aten.addcmul.default, aten.addcdiv.default, aten.lerp.Scalar, aten.lerp.Tensor,
                 aten.sqrt.default, aten.neg.default, aten.maximum.default, aten.square.default,
                 aten.abs.default, aten.sign.default]

for _op in _INPLACE:
    register_aten(_op)(_values_op(_op, True))
for _op in _OUT_OF_PLACE:
    register_aten(_op)(_values_op(_op, False))


@register_aten(aten.maximum.out)
def _maximum_out(a, b, *, out):
    """``torch.maximum(a, b, out=out)`` (AMSGrad's running maximum) on one pattern."""
    P = _pattern_of("maximum", (a, b, out))
    va, vb, vo = (_values("maximum", P, x, k) for k, x in enumerate((a, b, out)))
    torch.maximum(va, vb, out=vo)
    return out


@register_aten(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(t, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if layout is not None and layout is not torch.strided:
        raise RuntimeError(f"scorch: zeros_like: layout {layout} of a sparse tensor")
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError(f"scorch: zeros_like: sparse tensors live on the CPU; cannot make one "
                           f"on {device}")
    st = t._storage
    vals = torch.zeros_like(st.values, dtype=dtype)
    return SparseTensor(_pattern.with_pattern_values(st, vals))


@register_aten(aten.new_empty_strided.default)
def _new_empty_strided(t, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """The autograd engine's copy of an incoming gradient (``backward(create_graph=True)``:
    ``new_grad.new_empty_strided(...).copy_(new_grad)``): the pattern with zero values, which
    ``copy_`` then replaces. Another size is a plain dense ``empty_strided``, as torch's."""
    if tuple(size) == tuple(t.shape) and (layout is None or layout is torch.strided):
        return _zeros_like(t, dtype)
    return torch.empty_strided(size, stride, dtype=dtype or t.dtype)


@register_aten(aten.full_like.default)
def _full_like(t, fill_value, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    """``full_like(S, 0)`` is ``zeros_like``: the pattern with zero values (Adagrad's state,
    whose later in-place steps need one pattern); another value fills every position, so the
    result is dense by nature."""
    if fill_value == 0 or values_level() or _in_optimizer_init():
        # in an optimizer step (optimizer_step) or its set-up (Adagrad's
        # ``initial_accumulator_value``): state on the pattern
        out = _zeros_like(t, dtype, layout, device, pin_memory, memory_format)
        out._storage.values.fill_(fill_value)
        return out
    check_dense_size("full_like", t.shape, dtype or t.dtype)
    return torch.full(tuple(t.shape), fill_value, dtype=dtype or t.dtype)


def _in_optimizer_init(depth: int = 12) -> bool:
    """Whether a torch.optim optimizer's ``__init__`` is on the stack (a few frames up):
    the state it makes for a sparse parameter lives on the parameter's pattern. Checked only
    for a non-zero fill outside a step."""
    f = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return False
        code = f.f_code
        if code.co_name == "__init__" and "torch/optim/" in code.co_filename.replace("\\", "/"):
            return True
        f = f.f_back
    return False


def _add_like(sign: float):
    op = aten.add.Tensor if sign > 0 else aten.sub.Tensor
    name = "add" if sign > 0 else "sub"

    def handler(a, b, alpha=1):
        if isinstance(a, SparseTensor) and isinstance(b, SparseTensor) and \
                not _pattern.same_pattern(a._storage, b._storage):
            return _union_add(a, b, sign * alpha)
        P = _pattern_of(name, (a, b))
        other = b if isinstance(a, SparseTensor) else a
        if values_level() and (not isinstance(other, torch.Tensor) or other.numel() == 1):
            va, vb = (_values(name, P, x, k) for k, x in enumerate((a, b)))
            return SparseTensor(_pattern.with_pattern_values(P, op(va, vb, alpha=alpha)))
        if not (isinstance(a, SparseTensor) and isinstance(b, SparseTensor)):
            # dense by nature; reached only from inside a torch function scorch has no
            # handler for (``torch.add`` / ``torch.sub`` themselves are handled above ATen)
            return dense_fallback(op, (a, b), {"alpha": alpha})
        out = op(a._storage.values, b._storage.values, alpha=alpha)
        res = SparseTensor(_pattern.with_pattern_values(P, out))
        if a.__dict__.get("_values_grad") or b.__dict__.get("_values_grad"):
            res._values_grad = True
        return res
    return handler


def _accumulating(args) -> bool:
    """``grad.add_(new)`` of two sparse tensors where one is a gradient (``mark_gradient``):
    what autograd's gradient accumulation runs (user code's ``add_`` arrives above ATen)."""
    return (len(args) >= 2 and isinstance(args[0], SparseTensor) and isinstance(args[1], SparseTensor)
            and (args[0].__dict__.get("_values_grad") or args[1].__dict__.get("_values_grad")))


def _union_add(a: SparseTensor, b: SparseTensor, scale: float) -> SparseTensor:
    """``a + scale * b`` of two patterns: their union, through the compiler."""
    from .. import tensor_compiler
    from ..tensor_compiler.index_notation import Access, Assignment
    if tuple(a.shape) != tuple(b.shape):
        raise RuntimeError(f"scorch: add: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    idx = tuple(f"i{d}" for d in range(a.dim()))
    expr = Access(0, idx) + float(scale) * Access(1, idx)
    st = tensor_compiler.compute(Assignment(idx, expr), a._storage, b._storage,
                                 out_format=a._storage.format)
    return SparseTensor(st) if isinstance(st, Storage) else st


register_aten(aten.add.Tensor)(_add_like(1.0))
register_aten(aten.sub.Tensor)(_add_like(-1.0))


# --- _foreach_ forms: the single op per element ------------------------------------------

def _foreach(packet_name: str, inplace: bool):
    single = getattr(aten, packet_name, None)
    if single is None:   # no in-place single op (maximum_): compute, then copy into place
        plain = getattr(aten, packet_name.rstrip("_"))

        def single(x, *rest, **kw):
            return x.copy_(plain(x, *rest, **kw))

    takes_value = packet_name.rstrip("_") in ("addcmul", "addcdiv")

    def handler(*args, **kwargs):
        args = list(args)
        if takes_value and len(args) == 4:   # the foreach form's positional value(s)
            kwargs = dict(kwargs, value=args.pop())
        n = len(args[0])
        per_element = [isinstance(a, (list, tuple)) for a in args]
        kw_lists = {k for k, v in kwargs.items()
                    if isinstance(v, (list, tuple)) or (isinstance(v, torch.Tensor) and v.dim() == 1)}
        outs = []
        for i in range(n):
            call = [a[i] if each else a for a, each in zip(args, per_element)]
            kw = {k: (v[i].item() if isinstance(v, torch.Tensor) else v[i]) if k in kw_lists else v
                  for k, v in kwargs.items()}
            outs.append(single(*call, **kw))
        return None if inplace else outs
    return handler


for _name in ["add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "neg",
              "maximum", "zero", "sign", "copy", "abs", "clamp_min", "clamp_max", "reciprocal"]:
    for _inplace in (False, True):
        _fname = f"_foreach_{_name}" + ("_" if _inplace else "")
        _packet = getattr(aten, _fname, None)
        if _packet is None:
            continue
        for _ov in _packet.overloads():
            register_aten(getattr(_packet, _ov))(_foreach(_name + ("_" if _inplace else ""), _inplace))


@register_aten(aten._foreach_norm.Scalar)
def _foreach_norm(tensors, ord=2, dtype=None):
    """``clip_grad_norm_(foreach=True)``: each norm from the stored values (an unstored 0 adds
    nothing to a p-norm, p > 0 or inf; for other orders the values and one 0 where any is
    unstored)."""
    out = []
    for t in tensors:
        if isinstance(t, SparseTensor):
            v = t._storage.values
            p = float(ord)
            if not p > 0 and t.nnz < math.prod(t.shape):
                v = torch.cat([v.reshape(-1), v.new_zeros(1)])
            out.append(torch.linalg.vector_norm(v, ord, dtype=dtype))
        else:
            out.append(torch.linalg.vector_norm(t, ord, dtype=dtype))
    return out


# --- mixed precision and fused optimizers ---------------------------------------------------

@register_aten(aten._amp_foreach_non_finite_check_and_unscale_.default)
def _amp_unscale(grads, found_inf, inv_scale):
    """``GradScaler.unscale_``: each gradient times ``inv_scale`` in place, ``found_inf``
    set where one holds inf or NaN; a sparse gradient's stored values are all it has."""
    dense = [g for g in grads if not isinstance(g, SparseTensor)]
    if dense:
        torch._amp_foreach_non_finite_check_and_unscale_(dense, found_inf, inv_scale)
    for g in grads:
        if isinstance(g, SparseTensor):
            values = g._storage.values
            values.mul_(inv_scale.to(values.dtype))
            if not bool(torch.isfinite(values).all()):
                found_inf.fill_(1.0)


def _fused_refused(name: str):
    return refusal(NotImplementedError,
                   f"{name}: torch's fused optimizer kernels take dense parameters only; with "
                   f"sparse parameters construct the optimizer with fused=False (foreach=True, "
                   f"torch's default on CPU, updates the stored values)")


for _fused in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"):
    _packet = getattr(aten, _fused, None)
    if _packet is not None:
        for _ov in _packet.overloads():
            register_aten(getattr(_packet, _ov))(_fused_refused(_fused.strip("_")))

