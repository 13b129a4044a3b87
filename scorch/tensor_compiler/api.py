"""The compiler's entry points: ``einsum``, ``compute`` (an index-notation assignment such as
``A - 0.5 * B``) and ``explain`` (the plan, nothing run). Dense tensors are results as torch
tensors, sparse results are Storages; the tensor layer above wraps them.

A call binds its operands (``operands``), finds or makes the plan (``planner``, cached in
``plans``) and runs it (``execute``); a warm ``einsum`` is first tried whole in C
(``fastcall``)."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..formats import Format, as_format
from ..level_storage import Storage
from .codegen import kernel_source
from .lower import lower_kernel
from .execute import gathered_relayout, ordered_relayout, run, stored_entries, strided_reads
from .frontend import bind_sizes, check_equation
from .index_notation import Assignment, accesses, parse_einsum
from .operands import as_operand
from .relayout import relayout_pays
from .shared_pattern import values_plan
from . import threads
from .tiling import relaid_panel_narrower
from .planner import (block_key, broadcast_key, einsum_entry, make_entry, resolve_out_format,
                      unit_mask)
from .plans import (COMPILER_VERSION, UNORDERED_SIGNATURES, Plan, _fast, _plans, _stats, cached_entry,
                    storage_signature)

__all__ = ["einsum", "einsum_declined", "compute", "explain", "plan_cache_info",
           "plan_cache_clear", "set_sparse_tensor_type"]

_STRIDED = torch.strided
#: ``_PROFILER._is_profiler_enabled``: a profiler runs (torch's flag, a module attribute)
_PROFILER = torch.autograd.profiler
_ANY_REQUIRES_GRAD = torch._C._any_requires_grad
_SPARSE_TENSOR: list = [None]   # the user-facing tensor type (set_sparse_tensor_type)


def set_sparse_tensor_type(cls) -> None:
    """The tensor type whose instances carry a ``_storage`` (``scorch.SparseTensor``): the warm
    path recognizes it by identity. Set by the layer above; the compiler imports no tensor
    type. A warm-call module loaded before (a first call straight into the compiler) learns
    it too: configured without it, it would decline every SparseTensor operand for good."""
    _SPARSE_TENSOR[0] = cls
    if _DISPATCH[1] is not None:
        _DISPATCH[1].configure(Storage, cls)


def plan_cache_info() -> dict:
    info = {"plans": len(_plans), **_stats}
    if _DISPATCH[0] is not None and _DISPATCH[1] is not None:   # warm calls served in C
        info["plan_hits"] += _DISPATCH[1].hits()
    return info


def plan_cache_clear() -> None:
    _plans.clear()
    _fast.clear()
    _EXPR_FAST.clear()


threads.on_thread_count_change(plan_cache_clear)   # plans are priced for a thread count


_DISPATCH: list = [None, None]   # fastcall.dispatch and its module, once loaded (see einsum)


def _load_dispatch() -> None:
    """Point ``einsum``'s first step at the C warm-call lookup (``fastcall.dispatch``), or at
    a stand-in that always declines where the C module is unavailable."""
    from .fastcall import load
    fc = load()
    if fc is None:
        _DISPATCH[:] = [lambda table, equation, operands: NotImplemented, None]
        return
    fc.configure(Storage, _SPARSE_TENSOR[0])
    _DISPATCH[:] = [threads.checked(fc.dispatch), fc]   # a changed thread count noticed before the lookup


def _not_recorded(entry: str, operands, any_operand: bool) -> None:
    """No silent detach: the compiler's entry points record no autograd graph, so an
    operand that requires grad (in grad mode) is an error pointing at the differentiable
    entries. Called only when one does (the warm call tests that alone, in one C call).
    ``any_operand=False``: only with a sparse operand (dense-only einsum is torch.einsum,
    graph intact)."""
    if torch.is_grad_enabled() and (
            any_operand or not all(type(x) is torch.Tensor and x.layout is _STRIDED for x in operands)):
        raise RuntimeError(
            f"scorch.tensor_compiler.{entry}() records no autograd graph and an operand requires "
            f"grad; use the differentiable scorch.einsum / scorch.gradients.compute, or call it "
            f"under torch.no_grad()")


def einsum(equation: str, *operands, out_format=None, sorted: bool = True):
    """``torch.einsum`` over dense tensors, Storages and SparseTensors (anything with a
    ``._storage``) in any format. Dense operands only and no ``out_format``: exactly
    ``torch.einsum``. Returns a dense tensor or a Storage (sparse result), whose coordinates
    are sorted and unique within every fiber (a CSR result is canonical), so it feeds any
    further kernel or conversion as it is. ``sorted=False`` lets a workspace-built result
    (SpGEMM) keep each fiber's coordinates unique but in any order, as scipy does: its last
    level is marked unordered (``Level.ordered``) and sorted by whatever needs order."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if _ANY_REQUIRES_GRAD(*operands):
        _not_recorded("einsum", operands, out_format is not None)
    check_equation(equation)
    if out_format is None and sorted and _DISPATCH[0] is not None and not _PROFILER._is_profiler_enabled:
        # the warm call in C: plan lookup, checks, output and kernel in one step
        r = _DISPATCH[0](_fast, equation, operands)
        if r is not NotImplemented:
            return r
    try:
        return einsum_declined(equation, operands, out_format, sorted)
    except RuntimeError as e:   # inside a functorch transform: say so (the error path only)
        from ..tensor_type import _refuse_under_functorch
        _refuse_under_functorch(e, operands)
        raise


def einsum_declined(equation: str, operands: tuple, out_format=None, sorted: bool = True,
                    plan_only: bool = False):
    """``einsum`` after the C warm call declined (or was not tried): the Python path.
    ``scorch.einsum`` tries the C call itself and continues here. ``plan_only``
    (``explain``): the plan entry and the operands as prepared for it, nothing run (None
    where torch.einsum would run), so what ``explain`` shows is what runs."""
    # the warm path: one pass builds the operands and the plan key (ints for storages,
    # dtype and rank for dense tensors; the two kinds never compare equal)
    ops = []
    key = [equation, out_format] if sorted else [equation, out_format, "unsorted"]
    sparse = False
    elsewhere = None   # a dense operand on another device (fine for torch.einsum alone)
    for n, x in enumerate(operands):
        tx = type(x)
        if tx is Storage:
            st = x
        elif tx is _SPARSE_TENSOR[0]:
            st = x._storage
        elif (tx is torch.Tensor and x.layout is _STRIDED and not x.requires_grad and x.is_cpu
              and not x._is_zerotensor() and not x.is_neg() and not x.is_conj()):
            st = x
        elif isinstance(x, torch.Tensor) and x.layout is _STRIDED and not x.is_cpu:
            st = x
            elsewhere = n
        else:
            st = as_operand(x, n)
        if type(st) is Storage:
            sparse = True
            st, sig = _sorted_operand(st)
            ops.append(st)
            key.append(sig)
        else:
            ops.append(st)
            key.append(st.dtype)
            key.append(st.dim())
    if out_format is None and not sparse:
        if plan_only:
            return None
        return torch.einsum(check_equation(equation), *operands)   # the caller's tensors: autograd intact
    # a dense operand's size-1 extents (that may broadcast) are part of the plan: read only
    # here, past the dense-only return (under torch.jit.trace a shape test warns, 24 times
    # for a 4-d einsum); the key is then rebuilt, as it is from the operands read
    # (COO read compressed)
    stretched = False
    for st in ops:            # (a loop: ``any`` of a generator costs ~0.3 us more)
        if type(st) is not Storage and 1 in st.shape:
            stretched = True
            break
    converted = _products_read_compressed(equation, ops)
    if converted is not ops or stretched:
        ops = converted
        if stretched:
            equation, ops = squeeze_dense_broadcasts(equation, ops)
        key = [equation, out_format] if sorted else [equation, out_format, "unsorted"]
        for st in ops:
            if type(st) is Storage:
                key.append(st._sig if st._sig is not None else storage_signature(st))
            else:
                key.append(st.dtype)
                key.append(st.dim() | unit_mask(st) << 8)
    if elsewhere is not None:
        raise ValueError(f"einsum(): operand {elsewhere} is on device "
                         f"{operands[elsewhere].device}; scorch kernels run on CPU tensors "
                         f"(move it with .cpu())")
    if _DISPATCH[0] is None:
        _load_dispatch()
    check_equation(equation)
    for st in ops:
        if type(st) is Storage and 1 in st.shape:
            # whether a size-1 dimension broadcasts is part of the plan
            key.append(broadcast_key(equation, ops))
            break
    for st in ops:
        if type(st) is not Storage and st.dim() >= 3:
            # the re-read blocks' size classes are part of the plan (planner.block_key);
            # the C warm key has no such item, so these calls take this path
            key.append(block_key(equation, ops))
            break
    key = tuple(key)
    threads.check_requested()   # (as ``checked``): a plan priced for this thread count
    entry = _fast.get(key)
    if entry is None:
        entry = einsum_entry(equation, ops, out_format, sorted)
        if len(_fast) > 4096:
            _fast.clear()
        _fast[key] = entry
    else:
        _stats["plan_hits"] += 1
    if plan_only:
        return entry, ops
    if _PROFILER._is_profiler_enabled:
        # a profiler sees torch's ops only: the kernel (raw pointers, no ATen op) gets a
        # range of its own, or its time went unattributed (the output's ``aten::empty``);
        # the warm C calls step aside while one runs
        with _PROFILER.record_function(f"scorch::einsum {equation}"):
            return run(entry, ops) if out_format is None else _run_into(entry, ops, out_format)
    return run(entry, ops) if out_format is None else _run_into(entry, ops, out_format)


def _dense_order(out_format, rank: int) -> Optional[Tuple[int, ...]]:
    """The mode order of an all-dense ``out_format`` that is not row-major (None for any
    other): ``Format("dd", mode_order=(1, 0))`` asks for a column-major result."""
    fmt = as_format(out_format, rank)
    if fmt.block is None and all(k.full for k in fmt.levels) \
            and tuple(fmt.mode_order) != tuple(range(rank)):
        return tuple(fmt.mode_order)
    return None


def _run_into(entry, ops, out_format):
    """``run`` for a call that names its ``out_format``. The kernels write a dense result
    row-major: one in a dense format of another mode order is laid out in it (a copy of a
    result dense by nature; ``Format("dd", mode_order=(1, 0))`` gives a column-major
    tensor). A result that does not fit a singleton level (``"ds"``, ``"cs"``: one entry
    per row) is an error that names the format, not only the level that refused it."""
    try:
        result = run(entry, ops)
    except ValueError as e:
        out = entry.schedule.output
        fmt = out.final_format or out.format
        if fmt is None or not any(k.letter == "s" for k in fmt.levels):
            raise
        raise ValueError(f"einsum(): the result does not fit out_format={fmt!r}, which stores "
                         f"at most one entry below each position of the level above its "
                         f"singleton level: {e}") from None
    if type(result) is torch.Tensor and result.dim() > 1:
        order = _dense_order(out_format, result.dim())
        if order is not None:
            inverse = sorted(range(len(order)), key=order.__getitem__)
            result = result.permute(order).contiguous().permute(inverse)
    return result


_EXPR_FAST: Dict[tuple, tuple] = {}   # front cache of compute's plans (see compute)

#: the op layer's assignments, one object per kind of call (``kept_assignment``)
_KEPT: Dict[tuple, object] = {}


def kept_assignment(key: tuple, build):
    """``build()``'s assignment (or a tuple holding assignments), made once per ``key``: the
    warm path of ``compute`` finds a plan by the assignment's identity, so an op that made
    a new expression each call had it printed and keyed every time (``A * D`` of a small
    matrix 55 -> 15 us). ``key`` names the op and everything its expression depends on."""
    found = _KEPT.get(key)
    if found is None:
        if len(_KEPT) >= 8192:       # many kinds (a swept parameter, many shapes): start over
            _KEPT.clear()
        found = _KEPT[key] = build()
    return found


def _sorted_operand(st: Storage) -> Tuple[Storage, int]:
    """A Storage operand as a kernel reads it, with its signature: its sorted form when it
    is an ``einsum(..., sorted=False)`` result (kernels merge and search sorted
    coordinates), told by the signature (an int), not by walking its levels."""
    sig = st._sig
    if sig is None:
        sig = storage_signature(st)
    if sig in UNORDERED_SIGNATURES:
        st = st.with_sorted_coordinates()
        sig = storage_signature(st)
    return st, sig


def _products_read_compressed(equation: str, ops: list) -> list:
    """Coordinate-level (COO) operands of a product of sparse operands, read as the same mode
    order with a dense first level and compressed ones below (CSR's levels): a coordinate
    level cannot be located by a coordinate, so the planner could only run COO x COO as an
    outer product into a workspace as large as the result (30-90x scipy at 50k x 50k). The
    conversion is kept with the pattern (``kept_conversions``): one pass over the entries on
    the first call, a gather of the values after. Other calls: ``ops`` as they are."""
    sparse = [n for n, x in enumerate(ops) if type(x) is Storage]
    if len(sparse) < 2 or not any(k.letter in "qs" for n in sparse for k in ops[n].format.levels) \
            or "->" not in equation or "..." in equation:
        return ops          # (the common calls: one sparse operand, no COO; ~0.3 us)
    lhs, rhs = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        return ops
    shared = {v for v in set(lhs) - set(rhs) - {","}
              if sum(v in terms[n] for n in sparse) >= 2}
    if not shared:
        return ops
    out = list(ops)
    for n in sparse:
        fmt = ops[n].format
        if fmt.block is not None or not any(k.letter in "qs" for k in fmt.levels) \
                or not any(v in shared for v in terms[n]):
            continue
        from ..kept_conversions import reformatted
        # CSR's dense first level is an array as long as that dimension: for a hypersparse
        # operand (far more rows than entries) compressed levels only, so cost follows nnz
        rows = ops[n].shape[fmt.mode_order[0]]
        dense_first = rows <= max(8 * ops[n].nnz, 1 << 16)
        letters = ("d" if dense_first else "c") + "c" * (len(fmt.levels) - 1)
        out[n], _ = _sorted_operand(reformatted(ops[n], Format(letters, fmt.mode_order)))
    return out


def _keyed_operands(operands) -> Tuple[list, list]:
    """The operands as kernels read them (``_sorted_operand``) and what a plan depends on
    of each, cheaply: a Storage's signature, a dense tensor's dtype and rank."""
    ops, keys = [], []
    for x in operands:
        st = as_operand(x)
        if type(st) is Storage:
            st, k = _sorted_operand(st)
        else:
            k = (st.dtype, st.dim() | unit_mask(st) << 8 if 1 in st.shape else st.dim())
        ops.append(st)
        keys.append(k)
    return ops, keys


def squeeze_dense_broadcasts(equation: str, ops: list) -> Tuple[str, list]:
    """The einsum with every dense operand's broadcast size-1 dimension dropped from the
    operand (a view) and from its subscripts: the kernel then reads that operand once per
    value of the other variables, with no stretched copy (a column ``D[i, 0]`` against a
    2M x 2M matrix streamed along ``j`` would otherwise be laid out at full size). Equations
    with ``...`` or without ``->``, and repeated subscripts, stay as they are."""
    if "..." in equation or "->" not in equation:
        return equation, ops
    lhs, out = equation.replace(" ", "").split("->")
    subs = lhs.split(",")
    if len(subs) != len(ops):
        return equation, ops
    wide = {v for sub, x in zip(subs, ops) if len(sub) == len(x.shape)
            for v, n in zip(sub, x.shape) if n != 1}
    ops = list(ops)
    changed = False
    for k, (sub, x) in enumerate(zip(subs, ops)):
        if type(x) is Storage or len(sub) != x.dim() or len(set(sub)) != len(sub):
            continue
        drop = [d for d, v in enumerate(sub) if x.shape[d] == 1 and v in wide]
        if drop:
            subs[k] = "".join(v for d, v in enumerate(sub) if d not in drop)
            ops[k] = x.squeeze(drop)
            changed = True
    return (",".join(subs) + "->" + out if changed else equation), ops


def compute(assignment: Assignment, *operands, out_format=None):
    """Evaluate an index-notation assignment (e.g. ``Assignment("ij", A - 0.5 * B)``) over
    these operands through the same compiler path as einsum (no autograd: see
    ``scorch.gradients.compute``)."""
    if _ANY_REQUIRES_GRAD(*operands):
        _not_recorded("compute", operands, True)
    ops, keys = _keyed_operands(operands)
    # the warm path: the plan found by the assignment's identity and the operands'
    # signatures (ints), without walking or printing the expression (an op on a small
    # matrix takes a few us in its kernel)
    fkey = (id(assignment), out_format, *keys)
    hit = _EXPR_FAST.get(fkey)
    if hit is not None and hit[0] is assignment:
        _, indices, tensors, entry = hit
        try:
            bind_sizes(indices, [ops[n].shape for n in tensors])
        except ValueError:
            _bind_sizes(accesses(assignment.rhs), ops)   # the same error, operands named
            raise
        _stats["plan_hits"] += 1
        return run(entry, ops)
    accs: Dict[int, Tuple[str, ...]] = {}
    every = accesses(assignment.rhs)
    for a in every:
        if a.tensor >= len(ops):
            raise ValueError(f"expression uses operand {a.tensor} but {len(ops)} were given")
        if len(a.indices) != len(ops[a.tensor].shape):
            raise ValueError(
                f"operand {a.tensor} has {len(ops[a.tensor].shape)} dimensions but is indexed by {a.indices}")
        accs.setdefault(a.tensor, a.indices)
    _bind_sizes(every, ops)
    operand_indices = [accs.get(n, ()) for n in range(len(ops))]
    # keyed by the operands' signatures (``keys``), not only their formats: the entry's warm
    # runner takes operands of its first call's signatures only (the statistics class is
    # one), so a plan shared with a matrix of another class sent every call of this one
    # down the general path (dwt_992 after west0067: +100 us a call, ``A - C`` 0.79 of scipy)
    key = (COMPILER_VERSION, "expr", str(assignment), assignment, tuple(keys), out_format)

    def make():
        fmt = resolve_out_format(out_format, len(assignment.output))
        return make_entry(assignment, operand_indices, ops, fmt)
    entry = cached_entry(key, make)
    if len(_EXPR_FAST) > 4096:
        _EXPR_FAST.clear()
    # the entry holds the assignment, so its id stays its own while cached
    _EXPR_FAST[fkey] = (assignment, [a.indices for a in every], [a.tensor for a in every], entry)
    return run(entry, ops)


def _bind_sizes(every, ops) -> None:
    bind_sizes([a.indices for a in every], [ops[a.tensor].shape for a in every],
               [f"operand {a.tensor} (access {a})" for a in every], "compute()")


def explain(equation: str, *operands, out_format=None, sorted: bool = True) -> Plan:
    """The plan for ``einsum(equation, *operands)``; nothing is compiled or run. The
    operands go through ``einsum_declined`` itself (the same checks and errors, COO read
    compressed, a dense operand's broadcast size-1 dimensions dropped), so the plan is
    the one that runs. With only dense operands (and no ``out_format``) torch.einsum
    runs: a plan with no loops whose ``source`` says so and whose output is dense."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    prepared = einsum_declined(check_equation(equation), tuple(operands), out_format, sorted,
                               plan_only=True)
    if prepared is None:
        return _torch_einsum_plan(equation, operands)
    plan = _plan_of(*prepared)
    order = _dense_order(out_format, len(plan.output_format.levels)) \
        if out_format is not None and plan.output_format.is_dense else None
    if order is not None:    # laid out in the format's mode order (_run_into)
        plan.output_format = Format(plan.output_format.levels, order)
    return plan


def _torch_einsum_plan(equation: str, operands) -> Plan:
    """``explain``'s plan where only dense operands are given: ``einsum`` hands the call to
    torch.einsum, no scorch kernel is made."""
    spec = parse_einsum(equation, [tuple(getattr(x, "shape", ())) for x in operands])
    rank = len(spec.assignment.output)
    return Plan([], [], [], Format("d" * max(1, rank)),
                "# only dense operands: torch.einsum computes this (no scorch kernel)\n",
                [], spec.assignment)


def _plan_of(entry, ops) -> Plan:
    s = entry.schedule
    idx = {}
    for ap in s.accesses:
        if ap.sparse:
            idx[ap.id] = ops[ap.tensor].index_dtype
    # in the caller's letters: the compiled module is this source with its loops named by
    # depth (``canonical``), the same kernel
    kernel = lower_kernel(s, entry.value_dtype, idx)
    out = s.output
    if out.dense:
        ofmt = Format("d" * max(1, len(out.vars))) if out.vars else Format("d")
    else:
        ofmt = out.final_format or out.format
    transposes = [(ap.tensor, ap.source_format, ap.format) for ap in s.accesses if ap.transposed]
    workspaces = list(s.workspaces)
    if entry.dense_route is not None:
        workspaces.append("or the dense route where the dense result is at most the product's "
                          "work (computed dense, its touched rows kept: dense_route.py)")
    if values_plan(entry):   # execute.run tries it first: then ``source`` does not run
        workspaces.append("or values only where the sparse operands share one pattern: the "
                          "result's values computed over the stored entries, no kernel "
                          "(shared_pattern.py)")
    return Plan(list(s.loop_order), workspaces, list(s.tiled), ofmt, kernel_source(kernel, s),
                transposes, s.assignment, s, kernel, _relayouts(entry, ops),
                _plan_of(entry.reuse, ops) if entry.reuse is not None else None)


def result_is_dense(equation: str, *operands, out_format=None) -> bool:
    """Whether ``einsum(equation, *operands)`` returns a dense tensor (the plan's output,
    read from the plan cache; nothing is compiled or run). Autograd's partial-product split
    (``gradients.partial_product``) asks before it changes how a result is made."""
    ops = _keyed_operands(operands)[0]
    entry = einsum_entry(equation, ops, out_format)
    return entry.schedule.output.dense


def read_formats(equation: str, *operands, out_format=None) -> Tuple[Optional[Format], ...]:
    """The format the plan of ``einsum(equation, *operands)`` reads each operand in: its
    own, or the transposed copy the call would make (None: a dense operand, or one read in
    more than one format); nothing is compiled or run. A caller that can hand an operand
    over in that form (a gradient's pattern factor, ``gradients.einsum_grad``) saves the
    copy and may let the kernel write at the operand's positions."""
    ops = _keyed_operands(operands)[0]
    entry = einsum_entry(equation, ops, out_format)
    out: list = [None] * len(ops)
    if entry.split is not None:
        return tuple(out)
    seen: Dict[int, set] = {}
    for ap in entry.schedule.accesses:
        if ap.sparse:
            seen.setdefault(ap.tensor, set()).add(ap.format)
    for n, fmts in seen.items():
        if len(fmts) == 1:
            out[n] = next(iter(fmts))
    return tuple(out)


def _relayouts(entry, ops) -> list:
    """What ``execute`` does to each dense operand the innermost loop streams: read in
    place (stride 1 there) or re-laid out once per call (``relayout``), with the entries
    copied against the entries the kernel reads from it (SDDMM with C as K x n: K * n
    copied, about nnz * K read with stride 1 instead of stride n)."""
    s, out = entry.schedule, []
    est = s.estimates[0].estimate if s.estimates else None
    for aid, (d, _perm, _inv) in sorted(entry.relayout.items()):
        ap = s.accesses[aid]
        x = ops[ap.tensor]
        if entry.split is not None or len(ap.indices) != x.dim():
            continue     # blocked operands split into grid and block variables: not shown
        var = ap.indices[d]
        if x.stride(d) == 1 or x.shape[d] <= 1:
            if ordered_relayout(entry, ops, ap, x):
                order = ", ".join(ap.indices[k] for k in _perm)
                out.append(f"operand {ap.tensor} ({var} has stride 1; a sparse loop separates "
                           f"dimensions it nests the other way): copied to loop order ({order}) "
                           f"once per call, {x.numel()} entries")
            else:
                out.append(f"operand {ap.tensor} ({var} has stride 1): read in place")
            continue
        narrow = entry.narrowed.columns(ops) if entry.narrowed is not None and entry.narrowed.dense == ap.tensor else None
        if narrow is not None:
            kept = narrow[0].numel()
            out.append(f"operand {ap.tensor} (stride {x.stride(d)} along {var}, the innermost loop): "
                       f"only the {kept} of its {x.shape[1 - d]} slices operand {entry.narrowed.sparse} "
                       f"stores, copied to stride 1 once per call, {kept * x.shape[d]} entries "
                       f"(narrowed_gather.py)")
            continue
        reads = strided_reads(entry, ops, x.shape[d])   # the copy against the kernel's reads
        if reads is not None:
            if not relayout_pays(x.numel(), reads):
                out.append(f"operand {ap.tensor} (stride {x.stride(d)} along {var}, the innermost loop): "
                           f"read with its stride ({reads} entries; a copy to stride 1 would move "
                           f"{x.numel()})")
                continue
            out.append(f"operand {ap.tensor} (stride {x.stride(d)} along {var}, the innermost loop): "
                       f"copied to stride 1 once per call, {x.numel()} entries; the kernel reads {reads}")
            continue
        reads = f"; the kernel reads ~{est.work:.4g} entries" if est is not None else ""
        out.append(f"operand {ap.tensor} (stride {x.stride(d)} along {var}, the innermost loop): "
                   f"copied to stride 1 once per call, {x.numel()} entries{reads}")
    order = s.loop_order
    sizes = bind_sizes(entry.operand_indices, [x.shape for x in ops])
    for aid, (d, _perm, _inv) in sorted(entry.gather_relayout.items()):
        ap = s.accesses[aid]
        x = ops[ap.tensor]
        if entry.split is not None or len(ap.indices) != x.dim():
            continue
        var = ap.indices[d]
        above = order[order.index(var) - 1] if order.index(var) else var
        head = f"operand {ap.tensor} ({var} gathered by the sparse loop below {above}"
        if x.stride(d) == 1 or x.shape[d] <= 1:
            out.append(f"{head}, stride 1): read in place")
            continue
        reads = stored_entries(entry, ops) * (x.numel() // x.shape[d])
        if gathered_relayout(entry, ops, ap, x, sizes):
            out.append(f"{head}, stride {x.stride(d)}): copied to loop order once per call, "
                       f"{x.numel()} entries; the kernel gathers {reads}")
        else:
            why = ("the panels would not narrow" if not relaid_panel_narrower(entry, sizes)
                   else f"a copy would move {x.numel()}")
            out.append(f"{head}, stride {x.stride(d)}): read with its strides ({reads} gathered; {why})")
    return out
