"""Scorch: sparse tensors as a first-class, compiled part of PyTorch on the CPU.

``import scorch as torch`` gives every public name of torch; scorch replaces only the
functions it extends for sparse operands, and those give torch's own result, through
torch's own kernels, when every operand is dense.
"""
from ._runtime import require_built as _require_built

_require_built()   # a source checkout without compiled extensions: say so, not fail later

import torch as _torch  # noqa: E402
from torch import *  # noqa: F401,F403  (the drop-in surface)

from . import _torch_alias

_torch_alias.install()

from . import nn, sparse  # noqa: E402,F401
from .formats import Format, LevelKind, as_format, compressed, coordinate, dense  # noqa: E402,F401
from .level_kinds import singleton  # noqa: E402,F401
from .level_storage import Level  # noqa: E402,F401  (Storage: scorch.level_storage.Storage; torch.Storage stays torch's)
from .tensor_type import SparseTensor  # noqa: E402,F401
from .constructors import from_scipy, sparse_tensor, tensor  # noqa: E402,F401
from . import aten_ops, sparse_ops  # noqa: E402,F401  (registers the sparse handlers)
from . import collectives  # noqa: E402,F401  (torch.distributed on SparseTensor; saving: via tensor_type)
from . import data_loading  # noqa: E402,F401  (DataLoader batches of sparse samples stay sparse)
from . import gradients  # noqa: E402,F401  (sparse autograd: values-level ATen ops)
from . import library_ops  # noqa: E402,F401  (torch.ops.scorch.*: the kernels under torch.compile)
from .sparse_ops.einsum import einsum, explain  # noqa: E402,F401
from .tensor_compiler.planner import UnsupportedDtypeError  # noqa: E402,F401
from .sparse_ops.stored_zeros import eliminate_zeros  # noqa: E402,F401
from .kernel_cache import cache_clear, cache_info  # noqa: E402,F401
from ._dispatch import (DenseFallbackError, get_dense_fallback_limit,  # noqa: E402,F401
                        set_dense_fallback_limit)

from . import dynamo_rules as _dynamo_rules  # noqa: E402
from ._dispatch import mirror_method_forms as _mirror  # noqa: E402
_mirror()   # Tensor.X where only torch.X was registered, and the reverse

_dynamo_rules.mark_package(__name__)   # torch.compile: scorch calls run eagerly, never traced into

# a drop-in answers as torch: user version gates (``version.parse(torch.__version__) >= ...``)
# under ``import scorch as torch`` read torch's version; scorch's own is ``scorch_version``
__version__ = _torch.__version__
scorch_version = "0.1.0"


def __getattr__(name: str):
    if name == "CompileError":  # the compiler is imported on first use, not with scorch
        from .tensor_compiler.build import CompileError
        return CompileError
    # everything torch has that scorch does not define (torch.float32, torch.linalg, ...)
    return getattr(_torch, name)


def __dir__():
    return sorted(set(dir(_torch)) | set(globals()))
