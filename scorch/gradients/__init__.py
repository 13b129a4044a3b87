"""Autograd for scorch: gradients of einsums and index expressions as more einsums through
the same compiler (``einsum_grad``, ``expr_grad`` with the elementwise functions' table in
``derivatives``, the Functions in ``functions``), the per-fiber ops' rules (softmax, amax:
``fiber_ops``), sparse gradients on the operand's pattern (``pattern``, ``values``), and the
values-level ATen ops that gradient accumulation and torch optimizers call on sparse
tensors (``optim_ops``).

Importing the package registers the ATen handlers and the differentiable ``values`` /
``to_dense`` / ``to_format``; the compiler side (``functions``) is imported on first use,
like the compiler itself.
"""
from typing import Optional

from ..formats import FormatLike
from . import gradcheck, optim_ops, values  # noqa: F401  (registration)

gradcheck.install()

__all__ = ["compute", "einsum"]


def compute(assignment, *operands, out_format: Optional[FormatLike] = None):
    """``scorch.tensor_compiler.compute`` for the op layer: an index-notation assignment
    (``Mul``/``Add``/``Sub``/``Neg``/``Scalar`` expressions with einsum-style sums) over dense
    and sparse operands, differentiable in every operand when grad mode is on; a sparse
    result is a SparseTensor."""
    from .functions import compute as run
    return run(assignment, *operands, out_format=out_format)


def einsum(equation: str, *operands, out_format: Optional[FormatLike] = None):
    """``scorch.einsum`` in equation form, differentiable in every operand."""
    from .functions import einsum as run
    return run(equation, *operands, out_format=out_format)
