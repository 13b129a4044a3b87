"""The derivative of each elementwise function of ``tensor_compiler/functions.py``, as an
index expression of its argument: the table beside the zero-preserving one.

``expr_grad`` applies the chain rule through ``Apply`` nodes with it, so the gradient of a
fused expression such as ``tanh(A * B)`` is one more kernel the same compiler builds; for a
sparse argument the gradient kernel carries the argument's pattern as a factor, so
``f'(x)`` is computed only at stored entries (even where ``f'(0) != 0``).

Each rule is written with the table's own functions (no comparisons in the IR): relu's step
is ``relu(sign(x))`` (0 at 0, as torch's ``threshold_backward``), a reciprocal is
``pow(x, -1)`` (a quotient's denominator must be dense, an argument need not be). Torch's
conventions at the kinks hold: abs'(0) = sign(0) = 0, sqrt'(0) = inf, log'(0) = inf.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from ..tensor_compiler.functions import FUNCTIONS
from ..tensor_compiler.index_notation import Add, Apply, Expr, Mul, Neg, Scalar, Sub

__all__ = ["DERIVATIVES", "derivative_of"]

Rule = Callable[[Expr, Optional[float]], Optional[Expr]]


def _pow(x: Expr, p: Optional[float]) -> Optional[Expr]:
    if p == 0:
        return None                       # x ** 0 == 1: constant
    if p == 1:
        return Scalar(1.0)
    if p == 2:
        return Mul(Scalar(2.0), x)
    return Mul(Scalar(float(p)), Apply("pow", x, float(p) - 1.0))


def _one_minus_tanh_squared(x: Expr, p: Optional[float]) -> Expr:
    return Sub(Scalar(1.0), Apply("square", Apply("tanh", x)))


def _sigmoid(x: Expr, p: Optional[float]) -> Expr:
    s = Apply("sigmoid", x)
    return Mul(s, Sub(Scalar(1.0), s))


def _step(x: Expr) -> Expr:
    """1 where x > 0, else 0 (0 at 0, as torch's threshold_backward)."""
    return Apply("relu", Apply("sign", x))


def _reciprocal_of(e: Expr, power: float = -1.0) -> Expr:
    return Apply("pow", e, power)


def _gelu(x: Expr, p: Optional[float]) -> Expr:
    # Phi(x) + x phi(x): 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
    cdf = Mul(Scalar(0.5), Add(Scalar(1.0), Apply("erf", Mul(Scalar(0.7071067811865476), x))))
    pdf = Mul(Scalar(0.3989422804014327), Apply("exp", Mul(Scalar(-0.5), Apply("square", x))))
    return Add(cdf, Mul(x, pdf))


def _silu(x: Expr, p: Optional[float]) -> Expr:
    s = Apply("sigmoid", x)
    return Mul(s, Add(Scalar(1.0), Mul(x, Sub(Scalar(1.0), s))))


def _leaky_relu(x: Expr, p: Optional[float]) -> Expr:
    slope = FUNCTIONS["leaky_relu"].param(p)
    return Add(Scalar(float(slope)), Mul(Scalar(1.0 - slope), _step(x)))


def _elu(x: Expr, p: Optional[float]) -> Expr:
    alpha = FUNCTIONS["elu"].param(p)       # alpha * exp(x) where x <= 0 (alpha at 0, as torch)
    step = _step(x)
    return Add(step, Mul(Sub(Scalar(1.0), step), Mul(Scalar(float(alpha)), Apply("exp", x))))


def _selu(x: Expr, p: Optional[float]) -> Expr:
    step = _step(x)
    tail = Mul(Scalar(1.7580993408473766), Apply("exp", x))     # scale * alpha * exp(x)
    return Add(Mul(Scalar(1.0507009873554805), step), Mul(Sub(Scalar(1.0), step), tail))


def _celu(x: Expr, p: Optional[float]) -> Expr:
    alpha = float(FUNCTIONS["celu"].param(p))
    step = _step(x)
    return Add(step, Mul(Sub(Scalar(1.0), step), Apply("exp", Mul(Scalar(1.0 / alpha), x))))


def _mish(x: Expr, p: Optional[float]) -> Expr:
    # tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x), sp = softplus(x)
    t = Apply("tanh", Apply("log1p", Apply("exp", x)))
    return Add(t, Mul(Mul(x, Sub(Scalar(1.0), Apply("square", t))), Apply("sigmoid", x)))


def _outside(x: Expr, p: Optional[float], name: str) -> Expr:
    """1 where |x| > lambda, else 0 (the shrinks' backward)."""
    return _step(Sub(Apply("abs", x), Scalar(float(FUNCTIONS[name].param(p)))))


def _hardswish(x: Expr, p: Optional[float]) -> Expr:
    """torch's hardswish_backward: 0 below -3, x / 3 + 1/2 on [-3, 3], 1 above 3."""
    at_least = Sub(Scalar(1.0), _step(Sub(Scalar(-3.0), x)))     # x >= -3
    at_most = Sub(Scalar(1.0), _step(Sub(x, Scalar(3.0))))       # x <= 3
    middle = Add(Mul(x, Scalar(1.0 / 3.0)), Scalar(0.5))
    return Add(Mul(Mul(at_least, at_most), middle), _step(Sub(x, Scalar(3.0))))


#: function name -> f'(x) as an expression of the argument ``x`` (None: f' == 0)
DERIVATIVES: Dict[str, Rule] = {
    "abs": lambda x, p: Apply("sign", x),
    "relu": lambda x, p: Apply("relu", Apply("sign", x)),
    "sqrt": lambda x, p: Mul(Scalar(0.5), Apply("pow", x, -0.5)),
    "sin": lambda x, p: Apply("cos", x),
    "tanh": _one_minus_tanh_squared,
    "sign": lambda x, p: None,
    "stored": lambda x, p: None,     # constant on the pattern
    "pow": _pow,
    "square": lambda x, p: Mul(Scalar(2.0), x),
    "exp": lambda x, p: Apply("exp", x),
    "cos": lambda x, p: Neg(Apply("sin", x)),
    "sigmoid": _sigmoid,
    "log": lambda x, p: Apply("pow", x, -1.0),
    "expm1": lambda x, p: Apply("exp", x),
    "log1p": lambda x, p: _reciprocal_of(Add(Scalar(1.0), x)),
    "erf": lambda x, p: Mul(Scalar(1.1283791670955126), Apply("exp", Neg(Apply("square", x)))),
    "atan": lambda x, p: _reciprocal_of(Add(Scalar(1.0), Apply("square", x))),
    "gelu": _gelu,
    "silu": _silu,
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    # 1 strictly inside (-1, 1), 0 at and beyond the bounds (torch's hardtanh_backward)
    "hardtanh": lambda x, p: _step(Sub(Scalar(1.0), Apply("abs", x))),
    "softsign": lambda x, p: _reciprocal_of(Add(Scalar(1.0), Apply("abs", x)), -2.0),
    "relu6": lambda x, p: Mul(_step(x), _step(Sub(Scalar(6.0), x))),
    "selu": _selu,
    "celu": _celu,
    "mish": _mish,
    "tanhshrink": lambda x, p: Apply("square", Apply("tanh", x)),
    "softshrink": lambda x, p: _outside(x, p, "softshrink"),
    "hardshrink": lambda x, p: _outside(x, p, "hardshrink"),
    "hardswish": _hardswish,
    # 1 where x > threshold (torch's threshold_backward)
    "threshold": lambda x, p: _step(Sub(x, Scalar(float(FUNCTIONS["threshold"].param(p))))),
    "asin": lambda x, p: _reciprocal_of(Sub(Scalar(1.0), Apply("square", x)), -0.5),
    "asinh": lambda x, p: _reciprocal_of(Add(Scalar(1.0), Apply("square", x)), -0.5),
    "atanh": lambda x, p: _reciprocal_of(Sub(Scalar(1.0), Apply("square", x))),
    "sinh": lambda x, p: Mul(Scalar(0.5), Add(Apply("exp", x), Apply("exp", Neg(x)))),
    "tan": lambda x, p: Add(Scalar(1.0), Apply("square", Apply("tan", x))),
    "deg2rad": lambda x, p: Scalar(0.017453292519943295),
    "rad2deg": lambda x, p: Scalar(57.29577951308232),
    "logsigmoid": lambda x, p: Apply("sigmoid", Neg(x)),
    "softplus": lambda x, p: Apply("sigmoid", x),
    "floor": lambda x, p: None,
    "ceil": lambda x, p: None,
    "round": lambda x, p: None,
    "trunc": lambda x, p: None,
    "frac": lambda x, p: Scalar(1.0),
}



def derivative_of(node: Apply) -> Optional[Expr]:
    """``f'(a)`` for ``node = Apply(f, a, p)``; None where it is identically zero."""
    rule = DERIVATIVES.get(node.fn)
    if rule is None:   # a function added to FUNCTIONS without its rule: say so, never detach
        known = "" if node.fn in FUNCTIONS else " (not an elementwise function)"
        raise NotImplementedError(f"scorch autograd: no derivative rule for {node.fn!r}{known}; "
                                  f"add it to scorch/gradients/derivatives.py")
    return rule(node.a, node.p)
