"""Front-end rewrites of an einsum before planning.

* ``rename_broadcast``: a size-1 dimension of a sparse operand that broadcasts gets its own
  variable of size 1 (summing over one coordinate is the identity), so the operand no longer
  depends on the broadcast variable.
* ``block_split``: blocked operands read natively. Each blocked index variable ``v`` (block
  ``b``) is split into ``v_o`` (over the grid of blocks) and ``v_i`` (inside a block), so a
  blocked operand is a tensor of twice the rank whose last levels are the dense block
  insides; dense operands and the dense output are read through ``v = v_o * b + v_i``
  strides, and the kernel co-iterates the block grid and runs dense loops inside blocks.
  ``split_operand`` presents an operand as such a plan reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..formats import Format, LevelKind
from ..level_storage import Level, Storage
from .index_notation import Assignment, EinsumSpec, product

__all__ = ["rename_broadcast", "BlockSplit", "block_split", "split_operand", "outer_var",
           "inner_var"]


def outer_var(v: str) -> str:
    return v + "_o"


def inner_var(v: str) -> str:
    return v + "_i"


def rename_broadcast(spec: EinsumSpec, ops) -> Tuple[Assignment, List[Tuple[str, ...]]]:
    op_idx = []
    for n, idx in enumerate(spec.operand_indices):
        if isinstance(ops[n], Storage) and spec.broadcast[n]:
            idx = tuple(f"_b{n}_{d}" if d in spec.broadcast[n] else v for d, v in enumerate(idx))
        op_idx.append(tuple(idx))
    return Assignment(spec.assignment.output, product(op_idx)), op_idx


@dataclass
class BlockSplit:
    """The split einsum: its assignment and operand indices, the formats the kernel reads
    (block-inner levels appended as dense levels), how many trailing levels of each blocked
    operand are fixed (``fixed_tail``), and the block size of every split variable."""
    assignment: Assignment
    operand_indices: List[Tuple[str, ...]]
    formats: List[Optional[Format]]
    fixed_tail: Dict[int, int]
    blocks: Dict[str, int]


def _with_block_levels(f: Format, rank: int) -> Format:
    return Format(f.levels + (LevelKind.DENSE,) * rank, f.mode_order + tuple(range(rank, 2 * rank)))


def block_split(asg: Assignment, op_idx: Sequence[Tuple[str, ...]], ops,
                out_fmt: Optional[Format]) -> Optional[BlockSplit]:
    """The split, when it is consistent (every sparse operand on a split variable is blocked
    with the same block size on it, no split variable repeats inside an operand) and the
    output is dense; otherwise None (blocked operands are then converted to their unblocked
    format first)."""
    blocked = [n for n, x in enumerate(ops) if isinstance(x, Storage) and x.format.block is not None]
    if not blocked or (out_fmt is not None and not out_fmt.is_dense):
        return None
    bs: Dict[str, int] = {}
    for n in blocked:
        idx = op_idx[n]
        if len(set(idx)) != len(idx) or len(idx) != ops[n].ndim:
            return None
        for d, v in enumerate(idx):
            if bs.setdefault(v, ops[n].format.block[d]) != ops[n].format.block[d]:
                return None
    for n, x in enumerate(ops):
        if n in blocked:
            continue
        if isinstance(x, Storage) and any(v in bs for v in op_idx[n]):
            return None
        if any(op_idx[n].count(v) > 1 for v in bs):
            return None

    def expand(idx):
        out = []
        for v in idx:
            out.extend((outer_var(v), inner_var(v)) if v in bs else (v,))
        return tuple(out)
    new_idx, formats, tail = [], [], {}
    for n, (idx, x) in enumerate(zip(op_idx, ops)):
        if n in blocked:
            r = len(idx)
            new_idx.append(tuple(outer_var(v) for v in idx) + tuple(inner_var(v) for v in idx))
            formats.append(_with_block_levels(x.format, r))
            tail[n] = r
        else:
            new_idx.append(expand(idx))
            formats.append(Format(x.format.levels, x.format.mode_order) if isinstance(x, Storage) else None)
    return BlockSplit(Assignment(expand(asg.output), product(new_idx)), new_idx, formats, tail, bs)


def split_operand(blocks: Dict[str, int], orig_indices: Sequence[Tuple[str, ...]], n: int, x):
    """Operand ``n`` as a split plan reads it: a blocked storage as twice the rank (its block
    levels exposed), a dense tensor with each split dimension unflattened into (grid, block)."""
    if isinstance(x, Storage):
        if x.format.block is None:
            return x
        r = x.ndim
        levels = [Level(lv.kind, lv.dim + r if lv.block_inner else lv.dim, lv.size, lv.pos, lv.crd)
                  for lv in x.levels]
        f = x.format
        shape = tuple(s // b for s, b in zip(x.shape, f.block)) + tuple(f.block)
        return Storage(_with_block_levels(f, r), shape, levels, x.values, x.index_dtype)
    idx = orig_indices[n]
    for d in reversed(range(len(idx))):
        b = blocks.get(idx[d])
        if b is not None:
            if x.shape[d] % b:
                raise ValueError(f"einsum(): size {x.shape[d]} of operand {n} (subscript {idx[d]}) "
                                 f"is not a multiple of the block size {b}")
            x = x.unflatten(d, (x.shape[d] // b, b))
    return x
