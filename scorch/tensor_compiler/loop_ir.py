"""The loop IR: the generated kernel as immutable statement nodes, between lowering and printing.

``lower`` builds one :class:`Kernel` from a schedule and makes every decision there (which
loop kind runs each index variable, which locals a chunk function declares, whether a store
assigns or adds, whether the output is zeroed first, which chunk-function variants exist,
how the outermost loop is cut into chunks); ``codegen`` only prints the nodes as Cython.
Emitting a node depends on nothing but the node. The chunk function's locals are collected
while its body is lowered (in order of first use) and recorded on the :class:`ChunkFunction`.

C expressions stay strings inside the nodes (``"a.t0_vals[q0_1]"``); statements are nodes:

* :class:`Assign` ``target = expr``, :class:`AddTo` ``target += expr``, :class:`Call` (an
  expression statement such as ``ws.clear()``);
* :class:`For` ``for var in range(lo, hi)``, :class:`While`, :class:`If`; a loop's ``role``
  says why it exists (``"dense"``, ``"segment"``: the segment of one sparse level,
  ``"group"``: runs of equal coordinates, ``"merge"``: a merge of several sparse levels (a
  lattice point of two or more, or one k-pointer loop), ``"rest"``: a lattice point of one
  level, the rest of its segment after the others ended, ``"search"``: a diagonal's bound coordinate, ``"drain"``: a workspace read out,
  ``"zero"``: an output row cleared);
* :class:`LevelCode`: the lines a level kind contributes (``levels.segment_setup`` and
  ``levels.group_end``), kept as the level wrote them;
* :class:`AppendEntry`: one output entry appended to the chunk's buffers (coordinate
  tuples, or rows assembly with the row's count); :class:`RowEnd`: a row's count stored
  once (rows written straight into the output's room);
* :class:`ChunkFunction`: one ``run_chunk*`` variant (its locals and body) and the run-time
  condition that selects it;
* :class:`Kernel`: the module: header comments, cimports, the argument struct, vector
  types, chunk functions, the ``kernel`` entry (:class:`Chunking` with load balancing, the
  optional memset, :class:`Panels`, the epilogue: :class:`DenseOutput`,
  :class:`TuplesOutput` or :class:`RowsOutput`) and whether it has a C entry capsule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Tuple, Union

__all__ = ["ArgSpec", "Stmt", "Assign", "AddTo", "Call", "For", "While", "If", "LevelCode", "outline",
           "AppendEntry", "RowEnd", "ChunkFunction", "Chunking", "Panels", "DenseOutput", "TuplesOutput",
           "RowsOutput", "Kernel", "walk"]


# A kernel argument: (field name, C type, what it is). "what" is a tuple the runtime reads:
# ("pos"|"crd", access, level) | ("vals", access) | ("stride", access, var) | ("size", var)
# | ("out",) | ("ostride", var)
ArgSpec = Tuple[str, str, tuple]


@dataclass(frozen=True)
class Assign:
    target: str
    expr: str


@dataclass(frozen=True)
class AddTo:
    target: str
    expr: str


@dataclass(frozen=True)
class Call:
    """An expression statement (a call or method call, e.g. ``ws.clear()``)."""
    code: str


@dataclass(frozen=True)
class For:
    """``for var in range(lo, hi)`` (``range(hi)`` when ``lo`` is None)."""
    var: str
    lo: Optional[str]
    hi: str
    body: Tuple["Stmt", ...]
    role: str = "dense"


@dataclass(frozen=True)
class While:
    cond: str
    body: Tuple["Stmt", ...]
    role: str = "merge"


@dataclass(frozen=True)
class If:
    cond: str
    then: Tuple["Stmt", ...]
    orelse: Tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class LevelCode:
    """Statements written by a level kind (``levels.segment_setup``/``group_end``), one
    string per line, nested lines indented by four spaces."""
    lines: Tuple[str, ...]


@dataclass(frozen=True)
class AppendEntry:
    """Append one output entry: ``coords`` (one C expression per output level) and
    ``value``. ``row``: rows assembly (only the last coordinate is appended, the entry is
    counted into ``out_pos[row + 1]``); None: one coordinate vector per level. ``local``
    (rows assembly with a bound pass): written at ``ok`` into the chunk's room
    (``ocrd``/``oval`` are plain arrays), the row counted once (:class:`RowEnd`)."""
    coords: Tuple[str, ...]
    value: str
    row: Optional[str] = None
    local: bool = False


@dataclass(frozen=True)
class RowEnd:
    """The row's entry count (``ok - ob``: ``ob`` is where it started) stored into
    ``out_pos[row + 1]``."""
    row: str


Stmt = Union[Assign, AddTo, Call, For, While, If, LevelCode, AppendEntry, RowEnd]


@dataclass(frozen=True)
class ChunkFunction:
    """``cdef void name(Args*, clo, chi, ocrd, oval)``: the loop nest over one range of the
    outermost loop. ``select``: the run-time condition under which ``kernel`` calls this
    variant instead of ``run_chunk`` (None for ``run_chunk`` itself). ``returns``: a local
    the function returns (the chunk's entry count when rows are written through local
    pointers), or None (``void``). ``width``: the compile-time row width of a register-row or
    vector-dot variant (``run_chunk_w<W>``), None for the others."""
    name: str
    select: Optional[str]
    locals: Tuple[Tuple[str, str], ...]      # (name, C type), in order of first use
    body: Tuple[Stmt, ...]
    returns: Optional[str] = None
    width: Optional[int] = None


@dataclass(frozen=True)
class Chunking:
    """How ``kernel`` cuts the outermost loop's range ``[lo0, hi0)`` into chunks.
    ``kind``: None (one chunk, the range is unused), ``"dense"`` (``0 .. N_var``) or
    ``"sparse"`` (the positions of the top level ``level_pos``); ``balance``: the pos array
    that weighs a dense range by stored entries (None: equal ranges)."""
    kind: Optional[str]
    var: Optional[str] = None
    level_pos: Optional[str] = None
    balance: Optional[str] = None


@dataclass(frozen=True)
class Panels:
    """Algorithm 3's tiling of the innermost loop ``var`` into panels of ``widths`` columns:
    ``shifted`` are the Args fields whose base pointers move with the panel. ``cache``:
    cache blocking (``schedule.CacheTile``), panels of any width run through the generic
    chunk, in ``parallel`` when nothing below is split into chunks."""
    var: str
    widths: Tuple[int, ...]
    shifted: Tuple[str, ...]
    cache: bool = False
    parallel: bool = False


@dataclass(frozen=True)
class DenseOutput:
    """Nothing is appended: the chunks write a preallocated output (dense or an operand's
    pattern)."""


@dataclass(frozen=True)
class TuplesOutput:
    """Chunks append coordinate tuples (``levels`` coordinates each) and values; the kernel
    returns them level-major."""
    levels: int


@dataclass(frozen=True)
class RowsOutput:
    """Rows assembly: ``dense_vars`` are the dense levels' variables over the last
    (compressed) level ``last``; coordinates are appended in ``index_type``. ``bound``: the
    kernel has a bound pass (``Kernel.bound_function``: an upper bound of each chunk's
    entries, from the trip counts of the loop over the last level) and the chunk functions
    write straight into that room and return their entry counts; else they append to
    growable buffers."""
    dense_vars: Tuple[str, ...]
    last: str
    level_vars: Tuple[str, ...]
    index_type: str
    bound: bool = False


@dataclass(frozen=True)
class Kernel:
    header: Tuple[str, ...]                  # comment lines describing the kernel
    imports: Tuple[str, ...]
    args: Tuple[ArgSpec, ...]                # the Args struct, in the runtime's order
    value_type: str                          # C value type
    np_value_type: str
    vector_type: Optional[str]               # scorch_vf / scorch_vd when a variant uses vectors
    buffers: Tuple[str, str]                 # chunk buffer types (coordinates, values)
    chunk_functions: Tuple[ChunkFunction, ...]
    c_entry: bool                            # kernel_c + KERNEL_C capsule (no GIL at all)
    ws_vars: Tuple[str, ...]                 # workspace variables (overflow check), or ()
    chunking: Chunking
    memset: Optional[str]                    # element count to zero first, or None
    panels: Optional[Panels]
    output: Union[DenseOutput, TuplesOutput, RowsOutput]
    fill: Optional[str] = None               # what memset fills instead of 0 (max/min: -inf/+inf)
    vector_bytes: int = 64                   # the vector type's size (the target's registers)
    target: str = ""                         # a chosen (not native) build target, or ""
    bound_function: Optional[ChunkFunction] = None   # rows output's bound pass (RowsOutput.bound)
    cflags: str = ""                         # extra compiler flags the kernel asks for, or ""
    sums4: Tuple[str, ...] = ()              # vector types with a 4-way transposing sum (_hsum4)


def walk(stmts) -> Iterator[Stmt]:
    """Every statement of ``stmts`` and of the blocks nested in them, in order."""
    for st in stmts:
        yield st
        if isinstance(st, (For, While)):
            yield from walk(st.body)
        elif isinstance(st, If):
            yield from walk(st.then)
            yield from walk(st.orelse)


def outline(k: Kernel) -> str:
    """The loop structure of a kernel, as ``explain`` shows it: each chunk function's loops
    with their roles, the guards and the stores into the output, workspace or accumulator
    (the bookkeeping in between is left out; ``Plan.source`` has every line)."""
    lines = []
    c = k.chunking
    if c.kind is not None:
        lines.append(f"chunks over {c.var} ({c.kind}"
                     + (f", balanced by stored entries of {c.balance}" if c.balance else "") + ")")
    if k.memset is not None:
        lines.append(f"fill the output with {k.fill or 0} ({k.memset} values)")
    if k.panels is not None and k.panels.cache:
        lines.append(f"tile loop: for each panel of {k.panels.var} (width per call, cache-sized)"
                     + (", in parallel" if k.panels.parallel else "")
                     + ": run_chunk on the panel")
    for fn in k.chunk_functions:
        lines.append(fn.name + (f"  (when {fn.select})" if fn.select else "") + ":")
        _outline(fn.body, 1, lines)
    lines.append(f"output: {type(k.output).__name__}")
    return "\n".join(lines)


def _stores(st) -> bool:
    target = getattr(st, "target", "")
    return "out_vals" in target or target.startswith(("acc", "wv", "ws"))


def _outline(stmts, ind: int, lines) -> None:
    pre = "  " * ind
    for st in stmts:
        if isinstance(st, For):
            lines.append(f"{pre}for {st.var} in [{st.lo or 0}, {st.hi})  # {st.role}")
            _outline(st.body, ind + 1, lines)
        elif isinstance(st, While):
            lines.append(f"{pre}while {st.cond}  # {st.role}")
            _outline(st.body, ind + 1, lines)
        elif isinstance(st, If):
            inner: list = []
            _outline(st.then, ind + 1, inner)
            _outline(st.orelse, ind + 1, inner)
            if inner:
                lines.append(f"{pre}if {st.cond}")
                lines.extend(inner)
        elif isinstance(st, AppendEntry):
            lines.append(f"{pre}append ({', '.join(st.coords)}) <- {st.value}")
        elif isinstance(st, Assign) and _stores(st):
            lines.append(f"{pre}{st.target} = {st.expr}")
        elif isinstance(st, AddTo) and _stores(st):
            lines.append(f"{pre}{st.target} += {st.expr}")
        elif isinstance(st, Call) and st.code.startswith(("ws.", "dense_ws_drain")):
            lines.append(f"{pre}{st.code}")
