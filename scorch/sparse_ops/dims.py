"""Dimension arguments checked as torch checks them: one place, so that no op wraps an
out-of-range ``dim`` around the rank (``flip(2)`` on a matrix flipping dim 0) or takes a
repeated one once."""
from __future__ import annotations

import numbers
from typing import List, Optional, Sequence, Union

__all__ = ["checked_dim", "checked_dims"]


def checked_dim(dim, rank: int, name: Optional[str] = None, argument: str = "dim") -> int:
    """``dim`` in ``[0, rank)`` (a 0-d tensor takes -1 and 0, as torch); torch's IndexError
    otherwise, and a TypeError (naming ``argument``) for what is not an int."""
    prefix = f"{name}(): " if name else ""
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool):
        raise TypeError(f"{prefix}{argument} must be an int, got {dim!r}")
    n = max(rank, 1)
    if not -n <= dim < n:
        raise IndexError(f"{prefix}Dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return int(dim) % n


def checked_dims(dims: Union[int, Sequence[int]], rank: int, name: Optional[str] = None,
                 argument: str = "dim") -> List[int]:
    """Each of ``dims`` (an int or a sequence) checked; a dim named twice raises, as torch."""
    dims = [dims] if isinstance(dims, numbers.Integral) else list(dims)
    out = [checked_dim(d, rank, name, argument) for d in dims]
    if len(set(out)) != len(out):
        repeated = next(d for d in out if out.count(d) > 1)
        prefix = f"{name}(): " if name else ""
        raise RuntimeError(f"{prefix}{argument} {repeated} appears multiple times in the list "
                           f"of dims")
    return out
