"""The front end's checks, shared by every entry point: the equation and operands are what
the compiler takes, and index variables' sizes agree (torch's broadcasting: a size-1
dimension takes the other operands' size). One function binds sizes for ``parse_einsum``,
``compute`` and every general-path call, so the three give the same answers and messages."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

__all__ = ["bind_sizes", "check_equation", "variable_name"]


def variable_name(v: str) -> str:
    """How a user reads an index variable: the einsum letter, or the ellipsis dimension."""
    return v if not v.startswith("_") else f"... dimension {v[1:]}"


def check_equation(equation: object) -> str:
    if not isinstance(equation, str):
        raise TypeError(f"einsum(): the equation must be a string such as 'ij,jk->ik', "
                        f"got {type(equation).__name__} {equation!r}")
    return equation


def bind_sizes(operand_indices: Sequence[Tuple[str, ...]], shapes: Sequence[Sequence[int]],
               labels: Optional[Sequence[str]] = None, caller: str = "einsum()") -> Dict[str, int]:
    """The size of every index variable. A size-1 dimension broadcasts; a variable repeated
    inside one operand (a diagonal, ``ii->i``) needs equal sizes there, as torch requires.
    ``labels[n]`` names operand ``n`` in messages (default ``operand n``)."""
    # the common case first (every occurrence of a variable has one size: no broadcast, no
    # message to prepare); it runs on every warm call (~0.4 us against ~1.8)
    sizes: Dict[str, int] = {}
    for idx, shape in zip(operand_indices, shapes):
        for v, s in zip(idx, shape):
            old = sizes.get(v)
            if old is None:
                sizes[v] = int(s)
            elif old != s:
                return _bind_broadcast(operand_indices, shapes, labels, caller)
    return sizes


def _bind_broadcast(operand_indices, shapes, labels, caller) -> Dict[str, int]:
    """``bind_sizes`` where some variable has two sizes: broadcasts, or the error."""
    sizes: Dict[str, int] = {}
    seen: Dict[str, str] = {}
    for n, (idx, shape) in enumerate(zip(operand_indices, shapes)):
        me = labels[n] if labels is not None else f"operand {n}"
        mine: Dict[str, int] = {}
        for v, s in zip(idx, shape):
            s = int(s)
            if mine.setdefault(v, s) != s:
                raise ValueError(
                    f"{caller}: subscript {variable_name(v)} is repeated for {me} but the "
                    f"sizes don't match, {mine[v]} != {s}")
            old = sizes.get(v)
            if old is None or old == 1:
                sizes[v] = s
                seen.setdefault(v, me)
            elif s != old and s != 1:
                raise ValueError(
                    f"{caller}: subscript {variable_name(v)} has size {s} for {me} which "
                    f"does not broadcast with previously seen size {old} ({seen[v]})")
    return sizes
