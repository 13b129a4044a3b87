"""Ops whose result is dense whatever the operand's sparsity (JAX sparse's "densifying"
column): a running sum (``cumsum``), ``1 / x`` at the zeros (``reciprocal``), a loss over every
position (``mse_loss``, ``cross_entropy``), a normalisation over every element
(``layer_norm``), ``isclose(0, 0)``. Their cost is the dense result's, so they run torch's own
op on the sparse operand's dense copy; unlike the generic fallback they are differentiable
(through ``to_dense``: the gradient comes back on the stored entries) and say nothing, as an
op that is meant to be dense. The dense-size limit still holds (``check_dense_size``)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .. import interop
from .._dispatch import check_dense_size, register
from ..tensor_type import SparseTensor

__all__ = ["DENSE_BY_NATURE", "run_densified"]

#: torch functions whose result is dense by nature (every position of the result depends on
#: every implicit zero of the operand, or maps 0 elsewhere)
DENSE_BY_NATURE = (
    torch.cumsum, torch.Tensor.cumsum, torch.cumprod, torch.Tensor.cumprod,
    torch.logcumsumexp, torch.Tensor.logcumsumexp, torch.logsumexp, torch.Tensor.logsumexp,
    torch.reciprocal, torch.Tensor.reciprocal, torch.rsqrt, torch.Tensor.rsqrt,
    torch.cosh, torch.Tensor.cosh, torch.acos, torch.Tensor.acos, torch.exp2, torch.Tensor.exp2,
    torch.erfc, torch.Tensor.erfc, torch.isclose, torch.Tensor.isclose, torch.isfinite,
    torch.Tensor.isfinite, torch.matrix_exp,
    torch.linalg.matrix_exp, torch.ones_like,
    torch.scatter, torch.Tensor.scatter, torch.scatter_reduce, torch.Tensor.scatter_reduce,
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.cross_entropy, F.nll_loss,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.kl_div, F.layer_norm,
    # an index at every position (the zeros ranked too)
    torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort, torch.msort, torch.Tensor.msort,
    # f(0) != 0
    torch.log2, torch.Tensor.log2, torch.log10, torch.Tensor.log10, torch.logit, torch.Tensor.logit,
    torch.special.logit, torch.sinc, torch.Tensor.sinc, torch.i0, torch.Tensor.i0, F.hardsigmoid,
    torch.atan2, torch.Tensor.atan2, torch.arctan2, torch.Tensor.arctan2, torch.logaddexp,
    torch.Tensor.logaddexp, torch.logaddexp2, torch.Tensor.logaddexp2, torch.bitwise_not,
    torch.Tensor.bitwise_not, torch.Tensor.__invert__, torch.Tensor.__rpow__,
    # normalisations over every element, distances, losses
    F.batch_norm, F.group_norm, F.instance_norm, F.local_response_norm, torch.cdist,
    F.pairwise_distance, F.pdist,
    F.hinge_embedding_loss, F.cosine_embedding_loss, F.soft_margin_loss, F.margin_ranking_loss,
    F.poisson_nll_loss, F.gaussian_nll_loss, F.multilabel_soft_margin_loss,
    F.multilabel_margin_loss, F.multi_margin_loss, F.triplet_margin_loss,
    # dense factorizations and what is built on them
    torch.linalg.svd, torch.svd, torch.Tensor.svd, torch.linalg.svdvals, torch.linalg.qr, torch.qr,
    torch.Tensor.qr, torch.linalg.eigh, torch.linalg.eigvalsh, torch.linalg.eig, torch.linalg.eigvals,
    torch.linalg.det, torch.det, torch.Tensor.det, torch.linalg.slogdet, torch.slogdet, torch.logdet,
    torch.Tensor.logdet, torch.linalg.matrix_rank, torch.linalg.pinv, torch.pinverse,
    torch.linalg.cholesky, torch.cholesky, torch.linalg.inv, torch.inverse, torch.Tensor.inverse,
    torch.linalg.solve, torch.linalg.lstsq, torch.linalg.cond,
    torch.linalg.solve_ex, torch.linalg.inv_ex, torch.linalg.cholesky_ex, torch.linalg.lu,
    torch.linalg.lu_factor, torch.linalg.lu_factor_ex, torch.linalg.lu_solve, torch.linalg.ldl_factor,
    torch.linalg.ldl_factor_ex, torch.linalg.ldl_solve, torch.linalg.solve_triangular,
    torch.linalg.householder_product, torch.linalg.tensorsolve, torch.linalg.tensorinv, torch.lu,
    torch.Tensor.lu, torch.lu_solve, torch.Tensor.lu_solve, torch.lu_unpack, torch.geqrf,
    torch.Tensor.geqrf, torch.ormqr, torch.Tensor.ormqr, torch.triangular_solve,
    torch.Tensor.triangular_solve, torch.cholesky_solve, torch.Tensor.cholesky_solve,
    torch.cholesky_inverse, torch.Tensor.cholesky_inverse,
    # running extremes and integrals (every position after the first entry), spectra
    torch.cummax, torch.Tensor.cummax, torch.cummin, torch.Tensor.cummin,
    torch.cumulative_trapezoid, *(getattr(torch.fft, _name) for _name in (
        "fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn",
        "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn")),
    torch.stft, torch.Tensor.stft, torch.histogramdd,
    # the normalisations' ATen-level forms, true at every element
    torch.layer_norm, torch.native_layer_norm, torch.batch_norm, torch.native_batch_norm,
    torch.group_norm, torch.native_group_norm, torch.instance_norm, torch.isreal, torch.Tensor.isreal,
    # losses over every position
    F.ctc_loss, F.triplet_margin_with_distance_loss, F.multi_head_attention_forward,
    *((F.linear_cross_entropy,) if hasattr(F, "linear_cross_entropy") else ()),
    # n % 0 is NaN; complex results (scorch stores real values)
    torch.Tensor.__rmod__, torch.complex, torch.polar, torch.view_as_complex,
    # a column of ones (x ** 0); attention's softmax over every key
    torch.linalg.vander, F.scaled_dot_product_attention,
    # a random value at every position
    torch.rand_like, torch.randn_like, torch.randint_like,
)


def _densified(name: str):
    def dense(x):
        if isinstance(x, SparseTensor):
            check_dense_size(name, x.shape, x.dtype)
            return x.to_dense()          # differentiable: the gradient returns to the pattern
        return x
    return dense


def run_densified(fn, *args, **kwargs):
    """``fn`` on the dense copies of the sparse operands (under the dense limit),
    differentiable through ``to_dense``: for a handler that finds its call dense by nature."""
    name = getattr(fn, "__name__", str(fn))
    args, kwargs = tree_map(_densified(name), (args, kwargs))
    return fn(*args, **kwargs)


def _handler(fn):
    def handler(*args, **kwargs):
        found = []
        tree_map(lambda x: found.append(x) if isinstance(x, SparseTensor) else None, (args, kwargs))
        if not found:
            return NotImplemented
        return run_densified(fn, *args, **kwargs)
    return handler


for _fn in DENSE_BY_NATURE:
    register(_fn)(_handler(_fn))


@register(torch.vander)
def _vander(x, N=None, increasing=False):
    """Through ``linalg.vander`` (torch's ``vander`` writes its result in place, which breaks
    the graph behind a densified operand)."""
    if not isinstance(x, SparseTensor):
        return NotImplemented
    check_dense_size("vander", (x.shape[0], N or x.shape[0]), x.dtype)
    out = torch.linalg.vander(x.to_dense(), N=N)
    return out if increasing else out.flip(-1)


# --- triangular solves: dense results, but the sparse factor is not densified -------------

def _solved(A, B, upper: bool, transpose: bool, unitriangular: bool) -> Optional[torch.Tensor]:
    """``X`` with ``op(A) X = B`` for a 2-D sparse float factor ``A`` and a dense 2-D ``B``
    of its dtype, through torch's own CSR triangular solve on ``A``'s arrays (MKL; its cost
    follows the stored entries: a 200,000^2 factor with 600k entries in 0.07 s, where the
    dense copy would take 305 GB). None where that does not apply (a graph to record, a
    batch, a sparse ``B``, a zero on the diagonal): the dense copy's path then."""
    if (not isinstance(A, SparseTensor) or A.dim() != 2 or type(B) is not torch.Tensor
            or B.dim() != 2 or B.dtype != A.dtype or A.dtype not in (torch.float32, torch.float64)
            or (torch.is_grad_enabled() and (A.requires_grad or B.requires_grad))):
        return None
    if not unitriangular and not bool((torch.diagonal(A) != 0).all()):
        return None   # singular: the dense solve's inf / NaN, which MKL's differ from
    csr = interop.to_torch(A.to_format("csr")._storage, internal=True)   # not the user's tensor
    return torch.triangular_solve(B, csr, upper=upper, transpose=transpose,
                                  unitriangular=unitriangular).solution


@register(torch.triangular_solve, torch.Tensor.triangular_solve)
def _triangular_solve(B, A, upper=True, transpose=False, unitriangular=False):
    X = _solved(A, B, upper, transpose, unitriangular)
    if X is None:
        return run_densified(torch.triangular_solve, B, A, upper=upper, transpose=transpose,
                             unitriangular=unitriangular)
    return torch.return_types.triangular_solve((X, A.clone()))


@register(torch.linalg.solve_triangular)
def _solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    X = None
    if out is None:   # X A = B is A^T X^T = B^T
        X = _solved(A, B, upper, False, unitriangular) if left else \
            _solved(A, B.t().contiguous() if type(B) is torch.Tensor else B, upper, True, unitriangular)
        X = X if X is None or left else X.t()
    if X is None:
        return run_densified(torch.linalg.solve_triangular, A, B, upper=upper, left=left,
                             unitriangular=unitriangular, out=out)
    return X
