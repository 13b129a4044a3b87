"""``F.linear`` with a sparse weight or a sparse batch: a sparse layer's product and its
gradients, in ONE autograd node per call where the operands allow.

``y = x @ W^T + b`` runs in one of these forms:

* **the batch as columns** (``_ColumnBatchLinear``): ``y^T = W @ x^T`` with the batch
  transposed into a dense ``x^T`` (each input feature's B values contiguous). The SpMM
  streams W's stored entries and updates B-wide rows of ``y^T`` with vector FMAs; the
  weight's gradient is the SDDMM ``dW[o, j] = g^T[o, :] . x^T[j, :]`` on W's own pattern,
  two contiguous rows per stored weight. A dense batch takes it. So does a sparse batch
  whose product fills up (the result is dense by nature) where expanding it costs less than
  keeping it sparse (``expand_pays``: MNIST's 64 x 784 CSR batch at 18 % stored, a 10 %
  weight: fwd + bwd 480 -> 210 us).
* **the sparse batch kept sparse** (``_SparseBatchLinear``): each stored batch entry scatters
  a column of the input-major weight into its output row; for a sparse batch too sparse, or
  too wide, to expand.
* one einsum (``matmul._contract``) with a sparse result where the product stays sparse, and
  the composed differentiable graph for what the nodes do not take (blocked or complex
  weights, a sparse batch that needs its own gradient, double backward).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .. import _dispatch
from .._dispatch import register
from ..conversion import to_dense
from ..gradients import pattern as _pattern
from ..gradients.values import from_values, mark_gradient, values_of
from ..tensor_compiler.relayout import transposed
from ..tensor_compiler.threads import threads_for
from ..tensor_compiler.tiling import l2_cache_bytes
from ..tensor_type import SparseTensor, as_scorch, is_sparse_operand
from . import elementwise
from . import einsum as _einsum_entry
from .gathered_columns import gathered_columns_product
from .matmul import _BATCH_LETTERS, autocast_aware, _check_dtypes, _contract, _dtype, _shape, _sparse_dense, _sparse_only

__all__ = ["linear", "expand_pays", "DENSE_PRODUCT_FILL", "EXPAND_PER_WORK"]

#: sparse @ sparse products expected to store at least this fraction of their entries are
#: computed dense (see linear)
DENSE_PRODUCT_FILL = 0.25

#: a sparse batch (B x K) is expanded into its dense transpose where writing its B * K
#: entries costs at most EXPAND_PER_WORK times the work of keeping it sparse: one scattered
#: update per stored batch entry and weight of its column, plus the B x N result. Measured
#: (64 x 784 batch, 784 -> 256 weight, fwd + bwd, 1 thread, Zen 5): the expanded form is
#: 1.0-1.3x at 0.5-4 % stored batch entries and 10 % weight, 1.5-2.5x above; with a 1 %
#: weight 1.3-2x at 4-18 %. A 64 x 100k bag-of-words batch at 0.1 % stays sparse.
EXPAND_PER_WORK = 4


def _fills_up(a, b, inner: int) -> bool:
    """Whether ``a @ b^T`` (both sparse, reduction extent ``inner``) is expected to store at
    least ``DENSE_PRODUCT_FILL`` of its entries, for uniformly spread stored entries:
    1 - (1 - da * db) ** inner."""
    if not (is_sparse_operand(a) and is_sparse_operand(b)) or inner == 0:
        return False
    da, db = _density(a), _density(b)
    return 1.0 - (1.0 - da * db) ** inner >= DENSE_PRODUCT_FILL


def _density(x) -> float:
    st = getattr(x, "_storage", None)
    nnz = st.nnz if st is not None else x._nnz()
    size = math.prod(_shape(x))
    return nnz / size if size else 0.0


def expand_pays(batch_nnz: int, batch: int, inputs: int, weight_nnz: int, outputs: int) -> bool:
    """Whether a sparse batch (``batch`` x ``inputs``, ``batch_nnz`` stored) through a sparse
    weight (``outputs`` x ``inputs``, ``weight_nnz`` stored) runs faster expanded into its
    dense transpose (see :data:`EXPAND_PER_WORK`)."""
    scattered = batch_nnz * weight_nnz / inputs if inputs else 0.0
    return batch * inputs <= EXPAND_PER_WORK * (scattered + batch * outputs)


def _expansion_fits(shape, itemsize: int) -> bool:
    """Whether a sparse batch's dense transpose stays under the dense limit (the one the
    dense fallback and dense-by-nature results keep to)."""
    return shape[0] * shape[1] * itemsize <= _dispatch.get_dense_fallback_limit()


# --- the batch as columns --------------------------------------------------------------------

_COLUMN_DTYPES = (torch.float32, torch.float64)
#: the column form's product, ``y^T = W @ x^T``, whose gradient plans the backward asks for
_COLUMN_EQUATION = "oj,ja->oa"


def _column_weight(weight) -> bool:
    """A weight the column form takes: an unblocked sparse matrix of a real float dtype."""
    if type(weight) is not SparseTensor:
        return False
    st = weight._storage
    return st.ndim == 2 and st.format.block is None and st.values.dtype in _COLUMN_DTYPES


def add_bias_(out: torch.Tensor, bias: torch.Tensor) -> None:
    """``out += bias`` where ``out`` is this call's own result. A bias on another device
    raises as dense ``F.linear`` does: torch's CPU ``add_`` with a meta operand does nothing
    at all (a layer built under ``torch.device("meta")`` whose bias was never materialized
    returned ``x @ W^T`` without it)."""
    if bias.device != out.device:
        raise RuntimeError(f"F.linear: the bias is on device {bias.device}, the result on "
                           f"{out.device} (materialize it first, e.g. module.to_empty(device="
                           f"'cpu') and initialize it)")
    out.add_(bias)


def _plain_bias(bias, dtype) -> bool:
    return bias is None or (isinstance(bias, torch.Tensor) and not is_sparse_operand(bias)
                            and bias.dim() <= 1 and bias.dtype == dtype)


def _batch_transposed(x) -> torch.Tensor:
    """``x^T`` dense and contiguous (K x B) for a 2-D dense or sparse batch."""
    if type(x) is SparseTensor:   # the CSR batch written straight into its transpose
        return to_dense(x._storage.permuted((1, 0)))
    return transposed(x, threads_for)


#: batch panels (see ``_batch_panel``) pay where the product does at least this many
#: multiply-adds (stored weights x batch rows): each panel costs a few calls' fixed time
PANEL_MIN_WORK = 20_000_000
#: and where the transposed batch and result take more than this many L2 caches
PANEL_MIN_L2 = 2
#: the narrowest panel (batch rows): shorter rows make the kernels' vector loops short
PANEL_MIN_ROWS = 64


def _batch_panel(batch: int, inputs: int, outputs: int, weight_nnz: int, itemsize: int) -> Optional[int]:
    """Batch rows per panel of the column form, or None for the whole batch at once.

    ``x^T`` and ``y^T`` (or ``g^T`` in the backward) are re-read once per stored weight
    (a row of B values each). Where the two outgrow L2 (a 4096 -> 4096 layer at batch
    512: 16 MB), every read comes from L3; panels of the batch whose two transposes fit
    one core's L2 keep them there, one pass over the weight's pattern per panel. Measured
    (1 thread, Zen 5, 1 MiB L2), forward / weight-gradient SDDMM, whole -> panels:
    4096 -> 4096 at 1 % 5.3 -> 3.8 / 5.8 -> 3.7 ms, at 10 % 45 -> 26 ms (SDDMM);
    1024 -> 1024 at 10 % 1.61 -> 1.38 / 2.54 -> 1.46 ms; at 1 % (5M multiply-adds) and
    784 -> 256 at 10 % panels lose (0.38 -> 0.45 ms): below ``PANEL_MIN_WORK``. The width
    fills one L2 with the two panels, at least ``PANEL_MIN_ROWS`` rows (4096 -> 4096: 64,
    better than 32 or 128 there; 1024 -> 1024: 128, better than 64 or 256)."""
    if weight_nnz * batch < PANEL_MIN_WORK:
        return None
    l2 = l2_cache_bytes()
    per_row = (inputs + outputs) * itemsize
    if batch * per_row <= PANEL_MIN_L2 * l2:
        return None
    rows = max(PANEL_MIN_ROWS, (l2 // per_row) // 16 * 16)
    return rows if rows < batch else None


def _column_panel(x, weight: SparseTensor) -> Optional[int]:
    """``_batch_panel`` for this batch and weight."""
    W = weight._storage
    values = W.values
    return _batch_panel(x.shape[0], W.shape[1], W.shape[0], values.numel(), values.element_size())


def _panels(batch: int, rows: Optional[int]):
    """The (start, stop) batch rows of each panel."""
    if rows is None:
        return [(0, batch)]
    return [(s, min(s + rows, batch)) for s in range(0, batch, rows)]


def _panel_forward(x, weight: SparseTensor, bias, rows: Optional[int]):
    """The column form over the batch's panels: ``(y, [x_p^T for each panel])``."""
    batch = x.shape[0]
    if rows is None:
        xt = _batch_transposed(x)
        return _column_forward(xt, weight, bias), [xt]
    out = torch.empty(batch, weight._storage.shape[0], dtype=weight._storage.values.dtype)
    xts = []
    for lo, hi in _panels(batch, rows):
        xt = _batch_transposed(x[lo:hi])
        xts.append(xt)
        out[lo:hi] = _column_forward(xt, weight, None)
    if bias is not None:
        add_bias_(out, bias)
    return out, xts


def _column_forward(xt: torch.Tensor, weight: SparseTensor, bias) -> torch.Tensor:
    """``(W @ x^T)^T + b``, contiguous (B x N). The SpMM as ``W @ x^T`` takes (for a weight
    whose product format inference makes dense) the warm call in C: 8 us less than asking
    for a dense output, which goes through the Python runner."""
    out_t = _sparse_dense(weight, xt)
    if out_t is None:
        out_t = _einsum_entry._compiler().einsum(_COLUMN_EQUATION, weight._storage, xt, out_format="dense")
    out = transposed(out_t, threads_for)
    if bias is not None:
        add_bias_(out, bias)
    return out


class _ColumnBatchLinear(torch.autograd.Function):
    """``x @ W^T + b`` for a sparse weight, the batch as the SpMM's dense columns (see the
    module docstring). ``x`` is a dense 2-D batch or a SparseTensor that needs no
    gradient; only ``x^T`` is kept for the backward (one per batch panel where the batch
    runs in panels: ``_batch_panel``). Double backward re-runs the composed
    graph."""

    @staticmethod
    def forward(ctx, x, weight: SparseTensor, bias):
        ctx.rows = _column_panel(x, weight)
        out, xts = _panel_forward(x, weight, bias, ctx.rows)
        ctx.save_for_backward(x, weight, bias, *xts)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, bias, *xts = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():   # create_graph: the composed, differentiable graph
            return _composed_gradients("aj,oj->ao", (x, weight, bias), needs, grad)
        from ..gradients import einsum_grad, functions
        compiler = _einsum_entry._compiler()
        W = weight._storage
        grad_x = grad_w = None
        if needs[0]:   # a dense batch's: g @ W, each output row a sum of W's rows
            grad_x = compiler.einsum("ao,oj->aj", grad.contiguous(), W, out_format="dense")
        if needs[1]:   # on W's pattern ("oj,oa,ja->oj"): dot products of two contiguous rows
            vals = None    # summed over the batch's panels (one panel: the whole batch)
            for (lo, hi), xt in zip(_panels(grad.shape[0], ctx.rows), xts):
                gt = transposed(grad if ctx.rows is None else grad[lo:hi], threads_for)
                plan = einsum_grad.gradient_plan(_COLUMN_EQUATION, (W.shape, tuple(xt.shape)), 0, True)
                part = einsum_grad.pattern_gradient_values(plan, W, gt, xt, compiler)
                if part is None:      # declined: the general gradient, over the whole batch
                    xt = xts[0] if len(xts) == 1 else _batch_transposed(x)
                    gt = transposed(grad, threads_for)
                    plan = einsum_grad.gradient_plan(_COLUMN_EQUATION, (W.shape, tuple(xt.shape)), 0, True)
                    grad_w = einsum_grad.operand_gradient(plan, functions.einsum, gt, (weight.detach(), xt))
                    vals = None
                    break
                vals = part if vals is None else vals.add_(part)
            if vals is not None:
                grad_w = SparseTensor(_pattern.with_pattern_values(W, vals))
            grad_w = mark_gradient(grad_w)
        grad_b = grad.sum_to_size(bias.shape) if needs[2] else None
        return grad_x, grad_w, grad_b


def _column_batch_linear(x, weight, bias, lead: tuple) -> torch.Tensor:
    """The column form for a batch flattened to 2-D, its leading shape ``lead`` restored."""
    if torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        out = _ColumnBatchLinear.apply(x, weight, bias)
    else:
        out = _panel_forward(x, weight, bias, _column_panel(x, weight))[0]
    return out.view(*lead, out.shape[-1]) if len(lead) != 1 else out


# --- the sparse batch kept sparse ---------------------------------------------------------------

def _input_major(weight: SparseTensor) -> SparseTensor:
    """A sparse weight (out, in) stored input-major (CSR -> CSC), for ``x @ W^T`` with a
    sparse ``x``: the kernel walks each input row's stored features and, for each, the
    weights that read it (a scatter into the output row); handed over as stored, the weight
    would be transposed by the compiler on every call. The converted pattern and the
    permutation of positions are kept while the weight's pattern lives
    (``pattern.reformat_permutation``), so a step only gathers the current values,
    differentiably: the weight's gradient is computed on this pattern (an SDDMM that walks
    each input feature's weights, reading the batch by columns) and flows back through the
    gather to the weight's own positions."""
    got = _input_major_kept(weight)
    if got is None:
        return weight
    st = weight._storage
    conv, perm = got
    if torch.is_grad_enabled() and weight.requires_grad:
        return from_values(conv, _pattern.permuted(values_of(weight), perm))
    return SparseTensor(_pattern.reformatted(st, conv.format))


def _input_major_kept(weight: SparseTensor):
    """The weight's input-major pattern and permutation (``pattern.reformat_permutation``),
    or None where it is already input-major, blocked or not a matrix. Memoized on the
    weight for its current storage: a training step asks once per forward, and a lookup
    here costs less than the kept conversion's key."""
    st = weight._storage
    if st.ndim != 2 or st.format.block is not None or st.format.mode_order[0] == 1:
        return None
    memo = weight.__dict__.get("_input_major")
    if memo is not None and memo[0] is st:
        return memo[1]
    kept = _pattern.reformat_permutation(st, st.format.transposed_copy((1, 0)))
    weight.__dict__["_input_major"] = (st, kept)
    return kept


def _dense_product_linear(equation: str, input, weight: SparseTensor) -> torch.Tensor:
    """``input @ weight^T`` as a dense result, through the differentiable pieces: the
    input-major weight (a gather node) and the einsum (its Function)."""
    return _einsum_entry.einsum(equation, input, _input_major(weight), out_format="dense")


def _sparse_batch_linear(equation: str, input, weight, bias) -> Optional[torch.Tensor]:
    """``F.linear`` of a sparse batch through a sparse weight with a dense result, as ONE
    autograd node (``_SparseBatchLinear``) where the weight is a SparseTensor with a kept
    input-major permutation and the bias is absent or a dense vector; None otherwise (the
    caller composes the differentiable pieces)."""
    if type(input) is not SparseTensor or type(weight) is not SparseTensor:
        return None
    if not _plain_bias(bias, weight._storage.values.dtype):
        return None
    kept = _input_major_kept(weight)
    if kept is None:
        return None
    return _SparseBatchLinear.apply(equation, kept, input, weight, bias)


class _SparseBatchLinear(torch.autograd.Function):
    """``input @ weight^T + bias`` for a sparse batch and a sparse weight in one graph node:
    the forward gathers the weight's values into its kept input-major pattern, runs the one
    kernel and adds the bias in place; the backward runs the gradient einsums
    (``einsum_grad``, as ``scorch.einsum``'s own backward does) on that pattern and gathers
    the weight's gradient back to its own positions. The same work as the composed graph
    (gather node, einsum Function, bias add) without three nodes' Python per step. Double
    backward re-runs the composed graph."""

    @staticmethod
    def forward(ctx, equation: str, kept, input: SparseTensor, weight: SparseTensor, bias):
        ctx.equation, ctx.kept = equation, kept
        ctx.input_major = _pattern.through_permutation(weight._storage, kept)
        out = _einsum_entry._compiler().einsum(equation, input._storage, ctx.input_major,
                                               out_format="dense")
        if bias is not None:
            add_bias_(out, bias)
        ctx.save_for_backward(input, weight, bias)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        input, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        if torch.is_grad_enabled():   # create_graph: the composed, differentiable graph
            return (None, None) + _composed_gradients(ctx.equation, (input, weight, bias), needs, grad)
        from ..gradients import einsum_grad, functions
        P, shapes = ctx.input_major, (_shape(input), ctx.input_major.shape)
        grads = [None, None]
        if needs[1]:   # the weight's: on its input-major pattern, then gathered back
            plan = einsum_grad.gradient_plan(ctx.equation, shapes, 1, True)
            vals = einsum_grad.pattern_gradient_values(plan, P, grad, input._storage, _einsum_entry._compiler())
            if vals is None:
                vals = einsum_grad.operand_gradient(plan, functions.einsum, grad,
                                                    (input, SparseTensor(P)))._storage.values
            vals = _pattern.inverse_permuted(vals, ctx.kept[1])
            grads[1] = SparseTensor(_pattern.with_pattern_values(weight._storage, vals))
        if needs[0]:
            plan = einsum_grad.gradient_plan(ctx.equation, shapes, 0, True)
            grads[0] = einsum_grad.operand_gradient(plan, functions.einsum, grad, (input, SparseTensor(P)))
        bias_grad = grad.sum_to_size(bias.shape) if needs[2] else None
        return None, None, mark_gradient(grads[0]), mark_gradient(grads[1]), bias_grad


def _composed_gradients(equation: str, inputs: tuple, needs: tuple, grad: torch.Tensor) -> tuple:
    """The gradients of a fused node's inputs through the composed graph, built again with
    ``create_graph`` (double backward)."""
    x, w, b = inputs
    with torch.enable_grad():
        out = _dense_product_linear(equation, x, w)
        if b is not None:
            out = out + b
    wanted = [t for t, need in zip(inputs, needs) if need]
    got = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
    return tuple(next(got) if need else None for need in needs)


# --- F.linear -----------------------------------------------------------------------------------

def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear``: ``input @ weight.T + bias`` with the transpose folded into the einsum
    (no copy), sparse weight or sparse input."""
    si, sw = _shape(input), _shape(weight)
    if len(sw) not in (1, 2):
        raise RuntimeError(f"linear: weight must be 1-D or 2-D, got shape {sw}")
    if len(si) == 0:
        raise RuntimeError("linear: input must have at least 1 dimension")
    if si[-1] != sw[-1]:
        raise RuntimeError(f"linear: input shape {si} and weight shape {sw} cannot be "
                           f"multiplied ({si[-1]} != {sw[-1]})")
    _check_dtypes("linear", input, weight)
    if bias is not None and _dtype(bias) != _dtype(weight):
        raise RuntimeError(f"linear: bias must have the dtype of input and weight ({_dtype(weight)}), "
                           f"got {_dtype(bias)}")
    lead = _BATCH_LETTERS[:len(si) - 1]
    if len(lead) != len(si) - 1:
        raise RuntimeError("linear: too many leading dimensions")
    if len(sw) == 2 and len(si) >= 2 and is_sparse_operand(weight) \
            and not is_sparse_operand(input):
        x2 = input.reshape(math.prod(si[:-1]), si[-1])
        if _column_weight(weight) and type(input) is torch.Tensor and _plain_bias(bias, input.dtype):
            return _column_batch_linear(x2, weight, bias, si[:-1])
        # the same product through the general einsum (blocked or complex weights)
        out = _contract("oj,ja->oa", weight, x2.t()).t().contiguous().view(*si[:-1], sw[0])
    elif len(sw) == 2 and _fills_up(input, weight, si[-1]):
        # sparse @ sparse whose product stores (nearly) every entry (a sparse autoencoder's
        # CSR batch through a CSR weight): a dense result, so the layer stays a dense
        # activation and the weight's gradient an SDDMM on its pattern, not a three-way
        # intersection
        if len(si) == 2 and _column_weight(weight) and type(input) is SparseTensor \
                and not input.requires_grad and _plain_bias(bias, weight._storage.values.dtype) \
                and expand_pays(input._storage.nnz, si[0], si[1], weight._storage.nnz, sw[0]) \
                and _expansion_fits(si, weight._storage.values.element_size()):
            return _column_batch_linear(input, weight, bias, si[:-1])
        fused = _sparse_batch_linear(f"{lead}j,oj->{lead}o", input, weight, bias)
        if fused is not None:
            return fused
        out = _dense_product_linear(f"{lead}j,oj->{lead}o", input, weight)
    elif len(sw) == 2:
        out = gathered_columns_product(input, weight) if len(si) == 2 else None
        if out is None:
            out = _contract(f"{lead}j,oj->{lead}o", input, weight)
    else:
        out = _contract(f"{lead}j,j->{lead}", input, weight)
    return out if bias is None else elementwise.add(out, bias)


@register(torch.nn.functional.linear)
@autocast_aware
@_sparse_only
def _linear(input, weight, bias=None):
    # torch's sparse layouts as scorch tensors (sharing arrays): the paths below read _storage
    return linear(as_scorch(input), as_scorch(weight), bias)
