"""The elementwise functions index expressions may apply, in one table: what each computes
(a C expression of its argument ``{x}`` and parameter ``{p}``) and whether it maps 0 to 0.

The zero-preserving column is what format inference (paper Algorithm 4) and the merge
lattice read (in the style of JAX sparse's list of zero-preserving primitives): a function
that keeps 0 at 0 is computed only where its argument may be nonzero, so a sparse argument
gives a sparse result; a function that maps 0 elsewhere (``exp``, ``cos``, ``sigmoid``) makes
the result dense by nature. ``pow`` keeps 0 only for a positive exponent."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

__all__ = ["Function", "FUNCTIONS", "function"]


@dataclass(frozen=True)
class Function:
    name: str
    c_expr: str                        # with {x} (the argument) and {p} (the parameter)
    zero_preserving: bool              # f(0) == 0 (for pow: when the exponent is positive)
    math: Tuple[str, ...] = ()         # libc.math names the expression uses
    parameter: bool = False            # takes a scalar parameter (pow's exponent)
    #: torch's op for the same function over a values array (``shared_pattern`` computes
    #: operands on one pattern with it); None: only the kernel computes it
    torch_op: Optional[Callable] = None

    def preserves_zero(self, p: Optional[float] = None) -> bool:
        if self.name == "pow":
            return p is not None and p > 0
        return self.zero_preserving


_TABLE = [
    # maps 0 to 0: stays sparse
    Function("abs", "({x} if {x} >= 0 else -({x}))", True, torch_op=torch.abs),   # any value type (fabs: doubles)
    Function("relu", "({x} if {x} > 0 else 0)", True, torch_op=torch.relu),
    Function("sqrt", "sqrt({x})", True, ("sqrt",), torch_op=torch.sqrt),
    Function("sin", "sin({x})", True, ("sin",), torch_op=torch.sin),
    Function("tanh", "tanh({x})", True, ("tanh",), torch_op=torch.tanh),
    Function("sign", "((({x}) > 0) - (({x}) < 0))", True, torch_op=torch.sign),
    Function("pow", "pow({x}, {p})", True, ("pow",), parameter=True, torch_op=torch.pow),
    Function("square", "(({x}) * ({x}))", True, torch_op=torch.square),
    # maps 0 elsewhere: dense by nature
    Function("exp", "exp({x})", False, ("exp",), torch_op=torch.exp),
    Function("cos", "cos({x})", False, ("cos",), torch_op=torch.cos),
    Function("sigmoid", "(1 / (1 + exp(-({x}))))", False, ("exp",), torch_op=torch.sigmoid),
    Function("log", "log({x})", False, ("log",), torch_op=torch.log),
]

FUNCTIONS: Dict[str, Function] = {f.name: f for f in _TABLE}


def function(name: str) -> Function:
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown elementwise function {name!r}; known: "
                         f"{', '.join(sorted(FUNCTIONS))}") from None
