"""Warm-call fast path: a straight-line Python function per (plan, index widths).

The general run path (``scorch.tensor_compiler._run``) loops over the plan's accesses and
arguments, checks broadcasting, converts and casts. Once a kernel is loaded, the common
case (operands already in the formats, dtypes and layouts the kernel reads) needs none of
that, so we generate, once, a function that reads the sizes, checks them, collects the
``data_ptr()``/stride arguments in one list literal and calls the kernel. Anything
unexpected (a broadcast, a dtype or index width that differs, a dense operand whose
innermost stride is not 1, a transpose or conversion) makes it return ``None`` and the
caller takes the general path, which handles (or reports) it.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

__all__ = ["make_runner"]


def make_runner(entry, module, args, index_dtypes: Dict[int, torch.dtype], threads_for, assemble,
                pattern=None, empty=None):
    s = entry.schedule
    if entry.split is not None or any(ap.transposed for ap in s.accesses):
        return None
    nops = len(entry.operand_indices)
    by_tensor: Dict[int, List] = {}
    for ap in s.accesses:
        by_tensor.setdefault(ap.tensor, []).append(ap)
    from . import PARALLEL_MIN_WORK
    L: List[str] = []
    w = L.append
    w("def run(ops):")
    w(f"    if len(ops) != {nops}: return None")
    for n in range(nops):
        w(f"    x{n} = ops[{n}]")
    # sizes: first occurrence defines, the rest must agree exactly (broadcasts go slow)
    seen: Dict[str, str] = {}
    for n, idx in enumerate(entry.operand_indices):
        sparse = any(ap.sparse for ap in by_tensor.get(n, []))
        shape = f"x{n}.shape"
        if idx:
            w(f"    if len({shape}) != {len(idx)}: return None")
        for d, v in enumerate(idx):
            if v not in seen:
                seen[v] = f"N{len(seen)}"
                w(f"    {seen[v]} = {shape}[{d}]")
            else:
                w(f"    if {shape}[{d}] != {seen[v]}: return None")
        if sparse:
            aps = by_tensor[n]
            it = index_dtypes[aps[0].id]
            w(f"    if x{n}.values.dtype is not VT or x{n}.index_dtype is not IDT{n} "
              f"or x{n}.format.block is not None or not x{n}.values.is_contiguous(): return None")
            w(f"    lv{n} = x{n}.levels")
        elif n in by_tensor:
            w(f"    if x{n}.dtype is not VT: return None")
    for i, (d, _, _) in entry.relayout.items():
        ap = s.accesses[i]
        w(f"    if x{ap.tensor}.stride({d}) != 1 and x{ap.tensor}.shape[{d}] > 1: return None")
    work = " + ".join(
        (f"x{n}.values.numel()" if any(ap.sparse for ap in aps) else f"x{n}.numel()")
        for n, aps in sorted(by_tensor.items())) or "0"
    w(f"    work = {work}")
    w(f"    nt = 1 if work < {PARALLEL_MIN_WORK} else THREADS(work)")
    out = s.output
    if out.pattern >= 0:
        P = s.accesses[out.pattern].tensor
        for v in entry.assignment.reduction:
            w(f"    if {seen[v]} == 0: return None")
        w(f"    out = EMPTY((x{P}.values.numel(),), VT)  # P's pattern, written by the kernel")
    if out.dense:
        shape = ", ".join(seen[v] for v in out.vars)
        w(f"    out = EMPTY(({shape}{',' if len(out.vars) == 1 else ''}), VT)  # written (or zeroed) by the kernel")
    vals = []
    for _, _, what in args:
        tag = what[0]
        if tag == "size":
            vals.append(seen[what[1]])
        elif tag in ("pos", "crd"):
            ap = s.accesses[what[1]]
            vals.append(f"lv{ap.tensor}[{what[2]}].{tag}.data_ptr()")
        elif tag == "vals":
            ap = s.accesses[what[1]]
            vals.append(f"x{ap.tensor}.values.data_ptr()" if ap.sparse else f"x{ap.tensor}.data_ptr()")
        elif tag == "stride":
            ap = s.accesses[what[1]]
            dims = [d for d, v in enumerate(ap.indices) if v == what[2]]
            vals.append(" + ".join(f"x{ap.tensor}.stride({d})" for d in dims))
        elif tag == "out":
            vals.append("out.data_ptr()")
        elif tag == "ostride":
            vals.append(f"out.stride({out.vars.index(what[1])})")
    w(f"    res = KERNEL([{', '.join(vals)}], nt)")
    if out.dense:
        w("    return out")
    elif out.pattern >= 0:
        sizes = ", ".join(f"{v!r}: {seen[v]}" for v in s.loop_order)
        w(f"    return PATTERN(ENTRY, x{P}, out, {{{sizes}}})")
    else:
        sizes = ", ".join(f"{v!r}: {seen[v]}" for v in s.loop_order)
        w(f"    return ASSEMBLE(ENTRY, res, {{{sizes}}})")
    src = "\n".join(L) + "\n"
    env = {"torch": torch, "VT": entry.value_dtype, "KERNEL": module.kernel, "THREADS": threads_for,
           "ASSEMBLE": assemble, "ENTRY": entry, "PATTERN": pattern,
           "EMPTY": empty if empty is not None else (lambda shape, dt: torch.empty(shape, dtype=dt))}
    for n, aps in by_tensor.items():
        if aps[0].sparse:
            env[f"IDT{n}"] = index_dtypes[aps[0].id]
    exec(compile(src, f"<scorch runner {'_'.join(s.loop_order)}>", "exec"), env)
    run = env["run"]
    run.source = src
    return run
