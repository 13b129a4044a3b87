"""Kernels named by loop depth, not by the caller's index letters.

``einsum("ij,jk->ik")`` and ``einsum("bn,nd->bd")`` are the same kernel; named after their
letters, each compiled a module of its own (10-60 s on first use) and only the first found
the install-time kernels (``prebuilt``). Code generation therefore runs on the schedule with
every index variable renamed after its loop depth (:func:`depth_name`): equal schedules give
equal source, one module, one cache entry. The kernel's argument table is mapped back to
the caller's variables, which the plan binds sizes and strides by. The compiled source
names the loops ``i, j, k, l, ...`` outermost first (the letters of the common ``i, j, k``
nests), whatever the caller called them; plans, error messages and ``explain`` (its source
and loop IR too: the same kernel, renamed) keep the caller's letters."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from .index_notation import Access, Assignment, Expr
from .schedule import Schedule

__all__ = ["depth_name", "canonical_schedule", "caller_args"]


_LETTERS = "ijklmnopqrstuvwxyzabcdefgh"


def depth_name(depth: int) -> str:
    """The kernel's name of the loop variable at ``depth``."""
    return _LETTERS[depth] if depth < len(_LETTERS) else f"v{depth}"


def canonical_schedule(s: Schedule) -> Tuple[Schedule, Dict[str, str]]:
    """``s`` with its variables renamed by loop depth (variables outside the loops, if any,
    numbered after them), and the map from the new names back to the caller's."""
    order = list(s.loop_order)
    names = {v: depth_name(n) for n, v in enumerate(order + [v for v in s.assignment.all_vars
                                                             if v not in order])}
    back = {new: old for old, new in names.items()}
    if all(k == v for k, v in names.items()):
        return s, back

    def one(v: str) -> str:
        return names.get(v, v)

    def many(vs: Sequence[str]) -> Tuple[str, ...]:
        return tuple(one(v) for v in vs)
    accesses = [dataclasses.replace(ap, indices=many(ap.indices),
                                    levels=[dataclasses.replace(lv, var=one(lv.var)) for lv in ap.levels])
                for ap in s.accesses]
    out = s.output
    output = dataclasses.replace(out, vars=many(out.vars), level_vars=many(out.level_vars),
                                 ws_vars=many(out.ws_vars), layout=many(out.layout))
    tile = s.cache_tile
    if tile is not None:
        tile = dataclasses.replace(tile, var=one(tile.var), above=one(tile.above), block=many(tile.block))
    asg = s.assignment
    assignment = Assignment(many(asg.output), _renamed(asg.rhs, names), asg.reduce, asg.exact)
    return dataclasses.replace(s, assignment=assignment, loop_order=[one(v) for v in order],
                               accesses=accesses, output=output, tiled=[one(v) for v in s.tiled],
                               cache_tile=tile), back


def _renamed(e: Expr, names: Dict[str, str]) -> Expr:
    if isinstance(e, Access):
        return Access(e.tensor, [names.get(v, v) for v in e.indices])
    kids = {f: _renamed(getattr(e, f), names) for f in ("c", "a", "b")
            if isinstance(getattr(e, f, None), Expr)}
    return dataclasses.replace(e, **kids) if kids else e


#: the argument kinds (``loop_ir.ArgSpec``'s ``what``) whose last item is a variable
_BY_VARIABLE = ("size", "stride", "ostride")


def caller_args(args: Sequence[tuple], back: Dict[str, str]) -> List[tuple]:
    """The kernel's ``(name, C type, what)`` fields with the variables in ``what`` the
    caller's again (``arguments.arg_table`` binds them from the plan's own schedule)."""
    out = []
    for name, ctype, what in args:
        if what[0] in _BY_VARIABLE:
            what = what[:-1] + (back.get(what[-1], what[-1]),)
        out.append((name, ctype, what))
    return out
