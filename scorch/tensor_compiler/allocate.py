"""Uninitialized buffers for kernel outputs and scratch copies."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["EMPTY_NUMPY_MIN", "empty_output"]


#: outputs of at least this many elements are allocated through numpy (see empty_output)
EMPTY_NUMPY_MIN = 1 << 18

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
              torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
              torch.uint8: np.uint8}


def empty_output(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized output. Big ones come from numpy's allocator, which asks the kernel
    for transparent huge pages (``madvise``): first-touch page faults of a fresh 167 MB
    ``torch.empty`` cost ~80 ms on the dev box (THP in ``madvise`` mode), ~17 ms this way,
    more than an SpMM over that output."""
    n = 1
    for d in shape:
        n *= d
    npt = _NP_DTYPES.get(dtype)
    if npt is None or n < EMPTY_NUMPY_MIN:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(np.empty(shape, dtype=npt))
