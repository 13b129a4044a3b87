"""The gradient of ``C = einsum(eq, *operands)`` with respect to each operand, as another
einsum of ``grad_C`` with the other operands, which the same compiler runs.

For operand ``n`` indexed by ``idx_n`` the gradient is ``sum grad_C(out) * prod_{m != n}
op_m(idx_m)`` over every variable not in ``idx_n``. Around that product:

* a dense operand's gradient is dense: the einsum produces the variables of ``idx_n`` that
  occur elsewhere; variables only ``idx_n`` has (summed in the forward) are broadcast back,
  broadcast size-1 dimensions are summed out (their variable is not produced), and a
  repeated variable (a diagonal, ``"ii->i"``) is written into the diagonal of zeros;
* a sparse operand's gradient lives on its pattern: the pattern (all-one values) is one
  more factor over ``idx_n``, so the kernel evaluates the product only at stored entries
  (for ``A @ X`` an SDDMM) and the output shares the operand's level arrays. A repeated
  subscript (``"ii->i"``) takes the pattern's diagonal entries (a filter over the stored
  coordinates) as the factor over the distinct subscripts; the other entries get 0.

``GradientPlan`` holds the equation algebra (pure, cached per equation and shapes);
``operand_gradient`` runs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..compiler_access import compiler as _compiler
from ..level_storage import Storage
from ..tensor_compiler.index_notation import parse_einsum
from ..tensor_type import SparseTensor
from . import pattern as _pattern
from .values import from_values, grad_values, values_of

__all__ = ["GradientPlan", "gradient_plan", "operand_gradient", "dense_to_pattern"]

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class GradientPlan:
    """How to get operand ``n``'s gradient. Terms are einsum subscripts (letters).

    ``grad_term`` indexes grad_C, ``other_terms`` the other operands (in ``others`` order);
    a sparse operand adds ``pattern_term`` (its own subscripts, broadcast dims renamed) as
    the first factor and produces it. A dense operand produces ``result_term`` and
    ``result_vars``, then ``dims`` says, per dimension, the produced variable it takes, or
    None (broadcast size 1 or a variable the einsum does not produce: expanded)."""
    n: int
    sparse: bool
    grad_term: str
    others: Tuple[int, ...]
    other_terms: Tuple[str, ...]
    pattern_term: str
    result_term: str
    dims: Tuple[Optional[str], ...]   # per dimension of the operand: its letter (None: size 1)
    repeated: bool                    # a letter repeats in the operand (diagonal)

    def equation(self, with_pattern: bool = True) -> str:
        terms = ([self.pattern_term] if self.sparse and with_pattern else []) + \
            [self.grad_term] + list(self.other_terms)
        return ",".join(terms) + "->" + (self.pattern_term if self.sparse else self.result_term)


@lru_cache(maxsize=4096)
def gradient_plan(equation: str, shapes: Tuple[Tuple[int, ...], ...], n: int,
                  sparse: bool) -> GradientPlan:
    """The gradient einsum of operand ``n`` of ``equation`` for operands of ``shapes``."""
    spec = parse_einsum(equation, shapes)
    out = spec.assignment.output
    op_idx = spec.operand_indices
    names: Dict[str, str] = {}
    used = {v for idx in op_idx for v in idx if not v.startswith("_")}
    free = [c for c in _LETTERS if c not in used]

    def letter(v: str) -> str:
        if not v.startswith("_"):
            return v
        if v not in names:
            if not free:
                raise RuntimeError(f"einsum gradient of {equation!r}: more than 52 indices")
            names[v] = free.pop(0)
        return names[v]
    idx_n = op_idx[n]
    bcast = set(spec.broadcast[n])
    others = tuple(m for m in range(len(op_idx)) if m != n)
    grad_term = "".join(letter(v) for v in out)
    other_terms = tuple("".join(letter(v) for v in op_idx[m]) for m in others)
    repeated = len(set(idx_n)) != len(idx_n)
    if sparse:
        term = []
        for d, v in enumerate(idx_n):
            if d in bcast:   # a size-1 dimension that broadcast: its own (summed) index
                if not free:
                    raise RuntimeError(f"einsum gradient of {equation!r}: more than 52 indices")
                term.append(free.pop(0))
            else:
                term.append(letter(v))
        # a repeated subscript: the factor is the diagonal, over the distinct subscripts
        pattern_term = "".join(dict.fromkeys(term))
        return GradientPlan(n, True, grad_term, others, other_terms, pattern_term, "",
                            tuple(term), repeated)
    present = set(out) | {v for m in others for v in op_idx[m]}
    result: List[str] = []
    dims: List[Optional[str]] = []
    for d, v in enumerate(idx_n):
        if d in bcast or v not in present:
            dims.append(None if d in bcast else "+" + letter(v))   # "+x": expand to x's size
            continue
        if letter(v) not in result:
            result.append(letter(v))
        dims.append(letter(v))
    return GradientPlan(n, False, grad_term, others, other_terms, "", "".join(result),
                        tuple(dims), repeated)


def dense_to_pattern(C: Storage, grad: torch.Tensor) -> SparseTensor:
    """A dense gradient of a sparse result, on the result's pattern: entries outside the
    pattern are structurally zero (they do not depend on the inputs)."""
    from .._runtime import convert
    coords = convert.coords(C)
    vals = grad[tuple(coords)] if C.ndim else grad.reshape(1).expand(C.nnz)
    return from_values(C, vals.to(C.dtype))


def _sizes(plan: GradientPlan, grad, operands) -> Dict[str, int]:
    sizes: Dict[str, int] = {}
    for term, x in [(plan.grad_term, grad)] + [(t, operands[m]) for t, m in
                                               zip(plan.other_terms, plan.others)]:
        for c, s in zip(term, x.shape):
            if sizes.get(c, 1) == 1:
                sizes[c] = int(s)
    return sizes


def full_gradient(R, dims: Sequence[Optional[Tuple[str, str]]], result_vars: Sequence[str],
                  sizes: Dict[str, int], shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A dense operand's whole gradient from a result ``R`` over ``result_vars``.

    ``dims[d]`` is ``("var", v)`` (the dimension takes produced variable ``v``),
    ``("expand", v)`` (a variable the result does not have: broadcast to its size) or None
    (a broadcast size-1 dimension)."""
    if isinstance(R, SparseTensor):
        R = R.to_dense()
    R = R.to(dtype)
    # (a produced variable can have size 1 where the operand's dimension is bigger: the
    # other operand that carries it broadcast, so the gradient does too)
    if all(d is not None and d[0] == "var" for d in dims) and \
            len(set(d[1] for d in dims)) == len(dims):
        return R if tuple(R.shape) == tuple(shape) else R.expand(shape)
    if len(set(d[1] for d in dims if d is not None and d[0] == "var")) == \
            len([d for d in dims if d is not None and d[0] == "var"]):
        view = [R.shape[result_vars.index(d[1])] if d is not None and d[0] == "var" else 1
                for d in dims]
        return R.reshape(view).expand(shape)
    # a diagonal: zeros, and the result written where the repeated subscripts agree (a
    # variable only this operand has is broadcast along its own, possibly diagonal, stride)
    expanded = list(dict.fromkeys(d[1] for d in dims if d is not None and d[0] == "expand"))
    every = list(result_vars) + expanded
    Z = torch.zeros(shape, dtype=dtype)
    strides = {v: 0 for v in every}
    sizes = dict(sizes)
    for k, d in enumerate(dims):
        if d is not None:
            strides[d[1]] += Z.stride(k)
            sizes.setdefault(d[1], shape[k])
    extent = [sizes[v] for v in every]
    R = R.reshape(list(R.shape) + [1] * len(expanded)).expand(extent)
    Z.as_strided(extent, [strides[v] for v in every]).copy_(R)
    return Z


def _dense_result(plan: GradientPlan, R, grad, operands, shape, dtype) -> torch.Tensor:
    sizes = _sizes(plan, grad, operands)
    dims = [None if c is None else (("expand", c[1:]) if c.startswith("+") else ("var", c))
            for c in plan.dims]
    return full_gradient(R, dims, list(plan.result_term), sizes, shape, dtype)


def operand_gradient(plan: GradientPlan, einsum: Callable, grad, operands: Sequence,
                     prepare: Callable = None):
    """Run ``plan`` for ``grad`` (grad_C) and the forward's ``operands``: a dense tensor, or
    a SparseTensor with operand ``n``'s pattern and format."""
    x = operands[plan.n]
    others = [operands[m] for m in plan.others]
    if plan.sparse and plan.repeated:
        return _diagonal_gradient(plan, einsum, grad, x, others)
    if not plan.sparse:
        eq = plan.equation()
        ops = [grad] + others
        if prepare is not None:
            ops = prepare(eq, ops)
        # a dense operand's gradient is dense: asked for as such, the compiler writes it in
        # place instead of assembling a sparse result through a workspace
        sparse = plan.result_term and any(isinstance(o, SparseTensor) for o in ops)
        R = einsum(eq, *ops, out_format="d" * len(plan.result_term)) if sparse \
            else einsum(eq, *ops)
        return _dense_result(plan, R, grad, operands, tuple(x.shape), x.dtype)
    P = x._storage
    # a factor already on P's pattern (grad_C of a pattern-preserving op, an operand that
    # is P itself) does the pattern factor's job
    terms = [plan.grad_term] + list(plan.other_terms)
    factors = [grad] + others
    merged = False
    for k, (t, f) in enumerate(zip(terms, factors)):
        if t == plan.pattern_term and isinstance(f, SparseTensor) and \
                _pattern.shares_arrays(P, f._storage):
            merged = True
            break
    dtype = torch.promote_types(grad.dtype, x.dtype)
    for f in others:
        dtype = torch.promote_types(dtype, f.dtype)
    Q, perm = P, None
    if merged:
        eq = plan.equation(with_pattern=False)
    else:
        eq = plan.equation()
        Q, perm = _pattern.pattern_factor(P, dtype)
    factors = _located_factors(plan, Q, terms, factors)
    if not merged:
        Q, perm = _pattern_as_read(eq, Q, perm, factors)
    ops = factors if merged else [SparseTensor(Q)] + factors
    R = einsum(eq, *ops)
    if not isinstance(R, SparseTensor):   # a dense result (e.g. every factor dense and small)
        return dense_to_pattern(P, R.to(x.dtype))
    if _pattern.shares_arrays(P, R._storage):
        vals = values_of(R)
    else:
        vals = _pattern.values_from_factor(P, Q, perm, R._storage, values_of(R))
    return from_values(P, vals.to(x.dtype))



#: (equation, pattern format and shape, dtypes, factor shapes) -> the format the plan reads the
#: pattern factor in (``_pattern_as_read``)
_READ_FORMAT: Dict[tuple, object] = {}
_UNKNOWN = object()


def _pattern_as_read(eq: str, Q: Storage, perm: Optional[torch.Tensor],
                     factors: list) -> Tuple[Storage, Optional[torch.Tensor]]:
    """The pattern factor ``Q`` (``perm``: its positions in the operand's) in the format the
    gradient kernel reads it in, where the plan would read it transposed and every other
    factor is dense. The MoE gate gradient ``bn,bh,bd,ndh->bn`` runs expert-major on the CSR
    gate: handed the gate as CSC, the kernel writes the gradient at the pattern's positions,
    with no entries appended, assembled and converted back to CSR (44.1 vs 46.7 ms min,
    1 thread, Zen 3, under load); a kept permutation (``pattern.reformat_permutation``) puts
    the values back in the operand's order."""
    if any(isinstance(f, SparseTensor) for f in factors):
        return Q, perm
    # asking the plan costs ~50-150 us; a training step asks again with the same shapes. A
    # stale answer (the plan changed with the pattern's statistics) costs speed only: the
    # result is placed on the operand's pattern either way (``values_from_factor``)
    key = (eq, Q.format, tuple(Q.shape), Q.values.dtype, Q.index_dtype,
           tuple((f.dtype, tuple(f.shape)) for f in factors))
    fmt = _READ_FORMAT.get(key, _UNKNOWN)
    if fmt is _UNKNOWN:
        fmt = _compiler().read_formats(eq, SparseTensor(Q), *factors)[0]
        if len(_READ_FORMAT) >= 512:
            _READ_FORMAT.clear()
        _READ_FORMAT[key] = fmt
    if fmt is None or fmt == Q.format:
        return Q, perm
    got = _pattern.reformat_permutation(Q, fmt)
    if got is None:
        return Q, perm
    conv, to_q = got
    return (_pattern.pattern_ones(conv, Q.values.dtype),
            to_q if perm is None else perm.index_select(0, to_q))


def _located_factors(plan: GradientPlan, Q: Storage, terms: Sequence[str], factors: list) -> list:
    """The factors with every other sparse one that shares variables with the pattern
    handed over in ``pattern.located_format`` (e.g. a CSR batch ``X`` as CSC for the weight
    gradient ``oj,ao,aj->oj``): the kernel then iterates the pattern alone over its
    variables and writes the gradient at the pattern's positions. Left to the compiler, the
    factor is intersected there and the result holds only the entries it meets, which
    then have to be searched for in the pattern. A factor seen again (a fixed input)
    keeps its conversion (``pattern.converted_partner``)."""
    level_vars = "".join(plan.pattern_term[d] for d in Q.format.mode_order)
    out = factors
    for k, (t, f) in enumerate(zip(terms, factors)):
        if not isinstance(f, SparseTensor) or _pattern.shares_arrays(Q, f._storage):
            continue
        st = f._storage
        fmt = _pattern.located_format(st.format, st.shape, st.nnz, t, level_vars, Q.nnz)
        if fmt is None:
            continue
        if out is factors:
            out = list(factors)
        differentiable = torch.is_grad_enabled() and f.requires_grad   # double backward
        out[k] = f.to_format(fmt) if differentiable else SparseTensor(_pattern.converted_partner(st, fmt))
    return out


def pattern_gradient_values(plan: GradientPlan, P: Storage, grad: torch.Tensor, partner,
                            compiler) -> Optional[torch.Tensor]:
    """The values at ``P``'s positions of sparse operand ``plan.n``'s gradient, for the
    common two-operand case (a dense ``grad``, one partner: a Storage or a dense tensor, no
    graph to record), run on storages through ``compiler.einsum``: what ``operand_gradient``
    does there (a sparse partner located, the kernel writing ``P``'s pattern), without its
    tensor wrappers and general checks (a training step's backward calls it once per sparse
    layer). None where the general path is needed."""
    if plan.repeated or len(plan.other_terms) != 1 or type(grad) is not torch.Tensor \
            or grad.layout is not torch.strided:
        return None
    if type(partner) is Storage:
        level_vars = "".join(plan.pattern_term[d] for d in P.format.mode_order)
        fmt = _pattern.located_format(partner.format, partner.shape, partner.nnz, plan.other_terms[0],
                                      level_vars, P.nnz)
        if fmt is not None:
            partner = _pattern.converted_partner(partner, fmt)
    dtype = torch.promote_types(grad.dtype, partner.dtype)
    R = compiler.einsum(plan.equation(), _pattern.pattern_ones(P, dtype), grad, partner)
    if type(R) is not Storage:
        return None
    vals = R.values if _pattern.shares_arrays(P, R) else _pattern.values_on_pattern(P, R, R.values)
    return vals.to(P.dtype)


def _diagonal_gradient(plan: GradientPlan, einsum: Callable, grad, x: SparseTensor, others):
    """A sparse operand read along a diagonal (a subscript repeated): the gradient einsum
    runs on the pattern's diagonal entries (``pattern.diagonal``) and its values go back
    to those entries; every other stored entry gets 0."""
    P = x._storage
    dtype = torch.promote_types(grad.dtype, x.dtype)
    Q, entries, which = _pattern.diagonal(P, plan.dims, dtype)
    R = einsum(plan.equation(), SparseTensor(Q), grad, *others)
    vals = grad_values(Q, R)
    return from_values(P, _pattern.from_diagonal(P, entries, which, vals).to(x.dtype))
