"""Randomized low-rank solvers on a sparse matrix: ``torch.svd_lowrank``,
``torch.pca_lowrank`` and ``torch.lobpcg``, which torch documents for large sparse inputs.

torch writes them in Python over ``matmul``; run as an unregistered function (with
scorch's dispatch off inside) their products reached ATen on the sparse operand and took
the dense fallback (929 MiB for a 15k x 15k mesh). Here torch's own algorithm runs with
dispatch on, so each ``A @ X`` / ``A^H @ Q`` is a scorch kernel and every other step works
on the dense q-column blocks. ``pca_lowrank(center=True)`` subtracts the column means as a
rank-one correction, ``M @ X = 1 (c @ X)``, rather than the dense ``A - mean`` torch's
strided branch forms (the mean matrix is dense by nature, its products are not).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch._lobpcg import _lobpcg
from torch._lowrank import _svd_lowrank

from .._dispatch import register
from ..tensor_type import is_sparse_operand

__all__ = ["svd_lowrank", "pca_lowrank", "lobpcg"]

Tensor = torch.Tensor


def svd_lowrank(A, q: Optional[int] = 6, niter: Optional[int] = 2,
                M: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return _svd_lowrank(A, q=q, niter=niter, M=M)


def _centered_basis(A, c: Tensor, q: int, niter: int) -> Tensor:
    """Halko et al.'s Algorithm 4.4 for ``A - 1 c`` (``c``: 1 x n, the column means)."""
    dtype = c.dtype

    def times(X):            # (A - 1 c) @ X
        return A @ X - c @ X

    def times_h(Y):          # (A - 1 c)^H @ Y
        return A.mH @ Y - c.mH @ Y.sum(0, keepdim=True)

    Q = torch.linalg.qr(times(torch.randn(A.shape[-1], q, dtype=dtype))).Q
    for _ in range(niter):
        Q = torch.linalg.qr(times_h(Q)).Q
        Q = torch.linalg.qr(times(Q)).Q
    return Q


def pca_lowrank(A, q: Optional[int] = None, center: bool = True,
                niter: int = 2) -> Tuple[Tensor, Tensor, Tensor]:
    if A.dim() != 2:
        raise ValueError("pca_lowrank input is expected to be 2-dimensional tensor")
    m, n = A.shape
    if q is None:
        q = min(6, m, n)
    elif not (0 <= q <= min(m, n)):
        raise ValueError(f"q(={q}) must be non-negative integer and not greater than "
                         f"min(m, n)={min(m, n)}")
    if not niter >= 0:
        raise ValueError(f"niter(={niter}) must be non-negative integer")
    if not center:
        return _svd_lowrank(A, q, niter=niter, M=None)
    dtype = A.dtype if A.dtype.is_floating_point else torch.float32
    # the centring is a rank-one correction (A @ X - 1 (c @ X)), which cancels where the
    # column means are large next to the spread: float32 goes through float64 (columns
    # around 1e4 with spread 0.1: singular values 2.6e-3 off, torch 1.7e-5)
    work = torch.float64 if dtype == torch.float32 else dtype
    if A.dtype != work:
        A = A.to(work)
    total = A.sum(0)
    c = (total.to_dense() if is_sparse_operand(total) else total).to(work)
    c = (c / m).reshape(1, n)
    Q = _centered_basis(A, c, q, niter)
    B = (A.mH @ Q).mH - (Q.sum(0, keepdim=True).mH @ c)      # Q^H (A - 1 c)
    U, S, Vh = torch.linalg.svd(B, full_matrices=False)
    if work == dtype:
        return Q @ U, S, Vh.mH
    return (Q @ U).to(dtype), S.to(dtype), Vh.mH.to(dtype)


def lobpcg(A, k=None, B=None, X=None, n=None, iK=None, niter=None, tol=None, largest=None,
           method=None, tracker=None, ortho_iparams=None, ortho_fparams=None,
           ortho_bparams=None):
    if A.requires_grad or (B is not None and B.requires_grad):
        raise NotImplementedError("lobpcg: gradients with respect to a sparse A or B are not "
                                  "supported; call it on A.detach()")
    return _lobpcg(A, k, B, X, n, iK, niter, tol, largest, method, tracker, ortho_iparams,
                   ortho_fparams, ortho_bparams)


@register(torch.svd_lowrank)
def _svd_lowrank_handler(A, q=6, niter=2, M=None):
    if not is_sparse_operand(A):
        return NotImplemented
    return svd_lowrank(A, q, niter, M)


@register(torch.pca_lowrank)
def _pca_lowrank_handler(A, q=None, center=True, niter=2):
    if not is_sparse_operand(A):
        return NotImplemented
    return pca_lowrank(A, q, center, niter)


@register(torch.lobpcg)
def _lobpcg_handler(A, k=None, B=None, X=None, n=None, iK=None, niter=None, tol=None,
                    largest=None, method=None, tracker=None, ortho_iparams=None,
                    ortho_fparams=None, ortho_bparams=None):
    if not is_sparse_operand(A) and not is_sparse_operand(B):
        return NotImplemented
    return lobpcg(A, k, B, X, n, iK, niter, tol, largest, method, tracker, ortho_iparams,
                  ortho_fparams, ortho_bparams)
