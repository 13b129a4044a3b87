"""Warm-call fast path: a straight-line Python function per (plan, index widths).

The general run path (``execute.run_general``) loops over the plan's accesses and
arguments, checks broadcasting, converts and casts. Once a kernel is loaded, the common
case (operands already in the formats, dtypes and layouts the kernel reads) needs none of
that, so we generate, once, a function that reads the sizes, checks them, collects the
``data_ptr()``/stride arguments in one list literal and calls the kernel. Anything
unexpected (a broadcast, a dtype or index width that differs, a transpose or conversion)
makes it return ``None`` and the caller takes the general path, which handles (or reports)
it. A dense operand streamed by the innermost loop with a stride other than 1 is re-laid
out here, as the general path would.

Where the kernel writes a preallocated dense output, or the values of a pattern output (an
SDDMM's, on S's pattern), and the C module is built, the same checks and arguments also go
into a ``fastcall.Plan`` (``scorch/_runtime/fastcall.cpp``) that does them on the
``at::Tensor`` and falls back to this function whenever it declines.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from .arguments import DATA, OUT, OUT_STRIDE, SIZE, STORAGE, STRIDE, arg_table, by_operand
from .allocate import EMPTY_NUMPY_MIN, empty_output
from .assemble import assemble, pattern_storage
from .codegen import reads_strided, short_rows_limit
from ..kept_conversions import reformatted
from .plans import storage_pointers, storage_signature
from .relayout import gather_pays, in_dimension_order, out_of_order, relayout, relayout_pays
from .schedule import dimension_permutation, pattern_suffix
from . import threads
from .tiling import choose_panel, gathers_cleared, panel_chooser, relaid_panel_narrower

__all__ = ["make_runner"]


def make_runner(entry, module, args, index_dtypes: Dict[int, torch.dtype], ops):
    """The warm-call function for ``entry``'s kernel, or None when the operands of this
    first call are not exactly what the kernel reads (then every call takes the general
    path). Sparse operands are recognized by their signature (``storage_signature``: same
    format, dtypes, size-1 dimensions, contiguity) and read through their cached
    addresses (``storage_pointers``)."""
    s = entry.schedule
    if entry.split is not None:
        return None
    nops = len(entry.operand_indices)
    by_tensor: Dict[int, List] = {}
    for ap in s.accesses:
        by_tensor.setdefault(ap.tensor, []).append(ap)
    # a reuse plan's transposes are kept across calls (``planner.reuse_entry``): the runner
    # reads each through its kept conversion, the same Storage while the values stay
    kept = {n: aps[0].format for n, aps in by_tensor.items() if any(ap.transposed for ap in aps)}
    if kept and (not entry.kept_transposes or any(len(by_tensor[n]) > 1 for n in kept)):
        return None
    relaid = set(entry.relayout) | set(entry.gather_relayout)
    if any(len(aps) > 1 and any(ap.id in relaid for ap in aps) for aps in by_tensor.values()):
        return None   # one dense tensor read twice (T(i,j) * T(j,i)), re-laid out for one read only
    vt = entry.value_dtype
    env = {"torch": torch, "VT": vt, "KERNEL": module.kernel, "THREADS": threads.threads_for,
           "ASSEMBLE": assemble, "ENTRY": entry, "PATTERN": pattern_storage, "PTRS": storage_pointers,
           "TEMPTY": torch.empty, "RELAYOUT": relayout, "EMPTY": empty_output,
           "PAYS": relayout_pays, "GPAYS": gather_pays, "NARROWER": relaid_panel_narrower,
           "OUT_OF_ORDER": out_of_order, "IN_DIMENSION_ORDER": in_dimension_order,
           "KEPT": reformatted, "SIG": storage_signature}
    sparse = set()
    for n, aps in by_tensor.items():
        if aps[0].sparse:
            x = ops[n] if n not in kept else reformatted(ops[n], kept[n])
            if (x.values.dtype != vt or x.index_dtype != index_dtypes[aps[0].id]
                    or x.format.block is not None or not x.values.is_contiguous()):
                return None
            env[f"S{n}"] = storage_signature(x)
            if n in kept:
                env[f"S{n}_SOURCE"] = storage_signature(ops[n])
            sparse.add(n)
    L: List[str] = []
    w = L.append
    w("def run(ops):")
    w(f"    if len(ops) != {nops}: return None")
    for n in range(nops):
        w(f"    x{n} = ops[{n}]")
        if n in kept:
            env[f"F{n}"] = kept[n]
            w(f"    if x{n}._sig != S{n}_SOURCE: return None")
            w(f"    x{n} = KEPT(x{n}, F{n})")
            w(f"    if SIG(x{n}) != S{n}: return None")
        elif n in sparse:
            w(f"    if x{n}._sig != S{n}: return None")
        if n in sparse:
            w(f"    p{n} = x{n}._ptrs")
            w(f"    if p{n} is None: p{n} = PTRS(x{n})")
        elif n in by_tensor:
            w(f"    if x{n}.dtype is not VT: return None")
    # sizes: first occurrence defines, the rest must agree exactly (broadcasts go slow)
    seen: Dict[str, str] = {}
    for n, idx in enumerate(entry.operand_indices):
        if not idx:
            continue
        w(f"    s{n} = x{n}.shape")
        if n not in sparse:
            w(f"    if len(s{n}) != {len(idx)}: return None")
        for d, v in enumerate(idx):
            if v not in seen:
                seen[v] = f"N{len(seen)}"
                w(f"    {seen[v]} = s{n}[{d}]")
            else:
                w(f"    if s{n}[{d}] != {seen[v]}: return None")
    strided = reads_strided(s)
    nnz = " + ".join(f"p{n}[-1]" for n in sorted(sparse)) or "0"   # the stored entries
    for i, (d, perm, inv) in entry.relayout.items():
        # a dense operand the innermost loop streams is read with stride 1: re-laid out
        # here when it is not (SDDMM's C), as the general path does; a kernel that can read
        # it strided does so where the copy would cost more (``relayout_pays``)
        ap = s.accesses[i]
        x = f"x{ap.tensor}"
        pays = ""
        if strided:
            pays = f" and PAYS({x}.numel(), ({nnz}) * {x}.shape[{d}])"
        w(f"    if {x}.stride({d}) != 1 and {x}.shape[{d}] > 1{pays}:")
        w(f"        {x} = RELAYOUT({x}, {tuple(perm)!r}, {tuple(inv)!r}, THREADS, {ap.id})")
        pairs = entry.order_relayout.get(i)
        if pairs:
            # ... and in loop order above it where a sparse loop separates its variables
            w(f"    elif OUT_OF_ORDER({x}, {pairs!r}) and PAYS({x}.numel(), {nnz}):")
            w(f"        {x} = RELAYOUT({x}, {tuple(perm)!r}, {tuple(inv)!r}, THREADS, {ap.id})")
    for i, (d, perm, inv) in entry.gather_relayout.items():
        # a dense operand gathered by a sparse loop: copied to loop order where that pays
        ap = s.accesses[i]
        x = f"x{ap.tensor}"
        narrower = ""
        if gathers_cleared(entry) is not None:
            sz = ", ".join(f"{v!r}: {seen[v]}" for v in s.loop_order)
            narrower = f" and NARROWER(ENTRY, {{{sz}}})"
        w(f"    if {x}.stride({d}) != 1 and {x}.shape[{d}] > 1{narrower} and GPAYS({x}.numel(), {nnz}, {x}.shape[{d}]):")
        w(f"        {x} = RELAYOUT({x}, {tuple(perm)!r}, {tuple(inv)!r}, THREADS, {ap.id})")
    work = " + ".join((f"p{n}[-1]" if n in sparse else f"x{n}.numel()")
                      for n in sorted(by_tensor)) or "0"
    w(f"    work = {work}")
    w(f"    nt = 1 if work < {threads.PARALLEL_MIN_WORK} else THREADS(work)")
    out = s.output
    if out.pattern >= 0:
        P = s.accesses[out.pattern].tensor
        for v in entry.assignment.reduction:
            w(f"    if {seen[v]} == 0: return None")
        block = "".join(f" * {seen[v]}" for v in pattern_suffix(s))   # dense levels under P's
        w(f"    out = EMPTY((p{P}[-1]{block},), VT)  # P's pattern, written by the kernel")
    if out.dense:
        # written (or zeroed) by the kernel; torch.empty with int sizes is the cheapest call
        # (~0.9 us, a tuple costs 0.5 us more), big outputs go through numpy (huge pages)
        dims = [seen[v] for v in out.memory_order]
        shape = ", ".join(dims)
        w(f"    if {' * '.join(dims) or '1'} < {EMPTY_NUMPY_MIN}:")
        w(f"        out = TEMPTY({shape + ', ' if dims else '(), '}dtype=VT)")
        w("    else:")
        w(f"        out = EMPTY(({shape}{',' if len(dims) == 1 else ''}), VT)")
    vals = []
    for kind, a, b in by_operand(arg_table(args, s), s):
        if kind == SIZE:
            vals.append(seen[a])
        elif kind == STORAGE:
            vals.append(f"p{a}[{b}]")
        elif kind == DATA:
            vals.append(f"x{a}.data_ptr()")
        elif kind == STRIDE:
            vals.append(" + ".join(f"x{a}.stride({d})" for d in b))
        elif kind == OUT:
            vals.append("out.data_ptr()")
        else:   # the output is fresh and contiguous: its strides follow from the sizes
            vals.append(" * ".join(seen[v] for v in b) or "1")
    panel = "0"
    rule = panel_chooser(entry)
    if rule is not None:
        # rows wider than the register kernel may run in panels (choose_panel), a cache
        # tile in cache-sized panels (choose_cache_panel)
        choose, first, threshold, rows_vars = rule
        env.update({"CHOOSE": choose, "WIDTHS": first})
        L_ = s.loop_order[-1]
        rows = " * ".join(seen[v] for v in rows_vars) or "1"
        widths = "WIDTHS"
        cleared = gathers_cleared(entry)
        if cleared is not None:
            # the gathered operands at stride 1 (re-laid out above): register tiles first
            env["WIDTHS_RELAID"] = first[:3] + (False,)
            unit = " and ".join(f"(x{s.accesses[a].tensor}.stride({d}) == 1 or x{s.accesses[a].tensor}.shape[{d}] <= 1)"
                                for a, d in cleared)
            widths = f"(WIDTHS_RELAID if {unit} else WIDTHS)"
        w(f"    panel = 0 if {seen[L_]} <= {threshold} else CHOOSE({widths}, {seen[L_]}, {nnz}, {rows})")
        panel = "panel"
    sr = entry.short_rows
    if sr is not None:
        # short rows run the scalar variant (codegen.short_rows), built on first need by
        # the general path
        env["SHORT"] = entry.short
        env["IKEY"] = tuple(index_dtypes.get(ap.id) if ap.sparse else None for ap in s.accesses)
        rows = " * ".join(seen[v] for v in sr[1]) or "1"
        w("    kern = KERNEL")
        w(f"    if p{s.accesses[sr[0]].tensor}[-1] <= {short_rows_limit(vt)} * {rows}:")
        w("        kern = SHORT.get(IKEY)")
        w("        if kern is None: return None")
        w("        kern = kern.kernel")
        w(f"    res = kern([{', '.join(vals)}], nt, {panel})")
    else:
        w(f"    res = KERNEL([{', '.join(vals)}], nt, {panel})")
    if out.dense and out.layout:
        # laid out in loop order (schedule.dense_layout): the result in dimension order
        w(f"    return IN_DIMENSION_ORDER(out, {dimension_permutation(out)!r}, THREADS)")
    elif out.dense:
        w("    return out")
    elif out.pattern >= 0:
        sizes = ", ".join(f"{v!r}: {seen[v]}" for v in s.loop_order)
        w(f"    return PATTERN(ENTRY, x{P}, out, {{{sizes}}})")
    else:
        sizes = ", ".join(f"{v!r}: {seen[v]}" for v in s.loop_order)
        w(f"    return ASSEMBLE(ENTRY, res, {{{sizes}}})")
    src = "\n".join(L) + "\n"
    exec(compile(src, f"<scorch runner {'_'.join(s.loop_order)}>", "exec"), env)
    run = env["run"]
    run.source = src
    plan = None if kept else _c_plan(entry, module, args, run, env, seen, sparse, by_tensor)
    return plan if plan is not None else run


def _c_plan(entry, module, args, fallback, env, seen, sparse, by_tensor):
    """The same checks and arguments as the Python runner above, as a C plan
    (``scorch/_runtime/fastcall.cpp``) that falls back to it; None where the kernel has no
    C entry (outputs assembled from appended entries) or the C module is unavailable. A
    pattern output (SDDMM's values on ``S``'s pattern) is finished by ``pattern_storage``
    (~2 us), which the C plan calls."""
    s = entry.schedule
    out = s.output
    if not (out.dense or out.pattern >= 0) or not hasattr(module, "KERNEL_C"):
        return None
    if out.layout:
        return None    # the C plan returns the output as allocated (in dimension order)
    if out.pattern >= 0 and pattern_suffix(s):
        return None    # the C plan sizes a pattern output by the pattern's values alone
    if any(idx and n not in by_tensor for n, idx in enumerate(entry.operand_indices)):
        return None
    from .fastcall import load
    fc = load()
    if fc is None:
        return None
    var = {v: int(name[1:]) for v, name in seen.items()}   # index variable -> N<k>
    vt = torch.empty(0, dtype=entry.value_dtype)
    operands = []
    for n in range(len(entry.operand_indices)):
        if n in sparse:
            operands.append((1, env[f"S{n}"], None, 0))
        elif n in by_tensor:
            operands.append((2, 0, vt, len(entry.operand_indices[n])))
        else:
            operands.append((0, 0, None, 0))
    dims = [(n, d, var[v]) for n, idx in enumerate(entry.operand_indices) for d, v in enumerate(idx)]
    # the C plan runs operands at stride 1 there only (else the Python runner re-lays out)
    unit = [(s.accesses[i].tensor, d) for i, (d, _, _) in list(entry.relayout.items()) + list(entry.gather_relayout.items())]
    # ... and declines operands nested against the loops (out_of_order: the runner copies)
    order = [(s.accesses[i].tensor, u, w) for i, pairs in sorted(entry.order_relayout.items()) for u, w in pairs]
    c_args = []
    for kind, a, b in by_operand(arg_table(args, s), s):
        if kind == SIZE:
            c_args.append((kind, var[a], 0))
        elif kind == STRIDE:
            c_args.append((kind, a, sum(1 << d for d in b)))
        elif kind == OUT_STRIDE:
            c_args.append((kind, 0, sum(1 << var[v] for v in b)))
        else:
            c_args.append((kind, a, b))
    spec = {"operands": operands, "dims": [x for t in dims for x in t],
            "unit": [x for t in unit for x in t], "order": [x for t in order for x in t], "args": c_args, "nvars": len(var),
            "min_work": threads.PARALLEL_MIN_WORK, "out_max": EMPTY_NUMPY_MIN, "out_dtype": vt,
            "out_vars": [var[v] for v in out.vars], "short": None, "panel": None, "pattern": None}
    if out.pattern >= 0:
        names = sorted(var, key=var.get)     # the C plan's variable numbering

        def finish(P, values, sizes):
            return pattern_storage(entry, P, values, dict(zip(names, sizes)))
        spec["pattern"] = (s.accesses[out.pattern].tensor, [var[v] for v in entry.assignment.reduction])
        spec["finish"] = finish
    short_getter = None
    if entry.short_rows is not None:
        acc, rows = entry.short_rows
        spec["short"] = (s.accesses[acc].tensor, [var[v] for v in rows],
                         short_rows_limit(entry.value_dtype))
        ikey = env["IKEY"]

        def short_getter():   # the variant is built by the general path on first need
            mod = entry.short.get(ikey)
            return None if mod is None else mod.KERNEL_C
    rule = panel_chooser(entry)
    choose, first = choose_panel, tuple(entry.panels or ())
    if rule is not None:
        choose, first, threshold, rows_vars = rule
        if gathers_cleared(entry) is not None:
            first = first[:3] + (False,)   # the gathered operands arrive at stride 1 here
        spec["panel"] = (var[s.loop_order[-1]], threshold, [var[v] for v in rows_vars])
    try:
        return fc.Plan(module.KERNEL_C, short_getter, fallback, threads.threads_for, choose,
                       first, storage_pointers, spec)
    except Exception:  # noqa: BLE001  (a spec the C plan cannot take: the Python runner)
        return None
