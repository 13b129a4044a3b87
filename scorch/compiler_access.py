"""The compiler package for the layers above it, imported on first use and kept: importing
it costs ~0.5 s (not paid by ``import scorch``), an import statement on every call ~2.5 us."""
from __future__ import annotations

_module = None


def compiler():
    """``scorch.tensor_compiler``, told which tensor type carries a Storage."""
    global _module
    if _module is None:
        from . import tensor_compiler
        from .tensor_type import SparseTensor
        tensor_compiler.set_sparse_tensor_type(SparseTensor)
        _module = tensor_compiler
    return _module
