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
import torch.nn.functional as F

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
    default: Optional[float] = None    # the parameter when none is given (leaky_relu's slope)
    #: a function of where its argument is stored, not of its value (``stored``): no torch
    #: function of a dense tensor computes it
    of_pattern: bool = False

    def param(self, p: Optional[float]) -> Optional[float]:
        return self.default if p is None else p

    def preserves_zero(self, p: Optional[float] = None) -> bool:
        if self.name == "pow":
            return p is not None and p > 0
        return self.zero_preserving


_TABLE = [
    # 1 at every stored entry of its argument (a stored 0 too), nothing elsewhere: a kernel
    # that computes an expression on exactly its operand's pattern (softmax's exponentials,
    # exp(x - max) * stored(x)) reads one operand, where multiplying by a tensor of ones on
    # the same pattern co-iterated two and assembled the result
    Function("stored", "1", True, torch_op=torch.ones_like, of_pattern=True),
    # maps 0 to 0: stays sparse
    Function("abs", "({x} if {x} >= 0 else -({x}))", True, torch_op=torch.abs),   # any value type (fabs: doubles)
    Function("relu", "(0 if {x} <= 0 else {x})", True, torch_op=torch.relu),     # NaN stays NaN, as torch
    Function("sqrt", "sqrt({x})", True, ("sqrt",), torch_op=torch.sqrt),
    Function("sin", "sin({x})", True, ("sin",), torch_op=torch.sin),
    Function("tanh", "tanh({x})", True, ("tanh",), torch_op=torch.tanh),
    Function("sign", "((({x}) > 0) - (({x}) < 0))", True, torch_op=torch.sign),
    Function("pow", "pow({x}, {p})", True, ("pow",), parameter=True, torch_op=torch.pow),
    Function("square", "(({x}) * ({x}))", True, torch_op=torch.square),
    Function("expm1", "expm1({x})", True, ("expm1",), torch_op=torch.expm1),
    Function("log1p", "log1p({x})", True, ("log1p",), torch_op=torch.log1p),
    Function("erf", "erf({x})", True, ("erf",), torch_op=torch.erf),
    Function("atan", "atan({x})", True, ("atan",), torch_op=torch.atan),
    # the activations of torch.nn.functional that keep 0 (gelu: the exact, erf form)
    Function("gelu", "(0.5 * ({x}) * (1 + erf(({x}) * 0.7071067811865476)))", True, ("erf",),
             torch_op=F.gelu),
    Function("silu", "(({x}) / (1 + exp(-({x}))))", True, ("exp",), torch_op=F.silu),
    Function("leaky_relu", "({x} if {x} > 0 else {p} * ({x}))", True, parameter=True,
             torch_op=F.leaky_relu, default=0.01),
    Function("elu", "({x} if {x} > 0 else {p} * expm1({x}))", True, ("expm1",), parameter=True,
             torch_op=F.elu, default=1.0),
    Function("hardtanh", "(-1 if {x} < -1 else (1 if {x} > 1 else {x}))", True, torch_op=F.hardtanh),
    Function("softsign", "(({x}) / (1 + ({x} if {x} >= 0 else -({x}))))", True, torch_op=F.softsign),
    Function("relu6", "(0 if {x} <= 0 else (6 if {x} >= 6 else {x}))", True, torch_op=F.relu6),
    Function("selu", "(1.0507009873554805 * ({x} if {x} > 0 else 1.6732632423543772 * expm1({x})))",
             True, ("expm1",), torch_op=F.selu),
    Function("celu", "({x} if {x} > 0 else {p} * expm1(({x}) / {p}))", True, ("expm1",),
             parameter=True, torch_op=F.celu, default=1.0),
    Function("mish", "(({x}) * tanh(log1p(exp({x}))))", True, ("tanh", "log1p", "exp"), torch_op=F.mish),
    Function("tanhshrink", "(({x}) - tanh({x}))", True, ("tanh",), torch_op=F.tanhshrink),
    Function("softshrink", "((({x}) - {p}) if {x} > {p} else ((({x}) + {p}) if {x} < -{p} else 0))", True,
             parameter=True, torch_op=F.softshrink, default=0.5),
    Function("hardshrink", "(0 if ({x} >= -{p}) & ({x} <= {p}) else {x})", True, parameter=True,
             torch_op=F.hardshrink, default=0.5),
    # x * relu6(x + 3) / 6: 0 below -3, x above 3 (NaN stays NaN, as torch's)
    Function("hardswish", "(0 if {x} < -3 else ({x} if {x} > 3 else ({x}) * (({x}) + 3) / 6))", True,
             torch_op=F.hardswish),
    # F.threshold(x, p, 0): x where x > p, else 0 (keeps 0 only with value 0; NaN stays NaN)
    Function("threshold", "(0 if {x} <= {p} else {x})", True, parameter=True,
             torch_op=lambda x, p=0.0: F.threshold(x, p, 0.0), default=0.0),
    Function("asin", "asin({x})", True, ("asin",), torch_op=torch.asin),
    Function("asinh", "asinh({x})", True, ("asinh",), torch_op=torch.asinh),
    Function("atanh", "atanh({x})", True, ("atanh",), torch_op=torch.atanh),
    Function("sinh", "sinh({x})", True, ("sinh",), torch_op=torch.sinh),
    Function("tan", "tan({x})", True, ("tan",), torch_op=torch.tan),
    Function("deg2rad", "(({x}) * 0.017453292519943295)", True, torch_op=torch.deg2rad),
    Function("rad2deg", "(({x}) * 57.29577951308232)", True, torch_op=torch.rad2deg),
    # rounding (round: half to even, as torch; C's round() goes away from zero)
    Function("floor", "floor({x})", True, ("floor",), torch_op=torch.floor),
    Function("ceil", "ceil({x})", True, ("ceil",), torch_op=torch.ceil),
    Function("round", "nearbyint({x})", True, ("nearbyint",), torch_op=torch.round),
    Function("trunc", "trunc({x})", True, ("trunc",), torch_op=torch.trunc),
    Function("frac", "(({x}) - trunc({x}))", True, ("trunc",), torch_op=torch.frac),
    # maps 0 elsewhere: dense by nature
    Function("exp", "exp({x})", False, ("exp",), torch_op=torch.exp),
    Function("cos", "cos({x})", False, ("cos",), torch_op=torch.cos),
    Function("sigmoid", "(1 / (1 + exp(-({x}))))", False, ("exp",), torch_op=torch.sigmoid),
    Function("log", "log({x})", False, ("log",), torch_op=torch.log),
    # log(sigmoid(x)) without overflow, as torch: min(x, 0) - log1p(exp(-|x|))
    Function("logsigmoid", "(({x} if {x} < 0 else 0) - log1p(exp(-({x} if {x} >= 0 else -({x})))))",
             False, ("log1p", "exp"), torch_op=F.logsigmoid),
    Function("softplus", "({x} if {x} > 20 else log1p(exp({x})))", False, ("log1p", "exp"),
             torch_op=F.softplus),
]

FUNCTIONS: Dict[str, Function] = {f.name: f for f in _TABLE}


def function(name: str) -> Function:
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown elementwise function {name!r}; known: "
                         f"{', '.join(sorted(FUNCTIONS))}") from None
