"""The differentiable ways between a sparse tensor and its stored values: ``values()``, a
pattern holding new values, ``to_dense()``, construction from ``(indices, values)``, and
torch's own sparse layouts both ways (``from_torch``, ``to_torch``).

A sparse tensor's gradient is the gradient of its stored values, so each of these moves a
gradient between a pattern and a 1-d values tensor (or a dense tensor, at the pattern's
coordinates). Without grad mode or a tensor that requires grad they are the plain calls.
"""
from __future__ import annotations

import torch

from ..formats import Format
from ..level_storage import Storage
from .. import _dispatch
from .. import tensor_type as _tensor_type
from ..tensor_type import SparseTensor
from . import pattern as _pattern

__all__ = ["values_of", "from_values", "with_dtype", "to_dense", "to_format",
           "from_coordinates", "from_dense", "from_torch", "to_torch", "grad_values",
           "mark_gradient"]


def _convert():
    from .._runtime import convert
    return convert


def grad_values(P: Storage, g) -> torch.Tensor:
    """A gradient of a tensor with pattern ``P`` (a SparseTensor on ``P``'s pattern or a
    subset of it, a torch sparse tensor, or dense) as one value per stored entry of ``P``."""
    if isinstance(g, torch.Tensor) and g.layout != torch.strided and not isinstance(g, SparseTensor):
        g = _tensor_type.as_scorch(g)   # a torch COO handed in as the incoming gradient
    if isinstance(g, SparseTensor):
        vals = values_of(g)
        return vals if _pattern.shares_arrays(P, g._storage) else \
            _pattern.values_on_pattern(P, g._storage, vals)
    if P.ndim == 0:
        return g.reshape(1).expand(P.nnz)
    return g[tuple(_convert().coords(P))]


def mark_gradient(g):
    """Flag a SparseTensor that is a gradient on its tensor's pattern (see
    ``SparseTensor.is_sparse``)."""
    if isinstance(g, SparseTensor):
        g._values_grad = True
    return g


class _Values(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: SparseTensor) -> torch.Tensor:
        ctx.pattern = s._storage.pattern_only()
        if _GRAD_FN(s) is None:
            ctx.leaf = s   # for view_of (its AccumulateGrad holds it anyway)
        return s._storage.values.detach()   # an alias: the storage's own tensor never gets a grad_fn

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return mark_gradient(from_values(ctx.pattern, g))


class _FromValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, P: Storage) -> SparseTensor:
        ctx.pattern = P.pattern_only()
        return SparseTensor(_pattern.with_pattern_values(P, values.detach()))

    @staticmethod
    def backward(ctx, g):
        return grad_values(ctx.pattern, g), None


class _ViewOf(torch.autograd.Function):
    """A view: the same values array under another structure (a permuted mode order, a size-1
    dim added or dropped). The values are saved only for torch's version check: a backward
    through the view after an in-place change of the shared values (``base.relu_()``) raises
    torch's "modified by an inplace operation" error instead of using a gradient that does
    not see the change (torch would rebase the view; scorch's views are not torch views)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, P: Storage) -> SparseTensor:
        ctx.pattern = P.pattern_only()
        ctx.save_for_backward(values)
        return SparseTensor(_pattern.with_pattern_values(P, values.detach()))

    @staticmethod
    def backward(ctx, g):
        ctx.saved_tensors                  # noqa: B018  (the version check)
        return grad_values(ctx.pattern, g), None


class _ToDense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: SparseTensor) -> torch.Tensor:
        ctx.pattern = s._storage.pattern_only()
        return _convert().to_dense(s._storage)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return mark_gradient(from_values(ctx.pattern, grad_values(ctx.pattern, g)))


def _tracked(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and torch._C._any_requires_grad(x)


def values_of(s: SparseTensor) -> torch.Tensor:
    """``s.values()``: differentiable when ``s`` requires grad. A tensor ``from_values``
    made hands back the values it was made of (while its history is that one: an in-place
    op rebases it), so a chain of values-level ops (``A.relu().sum()``) records no
    to-sparse-and-back pair of nodes between them."""
    if _tracked(s):
        made = s.__dict__.get("_made_of")
        if made is not None and made[1] is _GRAD_FN(s) and not _observed(s):
            s.__dict__["_read_through"] = True      # (a hook registered later: refused)
            return made[0]
        return _Values.apply(s)
    return s._storage.values


_GRAD_FN = torch._C.TensorBase.grad_fn.__get__


def _observed(s: SparseTensor) -> bool:
    """A hook or ``retain_grad`` on ``s`` needs its gradient to pass through its own node
    (the shortcut of ``values_of`` would route around it). Only one registered before the
    use is seen; torch's ``autograd.grad(out, s)`` with ``s`` an intermediate needs that too
    (``s.retain_grad()`` first)."""
    return bool(s._backward_hooks) or s.retains_grad


def _late_observer(name: str):
    """``s.register_hook`` / ``s.retain_grad()`` on a sparse intermediate some op already
    read through the values shortcut: its gradient will not pass through ``s``'s node, so
    the hook would never run (and ``s.grad`` stay None) with no sign of it: refused."""
    def handler(s, *args, **kwargs):
        if type(s) is SparseTensor and s.__dict__.get("_read_through") and s.grad_fn is not None:
            raise RuntimeError(
                f"scorch: {name} on a sparse tensor after an op has used it: its gradient "
                f"does not pass through it there; call {name} right after making the tensor, "
                f"before using it")
        return NotImplemented
    return handler


_dispatch.register(torch.Tensor.register_hook)(_late_observer("register_hook"))
_dispatch.register(torch.Tensor.retain_grad)(_late_observer("retain_grad"))


def _refuse_read_through_inputs(name: str, inputs) -> None:
    """``autograd.grad(out, [M])`` / ``backward(inputs=[M])`` for a sparse intermediate ``M``
    that an op read through the values shortcut: its gradient never reaches ``M``'s node, so
    torch would answer None (``allow_unused``), zeros (``materialize_grads``), nothing
    accumulated (``backward``) or a partial gradient (``M`` also used through its node):
    refused with what to do instead."""
    for t in inputs if isinstance(inputs, (tuple, list)) else (inputs,):
        if type(t) is SparseTensor and t.__dict__.get("_read_through") and t.grad_fn is not None:
            raise RuntimeError(
                f"scorch: {name} with respect to a sparse intermediate that an op has already "
                f"used: its gradient does not pass through it (a chain of values-level ops "
                f"links to the stored values directly); call retain_grad() on it right after "
                f"making it, before using it, and its gradient is computed")


@_dispatch.register(torch.autograd.grad)
def _autograd_grad(outputs, inputs, *args, is_grads_batched=False, **kwargs):
    """Checks only (torch's own ``grad`` then runs): a batched backward (``vmap`` over it)
    is a transform scorch does not support; see ``_refuse_read_through_inputs``."""
    if is_grads_batched:
        _tensor_type.refuse_transform(torch.autograd.grad)
    _refuse_read_through_inputs("torch.autograd.grad", inputs)
    return NotImplemented


@_dispatch.register(torch.autograd.backward)
def _autograd_backward(tensors, *args, inputs=None, **kwargs):
    if inputs is not None:
        _refuse_read_through_inputs("backward(inputs=...)", inputs)
    return NotImplemented


_tensor_type.CHECKS_ONLY.update((torch.autograd.grad, torch.autograd.backward))


def from_values(P: Storage, values: torch.Tensor) -> SparseTensor:
    """A SparseTensor with ``P``'s pattern and ``values``: differentiable in ``values``."""
    if _tracked(values):
        out = _FromValues.apply(values, P)
        out._made_of = (values, _GRAD_FN(out))
        return out
    return SparseTensor(_pattern.with_pattern_values(P, values))


class _LeafView(torch.autograd.Function):
    """``_ViewOf`` of a leaf's own values, recorded on the leaf itself: the view's node
    links to the leaf's AccumulateGrad, as a dense view does. torch finds a leaf's gradient
    node through ``t.view_as(t).grad_fn.next_functions`` (``register_multi_grad_hook``,
    ``get_gradient_edge``); through ``_Values`` it found a new node per call, which never
    runs, and a multi-grad hook fired once per gradient instead of once."""

    @staticmethod
    def forward(ctx, leaf: SparseTensor, values: torch.Tensor, P: Storage) -> SparseTensor:
        ctx.pattern, ctx.leaf_pattern = P.pattern_only(), leaf._storage.pattern_only()
        ctx.save_for_backward(values)      # the version check, as _ViewOf's
        return SparseTensor(_pattern.with_pattern_values(P, values))

    @staticmethod
    def backward(ctx, g):
        ctx.saved_tensors                  # noqa: B018  (the version check)
        # the view shares the leaf's values array: one gradient value per stored value
        return mark_gradient(from_values(ctx.leaf_pattern, grad_values(ctx.pattern, g))), None, None


def view_of(P: Storage, values: torch.Tensor) -> SparseTensor:
    """A SparseTensor on ``P`` sharing ``values`` (a view of their tensor): differentiable
    in ``values``, and checked against in-place changes of them (``_ViewOf``; a leaf's own
    values: ``_LeafView``)."""
    if _tracked(values):
        leaf = getattr(_GRAD_FN(values), "leaf", None)
        if leaf is not None:
            return _LeafView.apply(leaf, values.detach(), P)
        return _ViewOf.apply(values, P)
    return SparseTensor(_pattern.with_pattern_values(P, values))


def with_dtype(s: SparseTensor, dtype: torch.dtype) -> SparseTensor:
    """``s`` with its values cast to ``dtype`` (the same pattern), differentiable: the cast
    an op does for type promotion must not cut the graph."""
    if s.dtype == dtype:
        return s
    return from_values(s._storage, values_of(s).to(dtype))


def to_dense(s: SparseTensor) -> torch.Tensor:
    """``s.to_dense()``: differentiable when ``s`` requires grad (the backward gathers the
    dense gradient at the stored coordinates)."""
    if _tracked(s):
        return _ToDense.apply(s)
    return _convert().to_dense(s._storage)


def to_format(s: SparseTensor, fmt: Format) -> SparseTensor:
    """``s.to_format(fmt)`` differentiable: the converted values are a permutation of the
    stored ones (positions a dense target level adds are zero)."""
    st = s._storage
    tagged = Storage(st.format, st.shape, st.levels,
                     torch.arange(1, st.nnz + 1, dtype=torch.int64), st.index_dtype)
    conv = _convert().convert(tagged, fmt)
    src = conv.values
    vals = values_of(s)[(src - 1).clamp_(min=0)]
    if conv.nnz != st.nnz:
        vals = torch.where(src > 0, vals, torch.zeros((), dtype=vals.dtype))
    return from_values(conv, vals)


def from_coordinates(st: Storage, indices: torch.Tensor, values: torch.Tensor) -> SparseTensor:
    """The tensor ``st`` built from ``(indices, values)``, differentiable in ``values``:
    duplicates were summed, so each stored value is the sum of its inputs (index_add) and
    the backward gathers. Untracked ``values`` need none of that: ``st`` holds their sums
    already (finding each input's position costs a sort and a search, 4x the build)."""
    if not _tracked(values):
        return SparseTensor(st)
    pos, _ = _pattern.positions_in_pattern(st, indices.to(torch.int64).reshape(st.ndim, -1))
    vals = torch.zeros(st.nnz, dtype=st.dtype).index_add(0, pos, values.to(st.dtype))
    return from_values(st, vals)


def from_dense(st: Storage, x: torch.Tensor) -> SparseTensor:
    """The tensor ``st`` built from dense ``x``, differentiable in ``x``: its stored values
    are ``x`` at the stored coordinates."""
    vals = x[tuple(_convert().coords(st))] if st.ndim else x.reshape(1)
    return from_values(st, vals.to(st.dtype))


# --- torch's own sparse layouts -------------------------------------------------------------

#: layouts whose leaves torch's autograd can give a gradient in their own layout (as
#: torch.sparse.mm does); the others (CSC, BSR, BSC) fail in torch's engine
_GRADIENT_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


def _torch_gradient(x: torch.Tensor, P: Storage, vals: torch.Tensor) -> torch.Tensor:
    """Values on ``P`` (the storage read from torch tensor ``x``) as a gradient in ``x``'s
    layout, on the same (coalesced) pattern."""
    if x.layout is torch.sparse_coo:
        sparse_dims = sum(1 for lv in P.levels if lv.crd is not None)
        indices = torch.stack([lv.crd.to(torch.int64) for lv in P.levels[:sparse_dims]])
        # (a hybrid tensor's P.nnz counts the values of its dense blocks: one row per index)
        blocks = vals.reshape(indices.shape[1], *x.shape[sparse_dims:]) if sparse_dims else vals
        return torch.sparse_coo_tensor(indices, blocks, x.shape, is_coalesced=True,
                                       check_invariants=False)
    from .. import interop
    return interop.to_torch(_pattern.with_pattern_values(P, vals))


class _FromTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> SparseTensor:
        from .. import interop
        ctx.pattern, ctx.source = interop.from_torch(x), x.detach()
        return SparseTensor(ctx.pattern)

    @staticmethod
    def backward(ctx, g):
        P = ctx.pattern
        return _torch_gradient(ctx.source, P, grad_values(P, g).to(P.dtype))


def from_torch(x: torch.Tensor, operand: str = "operand") -> SparseTensor:
    """A torch sparse tensor (COO, CSR) that requires grad as a SparseTensor over its arrays
    (read once), differentiable: the gradient flows back to ``x`` in ``x``'s layout, on its
    pattern, as ``torch.sparse.mm`` gives it. torch cannot hold a gradient in the other
    layouts: a clear error names the operand."""
    if x.layout not in _GRADIENT_LAYOUTS:
        name = str(x.layout).replace("torch.", "")
        raise RuntimeError(
            f"scorch: {operand} is a torch {name} tensor that requires grad; torch's autograd "
            f"cannot give a {name} tensor a gradient. Use x.to_sparse_csr() / x.to_sparse() "
            f"or scorch.sparse_tensor(x, requires_grad=True)")
    return _FromTorch.apply(x)


class _ToTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: SparseTensor) -> torch.Tensor:
        from .. import interop
        ctx.pattern = s._storage.pattern_only()
        return interop.to_torch(s._storage)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        if g.layout is not torch.strided:   # torch's sparse gradient: its entries on the pattern
            from .. import interop
            g = SparseTensor(interop.from_torch(g))
        return mark_gradient(from_values(ctx.pattern, grad_values(ctx.pattern, g).to(ctx.pattern.dtype)))


def to_torch(s: SparseTensor) -> torch.Tensor:
    """``s.to_torch()`` differentiable: torch's gradient of the torch tensor (sparse or
    dense) comes back as ``s``'s gradient on its pattern."""
    return _ToTorch.apply(s)


_tensor_type._AUTOGRAD.update(values=values_of, to_dense=to_dense, to_format=to_format,
                              from_values=from_values, view_of=view_of, from_torch=from_torch,
                              to_torch=to_torch)
