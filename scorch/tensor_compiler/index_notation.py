"""Index notation: the expression language the compiler starts from.

An :class:`Assignment` ``out(i, k) = sum_j A(i, j) * B(j, k)`` has output index variables
and a right-hand side built from :class:`Access` (operand ``n`` indexed by variables),
:class:`Mul`, :class:`Add`, :class:`Sub`, :class:`Div`, :class:`Neg`, :class:`Apply`,
:class:`Scalar`, the comparisons (:class:`Lt`, :class:`Le`, :class:`Gt`, :class:`Ge`,
:class:`Eq`, :class:`Ne`: 1 where they hold, else 0) and :class:`Where`. Every variable of
the right-hand side that is not an output variable is summed over (einsum semantics).

``parse_einsum`` turns a torch-style einsum equation (implicit output, ``...``, batch
indices, outer products, any number of operands) into an Assignment; elementwise
expressions are built with Python operators on accesses::

    A, B = Access(0, "ij"), Access(1, "ij")
    Assignment("ij", A - 0.5 * B)

Index variables are strings: the einsum letter, or ``"_0"``, ``"_1"``, ... for the
dimensions an ellipsis stands for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .frontend import bind_sizes, check_equation
from .functions import function

__all__ = [
    "Expr", "Access", "Binary", "Mul", "Add", "Sub", "Div", "Neg", "Apply", "Scalar", "Assignment",
    "Compare", "Lt", "Le", "Gt", "Ge", "Eq", "Ne", "COMPARISONS", "Where",
    "parse_einsum", "EinsumSpec", "accesses", "label_sort_key", "product", "REDUCTIONS",
]


class Expr:
    """A node of the right-hand side. Python operators build new nodes."""

    def __mul__(self, other): return Mul(self, _wrap(other))
    def __rmul__(self, other): return Mul(_wrap(other), self)
    def __add__(self, other): return Add(self, _wrap(other))
    def __radd__(self, other): return Add(_wrap(other), self)
    def __sub__(self, other): return Sub(self, _wrap(other))
    def __rsub__(self, other): return Sub(_wrap(other), self)
    def __neg__(self): return Neg(self)
    def __truediv__(self, other): return Div(self, _wrap(other))
    def __rtruediv__(self, other): return Div(_wrap(other), self)

    def children(self) -> Tuple["Expr", ...]:
        """The sub-expressions (what a traversal visits)."""
        fields = self.__dict__     # nodes are frozen dataclasses: their fields live here
        return tuple(fields[f] for f in ("c", "a", "b") if isinstance(fields.get(f), Expr))

    def vars(self) -> List[str]:
        """Index variables in first-appearance order (walked once per node: nodes are
        immutable, and the op layer asks an expression's variables several times a call)."""
        known = self.__dict__.get("_vars")
        if known is None:
            out: List[str] = []
            for a in accesses(self):
                for v in a.indices:
                    if v not in out:
                        out.append(v)
            known = tuple(out)
            object.__setattr__(self, "_vars", known)
        return list(known)


def _wrap(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (int, float)):
        return Scalar(x)
    raise TypeError(f"cannot use {type(x).__name__} in an index expression")


@dataclass(frozen=True, eq=True)
class Access(Expr):
    """Operand number ``tensor`` indexed by ``indices`` (one variable per dimension)."""
    tensor: int
    indices: Tuple[str, ...]

    def __init__(self, tensor: int, indices: Sequence[str]):
        object.__setattr__(self, "tensor", int(tensor))
        object.__setattr__(self, "indices", tuple(indices))

    def __str__(self) -> str:
        return f"T{self.tensor}({','.join(self.indices)})"


@dataclass(frozen=True, eq=True)
class Binary(Expr):
    """A binary node; subclasses name the operator (``symbol``) and how operands print."""
    a: Expr
    b: Expr

    symbol = "?"
    paren_left = False      # the left operand is parenthesized like the right one
    paren_right_always = False

    def __str__(self) -> str:
        cls = type(self)
        left = _paren(self.a, cls) if self.paren_left else str(self.a)
        return f"{left} {self.symbol} {_paren(self.b, cls, always=self.paren_right_always)}"


# the subclasses inherit Binary's dataclass methods (equality compares the class too)
class Mul(Binary):
    symbol, paren_left = "*", True


class Add(Binary):
    symbol = "+"


class Sub(Binary):
    symbol, paren_right_always = "-", True


class Div(Binary):
    """``a / b``: computed where ``a`` may be nonzero; ``b`` must be dense (a sparse
    denominator makes the result dense by nature: x / 0)."""
    symbol, paren_left, paren_right_always = "/", True, True


class Compare(Binary):
    """A comparison: 1 where ``holds(a, b)``, else 0 (the op layer stores the result as bool).
    Whether it keeps 0 where its operands are 0 is ``holds(0, 0)`` (``merge_lattice``)."""
    symbol, paren_left, paren_right_always = "?", True, True
    holds: Callable[[float, float], bool] = staticmethod(lambda x, y: False)


class Lt(Compare):
    symbol, holds = "<", staticmethod(lambda x, y: x < y)


class Le(Compare):
    symbol, holds = "<=", staticmethod(lambda x, y: x <= y)


class Gt(Compare):
    symbol, holds = ">", staticmethod(lambda x, y: x > y)


class Ge(Compare):
    symbol, holds = ">=", staticmethod(lambda x, y: x >= y)


class Eq(Compare):
    symbol, holds = "==", staticmethod(lambda x, y: x == y)


class Ne(Compare):
    symbol, holds = "!=", staticmethod(lambda x, y: x != y)


#: the comparison nodes by torch's name of the op
COMPARISONS = {"lt": Lt, "le": Le, "gt": Gt, "ge": Ge, "eq": Eq, "ne": Ne}


@dataclass(frozen=True, eq=True)
class Where(Expr):
    """``a`` where ``c`` is nonzero, else ``b`` (torch.where)."""
    c: Expr
    a: Expr
    b: Expr

    def __str__(self) -> str:
        return f"where({self.c}, {self.a}, {self.b})"


@dataclass(frozen=True, eq=True)
class Apply(Expr):
    """An elementwise function (``functions.FUNCTIONS``) of ``a``; ``p``: its parameter."""
    fn: str
    a: Expr
    p: Optional[float] = None

    def __post_init__(self):
        f = function(self.fn)
        if f.parameter and self.p is None and f.default is None:
            raise ValueError(f"{self.fn} needs a parameter")

    def __str__(self) -> str:
        return f"{self.fn}({self.a}{'' if self.p is None else f', {self.p!r}'})"


@dataclass(frozen=True, eq=True)
class Neg(Expr):
    a: Expr

    def __str__(self) -> str:
        return f"-{_paren(self.a, Neg, always=True)}"


@dataclass(frozen=True, eq=True)
class Scalar(Expr):
    value: float

    def __str__(self) -> str:
        return repr(self.value)


def _paren(e: Expr, parent, always: bool = False) -> str:
    if isinstance(e, (Access, Scalar, Apply, Where)):
        return str(e)
    if isinstance(e, Mul) and parent in (Mul, Add, Sub, Neg) and not (always and parent is Neg):
        return str(e)
    if not always and isinstance(e, type(parent)) and parent in (Mul, Add):
        return str(e)
    return f"({e})"


def accesses(e: Expr) -> List[Access]:
    """Every access of ``e``, left to right."""
    if isinstance(e, Access):
        return [e]
    return [a for c in e.children() for a in accesses(c)]


@dataclass(frozen=True)
class Assignment:
    """``out(output) = reduce over the reduction variables of rhs``: ``reduce`` is ``"sum"``
    (einsum), or ``"max"`` / ``"min"`` over the *stored* entries (an unstored entry does not
    take part: the op layer adds torch's implicit zeros where a fiber has unstored ones, and
    ``torch.sparse.softmax`` wants exactly this; an empty fiber gives -inf / +inf).
    ``exact``: the kernel keeps the expression's order of operations (no ``-fassociative-
    math``): ``(x - m) - log(s)`` of a log-softmax, which regrouped as ``x - (m + log(s))``
    loses everything below the spacing of ``m`` (0.03 at 1e6 in float32)."""
    output: Tuple[str, ...]
    rhs: Expr
    reduce: str = "sum"
    exact: bool = False

    def __init__(self, output: Sequence[str], rhs: Expr, reduce: str = "sum", exact: bool = False):
        object.__setattr__(self, "output", tuple(output))
        object.__setattr__(self, "rhs", rhs)
        object.__setattr__(self, "reduce", reduce)
        object.__setattr__(self, "exact", bool(exact))
        if reduce not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduce!r}; expected one of {', '.join(REDUCTIONS)}")
        rhs_vars = rhs.vars()
        missing = [v for v in self.output if v not in rhs_vars]
        if missing:
            raise ValueError(f"output index {missing[0]!r} does not appear on the right-hand side")
        if len(set(self.output)) != len(self.output):
            raise ValueError(f"output indices {self.output} repeat an index")

    @property
    def reduction(self) -> Tuple[str, ...]:
        return tuple(v for v in self.rhs.vars() if v not in self.output)

    @property
    def all_vars(self) -> Tuple[str, ...]:
        return tuple(self.rhs.vars())

    def __str__(self) -> str:
        red = "".join(f"{self.reduce}_{v} " for v in self.reduction)
        return f"out({','.join(self.output)}) = {red}{self.rhs}"


#: reductions an Assignment may use
REDUCTIONS = ("sum", "max", "min")


# ---------------------------------------------------------------------------------------
# einsum parsing
# ---------------------------------------------------------------------------------------

def product(operand_indices: Sequence[Sequence[str]]) -> Expr:
    """``T0(..) * T1(..) * ...``: the right-hand side of an einsum over these operands."""
    if not operand_indices:
        raise ValueError("einsum(): must provide at least one operand")
    rhs: Expr = Access(0, operand_indices[0])
    for n in range(1, len(operand_indices)):
        rhs = Mul(rhs, Access(n, operand_indices[n]))
    return rhs


def label_sort_key(v: str):
    """torch's implicit-output order: ellipsis dims first, then A-Z, then a-z."""
    if v.startswith("_"):
        return (0, int(v[1:]))
    return (1, 0 if v.isupper() else 1, v)


@dataclass
class EinsumSpec:
    """A parsed equation: the assignment, each operand's (possibly repeated) indices, and
    the size of every index variable."""
    assignment: Assignment
    operand_indices: List[Tuple[str, ...]]
    sizes: Dict[str, int]
    broadcast: List[Tuple[int, ...]]  # per operand: dims of size 1 broadcast to a bigger size


def _split_term(term: str, ndim: int, opno: int, equation: str) -> Tuple[List[str], int]:
    if term.count("...") > 1 or ("." in term.replace("...", "")):
        raise ValueError(f"einsum(): invalid ellipsis in subscript {term!r} of {equation!r}")
    letters = [ch for ch in term.replace("...", "") ]
    for ch in letters:
        if not ch.isalpha() or not ch.isascii():
            raise ValueError(f"einsum(): invalid subscript {ch!r} in {equation!r}: subscripts must be letters [a-zA-Z]")
    if "..." in term:
        n_ell = ndim - len(letters)
        if n_ell < 0:
            raise ValueError(
                f"einsum(): the number of subscripts in the equation ({len(letters)}) is more than "
                f"the number of dimensions ({ndim}) for operand {opno}")
        before, after = term.split("...")
        return list(before) + ["..."] + list(after), n_ell
    if len(letters) != ndim:
        raise ValueError(
            f"einsum(): the number of subscripts in the equation ({len(letters)}) does not match "
            f"the number of dimensions ({ndim}) for operand {opno} and no ellipsis was given")
    return letters, 0


def parse_einsum(equation: str, shapes: Sequence[Sequence[int]]) -> EinsumSpec:
    """Parse ``equation`` for operands of the given shapes (torch.einsum's rules)."""
    eq = check_equation(equation).replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->", 1)
        explicit = True
    else:
        lhs, rhs, explicit = eq, "", False
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(
            f"einsum(): the equation {equation!r} has {len(terms)} operand subscripts but "
            f"{len(shapes)} operands were given")
    max_ell = 0
    split = []
    for n, (term, shape) in enumerate(zip(terms, shapes)):
        parts, n_ell = _split_term(term, len(shape), n, equation)
        split.append((parts, n_ell))
        max_ell = max(max_ell, n_ell)
    ell_names = [f"_{k}" for k in range(max_ell)]
    op_indices: List[Tuple[str, ...]] = []
    broadcast: List[Tuple[int, ...]] = []
    for n, ((parts, n_ell), shape) in enumerate(zip(split, shapes)):
        idx: List[str] = []
        for p in parts:
            if p == "...":
                idx.extend(ell_names[max_ell - n_ell:])
            else:
                idx.append(p)
        op_indices.append(tuple(idx))
    sizes = bind_sizes(op_indices, shapes)
    for n, (idx, shape) in enumerate(zip(op_indices, shapes)):
        broadcast.append(tuple(d for d, (v, s) in enumerate(zip(idx, shape))
                               if int(s) == 1 and sizes[v] != 1))
    counts: Dict[str, int] = {}
    for idx in op_indices:
        for v in idx:
            counts[v] = counts.get(v, 0) + 1
    if explicit:
        out_parts, _ = (list(rhs.replace("...", "")), 0)
        for ch in out_parts:
            if not ch.isalpha():
                raise ValueError(f"einsum(): invalid output subscript {ch!r} in {equation!r}")
        before, _, after = rhs.partition("...")
        if "..." in rhs:
            out = list(before) + ell_names + list(after)
        else:
            if max_ell and any(v in counts for v in ell_names):
                pass  # ellipsis dims not in the output are summed (torch does the same)
            out = list(rhs)
        for v in out:
            if v not in counts:
                raise ValueError(
                    f"einsum(): output subscript {v} does not appear in the equation for any input operand")
        if len(set(out)) != len(out):
            raise ValueError(f"einsum(): output subscript appears more than once in {equation!r}")
    else:
        out = ell_names + sorted((v for v in counts if counts[v] == 1 and not v.startswith("_")),
                                 key=label_sort_key)
    return EinsumSpec(Assignment(out, product(op_indices)), op_indices, sizes, broadcast)
