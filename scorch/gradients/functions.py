"""The ``torch.autograd.Function``s of the compiler's entry points: ``einsum`` and
``compute`` (index-notation assignments). Their backward passes are more einsums/compute
calls through the same compiler (``einsum_grad``, ``expr_grad``), made with the
differentiable entry points below, so double backward works wherever the pieces do.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ..formats import FormatLike
from ..level_storage import Storage
from ..compiler_access import compiler as _compiler
from ..tensor_compiler.index_notation import Assignment
from ..tensor_type import SparseTensor, _TORCH_SPARSE_LAYOUTS, _refuse_under_functorch
from . import einsum_grad, expr_grad, partial_product
from . import pattern as _pattern
from .values import from_torch, mark_gradient, values_of

__all__ = ["einsum", "compute", "needs_graph"]

def _saved(ctx, out, operands):
    """forward's bookkeeping: the operands, and a sparse output's pattern (its gradient
    lives there). A sparse operand's values are saved too: torch checks a saved tensor's
    version when backward reads it, and the values are what an in-place change
    (``A.mul_(2)`` under no_grad, an optimizer step) writes; the SparseTensor's own version
    counter never moves, so a changed operand went unnoticed and the backward read the new
    values."""
    ctx.out_pattern = out._storage.pattern_only() if isinstance(out, SparseTensor) else None
    ctx.n_operands = len(operands)
    ctx.save_for_backward(*operands, *(x._storage.values for x in operands
                                       if isinstance(x, SparseTensor)))
    return out


def _saved_operands(ctx) -> tuple:
    """The operands ``_saved`` kept (reading them checks that none changed in place). Under
    ``torch.autograd.graph.allow_mutation_on_saved_tensors()`` a changed operand's values
    come back as the copy torch kept of them: the operand is read with those."""
    saved = ctx.saved_tensors
    operands, values = list(saved[:ctx.n_operands]), iter(saved[ctx.n_operands:])
    for k, x in enumerate(operands):
        if isinstance(x, SparseTensor):
            v = next(values)
            if v is not x._storage.values:
                operands[k] = SparseTensor(x._storage.on_pattern(v))
    return tuple(operands)


def _on_output_pattern(ctx, grad):
    if ctx.out_pattern is not None and not isinstance(grad, SparseTensor):
        return einsum_grad.dense_to_pattern(ctx.out_pattern, grad)
    return grad


def _gradients(ctx, operands, gradient) -> tuple:
    """backward's result for (equation or assignment, out_format, *operands): ``gradient(n,
    x)`` for every operand that needs one, marked as a gradient on its pattern."""
    grads = [None, None]
    for n, x in enumerate(operands):
        grads.append(mark_gradient(gradient(n, x)) if ctx.needs_input_grad[n + 2] else None)
    return tuple(grads)


def _wrap(result):
    return SparseTensor(result) if type(result) is Storage else result


def needs_graph(operands: Sequence[Any]) -> bool:
    """Grad mode is on and some operand requires grad."""
    return torch.is_grad_enabled() and torch._C._any_requires_grad(*operands)


def _read_torch_layouts(what: str, operands) -> tuple:
    """The operands with each torch sparse tensor that requires grad read as a SparseTensor
    once, differentiably: its gradient flows back to it in its own layout
    (``values.from_torch``)."""
    out = list(operands)
    for n, x in enumerate(operands):
        if isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) and \
                x.layout in _TORCH_SPARSE_LAYOUTS and x.requires_grad:
            out[n] = from_torch(x, f"{what}: operand {n}")
    return tuple(out)


# --- the transposes a gradient kernel reads, kept on the tensor -----------------------------

def _output_first(equation: str, ops: list) -> list:
    """A dense operand's gradient einsum (``A^T @ grad_C`` for SpMM) reads a sparse operand
    whose outer stored level is summed: left as it is, the kernel scatters into the output
    (a workspace per row of the sum). The operand is handed over re-formatted instead, its
    output-indexed dimensions stored first (CSR -> CSC for ``A^T``), so the kernel walks it
    concordantly and writes each output row once; ``pattern.reformatted`` keeps the
    converted pattern and the permutation of positions, so a later backward step only
    gathers the current values (no transpose rebuilt per step)."""
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    new = None
    for n, (term, x) in enumerate(zip(terms, ops)):
        if not isinstance(x, SparseTensor) or x._storage.ndim < 2:
            continue
        fmt = x._storage.format
        if fmt.block is not None or term[fmt.mode_order[0]] in out:
            continue
        # dense levels under the last sparse one (attention scores' heads, 'dcdd') stay
        # last where another sparse operand is walked with the pattern (BigBird's k
        # gradient, ``bhij,ij,bhid->bhjd``: the pattern (j, i) as the CSC factor reads it,
        # 12.6 -> 6.7 ms, no second transpose); alone, each head's rows come first, so
        # the kernel sums an output row in registers (v's gradient: 2.6 ms, 6.5 ms without)
        partners = [o for m, o in enumerate(ops) if m != n and isinstance(o, SparseTensor)]
        tail = fmt.dense_tail() if partners else ()
        first = sorted((d for d in range(len(term)) if term[d] in out and d not in tail),
                       key=lambda d: out.index(term[d]))
        if not first:
            continue
        order = tuple(first) + tuple(d for d in fmt.mode_order if d not in first and d not in tail) + tail
        if new is None:
            new = list(ops)
        target = fmt.transposed_copy(order)
        if needs_graph((x,)):   # double backward through x: the differentiable conversion
            new[n] = x.to_format(target)
        else:
            new[n] = SparseTensor(_pattern.reformatted(x._storage, target))
    return ops if new is None else new


# --- einsum ---------------------------------------------------------------------------------

def _raw_einsum(equation: str, operands: Sequence, out_format: Optional[FormatLike]):
    return _wrap(_compiler().einsum(equation, *operands, out_format=out_format))


def _partial_split(ctx, equation: str, out_format, operands) -> Optional[partial_product.PartialPlan]:
    """The forward's split at its sparse operand (``partial_product``) where it pays and
    leaves the result as it was (dense), else None."""
    if out_format is not None:
        return None
    s = partial_product.needs(ctx.needs_input_grad[2:], operands, SparseTensor)
    if s is None:
        return None
    plan = partial_product.partial_plan(equation, s, len(operands))
    if plan is None:
        return None
    S = operands[s]
    dtype = S.dtype
    for x in operands:
        dtype = torch.promote_types(dtype, x.dtype)
    if not partial_product.pays(plan, equation, ctx.shapes, S._storage.nnz, dtype.itemsize):
        return None
    if not _compiler().result_is_dense(equation, *operands):
        return None
    return plan


class EinsumFunction(torch.autograd.Function):
    """``C = einsum(equation, *operands)``; backward: one gradient einsum per operand that
    needs one (``einsum_grad``). Where a sparse operand's gradient would recontract what
    the forward contracted, the forward keeps that product (``partial_product``)."""

    @staticmethod
    def forward(ctx, equation: str, out_format, *operands):
        ctx.equation = equation
        ctx.shapes = tuple(tuple(int(s) for s in x.shape) for x in operands)
        ctx.partial = None
        plan = _partial_split(ctx, equation, out_format, operands)
        if plan is None:
            return _saved(ctx, _raw_einsum(equation, operands, out_format), operands)
        S = operands[plan.s]
        ones = SparseTensor(_pattern.with_pattern_values(S._storage, torch.ones_like(values_of(S))))
        P = _raw_einsum(plan.p_equation, (ones,) + tuple(operands[m] for m in plan.others),
                        partial_product.dense_format(plan))
        ctx.partial = (plan, P)
        return _saved(ctx, _raw_einsum(plan.out_equation, (P, S), None), operands)

    @staticmethod
    def backward(ctx, grad):
        operands, grad = _saved_operands(ctx), _on_output_pattern(ctx, grad)

        def gradient(n, x):
            if ctx.partial is not None and n == ctx.partial[0].s and not torch.is_grad_enabled():
                return _partial_gradient(ctx, grad, x)
            plan = einsum_grad.gradient_plan(ctx.equation, ctx.shapes, n, isinstance(x, SparseTensor))
            return einsum_grad.operand_gradient(plan, einsum, grad, operands, _output_first)
        return _gradients(ctx, operands, gradient)


def _partial_gradient(ctx, grad, S):
    """The sparse operand's gradient from the kept product: ``P, S -> C``'s gradient in
    ``S`` (a dot of ``grad_C`` and ``P`` at each stored entry)."""
    plan, P = ctx.partial
    gplan = einsum_grad.gradient_plan(plan.out_equation, (tuple(P.shape), tuple(S.shape)), 1, True)
    return einsum_grad.operand_gradient(gplan, einsum, grad, (P, S), _output_first)


def einsum(equation: str, *operands, out_format: Optional[FormatLike] = None) -> torch.Tensor:
    """``scorch.einsum(equation, *operands)`` (equation form), differentiable in every
    operand when grad mode is on."""
    if needs_graph(operands):
        operands = _read_torch_layouts("einsum", operands)
        if out_format is None and not any(isinstance(x, SparseTensor) or x.layout in
                                          _TORCH_SPARSE_LAYOUTS for x in operands
                                          if isinstance(x, torch.Tensor)):
            return torch.einsum(equation, *operands)   # dense: torch's own autograd
        return EinsumFunction.apply(equation, out_format, *operands)
    return _raw_einsum(equation, operands, out_format)


# --- compute (index-notation assignments) ---------------------------------------------------

def _raw_compute(assignment: Assignment, operands: Sequence, out_format):
    try:
        return _wrap(_compiler().compute(assignment, *operands, out_format=out_format))
    except RuntimeError as e:
        # a backward vmapped by autograd (jacobian(vectorize=True)) hands batched gradients
        # without memory: named as the unsupported transform (the error path only)
        _refuse_under_functorch(e, operands)
        raise


class ComputeFunction(torch.autograd.Function):
    """``out = compute(assignment, *operands)`` with the product/sum rule per access
    (``expr_grad``)."""

    @staticmethod
    def forward(ctx, assignment: Assignment, out_format, *operands):
        ctx.assignment = assignment
        return _saved(ctx, _raw_compute(assignment, operands, out_format), operands)

    @staticmethod
    def backward(ctx, grad):
        operands, grad = _saved_operands(ctx), _on_output_pattern(ctx, grad)
        return _gradients(ctx, operands, lambda n, x: expr_grad.operand_gradient(
            ctx.assignment, n, grad, operands, compute))


def compute(assignment: Assignment, *operands, out_format: Optional[FormatLike] = None):
    """``scorch.tensor_compiler.compute`` for the op layer: runs an index-notation
    assignment (elementwise ``Mul``/``Add``/``Sub``/``Neg``/``Scalar`` expressions with
    einsum-style sums), differentiable in every operand when grad mode is on; sparse results
    are SparseTensors."""
    if needs_graph(operands):
        operands = _read_torch_layouts("compute", operands)
        return ComputeFunction.apply(assignment, out_format, *operands)
    return _raw_compute(assignment, operands, out_format)
