"""Uninitialized and zeroed buffers for kernel outputs, dense results and scratch copies."""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["EMPTY_NUMPY_MIN", "empty_output", "zeros_output"]


#: outputs of at least this many elements are allocated through numpy (see empty_output)
EMPTY_NUMPY_MIN = 1 << 18

#: the alignment of a numpy-allocated output: a cache line, as torch's own allocator gives
#: (glibc's big blocks start 16 bytes past a page; rows of 32 float32 then span 3 lines and
#: every vector load of a later kernel splits, 8-43 % slower)
_ALIGN = 64


def _numpy_block(shape, dtype: torch.dtype, zeroed: bool) -> torch.Tensor:
    """A cache-line aligned tensor in numpy's memory. numpy asks the kernel for transparent
    huge pages on big blocks, and its zeroed blocks come from ``calloc``, which leaves fresh
    pages to the kernel's zero fill (no memset: a page nothing writes is never touched)."""
    nbytes = torch.empty((), dtype=dtype).element_size() * math.prod(shape)
    block = (np.zeros if zeroed else np.empty)(nbytes + _ALIGN, dtype=np.uint8)
    skip = -block.ctypes.data % _ALIGN
    storage = torch.from_numpy(block[skip:skip + nbytes]).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)   # not a view of the bytes


def empty_output(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized output. Big ones come from numpy's allocator: first-touch page faults
    of a fresh 167 MB ``torch.empty`` cost ~80 ms on the dev box (THP in ``madvise`` mode),
    ~17 ms with huge pages, more than an SpMM over that output."""
    if math.prod(shape) < EMPTY_NUMPY_MIN:
        return torch.empty(shape, dtype=dtype)
    return _numpy_block(tuple(shape), dtype, False)


def zeros_output(shape, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed output, for a dense result that a pass over stored entries writes into
    (``to_dense``). A big one skips ``torch.zeros``'s memset and its small pages: 5000 x 5000
    float32 from 25k entries 48 -> 9 ms on the dev box."""
    if math.prod(shape) < EMPTY_NUMPY_MIN:
        return torch.zeros(shape, dtype=dtype)
    return _numpy_block(tuple(shape), dtype, True)
