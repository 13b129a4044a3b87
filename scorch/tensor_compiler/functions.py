"""The elementwise functions index expressions may apply, in one table: what each computes
(a C expression of its argument ``{x}`` and parameter ``{p}``) and whether it maps 0 to 0.

The zero-preserving column is what format inference (paper Algorithm 4) and the merge
lattice read (in the style of JAX sparse's list of zero-preserving primitives): a function
that keeps 0 at 0 is computed only where its argument may be nonzero, so a sparse argument
gives a sparse result; a function that maps 0 elsewhere (``exp``, ``cos``, ``sigmoid``) makes
the result dense by nature. ``pow`` keeps 0 only for a positive exponent."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["Function", "FUNCTIONS", "function"]


@dataclass(frozen=True)
class Function:
    name: str
    c_expr: str                        # with {x} (the argument) and {p} (the parameter)
    zero_preserving: bool              # f(0) == 0 (for pow: when the exponent is positive)
    math: Tuple[str, ...] = ()         # libc.math names the expression uses
    parameter: bool = False            # takes a scalar parameter (pow's exponent)

    def preserves_zero(self, p: Optional[float] = None) -> bool:
        if self.name == "pow":
            return p is not None and p > 0
        return self.zero_preserving


_TABLE = [
    # maps 0 to 0: stays sparse
    Function("abs", "({x} if {x} >= 0 else -({x}))", True),   # any value type (fabs: doubles)
    Function("relu", "({x} if {x} > 0 else 0)", True),
    Function("sqrt", "sqrt({x})", True, ("sqrt",)),
    Function("sin", "sin({x})", True, ("sin",)),
    Function("tanh", "tanh({x})", True, ("tanh",)),
    Function("sign", "((({x}) > 0) - (({x}) < 0))", True),
    Function("pow", "pow({x}, {p})", True, ("pow",), parameter=True),
    Function("square", "(({x}) * ({x}))", True),
    # maps 0 elsewhere: dense by nature
    Function("exp", "exp({x})", False, ("exp",)),
    Function("cos", "cos({x})", False, ("cos",)),
    Function("sigmoid", "(1 / (1 + exp(-({x}))))", False, ("exp",)),
    Function("log", "log({x})", False, ("log",)),
]

FUNCTIONS: Dict[str, Function] = {f.name: f for f in _TABLE}


def function(name: str) -> Function:
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown elementwise function {name!r}; known: "
                         f"{', '.join(sorted(FUNCTIONS))}") from None
