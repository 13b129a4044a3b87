"""Broadcast shapes without ``torch.broadcast_shapes``.

torch's version goes through ``torch._refs``: its first call imports ``torch.fx`` and sympy
(~0.2 s, about 500 modules), and every later call costs ~7 us. Elementwise ops on sparse
operands ask for the broadcast shape on every call, so that cost lands on the first op of
a process and on every small op after it; this is the same rule in plain Python."""
from __future__ import annotations

from typing import Tuple, Union

import torch

__all__ = ["broadcast_shapes"]

ShapeLike = Union[int, Tuple[int, ...], torch.Size]


def broadcast_shapes(*shapes: ShapeLike) -> torch.Size:
    """The shape that ``shapes`` broadcast to, with torch's errors (``RuntimeError`` for
    sizes that disagree, ``ValueError`` for a negative one)."""
    dims = [(s,) if isinstance(s, int) else tuple(s) for s in shapes]
    out = [1] * max((len(d) for d in dims), default=0)
    for i, d in enumerate(dims):
        for k in range(-1, -1 - len(d), -1):       # from the last dimension, as torch
            size = d[k]
            if out[k] == 1:
                if size < 0:
                    raise ValueError("Attempting to broadcast a dimension with negative length!")
                out[k] = size
            elif size != 1 and size != out[k]:
                raise RuntimeError(
                    f"Attempting to broadcast a dimension of length {size} at {k}! "
                    f"Mismatching argument at index {i} had {tuple(d)}; but expected shape "
                    f"should be broadcastable to {out}")
    return torch.Size(out)
