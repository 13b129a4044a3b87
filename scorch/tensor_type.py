"""``SparseTensor``: a torch.Tensor subclass whose data lives in level storage.

It is a *wrapper* subclass: the torch side holds only metadata (shape, dtype, device,
requires_grad), and ``_storage`` holds the level arrays. Calls reach scorch in two ways:

* ``__torch_function__`` sees every torch API call with a SparseTensor among its arguments
  (``torch.einsum``, ``torch.Tensor.to_dense``, operators ...). Functions scorch supports
  sparsely are looked up in ``scorch._dispatch`` (registered by ``scorch.ops``); everything
  else falls through to torch.
* ``__torch_dispatch__`` sees the ATen ops that reach the dispatcher. Storage-level ops
  (detach, alias, clone, dtype casts, copy_: ``scorch.aten_ops``) are done on the arrays; any other op runs on a
  dense copy with a one-time warning naming it, so unported code keeps working and says why
  it is slow. In-place ops other than ``copy_`` raise: a sparse tensor cannot silently
  become dense.
"""
from __future__ import annotations

import copy
import numbers
import sys
from typing import Optional, Sequence

import torch

from . import _dispatch, saving
from .formats import Format, FormatLike, LevelKind, as_format
from .level_storage import Level, Storage
from .tensor_cache import version

__all__ = ["SparseTensor"]


def _convert_module():
    from . import conversion
    return conversion


_NO_SUBCLASS_DISPATCH = torch._C.DisableTorchFunctionSubclass
_TB = torch._C.TensorBase
#: the innermost ``torch.func`` transform being run, or None (nearly always): see
#: ``refuse_transform``
_functorch_stack = torch._C._functorch.peek_interpreter_stack
#: some torch function mode is active, torch.jit.trace runs (nearly never): see
#: ``refuse_foreign_context``
_tf_mode_on = torch._C._is_torch_function_mode_enabled
_jit_tracing = torch._C._get_tracing_state


def _slot_property(slot, settable: bool = False) -> property:
    """A property reading (and writing) torch's own ``slot`` of the tensor with the
    subclass's ``__torch_function__`` off (see ``SparseTensor``'s metadata)."""
    get, put = slot.__get__, slot.__set__

    def read(self):
        with _NO_SUBCLASS_DISPATCH():
            return get(self)

    def write(self, value) -> None:
        with _NO_SUBCLASS_DISPATCH():
            put(self, value)
    return property(read, write if settable else None, doc=slot.__doc__)


class SparseTensor(torch.Tensor):
    """A sparse tensor in any level format (see ``scorch.Format``)."""

    _storage: Storage

    @staticmethod
    def __new__(cls, storage: Storage, requires_grad: bool = False) -> "SparseTensor":
        if not isinstance(storage, Storage):
            raise TypeError(
                "SparseTensor(...) wraps a scorch Storage; build sparse tensors with "
                "scorch.sparse_tensor(x, format=...)")
        r = torch.Tensor._make_wrapper_subclass(
            cls, storage.shape, dtype=storage.dtype, device=torch.device("cpu"),
            requires_grad=requires_grad)
        r._storage = storage
        return r

    def __init__(self, storage: Storage, requires_grad: bool = False) -> None:
        pass

    @classmethod
    def _from_storage(cls, storage: Storage, requires_grad: bool = False) -> "SparseTensor":
        return cls(storage, requires_grad)

    # --- torch's metadata, read without the subclass dispatch -------------------------------
    # torch sends a subclass's reads of ``dtype``, ``shape``, ``dim()`` ... through
    # ``__torch_function__``: ~1 us each, and an op reads them many times (``relu`` of a small
    # matrix spent a third of its time there). These read torch's own slots with that
    # dispatch off: 0.2 us.
    dtype = _slot_property(_TB.dtype)
    shape = _slot_property(_TB.shape)
    ndim = _slot_property(_TB.ndim)
    device = _slot_property(_TB.device)
    layout = _slot_property(_TB.layout)
    requires_grad = _slot_property(_TB.requires_grad, settable=True)

    def dim(self) -> int:
        with _NO_SUBCLASS_DISPATCH():
            return _TB.dim(self)

    def size(self, dim=None):
        with _NO_SUBCLASS_DISPATCH():
            return _TB.size(self) if dim is None else _TB.size(self, dim)

    # --- sparse-specific attributes -------------------------------------------------------
    @property
    def format(self) -> Format:
        return self._storage.format

    @property
    def nnz(self) -> int:
        """Number of stored entries (stored zeros and dense-level fill included)."""
        return self._storage.nnz

    @property
    def index_dtype(self) -> torch.dtype:
        return self._storage.index_dtype

    @property
    def is_sparse(self) -> bool:
        """torch's flag; True for every scorch format with a sparse level, except for a
        gradient on its tensor's own pattern: that is the (dense) gradient of the stored
        values, which optimizers that refuse torch's sparse gradients (Adam) can take."""
        return (self._storage.format.is_sparse and not self.__dict__.get("_values_grad", False)
                and not _is_compiling())

    def values(self) -> torch.Tensor:
        """Stored values in storage order, sharing memory with the tensor; differentiable
        when the tensor requires grad. 1-d, but for torch's hybrid layouts (trailing dense
        levels, ``qqd`` / ``dcd``): (index tuples, *dense dims), as torch's."""
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(SparseTensor.values)
        st = self._storage
        vals = _AUTOGRAD["values"](self) if _grad_enabled() and _any_requires_grad(self) else st.values
        return _convert_module().hybrid_values(st, vals)

    def indices(self) -> torch.Tensor:
        """(sparse_dim, _nnz) int64 coordinates of ``values()``, as torch's COO ``indices()``
        (a hybrid's dense dims have none: ``conversion.hybrid_indices``): built
        once per pattern and kept with it (a loop calling ``A.indices()`` had rebuilt them
        each time, ~1 ms for 1M entries, where torch's is a view), rebuilt if the caller
        wrote into the returned tensor."""
        if _is_compiling():
            return _UNDER_COMPILE[0](SparseTensor.indices, (self,), {})
        st = self._storage
        kept = st._coords
        if kept is not None and version(kept[0]) == kept[1]:
            return kept[0]
        coords = _convert_module().hybrid_indices(st)
        st._coords = (coords, version(coords))
        return coords

    def to_dense(self, dtype: Optional[torch.dtype] = None, *, masked_grad=None) -> torch.Tensor:
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(SparseTensor.to_dense)
        if _is_compiling():
            out = _UNDER_COMPILE[0](SparseTensor.to_dense, (self,), {})
        elif _grad_enabled() and _any_requires_grad(self):
            out = _AUTOGRAD["to_dense"](self)
        else:
            out = _convert_module().to_dense(self._storage)
        return out if dtype is None else out.to(dtype)

    def to_format(self, format: FormatLike) -> "SparseTensor":
        """The same tensor in another format, converted without passing through dense."""
        fmt = as_format(format, self.dim())
        if fmt == self._storage.format:
            return self
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(SparseTensor.to_format)
        if _is_compiling():
            return _UNDER_COMPILE[0](SparseTensor.to_format, (self, fmt), {})
        if _grad_enabled() and _any_requires_grad(self):
            return _AUTOGRAD["to_format"](self, fmt)   # differentiable: a permutation of values
        return SparseTensor(_convert_module().convert(self._storage, fmt))

    def to_torch(self) -> torch.Tensor:
        """The torch layout that matches the format (COO, CSR, CSC, BSR, BSC); arrays are
        shared where torch's layout agrees with the storage; differentiable."""
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(SparseTensor.to_torch)
        if _is_compiling():
            return _UNDER_COMPILE[0](SparseTensor.to_torch, (self,), {})
        if _grad_enabled() and _any_requires_grad(self):
            return _AUTOGRAD["to_torch"](self)
        from . import interop
        return interop.to_torch(self._storage)

    def to_scipy(self, kind: str = "array"):
        """scipy.sparse array (``kind="matrix"`` for the matrix classes), sharing arrays."""
        if _is_compiling():
            return _UNDER_COMPILE[0](SparseTensor.to_scipy, (self, kind), {})
        if self.requires_grad:   # as torch's numpy(): scipy holds no graph
            raise RuntimeError("Can't call to_scipy() on a sparse tensor that requires grad. "
                               "Use tensor.detach().to_scipy() instead.")
        from . import interop
        return interop.to_scipy(self._storage, kind)

    def eliminate_zeros(self) -> "SparseTensor":
        """A new tensor without the stored entries equal to zero (out of place, unlike
        scipy's; ``t`` is unchanged): ``scorch.eliminate_zeros``, which says what is kept."""
        return _ELIMINATE_ZEROS[0](self)

    def __repr__(self, *, tensor_contents=None) -> str:
        st = self._storage
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"SparseTensor(shape={tuple(st.shape)}, format={st.format}, nnz={st.nnz}, "
                f"dtype={st.dtype}{grad})")

    def __reduce_ex__(self, protocol):
        st = self._storage
        arrays = [(lv.kind.letter, lv.dim, lv.size, lv.pos, lv.crd, lv.block_inner)
                  for lv in st.levels]
        extra = _user_state(self)
        values = st.values
        if values.untyped_storage().nbytes() > values.numel() * values.element_size() and \
                not values.is_shared():
            values = values.clone()     # rows viewing a matrix's values: only theirs are written
        return (_load, (st.format, st.shape, arrays, values, self.requires_grad)
                + ((extra,) if extra else ()))

    def __deepcopy__(self, memo):
        """As torch's: the arrays copied through ``memo`` (a tensor and its views, ``S`` and
        ``S.t()``, still share their copies), the gradient and the attributes (a
        Parameter's mark) with them."""
        got = memo.get(id(self))
        if got is not None:
            return got
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) "
                               "support the deepcopy protocol at the moment.")

        def copied(a):
            return None if a is None else copy.deepcopy(a.detach(), memo)
        st = self._storage
        levels = [Level(lv.kind, lv.dim, lv.size, copied(lv.pos), copied(lv.crd),
                        lv.block_inner, lv.ordered) for lv in st.levels]
        out = SparseTensor(Storage(st.format, st.shape, levels, copied(st.values),
                                   st.index_dtype), self.requires_grad)
        memo[id(self)] = out
        for key, value in _user_state(self).items():
            out.__dict__[key] = copy.deepcopy(value, memo)
        if self.is_leaf and self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        return out

    # Traceable-wrapper-subclass protocol: lets nn.Module.to()/.double() swap parameters and
    # lets torch utilities see the arrays inside. Inner tensors are named by level.
    def __tensor_flatten__(self):
        st = self._storage
        flat = self.__dict__.get("_flat")   # asked on every call of a compiled graph (guards)
        gradient = self.__dict__.get("_values_grad", False)   # see is_sparse
        if flat is not None and flat[0] is st and flat[2][3] == gradient:
            return flat[1], flat[2]
        names = []
        for k, lv in enumerate(st.levels):
            if lv.pos is not None:
                names.append(f"_level{k}_pos")
            if lv.crd is not None:
                names.append(f"_level{k}_crd")
        names.append("_level_values")
        meta = (st.format, st.shape, tuple((lv.kind.letter, lv.dim, lv.size, lv.block_inner)
                                           for lv in st.levels), gradient)
        self._flat = (st, names, meta)
        return names, meta

    def _stable_hash_for_caching(self) -> str:
        """torch's on-disk caches of compiled graphs key a graph with a SparseTensor input
        by this: its static description (what ``__tensor_flatten__`` says), its arrays'
        dtypes, shapes and strides, and the version of the operators it is traced into
        (``_CACHE_SALT``, set by ``scorch.library_ops``): an upgrade never replays a stale
        graph."""
        names, meta = self.__tensor_flatten__()
        st = self._storage
        arrays = tuple((str(a.dtype), tuple(a.shape), a.stride()) for a in st.arrays())
        return repr((_CACHE_SALT[0], repr(meta), tuple(self.shape), self.requires_grad, arrays))

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """A compiled backward guessed its tangent's metadata when tracing; eager autograd
        hands the gradient of a returned sparse result flagged as a gradient on its pattern
        (``_values_grad``), which the guess cannot know: the same arrays with the guessed
        flag. Any other difference (format, levels) is not a tangent it can take."""
        if expected_type not in (None, SparseTensor):
            return None
        meta = self.__tensor_flatten__()[1]
        if tuple(meta[:3]) != tuple(expected_metadata[:3]):
            return None
        out = SparseTensor(self._storage)
        if expected_metadata[3]:
            out._values_grad = True
        return out

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        fmt, shape, level_meta, gradient = meta
        arrays = [(k, d, s, inner.get(f"_level{i}_pos"), inner.get(f"_level{i}_crd"), b)
                  for i, (k, d, s, b) in enumerate(level_meta)]
        out = _rebuild(fmt, shape, arrays, inner["_level_values"], False)
        if gradient:   # a compiled backward's gradient on its tensor's pattern stays one
            out._values_grad = True
        return out

    def __getattr__(self, name: str):
        if name == "_storage":
            pending = self.__dict__.get("_pending")
            if pending is not None:
                # a deferred elementwise result (scorch.sparse_ops.fusion): computed on the
                # first read of its storage, the one door every reader goes through
                st = self._storage = pending.materialize()
                del self._pending
                return st
        if name.startswith("_level"):
            st = self._storage if "_pending" in self.__dict__ else self.__dict__.get("_storage")
            if st is not None:
                if name == "_level_values":
                    return st.values
                k, _, which = name[len("_level"):].partition("_")
                if k.isdigit() and which in ("pos", "crd"):
                    return getattr(st.levels[int(k)], which)
        raise AttributeError(f"'SparseTensor' object has no attribute {name!r}")

    # --- dispatch ---------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(func)
        if _FWAD._current_level >= 0:
            _refuse_dual(func, args, kwargs)
        handler = _dispatch.lookup(func)
        if handler is not None:
            if _is_compiling():
                if func in CHECKS_ONLY:   # torch's own call, as the handler would leave it
                    with torch._C.DisableTorchFunctionSubclass():
                        return func(*args, **kwargs)
                return _UNDER_COMPILE[0](func, args, kwargs)
            if kwargs.get("out") is not None:
                return _into_out(func, handler, args, kwargs)
            result = _run_handler(func, handler, args, kwargs)
            if result is not NotImplemented:
                return result
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    # ``A @ X``, ``X @ A`` and ``A.mm(X)`` straight to their handlers: torch's Python-level
    # ``Tensor.__matmul__`` and its ``__torch_function__`` dispatch cost ~1.5 us, as much as
    # a tenth of a small SpMM. Python asks a subclass's reflected method first, so
    # ``dense @ sparse`` comes here too. A handler that declines leaves the call to torch.
    def __matmul__(self, other):
        spmm = _SPMM[0]
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(torch.Tensor.__matmul__)
        if _FWAD._current_level >= 0:
            _refuse_dual(torch.Tensor.__matmul__, (self, other), {})
        if spmm is not None and type(other) is torch.Tensor:   # the hot path, inline
            try:
                result = spmm(self, other, 1 if other.ndim == 1 else 2)   # SpMV or SpMM
            except RuntimeError as e:
                _refuse_under_functorch(e)
                _refuse_nested(torch.Tensor.__matmul__, (self, other))
                raise
            if result is not None:
                return result
        if not isinstance(other, torch.Tensor):
            other = numpy_as_tensor(other)   # (torch's parser takes a numpy array)
            if not isinstance(other, torch.Tensor):
                return NotImplemented      # Python's TypeError, as for a dense tensor
        return _direct(torch.Tensor.__matmul__, self, other)

    def __rmatmul__(self, other):
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        return _direct(torch.Tensor.__rmatmul__, self, other)

    def mm(self, mat2):
        if not isinstance(mat2, torch.Tensor):
            raise TypeError(f"mm(): argument 'mat2' must be Tensor, not {type(mat2).__name__}")
        return _matmul_direct(torch.Tensor.mm, self, mat2)

    def sum(self, *args, **kwargs):
        return _direct(torch.Tensor.sum, self, *args, **kwargs)

    # Elementwise ops that keep the pattern (a scalar factor or divisor, negation, two
    # operands sharing their index arrays, as ``A`` and ``A * 2`` do): new values over the
    # same level arrays, without the op layer's and the compiler's per-call work (tens of
    # us, more than scipy.sparse takes for a small matrix). Anything else, and anything that
    # autograd records, goes to the registered handlers as before.
    def __mul__(self, other):
        r = _scalar_op(torch.mul, self, other)
        return _or_handler(r if r is not None else _pattern_op(torch.mul, self, other),
                           torch.Tensor.__mul__, self, other)

    def __rmul__(self, other):
        return _or_handler(_scalar_op(torch.mul, self, other), torch.Tensor.__rmul__, self, other)

    def __truediv__(self, other):
        return _or_handler(_scalar_op(torch.div, self, other), torch.Tensor.__truediv__, self, other)

    def __add__(self, other):
        return _or_handler(_pattern_op(torch.add, self, other), torch.Tensor.__add__, self, other)

    def __sub__(self, other):
        return _or_handler(_pattern_op(torch.sub, self, other), torch.Tensor.__sub__, self, other)

    def __neg__(self):
        if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
            refuse_foreign(torch.neg)
        if (_grad_enabled() and _any_requires_grad(self)) or _deferred(self):
            return _direct(torch.Tensor.__neg__, self)
        return carry_grad_flag(self, with_values(self, torch.neg(self._storage.values)))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func not in _GRAD_SAFE and _tf_enabled() and _graph_task() == -1 \
                and func not in _dispatch._ATEN_HANDLERS and func not in _NOT_FROM_TRANSFORMS:
            # An op bound for the dense fallback with torch functions on, outside a
            # backward, did not come through ``__torch_function__`` (whose fall-through
            # turns them off): a tensor wrapping this one passed it down, which is what
            # torch.func's grad / vjp / jacrev do with a sparse argument (their interpreter
            # is popped by now). It would give a dense, off-pattern gradient: refused. (A
            # few methods skip ``__torch_function__`` on their own: ``set_``; TorchScript
            # calls no ``__torch_function__`` at all.)
            refuse_transform(func, scripted=True)
        if (func not in _GRAD_SAFE and func.overloadpacket not in _NO_GRADIENT
                and _grad_enabled() and _any_requires_grad(*args)
                and not (func is _aten.copy_.default and _sparse_to_sparse(args))):
            # autograd recorded torch's derivative formula for this op, which would hand a
            # sparse input a dense gradient: no silent wrong graph
            raise RuntimeError(
                f"scorch: '{func.overloadpacket.__name__}' on a sparse tensor that requires "
                f"grad has no sparse backward; wrap it in torch.no_grad(), .detach() the "
                f"input, or use a differentiable scorch op (einsum, to_dense, values)")
        if _is_compiling() and func not in _dispatch._ATEN_HANDLERS:
            # no dense fallback on fake arrays: a graph break, and the op runs eagerly
            _unsupported_under_compile(func, args, kwargs)
        return _dispatch.aten_fallback(cls, func, args, kwargs or {})


def _into_out(func, handler, args, kwargs):
    """``torch.f(..., out=o)`` with a sparse operand: the result computed as without ``out``
    (the handler, else torch's own path), then written into ``o`` as torch's ``out=`` does:
    cast where torch's casting rules allow, a dense ``o`` resized to the result's shape (with
    torch's warning when it held elements), a sparse ``o`` given the values in its format."""
    out = kwargs["out"]
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    name = getattr(func, "__name__", str(func))
    if _grad_enabled() and _any_requires_grad(*args, *rest.values(), *_flat(out)):
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic "
                           f"differentiation, but one of the arguments requires grad.")
    result = handler(*args, **rest)
    if result is NotImplemented:
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **rest)
    if isinstance(out, (tuple, list)):
        if not isinstance(result, (tuple, list)) or len(result) != len(out):
            raise RuntimeError(f"{name}(): out= holds {len(out)} tensors for a result of "
                               f"{len(result) if isinstance(result, (tuple, list)) else 1}")
        for o, r in zip(out, result):
            _write_out(name, o, r)
        return out if type(result) in (tuple, list) else type(result)(tuple(out))   # return_types
    _write_out(name, out, result)
    return out


def _flat(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _write_out(name: str, out: torch.Tensor, result) -> None:
    if not isinstance(result, torch.Tensor):
        result = torch.as_tensor(result)
    if out.device != result.device:     # (a meta out= would take the copy and keep nothing)
        raise RuntimeError(f"{name}(): Expected out tensor to have device {result.device}, but "
                           f"got {out.device} instead")
    if not torch.can_cast(result.dtype, out.dtype):
        raise RuntimeError(f"{name}(): result type {result.dtype} can't be cast to the desired "
                           f"output type {out.dtype}")
    if isinstance(out, SparseTensor) or (out.layout != torch.strided
                                         and isinstance(result, SparseTensor)):
        if tuple(out.shape) != tuple(result.shape):
            raise RuntimeError(f"{name}(): out= is a sparse tensor of shape {tuple(out.shape)} "
                               f"for a result of shape {tuple(result.shape)} (a sparse tensor "
                               f"cannot be resized)")
        with torch.no_grad():
            out.copy_(result)
        return
    dense = result.to_dense() if isinstance(result, SparseTensor) else result
    if tuple(out.shape) != tuple(dense.shape):
        if out.numel():
            import warnings
            warnings.warn(f"An output with one or more elements was resized since it had shape "
                          f"{list(out.shape)}, which does not match the required output shape "
                          f"{list(dense.shape)}. This behavior is deprecated, and in a future "
                          f"PyTorch release outputs will not be resized unless they have zero "
                          f"elements. You can explicitly reuse an out tensor t by resizing it, "
                          f"inplace, to zero elements with t.resize_(0).", stacklevel=4)
        out.resize_(dense.shape)
    out.copy_(dense)


# --- torch.compile ---------------------------------------------------------------------------
# Dynamo runs SparseTensor's operators (``A @ X``) on tensors whose level arrays are fake
# (shapes, no data) to learn the result's shape, and AOTAutograd runs them again to record
# the graph. While a compile runs, the operators go to ``_UNDER_COMPILE[0]``: the registered
# operators where there is one (installed by ``scorch.library_ops``), else an
# ``UnsupportedOperatorException``, which Dynamo turns into a graph break: the op then runs
# eagerly on the real tensor.
_is_compiling = torch.compiler.is_compiling


def _unsupported_under_compile(method, args, kwargs):
    raise torch._subclasses.fake_tensor.UnsupportedOperatorException(method)


_UNDER_COMPILE: list = [_unsupported_under_compile]
#: torch functions whose handler only checks its arguments, then leaves the call to torch
#: (``torch.autograd.grad``): torch's own call while a graph is traced (AOTAutograd's
#: backward calls it), not an unsupported operator
CHECKS_ONLY: set = set()
#: a pattern holding new values, differentiably, in a form a graph being traced can hold
#: (``scorch.library_ops._on_pattern``, installed there)
_ON_PATTERN_UNDER_COMPILE: list = [None]
#: the version of what compiled graphs call (a hash of the traced modules' source)
_CACHE_SALT: list = [""]


def _inner_array(level: int, which: str) -> property:
    """``_level{k}_pos`` / ``_level{k}_crd``: the names ``__tensor_flatten__`` gives the
    arrays, read by compiled graphs on every call (a property, not ``__getattr__``'s
    miss path)."""
    return property(lambda self: getattr(self._storage.levels[level], which)
                    if level < len(self._storage.levels) else None)


for _k in range(8):
    for _which in ("pos", "crd"):
        setattr(SparseTensor, f"_level{_k}_{_which}", _inner_array(_k, _which))
SparseTensor._level_values = property(lambda self: self._storage.values)


def numpy_as_tensor(x):
    """A numpy array as a tensor, as torch's argument parser reads one (``A * nd``,
    ``A[np.array([0, 2])]``); anything else as it is. numpy is looked up only where it is
    imported already (no array can exist otherwise)."""
    np = sys.modules.get("numpy")
    return torch.as_tensor(x) if np is not None and type(x) is np.ndarray else x


def _reading_numpy(method):
    """``method``, one of torch's C operator methods, with a numpy array operand read as a
    tensor first, as torch's argument parser reads it elsewhere (``A * nd``): the C method
    declines an array before any dispatch, so Python then asks numpy's reflected operator
    (which tries to convert the sparse tensor: "no numpy / list form"), and ``S += nd``
    rebinds ``S`` to ``S + nd`` instead of updating it in place."""
    def operator(self, other):
        return method(self, numpy_as_tensor(other))
    operator.__name__ = method.__name__
    return operator


for _name in ("__mod__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
              "__imod__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"):
    setattr(SparseTensor, _name, _reading_numpy(getattr(torch.Tensor, _name)))


#: sparse matrix @ dense operand of rank 1 or 2, warm: ``(a, b, rank)``
#: (``scorch.sparse_ops.matmul._sparse_dense``, which installs itself: this module cannot
#: import the op layer); None where it declines
_SPMM: list = [None]


#: forward-mode AD: a level >= 0 while ``dual_level()`` is open (a module global of torch's)
_FWAD = torch.autograd.forward_ad
_MAKE_DUAL = torch._VF._make_dual


def _refuse_dual(func, args, kwargs) -> None:
    """Scorch's kernels read primal values only: a dual tensor's tangent would be dropped
    without a word, so forward-mode AD with a sparse operand raises (as torch.sparse does).
    A sparse tensor never becomes dual: ``make_dual`` with a sparse primal or tangent is
    refused here (every later op would drop the tangent), so only the dense operands of an
    op need their tangent checked."""
    if func is _MAKE_DUAL:
        raise NotImplementedError(
            "scorch: forward-mode AD (torch.autograd.forward_ad.make_dual) with a sparse primal "
            "or tangent is not supported: scorch's kernels read primal values only; use reverse "
            "mode (backward, torch.autograd.grad)")
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        for x in items:
            if type(x) is torch.Tensor and _legacy_batched(x):
                # autograd.functional.jacobian(vectorize=True, strategy="forward-mode")
                # vmaps the tangents (torch's unpack_dual has no batching rule)
                refuse_transform(func)
            if isinstance(x, torch.Tensor) and type(x) is not SparseTensor \
                    and _FWAD.unpack_dual(x).tangent is not None:
                raise NotImplementedError(
                    f"scorch: forward-mode AD (a dual tensor from torch.autograd.forward_ad or "
                    f"torch.func.jvp) is not supported with a sparse operand "
                    f"({getattr(func, '__name__', func)}); use reverse mode (backward, "
                    f"torch.autograd.grad)")


def _direct(method, *args, **kwargs):
    """``method(*args)`` through its registered handler without torch's dispatch, else
    torch's own method (which dispatches through ``__torch_function__`` as usual)."""
    if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
        refuse_foreign(method)
    if _FWAD._current_level >= 0:
        _refuse_dual(method, args, kwargs)
    if _is_compiling():
        return _UNDER_COMPILE[0](method, args, kwargs)
    handler = _dispatch.lookup(method)
    if handler is not None:
        result = _run_handler(method, handler, args, kwargs)
        if result is not NotImplemented:
            return result
    return method(*args, **kwargs)


_NUMPY_ALIASES = frozenset(_dispatch.NUMPY_KEYWORDS)


def _run_handler(func, handler, args, kwargs):
    """``handler(*args, **kwargs)`` (NotImplemented: torch's own path takes the call), its
    failures explained where an operand is the cause (checked on the error path only)."""
    if kwargs and not _NUMPY_ALIASES.isdisjoint(kwargs):
        kwargs = _dispatch.torch_keywords(handler, kwargs)   # ``A.sum(axis=0, keepdims=True)``
    try:
        out = handler(*args, **kwargs)
    except RuntimeError as e:
        _refuse_under_functorch(e)
        _refuse_nested(func, args)
        raise
    except (TypeError, AttributeError):
        return _foreign_operands(func, handler, args, kwargs)
    if type(out) is SparseTensor:
        _carry_gradient_pattern(args, out)
    if func in _VIEW_FUNCTIONS:
        _mark_copies(func, args, out)
    return out


#: the functions torch documents as views (``tensor_view.html``): an in-place write to the
#: result reaches the input. Scorch's result of one shares the input's values where the
#: selected entries are contiguous in them (rows of a row-major tensor outside autograd, a
#: transpose, a reshape); elsewhere it is a copy, marked by ``_mark_copies`` so that an
#: in-place write to it raises (``refuse_write_to_copy``) instead of being lost.
_VIEW_FUNCTIONS = frozenset(
    f for name in ("__getitem__", "select", "narrow", "unbind", "split", "chunk", "tensor_split",
                   "hsplit", "vsplit", "dsplit", "split_with_sizes", "diagonal", "expand",
                   "expand_as", "unfold", "unflatten", "movedim", "moveaxis", "squeeze",
                   "unsqueeze", "t", "transpose", "swapaxes", "swapdims", "permute", "view",
                   "view_as", "adjoint")
    for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None)) if f is not None)


def _mark_copies(func, args, out) -> None:
    src = args[0] if args else None
    if type(src) is not SparseTensor or (func is _GETITEM and _advanced(args[1])):
        return                          # an index tensor or list: a copy in torch too
    base = _root(src._storage.values)
    for o in (out if isinstance(out, (list, tuple)) else (out,)):
        if type(o) is SparseTensor and o._storage.values.numel() and \
                _root(o._storage.values) is not base:
            o.__dict__["_copy_of_view"] = getattr(func, "__name__", str(func))


def _root(values: torch.Tensor) -> torch.Tensor:
    """The tensor ``values`` views (itself if none): torch points every view at the root,
    so two values arrays share memory exactly when their roots are one tensor."""
    base = values._base
    return values if base is None else base


_GETITEM = torch.Tensor.__getitem__


def _advanced(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (list, torch.Tensor)) or (hasattr(i, "__array__") and not isinstance(i, numbers.Number))
               for i in items)


def refuse_write_to_copy(s, name: str = "") -> None:
    """An in-place write to a copy that stands for a torch view (``_mark_copies``) would not
    reach the tensor it came from, where dense torch's would: raise, naming both."""
    view = s.__dict__.get("_copy_of_view") if type(s) is SparseTensor else None
    if view is not None:
        what = f"in-place '{name}'" if name else "an in-place write"
        raise RuntimeError(
            f"scorch: {what} on the result of "
            f"'{view}' of a sparse tensor: torch makes "
            f"that a view, but here it is a copy (its entries are gathered from the tensor's "
            f"values; rows of a row-major tensor taken outside autograd are views), so the write "
            f"would not reach the tensor. Write through the tensor itself (t[...] = v, "
            f"index_put_, masked_fill_), or .clone() the result first to change only it")


def _carry_gradient_pattern(args, out: "SparseTensor") -> None:
    """A result on the very pattern of a gradient of stored values (``is_sparse`` False) is
    one too: ``p.grad = p.grad / 4`` (gradient accumulation) stays a gradient Adam, RMSprop
    and Adagrad take, as ``div_`` in place does."""
    for a in args:
        if type(a) is SparseTensor and a.__dict__.get("_values_grad") and a is not out \
                and out._storage.shares_pattern(a._storage):
            out._values_grad = True
            return


def _refuse_nested(func, args) -> None:
    """A nested (jagged) tensor operand, named, where a handler failed reading its shape
    (torch's "NestedTensorImpl doesn't support sizes"); checked on the error path only."""
    for n, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_nested:
            raise TypeError(f"{getattr(func, '__name__', func)}(): operand {n} is a nested "
                            f"tensor; scorch's sparse operations take plain (strided) dense "
                            f"tensors, so pad it first (torch.nested.to_padded_tensor)")


def _foreign_operands(func, handler, args, kwargs):
    """After a handler failed on a TypeError / AttributeError (the error path only): a numpy
    array operand becomes a tensor, as torch's argument parser makes it (``A * ndarray``); an
    operator (``__mul__``, ...) whose other operand is neither a tensor nor a number gives
    NotImplemented, so Python asks that operand's reflected method, as for a dense tensor
    (``A * None`` then raises Python's TypeError); else the error stands."""
    import numbers
    read = tuple(numpy_as_tensor(a) for a in args)
    if any(r is not a for r, a in zip(read, args)):
        return handler(*read, **kwargs)
    if (getattr(func, "__name__", "").startswith("__") and len(args) == 2
            and not isinstance(args[1], (torch.Tensor, numbers.Number))):
        return NotImplemented
    raise


_TRANSFORMS_REFUSED = (
    "scorch: torch.func transforms (vmap, grad, vjp, jacrev, jacfwd, hessian, jvp, "
    "functional_call under grad; also torch.autograd.functional.jacobian / hessian with "
    "vectorize=True and torch.autograd.grad with is_grads_batched=True, which vmap the "
    "backward) are not supported on functions that use a scorch sparse tensor ({}); use "
    "torch.autograd.grad or torch.autograd.functional.jacobian (vectorize=False), and a loop "
    "or a batched einsum in place of vmap")


def refuse_transform(func, error: Optional[BaseException] = None, scripted: bool = False) -> None:
    """Raise the refusal of ``torch.func`` transforms for ``func`` (a sparse tensor met one).

    Scorch's kernels read real arrays and its autograd Functions use the classic
    ``forward(ctx, ...)`` form, so under a transform a sparse op either fails deep in torch
    or, worse, runs on the dense fallback and returns a dense (off-pattern) or all-zero
    result (``jacfwd``'s basis written into a copy). Callers test ``_functorch_stack()``
    first (~0.1 us), so this costs nothing outside a transform. A graph being compiled is
    left alone (its tracing is not a user's transform). ``scripted``: seen where TorchScript
    looks the same (below ``__torch_dispatch__``): the message names it too."""
    if _is_compiling():
        return
    name = getattr(func, "__name__", None) or str(func)
    message = _TRANSFORMS_REFUSED.format(name)
    if scripted:   # seen below torch's dispatch, where a transform and a script look alike
        message += ("; TorchScript (torch.jit.script), which calls no __torch_function__, "
                    "cannot run scorch sparse tensors either: use torch.compile")
    raise NotImplementedError(message) from error


def refuse_foreign(func) -> None:
    """The refusal at a scorch entry where its callers' one combined test found something
    around the call (``_functorch_stack() is not None or _tf_mode_on() or _jit_tracing()
    is not None``: three C calls, ~0.1 us together): a ``torch.func`` transform
    (:func:`refuse_transform`), else a trace or a default device (:func:`refuse_foreign_context`);
    returns where none of them applies (a user's own function mode)."""
    if _functorch_stack() is not None:
        refuse_transform(func)
    refuse_foreign_context(func)


def refuse_foreign_context(func) -> None:
    """Raise at a scorch entry that torch's dispatch does not pass through (a SparseTensor's
    own methods and operators, the constructors) where what runs around it cannot hold a
    scorch kernel, whose arrays are written through raw pointers:

    * ``torch.jit.trace`` and ``make_fx`` would record only the output's allocation: a
      program that returns uninitialized memory, silently (``torch.compile`` is supported);
    * a default device other than the CPU (``with torch.device("meta")``,
      ``torch.set_default_device``) would place every array scorch allocates there, and the
      kernels would write through a meta tensor's null pointer (a segfault)."""
    if _is_compiling():
        return
    name = getattr(func, "__name__", None) or str(func)
    if _jit_tracing() is not None or _proxy_mode(_PROXY) is not None:
        raise RuntimeError(
            f"scorch: {name} inside torch.jit.trace / make_fx: scorch's kernels write their "
            f"results through raw pointers, which a trace does not record (it would replay an "
            f"empty program); use torch.compile, or run the model eagerly")
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            if mode.device.type != "cpu":
                raise RuntimeError(
                    f"scorch: {name} with the default device set to {mode.device} (with "
                    f"torch.device(...) or torch.set_default_device): scorch sparse tensors "
                    f"and their kernels live on the CPU; build and use them outside that "
                    f"context (deferred initialization: create the sparse weight after "
                    f"to_empty(device='cpu'))")
            return


_proxy_mode = torch._C._get_dispatch_mode
_PROXY = torch._C._TorchDispatchModeKey.PROXY


def refuse_transformed_source(name: str, *tensors) -> None:
    """A sparse tensor about to be built from ``tensors`` (dense data, values): refused inside
    a ``torch.func`` transform, from a functorch-wrapped tensor, or from a forward-mode dual
    tensor (its tangent would be dropped: torch's ``to_sparse`` and ``sparse_coo_tensor``
    raise NotImplementedError there too)."""
    if _functorch_stack() is not None or any(
            isinstance(x, torch.Tensor) and _functorch_wrapped(x) for x in tensors):
        refuse_transform(name)
    if _tf_mode_on() or _jit_tracing() is not None:
        refuse_foreign_context(name)
    if _FWAD._current_level >= 0:
        _refuse_dual(name, tensors, {})


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor

#: the functions torch's vectorized jacobians build their basis of one-hot cotangents in:
#: on a sparse output, ``new_zeros(...).diagonal().fill_(1)`` cannot write its ones
_BASIS_BUILDERS = frozenset({"_construct_standard_basis_for"})


def _building_vmapped_basis() -> bool:
    """Whether a caller a few frames up is torch building a vmapped jacobian's basis
    (``autograd.functional.jacobian(vectorize=True)``, ``hessian(vectorize=True)``): read
    on the error path only."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_code.co_name in _BASIS_BUILDERS and \
                frame.f_globals.get("__name__", "").startswith("torch."):
            return True
        frame = frame.f_back
    return False


def _refuse_under_functorch(error: RuntimeError, operands=()) -> None:
    """Inside a ``torch.func`` transform (vmap, grad, jacrev) a sparse op fails deep in
    torch ("Cannot access data pointer", "must override the setup_context staticmethod"):
    say what is unsupported and what to use. A backward vmapped by autograd itself
    (``jacobian(vectorize=True)``) shows no transform on the stack, only batched operands
    without memory. Only on the error path, so it costs nothing."""
    if _functorch_stack() is not None or _building_vmapped_basis() or any(
            type(x) is torch.Tensor and not torch._C._has_storage(x) for x in operands):
        refuse_transform("a sparse operation", error)


def _or_handler(result, method, a, b):
    """A fast path's result, or (None) ``method(a, b)`` through its handler."""
    if result is None:
        return _direct(method, a, b)
    if type(result) is SparseTensor:
        _carry_gradient_pattern((a, b), result)
    return result


def _matmul_direct(method, a, b):
    """``a @ b`` or ``a.mm(b)``: the warm SpMM when it takes the call, else the handler."""
    if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
        refuse_foreign(method)
    if _FWAD._current_level >= 0:
        _refuse_dual(method, (a, b), {})
    spmm = _SPMM[0]
    if spmm is not None:
        result = spmm(a, b, 2)
        if result is not None:
            return result
    return _direct(method, a, b)


_PY_SCALARS = (int, float, bool)


def _scalar_op(fn, t: "SparseTensor", scalar):
    """``fn(t, scalar)`` on the stored values for a Python number (torch's type promotion,
    as the dense op), or None. Under autograd, torch's op on the differentiable values:
    its gradient is torch's, on the pattern (165 -> ~50 us for ``(A * 2).sum()`` and its
    backward on a small matrix, which went through the compiler both ways)."""
    if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
        refuse_foreign(fn)
    if type(scalar) not in _PY_SCALARS or _deferred(t):
        return None   # a deferred operand goes to the handler, which fuses it
    if _grad_enabled() and _any_requires_grad(t):
        if _is_compiling():
            return _ON_PATTERN_UNDER_COMPILE[0](t._storage, fn(_AUTOGRAD["values"](t), scalar))
        return _AUTOGRAD["from_values"](t._storage, fn(_AUTOGRAD["values"](t), scalar))
    return with_values(t, fn(t._storage.values, scalar))


def _pattern_op(fn, a: "SparseTensor", b):
    """``fn(a, b)`` on the stored values when ``b`` is a SparseTensor over the very same
    level arrays (same format and shape), or None; under autograd as ``_scalar_op``."""
    if _functorch_stack() is not None or _tf_mode_on() or _jit_tracing() is not None:
        refuse_foreign(fn)
    if type(b) is not SparseTensor or _deferred(a) or _deferred(b):
        return None   # a deferred operand goes to the handler, which fuses it
    sa, sb = a._storage, b._storage
    if not (_same_index_arrays(sa, sb) if _is_compiling() else sa.shares_pattern(sb)):
        return None
    if _grad_enabled() and _any_requires_grad(a, b):
        values = _AUTOGRAD["values"]   # flat (a hybrid's values() are not)
        if _is_compiling():
            return _ON_PATTERN_UNDER_COMPILE[0](sa, fn(values(a), values(b)))
        return _AUTOGRAD["from_values"](sa, fn(values(a), values(b)))
    return with_values(a, fn(sa.values, sb.values))


def _same_index_arrays(sa: Storage, sb: Storage) -> bool:
    """``shares_pattern`` for a graph being traced (fake arrays have no addresses): two
    storages derived in the graph from one tensor (``A * 2`` and ``A``) hold the same level
    tuple, and the values-level op stays in the graph, where inductor fuses a chain of them
    (``B = A * 3; A * 2 + B``) into one loop over the stored values. Separate graph
    inputs never count as sharing (AOTAutograd gives each its own arrays, so Dynamo's and
    its traces would disagree); they graph-break."""
    return sa.levels is sb.levels and sa.shape == sb.shape and sa.format == sb.format


# --- autograd ------------------------------------------------------------------------------
_grad_enabled = torch.is_grad_enabled
_tf_enabled = torch._C._is_torch_function_enabled
_graph_task = torch._C._current_graph_task_id
_any_requires_grad = torch._C._any_requires_grad
#: the differentiable forms of values / to_dense / to_format / permute, installed by
#: ``scorch.gradients.values`` (which imports this module, so this one cannot import it)
_AUTOGRAD: dict = {}
#: ``SparseTensor.eliminate_zeros``'s function, installed by ``scorch.sparse_ops.stored_zeros``
#: (which imports this module)
_ELIMINATE_ZEROS: list = [None]
_aten = torch.ops.aten
#: ATen ops whose autograd formula is right for a sparse operand (views, copies, casts,
#: metadata, and adding gradients of one pattern)
#: ops that reach ``__torch_dispatch__`` without ``__torch_function__`` by themselves (not
#: through a transform's wrapper): torch's own error then, not the transforms' refusal
_NOT_FROM_TRANSFORMS = frozenset(getattr(_aten.set_, o) for o in _aten.set_.overloads())
_GRAD_SAFE = {_aten.detach.default, _aten.alias.default, _aten.clone.default,
              _aten._to_copy.default, _aten._nnz.default, _aten.is_same_size.default,
              _aten.add.Tensor, _aten.add_.Tensor, _aten.zeros_like.default,
              _aten.full_like.default, _aten.empty_like.default,
              _aten.new_empty_strided.default}


def _sparse_to_sparse(args) -> bool:
    """``copy_`` of a sparse tensor into a sparse one: torch's derivative hands the incoming
    gradient to the source as it is (the engine's ``backward(create_graph=True)`` copy)."""
    return len(args) >= 2 and isinstance(args[0], SparseTensor) and isinstance(args[1], SparseTensor)

#: ops whose results carry no gradient (bool or index results): nothing to detach
_NO_GRADIENT = {getattr(_aten, n) for n in (
    "allclose", "isclose", "equal", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf",
    "isfinite", "isposinf", "isneginf", "signbit", "logical_and", "logical_or",
    "logical_xor", "logical_not", "argmax", "argmin", "nonzero", "count_nonzero", "any",
    "all") if hasattr(_aten, n)}


def _rebuild(fmt, shape, arrays, values, requires_grad):
    levels = [Level(LevelKind(k), d, s, p, c, b) for k, d, s, p, c, b in arrays]
    return SparseTensor(Storage(fmt, shape, levels, values), requires_grad)


#: ``__dict__`` entries that belong to one tensor object (its storage, caches, its link to
#: the graph that made it): never pickled or copied
_OWN_STATE = frozenset({"_storage", "_flat", "_pending", "_made_of", "_alias_of"})


def _user_state(t: SparseTensor) -> dict:
    """The attributes a copy carries: a Parameter's ``_is_param``, a gradient's mark, the
    user's own."""
    return {k: v for k, v in t.__dict__.items() if k not in _OWN_STATE}


def _load(fmt, shape, arrays, values, requires_grad, state=None):
    """Unpickling (torch.load, pickle): like ``_rebuild``, after checking the arrays (a
    file can hold anything; see ``scorch.saving``); ``state``: the attributes saved."""
    t = SparseTensor(saving.checked_storage(fmt, shape, arrays, values), requires_grad)
    if state:
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ValueError(f"scorch: a saved sparse tensor's attributes are {type(state)}, "
                             f"not a dict of names")
        t.__dict__.update((k, v) for k, v in state.items() if k not in _OWN_STATE)
    return t


saving.allow_in_weights_only_load(_load)


def clone_sparse(t: SparseTensor, requires_grad: Optional[bool] = None) -> SparseTensor:
    """A copy with its own arrays (``clone``: ``requires_grad=False``, autograd gives it
    its history; a copy keeping ``t``'s flag by default)."""
    st = t._storage
    levels = [Level(lv.kind, lv.dim, lv.size,
                    None if lv.pos is None else lv.pos.clone(),
                    None if lv.crd is None else lv.crd.clone(), lv.block_inner, lv.ordered)
              for lv in st.levels]
    out = SparseTensor(Storage(st.format, st.shape, levels, st.values.clone(), st.index_dtype),
                       t.requires_grad if requires_grad is None else requires_grad)
    return carry_grad_flag(t, out)


def carry_grad_flag(src: SparseTensor, dst: SparseTensor) -> SparseTensor:
    """A copy or view of a gradient on its tensor's pattern is one too (``is_sparse``)."""
    if src.__dict__.get("_values_grad"):
        dst._values_grad = True
    return dst


def with_values(t: SparseTensor, values: torch.Tensor) -> SparseTensor:
    """Same structure, new values (same length): the result of a zero-preserving map."""
    st = t._storage
    return SparseTensor(Storage(st.format, st.shape, st.levels, values, st.index_dtype))


#: pending results not yet computed or inlined (counted by ``scorch.sparse_ops.fusion``):
#: while 0 (nearly always), nothing looks for one (reading a tensor's ``__dict__`` costs
#: ~0.5 us). Only a shortcut: a pending tensor a check misses is still computed on the
#: first read of its ``_storage``.
PENDING_LIVE = [0]


def _deferred(t: SparseTensor) -> bool:
    """Whether ``t`` is a pending result (never under torch.compile: none is made there)."""
    return not _is_compiling() and PENDING_LIVE[0] > 0 and "_pending" in t.__dict__


def make_pending(shape, dtype: torch.dtype, pending) -> SparseTensor:
    """A SparseTensor whose storage is computed on first read by ``pending.materialize()``
    (``SparseTensor.__getattr__``): a deferred elementwise result, see
    ``scorch.sparse_ops.fusion``."""
    r = torch.Tensor._make_wrapper_subclass(SparseTensor, shape, dtype=dtype,
                                            device=torch.device("cpu"))
    r._pending = pending
    return r


def is_sparse_operand(x) -> bool:
    """A scorch SparseTensor or one of torch's own sparse layouts."""
    return isinstance(x, SparseTensor) or (
        isinstance(x, torch.Tensor) and x.layout in _TORCH_SPARSE_LAYOUTS)


_TORCH_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc,
                         torch.sparse_bsr, torch.sparse_bsc)


def as_scorch(x) -> object:
    """Torch sparse layouts become SparseTensor (sharing arrays); anything else unchanged."""
    if isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) \
            and x.layout in _TORCH_SPARSE_LAYOUTS:
        if x.requires_grad and _grad_enabled():   # the gradient flows back to x
            return _AUTOGRAD["from_torch"](x)
        from . import interop
        return SparseTensor(interop.from_torch(x))
    return x


def _permuted_blocked(t: SparseTensor, dims: Sequence[int]) -> SparseTensor:
    """A blocked tensor permuted (BSR ``.t()`` is BSC, as torch's): its blocks are stored
    row-major, so no view can reorder them; one conversion to the unblocked format, the view,
    and one back into blocks of the permuted shape (cost follows the stored blocks)."""
    dims = [int(d) for d in dims]
    if dims == list(range(len(dims))):
        return t
    fmt = t._storage.format
    plain = permute_view(t.to_format(Format(fmt.levels, fmt.mode_order)), dims)
    pf = plain._storage.format
    return plain.to_format(Format(pf.levels, pf.mode_order, block=tuple(fmt.block[d] for d in dims)))


def permute_view(t: SparseTensor, dims: Sequence[int]) -> SparseTensor:
    """``t.permute(dims)`` without moving data: only the mode order changes."""
    st = t._storage
    if st.format.block is not None:
        return _permuted_blocked(t, dims)
    if _grad_enabled() and _any_requires_grad(t):
        return _AUTOGRAD["view_of"](st.permuted(dims), _AUTOGRAD["values"](t))   # same (flat) values, new view
    return SparseTensor(st.permuted(dims))
