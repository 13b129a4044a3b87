"""The inputs of one chunk function's lowering: the kernel's facts, the variant being built,
the declarations it collects, and the cursor handed from a loop to the loops inside it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ..loop_ir import Stmt
from .facts import KernelFacts

__all__ = ["Variant", "Decls", "Nest", "Cursor"]


@dataclass(frozen=True)
class Variant:
    """One chunk-function variant: ``width`` is the innermost loop's compile-time extent
    (None: the run-time ``N``), ``ws_map``: the workspace is the runtime's std::map, else
    local dense arrays; ``ws_scan``: the dense arrays without a touched list, each fiber read
    out by a scan of its whole extent's marks (fibers that fill much of it). ``prefetch``: the row loop prefetches its gathers ahead (see
    ``facts.PREFETCH_MIN_BYTES``). ``streams``: the short-rows row loop in its stream form
    (``stream_rows``: index and value lines requested ahead, long rows in blocks).
    ``row_loop``: the chunk is SpMV's row loop as one call of the runtime's (``gather_rows``):
    ``"dot"`` (scalar), ``"pairs"`` (scalar, two sums a row) or ``"gather"`` (a gathered dot a
    row); ``streams`` adds its requests.
    ``select``: the condition that picks it (None: ``run_chunk``).
    ``bound_only``: the bound pass of a rows output (the loops down to the last output
    level, adding up that loop's trip-count bounds). ``strided``: the accesses the innermost
    loop streams are read with their run-time strides (a vector dot's operand that arrived
    strided, where re-laying it out would cost more than reading it: ``relayout.relayout_pays``)."""
    name: str = "run_chunk"
    select: Optional[str] = None
    width: Optional[int] = None
    ws_map: bool = False
    ws_scan: bool = False
    prefetch: bool = False
    streams: bool = False
    bound_only: bool = False
    strided: bool = False
    row_loop: Optional[str] = None


class Decls:
    """The locals a chunk function declares, in order of first use (``need`` returns the
    name, so a node can use it where it declares it)."""

    def __init__(self) -> None:
        self._types: Dict[str, str] = {}

    def need(self, name: str, ctype: str = "int64_t") -> str:
        self._types.setdefault(name, ctype)
        return name

    def items(self) -> Tuple[Tuple[str, str], ...]:
        return tuple(self._types.items())


@dataclass(frozen=True)
class Nest:
    facts: KernelFacts
    variant: Variant
    decls: Decls
    #: loop-invariant statements a loop asks the chunk function to run once, before its
    #: loops (the vector dot's prefetch distance and end, ``loops._dot_prefetch``)
    setup: List[Stmt] = field(default_factory=list)


@dataclass
class Cursor:
    """Where the loops above stand, per access: ``pos`` the position of a sparse access
    (None inside a grouped run, whose range is ``seg``), ``pres`` its presence code (``"1"``
    when known present, ``"0"`` when known absent), ``off`` a dense access's offset; ``oo``
    the dense output's; ``some``: groups of presence codes of which at least one holds (the
    iterators of an enclosing merge point); ``vals``: a local holding an access's value at
    its current position (a merge point loads it unconditionally)."""
    pos: Dict[int, Optional[str]] = field(default_factory=dict)
    seg: Dict[int, Tuple[str, str]] = field(default_factory=dict)
    pres: Dict[int, str] = field(default_factory=dict)
    off: Dict[int, str] = field(default_factory=dict)
    oo: str = "0"
    some: Tuple[Tuple[str, ...], ...] = ()
    vals: Dict[int, str] = field(default_factory=dict)

    def child(self) -> "Cursor":
        """A copy the loop below rebinds (the loop's own cursor is never changed)."""
        return replace(self, pos=dict(self.pos), seg=dict(self.seg), pres=dict(self.pres),
                       off=dict(self.off), vals=dict(self.vals))
