"""A kernel's argument table: what each field of its ``Args`` struct is read from. Codegen
lists the fields as ``(name, C type, what)``; ``arg_table`` turns that into codes, read by
the general path here (``arg_values``), by the Python warm runner and by the C warm path
(``scorch/_runtime/fastcall.cpp`` takes the same codes, per operand: ``by_operand``)."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .plans import storage_pointers

__all__ = ["SIZE", "STORAGE", "DATA", "STRIDE", "OUT", "OUT_STRIDE", "arg_table", "by_operand",
           "arg_values"]

#: argument kinds (the codes fastcall.cpp takes)
SIZE, STORAGE, DATA, STRIDE, OUT, OUT_STRIDE = range(6)


def arg_table(args, s) -> List[tuple]:
    """Per field ``(kind, a, b)``: SIZE (variable, 0); STORAGE (access, index into the
    storage's ``storage_pointers``: ``2 * level + (crd)``, or -2 for the values); DATA (dense
    access, 0); STRIDE (access, its dimensions indexed by the variable: strides summed); OUT;
    OUT_STRIDE (0, the output variables after it in memory order: sizes multiplied, the
    output is fresh and contiguous in that order)."""
    out = s.output
    table = []
    for _, _, what in args:
        tag = what[0]
        if tag == "size":
            table.append((SIZE, what[1], 0))
        elif tag in ("pos", "crd"):
            table.append((STORAGE, what[1], 2 * what[2] + (tag == "crd")))
        elif tag == "vals":
            table.append((STORAGE, what[1], -2) if s.accesses[what[1]].sparse else (DATA, what[1], 0))
        elif tag == "stride":
            ap = s.accesses[what[1]]
            table.append((STRIDE, what[1], tuple(d for d, v in enumerate(ap.indices) if v == what[2])))
        elif tag == "out":
            table.append((OUT, 0, 0))
        elif tag == "ostride":
            mem = out.memory_order
            table.append((OUT_STRIDE, 0, tuple(mem[mem.index(what[1]) + 1:])))
        else:
            raise ValueError(f"unknown kernel argument {what!r}")
    return table


def by_operand(table: List[tuple], s) -> List[tuple]:
    """The table with accesses replaced by the operands they read: valid on the warm paths,
    where every access reads its operand as given (no transpose, no cast)."""
    return [(kind, s.accesses[a].tensor, b) if kind in (STORAGE, DATA, STRIDE) else (kind, a, b)
            for kind, a, b in table]


def arg_values(table: List[tuple], data: Dict[int, object], sizes: Dict[str, int],
               out: Optional[torch.Tensor]) -> List[int]:
    """The argument list of one general-path call: ``data`` maps each access to the Storage
    or dense tensor it reads (after transposes, casts and re-layouts)."""
    vals = []
    for kind, a, b in table:
        if kind == SIZE:
            vals.append(sizes[a])
        elif kind == STORAGE:
            vals.append(storage_pointers(data[a])[b])
        elif kind == DATA:
            vals.append(data[a].data_ptr())
        elif kind == STRIDE:
            x = data[a]   # a broadcast size-1 dimension is read with stride 0
            vals.append(sum(x.stride(d) for d in b if x.shape[d] != 1))
        elif kind == OUT:
            vals.append(out.data_ptr())
        else:
            n = 1
            for v in b:
                n *= sizes[v]
            vals.append(n)
    return vals
