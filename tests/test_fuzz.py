"""Fuzz suite (issue 14): random einsums and index expressions over random formats, mode
orders, shapes (size-0 and size-1 dims, broadcasting), dtypes and densities, checked against
dense torch.

A *configuration* is what decides the generated kernel: the equation (or expression), each
operand's format and index dtype, the value dtype and which dims broadcast. Everything else
(sizes, densities, values) is drawn freely by hypothesis. Compiling a kernel costs about a
second, so the two modes differ in where configurations come from:

* CI (default): derandomized (a fixed seed), with configurations drawn from a fixed pool
  built by a seeded generator (``POOL_SIZE`` einsums, ``EXPR_POOL_SIZE`` expressions), so a
  cold kernel cache compiles a bounded set of kernels; ``CI_EXAMPLES`` examples per test.
* long mode, for local runs: ``SCORCH_FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz.py
  -x`` draws N examples per test from the whole configuration space with a new seed each
  run (most examples compile a new kernel: about a second each on a quiet machine). Add
  ``SCORCH_FUZZ_SEED=<int>`` to repeat a run, ``-s --hypothesis-verbosity=verbose`` to watch
  each example. A failure prints the configuration, the sizes and hypothesis'
  ``@reproduce_failure`` line.

Configurations are made by plain ``random.Random`` generators (one code path for both
modes); the failing example's ``repr`` is the whole configuration.
"""
from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Optional, Tuple

import pytest
import torch
from hypothesis import HealthCheck, assume, given, seed, settings, strategies as st

import scorch
import scorch.tensor_compiler as C
from compiler_helpers import check_storage, dense, sparse
from ops_helpers import TORCH_FUNCTIONS
from scorch.formats import Format
from scorch.level_storage import Storage
from scorch.tensor_compiler.functions import FUNCTIONS
from scorch.tensor_compiler.index_notation import (Access, Add, Apply, Assignment, Div, Mul, Neg,
                                                   Scalar, Sub, accesses)
from scorch.tensor_type import SparseTensor

LONG_EXAMPLES = int(os.environ.get("SCORCH_FUZZ_EXAMPLES", "0") or 0)
LONG = LONG_EXAMPLES > 0
POOL_SIZE, EXPR_POOL_SIZE = 28, 10
CI_EXAMPLES, CI_EXPR_EXAMPLES = 90, 45
DTYPES = (torch.float32, torch.float64, torch.int64)


def fuzz_settings(ci_examples: int):
    """Derandomized and bounded in CI; N examples with a fresh (or given) seed in long mode."""
    s = settings(max_examples=LONG_EXAMPLES if LONG else ci_examples, deadline=None,
                 derandomize=not LONG, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])

    def wrap(test):
        test = s(test)
        if LONG and os.environ.get("SCORCH_FUZZ_SEED"):
            test = seed(int(os.environ["SCORCH_FUZZ_SEED"]))(test)
        return test
    return wrap


# ------------------------------------------------------------------ operand kinds

@dataclass(frozen=True)
class Kind:
    """How one operand is stored: ``dense``, ``torch_coo``/``torch_csr`` (torch's own sparse
    tensors), ``format`` (level storage in ``fmt``) or ``scorch`` (a SparseTensor built by
    scorch's constructor: singleton formats, which the reference model does not build)."""
    name: str
    fmt: Optional[Format] = None
    index_dtype: Optional[torch.dtype] = None

    @property
    def block(self):
        return None if self.fmt is None else self.fmt.block

    @property
    def singleton_from(self) -> Optional[int]:
        """First stored level of a singleton run (every later level is singleton)."""
        if self.fmt is None or "s" not in self.fmt.level_string:
            return None
        return self.fmt.level_string.index("s")


def random_kind(rng: random.Random, rank: int, repeats: bool) -> Kind:
    """Any format of this rank; blocked only for a matrix without a repeated index."""
    choices = ["dense"] * 3 + ["levels"] * 4 + ["named"] * 2
    if rank >= 1:
        choices += ["torch_coo"]
    if rank >= 2:   # a dense tensor laid out in another order (a permuted view)
        choices += ["dense_strided"]
    if rank == 2:
        choices += ["torch_csr", "blocked"] * (not repeats) + ["singleton"]
    if rank == 3:
        choices += ["singleton"]
    what = rng.choice(choices) if rank else "dense"
    order = list(range(rank))
    rng.shuffle(order)
    idx = rng.choice([None, None, None, torch.int64])
    if what in ("dense", "torch_coo", "torch_csr"):
        return Kind(what)
    if what == "dense_strided":
        return Kind(what, Format("d" * rank, order))
    if what == "levels":
        return Kind("format", Format("".join(rng.choice("dcq") for _ in range(rank)), order), idx)
    if what == "named":
        names = ["coo", "csf"] + (["csr", "csc", "dcsr", "dcsc"] if rank == 2 else [])
        return Kind("format", scorch.as_format(rng.choice(names), rank), idx)
    if what == "blocked":
        levels = rng.choice(["dc", "cc", "dq", "qq"])
        return Kind("format", Format(levels, order, block=(rng.randint(1, 3), rng.randint(1, 3))), idx)
    levels = rng.choice(["cs", "qs", "ds"] if rank == 2 else ["css", "qss", "dcs", "ccs", "dqs"])
    return Kind("scorch", Format(levels, order))


def make_operand(x: torch.Tensor, kind: Kind):
    if kind.name == "dense":
        return x
    if kind.name == "dense_strided":   # the same values, stored in the kind's mode order
        order = list(kind.fmt.mode_order)
        return x.permute(*order).contiguous().permute(*[order.index(d) for d in range(x.dim())])
    if kind.name == "torch_coo":
        return x.to_sparse()
    if kind.name == "torch_csr":
        return x.to_sparse_csr()
    if kind.name == "scorch":
        s = scorch.sparse_tensor(x, format=kind.fmt)
        torch.testing.assert_close(s.to_dense(), x)
        return s._storage
    return sparse(x, kind.fmt, kind.index_dtype)


def fit_singleton(x: torch.Tensor, kind: Kind, g: torch.Generator) -> torch.Tensor:
    """Keep one entry per parent position of a singleton run (the format holds exactly one);
    below all-dense parents every position needs one, so an empty fiber gets a 1."""
    k = kind.singleton_from
    if k is None or x.numel() == 0:
        return x
    fmt = kind.fmt
    y = x.permute(*fmt.mode_order)
    outer = math.prod(y.shape[:k])
    flat = y.reshape(outer, -1)
    nz = flat != 0
    flat = flat * (nz & (nz.cumsum(1) == 1))
    if set(fmt.level_string[:k]) <= {"d"} and flat.shape[1]:
        empty = ~(flat != 0).any(1)
        col = torch.randint(0, flat.shape[1], (outer,), generator=g)
        flat[empty, col[empty]] = 1
    inverse = [fmt.mode_order.index(d) for d in range(x.dim())]
    return flat.reshape(y.shape).permute(*inverse).contiguous()


def singleton_fits(kind: Kind, shape) -> bool:
    """A dense parent over an empty child dimension cannot hold its one entry."""
    k = kind.singleton_from
    if k is None or not set(kind.fmt.level_string[:k]) <= {"d"}:
        return True
    dims = [shape[d] for d in kind.fmt.mode_order]
    return math.prod(dims[:k]) == 0 or math.prod(dims[k:]) > 0


def random_values(shape, dtype, density: float, g: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    else:
        x = torch.randint(-4, 5, tuple(shape), generator=g, dtype=dtype)
    return x * (torch.rand(shape, generator=g) < density).to(dtype)


def assert_matches(got, want: torch.Tensor, dtype: torch.dtype) -> None:
    if isinstance(got, Storage):
        check_storage(got)
        got = dense(got)
    elif isinstance(got, SparseTensor):
        got = got.to_dense()
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if dtype.is_floating_point:
        tol = 1e-4 if dtype == torch.float32 else 1e-9
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        assert torch.equal(got, want), (got, want)


# ------------------------------------------------------------------ einsum configurations

@dataclass(frozen=True)
class EinsumConfig:
    equation: str
    terms: Tuple[Tuple[str, ...], ...]          # per operand, "." for an ellipsis dim
    kinds: Tuple[Kind, ...]
    dtype: torch.dtype
    broadcast: Tuple[Tuple[int, ...], ...]       # per operand: dims held at size 1
    public: bool                                 # through scorch.einsum (twice: the warm path)


def random_einsum(rng: random.Random) -> EinsumConfig:
    """1-3 operands of rank 0-3 over up to 4 letters, with repeated (diagonal), broadcast,
    reduced and summed-out letters; explicit, implicit and scalar outputs; an ellipsis."""
    pool = "ijkl"[: rng.randint(1, 4)]
    n_ops = rng.choice([1, 1, 2, 2, 2, 3, 3])
    ellipsis = rng.random() < 0.1
    terms = []
    for _ in range(n_ops):
        rank = rng.choice([0, 1, 1, 2, 2, 2, 3, 3])
        letters = rng.sample(pool, min(rank, len(pool)))
        if letters and rng.random() < 0.15:                     # a repeated index
            letters.insert(rng.randrange(len(letters) + 1), rng.choice(letters))
        ell = ["."] if ellipsis and rng.random() < 0.7 else []
        terms.append(tuple(ell + letters))
    used = sorted({v for t in terms for v in t if v != "."})
    mode = rng.random()
    if mode < 0.15:
        out = None                                               # implicit output
    elif mode < 0.3:
        out = []                                                 # a scalar
    else:
        out = rng.sample(used, rng.randint(0, len(used)))
    if out is not None and any("." in t for t in terms):
        out = ["."] + out

    def text(t):
        return "".join("..." if v == "." else v for v in t)
    equation = ",".join(text(t) for t in terms) + ("" if out is None else "->" + text(out))
    kinds = [random_kind(rng, len(t), len(set(t)) < len(t)) for t in terms]
    # a letter of a blocked operand does not broadcast: see test_broadcast_against_a_blocked_operand
    blocked = {v for t, k in zip(terms, kinds) if k.block is not None for v in t}
    broadcast = []
    for t in terms:
        counts = {v: t.count(v) for v in t}
        # a broadcast dim: a letter used once in this term and shared with another operand
        shared = [d for d, v in enumerate(t) if v != "." and counts[v] == 1
                  and sum(v in u for u in terms) > 1 and v not in blocked]
        broadcast.append(tuple(d for d in shared if rng.random() < 0.15))
    return EinsumConfig(equation, tuple(terms), tuple(kinds), rng.choice(DTYPES),
                        tuple(broadcast), rng.random() < 0.3)


def kind_features(kind: Kind) -> set:
    if kind.fmt is None or kind.name == "dense_strided":
        return {kind.name}
    f = kind.fmt
    tags = {f"levels {f.level_string}", f"level kind {'+'.join(sorted(set(f.level_string)))}"}
    tags |= {f"format {f.name}"} if f.name else set()
    tags |= {"blocked"} if f.block else set()
    tags |= {"mode order permuted"} if list(f.mode_order) != sorted(f.mode_order) else set()
    tags |= {"int64 indices"} if kind.index_dtype == torch.int64 else set()
    return tags


def einsum_features(cfg: EinsumConfig) -> set:
    """What a configuration exercises (the CI pool must cover all of ``EINSUM_FEATURES``)."""
    lhs, _, rhs = cfg.equation.partition("->")
    tags = {f"{len(cfg.terms)} operands", str(cfg.dtype)}
    tags |= {"implicit output"} if "->" not in cfg.equation else set()
    tags |= {"scalar output"} if "->" in cfg.equation and rhs in ("", "...") else set()
    tags |= {"ellipsis"} if "." in lhs else set()
    tags |= {"broadcast"} if any(cfg.broadcast) else set()
    tags |= {"public api"} if cfg.public else set()
    tags |= {"diagonal"} if any(len(set(t)) < len(t) for t in cfg.terms) else set()
    tags |= {"reduction"} if "->" in cfg.equation and set(lhs) - set(rhs) - {",", "."} else set()
    for t, kind in zip(cfg.terms, cfg.kinds):
        tags |= kind_features(kind) | {f"rank {len(t)}"}
    return tags


EINSUM_FEATURES = {"1 operands", "2 operands", "3 operands", "torch.float32", "torch.float64",
                   "torch.int64", "implicit output", "scalar output", "ellipsis", "broadcast",
                   "public api", "diagonal", "reduction", "dense", "dense_strided", "torch_coo", "torch_csr",
                   "blocked", "mode order permuted", "int64 indices", "rank 0", "rank 3",
                   "levels cs", "levels qs", "levels ds", "format csr", "format csc",
                   "format coo", "format dcsr", "format dcsc", "format csf", "level kind c+d+q"}


def covering_pool(make, features, wanted: set, size: int, prefix: str) -> list:
    """``size`` configurations from a seeded generator, chosen greedily so that together
    they exercise every feature in ``wanted`` (then the next ones in seed order)."""
    candidates = [make(random.Random(f"{prefix}-{n}")) for n in range(40 * size)]
    pool, seen = [], set()
    while len(pool) < size:
        best = max(candidates, key=lambda c: len((features(c) & wanted) - seen))
        if not (features(best) & wanted) - seen:
            best = next(c for c in candidates if c not in pool)
        pool.append(best)
        candidates.remove(best)
        seen |= features(best)
    return pool


EINSUM_POOL = covering_pool(random_einsum, einsum_features, EINSUM_FEATURES, POOL_SIZE, "scorch-fuzz")
einsum_configs = (st.integers(0, 2**32).map(lambda s: random_einsum(random.Random(s))) if LONG
                  else st.sampled_from(EINSUM_POOL))


def draw_sizes(data, cfg_terms, kinds) -> dict:
    """A size per letter (0-5, or a multiple of every block along it) and for the ellipsis."""
    unit = {}
    for t, kind in zip(cfg_terms, kinds):
        for d, v in enumerate(t):
            if kind.block is not None:
                unit[v] = math.lcm(unit.get(v, 1), kind.block[d])
    sizes = {}
    for v in sorted({v for t in cfg_terms for v in t}):
        if v in unit:
            sizes[v] = unit[v] * data.draw(st.integers(0, max(1, 6 // unit[v])), label=f"{v} blocks")
        else:
            sizes[v] = data.draw(st.sampled_from([3, 1, 0, 2, 4, 5]), label=f"size {v}")
    return sizes


def build_operands(data, terms, kinds, broadcast, sizes, dtype):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="values seed"))
    dense_ops, ops = [], []
    for t, kind, bc in zip(terms, kinds, broadcast):
        shape = [1 if d in bc else sizes[v] for d, v in enumerate(t)]
        assume(singleton_fits(kind, shape))
        density = data.draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]), label="density")
        x = random_values(shape, dtype, density, g)
        x = fit_singleton(x, kind, g)
        dense_ops.append(x)
        ops.append(make_operand(x, kind))
    return dense_ops, ops


@fuzz_settings(CI_EXAMPLES)
@given(cfg=einsum_configs, data=st.data())
def test_einsum_matches_dense_torch(cfg: EinsumConfig, data):
    sizes = draw_sizes(data, cfg.terms, cfg.kinds)
    dense_ops, ops = build_operands(data, cfg.terms, cfg.kinds, cfg.broadcast, sizes, cfg.dtype)
    want = torch.einsum(cfg.equation, *dense_ops)
    if cfg.public:
        wrapped = [SparseTensor(x) if isinstance(x, Storage) else x for x in ops]
        for _ in range(2):     # the second call takes the warm path (fastcall)
            assert_matches(scorch.einsum(cfg.equation, *wrapped), want, cfg.dtype)
    else:
        assert_matches(C.einsum(cfg.equation, *ops), want, cfg.dtype)


# ------------------------------------------------------------------ index expressions

INT_FUNCTIONS = ("abs", "relu", "sign", "square")
# the CI pool draws from the first eleven (a bounded pool that covers each of them); long runs
# draw from every function of the table
FLOAT_FUNCTIONS = ("abs", "relu", "sqrt", "sin", "tanh", "sign", "square", "exp", "cos", "sigmoid", "log")
LONG_FLOAT_FUNCTIONS = ("expm1", "log1p", "erf", "atan", "gelu", "silu", "leaky_relu", "elu",
                        "hardtanh", "softsign", "floor", "ceil", "round", "trunc", "frac", "relu6",
                        "selu", "celu", "mish", "tanhshrink", "softshrink", "hardshrink", "asinh",
                        "sinh", "deg2rad", "logsigmoid", "softplus", "hardswish", "threshold")
DENSE_FN = TORCH_FUNCTIONS


@dataclass(frozen=True)
class ExprConfig:
    assignment: Assignment
    terms: Tuple[Tuple[str, ...], ...]
    kinds: Tuple[Kind, ...]
    dtype: torch.dtype
    denominators: Tuple[int, ...] = field(default=())   # dense operands used as divisors


def random_expression(rng: random.Random, every_function: bool = False) -> ExprConfig:
    """An elementwise tree (+, -, *, unary minus, scalars, functions, division by a dense
    operand) over 1-3 operands indexed by the full index tuple or a subset (a broadcast
    row), reduced by sum/max/min to a random subset of the indices."""
    full = tuple("ijk"[: rng.choice([1, 2, 2, 2, 3])])
    dtype = rng.choice(DTYPES)
    n_ops = rng.randint(1, 3)
    terms = [full] + [full if rng.random() < 0.75 else tuple(sorted(rng.sample(full, rng.randint(1, len(full)))))
                      for _ in range(n_ops - 1)]
    kinds = [random_kind(rng, len(t), False) for t in terms]
    kinds = [Kind("dense") if k.name == "scorch" else k for k in kinds]   # singleton: einsum only
    denominators = []
    if dtype.is_floating_point and rng.random() < 0.3:
        n = len(terms)
        terms.append(full)
        kinds.append(Kind("dense"))
        denominators.append(n)
    out = tuple(v for v in full if rng.random() < 0.6)
    reduce = rng.choice(["sum", "sum", "max", "min"]) if len(out) < len(full) else "sum"
    functions = (FLOAT_FUNCTIONS + (LONG_FLOAT_FUNCTIONS if every_function else ())
                 if dtype.is_floating_point else INT_FUNCTIONS)
    if reduce != "sum":   # max/min skip NaN where torch propagates it: see test_max_min_propagate_nan
        functions = tuple(f for f in functions if f not in ("log", "sqrt", "log1p"))

    def tree(depth):
        r = rng.random()
        if depth == 0 or r < 0.3:
            return _leaf()
        if r < 0.45:
            return Neg(tree(depth - 1))
        if r < 0.6:
            return Apply(rng.choice(functions), tree(depth - 1))
        if r < 0.7 and denominators:
            return Div(tree(depth - 1), Access(denominators[0], full))
        op = rng.choice([Add, Sub, Mul, Mul])
        return op(tree(depth - 1), tree(depth - 1))

    def _leaf():
        if rng.random() < 0.12:
            return Scalar(rng.choice([2, -1, 3]) if not dtype.is_floating_point else rng.choice([0.5, -2.0, 1.5]))
        n = rng.randrange(n_ops)
        return Access(n, terms[n])

    rhs = tree(3)
    for n in range(n_ops):                        # every operand takes part (full index set)
        if all(a.tensor != n for a in accesses(rhs)):
            rhs = Add(rhs, Access(n, terms[n])) if rng.random() < 0.5 else Mul(rhs, Access(n, terms[n]))
    if not any(a.indices == full for a in accesses(rhs)):
        rhs = Mul(rhs, Access(0, full))
    return ExprConfig(Assignment(out, rhs, reduce), tuple(terms), tuple(kinds), dtype, tuple(denominators))


def _dense_eval(e, ops, full):
    """(value, stored mask) of ``e`` over the full index space, with torch broadcasting.

    A product is computed only where both factors are stored, a quotient where its numerator
    is (as torch.sparse does): elsewhere it is 0 even when the other side is NaN or inf."""
    if isinstance(e, Access):
        x, mask = ops[e.tensor]
        shape = [x.shape[e.indices.index(v)] if v in e.indices else 1 for v in full]
        return x.reshape(shape), mask.reshape(shape)
    if isinstance(e, Scalar):   # a float in double, as the kernel's C literal (log(0.5) in float32 is 2e-9 off)
        return torch.tensor(e.value, dtype=torch.float64 if isinstance(e.value, float) else None), torch.tensor(True)
    if isinstance(e, Neg):
        x, m = _dense_eval(e.a, ops, full)
        return -x, m
    if isinstance(e, Apply):
        x, m = _dense_eval(e.a, ops, full)
        keeps = FUNCTIONS[e.fn].preserves_zero(e.p)
        return DENSE_FN[e.fn](x), m if keeps else torch.ones_like(m)
    a, ma = _dense_eval(e.a, ops, full)
    b, mb = _dense_eval(e.b, ops, full)
    zero = torch.zeros((), dtype=torch.result_type(a, b))
    if isinstance(e, Mul):
        return torch.where(ma & mb, a * b, zero), ma & mb
    if isinstance(e, Div):
        return torch.where(ma, a / b, zero), ma | torch.zeros_like(mb)
    # a constant side equal to 0 adds no stored entry (``A + 0`` stores what A stores,
    # ``merge_lattice.zero_analysis``; a max over it skips A's unstored entries); any other
    # constant makes the sum present everywhere. Found by seed 4242 (session 24):
    # ``max_j (-(-1 - -1)) * -1 + T0(i,j)`` with T0 empty
    if not accesses(e.a) and bool((a == 0).all()):
        ma = torch.zeros_like(ma)
    if not accesses(e.b) and bool((b == 0).all()):
        mb = torch.zeros_like(mb)
    return (a + b if isinstance(e, Add) else a - b), ma | mb


def stored_mask(op, x: torch.Tensor) -> torch.Tensor:
    """Where an operand stores entries (every position for a dense operand)."""
    if isinstance(op, Storage):
        from reference_storage import reference_coords
        mask = torch.zeros(x.shape, dtype=torch.bool)
        coords = reference_coords(op)
        if coords.shape[1]:
            mask[tuple(torch.from_numpy(c) for c in coords)] = True
        return mask
    if op.layout == torch.sparse_coo:
        mask = torch.zeros(x.shape, dtype=torch.bool)
        mask[tuple(op.coalesce().indices())] = True
        return mask
    if op.layout == torch.sparse_csr:
        return _csr_mask(op)
    return torch.ones(x.shape, dtype=torch.bool)


def _csr_mask(op) -> torch.Tensor:
    rows = torch.repeat_interleave(torch.arange(op.shape[0]), op.crow_indices().diff())
    mask = torch.zeros(op.shape, dtype=torch.bool)
    mask[rows, op.col_indices()] = True
    return mask


def expr_features(cfg: ExprConfig) -> set:
    tags = {str(cfg.dtype), f"reduce {cfg.assignment.reduce}", f"rank {len(max(cfg.terms, key=len))}"}
    tags |= {"scalar output"} if not cfg.assignment.output else set()
    tags |= {"broadcast row"} if len({len(t) for t in cfg.terms}) > 1 else set()

    def walk(e):
        tags.add(type(e).__name__)
        if isinstance(e, Apply):
            tags.add(f"fn {e.fn}")
        for child in (getattr(e, "a", None), getattr(e, "b", None)):
            if child is not None:
                walk(child)
    walk(cfg.assignment.rhs)
    for kind in cfg.kinds:
        tags |= kind_features(kind)
    return tags


EXPR_FEATURES = {"torch.float32", "torch.float64", "torch.int64", "reduce sum", "reduce max",
                 "reduce min", "rank 1", "rank 3", "scalar output", "broadcast row", "Div", "Neg",
                 "Sub", "Scalar", "fn exp", "fn log", "fn relu", "fn sqrt", "fn sigmoid", "fn abs", "fn sign",
                 "blocked", "torch_csr", "torch_coo", "mode order permuted"}
EXPR_POOL = covering_pool(random_expression, expr_features, EXPR_FEATURES, EXPR_POOL_SIZE, "scorch-expr")
expr_configs = (st.integers(0, 2**32).map(lambda s: random_expression(random.Random(s), True)) if LONG
                else st.sampled_from(EXPR_POOL))


@fuzz_settings(CI_EXPR_EXAMPLES)
@given(cfg=expr_configs, data=st.data())
def test_expression_matches_dense_torch(cfg: ExprConfig, data):
    asg = cfg.assignment
    full = max(cfg.terms, key=len)
    sizes = draw_sizes(data, cfg.terms, cfg.kinds)
    dense_ops, ops = build_operands(data, cfg.terms, cfg.kinds, [()] * len(cfg.terms), sizes, cfg.dtype)
    for n in cfg.denominators:             # a divisor away from zero
        dense_ops[n] = dense_ops[n].abs() + 0.5
        ops[n] = dense_ops[n]
    got = C.compute(asg, *ops)
    value, mask = _dense_eval(asg.rhs, [(x, stored_mask(op, x)) for x, op in zip(dense_ops, ops)], full)
    shape = [sizes[v] for v in full]
    value = value.expand(shape).to(cfg.dtype)
    mask = mask.expand(shape)
    dims = tuple(d for d, v in enumerate(full) if v not in asg.output)
    if asg.reduce == "sum":
        want = value.sum(dims) if dims else value
        empty = None
    else:
        dt = cfg.dtype
        fill = (float("-inf") if asg.reduce == "max" else float("inf")) if dt.is_floating_point else \
            (torch.iinfo(dt).min if asg.reduce == "max" else torch.iinfo(dt).max)
        masked = torch.where(mask, value, torch.tensor(fill, dtype=dt))
        if masked.numel() == 0:            # torch's amax refuses an empty reduction
            want = torch.full([s for d, s in enumerate(shape) if d not in dims], fill, dtype=dt)
        else:
            want = masked.amax(dims) if asg.reduce == "max" else masked.amin(dims)
        empty = ~mask.any(dims) if dims else ~mask
    out_order = [v for v in full if v in asg.output]
    want = want.permute(*[out_order.index(v) for v in asg.output]) if want.dim() else want
    if empty is not None and isinstance(got, Storage):  # a sparse result stores no empty fiber
        empty = empty.permute(*[out_order.index(v) for v in asg.output]) if empty.dim() else empty
        want = torch.where(empty, torch.zeros((), dtype=cfg.dtype), want)
    assert_matches(got, want, cfg.dtype)


def test_an_empty_max_min_stores_nothing_on_a_pattern():
    """Found by this suite (session 23): ``out(j) = min_i (T0(i,j) + T2(i)) * T1(j)`` wrote
    its output on T1's pattern, so a j whose reduction found no stored entry kept min's
    identity (int64 max) as a stored value. A sparse result stores no empty fiber."""
    empty = scorch.sparse_tensor(torch.zeros(3, 3, dtype=torch.int64), format=scorch.Format("dq"))
    row = scorch.sparse_tensor(torch.zeros(3, dtype=torch.int64), format="coo")
    weights = scorch.sparse_tensor(torch.tensor([0, -1, 0]), format="coo")
    for reduce in ("min", "max"):
        asg = Assignment("j", Mul(Add(Access(0, "ij"), Access(2, "i")), Access(1, "j")), reduce)
        got = C.compute(asg, empty, weights, row)
        assert isinstance(got, Storage)          # sparse: an empty fiber is not stored
        assert_matches(got, torch.zeros(3, dtype=torch.int64), torch.int64)
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0]])         # a stored fiber keeps its extreme
    asg = Assignment("j", Mul(Access(0, "ij"), Access(1, "j")), "max")
    got = C.compute(asg, scorch.sparse_tensor(x, format=scorch.Format("dq")),
                    scorch.sparse_tensor(torch.tensor([3.0, 4.0]), format="coo"))
    assert isinstance(got, Storage)
    assert_matches(got, torch.tensor([6.0, 0.0]), torch.float32)


@pytest.mark.parametrize("fmt", ["csr", "dcsr", "coo"])
@pytest.mark.parametrize("c_density", [0.0, 0.5])
def test_a_sum_of_products_sharing_an_operand_keeps_every_product(fmt, c_density):
    """Found by this suite (session 24): ``A * B + A * C + B`` has presence ``B or (A and
    C)``, so the kernel merged the streams ``B`` and ``A and C``; A was then found only
    where C matched too, and ``A * B`` was lost wherever C held nothing. The streams are
    only taken where every product of the expression lies within one of them."""
    g = torch.Generator().manual_seed(0)

    def m(density):
        return torch.randn(6, 5, generator=g, dtype=torch.float64) * (torch.rand(6, 5, generator=g) < density)
    a, b, c = m(0.5), m(0.5), m(c_density)
    ops = [scorch.sparse_tensor(x, format=fmt) for x in (a, b, c)]
    A, B, Cx = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")
    got = C.compute(Assignment("ij", Add(Add(Mul(A, B), Mul(A, Cx)), B)), *ops)
    assert_matches(got, a * b + a * c + b, torch.float64)
    # the streams still serve a sum of disjoint products
    got = C.compute(Assignment("ij", Add(Mul(A, B), Cx)), *ops)
    assert_matches(got, a * b + c, torch.float64)


def test_max_min_propagate_nan():
    """Found by this suite: max/min over stored entries skipped NaN; torch.amax propagates it."""
    x = torch.tensor([[float("nan"), 1.0], [2.0, 0.0]])
    got = C.compute(Assignment("i", Access(0, "ij"), "max"), scorch.sparse_tensor(x, format="csr"))
    assert_matches(got, torch.tensor([float("nan"), 2.0]), torch.float32)


@pytest.mark.parametrize("pool, features, wanted", [
    (EINSUM_POOL, einsum_features, EINSUM_FEATURES), (EXPR_POOL, expr_features, EXPR_FEATURES)],
    ids=["einsum", "expression"])
def test_ci_pool_covers_every_feature(pool, features, wanted):
    """The bounded CI pool still exercises every format family, dtype and equation shape."""
    covered = set().union(*(features(c) for c in pool))
    assert wanted <= covered, f"not covered: {sorted(wanted - covered)}"


def test_abs_of_integers():
    """Found by this suite: abs of an int64 operand did not compile (fabs is a double)."""
    x = torch.tensor([[1, -2], [0, 3]])
    got = C.compute(Assignment("ij", Apply("abs", Access(0, "ij"))), scorch.sparse_tensor(x, format="csr"))
    assert_matches(got, x.abs(), torch.int64)


def test_broadcast_against_a_blocked_operand():
    """Found by this suite: a size-1 dim broadcast against a blocked operand's dim and summed
    was refused (a broadcast dense dim now leaves the equation before the block split)."""
    B = torch.arange(4.0).reshape(2, 2)
    got = scorch.einsum("ij,ij->", torch.ones(1, 2), scorch.sparse_tensor(B, format=Format("dc", block=(2, 2))))
    assert_matches(got, torch.tensor(6.0), torch.float32)


@pytest.mark.parametrize("equation", ["jij,kik->kj", "jij,kik->jk"])
@pytest.mark.parametrize("out_format", [None, "dense"])
def test_a_diagonal_operand_along_the_innermost_loop(equation, out_format):
    """``x[j, i, j]`` read along the innermost loop ``j`` has stride x.stride(0) + x.stride(2):
    an output row summed in registers read it as if at stride 1 (found by the fuzzer, seed
    2514; wrong since register rows, in more plans once outputs could be laid out in loop
    order)."""
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
        y = torch.randn(3, 3, 3, generator=g, dtype=torch.float64) * (torch.rand(3, 3, 3, generator=g) < 0.3)
        got = scorch.einsum(equation, x, scorch.sparse_tensor(y, format=Format("ccc")), out_format=out_format)
        got = got.to_dense() if isinstance(got, SparseTensor) else got
        torch.testing.assert_close(got, torch.einsum(equation, x, y))


@pytest.mark.parametrize("rows", [1, 4, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_vector_dot_whose_merge_tail_holds_no_streamed_operand(rows, dtype):
    """``sum_i (x(j) * 1.5 * A(i, j) + y(j))`` with x and y sparse: the merge over j ends
    with y alone, where the vector dot over i held only a scalar, which the kernel could
    not sum as a vector (a compile error; found by this suite, seed 2514)."""
    asg = Assignment("j", Add(Mul(Mul(Access(1, ("j",)), Scalar(1.5)), Access(0, ("i", "j"))),
                              Access(2, ("j",))), "sum")
    g = torch.Generator().manual_seed(rows)
    a = torch.randn(rows, 6, generator=g, dtype=dtype)
    x = torch.randn(6, generator=g, dtype=dtype) * torch.tensor([1, 0, 1, 0, 0, 1], dtype=dtype)
    y = torch.randn(6, generator=g, dtype=dtype) * torch.tensor([0, 1, 1, 0, 1, 1], dtype=dtype)
    got = C.compute(asg, a, sparse(x, Format("q")), sparse(y, Format("q")))
    want = (x * 1.5 * a + y).sum(0) * ((x != 0) | (y != 0))
    torch.testing.assert_close(dense(got), want)


@pytest.mark.parametrize("fmt", [Format("dc", (1, 0)), Format("dc"), Format("cc")])
def test_a_product_absent_through_a_difference_is_not_computed(fmt):
    """``-2 * log(A) * (A - A) + B``: where A stores nothing the product is absent (its
    factor ``A - A`` is 0 there), so the result is B; the kernel computed ``log(0) * 0``
    (NaN) wherever B alone was stored (found by this suite, seed 2515: the product's
    presence came only from factors that are accesses)."""
    A_ = Access(0, ("i", "j"))
    asg = Assignment(("i", "j"), Add(Mul(Scalar(-2.0), Mul(Apply("log", A_, None), Sub(A_, A_))),
                                     Access(1, ("i", "j"))), "sum")
    a = torch.tensor([[0.0, 2.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 3.0]])
    b = torch.tensor([[1.0, 0.0, 0.0], [0.0, -2.0, 0.0], [4.0, 0.0, 5.0]])
    got = dense(C.compute(asg, sparse(a, fmt), sparse(b, Format("qd"))))
    want = torch.where(a != 0, -2 * torch.log(a) * (a - a), torch.zeros(())) + b
    torch.testing.assert_close(got, want)
