"""The matmul family on sparse operands: ``@``, ``mm``, ``mv``, ``bmm``, ``matmul``, ``addmm``,
each lowered to ONE ``scorch.einsum`` call (so each is one generated kernel and inherits
einsum's gradients); ``addmm`` adds one elementwise step. ``F.linear`` (a sparse layer, with
its own fused graph nodes) lives in ``sparse_linear``.

Result layouts follow torch: sparse @ dense and dense @ sparse give dense tensors, sparse @
sparse gives a sparse tensor (its format comes from format inference).
"""
from __future__ import annotations

import torch

from .._dispatch import register
from ..compiler_access import compiler
from .. import tensor_type
from ..gradients import pattern as _pattern
from ..gradients.values import from_values, values_of
from ..tensor_type import SparseTensor, is_sparse_operand
from . import elementwise
from .nonlinear import _stored_count
from . import einsum as _einsum_entry
from .gathered_columns import gathered_columns_product
from ..broadcasting import broadcast_shapes

__all__ = ["matmul", "mm", "mv", "bmm", "addmm", "hspmm"]

_BATCH_LETTERS = "abcdefgh"


def _shape(x) -> tuple:
    """The shape without a trip through ``__torch_function__`` (each attribute of a
    SparseTensor read through torch costs ~1.3 us; a warm SpMM is ~4 us)."""
    st = getattr(x, "_storage", None) if type(x) is not torch.Tensor else None
    return st.shape if st is not None else tuple(x.shape)


_any_autocast = torch._C._is_any_autocast_enabled


def _dtype(x) -> torch.dtype:
    st = getattr(x, "_storage", None) if type(x) is not torch.Tensor else None
    return st.values.dtype if st is not None else x.dtype


def _any_sparse(*xs) -> bool:
    return any(is_sparse_operand(x) for x in xs)


def _contract(equation: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One einsum. With one dense operand the result is dense, as torch gives (format
    inference alone would make e.g. CSC @ dense sparse: slower, and not torch's layout)."""
    if is_sparse_operand(a) != is_sparse_operand(b) and not equation.endswith("->"):
        return _einsum_entry.einsum(equation, a, b, out_format="dense")
    return _einsum_entry.einsum(equation, a, b)


def _check_dtypes(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    da, db = _dtype(a), _dtype(b)
    if da != db:
        raise RuntimeError(f"{name}: expected both operands to have the same dtype, but got "
                           f"{da} for the first and {db} for the second")


def _check_rank(name: str, what: str, x: torch.Tensor, rank: int) -> None:
    s = _shape(x)
    if len(s) != rank:
        raise RuntimeError(f"{name}: {what} must be a {rank}-D tensor, got {len(s)}-D of shape "
                           f"{s}")


def _check_inner(name: str, a: torch.Tensor, b: torch.Tensor, da: int, db: int) -> None:
    sa, sb = _shape(a), _shape(b)
    if sa[da] != sb[db]:
        raise RuntimeError(f"{name}: shapes {sa} and {sb} cannot be multiplied "
                           f"({sa[da]} != {sb[db]})")


def _checked(name: str, equation: str, a, b, names: tuple, ranks: tuple, inner: tuple):
    """``equation`` over ``a``, ``b`` after torch's checks of ranks, inner sizes, dtypes."""
    _check_rank(name, names[0], a, ranks[0])
    _check_rank(name, names[1], b, ranks[1])
    _check_inner(name, a, b, *inner)
    _check_dtypes(name, a, b)
    return _contract(equation, a, b)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.mm``: (m, k) @ (k, n)."""
    return _checked("mm", "ij,jk->ik", a, b, ("self", "mat2"), (2, 2), (1, 0))


def mv(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``torch.mv``: (m, k) @ (k,)."""
    return _checked("mv", "ij,j->i", a, v, ("self", "vec"), (2, 1), (1, 0))


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm``: (B, m, k) @ (B, k, n), no broadcasting (as torch)."""
    _check_rank("bmm", "batch1", a, 3)
    _check_rank("bmm", "batch2", b, 3)
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"bmm: batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    _check_inner("bmm", a, b, 2, 1)
    _check_dtypes("bmm", a, b)
    return _contract("bij,bjk->bik", a, b)


def _batch_equation(a: torch.Tensor, b: torch.Tensor) -> str:
    """torch.matmul's rules as one einsum: 1-D operands are promoted (and the promoted
    dimension dropped again), batch dimensions broadcast from the right."""
    sa_, sb_ = _shape(a), _shape(b)
    ra, rb = len(sa_), len(sb_)
    nb = max(ra - 2 if ra >= 2 else 0, rb - 2 if rb >= 2 else 0)
    if nb > len(_BATCH_LETTERS):
        raise RuntimeError(f"matmul: at most {len(_BATCH_LETTERS)} batch dimensions are supported")
    batch = _BATCH_LETTERS[:nb]
    sa = batch[nb - (ra - 2):] + "ij" if ra >= 2 else "j"
    sb = batch[nb - (rb - 2):] + "jk" if rb >= 2 else "j"
    out = batch + ("i" if ra >= 2 else "") + ("k" if rb >= 2 else "")
    # broadcast batch dimensions: a sparse operand cannot stretch a size-1 dimension
    for n in range(nb):
        da = ra - 2 - (nb - n)
        db = rb - 2 - (nb - n)
        xa = sa_[da] if ra >= 2 and da >= 0 else None
        xb = sb_[db] if rb >= 2 and db >= 0 else None
        if xa is not None and xb is not None and xa != xb and 1 not in (xa, xb):
            raise RuntimeError(f"matmul: batch dimensions of {sa_} and {sb_} do not broadcast")
    return f"{sa},{sb}->{out}"


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul`` / ``@`` with torch's rank rules (1-D dot, 1-D promotion, batches)."""
    ra, rb = len(_shape(a)), len(_shape(b))
    if ra == 0 or rb == 0:
        raise RuntimeError(f"matmul: both arguments need at least 1 dimension, got "
                           f"{ra}D and {rb}D")
    _check_inner("matmul", a, b, -1, -2 if rb >= 2 else 0)
    _check_dtypes("matmul", a, b)
    if ra == 2 and rb == 2:
        return _contract("ij,jk->ik", a, b)
    return _contract(_batch_equation(a, b), a, b)


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1,
          alpha=1) -> torch.Tensor:
    """``beta * input + alpha * (mat1 @ mat2)``: one einsum for the product (alpha folded in
    as a scalar operand), one elementwise kernel for the sum."""
    _check_rank("addmm", "mat1", mat1, 2)
    _check_rank("addmm", "mat2", mat2, 2)
    _check_inner("addmm", mat1, mat2, 1, 0)
    _check_dtypes("addmm", mat1, mat2)
    return _scaled_sum(input, mm(mat1, mat2), beta, alpha)


def _scaled_sum(input, product, beta, alpha, ignored_at_zero: bool = True):
    """``beta * input + alpha * product`` (addmm, addmv, baddbmm): torch ignores ``input``
    (even NaN) when beta is 0, but broadcasts its shape; ``sspaddmm`` does not
    (``ignored_at_zero=False``: a NaN in ``input`` stays NaN, as torch's)."""
    prod = product if alpha == 1 else elementwise.mul(product, alpha)
    if beta == 0 and ignored_at_zero:
        broadcast_shapes(_shape(input), _shape(prod))
        return prod
    return elementwise.add(input if beta == 1 else elementwise.mul(input, beta), prod)


# --- registration --------------------------------------------------------------------------

def _sparse_only(fn):
    """torch's own kernels run when no operand is sparse."""
    def handler(*args, **kwargs):
        if not _any_sparse(*args, *kwargs.values()):
            return NotImplemented
        return fn(*args, **kwargs)
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


def autocast_aware(fn):
    """For a product on torch's CPU autocast list (``mm``, ``bmm``, ``matmul``, ``addmm``,
    ``baddbmm``, ``linear``; not ``mv`` / ``addmv``): torch's CPU autocast
    (``torch.autocast("cpu", torch.bfloat16)``) casts its float operands to the lower
    precision below scorch's handlers, where it cannot reach them: a bf16 activation times a
    float32 sparse matrix then raised on the dtypes. Inside an autocast block these products
    compute in float32 (the kernels have no bf16 path) and return autocast's dtype, as dense
    torch's do. Outside one, one C call (~0.1 us)."""
    def handler(*args, **kwargs):
        if not _any_autocast():
            return fn(*args, **kwargs)
        return _einsum_entry.autocast_product(fn, *args, **kwargs)
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


def _no_out(name, kwargs):
    if kwargs.get("out") is not None:
        raise RuntimeError(f"{name}: out= is not supported with sparse operands")
    kwargs.pop("out", None)


#: (sparse format, rank of the dense operand) -> out_format for sparse @ dense: None where
#: format inference already gives a dense result (then einsum takes its warm C path, ~1 us
#: faster; for SpMV through the Python path ~10 us), else "dense"
_SPMM_OUT: dict = {}
#: the last format and rank looked up and the answer: an identity check instead of hashing a
#: Format (~0.4 us) when the same matrix is multiplied again
_last_spmm = [None, 0, None]
#: the einsum of sparse matrix @ dense operand of rank 1 (SpMV) and 2 (SpMM)
_SPARSE_DENSE = {1: "ij,j->i", 2: "ij,jk->ik"}


def _spmm_out_format(a: SparseTensor, b: torch.Tensor, equation: str):
    key = (a._storage.format, b.ndim)
    if key not in _SPMM_OUT:
        plan = _einsum_entry.explain(equation, a, b)
        _SPMM_OUT[key] = None if plan.output_format.is_dense else "dense"
    _last_spmm[:] = [key[0], key[1], _SPMM_OUT[key]]
    return _SPMM_OUT[key]


_PROFILER = torch.autograd.profiler
_STRIDED = torch.strided

def _sparse_dense(a, b, nd: int = 2):
    """The hot path of sparse matrix @ dense operand of rank ``nd`` (2: SpMM for ``A @ X``,
    ``A.mm(X)``; 1: SpMV for ``A @ x``, ``A.mv(x)``; ``SparseTensor.__matmul__`` calls it
    straight), written out flat (each helper call costs ~0.1 us and a warm small SpMM or
    SpMV is a few us): the einsum with the output format that keeps its warm C call; None
    where another path must decide (and check), as inside an autocast block
    (``autocast_aware``). ``b`` must be strided: torch's sparse layouts are plain
    ``torch.Tensor`` too, and a product with one is sparse @ sparse (``matmul``), never
    this path (its dense result, or an error on the strides, and a wrong ``_SPMM_OUT``
    entry for every later call)."""
    if type(a) is SparseTensor and type(b) is torch.Tensor and b.layout is _STRIDED \
            and not _any_autocast() \
            and not _PROFILER._is_profiler_enabled:   # (profiled: einsum names the kernel)
        st = a._storage
        if st.format is _last_spmm[0] and nd == _last_spmm[1] and _last_spmm[2] is None \
                and not (_grad_enabled() and _any_requires_grad(a, b)):
            # the same format as the last call, whose product is dense: straight to the
            # warm C call, which checks the shapes, dtypes and strides itself (and declines
            # where they differ from its plan's; the checks below then run)
            dispatch = _warm_dispatch[0]
            if dispatch is not None:
                result = dispatch(_warm_dispatch[1], _SPARSE_DENSE[nd], (a, b))
                if result is not NotImplemented:
                    return result
        shape = st.shape
        if len(shape) == 2 and b.ndim == nd and shape[1] == b.shape[0] \
                and st.values.dtype == b.dtype:
            equation = _SPARSE_DENSE[nd]
            of = (_last_spmm[2] if st.format is _last_spmm[0] and nd == _last_spmm[1]
                  else _spmm_out_format(a, b, equation))
            if of is None and not (_grad_enabled() and _any_requires_grad(a, b)):
                # einsum's warm C call itself (what scorch.einsum would try first)
                dispatch = _warm_dispatch[0]
                if dispatch is None:   # loaded by the compiler's first einsum
                    compiler = _einsum_entry._compiler()
                    dispatch = _warm_dispatch[0] = compiler._DISPATCH[0]
                    _warm_dispatch[1] = compiler._fast
                if dispatch is not None:
                    result = dispatch(_warm_dispatch[1], equation, (a, b))
                    if result is not NotImplemented:
                        return result
            if of is None and nd == 2 and b.stride(0) == 1 and b.stride(1) != 1 and b.shape[1] > 1:
                # ``X @ W.t()`` (W out x in): F.linear's copy of only the rows X reaches
                result = gathered_columns_product(a, b.t())
                if result is not None:
                    return result
            return _einsum_entry.einsum(equation, a, b, out_format=of)
    return None


_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_warm_dispatch: list = [None, None]   # the compiler's C warm call and its plan table, once loaded
tensor_type._SPMM[0] = _sparse_dense


@register(torch.matmul, torch.linalg.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
@autocast_aware
def _matmul(a, b, *, out=None):
    if out is None:
        result = _sparse_dense(a, b, 1 if type(b) is torch.Tensor and b.ndim == 1 else 2)
        if result is not None:
            return result
    if not (is_sparse_operand(a) or is_sparse_operand(b)):
        return NotImplemented
    if out is not None:
        _no_out("matmul", {"out": out})
    return matmul(a, b)


@register(torch.Tensor.__rmatmul__)
@autocast_aware
@_sparse_only
def _rmatmul(a, b):
    return matmul(b, a)


@register(torch.mm, torch.Tensor.mm)
@autocast_aware
def _mm(a, b, **kwargs):
    if not kwargs:
        result = _sparse_dense(a, b, 2)
        if result is not None:
            return result
    if not _any_sparse(a, b):
        return NotImplemented
    _no_out("mm", kwargs)
    return mm(a, b)


@register(torch.sparse.mm)
@autocast_aware
@_sparse_only
def _sparse_mm(a, b, reduce=None):
    """``torch.sparse.mm`` (GCN code calls it): ``mm``; ``reduce="mean"`` / ``"amax"`` /
    ``"amin"`` (GraphSAGE's aggregations) over each row's stored entries only, as torch's
    CSR kernel: a row with none gives 0."""
    if reduce in (None, "sum"):
        return mm(a, b)
    if reduce not in ("mean", "amax", "amin"):
        raise RuntimeError(f"torch.sparse.mm: reduce argument must be one of sum, mean, amax, "
                           f"amin, got {reduce}")
    if not (isinstance(a, SparseTensor) and a.dim() == 2 and isinstance(b, torch.Tensor)
            and not is_sparse_operand(b) and b.dim() == 2):
        return NotImplemented
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"torch.sparse.mm: mat1 and mat2 shapes cannot be multiplied "
                           f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})")
    counts = _stored_count(a, (1,), a.shape[1])   # per row, O(rows) for CSR
    if reduce == "mean":      # differentiable: the product's rows over their entry counts
        return mm(a, b) / counts.clamp(min=1).to(b.dtype)[:, None]
    if torch.is_grad_enabled() and torch._C._any_requires_grad(a, b):
        raise NotImplementedError(f"torch.sparse.mm(reduce={reduce!r}) of scorch tensors has "
                                  f"no backward yet; use reduce='sum' or 'mean', or torch.no_grad()")
    tc = compiler()

    def build():
        return tc.Assignment("ik", tc.Access(0, "ij") * tc.Access(1, "jk"),
                             "max" if reduce == "amax" else "min")
    out = tc.compute(tc.kept_assignment(("mm_reduce", reduce), build), a, b.to(a.dtype),
                     out_format="dense")
    return out.masked_fill_((counts == 0)[:, None], 0)   # no entries: -inf / +inf there


@register(torch.mv, torch.Tensor.mv)
@_sparse_only
def _mv(a, v, **kwargs):
    if not kwargs:
        result = _sparse_dense(a, v, 1)
        if result is not None:
            return result
    _no_out("mv", kwargs)
    return mv(a, v)


@register(torch.bmm, torch.Tensor.bmm)
@autocast_aware
@_sparse_only
def _bmm(a, b, **kwargs):
    _no_out("bmm", kwargs)
    return bmm(a, b)


@register(torch.addmm, torch.Tensor.addmm, torch.sparse.addmm)
@autocast_aware
@_sparse_only
def _addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    _no_out("addmm", {"out": out})
    return addmm(input, mat1, mat2, beta=beta, alpha=alpha)


@register(torch.addmv, torch.Tensor.addmv)
@_sparse_only
def _addmv(input, mat, vec, *, beta=1, alpha=1, out=None):
    _no_out("addmv", {"out": out})
    return _scaled_sum(input, mv(mat, vec), beta, alpha)


@register(torch.baddbmm, torch.Tensor.baddbmm)
@autocast_aware
@_sparse_only
def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    _no_out("baddbmm", {"out": out})
    return _scaled_sum(input, bmm(batch1, batch2), beta, alpha)


def hspmm(mat1: SparseTensor, mat2: torch.Tensor, out_format="cd") -> SparseTensor:
    """``torch.hspmm`` / ``torch.smm``: sparse @ dense as a sparse result holding the rows of
    ``mat1`` with stored entries, each a dense row (format ``"cd"``, torch's hybrid COO with
    one sparse dimension): one einsum, differentiable as einsum is."""
    _check_rank("hspmm", "mat1", mat1, 2)
    _check_rank("hspmm", "mat2", mat2, 2)
    _check_inner("hspmm", mat1, mat2, 1, 0)
    return _einsum_entry.einsum("ik,kj->ij", mat1, mat2, out_format=out_format)


@register(torch.hspmm, torch.smm, torch.Tensor.smm)
def _hspmm(mat1, mat2, *, out=None):
    mat1 = tensor_type.as_scorch(mat1)
    if not isinstance(mat1, SparseTensor) or is_sparse_operand(mat2) or out is not None:
        return NotImplemented
    return hspmm(mat1, mat2)


@register(torch.sspaddmm, torch.Tensor.sspaddmm)
def _sspaddmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """``beta * input + alpha * (mat1 @ mat2)``, all sparse but ``mat2`` (torch's sspaddmm)."""
    input, mat1 = tensor_type.as_scorch(input), tensor_type.as_scorch(mat1)
    if (not isinstance(input, SparseTensor) or not isinstance(mat1, SparseTensor)
            or is_sparse_operand(mat2) or out is not None):
        return NotImplemented
    # the product in input's format: the sum is then the union of two patterns of one
    # format (with "cd" the dense rows would make the sum dense)
    return _scaled_sum(input, hspmm(mat1, mat2, input._storage.format), beta, alpha,
                       ignored_at_zero=False)


def sampled_addmm(input: SparseTensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1,
                  alpha=1) -> SparseTensor:
    """torch.sparse.sampled_addmm: ``alpha * (mat1 @ mat2)`` at ``input``'s stored entries plus
    ``beta * input``: ONE SDDMM einsum on the pattern (``"ij,ik,kj->ij"`` with the pattern's
    ones), never the dense product. The result keeps ``input``'s pattern."""
    _check_rank("sampled_addmm", "input", input, 2)
    _check_rank("sampled_addmm", "mat1", mat1, 2)
    _check_rank("sampled_addmm", "mat2", mat2, 2)
    _check_inner("sampled_addmm", mat1, mat2, 1, 0)
    if (mat1.shape[0], mat2.shape[1]) != tuple(input.shape):
        raise RuntimeError(f"sampled_addmm: input of shape {tuple(input.shape)} does not match the "
                           f"product's shape {(mat1.shape[0], mat2.shape[1])}")
    P = input._storage
    ones = SparseTensor(_pattern.pattern_ones(P, torch.promote_types(mat1.dtype, mat2.dtype)))
    prod = _einsum_entry.einsum("ij,ik,kj->ij", ones, mat1, mat2)
    vals = values_of(prod)
    if not prod._storage.shares_pattern(P):
        vals = _pattern.values_on_pattern(P, prod._storage, vals)
    out = vals * alpha if alpha != 1 else vals
    # (beta 0 included: torch's sampled_addmm keeps a NaN of input, unlike addmm)
    out = out + beta * values_of(input).to(out.dtype)
    return from_values(input._storage, out)


@register(torch.sparse.sampled_addmm)
def _sampled_addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    input = tensor_type.as_scorch(input)
    if not isinstance(input, SparseTensor) or out is not None:
        return NotImplemented
    return sampled_addmm(input, tensor_type.as_scorch(mat1), tensor_type.as_scorch(mat2), beta=beta,
                         alpha=alpha)
