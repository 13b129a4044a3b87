"""torch's special functions on a sparse operand, checked per call for what they do to 0 (the
table JAX sparse keeps by hand, here asked of torch itself): where ``f(0) == 0`` (``i1``,
``entr``, ``bessel_j1``, ``angle``, ``frexp``, ``xlog1py(0, y)``, ``ldexp``) torch's function runs
on the stored values and the pattern stays; where it is not (``lgamma``, ``ndtr``,
``bessel_y0``, a polynomial of even degree) the result is dense by nature: torch's function on
the dense copy, silent and differentiable, under the dense-size limit. Unary functions go
through ``nonlinear.on_stored_values``; those with a second operand (a number or a dense
tensor, broadcast) through ``elementwise.on_stored_values`` with the strict zero check."""
from __future__ import annotations

import torch

from .._dispatch import register
from ..gradients.values import from_values, values_of
from . import elementwise
from .nonlinear import _sparse, on_stored_values

__all__ = ["UNARY", "BINARY"]

_S = torch.special
#: functions of one tensor (and keyword or trailing number arguments)
UNARY = (
    torch.acosh, torch.Tensor.acosh, torch.arccosh, torch.Tensor.arccosh, torch.angle, torch.Tensor.angle,
    torch.digamma, torch.Tensor.digamma, _S.digamma, _S.psi, torch.lgamma, torch.Tensor.lgamma, _S.gammaln,
    torch.mvlgamma, torch.Tensor.mvlgamma, _S.multigammaln,
    _S.airy_ai, _S.bessel_j0, _S.bessel_j1, _S.bessel_y0, _S.bessel_y1, _S.entr, _S.erfcx, _S.i0e,
    _S.i1, _S.i1e, _S.log_ndtr, _S.modified_bessel_i0, _S.modified_bessel_i1, _S.modified_bessel_k0,
    _S.modified_bessel_k1, _S.ndtr, _S.ndtri, _S.scaled_modified_bessel_k0, _S.scaled_modified_bessel_k1,
    _S.spherical_bessel_j0, _S.i0, _S.expit, _S.exp2, _S.sinc, _S.round, _S.erfc,
)
#: functions of a sparse first operand and a number or dense second one
BINARY = (
    _S.xlog1py, _S.zeta, torch.ldexp, torch.Tensor.ldexp, torch.nextafter, torch.Tensor.nextafter,
    torch.igamma, torch.Tensor.igamma, _S.gammainc, torch.igammac, torch.Tensor.igammac, _S.gammaincc,
    _S.chebyshev_polynomial_t, _S.chebyshev_polynomial_u, _S.chebyshev_polynomial_v,
    _S.chebyshev_polynomial_w, _S.hermite_polynomial_h, _S.hermite_polynomial_he,
    _S.laguerre_polynomial_l, _S.legendre_polynomial_p, _S.shifted_chebyshev_polynomial_t,
    _S.shifted_chebyshev_polynomial_u, _S.shifted_chebyshev_polynomial_v,
    _S.shifted_chebyshev_polynomial_w,
)


def _unary(fn):
    def handler(x, *args, **kwargs):
        t = _sparse(x)
        if t is None or kwargs.get("out") is not None or t.dtype.is_complex:
            return NotImplemented
        return on_stored_values(lambda v, **kw: fn(v, *args, **kw), t, kwargs)
    return handler


def _binary(fn):
    def handler(x, other, *, out=None):
        if out is not None or _sparse(x) is None or _sparse(other) is not None:
            return NotImplemented          # a sparse second operand: the fallback's
        return elementwise.on_stored_values(fn, x, other, strict_zero=True)
    return handler


for _fn in UNARY:
    register(_fn)(_unary(_fn))
for _fn in BINARY:
    register(_fn)(_binary(_fn))


@register(torch.polygamma, torch.Tensor.polygamma, _S.polygamma)
def _polygamma(n, x=None, *, out=None):
    if isinstance(n, torch.Tensor):        # Tensor.polygamma(self, n)
        n, x = x, n
    t = _sparse(x)
    if t is None or out is not None:
        return NotImplemented
    return on_stored_values(lambda v, **kw: torch.polygamma(n, v), t, {})


@register(torch.frexp, torch.Tensor.frexp)
def _frexp(x, *, out=None):
    """Mantissa and exponent, both 0 at 0: two sparse tensors on the pattern."""
    t = _sparse(x)
    if t is None or out is not None or not t.dtype.is_floating_point:
        return NotImplemented
    mantissa, exponent = torch.frexp(values_of(t))
    return torch.return_types.frexp((from_values(t._storage, mantissa), from_values(t._storage, exponent)))
