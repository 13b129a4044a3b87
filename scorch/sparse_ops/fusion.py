"""Eager fusion across operator calls: ``A * B + A`` on sparse tensors runs ONE kernel.

``A * B + A`` is two calls, ``__mul__`` then ``__add__``. Deferring the product until it is
consumed is wrong in general: ``A`` or ``B`` could be changed in place in between, and a copy
to pin them costs what fusion saves. So a result is deferred only where nothing can run in
between: the caller's bytecode, read from its current instruction, shows that the very next
thing the interpreter does with the result is another arithmetic operator (only loads of
locals, globals and constants come first, and the loaded values are numbers or operands the
pending result already has, whose operators change nothing). The result is then returned *pending*: a SparseTensor with
shape and dtype but no storage, holding its operands and its expression. The next
elementwise op, finding a pending operand, inlines its expression and runs one kernel (or
defers again, for a chain such as ``A * B * 0.5 + A``; a number ``*`` of a pending operand
skips SparseTensor's stored-values fast path to reach it). Anything else that touches a
pending tensor reads its ``_storage``, and ``SparseTensor.__getattr__`` computes it there
(``materialize``): repr, values(), to_dense, pickling, other ops, torch.compile's flattening.

Deferred only where it pays: every value the window loads before the consuming operator is
already an operand of the pending expression (``A * B + A``) or a number
(``A * B * 0.5 + A``), so the fused kernel merges no more sparse iterators than the eager
ones and saves a whole pass (``A * B * 0.5`` alone is not deferred: the number runs on the
product's stored values, as eager); or the pending expression is a product (``is_product``),
its consumer a ``+`` or ``-`` and the new operand a SparseTensor (``A * B + C``, ``A * B - C``,
``A * B + C * D``): the
kernel runs the product as one stream of matches (the intersection of A and B) merged with
C's entries (``merge_lattice.conjunct_groups``, ``lower/loops._stream_merge``): the eager
order inside one kernel, measured at least as fast as the two kernels
(``benchmarks/report_ops_overhead.py --fusion``, docs/ops.md "Fusing across calls"). A new
operand after a sum (``A + B + C``) is not deferred: the fused kernel would be a three-way
union, whose steps cost more than the two two-way merges of the eager form; nor one
multiplied in (``A * B * C``: a three-way intersection measured 0.5-0.9x of the eager two).
``set_eager_fusion(True, new_operands=True)`` defers there too (the mechanism's tests).

On by default; ``set_eager_fusion(False)`` or ``SCORCH_EAGER_FUSION=0`` (or false/off/no) turns
it off.

Never deferred: under autograd (an operand requires grad), under torch.compile, under a
TorchFunctionMode or a trace function, from inside torch or scorch, for a call that is not
an operator (``torch.add(A, B)``), for bool values, and for operands of different shapes or
dtypes (broadcasting and type promotion stay eager, so the fused kernel computes exactly
what the two eager kernels compute). A number operand (or a 0-d tensor of the dtype, as
``/ 2`` passes its reciprocal) is a 0-d kernel argument, as in the eager kernel.
"""
from __future__ import annotations

import builtins
import dis
import sys
from typing import Dict, List, Optional, Tuple

import torch

from ..tensor_compiler.build import env_flag
from ..tensor_type import PENDING_LIVE, SparseTensor, make_pending, with_values
from .einsum import _compiler

__all__ = ["Pending", "pending_of", "fused", "register_dispatch_frames", "kernel_tree",
           "is_product", "set_eager_fusion", "eager_fusion_enabled"]

_LETTERS = "ijklmnopqrstuvwxyzabcdefgh"
#: most distinct operands one fused kernel takes (up to three merge as lattice points)
MAX_TERMS = 6

# An expression tree: an int is an operand (its position in the term list); a tuple is
# (op, child, ...) with op one of "add", "sub", "mul", "neg". A term is a SparseTensor of
# the result's shape and dtype, or a number (a Python number, or a 0-d dense tensor of the
# dtype), passed to the kernel as a 0-d operand.
Tree = object


class Pending:
    """A deferred elementwise result: its operands (concrete SparseTensors of one shape and
    dtype, and numbers) and its expression tree over them."""

    __slots__ = ("terms", "tree", "live")

    def __init__(self, terms: Tuple[SparseTensor, ...], tree: Tree) -> None:
        self.terms = terms
        self.tree = tree
        self.live = True
        PENDING_LIVE[0] += 1

    def release(self) -> None:
        """Computed or inlined into another expression: no longer looked for."""
        if self.live:
            self.live = False
            PENDING_LIVE[0] -= 1

    def materialize(self):
        """The Storage of the result: the one kernel of the whole expression."""
        self.release()
        return run_tree(self.tree, self.terms)._storage


def pending_of(x) -> Optional[Pending]:
    """The Pending of a deferred SparseTensor, else None (at once while none is live)."""
    if not PENDING_LIVE[0] or type(x) is not SparseTensor:
        return None
    return x.__dict__.get("_pending")


# --- the kernel of a tree ----------------------------------------------------------------

_ASSIGNMENTS: Dict[tuple, object] = {}   # (rank, tree) -> Assignment (compute's warm key)


def _expr(tree: Tree, accesses):
    if isinstance(tree, int):
        return accesses[tree]
    op = tree[0]
    if op == "neg":
        return -_expr(tree[1], accesses)
    a, b = _expr(tree[1], accesses), _expr(tree[2], accesses)
    return a + b if op == "add" else a - b if op == "sub" else a * b


def _assignment(rank: int, scalars: tuple, tree: Tree):
    """``scalars``: per term, whether it is a 0-d operand (indexed by nothing)."""
    key = (rank, scalars, tree)
    asg = _ASSIGNMENTS.get(key)
    if asg is None:
        ir = _compiler().index_notation
        v = _LETTERS[:rank]
        accesses = [ir.Access(k, "" if s else v) for k, s in enumerate(scalars)]
        if len(_ASSIGNMENTS) > 1024:
            _ASSIGNMENTS.clear()
        asg = _ASSIGNMENTS[key] = ir.Assignment(v, _expr(tree, accesses))
    return asg


def run_tree(tree: Tree, terms) -> torch.Tensor:
    """ONE kernel computing ``tree`` over ``terms`` (SparseTensors of one shape and dtype,
    0-d tensors); sparse unless a number is added to the product (then dense, as eager)."""
    scalars = tuple(type(t) is not SparseTensor for t in terms)
    first = next(t for t in terms if type(t) is SparseTensor)
    out = _compiler().compute(
        _assignment(len(first.shape), scalars, tree),
        *[t._storage if not s else t if type(t) is torch.Tensor
          else torch.tensor(t, dtype=first.dtype) for t, s in zip(terms, scalars)])
    return out if isinstance(out, torch.Tensor) else SparseTensor(out)


def kernel_tree(op: str, operands) -> Optional[Tuple[Tree, tuple]]:
    """The tree and distinct terms of ``op(*operands)`` with pending operands inlined, or
    None where it must not fuse (then every pending operand is materialized, so nothing
    else ever sees one)."""
    first = next(x for x in operands if type(x) is SparseTensor)   # a pending one is
    shape, dtype = first.shape, first.dtype
    ok = dtype != torch.bool and not (torch.is_grad_enabled()
                                      and torch._C._any_requires_grad(*operands))
    for x in operands:
        if type(x) is SparseTensor:
            ok = ok and x.shape == shape and x.dtype == dtype
        else:
            ok = ok and _scalar_keeps(x, dtype)
    terms: List[object] = []
    trees = []
    if ok:
        for x in operands:
            p = pending_of(x)
            if p is None and type(x) is not SparseTensor:   # a number: a 0-d argument
                terms.append(x)
                trees.append(len(terms) - 1)
            elif p is None:
                trees.append(_term(terms, x))
            else:
                mapping = [_term(terms, t) for t in p.terms]
                trees.append(_renumber(p.tree, mapping))
                p.release()
        ok = len(terms) <= MAX_TERMS
    if not ok:
        for x in operands:
            if pending_of(x) is not None:
                x._storage   # noqa: B018  (materializes it, before anything else reads it)
        return None
    return (op, *trees), tuple(terms)


def _scalar_keeps(x, dtype: torch.dtype) -> bool:
    """Whether ``x`` is a number (or a 0-d dense tensor of ``dtype``) that leaves a floating or
    complex ``dtype`` as it is: the eager kernel takes it as a 0-d operand of that dtype."""
    if type(x) is torch.Tensor:
        return x.dim() == 0 and x.dtype == dtype
    if type(x) in (int, float, bool):
        return dtype.is_floating_point or dtype.is_complex
    return type(x) is complex and dtype.is_complex


def _term(terms: list, x) -> int:
    for k, t in enumerate(terms):
        if t is x:
            return k
    terms.append(x)
    return len(terms) - 1


def _renumber(tree: Tree, mapping) -> Tree:
    if isinstance(tree, int):
        return mapping[tree]
    return (tree[0], *[_renumber(c, mapping) for c in tree[1:]])


def fused(op: str, *operands) -> Optional[SparseTensor]:
    """``op(*operands)`` as one kernel, inlining pending operands, and itself pending when
    the caller is about to hand it to the next operator; None where it does not fuse (the
    caller runs the op as usual on the now materialized operands)."""
    if op == "mul" and type(operands[0]) is not type(operands[1]):
        scaled = _scaled_at_the_end(*operands)
        if scaled is not None:
            return scaled
    found = kernel_tree(op, operands)
    if found is None:
        return None
    tree, terms = found
    if consumer_follows(terms, product=is_product(tree)) and not _adds_number(tree, terms):
        first = next(t for t in terms if type(t) is SparseTensor)
        return make_pending(first.shape, first.dtype, Pending(terms, tree))
    return run_tree(tree, terms)


def _scaled_at_the_end(a, b) -> Optional[SparseTensor]:
    """``pending * number`` ending the expression: the pending kernel, then the number on its
    stored values, as eager ``A * B * 0.5`` does (a kernel reading the number at every entry
    measured slower than the two); None where the expression goes on (or it is no number)."""
    t, number = (a, b) if type(a) is SparseTensor else (b, a)
    p = pending_of(t)
    if (p is None or not _scalar_keeps(number, t.dtype)
            or consumer_follows(p.terms, product=is_product(p.tree))):
        return None
    return with_values(t, t._storage.values * number)


def is_product(tree: Tree) -> bool:
    """Whether the tree is a product (of operands, numbers and negations): stored only
    where all its tensor operands are, so a new operand added to it merges as one stream
    (``merge_lattice.conjunct_groups``)."""
    return isinstance(tree, int) or (tree[0] in ("mul", "neg")
                                     and all(is_product(c) for c in tree[1:]))


def _adds_number(tree: Tree, terms) -> bool:
    """Whether the tree adds a number somewhere (``A * B + 2``): a dense result, which a
    pending SparseTensor cannot stand for."""
    if isinstance(tree, int):
        return False
    if tree[0] in ("add", "sub") and any(
            isinstance(c, int) and type(terms[c]) is not SparseTensor for c in tree[1:]):
        return True
    return any(_adds_number(c, terms) for c in tree[1:])


# --- is the result handed straight to the next operator? ----------------------------------

_ENABLED = [env_flag("SCORCH_EAGER_FUSION")]
_NEW_OPERANDS = [False]    # defer also where a non-product meets a new tensor operand
#: operands with fewer stored entries (both together) are never deferred: reading the
#: caller's bytecode costs ~2 us, more than fusion saves on a few thousand entries (a
#: 200 x 200 matrix, 2,000 entries: ``A * B + A`` 66 us as two kernels, 70 us deferred;
#: from ~90,000 entries it is 1.4-1.8x faster, docs/ops.md)
MIN_ENTRIES = [16384]


def set_eager_fusion(enabled: bool, new_operands: bool = False) -> None:
    """Turn deferral of operator results (one kernel for ``A * B + A``, ``A * B * 0.5``,
    ``A * B + C``) on or off; ``new_operands``: defer also where a result that is not a
    product meets a new tensor operand (``A + B + C``: a three-way union, not faster)."""
    _ENABLED[0] = bool(enabled)
    _NEW_OPERANDS[0] = bool(new_operands)


def eager_fusion_enabled() -> bool:
    return _ENABLED[0]


#: the bytecode read here: 3.11-3.13 (``BINARY_OP``, ``f_lasti`` in bytes); elsewhere nothing
#: is deferred
_SUPPORTED = (3, 11) <= sys.version_info[:2] <= (3, 13)
_LOADS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_CONST", "LOAD_NAME", "LOAD_GLOBAL",
          "LOAD_DEREF"}
_SKIP = {"NOP", "CACHE"}
_WINDOW = 24                       # instructions looked at after the current one
#: the values whose operators change nothing and call no user code
_NUMBERS = {int, float, bool, complex}
_PLAIN = {SparseTensor, torch.Tensor, torch.nn.Parameter, *_NUMBERS}

_DISPATCH_CODES: set = set()       # scorch's frames between the operator and fused()
_OPERATOR_CODES: set = set()       # SparseTensor's operator methods
_OPERATOR_DUNDERS: set = set()     # torch.Tensor operators reaching __torch_function__
_TORCH_FUNCTION: list = [None]     # SparseTensor.__torch_function__'s code
_is_compiling = torch.compiler.is_compiling
_function_modes = torch._C._len_torch_function_stack


def register_dispatch_frames(functions, operators=(), dunders=()) -> None:
    """Frames that only dispatch (skipped on the way up to the caller), the operator methods
    the interpreter calls for ``*``/``+``/``-``, and the torch dunders that reach them."""
    _DISPATCH_CODES.update(_code(f) for f in (*functions, *operators))
    _OPERATOR_CODES.update(_code(f) for f in operators)
    _OPERATOR_DUNDERS.update(dunders)


def _code(f):
    return getattr(f, "__func__", f).__code__


_DISPATCH_CODES.update(_code(f) for f in (fused, _scaled_at_the_end,
                                           SparseTensor.__torch_function__))
_TORCH_FUNCTION[0] = _code(SparseTensor.__torch_function__)

#: (code, offset) -> None (never deferred) or (the loads to check, whether the consumer is a
#: ``*`` or ``/`` that ends the expression, whether it is a ``+`` or ``-``)
_PLANS: Dict[tuple, Optional[tuple]] = {}


def consumer_follows(terms, entries: Optional[int] = None, product: bool = False) -> bool:
    """Whether the user's frame that called this operator will hand its result (over
    ``terms``) straight to another arithmetic operator, with nothing else run in between,
    and only operands it already has or numbers loaded on the way (fusion pays).
    ``entries``: the operands' stored entries where the caller has them at hand (it runs on
    every sparse elementwise operator: reading them again costs ~0.5 us). ``product``: the
    result is a product (``is_product``), so a new SparseTensor operand may follow where the
    consumer is a ``+`` or ``-`` (a sum of products: one stream per product)."""
    if (not _ENABLED[0] or not _SUPPORTED or _is_compiling() or sys.gettrace() is not None
            or (_stored_entries(terms) if entries is None else entries) < MIN_ENTRIES[0]
            or _function_modes()):
        return False     # a debugger or a TorchFunctionMode could run code in between
    f = sys._getframe(1)
    entry = None
    while f is not None and f.f_code in _DISPATCH_CODES:
        entry, f = f, f.f_back
    if f is None or entry is None:
        return False
    if entry.f_code not in _OPERATOR_CODES and not (
            entry.f_code is _TORCH_FUNCTION[0]
            and entry.f_locals.get("func") in _OPERATOR_DUNDERS):
        return False       # a call (torch.add(A, B)), not an operator
    if f.f_globals.get("__name__", "").startswith(("scorch.", "torch.")):
        return False       # arithmetic inside torch or scorch: not the user's expression
    key = (f.f_code, f.f_lasti)
    try:
        plan = _PLANS[key]
    except KeyError:
        if len(_PLANS) > 4096:
            _PLANS.clear()
        plan = _PLANS[key] = _plan(f.f_code, f.f_lasti)
    if plan is None:
        return False
    loads, scales_at_the_end, sums = plan
    if scales_at_the_end and _all_numbers(f, loads):
        return False       # ``A * B * 0.5`` alone: the number on the product's stored values
    return not loads or _all_known(f, loads, terms, product and sums)


def _stored_entries(terms) -> int:
    """The stored entries of the operator's sparse operands: concrete ones (a pending
    operand is inlined into its consumer's terms before this is asked)."""
    return sum(t._storage.values.numel() for t in terms if isinstance(t, SparseTensor))


def _plan(code, offset: int) -> Optional[tuple]:
    found = _window(code, offset)
    if found is None:
        return None
    loads, consumer = found
    return loads, (consumer.opname == "BINARY_OP" and consumer.argrepr in ("*", "/")
                   and _window(code, consumer.offset) is None), (
        consumer.opname == "BINARY_OP" and consumer.argrepr in ("+", "-"))


_INSTRUCTIONS: Dict[object, tuple] = {}


def _instructions(code) -> tuple:
    found = _INSTRUCTIONS.get(code)
    if found is None:
        if len(_INSTRUCTIONS) > 1024:
            _INSTRUCTIONS.clear()
        listed = [i for i in dis.get_instructions(code) if i.opname not in _SKIP]
        found = _INSTRUCTIONS[code] = (listed, {i.offset: k for k, i in enumerate(listed)})
    return found


def _binary(ins) -> Optional[bool]:
    """None: not an arithmetic binary operator; else whether it is in place (``+=``)."""
    return ins.argrepr.endswith("=") if ins.opname == "BINARY_OP" else None


def _window(code, offset: int) -> Optional[tuple]:
    """The loads between the operator at ``offset`` and the operator that consumes its
    result, and that operator, when only loads and operators on other loaded values come
    between; else None.
    A stack count: the result is the bottom of ``stack``, an operator that pops it
    consumes it."""
    listed, at = _instructions(code)
    k = at.get(offset)
    if k is None or (_binary(listed[k]) is None and listed[k].opname != "UNARY_NEGATIVE"):
        return None
    stack = 1                    # ours, and what was pushed above it
    loads = []
    for ins in listed[k + 1:k + 1 + _WINDOW]:
        op = ins.opname
        if op in _LOADS:
            if op == "LOAD_GLOBAL" and ins.arg & 1:   # a NULL first: a call follows
                return None      # a call follows
            if op == "LOAD_CONST" and type(ins.argval) not in _PLAIN:
                return None
            if op != "LOAD_CONST":
                loads.append((op, ins.argval))
            stack += 1
        elif op == "LOAD_FAST_LOAD_FAST":
            loads.extend(("LOAD_FAST", name) for name in ins.argval)
            stack += 2
        elif op == "UNARY_NEGATIVE":
            if stack == 1:
                return tuple(loads), ins
        else:
            inplace = _binary(ins)
            if inplace is None:
                return None
            if stack == 2:
                return tuple(loads), ins   # pops ours (left) and a value loaded above
            if stack == 1:            # pops ours (right) and the value below it
                below = _below(listed, k)
                return None if below is None else (tuple(loads) + below, ins)
            if inplace:
                return None
            stack -= 1
    return None


def _stack_effect(ins) -> Optional[Tuple[int, int]]:
    """(popped, pushed) of a side-effect-free load or an operator, else None."""
    op = ins.opname
    if op in _LOADS:
        if op == "LOAD_GLOBAL" and ins.arg & 1:
            return None
        return 0, 1
    if op == "LOAD_FAST_LOAD_FAST":
        return 0, 2
    if op == "UNARY_NEGATIVE":
        return 1, 1
    inplace = _binary(ins)
    return None if inplace is None or inplace else (2, 1)


def _below(listed, k: int) -> Optional[tuple]:
    """The loads that computed the value below the operator's operands at ``k`` (the left
    operand of the operator consuming its result): only loads and operators on loaded
    values, in straight-line code; else None (it could be anything)."""
    need = _stack_effect(listed[k])[0] + 1   # our operands and the value below them
    loads = []
    i = k
    while need > 0:
        if getattr(listed[i], "is_jump_target", True):
            return None                    # reached from elsewhere too
        i -= 1
        if i < 0:
            return None
        ins = listed[i]
        effect = _stack_effect(ins)
        if effect is None or effect[1] > need:
            return None
        need += effect[0] - effect[1]
        if ins.opname == "LOAD_FAST_LOAD_FAST":
            loads.extend(("LOAD_FAST", name) for name in ins.argval)
        elif ins.opname == "LOAD_CONST":
            if type(ins.argval) not in _PLAIN:
                return None
        elif effect == (0, 1):
            loads.append((ins.opname, ins.argval))
    return tuple(loads)


_MISSING = object()


def _all_numbers(frame, loads) -> bool:
    return all(type(v) in _NUMBERS for v in _loaded(frame, loads))


def _all_known(frame, loads, terms, product: bool = False) -> bool:
    """Whether every loaded value is a number or one of ``terms`` (or, after a product, a
    SparseTensor; deferring for new operands too, any plain tensor): its operators run no
    user code that could change an operand of the pending result, and the fused kernel merges no more
    streams than the eager ones (a product is one stream)."""
    for v in _loaded(frame, loads):
        if type(v) not in _NUMBERS and not any(v is t for t in terms) and not (
                _NEW_OPERANDS[0] and type(v) in _PLAIN) and not (
                product and type(v) is SparseTensor):
            return False
    return True


def _loaded(frame, loads):
    """The values the loads read in ``frame`` (``_MISSING`` for an unbound name)."""
    f_locals = frame.f_locals
    f_globals = frame.f_globals
    for op, name in loads:
        if op == "LOAD_GLOBAL":
            v = f_globals.get(name, _MISSING)
        else:
            v = f_locals.get(name, _MISSING)
            if v is _MISSING and op == "LOAD_NAME":
                v = f_globals.get(name, _MISSING)
        if v is _MISSING:
            v = getattr(builtins, name, _MISSING) if op in ("LOAD_GLOBAL", "LOAD_NAME") else v
        yield v
