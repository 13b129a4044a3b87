"""How ``torch.compile`` (Dynamo) treats scorch's own Python code.

Scorch's op layer and compiler are Python around generated C kernels: plan caches, kernel
builds, level arrays read as Python objects. Dynamo cannot put that in a graph, and tracing
into it costs seconds and ends in errors. So every scorch function is an *opaque eager call*
to Dynamo: it does not inline it (a graph break around the call) and, when the call runs
eagerly, no frame below it is compiled either. Eager code pays nothing for this: both marks
are read only while a compile is running.

The exceptions are the functions that route a call to the registered operators
(``scorch.library_ops``): they carry ``_torchdynamo_inline``, the function Dynamo traces in
their place, so the call stays inside the graph.

This module imports no other scorch module (it walks ``sys.modules``) and does not import
``torch._dynamo`` (1.7 s): the marks are a function attribute and a per-code-object flag of
torch's C extension.
"""
from __future__ import annotations

import sys
import types
from typing import Callable, Iterable

try:
    from torch._C._dynamo.eval_frame import (_FrameAction, _FrameExecStrategy,
                                             set_code_exec_strategy)
    _SKIP_RECURSIVELY = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
except ImportError:       # a torch without Dynamo's frame strategies: nothing to mark
    set_code_exec_strategy = None

__all__ = ["opaque_to_dynamo", "trace_instead", "script_as_builtin", "mark_package"]


def opaque_to_dynamo(fn: Callable) -> Callable:
    """Dynamo runs ``fn`` eagerly: it graph-breaks at the call instead of inlining it, and
    compiles no frame ``fn`` calls (scorch's internals, and any callback scorch calls)."""
    code = getattr(fn, "__code__", None)
    if code is None or set_code_exec_strategy is None or getattr(fn, "_scorch_traced", False):
        return fn
    set_code_exec_strategy(code, _SKIP_RECURSIVELY)
    if "_torchdynamo_inline" not in getattr(fn, "__dict__", {}):
        fn._torchdynamo_disable = True
    return fn


def trace_instead(fn: Callable, traced: Callable) -> None:
    """Dynamo traces ``traced`` where user code calls ``fn`` (eager calls still run ``fn``);
    ``fn`` stays skipped when it runs eagerly (after a graph break elsewhere)."""
    fn._torchdynamo_inline = traced
    fn.__dict__.pop("_torchdynamo_disable", None)
    traced._scorch_traced = True    # mark_package leaves it traceable


def script_as_builtin(fn: Callable, op: str) -> None:
    """``torch.jit.script`` compiles a call to ``fn`` as the ATen builtin ``op``
    (``"aten::einsum"``), as it does torch's own function: it cannot compile scorch's Python
    wrapper (``*args``, keyword-only arguments), and scripted code needs no sparse path (a
    SparseTensor reaching a scripted function is refused below torch's dispatch)."""
    try:
        from torch.jit._builtins import _register_builtin
    except ImportError:      # a torch without the table: scripting fn fails as it did
        return
    _register_builtin(fn, op)


def _functions_of(obj) -> Iterable[Callable]:
    """The Python functions a module or class defines (methods, static and class methods,
    property accessors)."""
    for value in list(vars(obj).values()):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            yield from (f for f in (value.fget, value.fset, value.fdel) if f is not None)
        elif isinstance(value, types.FunctionType):
            yield value


def mark_package(package: str) -> int:
    """``opaque_to_dynamo`` on every function and method defined in the loaded modules of
    ``package``; returns how many were marked."""
    count = 0
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(prefix)):
            continue
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != name:
                continue
            targets = _functions_of(value) if isinstance(value, type) else (
                [value] if isinstance(value, types.FunctionType) else [])
            for fn in targets:
                opaque_to_dynamo(fn)
                count += 1
    return count
