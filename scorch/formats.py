"""Tensor formats: one level kind per stored dimension, a mode order, optional dense blocks.

A format describes how the nonzeros of a tensor are laid out, one *level* at a time
(Kjolstad et al., "Format abstraction for sparse tensor algebra compilers"). Level ``k``
stores dimension ``mode_order[k]``; its kind says which arrays it keeps and what a
kernel can do with it (see ``LevelKind``). Formats are immutable values: they compare,
hash and print, so they can key a kernel cache.

Level strings use one letter per level: ``d`` dense, ``c`` compressed, ``q`` coordinate,
``s`` singleton (so ``"dc"`` is CSR, ``"cc"`` is DCSR, ``"qq"`` is COO, ``"ds"`` one entry per
row). What each kind can do is in ``scorch.level_kinds``.
"""
from __future__ import annotations

import operator
from typing import Iterable, Optional, Sequence, Tuple, Union

from .level_kinds import LevelKind, compressed, coordinate, dense, parse_level, registered, singleton

__all__ = [
    "LevelKind", "dense", "compressed", "coordinate", "singleton", "Format", "as_format",
    "FormatLike",
]


# Named 2-d formats: name -> (level letters, mode order).
_NAMED_MATRIX = {
    "csr": ("dc", (0, 1)),
    "csc": ("dc", (1, 0)),
    "dcsr": ("cc", (0, 1)),
    "dcsc": ("cc", (1, 0)),
}
# Named formats of any rank: name -> level letter repeated rank times.
_NAMED_ANY_RANK = {"dense": "d", "coo": "q", "csf": "c"}


def _letters() -> str:
    return "".join(k.letter for k in registered())


#: Format.permuted's answers, per (format key, dims)
_PERMUTED: dict = {}


def _ints(seq, name: str) -> tuple:
    """``seq`` as a tuple of ints; anything else (a string, floats, bools) is refused, not
    truncated (``block=(2.5, 2)`` is not ``(2, 2)``)."""
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
        raise ValueError(f"{name} must be a sequence of ints, got {seq!r}")
    try:
        if any(isinstance(v, bool) for v in seq):
            raise TypeError
        return tuple(operator.index(v) for v in seq)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of ints, got {seq!r}") from None


class Format:
    """A storage format: ``levels[k]`` is the kind of level ``k``, which stores dimension
    ``mode_order[k]``. ``block`` (one size per dimension) stores dense blocks: the levels
    then index the grid of blocks and each stored block is a dense row-major array
    (``Format("dc", block=(b, b))`` is BSR)."""

    __slots__ = ("_levels", "_mode_order", "_block")

    def __init__(self, levels: Union[str, Sequence[Union[str, LevelKind]]],
                 mode_order: Optional[Sequence[int]] = None,
                 block: Optional[Sequence[int]] = None) -> None:
        if not isinstance(levels, (str, Sequence)):
            raise TypeError(f"Format levels must be a level string such as 'dc' or a sequence of "
                            f"level kinds, got {type(levels).__name__} {levels!r}")
        if isinstance(levels, str):
            if levels.lower() in _NAMED_MATRIX or levels.lower() in _NAMED_ANY_RANK:
                raise ValueError(
                    f"format name {levels!r} is not a level string; use scorch.as_format({levels!r}, rank)")
            levels = list(levels)
        lv = tuple(parse_level(x) for x in levels)
        if len(lv) == 0:
            raise ValueError("a format needs at least one level (a 0-d tensor is dense)")
        rank = len(lv)
        if mode_order is None:
            mo = tuple(range(rank))
        else:
            mo = _ints(mode_order, "mode_order")
            if sorted(mo) != list(range(rank)):
                raise ValueError(
                    f"mode_order {mode_order!r} is not a permutation of 0..{rank - 1} "
                    f"for a format with {rank} levels")
        blk = None
        if block is not None:
            blk = _ints(block, "block")
            if len(blk) != rank:
                raise ValueError(f"block {block!r} has {len(blk)} sizes but the format has {rank} levels")
            if any(b <= 0 for b in blk):
                raise ValueError(f"block sizes must be positive, got {block!r}")
            if all(b == 1 for b in blk):
                blk = None
        self._levels = lv
        self._mode_order = mo
        self._block = blk

    # --- value semantics -------------------------------------------------------------
    @property
    def levels(self) -> Tuple[LevelKind, ...]:
        return self._levels

    @property
    def mode_order(self) -> Tuple[int, ...]:
        return self._mode_order

    @property
    def block(self) -> Optional[Tuple[int, ...]]:
        return self._block

    @property
    def rank(self) -> int:
        return len(self._levels)

    @property
    def level_string(self) -> str:
        return "".join(k.letter for k in self._levels)

    @property
    def is_dense(self) -> bool:
        """All levels dense (a strided array in mode order)."""
        return all(k.full for k in self._levels)

    @property
    def is_sparse(self) -> bool:
        return not self.is_dense

    def level_of_dim(self, dim: int) -> int:
        """Which level stores dimension ``dim``."""
        return self._mode_order.index(dim)

    def kind_of_dim(self, dim: int) -> LevelKind:
        return self._levels[self.level_of_dim(dim)]

    @property
    def name(self) -> Optional[str]:
        """The conventional name (``"csr"``, ``"coo"``, ...) when the format has one."""
        ls, mo, r = self.level_string, self._mode_order, self.rank
        if self._block is not None:
            if r == 2 and ls == "dc":
                return "bsr" if mo == (0, 1) else "bsc"
            return None
        if r == 2:
            for name, (l2, m2) in _NAMED_MATRIX.items():
                if ls == l2 and mo == m2:
                    return name
        if mo == tuple(range(r)):
            if ls == "q" * r:
                return "coo"
            if ls == "d" * r:
                return "dense"
            if r >= 3 and ls == "c" * r:
                return "csf"
        return None

    def with_mode_order(self, mode_order: Sequence[int]) -> "Format":
        return Format(self._levels, mode_order, self._block)

    def dense_tail(self) -> Tuple[int, ...]:
        """The dimensions stored in full below the last sparse level, in level order
        (attention scores 'dcdd' (i, j, b, h): b, h): independent of the pattern."""
        tail = len(self._levels)
        while tail > 0 and self._levels[tail - 1].full:
            tail -= 1
        return tuple(self._mode_order[tail:])

    def transposed_copy(self, mode_order: Sequence[int]) -> "Format":
        """The format of a copy of a tensor in this format stored in ``mode_order``.

        Position by position the kinds are kept (CSR stored as CSC stays dense over columns,
        compressed over rows), and a copy must hold any pattern, so kinds that cannot
        (singleton) become the kind an output fed by them would have. A dense level is only
        kept under a sparse one for a dimension of this format's dense tail (stored in full
        below its last sparse level, so independent of the pattern); any other dimension
        there would get one slot per stored parent position (a b x h x n x n blow-up for
        attention scores 'dcdd' (i, j, b, h) stored as (b, h, j, i)) and is compressed."""
        by_dim = dict(zip(self._mode_order, self._levels))
        free = set(self.dense_tail())
        kinds, sparse_above = [], False
        for k, d in zip(self._levels, mode_order):
            kind = k.output_kind()
            if kind.full and sparse_above and d not in free:
                own = by_dim[d]
                kind = own.output_kind() if not own.full else compressed
            kinds.append(kind)
            sparse_above = sparse_above or not kind.full
        return Format(kinds, mode_order, self._block)

    def permuted(self, dims: Sequence[int]) -> "Format":
        """The format of ``t.permute(dims)`` when ``t`` has this format (same storage). Kept
        per (format, dims): a layer's batch is seen transposed on every step."""
        key = (self._key(), tuple(dims))
        got = _PERMUTED.get(key)
        if got is None:
            inverse = [0] * self.rank
            for new, old in enumerate(dims):
                inverse[old] = new
            blk = None if self._block is None else tuple(self._block[d] for d in dims)
            got = Format(self._levels, tuple(inverse[m] for m in self._mode_order), blk)
            if len(_PERMUTED) >= 1024:
                _PERMUTED.clear()
            _PERMUTED[key] = got
        return got

    def _key(self):
        return (self._levels, self._mode_order, self._block)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = as_format(other, self.rank)
            except ValueError:
                return False
        return isinstance(other, Format) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = [repr(self.level_string)]
        if self._mode_order != tuple(range(self.rank)):
            args.append(f"mode_order={self._mode_order}")
        if self._block is not None:
            args.append(f"block={self._block}")
        return f"Format({', '.join(args)})"

    def __str__(self) -> str:
        return self.name or repr(self)

    def __reduce__(self):
        return (Format, (self.level_string, self._mode_order, self._block))


FormatLike = Union[str, Format, Sequence[Union[str, LevelKind]]]


def as_format(fmt: FormatLike, rank: Optional[int] = None) -> Format:
    """Resolve a format name, level string or ``Format`` for a tensor of ``rank`` dimensions.

    Raises ValueError for an unknown name or a format whose rank is not ``rank``.
    """
    if isinstance(fmt, Format):
        result = fmt
    elif isinstance(fmt, str):
        key = fmt.lower()
        if key in _NAMED_MATRIX:
            letters, mo = _NAMED_MATRIX[key]
            result = Format(letters, mo)
        elif key in ("bsr", "bsc"):
            raise ValueError(
                f"format {fmt!r} needs a block size: use scorch.Format('dc', "
                f"{'mode_order=(1, 0), ' if key == 'bsc' else ''}block=(b, b))")
        elif key in _NAMED_ANY_RANK:
            if rank is None:
                raise ValueError(f"format {fmt!r} needs the tensor's rank")
            if rank == 0:
                raise ValueError(f"a 0-d tensor has no sparse format (asked for {fmt!r})")
            result = Format(_NAMED_ANY_RANK[key] * rank)
        elif key and all(ch in _letters() for ch in key):
            result = Format(key)
        else:
            raise ValueError(
                f"unknown format {fmt!r}: expected one of dense, coo, csr, csc, dcsr, dcsc, csf, "
                f"a level string of the letters d (dense), c (compressed), q (coordinate), "
                f"s (singleton) such as 'dcc', or a scorch.Format")
    elif isinstance(fmt, Iterable):
        result = Format(list(fmt))
    else:
        raise ValueError(f"not a format: {fmt!r}")
    if rank is not None and result.rank != rank:
        raise ValueError(
            f"format {result} has {result.rank} levels but the tensor has {rank} dimensions")
    return result
