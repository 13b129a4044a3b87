"""Ops that need the compiler's newer IR: elementwise functions (``Apply`` over the table in
``tensor_compiler/functions.py``), ``amax``/``amin`` (max/min reductions over stored entries
plus torch's implicit zeros) and ``softmax``/``log_softmax`` over stored entries, as
``torch.sparse.softmax`` defines them (an unstored entry counts as minus infinity).

Every op is one or a few generated kernels (a zero-preserving function of floating values:
torch's function on the stored values); none densifies a sparse operand. Each is
differentiable in the stored values (``scorch.gradients``: the derivative table for the
functions, ``fiber_ops`` for softmax and amax/amin). A function that
keeps 0 at 0 (relu, abs, sqrt, sin, tanh, sign, square, pow with a positive exponent, expm1,
log1p, erf, atan, asin, asinh, atanh, sinh, tan, deg2rad, rad2deg, the activations gelu, silu,
leaky_relu, elu, selu, celu, relu6, mish, hardtanh, softsign, tanhshrink, softshrink,
hardshrink, hardswish and threshold (with value 0), and the roundings floor, ceil, round,
trunc, frac) gives a sparse result on the operand's pattern; one that maps 0 elsewhere (exp,
cos, sigmoid, log, logsigmoid, softplus) gives a dense result, dense by nature (subject to the
dense-size limit of ``_dispatch``).
"""
from __future__ import annotations

import inspect
import numbers
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .._dispatch import check_dense_size, register
from ..compiler_access import compiler
from ..gradients import compute as differentiable_compute
from ..gradients import fiber_ops
from ..gradients import pattern as _pattern
from ..gradients.optimizer_step import values_level
from ..gradients.values import from_values, values_of, with_dtype
from ..level_storage import Storage
from ..tensor_type import SparseTensor, as_scorch, numpy_as_tensor, with_values
from .dims import checked_dim
from . import inner_level
from .in_place import in_place_functional
from . import reductions
from .reductions import _keepdim, _reduced_dims

__all__ = ["apply", "amax", "amin", "softmax", "log_softmax"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"

#: functions whose result is a float even for integer inputs (torch promotes them)
#: (relu6 and hardtanh keep integers, as torch's)
_FLOATING = {"sqrt", "sin", "tanh", "exp", "cos", "sigmoid", "log", "expm1", "log1p", "erf", "atan",
             "gelu", "silu", "leaky_relu", "elu", "softsign", "selu", "celu", "mish", "tanhshrink",
             "softshrink", "hardshrink", "asin", "asinh", "atanh", "sinh", "tan", "deg2rad",
             "rad2deg", "logsigmoid", "softplus", "hardswish"}


def _tc():
    return compiler()


def _wrap(r):
    return SparseTensor(r) if isinstance(r, Storage) else r


def _vars(rank: int) -> str:
    return _LETTERS[:rank]


#: functions an optimizer step applies to a sparse parameter's state (Adam's, RMSprop's,
#: Adagrad's ``sqrt``): inside a step they run on the stored values with torch's own
#: function (``optimizer_step.values_level``): 95 -> 4 us of Adam's step on a 20k-entry
#: weight, which went through the compiler's differentiable elementwise path
_STEP_FUNCTIONS = {"sqrt": torch.sqrt}


#: the functions' table entries by name, read on first use (the table's module is the
#: compiler package's, imported on first use)
_FUNCTION_TABLE: dict = {}


def _function(name: str):
    f = _FUNCTION_TABLE.get(name)
    if f is None:
        from ..tensor_compiler.functions import function
        f = _FUNCTION_TABLE[name] = function(name)
    return f


def apply(fn: str, t: SparseTensor, p: Optional[float] = None) -> torch.Tensor:
    """``fn`` elementwise on a sparse tensor: torch's function on the stored values where it
    keeps 0 at 0 (floating values), else one generated kernel (dense by nature, integers)."""
    step_fn = _STEP_FUNCTIONS.get(fn)
    if step_fn is not None and p is None and t.dtype.is_floating_point and values_level():
        return SparseTensor(t._storage.on_pattern(step_fn(t._storage.values)))
    f = _function(fn)
    if f.torch_op is not None and not t.dtype.is_floating_point:
        # integers, bool and complex (no kernel type): torch's own op on the stored values
        # gives torch's result type (``bool.square()`` is int64, ``sign`` bool) and torch's
        # error where it has none (``gelu`` of integers); complex where 0 does not stay 0
        # (``exp``): on the dense copy, dense by nature
        def op(x):
            return f.torch_op(x, f.param(p)) if f.parameter else f.torch_op(x)
        if f.preserves_zero(p):
            # the differentiable values: a complex tensor that requires grad stays in the
            # graph (torch's derivative of ``op`` on the stored values, as dense torch's)
            return from_values(t._storage, op(values_of(t)))
        if t.dtype.is_complex:
            check_dense_size(fn, t.shape, t.dtype)
            return op(t.to_dense())
    elif t.dtype.is_complex:
        raise TypeError(f"scorch: '{fn}' of a complex sparse tensor is not supported")
    if fn in _FLOATING and not t.dtype.is_floating_point:
        t = with_values(t, t._storage.values.to(torch.get_default_dtype()))
    if f.preserves_zero(p):
        if f.torch_op is not None and t.dtype.is_floating_point:
            # on the pattern, one op on the values: torch's own function (and its derivative
            # under autograd), as the shared-pattern runner computes it, without building and
            # keying an expression for the compiler on every call (25 -> 4 us on a small one)
            values = values_of(t)
            values = f.torch_op(values, f.param(p)) if f.parameter else f.torch_op(values)
            return from_values(t._storage, values)
    else:
        check_dense_size(fn, t.shape, t.dtype)   # dense by nature: say when it is big
    # the differentiable compute: f'(x) on x's pattern (scorch.gradients.derivatives)
    return _wrap(differentiable_compute(_assignment(fn, t.dim(), p), t))


def _assignment(fn: str, rank: int, p: Optional[float]):
    """``out = fn(T0)`` elementwise, one object per kind of call
    (``tensor_compiler.kept_assignment``: 25 -> 9 us for ``exp`` of a small matrix)."""
    def build():
        from ..tensor_compiler.index_notation import Apply
        tc = _tc()
        v = _vars(rank)
        return tc.Assignment(v, Apply(fn, tc.Access(0, v), p))
    return _tc().kept_assignment(("apply", fn, rank, p), build)


def _reduction(rank: int, dims: Tuple[int, ...], reduce: str, kept: Optional[Tuple[int, ...]] = None):
    """``out(kept) = reduce over dims of T0`` with the kept variables (in ``kept``'s order
    when given), one object per kind."""
    def build():
        tc = _tc()
        v = _vars(rank)
        order = kept if kept is not None else [d for d in range(rank) if d not in dims]
        keep = "".join(v[d] for d in order)
        return tc.Assignment(keep, tc.Access(0, v), reduce), keep
    return _tc().kept_assignment(("reduce", rank, dims, reduce, kept), build)


def _reduce_stored(t: SparseTensor, dims: Tuple[int, ...], reduce: str, dense: bool = True):
    """max/min over the stored entries along ``dims`` (an empty fiber: -inf / +inf); a
    dense result is computed in the order t stores the kept dimensions and read back in
    dimension order (``fiber_ops.kept_in_storage_order``)."""
    kept = fiber_ops.kept_in_storage_order(t._storage, dims) if dense else None
    assignment, keep = _reduction(t.dim(), tuple(dims), reduce, kept)
    out_format = "dense" if (dense and keep) else None
    r = _tc().compute(assignment, t, out_format=out_format)
    return fiber_ops.to_dimension_order(r, kept) if kept is not None else r


#: value types whose sums of ones ``_stored_count`` takes in t's own type, with the largest
#: count each holds exactly
_EXACT_COUNT = {torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.int32: 2 ** 31 - 1,
                torch.int64: 2 ** 63 - 1}


def _stored_count(t: SparseTensor, dims: Tuple[int, ...], extent: int) -> torch.Tensor:
    """How many entries each fiber along ``dims`` stores (dense, over the kept dims; in t's
    value type where that counts up to ``extent`` exactly; along CSR's rows ``pos.diff()``). ``sum stored(t)`` reads t's
    pattern alone: a tensor of int64 ones on it (67 MB at BigBird's example size, batch 32
    x 4 heads, n = 512) cost 25 ms of page faults before the count's kernel ran."""
    st = t._storage
    if tuple(dims) == (st.levels[-1].dim,) and inner_level.dense_compressed(st):
        return st.levels[1].pos.diff()      # CSR along its rows, CSC along its columns
    limit = _EXACT_COUNT.get(st.values.dtype)
    if limit is None or extent > limit:
        ones = with_values(t, torch.ones_like(t._storage.values, dtype=torch.int64))
        assignment, keep = _reduction(t.dim(), tuple(dims), "sum")
        return _tc().compute(assignment, ones, out_format="dense" if keep else None)
    kept = fiber_ops.kept_in_storage_order(t._storage, dims)

    def build():
        from ..tensor_compiler.index_notation import Apply
        tc = _tc()
        v = _vars(t.dim())
        return tc.Assignment("".join(v[d] for d in kept), Apply("stored", tc.Access(0, v)), "sum")
    assignment = _tc().kept_assignment(("stored count", t.dim(), tuple(dims), kept), build)
    r = _tc().compute(assignment, t, out_format="dense" if kept else None)
    return fiber_ops.to_dimension_order(r, kept)


def _extreme(name: str, reduce: str, t: SparseTensor, dim, keepdim: bool) -> torch.Tensor:
    if t.dtype == torch.bool:    # the compiler's values are numbers: any / all as 0 / 1
        as_bytes = with_values(t, t._storage.values.to(torch.uint8))
        return _extreme(name, reduce, as_bytes, dim, keepdim).to(torch.bool)
    dims = _reduced_dims(dim if dim != () else None, t.dim(), name)
    extent = 1
    for d in dims:
        extent *= t.shape[d]
    if extent == 0:
        raise IndexError(f"{name}(): Expected reduction dim {dims[0]} to have non-zero size.")

    def run(x: SparseTensor) -> torch.Tensor:
        if len(dims) == x.dim():      # over everything: torch's reduction of the values
            values = x._storage.values
            if values.numel() == 0:
                return torch.zeros((), dtype=values.dtype)
            m = values.amax() if reduce == "max" else values.amin()
            if values.numel() == extent:
                return m
            zero = torch.zeros((), dtype=m.dtype)
            return torch.maximum(m, zero) if reduce == "max" else torch.minimum(m, zero)
        m = _reduce_stored(x, dims, reduce)
        count = _stored_count(x, dims, extent)
        return _with_implicit_zeros(m, count, extent, reduce).contiguous()   # (m: in storage order)
    m = None if len(dims) == t.dim() else _sparse_extreme(t, dims, reduce, extent, run)
    if m is None:
        m = fiber_ops.extreme(t, dims, run)   # torch's backward: split among ties
    return _keepdim(m, dims) if keepdim else m


def _with_implicit_zeros(m: torch.Tensor, count: torch.Tensor, extent: int, reduce: str):
    """The fibers' max / min ``m`` of their stored entries with torch's implicit zeros
    counted: a fiber storing fewer than ``extent`` entries (``count``) also holds a 0."""
    zero = torch.zeros((), dtype=m.dtype)
    return torch.where(count < extent, torch.maximum(m, zero) if reduce == "max"
                       else torch.minimum(m, zero), m)


def _sparse_extreme(t: SparseTensor, dims: Tuple[int, ...], reduce: str, extent: int,
                    run) -> Optional[SparseTensor]:
    """amax / amin over ``dims`` as a sparse result where a kept dim is stored by a sparse
    level (DCSR, COO, CSF, CSR over its rows ...), on the pattern ``sum`` over ``dims`` gives
    (the fibers storing an entry): a fiber storing nothing has the value 0, an unstored
    entry's, so this is exact. Its values: where the kept positions are few
    (``fiber_ops.wide_groups``), the kernels' dense result ``run`` read at the pattern's
    entries (as ``sum``'s dense pass); past that, one slot per stored fiber, so the cost
    follows the stored entries (a 20M-row DCSR with 1000 entries: no 76 MiB vector). None
    where the kept dims are all dense levels (a dense result by design, as ``sum``'s: CSR
    along its rows) or blocked."""
    st = t._storage
    if st.format.block is not None or all(lv.kind.full for lv in st.levels if lv.dim not in dims):
        return None
    R = reductions.sum(SparseTensor(_pattern.pattern_ones(st, torch.float32)), dims)
    if not isinstance(R, SparseTensor):
        return None
    R = R._storage
    keep = [d for d in range(st.ndim) if d not in dims]
    if fiber_ops.wide_groups(st, keep):
        slot = _entry_slots(st, R, keep)
        return from_values(R, _SlotExtreme.apply(values_of(t), slot, R.nnz, extent, reduce))
    dense = fiber_ops.extreme(t, dims, run)   # differentiable: the gather below too
    at = fiber_ops.fiber_numbers(_pattern._convert().coords(R), R.shape, range(R.ndim))
    return from_values(R, dense.reshape(-1)[at])


def _entry_slots(st: Storage, R: Storage, keep) -> torch.Tensor:
    """Each stored entry of ``st``'s position in ``R`` (over the dims ``keep``, storing every
    fiber an entry falls in, in the order of its keys): O(nnz) where the entries come in
    key order (the kept dims are ``st``'s outer levels: DCSR's rows), else one sort."""
    coords = _pattern._convert().coords(st)[keep]
    keys = _pattern._linear_keys(coords, R.shape, R.format.mode_order)
    r_keys = _pattern._linear_keys(_pattern._convert().coords(R), R.shape, R.format.mode_order)
    if keys.numel() == 0:
        return keys
    if bool((keys[1:] >= keys[:-1]).all()):
        starts = torch.ones(keys.shape, dtype=torch.bool)
        torch.ne(keys[1:], keys[:-1], out=starts[1:])
        if torch.equal(keys[starts], r_keys):
            return torch.cumsum(starts, 0) - 1
    else:
        unique, slot = torch.unique(keys, return_inverse=True)
        if torch.equal(unique, r_keys):
            return slot
    return _pattern.positions_in_pattern(R, coords)[0]   # (R in another order)


class _SlotExtreme(torch.autograd.Function):
    """The max / min of the stored ``values`` grouped by ``slot`` (each entry's position in
    the result, every slot holding one at least), implicit zeros counted; the backward is
    torch's (``fiber_ops._Extreme``'s, over slots): the gradient split evenly among the
    entries equal to the extreme and, where it is 0, the fiber's implicit zeros."""

    @staticmethod
    def forward(ctx, values, slot, slots: int, extent: int, reduce: str):
        m = values.new_zeros(slots).scatter_reduce_(
            0, slot, values, "amax" if reduce == "max" else "amin", include_self=False)
        stored = torch.bincount(slot, minlength=slots)
        m = _with_implicit_zeros(m, stored, extent, reduce)
        ctx.extent = extent
        ctx.save_for_backward(values, slot, stored, m)
        return m

    @staticmethod
    def backward(ctx, g):
        values, slot, stored, m = ctx.saved_tensors
        tie = values == m[slot]
        ties = torch.zeros_like(m).index_add_(0, slot, tie.to(m.dtype))
        count = ties + torch.where(m == 0, ctx.extent - stored, 0).to(m.dtype)
        share = (g / count.clamp(min=1))[slot]
        return torch.where(tie, share, torch.zeros((), dtype=share.dtype)), None, None, None, None


def amax(t: SparseTensor, dim=(), keepdim: bool = False) -> torch.Tensor:
    return _extreme("amax", "max", t, dim, keepdim)


def amin(t: SparseTensor, dim=(), keepdim: bool = False) -> torch.Tensor:
    return _extreme("amin", "min", t, dim, keepdim)


def _softmax(t: SparseTensor, dim: int, log: bool, dtype: Optional[torch.dtype]) -> SparseTensor:
    """Over the stored entries of each fiber along ``dim``: one max kernel, one kernel for
    the exponentials on the pattern with their sums, one for the quotient; an empty fiber
    has no entries (no NaN)."""
    dim = checked_dim(dim, t.dim(), "softmax")
    if dtype is not None:
        t = with_dtype(t, dtype)   # differentiable cast
    if not t.dtype.is_floating_point:     # (torch: "softmax" not implemented for 'Long')
        what = f"dtype={dtype} is not" if dtype is not None else f"got {t.dtype}, expected"
        raise RuntimeError(f"{'log_' if log else ''}softmax(): {what} a floating point type")
    if fiber_ops.wide_fibers(t._storage, dim):   # one slot per stored fiber, not a dense array
        return fiber_ops.softmax(t, dim, log, lambda x: fiber_ops.softmax_by_groups(x, dim, log))
    return fiber_ops.softmax(t, dim, log, lambda x: _softmax_kernels(x, dim, log))


def _softmax_assignments(rank: int, dim: int, log: bool, kept: Tuple[int, ...]):
    """The exponentials on the pattern, their sums and the result, over T0 = x,
    T1 = the fibers' max (T2 = the sums, for log): one set of objects per kind of call.
    ``stored(x)`` keeps each on x's pattern, one sparse operand: the kernel writes the
    values at x's positions on its arrays (a tensor of ones on the pattern, co-iterated with
    x, made the result an assembled one: 75 of 80 ms at BigBird's n = 4096)."""
    def build():
        from ..tensor_compiler.index_notation import Apply, Div
        tc = _tc()
        v = _vars(rank)
        keep = "".join(c for d, c in enumerate(v) if d != dim)
        A, M = tc.Access(0, v), tc.Access(1, keep)
        P = Apply("stored", A)
        exps = tc.Assignment(v, P * Apply("exp", A - M))
        # the sums laid out as x stores the kept dimensions (fiber_ops.kept_in_storage_order)
        sums = tc.Assignment("".join(v[d] for d in kept), tc.Access(0, v))
        if log:
            # in the order written (Assignment.exact): x - m first, exact where x is near m
            result = tc.Assignment(v, P * (A - M - Apply("log", tc.Access(2, keep))), exact=True)
        else:
            result = tc.Assignment(v, Div(tc.Access(0, v), tc.Access(1, keep)))
        return exps, sums, result, keep
    return _tc().kept_assignment(("softmax", rank, dim, log, kept), build)


def _softmax_kernels(t: SparseTensor, dim: int, log: bool) -> SparseTensor:
    tc = _tc()
    kept = fiber_ops.kept_in_storage_order(t._storage, (dim,))
    exps, sums, result, keep = _softmax_assignments(t.dim(), dim, log, kept)
    m = _reduce_stored(t, (dim,), "max")                       # -inf on empty fibers
    e = _wrap(tc.compute(exps, t, m))
    s = fiber_ops.to_dimension_order(tc.compute(sums, e, out_format="dense" if keep else None), kept)
    if not log:
        return _wrap(tc.compute(result, e, s))
    return _wrap(tc.compute(result, t, m, s))


def softmax(t: SparseTensor, dim: int, dtype: Optional[torch.dtype] = None) -> SparseTensor:
    return _softmax(t, dim, False, dtype)


def log_softmax(t: SparseTensor, dim: int, dtype: Optional[torch.dtype] = None) -> SparseTensor:
    return _softmax(t, dim, True, dtype)


# --- registration -------------------------------------------------------------------------

def _sparse(x) -> Optional[SparseTensor]:
    x = as_scorch(x)
    return x if isinstance(x, SparseTensor) else None


def _parameters(fn) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):       # a builtin without a signature
        return ()


def _unary(fn: str, *torch_functions, **params):
    """Register ``fn`` for ``torch_functions``; ``params``: the arguments after the input,
    in torch's order, as name -> (default, free). A free one becomes the kernel's parameter
    (leaky_relu's slope); of the others only the default is supported. Anything else
    (``out=``, another value) goes to the fallback; ``inplace=True`` runs torch's in-place
    op on the stored values (``in_place``)."""
    with_flag = [f for f in torch_functions if "inplace" in _parameters(f)]

    @register(*torch_functions)
    def handler(x, *args, **kwargs):
        if kwargs.get("inplace") and with_flag and isinstance(x, SparseTensor):
            return in_place_functional(fn, with_flag[0], x, args, kwargs)
        t = _sparse(x)
        if (t is None or len(args) > len(params) or kwargs.get("out") is not None
                or kwargs.get("inplace")):
            return NotImplemented
        kwargs = {**dict(zip(params, args)), **kwargs}      # positional parameters, in order
        p = None
        for name, value in kwargs.items():
            if name in ("out", "inplace"):
                continue
            if name not in params:
                return NotImplemented
            default, free = params[name]
            if free:
                if not isinstance(value, numbers.Real) or isinstance(value, bool):
                    return NotImplemented
                p = float(value)
            elif value != default:       # not the kernel's: torch's function on the values
                return on_stored_values(torch_functions[0], t, kwargs)
        return apply(fn, t, p)
    return handler


def on_stored_values(torch_function, t: SparseTensor, kwargs) -> torch.Tensor:
    """``torch_function(t, **kwargs)`` as torch's op on the stored values, where it keeps 0
    at 0 (``gelu(approximate="tanh")``, ``hardtanh(-2, 3)``, ``round(decimals=2)``);
    otherwise dense by nature (``softplus(beta=2)``): torch's op on the dense copy, under the
    dense-size limit."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "inplace")}
    with torch.no_grad():
        zero = torch_function(torch.zeros(1, dtype=t.dtype), **kwargs)
    if not bool((zero == 0).all()):
        check_dense_size(getattr(torch_function, "__name__", "op"), t.shape, zero.dtype)
        return torch_function(t.to_dense(), **kwargs)
    return from_values(t._storage, torch_function(values_of(t), **kwargs))


for _fn, _torch_fns in {
        "relu": (torch.relu, torch.Tensor.relu, F.relu),
        "abs": (torch.abs, torch.Tensor.abs, torch.absolute, torch.Tensor.absolute),
        "sqrt": (torch.sqrt, torch.Tensor.sqrt),
        "sin": (torch.sin, torch.Tensor.sin),
        "tanh": (torch.tanh, torch.Tensor.tanh, F.tanh),
        "sign": (torch.sign, torch.Tensor.sign),
        "square": (torch.square, torch.Tensor.square),
        "exp": (torch.exp, torch.Tensor.exp),
        "cos": (torch.cos, torch.Tensor.cos),
        "sigmoid": (torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid),
        "log": (torch.log, torch.Tensor.log),
        "expm1": (torch.expm1, torch.Tensor.expm1, torch.special.expm1),
        "log1p": (torch.log1p, torch.Tensor.log1p, torch.special.log1p),
        "erf": (torch.erf, torch.Tensor.erf, torch.special.erf),
        "atan": (torch.atan, torch.Tensor.atan, torch.arctan, torch.Tensor.arctan),
        "silu": (F.silu,),
        "softsign": (F.softsign,),
        "floor": (torch.floor, torch.Tensor.floor),
        "ceil": (torch.ceil, torch.Tensor.ceil),
        "trunc": (torch.trunc, torch.Tensor.trunc, torch.fix, torch.Tensor.fix),
        "frac": (torch.frac, torch.Tensor.frac),
        "relu6": (F.relu6,), "selu": (F.selu, torch.selu), "mish": (F.mish,),
        "tanhshrink": (F.tanhshrink,), "logsigmoid": (F.logsigmoid,),
        "asin": (torch.asin, torch.Tensor.asin, torch.arcsin, torch.Tensor.arcsin),
        "asinh": (torch.asinh, torch.Tensor.asinh, torch.arcsinh, torch.Tensor.arcsinh),
        "atanh": (torch.atanh, torch.Tensor.atanh, torch.arctanh, torch.Tensor.arctanh),
        "sinh": (torch.sinh, torch.Tensor.sinh), "tan": (torch.tan, torch.Tensor.tan),
        "deg2rad": (torch.deg2rad, torch.Tensor.deg2rad),
        "rad2deg": (torch.rad2deg, torch.Tensor.rad2deg)}.items():
    _unary(_fn, *_torch_fns)
_unary("celu", F.celu, torch.celu, alpha=(1.0, True))
_unary("softshrink", F.softshrink, lambd=(0.5, True))
_unary("hardshrink", F.hardshrink, torch.hardshrink, torch.Tensor.hardshrink, lambd=(0.5, True))
_unary("softplus", F.softplus, beta=(1.0, False), threshold=(20.0, False))
_unary("gelu", F.gelu, approximate=("none", False))
_unary("leaky_relu", F.leaky_relu, negative_slope=(0.01, True))
_unary("elu", F.elu, alpha=(1.0, True))
_unary("hardtanh", F.hardtanh, min_val=(-1.0, False), max_val=(1.0, False))
_unary("round", torch.round, torch.Tensor.round, decimals=(0, False))
_unary("hardswish", F.hardswish)
# F.threshold(x, threshold, value): sparse with value 0 (another value moves 0 unless the
# threshold is negative: two parameters, the fallback's)
_unary("threshold", F.threshold, torch.threshold, threshold=(0.0, True), value=(0.0, False))


@register(torch.sgn, torch.Tensor.sgn)
def _sgn(x, *, out=None):
    t = _sparse(x)   # sgn is sign for real values (x / |x| for complex: the fallback's)
    if t is None or out is not None or t.dtype.is_complex:
        return NotImplemented
    return apply("sign", t)


@register(torch.pow, torch.Tensor.pow, torch.Tensor.__pow__)
def _pow(x, exponent, *, out=None):
    exponent = numpy_as_tensor(exponent)   # as torch's parser reads it (A ** nd)
    t = _sparse(x)
    if out is None and isinstance(as_scorch(exponent), SparseTensor):
        # 0 ** 0 is 1 wherever neither stores an entry (a number base: b ** 0): dense by nature
        from .dense_by_nature import run_densified
        return run_densified(torch.pow, as_scorch(x), as_scorch(exponent))
    if (isinstance(exponent, torch.Tensor) and type(exponent) is torch.Tensor and exponent.dim() == 0
            and not exponent.requires_grad and t is not None
            and (t.dtype.is_floating_point or not exponent.dtype.is_floating_point)
            and exponent.dtype != torch.bool
            and torch.result_type(t._storage.values, exponent)
            == torch.result_type(t._storage.values, exponent.item())
            and not (exponent.item() < 0 and not t.dtype.is_floating_point)):
        # a 0-d exponent as a number where that gives torch's result type (``bool **
        # tensor(3, uint8)`` is uint8, ``** 3`` int64) and value (an integer base to a
        # negative 0-d tensor power is computed, to a negative number it raises)
        exponent = exponent.item()
    if (t is not None and out is None and isinstance(exponent, torch.Tensor)
            and not isinstance(exponent, SparseTensor) and exponent.dtype != torch.bool):
        # a dense exponent: torch's pow on the stored values where 0 ** e is 0 at every e
        # (e > 0), else dense by nature
        from . import elementwise
        return elementwise.on_stored_values(torch.pow, t, exponent, strict_zero=True)
    if t is None or out is not None or not isinstance(exponent, numbers.Real) or isinstance(exponent, bool):
        return NotImplemented
    if exponent == 1:
        return t
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        # torch's result type: ``int ** 0.5`` is float, ``bool ** 2`` int64 (the exponent's
        # own type counts); ``x ** 0`` is 1 everywhere: dense by nature
        if exponent > 0:
            return from_values(t._storage, torch.pow(t._storage.values, exponent))
        from .dense_by_nature import run_densified
        return run_densified(torch.pow, t, exponent)
    return apply("pow", t, float(exponent))


@register(torch.amax, torch.Tensor.amax)
def _amax(x, dim=(), keepdim=False, *, out=None):
    t = _sparse(x)
    return NotImplemented if t is None or out is not None else amax(t, dim, keepdim)


@register(torch.amin, torch.Tensor.amin)
def _amin(x, dim=(), keepdim=False, *, out=None):
    t = _sparse(x)
    return NotImplemented if t is None or out is not None else amin(t, dim, keepdim)


def _softmax_handler(log: bool):
    def handler(x, dim=None, dtype=None, *args, **kwargs):
        t = _sparse(x)
        if t is None:
            return NotImplemented
        if dim is None:
            raise TypeError("softmax(): a sparse tensor needs dim (which fibers to normalize)")
        dtype = kwargs.get("dtype", dtype)
        return (log_softmax if log else softmax)(t, dim, dtype if isinstance(dtype, torch.dtype) else None)
    return handler


register(torch.softmax, torch.Tensor.softmax, F.softmax, torch.sparse.softmax,
         torch._softmax)(_softmax_handler(False))
register(torch.log_softmax, torch.Tensor.log_softmax, F.log_softmax, torch.sparse.log_softmax,
         torch._log_softmax)(_softmax_handler(True))


@register(F.softmin)
def _softmin(x, dim=None, _stacklevel=3, dtype=None):
    """softmax of ``-x`` over the stored entries (an unstored entry takes no part, as in the
    sparse softmax)."""
    t = _sparse(x)
    if t is None:
        return NotImplemented
    if dim is None:
        raise TypeError("softmin(): a sparse tensor needs dim (which fibers to normalize)")
    return softmax(-t, dim, dtype)

