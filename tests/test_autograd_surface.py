"""The autograd surface: every torch function scorch runs on sparse operands (the registry of
``scorch._dispatch``, the ops of docs/ops.md), with a sparse input that requires grad and with
a dense input that requires grad beside a sparse one. Each backward runs and matches dense
torch (a sparse input's gradient on its stored entries), or the op raises an error that
names it: never a result cut off from the graph. A handler registered without a row here
fails ``test_every_registered_function_is_covered``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch import _dispatch

F64 = torch.float64
SHAPE = (4, 5)


def _dense(t):
    return t.to_dense() if isinstance(t, scorch.SparseTensor) else t


@dataclass
class Case:
    """``call(S, *partners)``: ``S`` the sparse operand (its dense copy for the oracle),
    ``partners`` dense tensors of ``partner_shapes``. ``oracle`` replaces ``call`` on the
    dense side where torch's dense op means something else (sparse softmax). ``raises``: the
    op refuses a sparse input that requires grad, with that error and message."""
    name: str
    functions: Sequence[object]
    call: Callable
    partner_shapes: Sequence[Tuple[int, ...]] = ()
    shape: Tuple[int, ...] = SHAPE
    positive: bool = False
    oracle: Optional[Callable] = None
    raises: Optional[Tuple[type, str]] = None
    bool_result: bool = False
    fmt: str = "csr"
    extra: dict = field(default_factory=dict)


def _torch_sparse_softmax(log):
    def oracle(d, dim=1):
        s = d.to_sparse().coalesce()
        r = (torch.sparse.log_softmax if log else torch.sparse.softmax)(s, dim)
        return r.to_dense()
    return oracle


_T = torch.Tensor


_COPY_FUNCTIONS = {
    torch.expand_copy: lambda s: torch.expand_copy(s[:1], (3, 5)).sum(0),
    torch.permute_copy: lambda s: torch.permute_copy(s, (1, 0)).sum(1),
    torch.t_copy: lambda s: torch.t_copy(s).sum(1),
    torch.transpose_copy: lambda s: torch.transpose_copy(s, 0, 1).sum(1),
    torch.squeeze_copy: lambda s: torch.squeeze_copy(s[None]).sum(0),
    torch.unsqueeze_copy: lambda s: torch.unsqueeze_copy(s, 0).sum((0, 1)),
    torch.unbind_copy: lambda s: torch.unbind_copy(s, 0)[2],
    torch.unfold_copy: lambda s: torch.unfold_copy(s, 0, 2, 1).sum((0, 2)),
    torch.view_copy: lambda s: torch.view_copy(s, (5, 4)).sum(1),
    torch.diagonal_copy: lambda s: F.pad(torch.diagonal_copy(s), (0, 1)),
    torch.split_with_sizes_copy: lambda s: torch.split_with_sizes_copy(s, [2, 3], 1)[1].sum(0)[:3].repeat(2)[:5],
    torch.split_copy: lambda s: torch.split_copy(s, 2)[1].sum(0),
    torch.narrow_copy: lambda s: torch.narrow_copy(s, 0, 1, 2).sum(0),
    _T.narrow_copy: lambda s: s.narrow_copy(1, 0, 2).sum(1).repeat(2)[:5],
    torch.select_copy: lambda s: torch.select_copy(s, 0, 3),
    torch.slice_copy: lambda s: torch.slice_copy(s, 0, 1, 3).sum(0),
    torch.alias_copy: lambda s: torch.alias_copy(s).sum(0),
    torch.detach_copy: lambda s: torch.detach_copy(s.detach()).sum(0),   # no derivative in torch
    torch.unsafe_split: lambda s: torch.unsafe_split(s, 2)[0].sum(0),
    _T.unsafe_split: lambda s: s.unsafe_split(3, 1)[0].sum(0).repeat(2)[:5],
    torch.unsafe_split_with_sizes: lambda s: torch.unsafe_split_with_sizes(s, [1, 3])[1].sum(0),
    torch.unsafe_chunk: lambda s: torch.unsafe_chunk(s, 2)[1].sum(0),
    _T.unsafe_chunk: lambda s: s.unsafe_chunk(4)[3][0],
}


def _copies(s):
    """Every ``*_copy`` (and ``unsafe_*``) form of a view, each reduced to a row of 5."""
    return torch.stack([f(s) for f in _COPY_FUNCTIONS.values()])


def _in_place_chain(s):
    """Every zero-keeping in-place op, each on a fresh non-leaf copy of ``s``."""
    calls = [lambda y: y.relu_(), torch.relu_, F.relu_, lambda y: F.leaky_relu_(y, 0.1), F.elu_,
             lambda y: F.hardtanh_(y, -0.5, 0.5), lambda y: F.threshold_(y, 0.2, 0.0), F.celu_, F.selu_,
             lambda y: y.abs_(), torch.abs_, lambda y: y.absolute_(), lambda y: (y.abs_() + 0.0).sqrt_(),
             torch.sqrt_ if False else (lambda y: torch.sqrt_(y.abs_())), lambda y: y.sin_(), torch.sin_,
             lambda y: y.tanh_(), torch.tanh_, lambda y: y.sign_(), lambda y: y.sgn_(), lambda y: y.square_(),
             torch.square_, lambda y: y.expm1_(), torch.expm1_, lambda y: y.abs_().log1p_(),
             lambda y: torch.log1p_(y.abs_()), lambda y: y.erf_(), torch.erf_, lambda y: (y * 0.5).erfinv_(),
             lambda y: y.atan_(), torch.atan_, lambda y: y.arctan_(), torch.arctan_, lambda y: y.floor_(),
             torch.floor_, lambda y: y.ceil_(), torch.ceil_, lambda y: y.trunc_(), torch.trunc_, lambda y: y.fix_(),
             torch.fix_, lambda y: y.frac_(), torch.frac_, lambda y: (y * 0.5).asin_(), lambda y: torch.asin_(y * 0.5),
             lambda y: (y * 0.5).arcsin_(), lambda y: torch.arcsin_(y * 0.5), lambda y: y.detach().asinh_(),
             lambda y: torch.asinh_(y.detach()), lambda y: y.detach().arcsinh_(), lambda y: torch.arcsinh_(y.detach()), lambda y: (y.detach() * 0.5).atanh_(), lambda y: torch.atanh_(y.detach() * 0.5),   # torch: no
             lambda y: (y.detach() * 0.5).arctanh_(), lambda y: torch.arctanh_(y.detach() * 0.5),  # grad lambda y: y.sinh_(), torch.sinh_,
             lambda y: y.tan_(), torch.tan_, lambda y: y.deg2rad_(), torch.deg2rad_, lambda y: y.rad2deg_(),
             torch.rad2deg_, lambda y: y.round_(), torch.round_, lambda y: y.neg_(), torch.neg_,
             lambda y: y.negative_(), torch.negative_, lambda y: y.clamp_(-0.5, 0.5),
             lambda y: torch.clamp_(y, -0.5, 0.5), lambda y: y.clip_(-1, 1), lambda y: torch.clip_(y, max=0.2), lambda y: y.clamp_min_(-0.5), lambda y: torch.clamp_min_(y, -0.5),
             lambda y: y.clamp_max_(0.5), lambda y: torch.clamp_max_(y, 0.5), lambda y: y.nan_to_num_(),
             torch.nan_to_num_, lambda y: y.pow_(2)]
    total = 0
    for call in calls:
        y = s * 1.0
        out = call(y)
        total = total + _dense(out)
    return total


_IN_PLACE_FUNCTIONS = [_T.relu_, torch.relu_, F.relu_, F.leaky_relu_, F.elu_, F.hardtanh_, F.threshold_, F.celu_,
                       F.selu_, _T.abs_, torch.abs_, _T.absolute_, _T.sqrt_, torch.sqrt_, _T.sin_, torch.sin_,
                       _T.tanh_, torch.tanh_, _T.sign_, _T.sgn_, _T.square_, torch.square_, _T.expm1_,
                       torch.expm1_, _T.log1p_, torch.log1p_, _T.erf_, torch.erf_, _T.erfinv_, _T.atan_,
                       torch.atan_, _T.arctan_, torch.arctan_, _T.floor_, torch.floor_, _T.ceil_, torch.ceil_,
                       _T.trunc_, torch.trunc_, _T.fix_, torch.fix_, _T.frac_, torch.frac_, _T.asin_,
                       torch.asin_, _T.arcsin_, torch.arcsin_, _T.asinh_, torch.asinh_, _T.arcsinh_,
                       torch.arcsinh_, _T.atanh_, torch.atanh_, _T.arctanh_, torch.arctanh_, _T.sinh_,
                       torch.sinh_, _T.tan_, torch.tan_, _T.deg2rad_, torch.deg2rad_, _T.rad2deg_,
                       torch.rad2deg_, _T.round_, torch.round_, _T.neg_, torch.neg_, _T.negative_,
                       torch.negative_, _T.clamp_, torch.clamp_, _T.clip_, torch.clip_, _T.clamp_min_,
                       torch.clamp_min_, _T.clamp_max_, torch.clamp_max_, _T.nan_to_num_, torch.nan_to_num_,
                       _T.pow_]


def _written(s):
    """Writes at positions, in place, each on a fresh non-leaf copy (a 0 anywhere; a value
    where something is stored)."""
    y = s * 1.0
    y.masked_fill_(y.detach() > 0.9, 0.0)
    z = s * 2.0
    z[z.detach() < 0] = 0.0
    w = s * 1.0
    w[torch.tensor([0, 1]), torch.tensor([2, 3])] = 0.0
    v = s * 1.0
    v.index_put_((torch.tensor([3]), torch.tensor([0])), torch.tensor(0.0, dtype=F64))
    u = s[:, :4] * 1.0
    u.fill_diagonal_(0.0)
    return _dense(y) + _dense(z) + _dense(w) + _dense(v) + torch.cat([_dense(u), _dense(s[:, 4:])], 1)


def _factorized(s):
    """The dense factorizations on a well-conditioned square matrix made from ``s``."""
    a = s[:, :4] + 3 * torch.eye(4, dtype=F64)
    total = torch.linalg.svdvals(a).sum() + torch.linalg.svd(a).S.sum() + torch.svd(a).S.sum() + a.svd().S.sum()
    total = total + torch.linalg.qr(a).R.diagonal().abs().sum() + torch.qr(a).R.abs().sum() + a.qr().R.abs().sum()
    b = a + a.t()                               # symmetric, for eigh
    total = total + torch.linalg.eigvalsh(b).sum() + torch.linalg.eigh(b).eigenvalues.sum()
    total = total + torch.linalg.eigvals(b).real.sum().detach() + torch.linalg.eig(b).eigenvalues.real.sum().detach()
    total = total + torch.linalg.det(a) + torch.det(a) + a.det() + torch.linalg.slogdet(a).logabsdet
    total = total + torch.slogdet(a).logabsdet + torch.logdet(a) + a.logdet()
    total = total + torch.linalg.matrix_rank(a).double() + torch.linalg.pinv(a).sum() + torch.pinverse(a).sum()
    c = b + 10 * torch.eye(4, dtype=F64)
    total = total + torch.linalg.cholesky(c).sum() + torch.cholesky(c).sum() + torch.linalg.inv(a).sum()
    total = total + torch.inverse(a).sum() + a.inverse().sum() + torch.linalg.solve(a, torch.ones(4, dtype=F64)).sum()
    total = total + torch.linalg.lstsq(a, torch.ones(4, 1, dtype=F64)).solution.sum() + torch.linalg.cond(a)
    return total


def _sum_of(*parts):
    """Every part (complex ones as their real and imaginary parts) summed into one number."""
    total = 0
    for p in parts:
        p = p if isinstance(p, torch.Tensor) else torch.as_tensor(p, dtype=F64)
        p = _dense(p)
        total = total + (torch.view_as_real(p.resolve_conj()).sum() if p.is_complex() else p.to(F64).sum())
    return total


def _more_factorized(s):
    """The dense-by-nature solvers and factorizations on SPARSE well-conditioned matrices
    (``s`` plus a sparse diagonal: a union, still sparse), so each handler runs."""
    eye = scorch.sparse_tensor(torch.eye(4, dtype=F64) * 8, format="csr")
    a = s[:, :4] + eye
    b = a + a.t() + eye                         # symmetric positive definite
    ones = scorch.sparse_tensor(torch.ones(4, 1, dtype=F64), format="csr")
    L = torch.linalg.cholesky(_dense(b))
    LU, piv = torch.linalg.lu_factor(a)
    qr, tau = torch.geqrf(a)
    sp = lambda m: scorch.sparse_tensor(m.detach(), format="csr")      # noqa: E731
    return _sum_of(
        torch.linalg.solve_ex(a, ones).result, torch.linalg.inv_ex(a).inverse, torch.linalg.cholesky_ex(b).L,
        torch.linalg.lu(a).U, LU, torch.linalg.lu_factor_ex(a).LU, torch.linalg.lu_solve(sp(LU), piv, ones),
        torch.linalg.ldl_factor(b).LD.detach(), torch.linalg.ldl_factor_ex(b).LD.detach(),
        torch.linalg.ldl_solve(sp(torch.linalg.ldl_factor(b).LD), torch.linalg.ldl_factor(b).pivots, ones).detach(),
        torch.linalg.solve_triangular(torch.triu(a), ones, upper=True),
        torch.linalg.householder_product(a, tau.detach()), torch.linalg.tensorsolve(a, ones[:, 0]),
        torch.linalg.tensorinv(a, ind=1), torch.lu(a)[0], a.lu()[0], torch.lu_solve(ones, sp(LU), piv),
        ones.lu_solve(sp(LU), piv), torch.lu_unpack(sp(LU), piv)[2], qr.detach(), a.geqrf()[0].detach(),
        torch.ormqr(sp(qr), tau.detach(), ones), sp(qr).ormqr(tau.detach(), ones),
        torch.triangular_solve(ones, torch.triu(a)).solution, ones.triangular_solve(torch.triu(a)).solution,
        torch.cholesky_solve(ones, sp(L)), ones.cholesky_solve(sp(L)), torch.cholesky_inverse(sp(L)),
        sp(L).cholesky_inverse())


_FFTS = ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn",
         "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn")


def _dense_results(s, x):
    """Running extremes, spectra, normalisations and losses of ``s``: dense by nature."""
    w, b = torch.ones(5, dtype=F64), torch.zeros(5, dtype=F64)
    q, kv = s.reshape(4, 1, 5), x.reshape(4, 1, 5)
    return _sum_of(
        torch.cummax(s, 1).values, s.cummax(0).values, torch.cummin(s, 1).values, s.cummin(0).values,
        torch.cumulative_trapezoid(s, dim=1), *(getattr(torch.fft, f)(s) for f in _FFTS),
        torch.stft(s[0], 4, return_complex=True), s[1].stft(4, return_complex=True),
        torch.histogramdd(s.reshape(-1, 2), bins=3).hist.detach(),
        torch.layer_norm(s, (5,)), torch.native_layer_norm(s, (5,), w, b, 1e-5)[0],
        torch.batch_norm(s, w, b, None, None, True, 0.1, 1e-5, False),
        torch.native_batch_norm(s, w, b, None, None, True, 0.1, 1e-5)[0],
        torch.group_norm(s[None], 1, w[:4], b[:4], 1e-5, False),
        torch.native_group_norm(s[None], w[:4], b[:4], 1, 4, 5, 1, 1e-5)[0],
        torch.instance_norm(s[None], None, None, None, None, True, 0.1, 1e-5, False),
        torch.isreal(s).double(), s.isreal().double(),
        F.ctc_loss(s.reshape(4, 1, 5), torch.tensor([[1, 2]]), torch.tensor([4]), torch.tensor([2])),
        F.triplet_margin_with_distance_loss(s, x, x * 0.5),
        F.multi_head_attention_forward(q, kv, kv, 5, 1, torch.ones(15, 5, dtype=F64) * 0.1,
                                       torch.zeros(15, dtype=F64), None, None, False, 0.0,
                                       torch.eye(5, dtype=F64), b, training=False)[0])


def _stored_softmin(d, dim=1):
    """softmin over the stored (nonzero) entries, as the sparse softmax: 0 elsewhere."""
    stored = d.detach() != 0
    return torch.where(stored, torch.softmax(torch.where(stored, -d, float("-inf")), dim), 0.0)


def _bitwise_integer(s):
    """The integer bitwise ops that keep 0 at 0 (on the pattern), out of place and in place."""
    i = (s * 10).long()
    return torch.stack([6 & i, torch.bitwise_left_shift(i, 1), i.bitwise_left_shift(2), i << 1,
                        torch.bitwise_right_shift(i, 1), i.bitwise_right_shift(2), i >> 1,
                        i.clone().bitwise_and_(5), i.clone().__iand__(3), i.clone().bitwise_left_shift_(1),
                        i.clone().__ilshift__(2), i.clone().bitwise_right_shift_(1), i.clone().__irshift__(2)])


CASES = [
    # --- einsum and the matmul family --------------------------------------------------------
    Case("einsum", [torch.einsum], lambda s, x: torch.einsum("ij,jk->ik", s, x), [(5, 3)]),
    Case("matmul", [torch.matmul, torch.linalg.matmul, _T.matmul, _T.__matmul__],
         lambda s, x: torch.matmul(s, x) + torch.linalg.matmul(s, x),
         [(5, 3)]),
    Case("@", [_T.__matmul__], lambda s, x: s @ x, [(5, 3)]),
    Case("rmatmul", [_T.__rmatmul__], lambda s, x: x @ s, [(3, 4)]),
    Case("mm", [torch.mm, _T.mm], lambda s, x: torch.mm(s, x), [(5, 3)]),
    Case("Tensor.mm", [_T.mm], lambda s, x: s.mm(x), [(5, 3)]),
    Case("mv", [torch.mv, _T.mv], lambda s, x: torch.mv(s, x), [(5,)]),
    Case("bmm", [torch.bmm, _T.bmm], lambda s, x: torch.bmm(s, x), [(2, 5, 3)], shape=(2, 4, 5),
         fmt="coo"),
    Case("addmv", [torch.addmv, _T.addmv], lambda s, c, v: torch.addmv(c, s, v, beta=0.5, alpha=2.0),
         [(4,), (5,)]),
    Case("baddbmm", [torch.baddbmm, _T.baddbmm],
         lambda s, c, x: torch.baddbmm(c, s, x, beta=0.5, alpha=2.0), [(2, 4, 3), (2, 5, 3)], shape=(2, 4, 5),
         fmt="coo"),
    Case("sparse.addmm", [torch.sparse.addmm], lambda s, c, x: torch.sparse.addmm(c, s, x), [(4, 3), (5, 3)]),
    Case("sampled_addmm", [torch.sparse.sampled_addmm],
         lambda s, a, b: torch.sparse.sampled_addmm(s, a, b, beta=0.5, alpha=2.0),
         [(4, 3), (3, 5)], oracle=lambda d, a, b: (d != 0) * (2.0 * (a @ b)) + 0.5 * d),
    Case("layouts", [_T.to_sparse_csr, _T.to_sparse_csc, _T.to_sparse, _T.to_sparse_coo, _T.coalesce],
         lambda s: s.to_sparse_csc().to_sparse().coalesce().to_sparse_csr().to_sparse_coo(),
         oracle=lambda d: d),
    Case("sparse_mask", [_T.sparse_mask], lambda s, x: x.sparse_mask(s) * s, [SHAPE],
         oracle=lambda d, x: x * (d != 0) * d),
    Case("addmm", [torch.addmm, _T.addmm], lambda s, c, x: torch.addmm(c, s, x, beta=0.5, alpha=2.0),
         [(4, 3), (5, 3)]),
    Case("linear", [F.linear], lambda s, x, b: F.linear(x, s, b), [(2, 5), (4,)]),
    Case("sparse.mm", [torch.sparse.mm], lambda s, x: torch.sparse.mm(s, x), [(5, 3)]),
    Case("linear_sparse_input", [F.linear], lambda s, w, b: F.linear(s, w, b), [(3, 5), (3,)]),
    Case("einsum_sddmm", [torch.einsum], lambda s, x, y: torch.einsum("ij,ik,jk->ij", s, x, y),
         [(4, 3), (5, 3)]),
    # --- elementwise arithmetic --------------------------------------------------------------
    Case("add", [torch.add, _T.add, _T.__add__], lambda s, x: torch.add(s, x, alpha=2.0), [SHAPE]),
    Case("radd", [_T.__radd__], lambda s, x: x + s, [SHAPE]),
    Case("add_sparse", [_T.__add__], lambda s: s + s * 3.0),
    Case("sub", [torch.sub, torch.subtract, _T.sub, _T.subtract, _T.__sub__],
         lambda s, x: torch.sub(s, x), [SHAPE]),
    Case("rsub", [torch.rsub, _T.__rsub__], lambda s, x: torch.rsub(s, x), [SHAPE]),
    Case("rsub_scalar", [_T.__rsub__], lambda s: 1.5 - s),
    Case("mul", [torch.mul, torch.multiply, _T.mul, _T.multiply, _T.__mul__],
         lambda s, x: torch.mul(s, x), [SHAPE]),
    Case("rmul", [_T.__rmul__], lambda s, x: x * s, [SHAPE]),
    Case("mul_scalar", [_T.__mul__, _T.__rmul__], lambda s: 2.0 * (s * 3.0)),
    Case("div", [torch.div, torch.divide, torch.true_divide, _T.div, _T.divide, _T.true_divide,
                 _T.__truediv__], lambda s, x: torch.div(s, x), [SHAPE], extra={"partner_positive": True}),
    Case("div_scalar", [_T.__truediv__], lambda s: s / 4.0),
    Case("rdiv", [_T.__rdiv__], lambda s: 2.0 / s, positive=True,
         raises=(RuntimeError, "'div' by a sparse tensor that requires grad .* has no backward")),
    Case("addcmul", [torch.addcmul, _T.addcmul], lambda s, x, y: torch.addcmul(s, s, y, value=0.5) + 0 * x,
         [SHAPE, SHAPE]),
    Case("addcdiv", [torch.addcdiv, _T.addcdiv], lambda s, x: torch.addcdiv(s, s, x, value=0.5),
         [SHAPE], extra={"partner_positive": True}),
    Case("neg", [torch.neg, torch.negative, _T.neg, _T.negative], lambda s: torch.neg(s)),
    Case("neg_op", [], lambda s: -s),
    # in-place by a tensor: the result written into the values, the history rebased
    # (in_place.record_in_place); the backward is the out-of-place op's
    Case("add_", [_T.add_, _T.__iadd__], lambda s: (s * 1.0).add_(s * 2.0)),
    Case("sub_", [_T.sub_, _T.subtract_, _T.__isub__], lambda s: (s * 1.0).sub_(s * 2.0, alpha=3)),
    # by a scalar: the stored values scaled in place, the history rebased (in_place.py)
    Case("mul_", [_T.mul_, _T.multiply_, _T.__imul__], lambda s: (s * 1.0).mul_(3.0)),
    Case("div_", [_T.div_, _T.divide_, _T.true_divide_, _T.__idiv__], lambda s: (s * 1.0).div_(4.0)),
    Case("mul_tensor", [_T.mul_], lambda s: (s * 1.0).mul_(s)),
    Case("mul_dense_tensor", [_T.mul_], lambda s, x: (s * 1.0).mul_(x), [SHAPE]),
    Case("div_dense_tensor", [_T.div_], lambda s, x: (s * 1.0).div_(x + 1.0), [SHAPE]),
    # a dense tensor updated in place by a sparse one: torch's copy_ records it
    Case("dense.add_(sparse)", [_T.add_], lambda s, x: (x * 1.0).add_(s), [SHAPE]),
    # --- elementwise functions (the derivative table) ----------------------------------------
    *[Case(name, [getattr(torch, name), getattr(_T, name)] + ([getattr(F, name)] if name in
                                                            ("relu", "tanh", "sigmoid") else []),
           (lambda name: lambda s: getattr(torch, name)(s))(name),
           positive=name in ("sqrt", "log"))
      for name in ("relu", "abs", "sqrt", "sin", "tanh", "sign", "square", "exp", "cos",
                   "sigmoid", "log")],
    *[Case(name, [getattr(torch, name), getattr(_T, name)] + extra,
           (lambda name: lambda s: getattr(torch, name)(s))(name), positive=name == "log1p")
      for name, extra in (("expm1", [torch.special.expm1]), ("log1p", [torch.special.log1p]),
                          ("erf", [torch.special.erf]), ("atan", [torch.arctan, _T.arctan]),
                          ("floor", []), ("ceil", []), ("round", []), ("trunc", [torch.fix, _T.fix]),
                          ("frac", []))],
    *[Case(name, [getattr(F, name)], (lambda name: lambda s: getattr(F, name)(s))(name))
      for name in ("gelu", "silu", "softsign", "hardtanh", "relu6", "mish", "tanhshrink",
                   "logsigmoid", "softplus")],
    Case("selu", [F.selu, torch.selu], lambda s: F.selu(s) + torch.selu(s)),
    Case("celu", [F.celu, torch.celu], lambda s: F.celu(s, alpha=0.7) + torch.celu(s)),
    Case("shrink", [F.softshrink, F.hardshrink, torch.hardshrink, _T.hardshrink],
         lambda s: F.softshrink(s, 0.9) + F.hardshrink(s, 0.9) + s.hardshrink(0.7)),
    *[Case(name, [getattr(torch, name), getattr(_T, name)] + extra,
           (lambda name: lambda s: getattr(torch, name)(s * 0.5))(name))
      for name, extra in (("asin", [torch.arcsin, _T.arcsin]), ("asinh", [torch.arcsinh, _T.arcsinh]),
                          ("atanh", [torch.arctanh, _T.arctanh]), ("sinh", []), ("tan", []),
                          ("deg2rad", []), ("rad2deg", []))],
    Case("hardswish", [F.hardswish], lambda s: F.hardswish(s * 4.0)),
    Case("threshold", [F.threshold, torch.threshold], lambda s: F.threshold(s, 0.7, 0.0) + torch.threshold(s, -0.9, 0)),
    Case("sgn", [torch.sgn, _T.sgn], lambda s: torch.sgn(s) * s + s.sgn()),
    Case("prelu", [F.prelu, torch.prelu], lambda s, w: F.prelu(s, w) + torch.prelu(s, w[:1]), [(5,)]),
    Case("leaky_relu", [F.leaky_relu], lambda s: F.leaky_relu(s, 0.2)),
    Case("elu", [F.elu], lambda s: F.elu(s, alpha=0.7)),
    Case("absolute", [torch.absolute, _T.absolute], lambda s: torch.absolute(s)),
    Case("pow", [torch.pow, _T.pow], lambda s: torch.pow(s, 3)),
    Case("pow_fraction", [_T.pow], lambda s: s.pow(1.5), positive=True),
    Case("**", [_T.__pow__], lambda s: s ** 2),
    # --- softmax over stored entries ---------------------------------------------------------
    Case("softmax", [torch.softmax, _T.softmax, F.softmax, torch._softmax],
         lambda s: F.softmax(s, dim=1), oracle=_torch_sparse_softmax(False)),
    Case("sparse.softmax", [torch.sparse.softmax], lambda s: torch.sparse.softmax(s, 1),
         oracle=_torch_sparse_softmax(False)),
    Case("log_softmax", [torch.log_softmax, _T.log_softmax, F.log_softmax, torch._log_softmax],
         lambda s: s.log_softmax(dim=1), oracle=_torch_sparse_softmax(True)),
    Case("sparse.log_softmax", [torch.sparse.log_softmax],
         lambda s: torch.sparse.log_softmax(s, 1), oracle=_torch_sparse_softmax(True)),
    # --- reductions --------------------------------------------------------------------------
    Case("sum", [torch.sum, _T.sum], lambda s: torch.sum(s, 1)),
    Case("sum_all", [_T.sum], lambda s: s.sum()),
    Case("sparse.sum", [torch.sparse.sum, torch._sparse_sum], lambda s: torch.sparse.sum(s, 0),
         oracle=lambda d: d.sum(0)),
    Case("mean", [torch.mean, _T.mean], lambda s: torch.mean(s, 0, keepdim=True)),
    Case("amax", [torch.amax, _T.amax], lambda s: torch.amax(s, 1)),
    Case("amin", [torch.amin, _T.amin], lambda s: s.amin(0)),
    # --- shape -------------------------------------------------------------------------------
    Case("t", [torch.t, _T.t], lambda s: torch.t(s)),
    Case("T", [_T.T], lambda s: s.T),
    Case("mT", [_T.mT], lambda s: s.mT),
    Case("transpose", [torch.transpose, _T.transpose, torch.swapaxes, _T.swapaxes, torch.swapdims,
                       _T.swapdims], lambda s: torch.transpose(s, 0, 1)),
    Case("permute", [torch.permute, _T.permute], lambda s: s.permute(1, 0)),
    Case("reshape", [torch.reshape, _T.reshape], lambda s: s.reshape(2, 10)),
    Case("view", [_T.view], lambda s: s.view(-1)),
    Case("view_as", [_T.view_as, _T.reshape_as], lambda s, x: s.view_as(x), [(20,)]),
    Case("flatten", [torch.flatten, _T.flatten], lambda s: torch.flatten(s)),
    Case("unflatten", [torch.unflatten, _T.unflatten], lambda s: s.unflatten(1, (5, 1))),
    Case("unsqueeze", [torch.unsqueeze, _T.unsqueeze], lambda s: s.unsqueeze(0)),
    Case("squeeze", [torch.squeeze, _T.squeeze], lambda s: s.unsqueeze(1).squeeze(1)),
    Case("cat", [torch.cat, torch.concat, torch.concatenate], lambda s: torch.cat([s, s * 2.0], 1)),
    Case("cat_dense", [torch.cat], lambda s, x: torch.cat([s, x], 0), [(2, 5)]),
    Case("stack", [torch.stack], lambda s: torch.stack([s, s * s], 0)),
    Case("stack_dense", [torch.stack], lambda s, x: torch.stack([s, x], 1), [SHAPE]),
    # session 30: aliases and compositions (scorch/sparse_ops/aliases.py)
    Case("movedim", [torch.movedim, _T.movedim, torch.moveaxis, _T.moveaxis],
         lambda s: torch.movedim(s, 0, 1) * 2 + s.moveaxis(1, 0)),
    Case("adjoint", [torch.adjoint, _T.adjoint, _T.mH, _T.H],
         lambda s: torch.adjoint(s) + s.mH * 2 + s.H * 3),
    Case("weight_norm", [torch._weight_norm, torch.norm_except_dim],
         lambda s, g: torch._weight_norm(s, g, 0) + torch._weight_norm(s, g.sum(), -1) * 2
         + torch.norm_except_dim(s, 2, 1).sum(), [(SHAPE[0], 1)]),
    Case("conj", [torch.conj, _T.conj, torch.conj_physical, _T.conj_physical],
         lambda s: torch.conj(s) + s.conj() * 2 + torch.conj_physical(s) * 3 + s.conj_physical() * 4),
    Case("stacks", [torch.vstack, torch.row_stack, torch.hstack, torch.dstack, torch.column_stack],
         lambda s: torch.cat([torch.vstack([s, s * 2]).reshape(-1), torch.row_stack([s]).reshape(-1),
                              torch.hstack([s, s]).reshape(-1), torch.dstack([s, s * 3]).reshape(-1),
                              torch.column_stack([s, s]).reshape(-1)])),
    Case("ravel", [torch.ravel, _T.ravel], lambda s: torch.ravel(s) + s.ravel() * 2),
    Case("tensor_split", [torch.tensor_split, _T.tensor_split],
         lambda s: torch.cat(torch.tensor_split(s, 3, 1), 1) * 2 + torch.cat(s.tensor_split([1, 3], 0), 0)),
    Case("multi_dot", [torch.linalg.multi_dot, torch.chain_matmul],
         lambda s, x, y: torch.linalg.multi_dot([s, x, y]) + torch.chain_matmul(s, x, y), [(5, 3), (3, 2)]),
    Case("pow_sparse_exponent", [torch.pow], lambda s: torch.pow(s, s * 0.5), positive=True),
    Case("mul_broadcast", [torch.mul], lambda s, x: s * x, [(5,)]),
    Case("getitem", [_T.__getitem__], lambda s: s[1:, [0, 2, 2]]),
    Case("reversed", [_T.__reversed__], lambda s: reversed(s) * 2),
    Case("embedding", [F.embedding], lambda s: F.embedding(torch.tensor([[3, 0], [0, 1]]), s)),
    Case("index_select", [torch.index_select, _T.index_select],
         lambda s: s.index_select(0, torch.tensor([3, 0, 0]))),
    Case("narrow", [torch.narrow, _T.narrow], lambda s: s.narrow(1, 1, 3)),
    Case("flip_roll_repeat", [torch.flip, _T.flip, torch.roll, _T.roll, _T.repeat],
         lambda s: s.flip(0) + torch.roll(s, (1, -2), (0, 1)) + s.repeat(2, 1)[4:]),
    Case("diff", [torch.diff, _T.diff], lambda s: torch.diff(s, dim=1) + s.diff(n=2, dim=0).sum()),
    Case("tril", [torch.tril, _T.tril], lambda s: torch.tril(s, 1)),
    Case("triu", [torch.triu, _T.triu], lambda s: s.triu(-1)),
    # --- products that are einsums ---------------------------------------------------------
    Case("outer", [torch.outer, _T.outer, torch.ger, _T.ger], lambda s, x: torch.outer(s[1], x), [(3,)]),
    Case("dot", [torch.dot, _T.dot, torch.inner, _T.inner, torch.vdot, _T.vdot],
         lambda s, x: torch.dot(s[2], x) + torch.inner(s[1], x) + torch.vdot(s[0], x), [(5,)]),
    Case("tensordot", [torch.tensordot], lambda s, x: torch.tensordot(s, x, dims=([1], [0])), [(5, 2)]),
    Case("kron", [torch.kron], lambda s, x: torch.kron(s, x), [(2, 2)]),
    # torch's hspmm, smm and sspaddmm take a sparse mat1 only: the oracle is the dense product
    Case("hspmm", [torch.hspmm, torch.smm, _T.smm], lambda s, x: torch.hspmm(s, x) + s.smm(x), [(5, 3)],
         oracle=lambda d, x: d @ x * 2.0),
    Case("sspaddmm", [torch.sspaddmm, _T.sspaddmm],
         lambda s, x: torch.sspaddmm(s[:, :4], s, x, beta=0.5, alpha=2.0) + s[:, :4].sspaddmm(s, x), [(5, 4)],
         oracle=lambda d, x: 1.5 * d[:, :4] + 3.0 * (d @ x)),
    Case("trace", [torch.trace, _T.trace], lambda s: torch.trace(s)),
    Case("diagonal", [torch.diagonal, _T.diagonal, torch.diag, _T.diag],
         lambda s: torch.diagonal(s) + s.diag() * 2.0),
    # --- stored-value ops and full reductions --------------------------------------------
    Case("clamp", [torch.clamp, _T.clamp, torch.clip, _T.clip], lambda s: torch.clamp(s, -0.8, 1.2)),
    Case("clamp_dense", [_T.clamp], lambda s: s.clamp(min=0.7)),
    Case("nan_to_num", [torch.nan_to_num, _T.nan_to_num], lambda s: torch.nan_to_num(s)),
    Case("lerp", [torch.lerp, _T.lerp], lambda s, x: torch.lerp(s, x, 0.3), [SHAPE]),
    Case("norm", [torch.linalg.vector_norm, torch.norm, _T.norm],
         lambda s: torch.linalg.vector_norm(s, 1) + s.norm() + torch.norm(s, dim=1).sum()),
    Case("max_all", [torch.max, _T.max, torch.min, _T.min], lambda s: torch.max(s) - s.min()),
    Case("var", [torch.var, _T.var, torch.std, _T.std],
         lambda s: torch.var(s, 1) + s.std(0, keepdim=True).sum() + s.var(correction=0)),
    Case("expand", [_T.expand, _T.expand_as, torch.broadcast_to],
         lambda s: s[:1].expand(3, -1) + torch.broadcast_to(s[:, :1], SHAPE)[:3] + s[2:3].expand_as(s[:3])),
    Case("matrix_power", [torch.linalg.matrix_power, torch.matrix_power, _T.matrix_power],
         lambda s: torch.linalg.matrix_power(s[:, :4], 3) + s[:, :4].matrix_power(1)),
    Case("fmod", [torch.fmod, _T.fmod, torch.remainder, _T.remainder, _T.__mod__],
         lambda s, x: torch.fmod(s, 0.3) + torch.remainder(s, x) + s % 0.4, [(5,)],
         extra={"partner_positive": True}),
    # torch's floor_divide has no derivative: the backward raises, as torch's
    Case("floor_divide", [torch.floor_divide, _T.floor_divide, _T.__floordiv__],
         lambda s: torch.floor_divide(s, 0.3) + s // 0.2, raises=(RuntimeError, "floor_divide")),
    Case("div_rounding", [torch.div], lambda s, x: torch.div(s, 0.3, rounding_mode="trunc") * x
         + s.div(x, rounding_mode="floor"), [SHAPE], extra={"partner_positive": True}),
    Case("clamp_min", [torch.clamp_min, _T.clamp_min, torch.clamp_max, _T.clamp_max],
         lambda s: torch.clamp_min(s, -0.9).clamp_max(1.1)),
    Case("normalize", [F.normalize], lambda s: F.normalize(s, dim=1) + F.normalize(s, p=1.0, dim=0)),
    # --- dense by nature: torch's op on the dense copy, differentiable through to_dense --------
    Case("cumsum", [torch.cumsum, _T.cumsum, torch.cumprod, _T.cumprod, torch.logcumsumexp,
                    _T.logcumsumexp], lambda s: s.cumsum(1) + torch.cumprod(s, 0) + s.logcumsumexp(1)),
    Case("logsumexp", [torch.logsumexp, _T.logsumexp], lambda s: torch.logsumexp(s, 1) + s.logsumexp(0).sum()),
    Case("reciprocal", [torch.reciprocal, _T.reciprocal, torch.rsqrt, _T.rsqrt],
         lambda s: (torch.reciprocal(s) + s.rsqrt()).clamp(max=1e6), positive=True),
    Case("cosh", [torch.cosh, _T.cosh, torch.acos, _T.acos, torch.exp2, _T.exp2, torch.erfc, _T.erfc],
         lambda s: torch.cosh(s) + (s * 0.5).acos() + s.exp2() + torch.erfc(s)),
    Case("matrix_exp", [torch.matrix_exp, torch.linalg.matrix_exp],
         lambda s: torch.matrix_exp(s[:, :4] * 0.3), ),
    Case("losses", [F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div],
         lambda s, x: F.mse_loss(s, x) + F.l1_loss(s, x) + F.smooth_l1_loss(s, x) + F.huber_loss(s, x)
         + F.kl_div(s, x, reduction="batchmean"), [SHAPE], extra={"partner_positive": True}),
    Case("cross_entropy", [F.cross_entropy, F.nll_loss],
         lambda s: F.cross_entropy(s, torch.tensor([0, 4, 2, 1])) + F.nll_loss(s, torch.tensor([1, 1, 0, 3]))),
    Case("binary_cross_entropy", [F.binary_cross_entropy, F.binary_cross_entropy_with_logits],
         lambda s, x: F.binary_cross_entropy((s * 0.4).abs() + 0.1, x * 0.5)
         + F.binary_cross_entropy_with_logits(s, x * 0.5), [SHAPE], extra={"partner_positive": True}),
    Case("layer_norm", [F.layer_norm], lambda s, w: F.layer_norm(s, (5,), w), [(5,)]),
    Case("sort", [torch.sort, _T.sort, torch.argsort, _T.argsort, torch.msort, _T.msort],
         lambda s: torch.sort(s, 1).values + s.sort(0, descending=True)[0] + torch.msort(s)
         + s.msort() * torch.argsort(s, 1).double() + _T.argsort(s, 0)),
    Case("log2", [torch.log2, _T.log2, torch.log10, _T.log10, torch.logit, _T.logit, torch.special.logit,
                  torch.sinc, _T.sinc, torch.i0, _T.i0, F.hardsigmoid],
         lambda s: torch.log2(s + 1.0) + (s + 1.0).log10() + torch.logit(s * 0.2 + 0.5) + (s * 0.2 + 0.5).logit()
         + torch.special.logit(s * 0.3 + 0.5) + torch.sinc(s) + s.sinc() + torch.i0(s) + s.i0() + F.hardsigmoid(s),
         positive=True),
    Case("atan2", [torch.atan2, _T.atan2, torch.arctan2, _T.arctan2, torch.logaddexp, _T.logaddexp,
                   torch.logaddexp2, _T.logaddexp2, _T.__rpow__],
         lambda s, x: torch.atan2(s, x) + s.atan2(x) + torch.arctan2(x, s) + s.arctan2(x) + torch.logaddexp(s, x)
         + s.logaddexp(x) + torch.logaddexp2(s, x) + s.logaddexp2(x) + 2.0 ** s, [SHAPE],
         extra={"partner_positive": True}),
    Case("bitwise_not", [torch.bitwise_not, _T.bitwise_not, _T.__invert__],
         lambda s: torch.stack([torch.bitwise_not(s > 0), (s > 0).bitwise_not(), ~(s < 0)]), bool_result=True),
    Case("norms_by_nature", [F.batch_norm, F.group_norm, F.instance_norm, F.local_response_norm],
         lambda s: F.batch_norm(s, None, None, training=True) + F.group_norm(s, 1)
         + F.instance_norm(s[None])[0] + F.local_response_norm(s[None], 2)[0]),
    Case("distances", [torch.cdist, F.pairwise_distance, F.pdist],
         lambda s, x: torch.cdist(s, x).sum(1) + F.pairwise_distance(s, x) + F.pdist(s)[:4], [SHAPE]),
    Case("more_losses", [F.hinge_embedding_loss, F.cosine_embedding_loss, F.soft_margin_loss,
                         F.margin_ranking_loss, F.poisson_nll_loss, F.gaussian_nll_loss,
                         F.multilabel_soft_margin_loss, F.multilabel_margin_loss, F.multi_margin_loss,
                         F.triplet_margin_loss],
         lambda s, x: F.hinge_embedding_loss(s, x.detach().sign()) + F.cosine_embedding_loss(s, x, torch.ones(4))
         + F.soft_margin_loss(s, x.detach().sign()) + F.margin_ranking_loss(s, x, x.detach().sign())
         + F.poisson_nll_loss(s, x) + F.gaussian_nll_loss(s, x, x.abs() + 0.1)
         + F.multilabel_soft_margin_loss(s, (x > 0).double()) + F.multilabel_margin_loss(s, torch.tensor([[1, 3, -1, 0, 0]] * 4))
         + F.multi_margin_loss(s, torch.tensor([0, 4, 2, 1])) + F.triplet_margin_loss(s, x, x.flip(0)), [SHAPE]),
    Case("isclose_ones_like", [torch.isclose, _T.isclose, torch.ones_like, torch.isfinite, _T.isfinite],
         lambda s: torch.isclose(s, s * 1.0).double() + torch.ones_like(s) + s.isfinite(), bool_result=True),
    # --- accessors ---------------------------------------------------------------------------
    Case("values", [_T.values, _T._values], lambda s: s.values() * 2.0 + s._values(),
         oracle=lambda d: d[d != 0] * 3.0),
    Case("to_dense", [_T.to_dense], lambda s: s.to_dense()),
    Case("to", [_T.to], lambda s: s.to(torch.float32).to(F64)),
    Case("to_copy", [_T.to], lambda s: s.to("cpu", F64, copy=True) * 2.0),
    Case("float", [_T.float, _T.double], lambda s: s.float().double()),
    Case("half", [_T.half, _T.bfloat16], lambda s: s.half().double() + s.bfloat16().double()),
    Case("type", [], lambda s: s.type(torch.float32).type("torch.DoubleTensor")),   # ATen's _to_copy
    Case("type_as", [_T.type_as], lambda s, x: s.type_as(x.float()).type_as(x), [SHAPE]),
    # --- where, masked_fill, dropout -------------------------------------------------------
    Case("where", [torch.where], lambda s, x: torch.where(s > 0, s, x * (s != 0)), [SHAPE]),
    Case("where_scalar", [torch.where], lambda s: torch.where(s > 0, s, 0.0)),
    Case("Tensor.where", [_T.where], lambda s: s.where(s < 0, 0.0)),
    Case("masked_fill", [torch.masked_fill, _T.masked_fill], lambda s: s.masked_fill(s > 0, 0.0)),
    Case("maximum", [torch.maximum, _T.maximum], lambda s, x: torch.maximum(s, x * (s != 0)), [SHAPE]),
    Case("minimum", [torch.minimum, _T.minimum], lambda s, x: torch.minimum(s, x - 1.0), [SHAPE]),
    Case("maximum_sparse_pair", [torch.maximum], lambda s: torch.maximum(s, (s * 0.5).t().t())),
    Case("fmax", [torch.fmax, _T.fmax, torch.fmin, _T.fmin],
         lambda s, x: torch.fmax(s, x * (s != 0)) + torch.fmin(s, (s * 0.5).t().t()) + s.fmax(x), [SHAPE]),
    Case("masked_fill_dense", [_T.masked_fill], lambda s, x: x.masked_fill(s > 0, 1.5) * s, [SHAPE]),
    Case("masked_fill_value", [_T.masked_fill],
         lambda s, x: s.masked_fill(s < 0, x.sum() / 10.0), [(2,)]),
    Case("dropout_eval", [F.dropout, torch.dropout], lambda s: F.dropout(s, 0.5, training=False)),
    # in-place forms of ops that keep 0 at 0 (session 36), rebased as the other in-place ops
    Case("in_place_ipow_remainder_fmod", [_T.__ipow__, _T.remainder_, _T.__imod__, _T.fmod_],
         lambda s: (s * 1.0).__ipow__(2) + (s * 1.0).remainder_(0.7) + (s * 1.0).__imod__(0.7)
         + (s * 1.0).fmod_(0.3)),
    Case("in_place_floor_divide", [_T.floor_divide_, _T.__ifloordiv__],
         lambda s: (s * 1.0).floor_divide_(0.3) + (s * 1.0).__ifloordiv__(0.2),
         raises=(RuntimeError, "floor_divide")),
    Case("fill_", [_T.fill_, torch.fill_], lambda s: (s * 1.0).fill_(0.0) + torch.fill_(s * 1.0, 0) + s),
    # --- results with no gradient: bool or index results ---------------------------------
    *[Case(name, fns, call, bool_result=True) for name, fns, call in [
        ("bitwise_integer", [_T.__rand__, torch.bitwise_left_shift, _T.bitwise_left_shift, _T.__lshift__,
                             torch.bitwise_right_shift, _T.bitwise_right_shift, _T.__rshift__,
                             _T.bitwise_and_, _T.__iand__, _T.bitwise_left_shift_, _T.__ilshift__,
                             _T.bitwise_right_shift_, _T.__irshift__], _bitwise_integer),
        ("compare", [torch.lt, torch.less, _T.lt, _T.less, _T.__lt__, torch.le, torch.less_equal,
                     _T.le, _T.less_equal, _T.__le__, torch.gt, torch.greater, _T.gt, _T.greater,
                     _T.__gt__, torch.ge, torch.greater_equal, _T.ge, _T.greater_equal, _T.__ge__,
                     torch.eq, _T.eq, _T.__eq__, torch.ne, torch.not_equal, _T.ne, _T.not_equal,
                     _T.__ne__], lambda s: s > 0),
        ("logical", [torch.logical_and, _T.logical_and, torch.logical_or, _T.logical_or,
                     torch.logical_xor, _T.logical_xor, torch.logical_not, _T.logical_not,
                     torch.bitwise_and, _T.bitwise_and, _T.__and__, torch.bitwise_or,
                     _T.bitwise_or, _T.__or__, torch.bitwise_xor, _T.bitwise_xor, _T.__xor__],
         lambda s: torch.logical_and(s, s > 0)),
    ]],
    Case("equal", [torch.equal, torch.allclose, _T.allclose],
         lambda s: torch.tensor([torch.equal(s, s), torch.allclose(s, s * 1.0), s.allclose(s * 2.0)]),
         bool_result=True),
    Case("isnan", [torch.isnan, _T.isnan, torch.isinf, _T.isinf, torch.isposinf, torch.isneginf,
                   torch.signbit, _T.signbit],
         lambda s: torch.isnan(s) | torch.isinf(s) | torch.isposinf(s) | torch.isneginf(s) | s.signbit(),
         bool_result=True,   # the dense copy's unstored -0.0 (a negative value times 0) is +0 in S
         oracle=lambda d: torch.isnan(d) | torch.isinf(d) | (d + 0.0).signbit()),
    # heaviside has no derivative in torch: the backward raises, as torch's
    Case("heaviside", [torch.heaviside, _T.heaviside], lambda s: torch.heaviside(s, torch.zeros((), dtype=F64)),
         raises=(RuntimeError, "heaviside")),
    Case("count_nonzero", [torch.count_nonzero, _T.count_nonzero, torch.any, _T.any, torch.all, _T.all],
         lambda s: torch.count_nonzero(s, dim=0) + s.any() + torch.all(s), bool_result=True),
    Case("layout_accessors", [_T.crow_indices, _T.col_indices, _T.ccol_indices, _T.row_indices,
                              _T.is_coalesced],
         lambda s: torch.cat([s.crow_indices(), s.col_indices(), s.to_format("csc").ccol_indices(),
                              s.to_format("csc").row_indices()]).long() + s.is_coalesced(),
         bool_result=True,
         oracle=lambda d: torch.cat([d.to_sparse_csr().crow_indices(), d.to_sparse_csr().col_indices(),
                                     d.to_sparse_csc().ccol_indices(), d.to_sparse_csc().row_indices()]) + 1),
    Case("prod", [torch.prod, _T.prod], lambda s: torch.prod(s, 1) + s.prod(0).sum() + (s * 0 + 1.5).prod()),
    Case("bucketize", [torch.bucketize, torch.searchsorted],
         lambda s: torch.bucketize(s, torch.tensor([0.0, 0.5, 2.0], dtype=s.dtype))
         + torch.searchsorted(torch.tensor([0.0, 1.0], dtype=s.dtype), s), bool_result=True),
    Case("argmax", [torch.argmax, _T.argmax, torch.argmin, _T.argmin],
         lambda s: torch.stack([torch.argmax(s, 1), s.argmin(1)]), bool_result=True),
    Case("nonzero", [torch.nonzero, _T.nonzero, torch.argwhere, _T.argwhere],
         lambda s: torch.cat([torch.nonzero(s), s.t().argwhere(), torch.stack(s.nonzero(as_tuple=True), 1)]),
         bool_result=True),
    Case("indices", [_T.indices, _T._indices], lambda s: s.indices(), bool_result=True,
         oracle=lambda d: d.detach().to_sparse().indices()),
    Case("nnz", [_T._nnz], lambda s: torch.tensor(s._nnz()), bool_result=True,
         oracle=lambda d: torch.tensor(int((d != 0).sum()))),
    Case("is_shared", [_T.is_shared], lambda s: torch.tensor(s.is_shared()), bool_result=True,
         oracle=lambda d: torch.tensor(False)),
    # --- order statistics (rows of sparse_ops/order_statistics.py) ------------------------------
    Case("topk", [torch.topk, _T.topk],
         lambda s: torch.cat([torch.topk(s, 2, 1).values.reshape(-1), s.topk(2, 0, largest=False).values.reshape(-1)])),
    Case("kthvalue", [torch.kthvalue, _T.kthvalue],
         lambda s: torch.kthvalue(s, 2, 1).values + s.kthvalue(4, 1, keepdim=True).values.squeeze(1)),
    Case("median", [torch.median, _T.median, torch.nanmedian, _T.nanmedian],
         lambda s: torch.median(s, 1).values + s.nanmedian(0).values.sum() + torch.median(s) + s.nanmedian()),
    Case("max_dim", [torch.max, _T.max, torch.min, _T.min],
         lambda s: torch.max(s, 1).values + s.min(dim=1, keepdim=True).values.squeeze(1) + s.max(0).values.sum()),
    # --- positions (rows of sparse_ops/positions.py) --------------------------------------------
    Case("gather", [torch.gather, _T.gather],
         lambda s: torch.cat([torch.gather(s, 1, torch.arange(12).view(4, 3) % 5).flatten(),
                              s.gather(0, torch.arange(15).view(3, 5) % 4).flatten()])),
    Case("take", [torch.take, _T.take, torch.take_along_dim, _T.take_along_dim],
         lambda s: torch.cat([torch.take(s, torch.tensor([0, -1, 7, 7])), s.take(torch.tensor([19])),
                              torch.take_along_dim(s, torch.tensor([[1], [4], [0], [-1]]), 1).flatten(),
                              s.take_along_dim(torch.tensor([3, 19, 3]))])),
    Case("masked_select", [torch.masked_select, _T.masked_select],
         lambda s, x: torch.cat([torch.masked_select(s, x > 0), s.masked_select(s > 0), x.masked_select(s < 0)]),
         [SHAPE]),
    Case("index_add", [torch.index_add, _T.index_add],
         lambda s, x: torch.index_add(x, 1, torch.tensor([2, 0, 2, 1, 2]), s, alpha=2.0), [(4, 3)]),
    Case("index_add_sparse_self", [_T.index_add],
         lambda s, x: s.index_add(0, torch.tensor([1, 1, 3, 0, 2]), x), [(5, 5)]),
    Case("dense.index_add_(sparse)", [_T.index_add_],
         lambda s, x: (x * 1.0).index_add_(1, torch.tensor([2, 0, 2, 1, 2]), s), [(4, 3)]),
    Case("scatter_add", [torch.scatter_add, _T.scatter_add],
         lambda s, x: torch.scatter_add(x, 0, torch.arange(20).view(4, 5) % 3, s), [SHAPE]),
    Case("scatter_add_sparse_self", [_T.scatter_add],
         lambda s, x: s.scatter_add(1, torch.arange(20).view(4, 5) % 4, x), [SHAPE]),
    Case("dense.scatter_add_(sparse)", [_T.scatter_add_],
         lambda s, x: (x * 1.0).scatter_add_(1, torch.arange(20).view(4, 5) % 4, s), [SHAPE]),
    Case("scatter", [torch.scatter, _T.scatter, torch.scatter_reduce, _T.scatter_reduce],
         lambda s, x: torch.scatter(s, 0, (torch.arange(4)[:, None] + torch.arange(5)) % 4, x)
         + s.scatter_reduce(1, torch.arange(20).view(4, 5) % 3, x, "sum"), [SHAPE]),
    # --- session 18, the rest of the surface -----------------------------------------------------
    # in place: on a non-leaf (a leaf that requires grad raises, as torch); the history rebased
    Case("in_place_keeping_zero", _IN_PLACE_FUNCTIONS, _in_place_chain),
    Case("in_place_moving_zero", [_T.sigmoid_, torch.sigmoid_, _T.exp_, torch.exp_, _T.cos_,
                                  torch.cos_, _T.log_, torch.log_],
         lambda s: (s * 1.0).sigmoid_(), raises=(RuntimeError, "maps 0 to")),
    Case("writes_at_positions", [_T.masked_fill_, _T.__setitem__, _T.index_put_, _T.fill_diagonal_],
         lambda s: _written(s)),
    Case("index_put", [torch.index_put, _T.index_put],
         lambda s, v: torch.index_put(s, (torch.tensor([0, 3]), torch.tensor([1, 1])), v)
         + s.index_put((torch.tensor([2]), torch.tensor([4])), torch.tensor(1.5, dtype=F64), accumulate=True), [(2,)]),
    Case("matrix_norm", [torch.linalg.matrix_norm],
         lambda s: torch.linalg.matrix_norm(s) + torch.linalg.matrix_norm(s, 1) + torch.linalg.matrix_norm(s, float("inf"))
         + torch.linalg.matrix_norm(s, -1) + torch.linalg.matrix_norm(s, "nuc")),
    Case("factorizations", [torch.linalg.svd, torch.svd, _T.svd, torch.linalg.svdvals, torch.linalg.qr, torch.qr, _T.qr,
                            torch.linalg.eigh, torch.linalg.eigvalsh, torch.linalg.eig, torch.linalg.eigvals,
                            torch.linalg.det, torch.det, _T.det, torch.linalg.slogdet, torch.slogdet, torch.logdet,
                            _T.logdet, torch.linalg.matrix_rank, torch.linalg.pinv, torch.pinverse, torch.linalg.cholesky,
                            torch.cholesky, torch.linalg.inv, torch.inverse, _T.inverse, torch.linalg.solve,
                            torch.linalg.lstsq, torch.linalg.cond],
         lambda s: _factorized(s)),
    Case("blocked_layouts", [_T.to_sparse_bsr, _T.to_sparse_bsc],
         lambda s: s.to_sparse_bsr((2, 1)).to_dense() + s.to_sparse_bsc((1, 5)).to_dense(), oracle=lambda d: d * 2),
    Case("random_like", [torch.rand_like, torch.randn_like, torch.randint_like],
         lambda s: torch.stack([torch.rand_like(s) * 0, torch.randn_like(s) * 0, torch.randint_like(s, 3) * 0]) + s,
         oracle=lambda d: torch.stack([d * 0, d * 0, d * 0]) + d),
    Case("sum_to_size", [_T.sum_to_size], lambda s: s.sum_to_size(1, 5).sum() + s.sum_to_size(4, 1).sum()),
    Case("bernoulli", [torch.bernoulli, _T.bernoulli], lambda s: torch.bernoulli(s * 0) + (s * 0.4).bernoulli() * 0 + s,
         positive=True),
    Case("new_dense", [_T.new_ones, _T.new_full, _T.new_tensor],
         lambda s: s.new_ones(4, 5) + s.new_full((4, 5), 2.0) + s.new_tensor([1.0, 2.0, 3.0, 4.0, 5.0]) + s),
    Case("is_pinned", [_T.is_pinned], lambda s: torch.tensor(s.is_pinned()), bool_result=True,
         oracle=lambda d: torch.tensor(False)),
    Case("softmin", [F.softmin], lambda s: F.softmin(s, 1), oracle=_stored_softmin),
    Case("glu", [F.glu], lambda s: F.glu(s[:, :4], 1)),
    Case("value_functions", [torch.erfinv, _T.erfinv, torch.special.erfinv, F.rrelu, torch.float_power,
                             _T.float_power],
         lambda s: torch.erfinv(s * 0.4) + (s * 0.5).erfinv() + torch.special.erfinv(s * 0.1)
         + F.rrelu(s, training=False) + torch.float_power(s, 2) + s.float_power(3)),
    Case("xlogy", [torch.xlogy, _T.xlogy, torch.special.xlogy, torch.copysign, _T.copysign],
         lambda s, x: torch.xlogy(s, x) + s.xlogy(2.0) + torch.special.xlogy(s, x)
         + torch.copysign(s, -x) + s.copysign(-1.0), [SHAPE], extra={"partner_positive": True}),
    Case("hypot", [torch.hypot, _T.hypot], lambda s, x: torch.hypot(s, x) + s.hypot(s * 2.0), [SHAPE]),
    Case("nansum", [torch.nansum, _T.nansum, torch.nanmean, _T.nanmean],
         lambda s: torch.nansum(s, 1) + s.nansum() + torch.nanmean(s, 0).sum() + s.nanmean()),
    Case("std_mean", [torch.std_mean, torch.var_mean, torch.aminmax, _T.aminmax],
         lambda s: torch.std_mean(s, 1)[0] + torch.var_mean(s)[1] + torch.aminmax(s, dim=1).max
         + s.aminmax().min),
    Case("norms", [torch.linalg.norm, torch.dist, _T.dist, F.cosine_similarity, torch.cosine_similarity],
         lambda s, x: torch.linalg.norm(s) + torch.linalg.norm(s, 1, 0).sum() + torch.dist(s, x)
         + s.dist(s * 2.0, 1) + F.cosine_similarity(s, x).sum() + torch.cosine_similarity(s, x, 0).sum(),
         [SHAPE]),
    Case("histc", [torch.histc, _T.histc, torch.bincount, _T.bincount, torch.unique, _T.unique],
         lambda s: torch.cat([torch.histc(s, 4), s.histc(3, -1, 1), torch.unique(s), s.unique(return_counts=True)[1],
                              torch.bincount((s.abs() * 3).long().flatten()),
                              (s.abs() * 2).long().flatten().bincount()]).double().detach(), bool_result=True),
    Case("where_nonzero", [torch.where], lambda s: torch.stack(torch.where(s)), bool_result=True),
    Case("split", [torch.split, _T.split, _T.split_with_sizes, torch.split_with_sizes, torch.chunk, _T.chunk,
                   torch.unbind, _T.unbind, torch.select, _T.select],
         lambda s: torch.stack([p.sum() for p in [
             torch.split(s, 2)[1], s.split([1, 3])[1], s.split_with_sizes([3, 1])[0],
             torch.split_with_sizes(s, [2, 2])[0], torch.chunk(s, 2)[0], s.chunk(3, 1)[1], *torch.unbind(s),
             *s.unbind(1), torch.select(s, 0, 2), s.select(1, 1)]])),
    Case("tile_pad", [torch.tile, _T.tile, F.pad, torch.block_diag],
         lambda s, x: torch.tile(s, (2,)).sum(1) + s.tile(1, 2).sum(1) + F.pad(s, (1, -1)).sum(1)
         + torch.block_diag(s, x).sum(1)[:4], [(2, 2)]),
    Case("diagonals", [torch.diag_embed, _T.diag_embed, torch.diagflat, _T.diagflat, _T.index_fill, torch.index_fill],
         lambda s: torch.stack([p.sum() for p in [
             torch.diag_embed(s), s.diag_embed(1), torch.diagflat(s), s.diagflat(-1),
             s.index_fill(1, torch.tensor([0, 2]), 0.0), torch.index_fill(s, 0, torch.tensor([1]), 0)]]) * torch.arange(1.0, 7.0)),
    Case("quantile", [torch.quantile, _T.quantile, torch.nanquantile, _T.nanquantile],
         lambda s: torch.cat([torch.quantile(s, 0.3, 1), s.quantile(torch.tensor([0.2, 0.9], dtype=F64), dim=0).reshape(-1),
                              torch.nanquantile(s, 0.6, 0, interpolation="midpoint"), s.nanquantile(0.5).reshape(1),
                              torch.quantile(s, 0.75, interpolation="nearest").reshape(1)])),
    Case("renorm_", [_T.renorm_], lambda s: (s * 1.0).renorm_(2, 0, 0.8) + (s * 2.0).renorm_(1, 1, 1.0)),
    Case("new_zeros", [_T.new_zeros, _T.new_empty, _T.sparse_dim, _T.dense_dim],
         lambda s: torch.tensor([s.new_zeros(2, 3).nnz, s.new_empty(3).numel(), s.sparse_dim(), s.dense_dim()]),
         bool_result=True, oracle=lambda d: torch.tensor([0, 3, 2, 0])),
    Case("embedding_bag", [F.embedding_bag],
         lambda s: F.embedding_bag(torch.tensor([[0, 3], [2, 2]]), s, mode="sum")
         + F.embedding_bag(torch.tensor([1, 0, 3]), s, torch.tensor([0, 1]), mode="mean")),
    Case("channel_dropout", [F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout],
         lambda s: F.dropout1d(s, 0.5, False) + F.dropout2d(s[None, None], 0.5, False)[0, 0]
         + F.dropout3d(s[None, None, None], 0.0)[0, 0, 0]
         + F.alpha_dropout(s, 0.5, False) + F.feature_alpha_dropout(s, 0.0, True)),
    # --- session 19 -------------------------------------------------------------------------------
    Case("windows", [_T.unfold, torch.cartesian_prod],
         lambda s: torch.cat([s.unfold(1, 3, 1).sum((1, 2)), s.unfold(0, 2, 2).sum((0, 2)),
                              torch.cartesian_prod(s[0], s[1]).sum(0), torch.cartesian_prod(s[2]).reshape(-1)])),
    Case("slices", [torch.renorm, _T.renorm, torch.cross, _T.cross, torch.linalg.cross],
         lambda s, x: torch.renorm(s, 2, 0, 0.8) + s.renorm(1, 1, 1.0)
         + F.pad(torch.linalg.cross(s[:, :3], x[:, :3]) + torch.cross(x[:, 1:4], s[:, 2:], dim=1)
                 + s[:, :3].cross(s[:, 2:], 1), (0, 2)), [SHAPE]),
    Case("mode", [torch.mode, _T.mode], lambda s: torch.mode(s, 1).values + s.mode(0).values.sum()),
    Case("masked_scatter", [torch.masked_scatter, _T.masked_scatter],
         lambda s, x: torch.masked_scatter(s, x > 0.2, x.flatten()) + s.masked_scatter(s < 0, -x.flatten()), [SHAPE]),
    Case("more_factorizations", [torch.linalg.solve_ex, torch.linalg.inv_ex, torch.linalg.cholesky_ex,
                                 torch.linalg.lu, torch.linalg.lu_factor, torch.linalg.lu_factor_ex,
                                 torch.linalg.lu_solve, torch.linalg.ldl_factor, torch.linalg.ldl_factor_ex,
                                 torch.linalg.ldl_solve, torch.linalg.solve_triangular,
                                 torch.linalg.householder_product, torch.linalg.tensorsolve, torch.linalg.tensorinv,
                                 torch.lu, _T.lu, torch.lu_solve, _T.lu_solve, torch.lu_unpack, torch.geqrf, _T.geqrf,
                                 torch.ormqr, _T.ormqr, torch.triangular_solve, _T.triangular_solve,
                                 torch.cholesky_solve, _T.cholesky_solve, torch.cholesky_inverse, _T.cholesky_inverse],
         lambda s: _more_factorized(s)),
    Case("dense_results", [torch.cummax, _T.cummax, torch.cummin, _T.cummin, torch.cumulative_trapezoid,
                           *(getattr(torch.fft, f) for f in _FFTS), torch.stft, _T.stft, torch.histogramdd,
                           torch.layer_norm, torch.native_layer_norm, torch.batch_norm, torch.native_batch_norm,
                           torch.group_norm, torch.native_group_norm, torch.instance_norm, torch.isreal, _T.isreal,
                           F.ctc_loss, F.triplet_margin_with_distance_loss, F.multi_head_attention_forward],
         lambda s, x: _dense_results(s, x), [SHAPE]),
    # special functions (sparse_ops/special_functions.py): f(0) == 0 on the values, else dense by
    # nature; -0.0 in the dense oracle flips some poles' signs, so positive values there
    Case("special_keeping_zero", [torch.angle, _T.angle, torch.special.bessel_j1, torch.special.i1,
                                  torch.special.i1e, torch.special.modified_bessel_i1, torch.special.entr,
                                  torch.special.round, torch.frexp, _T.frexp],
         lambda s: torch.angle(s) + s.angle() + torch.special.bessel_j1(s) + torch.special.i1(s)
         + torch.special.i1e(s) + torch.special.modified_bessel_i1(s) + torch.special.entr(s)
         + torch.special.round(s) + torch.frexp(s).mantissa + s.frexp()[0], positive=True),
    Case("special_dense_by_nature", [torch.special.airy_ai, torch.special.bessel_j0, torch.special.erfcx,
                                     torch.special.i0e, torch.special.log_ndtr, torch.special.modified_bessel_i0,
                                     torch.special.ndtr, torch.special.spherical_bessel_j0, torch.special.i0,
                                     torch.special.expit, torch.special.exp2, torch.special.sinc,
                                     torch.special.erfc, torch.lgamma, _T.lgamma, torch.special.gammaln,
                                     torch.mvlgamma, _T.mvlgamma, torch.special.multigammaln],
         lambda s: torch.special.airy_ai(s) + torch.special.bessel_j0(s) + torch.special.erfcx(s)
         + torch.special.i0e(s) + torch.special.log_ndtr(s) + torch.special.modified_bessel_i0(s)
         + torch.special.ndtr(s) + torch.special.spherical_bessel_j0(s) + torch.special.i0(s)
         + torch.special.expit(s) + torch.special.exp2(s) + torch.special.sinc(s) + torch.special.erfc(s)
         + torch.nan_to_num(torch.lgamma(s) + s.lgamma() + torch.special.gammaln(s), posinf=0.0)
         + torch.nan_to_num(torch.mvlgamma(s + 0.0, 1) + s.mvlgamma(1) + torch.special.multigammaln(s, 1), posinf=0.0),
         positive=True),
    Case("special_poles", [torch.digamma, _T.digamma, torch.special.digamma, torch.special.psi,
                           torch.polygamma, _T.polygamma, torch.special.polygamma, torch.special.bessel_y0,
                           torch.special.bessel_y1, torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
                           torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
                           torch.special.ndtri, torch.acosh, _T.acosh, torch.arccosh, _T.arccosh, torch.special.zeta],
         lambda s: torch.nan_to_num(
             torch.digamma(s) + s.digamma() + torch.special.digamma(s) + torch.special.psi(s)
             + torch.polygamma(1, s) + s.polygamma(2) + torch.special.polygamma(1, s)
             + torch.special.ndtri(s * 0.5) + torch.acosh(s * 2.0) + s.mul(2.0).acosh() + torch.arccosh(s * 2.0)
             + (s * 2.0).arccosh(), posinf=0.0, neginf=0.0, nan=0.0)
         + torch.nan_to_num(torch.stack([
             torch.special.bessel_y0(s), torch.special.bessel_y1(s), torch.special.modified_bessel_k0(s),
             torch.special.modified_bessel_k1(s), torch.special.scaled_modified_bessel_k0(s),
             torch.special.scaled_modified_bessel_k1(s), torch.special.zeta(s * 3.0, 2.0)]).sum(0),
             posinf=0.0, neginf=0.0, nan=0.0).detach(),       # torch has no derivative of these
         positive=True),
    Case("special_binary", [torch.special.xlog1py, torch.ldexp, _T.ldexp, torch.nextafter, _T.nextafter,
                            torch.igamma, _T.igamma, torch.special.gammainc, torch.igammac, _T.igammac,
                            torch.special.gammaincc],
         lambda s, x: torch.special.xlog1py(s, x) + torch.ldexp(s, x.round()) + s.ldexp(x.round())
         + (torch.nextafter(s, x) + s.nextafter(x) + torch.igamma(s, x) + s.igamma(x)
            + torch.special.gammainc(s, x) + torch.igammac(s, x) + s.igammac(x)
            + torch.special.gammaincc(s, x)).detach(), [SHAPE], positive=True, extra={"partner_positive": True}),
    Case("special_polynomials", [getattr(torch.special, f"{k}_polynomial_{p}") for k, ps in (
             ("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ("h", "he")),
             ("laguerre", "l"), ("legendre", "p")) for p in ps],
         lambda s: sum(getattr(torch.special, f"{k}_polynomial_{p}")(s, n) for k, ps in (
             ("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ("h", "he")),
             ("laguerre", "l"), ("legendre", "p")) for p in ps for n in (2, 3)).detach()),
    # other names of sparse ops (sparse_ops/variants.py)
    Case("copies", list(_COPY_FUNCTIONS), lambda s: _copies(s)),
    Case("flips", [torch.fliplr, _T.fliplr, torch.flipud, _T.flipud, torch.rot90, _T.rot90, torch.fft.fftshift,
                   torch.fft.ifftshift, torch.linalg.diagonal],
         lambda s: torch.fliplr(s) + s.fliplr() + torch.flipud(s) + s.flipud() + torch.rot90(s, 2)
         + s.rot90(1, (1, 0)).rot90(1, (0, 1)) + torch.fft.fftshift(s) + torch.fft.ifftshift(s, 0)
         + F.pad(torch.linalg.diagonal(s)[:, None], (0, 4), value=0.0)),
    Case("shuffles", [F.pixel_shuffle, torch.pixel_shuffle, F.pixel_unshuffle, torch.pixel_unshuffle,
                      F.channel_shuffle, torch.channel_shuffle, torch.native_channel_shuffle],
         lambda s: torch.cat([F.pixel_shuffle(s.reshape(1, 4, 5, 1), 2).flatten(),
                              torch.pixel_shuffle(s.reshape(4, 1, 5), 2).flatten(),
                              F.pixel_unshuffle(s.reshape(1, 4, 5)[:, :, :4], 2).flatten(),
                              torch.pixel_unshuffle(s.reshape(1, 1, 4, 5)[..., :4], 2).flatten(),
                              F.channel_shuffle(s.reshape(1, 4, 5), 2).flatten(),
                              torch.channel_shuffle(s.reshape(2, 2, 5), 2).flatten(),
                              torch.native_channel_shuffle(s.reshape(1, 4, 5), 4).flatten().detach()])),  # no derivative in torch
    Case("product_forms", [torch.linalg.vecdot, torch.addr, _T.addr, torch.addbmm, _T.addbmm, F.bilinear],
         lambda s, x: torch.linalg.vecdot(s, x) + torch.addr(x, s[0], s[1, :4] if False else s[:, 0], beta=0.5).sum(1)[:4]
         if False else torch.cat([torch.linalg.vecdot(s, x), s.linalg_vecdot(x) if False else torch.linalg.vecdot(x, s, dim=0),
                                  torch.addr(x[:, :4], s[:, 0], s[0, :4], beta=0.5, alpha=2.0).flatten(),
                                  s[:, :4].addr(x[0, :4], x[:, 1]).flatten(),
                                  torch.addbmm(x[:, :4], s[None, :, :3].expand(2, 4, 3), x[None, :3, :4].expand(2, 3, 4)).flatten(),
                                  s.addbmm(x[None, :, :3].expand(2, 4, 3), s[None, :3, :].expand(2, 3, 5)).flatten(),
                                  F.bilinear(s, x, torch.ones(2, 5, 5, dtype=F64)).flatten()]), [SHAPE]),
    Case("statistics", [torch.cov, _T.cov, torch.corrcoef, _T.corrcoef, torch.trapezoid, torch.trapz],
         lambda s, x: torch.cat([torch.cov(s).flatten(), s.cov(correction=0, aweights=x[0, :5].abs()).flatten(),
                                 torch.nan_to_num(torch.corrcoef(s)).flatten().detach(),   # NaN rows' gradients
                                 torch.nan_to_num(s.corrcoef()).flatten().detach(),
                                 torch.trapezoid(s),
                                 torch.trapezoid(s, x[0]), torch.trapz(s, dx=0.5, dim=0), torch.trapz(s, x, dim=1)]),
         [SHAPE], positive=True),
    Case("rms_norm", [F.rms_norm], lambda s, x: F.rms_norm(s, (5,), x[0]) + F.rms_norm(s, (4, 5), eps=1e-3), [SHAPE]),
    Case("repeats", [torch.repeat_interleave, _T.repeat_interleave, torch.combinations],
         lambda s: torch.cat([torch.repeat_interleave(s, 2, 0).sum(0), s.repeat_interleave(torch.tensor([1, 0, 3, 1, 2]), 1).sum(1),
                              torch.repeat_interleave(s, 2).reshape(4, 10).sum(1),
                              torch.combinations(s[0], 2).sum(0), torch.combinations(s[1], 3, True).sum(0)])),
    Case("region_writes", [torch.select_scatter, torch.slice_scatter, torch.diagonal_scatter, torch.index_copy,
                           _T.index_copy, torch.put, _T.put, torch.constant_pad_nd, torch.fill],
         lambda s, x: torch.select_scatter(s, x[0], 0, 2) + torch.slice_scatter(s, x[:, :2], 1, 1, 5, 2)
         + torch.diagonal_scatter(s, x[0, :4], 0) + torch.index_copy(s, 0, torch.tensor([3, 0]), x[:2])
         + s.index_copy(1, torch.tensor([4]), x[:, :1]) + torch.put(s, torch.tensor([0, 7, -1]), x[0, :3])
         + s.put(torch.tensor([5, 5]), x[1, :2], accumulate=True)
         + torch.constant_pad_nd(s, (0, 1), 2.0)[:, :5] + torch.constant_pad_nd(s, (1, 0))[:, 1:]
         + torch.fill(s, 0.0) + torch.fill(s, 2.5), [SHAPE]),
    Case("isin", [torch.isin], lambda s: torch.cat([torch.isin(s, torch.tensor([0.0, 1.0], dtype=F64)).flatten(),
                                                    torch.isin(s, s[0]).flatten()]).double(),
         bool_result=True),
    Case("dense_by_nature_more", [_T.__rmod__, torch.complex, torch.polar, torch.view_as_complex, torch.vander,
                                  torch.linalg.vander, F.scaled_dot_product_attention,
                                  *((F.linear_cross_entropy,) if hasattr(F, "linear_cross_entropy") else ())],
         lambda s, x: _sum_of(torch.complex(s, x), torch.polar(s, x), torch.view_as_complex(s.reshape(10, 2)),
                              # torch's own vander backward fails (its in-place cumprod): forward only
                              torch.vander(s[0], 3).detach(), torch.vander(s[2], increasing=True).detach(),
                              torch.linalg.vander(s[1], N=3),
                              F.scaled_dot_product_attention(s[None], x[None], x[None]),
                              *((F.linear_cross_entropy(s, x[:3], torch.tensor([0, 1, 2, 0])),)
                                if hasattr(F, "linear_cross_entropy") else ()),
                              torch.nan_to_num(2.0 % s).detach()), [SHAPE]),
    Case("conv_pool", [F.conv1d, F.conv2d, F.conv3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.max_pool1d,
                     F.max_pool2d, F.max_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
                     F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d, F.interpolate],
         lambda s, x: _sum_of(F.conv1d(s[None], x[:, :4, None] * 0.1, stride=1, padding=1),
                              F.conv2d(s[None, None], x[None, None, :2, :2]), F.conv3d(s[None, None, None], x[None, None, None, :1, :2]),
                              F.avg_pool1d(s[None], 2), F.avg_pool2d(s[None], 2, 1, 1), F.avg_pool3d(s[None, None], (1, 2, 2)),
                              F.max_pool1d(s[None], 2), F.max_pool2d(s[None], 2), F.max_pool3d(s[None, None], (1, 2, 1)),
                              F.adaptive_avg_pool1d(s[None], 5), F.adaptive_avg_pool2d(s[None], (2, 5)),
                              F.adaptive_avg_pool3d(s[None, None], (1, 4, 1)), F.adaptive_max_pool1d(s[None], 1),
                              F.adaptive_max_pool2d(s[None], (2, 1)), F.adaptive_max_pool3d(s[None, None], 1),
                              F.interpolate(s[None], scale_factor=2) * x[None, :, :1],
                              F.interpolate(s[None, None], size=(8, 5))), [SHAPE]),
    Case("conv_transpose_and_padded_pools",
         [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d],
         lambda s, x: _sum_of(F.conv_transpose1d(s[None], x[:, :4, None] * 0.1, None, 2, 1, 1),
                              F.conv_transpose2d(s[None, None], x[None, None, :2, :2], stride=(1, 2), padding=1),
                              F.conv_transpose3d(s[None, None, None], x[None, None, None, :1, :2], dilation=2),
                              F.max_pool1d(s[None], 3, 2, 1, ceil_mode=True),
                              F.avg_pool2d(s[None], 3, 2, 1, ceil_mode=True, count_include_pad=False)), [SHAPE]),
    Case("pool_indices", [F.max_pool1d_with_indices, F.max_pool2d_with_indices, F.max_pool3d_with_indices,
                          F.adaptive_max_pool1d_with_indices, F.adaptive_max_pool2d_with_indices,
                          F.adaptive_max_pool3d_with_indices, F.max_unpool1d, F.max_unpool2d, F.max_unpool3d],
         lambda s: _sum_of(F.max_unpool1d(*F.max_pool1d(s[None], 2, return_indices=True), 2, output_size=(5,)),
                           F.max_unpool2d(*F.max_pool2d(s[None], 2, 1, return_indices=True), 2, 1),
                           F.max_unpool3d(*F.max_pool3d(s[None, None], (1, 2, 2), return_indices=True), (1, 2, 2)),
                           F.adaptive_max_pool1d(s[None], 3, return_indices=True)[0],
                           F.adaptive_max_pool2d(s[None], (3, 2), return_indices=True)[0],
                           F.adaptive_max_pool3d(s[None, None], (1, 3, 2), return_indices=True)[0])),
    Case("grid_sample", [F.grid_sample, torch.grid_sampler, torch.grid_sampler_2d, torch.grid_sampler_3d],
         lambda s, x: _sum_of(F.grid_sample(s[None, None], x[None, :, :4, None].expand(1, 4, 4, 2) * 0.9,
                                            align_corners=False),
                              torch.grid_sampler(s[None, None], x[None, :3, :4, None].expand(1, 3, 4, 2) - 0.5, 1, 1, True),
                              torch.grid_sampler_2d(s[None, None], x[None, :2, :2, None].expand(1, 2, 2, 2), 0, 2, False),
                              torch.grid_sampler_3d(s[None, None, None], x[None, None, :2, :3, None].expand(1, 1, 2, 3, 3) * 0.5,
                                                    0, 0, True)), [SHAPE]),
    Case("index_reduce", [torch.index_reduce, _T.index_reduce],
         lambda s, x: torch.index_reduce(s, 0, torch.tensor([3, 0, 3]), x[:3], "prod")
         + s.index_reduce(1, torch.tensor([4, 1]), x[:, :2], "amax", include_self=False)
         + s.index_reduce(0, torch.tensor([1]), x[:1], "mean"), [SHAPE]),
    Case("item", [_T.item], lambda s: torch.tensor(s[0:1, 0:1].item() + s[1:2, 2:3].item(), dtype=F64),
         bool_result=True),
    Case("embedding_bag_max", [F.embedding_bag],
         lambda s: F.embedding_bag(torch.tensor([[0, 3], [2, 2]]), s, mode="max")
         + F.embedding_bag(torch.tensor([1, 0, 3]), s, torch.tensor([0, 1]), mode="max")),
]

#: handlers registered for non-differentiable things whose rows above do not run them
_COVERED_ELSEWHERE = {torch.Tensor.share_memory_: "tests/test_serialization.py",
                      # the recurrent layers and cells: gradients against the dense module
                      **{getattr(torch, m + c): "tests/test_recurrent.py"
                         for m in ("lstm", "gru", "rnn_tanh", "rnn_relu") for c in ("", "_cell")},
                      # no single memory block / a bool answer: refused by name, or no tensor
                      # to differentiate
                      _T.__dlpack__: "tests/test_object_protocol.py",
                      _T.__dlpack_device__: "tests/test_object_protocol.py",
                      _T.storage: "tests/test_object_protocol.py",
                      _T._typed_storage: "tests/test_object_protocol.py",
                      _T.untyped_storage: "tests/test_object_protocol.py",
                      _T.data_ptr: "tests/test_object_protocol.py",
                      _T.apply_: "tests/test_object_protocol.py",
                      _T.__contains__: "tests/test_object_protocol.py",
                      _T.pin_memory: "tests/test_capture_and_devices.py",
                      # refusals naming what to call instead (no tensor to differentiate)
                      torch.Tensor.numpy: "tests/test_torch_semantics.py",
                      torch.Tensor.tolist: "tests/test_torch_semantics.py",
                      torch.Tensor.__array__: "tests/test_torch_semantics.py",
                      # torch's algorithms over scorch's products (their gradients are the
                      # products'); lobpcg refuses a sparse A that requires grad
                      torch.svd_lowrank: "tests/test_ops_matmul.py",
                      torch.pca_lowrank: "tests/test_ops_matmul.py",
                      torch.lobpcg: "tests/test_ops_matmul.py",
                      # ``t.data = v`` swaps contents outside autograd, as torch's set_data
                      torch.Tensor.data.__set__: "tests/test_torch_semantics.py",
                      # a hook or retain_grad after a use: refused (torch's own otherwise)
                      torch.Tensor.register_hook: "tests/test_autograd_advanced.py",
                      torch.Tensor.retain_grad: "tests/test_autograd_advanced.py",
                      # checks only (torch's own call then runs): a gradient w.r.t. a sparse
                      # intermediate read through its values, or a batched backward, refused
                      torch.autograd.grad: "tests/test_functorch_refusals.py",
                      torch.autograd.backward: "tests/test_functorch_refusals.py"}


def test_every_registered_function_is_covered():
    """A new handler must come with its autograd row (a backward, or a clear refusal)."""
    covered = set()
    for case in CASES:
        for fn in case.functions:
            covered.add(fn)
            if type(fn).__name__ == "getset_descriptor":   # .T, .mT: registered as __get__
                covered.add(fn.__get__)
    for fn in list(covered):     # Tensor.X and torch.X with one handler (mirror_method_forms)
        name = getattr(fn, "__name__", "")
        for other in (getattr(torch, name, None), getattr(torch.Tensor, name, None)):
            if other is not None and _dispatch._HANDLERS.get(other) is _dispatch._HANDLERS.get(fn):
                covered.add(other)
    missing = [f for f in _dispatch._HANDLERS if f not in covered and f not in _COVERED_ELSEWHERE]
    names = [getattr(f, "__qualname__", None) or repr(f) for f in missing]
    assert not missing, f"registered without an autograd row in {__file__}: {names}"


def _values(shape, positive, seed, density=0.5):
    g = torch.Generator().manual_seed(seed)
    v = torch.rand(shape, dtype=F64, generator=g) + 0.5
    if not positive:
        v = v * torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).to(F64)
    return v * (torch.rand(shape, generator=g) < density)


def _partners(case: Case, seed: int):
    out = []
    for k, s in enumerate(case.partner_shapes):
        x = _values(s, case.extra.get("partner_positive", False), seed + 10 + k, density=1.0)
        out.append(x)
    return out


def _loss(out, seed):
    out = _dense(out)
    if not out.dtype.is_floating_point:
        return None
    w = torch.rand(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed))
    return (out * w).sum()


def _stored(S) -> torch.Tensor:
    mask = torch.zeros(S.shape, dtype=torch.bool)
    if S.nnz:
        mask[tuple(S.indices())] = True
    return mask


def _run(case: Case, sparse_grad: bool, dense_grad: bool, seed: int = 0):
    d = _values(case.shape, case.positive, seed)
    xs = _partners(case, seed)
    S = scorch.sparse_tensor(d, format=case.fmt, requires_grad=sparse_grad)
    Xs = [x.clone().requires_grad_(dense_grad) for x in xs]
    D = d.clone().requires_grad_(sparse_grad)
    Xd = [x.clone().requires_grad_(dense_grad) for x in xs]
    out = case.call(S, *Xs)
    expect = (case.oracle or case.call)(D, *Xd)
    torch.testing.assert_close(_dense(out), _dense(expect))
    assert out.requires_grad == _dense(expect).requires_grad, "the result lost the graph"
    if not out.requires_grad:
        return
    loss, loss_d = _loss(out, seed), _loss(expect, seed)
    loss.backward()
    loss_d.backward()
    if sparse_grad:
        assert isinstance(S.grad, scorch.SparseTensor), f"{type(S.grad).__name__} gradient"
        assert S.grad.format == S.format and S.grad.dtype == S.dtype
        assert S.grad._storage.shares_pattern(S._storage) or torch.equal(S.grad.indices(), S.indices())
        want = torch.where(_stored(S), D.grad, torch.zeros((), dtype=F64))
        torch.testing.assert_close(S.grad.to_dense(), want)
    for a, b in zip(Xs, Xd):
        if dense_grad:
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad)


_DIFFERENTIABLE = [c for c in CASES if not c.bool_result]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sparse_input_requiring_grad(case):
    if case.raises is not None:
        exc, message = case.raises
        with pytest.raises(exc, match=message):
            _run(case, True, False)
        return
    _run(case, True, False)


_MIXED = [c for c in _DIFFERENTIABLE if c.partner_shapes]


@pytest.mark.parametrize("case", _MIXED, ids=[c.name for c in _MIXED])
def test_dense_input_requiring_grad_beside_a_sparse_one(case):
    _run(case, False, True)


@pytest.mark.parametrize("case", _MIXED, ids=[c.name for c in _MIXED])
def test_both_require_grad(case):
    _run(case, True, True, seed=1)


_DOUBLE = {
    "spmm": lambda s, x: s @ x.t(),
    "mul": lambda s, x: s * x * x,
    "where": lambda s, x: torch.where(x > 0.5, s * x, 0.0),
    "sigmoid": lambda s, x: torch.sigmoid(s) * x,
    "sum": lambda s, x: (s * x).sum(1) ** 2,
}


@pytest.mark.parametrize("name", sorted(_DOUBLE))
def test_double_backward(name):
    """gradgradcheck (float64) in the stored values and the dense operand, where torch has
    a double backward for the dense op."""
    d = _values(SHAPE, False, 3)
    S = scorch.sparse_tensor(d, format="csr")
    idx, v = S.indices(), S.values().detach().clone().requires_grad_()
    x = torch.rand(SHAPE, dtype=F64, generator=torch.Generator().manual_seed(4)).requires_grad_()

    def f(v, x):
        return _dense(_DOUBLE[name](scorch.sparse_tensor((idx, v), size=SHAPE, format="csr"), x))
    assert torch.autograd.gradgradcheck(f, (v, x), fast_mode=True)


def test_dropout_in_training_scales_the_kept_entries():
    """The gradient of a dropped-out sparse tensor is the mask / (1 - p) on its pattern."""
    d = _values(SHAPE, False, 5, density=0.8)
    S = scorch.sparse_tensor(d, format="coo", requires_grad=True)
    out = F.dropout(S, 0.5, training=True)
    out.to_dense().sum().backward()
    kept = out.values().detach() != 0
    assert S.grad._storage.shares_pattern(S._storage)
    torch.testing.assert_close(S.grad.values(), kept.to(F64) * 2.0)
