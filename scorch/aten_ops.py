"""ATen ops done on the level arrays of a SparseTensor (detach, alias, clone, dtype casts,
copy_, to_dense, nnz): they never densify and never reach the dense fallback."""
from __future__ import annotations

import torch

from . import constructors, conversion
from ._dispatch import register_aten
from .tensor_type import SparseTensor, carry_grad_flag, clone_sparse, refuse_write_to_copy, with_values

aten = torch.ops.aten


@register_aten(aten.detach.default, aten.alias.default)
def _detach(t):
    if torch.is_inference_mode_enabled() and not t.is_inference():
        # made in inference mode the alias would be an inference tensor, and torch's
        # ADInplaceOrView kernel of detach then fails giving it ``t``'s version counter
        # ("Cannot set version_counter for inference tensor"): a normal tensor, as a dense
        # detach of a normal tensor is there
        with torch.inference_mode(False):
            return _detach(t)
    alias = carry_grad_flag(t, SparseTensor(t._storage))
    if t.is_leaf:
        # see _copy_. A plain reference (a weakref would stop torch.utils.swap_tensors, which
        # module.double() uses), to leaves only (a non-leaf would keep its graph alive);
        # copies and pickles leave it out (tensor_type._OWN_STATE)
        alias.__dict__["_alias_of"] = t
    return alias


def _aliases(t):
    """``t`` and the tensors it is a ``detach`` / ``.data`` alias of, while they still hold
    its Storage: a copy_ that changes the pattern on ``p.data`` must reach ``p``, as a dense
    copy_ writes the memory ``p`` shares."""
    storage = t._storage
    while t is not None and t._storage is storage:
        yield t
        t = t.__dict__.get("_alias_of")


@register_aten(aten.clone.default)
def _clone(t, memory_format=None):
    # below autograd: a clone in grad mode gets its CloneBackward history from torch's
    # autograd layer, and one under no_grad / inference_mode must not require grad (as a
    # dense clone there), so the new tensor never takes ``t.requires_grad`` as a leaf flag
    return clone_sparse(t, requires_grad=False)


@register_aten(aten._to_copy.default)
def _to_copy(t, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError(f"scorch: sparse tensors live on the CPU; cannot move to {device}")
    # ``layout`` is ignored: a SparseTensor's reads strided (a wrapper's), so torch passes
    # strided for "keep it" (``A.to(copy=True)``, ``type_as``, autograd casting a gradient
    # back with its input's options); densifying made ``A.to("cpu", copy=True)`` a dense
    # tensor (14.6 TiB for a 2M x 2M matrix). ``to_dense()`` is the way to a dense copy.
    values = t._storage.values
    if dtype is not None and dtype != values.dtype:
        values = values.to(dtype)
    else:
        values = values.clone()
    return carry_grad_flag(t, with_values(t, values))


@register_aten(aten.copy_.default)
def _copy_(self, src, non_blocking=False):
    """In-place copy (load_state_dict, optimizer updates): self takes src's values, in
    self's format and dtype. A dense self takes the sparse src's dense values (its own
    memory, as torch's copy_)."""
    if not isinstance(self, SparseTensor):
        if self.layout != torch.strided:       # a torch sparse tensor takes torch's layout
            t = src.to_torch()
            if t.layout != self.layout:
                t = t.to_sparse(layout=self.layout, blocksize=tuple(self.values().shape[1:3])
                                if self.layout in (torch.sparse_bsr, torch.sparse_bsc) else None)
            return self.copy_(t, non_blocking)
        return self.copy_(src.to_dense(), non_blocking)
    refuse_write_to_copy(self, "copy_")
    if tuple(src.shape) != tuple(self.shape):
        raise RuntimeError(f"copy_: shape {tuple(src.shape)} does not match the sparse "
                           f"tensor's shape {tuple(self.shape)}")
    if isinstance(src, SparseTensor) and src._storage.format == self._storage.format and \
            src._storage.shares_pattern(self._storage):
        # the same pattern: the values written in place, as a dense copy_ writes its memory
        # (what a compiled graph's write-back of a mutated ``values()`` records; and views
        # sharing these values see the change, as torch's views do)
        self._storage.values.copy_(src._storage.values)
        return self
    kept = None if isinstance(src, SparseTensor) else conversion.dense_on_pattern(self._storage, src)
    if kept is not None:   # a dense src that is 0 off the pattern: the pattern stays (stored zeros too)
        self._storage.values.copy_(kept)
        return self
    new = constructors.sparse_tensor(src, format=self._storage.format)
    st = new._storage
    if st.dtype != self.dtype:
        st = with_values(new, st.values.to(self.dtype))._storage
    if st.same_pattern(self._storage):
        # an equal pattern in other arrays (another module's weight, a deepcopy, a
        # checkpoint): the values written in place too, so ``p.data.copy_(src)`` and
        # ``p.detach().copy_(src)`` (target networks, AveragedModel) reach ``p``
        self._storage.values.copy_(st.values)
        return self
    for t in list(_aliases(self)):
        t._storage = st
    return self


@register_aten(aten.isnan.default)
def _isnan(t):
    """Autograd's anomaly mode checks every gradient with ``isnan(g)._is_any_true()``: the
    test of the stored values, on the pattern (an unstored zero is never NaN)."""
    return with_values(t, torch.isnan(t._storage.values))


@register_aten(aten.isinf.default)
def _isinf(t):
    return with_values(t, torch.isinf(t._storage.values))


@register_aten(aten._is_any_true.default)
def _is_any_true(t):
    return t._storage.values.any()


@register_aten(aten._is_all_true.default)
def _is_all_true(t):
    return torch.tensor(bool(t._storage.values.all()) and t._storage.nnz == t.numel())


@register_aten(aten.embedding_renorm_.default)
def _embedding_renorm_(weight, indices, max_norm, norm_type):
    """``nn.Embedding(max_norm=...)``: each looked-up row whose ``norm_type``-norm exceeds
    ``max_norm`` scaled to ``max_norm / (norm + 1e-7)``, as torch's kernel; a row's norm is
    its stored values', the scaling keeps the pattern."""
    st = weight._storage
    if st.ndim != 2 or st.format.block is not None:
        raise RuntimeError(f"embedding_renorm_: a sparse weight must be an unblocked matrix, "
                           f"got {st.format} of shape {tuple(st.shape)}")
    values = st.values
    row = conversion.coords(st)[0]
    entries = torch.isin(row, indices.reshape(-1).to(torch.int64)).nonzero().flatten()
    # one slot per looked-up row that stores entries (not an array as long as the table)
    rows, slot = torch.unique(row.index_select(0, entries), return_inverse=True)
    picked = values.index_select(0, entries)
    norms = picked.new_zeros(rows.numel()).index_add_(0, slot, picked.abs().pow(norm_type))
    norms = norms.pow(1.0 / norm_type)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    values.index_copy_(0, entries, picked * scale.index_select(0, slot))
    return weight


@register_aten(aten._to_dense.default, aten.to_dense.default)
def _to_dense(t, dtype=None, masked_grad=None):
    return t.to_dense(dtype)


@register_aten(aten._nnz.default)
def _nnz(t):
    return t._storage.nnz


@register_aten(aten.is_same_size.default)
def _is_same_size(a, b):
    return tuple(a.shape) == tuple(b.shape)
