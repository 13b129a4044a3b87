"""Lowering of a :class:`~scorch.tensor_compiler.schedule.Schedule` to Cython source.

The kernel is one loop nest, one loop per index variable in the schedule's order. At each
loop the levels bound to its variable decide how it runs (``levels.py``), and the merge
lattice (``merge_lattice.py``) decides which coordinates it visits:

* no sparse level: ``for c in range(N)``, dense levels *locate*;
* one sparse level that the expression needs: a loop over its segment;
* several sparse levels: a two-pointer (k-pointer) merge visiting the smallest current
  coordinate, entering the body where the lattice point holds (intersection for products,
  union for sums);
* sparse levels the expression does not need (a dense term in a sum): a dense loop with
  the sparse iterators merged into it.

Each access carries a presence flag (``"1"`` when known present), so an absent access
reads as zero and its child levels see an empty segment.

Generated code layout: ``cdef struct Args`` with typed raw pointers and sizes; ``cdef
void run_chunk(...) noexcept nogil`` with the loop nest for one range of the outermost
loop; ``def kernel(list args, int nthreads)`` that casts the Python ints (``data_ptr()``
values and sizes) to the struct and runs chunks under ``prange`` when the outermost
variable is an output variable (so chunks write disjoint parts of the output).

Sparse output assembly. Each chunk appends, in loop order, every output entry to its own
growable buffers (``std::vector``: one coordinate vector per output level and one value
vector): directly (loop order concordant with the output, reductions below the last output
variable through a scalar accumulator), or by draining a per-chunk workspace in key order (a
reduction above an output variable: Gustavson SpGEMM; a one-variable workspace drains
straight into the buffers). Chunks cover increasing ranges of the outermost loop, so
concatenating the buffers in chunk order gives sorted, unique coordinate tuples, returned
level-major; ``pos``/``crd`` are then built in one vectorized O(nnz) pass
(``levels.assemble_level``). This needs no symbolic pass and no over-allocation bound, and
reads the inputs once; the price is one copy of the output through the buffers.
Entries are kept where the expression's operands are stored, even if the computed value is
0 (e.g. ``A - A``): computed zeros are kept, never duplicates.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..formats import LevelKind
from . import merge_lattice as ml
from .index_notation import Access, Add, Expr, Mul, Neg, Scalar, Sub
from .levels import LevelPlan, group_end, segment_setup
from .schedule import Schedule

__all__ = ["generate", "short_rows", "short_rows_limit", "CTYPES", "NPTYPES", "ArgSpec", "SHORT_ROWS"]

CODEGEN_VERSION = 1

#: a sparse workspace whose extent is at most this many entries runs as a dense array with
#: a touched list (one per thread); larger ones use the std::map
DENSE_WS_LIMIT = 1 << 22

CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
          torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
          torch.uint8: "uint8_t"}
NPTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
           torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8"}
ITYPES = {torch.int32: "int32_t", torch.int64: "int64_t"}

#: segments (rows) of at most this many entries on average run the scalar variant of a
#: sparse-dot kernel (see short_rows); float32 rows shorter than one 512-bit vector (16)
#: never fill gcc's vector loop and run scalar faster (copter2, 12.7 a row: 286 -> 273 us,
#: random_uniform, 10 a row: 615 -> 559 us at 2 threads), float64 ones gain from 6 up
SHORT_ROWS = 6
SHORT_ROWS_BY_DTYPE = {torch.float32: 16}


def short_rows_limit(value_dtype: torch.dtype) -> int:
    """Average entries per row up to which the short-rows variant runs (see short_rows)."""
    return SHORT_ROWS_BY_DTYPE.get(value_dtype, SHORT_ROWS)

#: name of the capsule holding a kernel's C entry ``void kernel_c(const int64_t* args, int
#: nthreads, int panel)`` (``KERNEL_C`` in kernels that only write a preallocated output)
KERNEL_C_CAPSULE = "scorch.kernel_c"

# An argument: (field name, C type, what it is). "what" is a tuple the runtime reads:
# ("pos"|"crd", access, level) | ("vals", access) | ("stride", access, var) | ("size", var)
# | ("out",) | ("ostride", var)
ArgSpec = Tuple[str, str, tuple]


def unit_stride_accesses(s: Schedule):
    """Dense strided accesses that the innermost loop streams: the runtime hands them over
    with stride 1 in that variable (re-laid out if need be), so the kernel indexes them with
    ``+ c`` (vectorizable) instead of ``+ c * stride``."""
    if not s.loop_order:
        return set()
    last = s.loop_order[-1]
    return {ap.id for ap in s.accesses
            if not ap.sparse and last in ap.indices and len(set(ap.indices)) == len(ap.indices)}


def _cvar(v: str) -> str:
    return "c_" + v


class _Gen:
    def __init__(self, s: Schedule, value_dtype: torch.dtype, index_dtypes: Dict[int, torch.dtype]):
        self.s = s
        self.vt = CTYPES[value_dtype]
        self.npvt = NPTYPES[value_dtype]
        self.idx = {i: ITYPES[d] for i, d in index_dtypes.items()}
        self.args: List[ArgSpec] = []
        self.locals: Dict[str, str] = {}
        self.lines: List[str] = []
        self.ids = ml.access_ids(s.assignment.rhs)
        self.acc_by_id = {a.id: a for a in s.accesses}
        self.out = s.output
        self.chunk_kind: Optional[str] = None  # None | "dense" | "sparse"
        self.chunk_level: Optional[LevelPlan] = None
        # sparse workspaces come from the runtime (scorch._runtime.workspace, a std::map per
        # thread) for the value types it is instantiated for; otherwise std::map directly
        self.unit = unit_stride_accesses(s)
        last = s.loop_order[-1] if s.loop_order else None
        self.out_unit = last if (s.output.dense and s.output.vars and s.output.vars[-1] == last) else None
        self.rt_ws = (s.output.mode == "ws" and not s.output.ws_dense
                      and self.vt in ("float", "double", "int32_t", "int64_t"))
        self.row_depth = self.row_accumulation_depth()
        self.dot = self.vector_dot()
        self.W: Optional[int] = None       # compile-time extent of the innermost loop
        self.lanes = 16 if self.vt == "float" else 8      # one 512-bit register
        self.vtype = "scorch_vf" if self.vt == "float" else "scorch_vd"
        self.vec_at: Optional[int] = None   # vector leaf: the row offset being generated
        self.dense_flags: Dict[int, bool] = {}
        self.store_all = False             # every output element is stored (no memset)
        self.ws_map = False                # this nest's workspace: std::map, else dense arrays
        self.rows = self.rows_assembly()
        # output index type of the appended coordinates (rows assembly): the inputs' width
        self.oit = ("int32_t" if self.idx and all(t == "int32_t" for t in self.idx.values())
                    else "int64_t")
        if self.rows:
            self.crd_buf, self.val_buf = f"AppendBuffer[{self.oit}]", f"AppendBuffer[{self.vt}]"
        else:
            self.crd_buf, self.val_buf = "vector[int64_t]", f"vector[{self.vt}]"

    # ---- helpers ------------------------------------------------------------------
    def local(self, name: str, ctype: str = "int64_t") -> str:
        self.locals.setdefault(name, ctype)
        return name

    def arg(self, name: str, ctype: str, what: tuple) -> str:
        if all(a[0] != name for a in self.args):
            self.args.append((name, ctype, what))
        return "a." + name

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def emit_all(self, ind: int, lines: List[str]) -> None:
        for ln in lines:
            self.emit(ind, ln)

    # ---- arguments ----------------------------------------------------------------
    def collect_args(self) -> None:
        for v in self.s.loop_order:
            self.arg(f"N_{v}", "int64_t", ("size", v))
        for ap in self.s.accesses:
            if ap.sparse:
                it = self.idx[ap.id]
                for lv in ap.levels:
                    if lv.has_pos:
                        self.arg(f"t{ap.id}_pos{lv.k}", it + "*", ("pos", ap.id, lv.k))
                    if lv.kind.is_sparse:
                        self.arg(f"t{ap.id}_crd{lv.k}", it + "*", ("crd", ap.id, lv.k))
            else:
                for v in dict.fromkeys(ap.indices):
                    self.arg(f"t{ap.id}_st_{v}", "int64_t", ("stride", ap.id, v))
            self.arg(f"t{ap.id}_vals", self.vt + "*", ("vals", ap.id))
        if self.out.pattern >= 0:
            self.arg("out_vals", self.vt + "*", ("out",))
        if self.out.dense:
            self.arg("out_vals", self.vt + "*", ("out",))
            for v in self.out.vars:
                self.arg(f"out_st_{v}", "int64_t", ("ostride", v))

    # ---- expression ---------------------------------------------------------------
    def value(self, e: Expr, st) -> str:
        if isinstance(e, Access):
            i = self.ids[e]
            ap = self.acc_by_id[i]
            p = st["pos"][i] if ap.sparse else st["off"][i]
            code = f"a.t{i}_vals[{p}]"
            if self.vec_at is not None and not ap.sparse and self.s.loop_order[-1] in ap.indices:
                code = f"(<{self.vtype}*>(a.t{i}_vals + {p} + {self.vec_at}))[0]"
            pr = st["pres"][i]
            return code if pr == "1" else f"({code} if {pr} else 0)"
        if isinstance(e, Scalar):
            return f"(<{self.vt}>{e.value!r})"
        if isinstance(e, Neg):
            return f"(-{self.value(e.a, st)})"
        op = {Mul: "*", Add: "+", Sub: "-"}[type(e)]
        return f"({self.value(e.a, st)} {op} {self.value(e.b, st)})"

    # ---- output ---------------------------------------------------------------------
    def rows_assembly(self) -> int:
        """``m`` when the sparse output is ``m >= 1`` dense levels over one compressed level
        (CSR, or a batch of CSRs) and the first ``m`` loops are those dense variables, in
        order: each chunk of the outer loop then appends only the last level's coordinates
        and values (already in the output's index type) and counts the entries of each row
        into ``pos``; a prefix sum and one parallel copy of the chunks' buffers finish the
        output: no coordinate tuples, no sort, no assembly pass. 0 otherwise (the general
        tuple path)."""
        out, s = self.out, self.s
        if out.dense or out.pattern >= 0 or out.format is None:
            return 0
        kinds = out.format.levels
        m = len(kinds) - 1
        if m < 1 or kinds[-1] is not LevelKind.COMPRESSED or any(k is not LevelKind.DENSE for k in kinds[:-1]):
            return 0
        if tuple(s.loop_order[:m]) != tuple(out.level_vars[:m]):
            return 0
        if out.mode == "ws" and (out.ws_dense or not self.rt_ws or out.ws_vars != out.level_vars[-1:]):
            return 0
        return m

    def drain(self, it: str, crd: str, vals: str) -> str:
        """Sorted read-out of the workspace: the std::map's, or the local dense one's
        (``workspace.h``: dense_ws_drain)."""
        if self.ws_map:
            return f"ws.drain({crd}, {vals}, 0)"
        return f"dense_ws_drain[int32_t, {it}, {self.vt}](wl, wc, wlo, whi, wv, wm, {crd}, {vals}, wsp.sort_tmp)"

    def row_position(self) -> str:
        """The output row (the compressed level's parent position) of the current loops."""
        p = ""
        for v in self.out.level_vars[:self.rows]:
            p = _cvar(v) if not p else f"({p}) * a.N_{v} + {_cvar(v)}"
        return p

    def emit_tuple(self, ind: int, val: str) -> None:
        if self.rows:
            self.emit(ind, f"deref(ocrd).push_back({_cvar(self.out.level_vars[-1])})")
            self.emit(ind, f"deref(oval).push_back({val})")
            self.emit(ind, f"a.out_pos[{self.row_position()} + 1] += 1")
            return
        # one coordinate vector per output level (ocrd[l]), one value vector
        for l, v in enumerate(self.out.level_vars):
            self.emit(ind, f"ocrd[{l}].push_back({_cvar(v)})")
        self.emit(ind, f"deref(oval).push_back({val})")

    def ws_key(self) -> str:
        key = ""
        for v in self.out.ws_vars:
            key = _cvar(v) if not key else f"({key}) * a.N_{v} + {_cvar(v)}"
        return key

    def leaf(self, ind: int, st) -> None:
        cond = ml.to_code(self.s.formula, lambda i: st["pres"][i])
        if cond != "1":
            self.emit(ind, f"if {cond}:")
            ind += 1
        val = self.value(self.s.assignment.rhs, st)
        mode = self.out.mode
        if mode == "dense" and self.out.acc_depth >= 0:
            self.emit(ind, f"acc += {val}")
        elif mode == "dense":
            self.emit(ind, f"a.out_vals[{st['oo']}] += {val}")
        elif mode == "direct" and self.out.pattern >= 0:
            self.emit(ind, f"a.out_vals[{st['pos'][self.out.pattern]}] = {val}")
        elif mode == "direct":
            self.emit_tuple(ind, val)
        elif mode == "acc" and self.out.pattern >= 0:
            self.emit(ind, f"acc += {val}")
        elif mode == "acc":
            self.emit(ind, f"acc += {val}")
            self.emit(ind, "hit = 1")
        elif self.out.ws_dense:
            self.local("wkey")
            self.emit(ind, f"wkey = {self.ws_key()}")
            self.emit(ind, f"wsv[wkey] = wsv[wkey] + {val}")
            self.emit(ind, "wsf[wkey] = 1")
        elif self.rt_ws:
            # the dense workspace lives in locals (values, marks, touched list, range), so
            # the add is a few register operations; the std::map one is the runtime's
            self.local("wkey")
            self.emit(ind, f"wkey = {self.ws_key()}")
            # branch-free: whether the coordinate is new is data-dependent (about one add in
            # two on a mesh), a branch on it mispredicts; the touched list is always written
            # and its end advances only for a new coordinate
            if self.ws_map:
                self.emit(ind, f"ws.add(wkey, {val})")
            else:
                self.local("wnew", "int")
                self.emit_all(ind, ["wnew = 1 - wm[wkey]", "wm[wkey] = 1",
                                    f"wv[wkey] = wv[wkey] + {val}",
                                    "wl[wc] = <int32_t>wkey", "wc = wc + wnew",
                                    "wlo = wkey if wkey < wlo else wlo",
                                    "whi = wkey if wkey > whi else whi"])
        else:
            self.local("wkey")
            self.local("wref", self.vt + "*")
            self.emit(ind, f"wkey = {self.ws_key()}")
            self.emit(ind, "wref = &ws[wkey]")
            self.emit(ind, f"wref[0] = wref[0] + {val}")

    # ---- output rows in registers ----------------------------------------------------
    def row_accumulation_depth(self) -> int:
        """Depth ``d`` of the first reduction loop when a dense output's row (its innermost,
        unit-stride variable ``L``, the innermost loop, dense in every operand) is summed over
        the reduction loops ``d .. -1`` (SpMM ``i, j, k``: d = 1): that row is accumulated
        locally (a compile-time-width array gcc keeps in vector registers, or the output row
        itself, zeroed where it starts) and stored once per output row. -1 when not."""
        s, out = self.s, self.out
        order = s.loop_order
        if not out.dense or out.mode != "dense" or out.acc_depth >= 0 or len(order) < 3:
            return -1
        L = order[-1]
        if self.out_unit != L or len(set(out.vars)) != len(out.vars):
            return -1
        if any(ap.sparse and L in ap.level_vars for ap in s.accesses):
            return -1
        red = set(s.assignment.reduction)
        d = next((n for n, v in enumerate(order) if v in red), -1)
        if d <= 0 or not all(v in red for v in order[d:-1]):
            return -1
        if set(order[:d]) | {L} != set(out.vars):
            return -1
        return d

    def stores_once(self, depth: int) -> bool:
        """Every loop above ``depth`` is an output loop visiting its whole extent, so a store
        at ``depth`` writes every output element exactly once: it can assign (no memset)."""
        ok = all(self.dense_flags.get(n, False) and self.s.loop_order[n] in self.out.vars
                 for n in range(depth))
        self.store_all = ok
        return ok

    def row_start(self, ind: int, st) -> None:
        self.stores_once(self.row_depth)
        cv = _cvar(self.s.loop_order[-1])
        self.local(cv)
        if self.W is not None:
            for c in range(self.W // self.lanes):
                self.local(f"wv{c}", self.vtype)
                self.emit(ind, f"wv{c} = {self.vtype}_zero()")
        elif self.store_all:
            self.emit(ind, f"for {cv} in range(a.N_{self.s.loop_order[-1]}):")
            self.emit(ind + 1, f"a.out_vals[{st['oo']} + {cv}] = 0")

    def row_end(self, ind: int, st) -> None:
        if self.W is None:
            return
        for c in range(self.W // self.lanes):
            p = f"(<{self.vtype}*>(a.out_vals + {st['oo']} + {c * self.lanes}))[0]"
            self.emit(ind, f"{p} = wv{c}" if self.store_all else f"{p} = {p} + wv{c}")

    def vector_dot(self) -> bool:
        """The innermost loop is a reduction of a scalar accumulator wrapping only it (SDDMM's
        ``k``), dense in every operand: at a compile-time width it becomes vector products
        summed lane-wise, then one horizontal sum (no loop, no remainder)."""
        s, out = self.s, self.out
        order = s.loop_order
        if not order or out.acc_depth != len(order) - 1 or out.mode not in ("acc", "dense"):
            return False
        L = order[-1]
        if L not in s.assignment.reduction:
            return False
        if any(ap.sparse and L in ap.level_vars for ap in s.accesses):
            return False
        return all(ap.id in self.unit for ap in s.accesses if not ap.sparse and L in ap.indices)

    def vec_leaf(self, ind: int, st) -> None:
        """The innermost (row) loop of a compile-time width as whole vectors: accesses
        streamed by it are vector loads, the others scalars (GCC vector extensions
        broadcast them), one accumulator register per vector of the row (or, for a
        reduction, lane-wise partial sums added horizontally once)."""
        cond = ml.to_code(self.s.formula, lambda i: st["pres"][i])
        if cond != "1":
            self.emit(ind, f"if {cond}:")
            ind += 1
        if self.row_depth < 0:   # vector dot product
            terms = []
            for c in range(self.W // self.lanes):
                self.vec_at = c * self.lanes
                terms.append(self.value(self.s.assignment.rhs, st))
            self.vec_at = None
            self.emit(ind, f"acc = acc + {self.vtype}_hsum({' + '.join(terms)})")
            if self.out.mode == "acc" and self.out.pattern < 0:
                self.emit(ind, "hit = 1")
            return
        for c in range(self.W // self.lanes):
            self.vec_at = c * self.lanes
            self.emit(ind, f"wv{c} = wv{c} + {self.value(self.s.assignment.rhs, st)}")
        self.vec_at = None

    # ---- loops ----------------------------------------------------------------------
    def loop(self, depth: int, ind: int, st) -> None:
        order = self.s.loop_order
        if depth == len(order):
            self.leaf(ind, st)
            return
        out = self.out
        if out.mode == "ws" and depth == out.ws_depth and not out.ws_dense and not self.rt_ws:
            self.emit(ind, "ws.clear()")
        if out.mode == "ws" and depth == out.ws_depth and self.rt_ws:
            # a new fiber: values and marks are already clear (the drain cleared them)
            if not self.ws_map:
                self.emit_all(ind, ["wc = 0", "wlo = wsize", "whi = -1"])
        if out.mode == "acc" and depth == out.acc_depth and out.pattern >= 0:
            self.local("acc", self.vt)
            self.emit(ind, "acc = 0")
        elif out.mode == "acc" and depth == out.acc_depth:
            self.local("acc", self.vt)
            self.local("hit", "int")
            self.emit(ind, "acc = 0")
            self.emit(ind, "hit = 0")
        if out.mode == "dense" and depth == out.acc_depth:
            self.local("acc", self.vt)
            self.emit(ind, "acc = 0")
        if depth == self.row_depth:
            self.row_start(ind, st)
        self.loop_body(depth, ind, st)
        if depth == self.row_depth:
            self.row_end(ind, st)
        if out.mode == "ws" and depth == out.ws_depth and out.ws_dense:
            self.local("wkey")
            self.emit(ind, "for wi in range(wsize):")
            self.emit(ind + 1, "if wsf[wi]:")
            self.emit(ind + 2, "wkey = wi")
            for v in reversed(out.ws_vars):
                self.emit(ind + 2, f"{_cvar(v)} = wkey % a.N_{v}")
                self.emit(ind + 2, f"wkey = wkey // a.N_{v}")
            self.emit_tuple(ind + 2, "wsv[wi]")
            self.emit(ind + 2, "wsv[wi] = 0")
            self.emit(ind + 2, "wsf[wi] = 0")
        elif out.mode == "ws" and depth == out.ws_depth and self.rt_ws:
            # drain the runtime workspace (sorted, leaves it empty) and append the tuples
            self.local("wn")
            self.local("wi")
            if len(out.ws_vars) > 1:
                self.local("wkeys", "vector[int64_t]")
                self.local("wvals", f"vector[{self.vt}]")
            self.emit(ind, "wn = ws.size()" if self.ws_map else "wn = wc")
            self.emit(ind, "if wn:")
            if self.rows:
                # straight into room made in the chunk's buffers; the row's count into pos
                self.local("wb")
                self.emit(ind + 1, "wb = deref(oval).size()")
                self.emit(ind + 1, "deref(oval).grow(wn)")
                self.emit(ind + 1, "deref(ocrd).grow(wn)")
                self.emit(ind + 1, self.drain(self.oit, "deref(ocrd).data() + wb", "deref(oval).data() + wb"))
                self.emit(ind + 1, f"a.out_pos[{self.row_position()} + 1] += wn")
            elif len(out.ws_vars) == 1:
                # the key is the last level's coordinate: drain straight into the output
                # buffers, and repeat the prefix coordinates wn times
                L = len(out.level_vars) - 1
                self.local("wb")
                self.emit(ind + 1, "wb = deref(oval).size()")
                self.emit(ind + 1, "deref(oval).resize(wb + wn)")
                self.emit(ind + 1, f"ocrd[{L}].resize(wb + wn)")
                self.emit(ind + 1, self.drain("int64_t", f"ocrd[{L}].data() + wb", "deref(oval).data() + wb"))
                for l, v in enumerate(out.level_vars[:L]):
                    self.emit(ind + 1, f"ocrd[{l}].insert(ocrd[{l}].end(), <size_t>wn, {_cvar(v)})")
            else:
                self.emit(ind + 1, "wkeys.resize(wn)")
                self.emit(ind + 1, "wvals.resize(wn)")
                self.emit(ind + 1, self.drain("int64_t", "wkeys.data()", "wvals.data()"))
                self.emit(ind + 1, "for wi in range(wn):")
                self.emit(ind + 2, "wkey = wkeys[wi]")
                for v in reversed(out.ws_vars):
                    self.emit(ind + 2, f"{_cvar(v)} = wkey % a.N_{v}")
                    self.emit(ind + 2, f"wkey = wkey // a.N_{v}")
                self.emit_tuple(ind + 2, "wvals[wi]")
        elif out.mode == "ws" and depth == out.ws_depth:
            self.local("wit", f"cmap[int64_t, {self.vt}].iterator")
            self.emit(ind, "wit = ws.begin()")
            self.emit(ind, "while wit != ws.end():")
            self.emit(ind + 1, "wkey = deref(wit).first")
            for v in reversed(out.ws_vars):
                self.emit(ind + 1, f"{_cvar(v)} = wkey % a.N_{v}")
                self.emit(ind + 1, f"wkey = wkey // a.N_{v}")
            self.emit_tuple(ind + 1, "deref(wit).second")
            self.emit(ind + 1, "inc(wit)")
        if out.mode == "acc" and depth == out.acc_depth and out.pattern >= 0:
            # every stored entry of the pattern operand is one output entry (the caller runs
            # this kernel only when the reductions are non-empty)
            self.emit(ind, f"a.out_vals[{st['pos'][out.pattern]}] = acc")
        elif out.mode == "acc" and depth == out.acc_depth:
            self.emit(ind, "if hit:")
            self.emit_tuple(ind + 1, "acc")
        if out.mode == "dense" and depth == out.acc_depth:
            self.emit(ind, f"a.out_vals[{st['oo']}] {'=' if self.stores_once(depth) else '+='} acc")

    def loop_body(self, depth: int, ind: int, st) -> None:
        v = self.s.loop_order[depth]
        cv = self.local(_cvar(v))
        f = self.s.formula
        locs: List[LevelPlan] = []
        iters: List[LevelPlan] = []
        for ap in self.s.accesses:
            if ap.sparse:
                k = st["k"][ap.id]
                if k < len(ap.levels) and ap.levels[k].var == v:
                    (locs if ap.levels[k].locates else iters).append(ap.levels[k])
        strided = [ap for ap in self.s.accesses if not ap.sparse and v in ap.indices]
        it_ids = [lv.access for lv in iters]
        dense = (not iters) or ml.dense_needed(f, it_ids)
        nec = set(ml.necessary(f, it_ids)) if iters else set()
        chunked = depth == 0 and self.chunk_kind is not None

        # segment setup
        for lv in iters:
            self.local(lv.q)
            self.local(lv.hi)
            self.local(lv.qe)
            if chunked and self.chunk_kind == "sparse":
                continue
            parent = lv.segment_parent(st["pos"], st["seg"])
            self.emit_all(ind, segment_setup(lv, parent, st["pres"][lv.access]))

        new = {"pos": dict(st["pos"]), "seg": dict(st["seg"]), "pres": dict(st["pres"]),
               "k": dict(st["k"]), "off": dict(st["off"]), "oo": st["oo"]}
        for lv in iters + locs:
            new["k"][lv.access] += 1
        body: List[str] = []  # lines at loop-body indentation, before the nested loops

        bound = set(self.s.loop_order[:depth + 1])

        def chase():
            # levels whose variable is already bound (a repeated index: a diagonal) locate
            # the bound coordinate: dense levels by arithmetic, sparse levels by a search
            for ap in self.s.accesses:
                if not ap.sparse:
                    continue
                while new["k"][ap.id] < len(ap.levels) and ap.levels[new["k"][ap.id]].var in bound:
                    lv = ap.levels[new["k"][ap.id]]
                    new["k"][ap.id] += 1
                    cu = _cvar(lv.var)
                    if lv.locates:
                        p = self.local(lv.p)
                        body.append(f"{p} = {new['pos'][ap.id]} * a.N_{lv.var} + {cu}")
                        new["pos"][ap.id] = p
                        continue
                    self.local(lv.q)
                    self.local(lv.hi)
                    self.local(lv.qe)
                    fl = self.local(lv.found, "int")
                    parent = lv.segment_parent(new["pos"], new["seg"])
                    body.extend(segment_setup(lv, parent, new["pres"][ap.id]))
                    body.append(f"while {lv.q} < {lv.hi} and {lv.crd}[{lv.q}] < {cu}:")
                    body.append(f"    {lv.q} += 1")
                    body.append(f"{fl} = {lv.q} < {lv.hi} and {lv.crd}[{lv.q}] == {cu}")
                    body.append(f"if {fl}:")
                    body.extend("    " + x for x in group_end(lv, cu))
                    new["pres"][ap.id] = fl
                    if lv.grouped:
                        new["seg"][ap.id] = (lv.q, lv.qe)
                        new["pos"][ap.id] = None
                    else:
                        new["pos"][ap.id] = lv.q

        def bind_children():
            for lv in iters:
                if lv.grouped:
                    new["seg"][lv.access] = (lv.q, lv.qe)
                    new["pos"][lv.access] = None
                else:
                    new["pos"][lv.access] = lv.q
            for lv in locs:
                p = self.local(lv.p)
                par = st["pos"][lv.access]
                body.append(f"{p} = {cv}" if par == "0" else f"{p} = {par} * a.N_{v} + {cv}")
                new["pos"][lv.access] = p
            for ap in strided:
                o = self.local(f"o{ap.id}_{depth}")
                prev = st["off"][ap.id]
                unit = ap.id in self.unit and v == self.s.loop_order[-1]
                step = cv if unit else f"{cv} * a.t{ap.id}_st_{v}"
                body.append(f"{o} = {step}" if prev == "0" else f"{o} = {prev} + {step}")
                new["off"][ap.id] = o
            if self.out.dense and v in self.out.vars:
                o = self.local(f"oo_{depth}")
                step = cv if self.out_unit == v else f"{cv} * a.out_st_{v}"
                body.append(f"{o} = {step}" if st["oo"] == "0" else f"{o} = {st['oo']} + {step}")
                new["oo"] = o
            chase()

        self.dense_flags[depth] = dense
        if dense:
            lo, hi = ("clo", "chi") if chunked else ("0", f"a.N_{v}")
            if self.W is not None and depth == len(self.s.loop_order) - 1:
                self.vec_leaf(ind, st)
                return
            self.emit(ind, f"for {cv} in range({lo}, {hi}):")
            for lv in iters:
                fl = self.local(lv.found, "int")
                body.append(f"{fl} = {lv.q} < {lv.hi} and {lv.crd}[{lv.q}] == {cv}")
                body.append(f"if {fl}:")
                body.extend("    " + x for x in group_end(lv, cv))
                new["pres"][lv.access] = fl
            bind_children()
            self.emit_all(ind + 1, body)
            self.loop(depth + 1, ind + 1, new)
            for lv in iters:
                self.emit(ind + 1, f"if {lv.found}:")
                self.emit(ind + 2, f"{lv.q} = {lv.qe}")
        elif len(iters) == 1:
            lv = iters[0]
            new["pres"][lv.access] = "1"
            if not lv.grouped:
                lo, hi = ("clo", "chi") if chunked else (lv.q, lv.hi)
                qv = lv.q
                self.emit(ind, f"for {qv} in range({lo}, {hi}):")
                body.append(f"{cv} = {lv.crd}[{qv}]")
                bind_children()
                self.emit_all(ind + 1, body)
                self.loop(depth + 1, ind + 1, new)
            else:
                self.emit(ind, f"while {lv.q} < {lv.hi}:")
                body.append(f"{cv} = {lv.crd}[{lv.q}]")
                body.extend(group_end(lv, cv))
                bind_children()
                self.emit_all(ind + 1, body)
                self.loop(depth + 1, ind + 1, new)
                self.emit(ind + 1, f"{lv.q} = {lv.qe}")
        else:
            cond = ml.loop_condition(f, it_ids, lambda i: next(
                f"{l.q} < {l.hi}" for l in iters if l.access == i))
            self.emit(ind, f"while {cond}:")
            big = "9223372036854775807"
            body.append(f"{cv} = {big}")
            for lv in iters:
                body.append(f"if {lv.q} < {lv.hi} and {lv.crd}[{lv.q}] < {cv}:")
                body.append(f"    {cv} = {lv.crd}[{lv.q}]")
            for lv in iters:
                fl = self.local(lv.found, "int")
                body.append(f"{fl} = {lv.q} < {lv.hi} and {lv.crd}[{lv.q}] == {cv}")
                body.append(f"if {fl}:")
                body.extend("    " + x for x in group_end(lv, cv))
                new["pres"][lv.access] = "1" if lv.access in nec else fl
            guard = ml.to_code(f, lambda i: next((l.found for l in iters if l.access == i), "1"))
            bind_children()
            self.emit_all(ind + 1, body)
            if guard != "1":
                self.emit(ind + 1, f"if {guard}:")
                self.loop(depth + 1, ind + 2, new)
            else:
                self.loop(depth + 1, ind + 1, new)
            for lv in iters:
                self.emit(ind + 1, f"if {lv.found}:")
                self.emit(ind + 2, f"{lv.q} = {lv.qe}")

    # ---- chunking -------------------------------------------------------------------
    def decide_chunking(self) -> None:
        order = self.s.loop_order
        if not order or order[0] not in self.out.vars:
            return
        if self.out.mode == "ws" and self.out.ws_depth == 0:
            return
        v = order[0]
        iters = []
        for ap in self.s.accesses:
            if ap.sparse and ap.levels[0].var == v and ap.levels[0].kind.is_sparse:
                iters.append(ap.levels[0])
        if not iters:
            self.chunk_kind = "dense"
        elif len(iters) == 1 and not iters[0].grouped and not ml.dense_needed(self.s.formula, [iters[0].access]):
            self.chunk_kind = "sparse"
            self.chunk_level = iters[0]

    def balance_pos(self) -> Optional[str]:
        """The pos array that weighs a dense outermost loop's iterations by stored entries
        (a compressed level directly under a dense level on that variable: CSR's row
        pointer), or None."""
        if self.chunk_kind != "dense":
            return None
        v = self.s.loop_order[0]
        for ap in self.s.accesses:
            if (ap.sparse and len(ap.levels) > 1 and ap.levels[0].var == v
                    and ap.levels[0].locates and ap.levels[1].has_pos
                    and ap.levels[1].kind.is_sparse):
                return f"a.t{ap.id}_pos{ap.levels[1].k}"
        return None

    # ---- whole module -----------------------------------------------------------------
    def nest(self, W: Optional[int], ws_map: bool = False):
        """The loop nest of one chunk function: (locals, lines). ``W``: the innermost loop's
        compile-time extent (None: the run-time ``N``); ``ws_map``: the workspace is the
        runtime's std::map (an extent too large for a dense array per thread), else local
        dense arrays. Each variant is its own function so the hot loop has no run-time
        branch and no call that would push its variables out of registers."""
        self.W = W
        self.ws_map = ws_map
        self.lines = []
        self.locals = {}
        self.dense_flags = {}
        self.store_all = False
        init = {"pos": {a.id: "0" for a in self.s.accesses if a.sparse},
                "seg": {}, "pres": {a.id: "1" for a in self.s.accesses},
                "k": {a.id: 0 for a in self.s.accesses},
                "off": {a.id: "0" for a in self.s.accesses if not a.sparse}, "oo": "0"}
        if self.out.mode == "ws" and self.out.ws_dense:
            self.local("wsize")
            self.local("wi")
            self.local("wsv", self.vt + "*")
            self.local("wsf", "char*")
            size = " * ".join(f"a.N_{v}" for v in self.out.ws_vars)
            self.lines.append(f"    wsize = {size}")
            self.lines.append(f"    wsv = <{self.vt}*>calloc(wsize + 1, sizeof({self.vt}))")
            self.lines.append("    wsf = <char*>calloc(wsize + 1, 1)")
        elif self.out.mode == "ws" and self.rt_ws:
            # std::map (the paper's red-black tree) in general; a dense array with a
            # touched list when the workspace's extent is small enough to allocate per thread
            if self.ws_map:
                self.local("ws", f"SparseWorkspace[{self.vt}]")
            else:
                for name, ct in (("wv", self.vt + "*"), ("wm", "uint8_t*"), ("wl", "int32_t*"),
                                 ("wc", "int64_t"), ("wlo", "int64_t"),
                                 ("whi", "int64_t"), ("wsize", "int64_t"),
                                 ("wsp", f"DenseScratch[{self.vt}]*")):
                    self.local(name, ct)
                size = " * ".join(f"a.N_{v}" for v in self.out.ws_vars)
                # the thread's own arrays, kept across calls (no allocation, no zeroing)
                self.lines.append(f"    wsize = {size}")
                self.lines.append(f"    wsp = dense_scratch[{self.vt}](wsize + 1)")
                self.lines.append("    wv = wsp.values")
                self.lines.append("    wm = wsp.mark")
                self.lines.append("    wl = wsp.touched")
        elif self.out.mode == "ws":
            self.local("ws", f"cmap[int64_t, {self.vt}]")
        self.loop(0, 1, init)
        if self.out.mode == "ws" and self.out.ws_dense:
            self.lines.append("    free(wsv)")
            self.lines.append("    free(wsf)")
        return self.locals, self.lines

    def widths(self) -> Tuple[int, ...]:
        """Innermost extents that get their own chunk function (a fixed number of vector
        operations per row, the row accumulated in registers): 16 float32 = one AVX-512
        register. Only for the row accumulation (``row_accumulation_depth``)."""
        if (self.row_depth < 0 and not self.dot) or self.vt not in ("float", "double"):
            return ()
        return (16, 32, 64, 128) if self.vt == "float" else (8, 16, 32, 64)

    @staticmethod
    def run_chunks(w, fn: str, one: str, each: str, ind: str = "    ", args: str = "&a") -> None:
        """Lines that run chunk function ``fn`` over all chunks: inline for one chunk,
        else under ``prange`` (dynamic); ``one``/``each``: its buffer arguments."""
        w(f"{ind}if nchunks == 1:")
        w(f"{ind}    with nogil:")
        w(f"{ind}        {fn}({args}, lo0, hi0, {one})")
        w(f"{ind}else:")
        w(f"{ind}    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
        w(f"{ind}        {fn}({args}, bounds[t], bounds[t + 1], {each})")

    def panels(self) -> Tuple[int, ...]:
        """Panel widths the innermost (tiled, Algorithm 3) loop can be cut into: the row
        widths, when the row is accumulated in registers (SpMM's k). The caller picks one
        per input (``tensor_compiler.panel_width``) or 0 for whole rows."""
        if self.row_depth < 0 or self.s.loop_order[-1] not in self.s.tiled:
            return ()
        return self.widths()

    def panel_loop(self, w) -> None:
        """Tiling of the innermost dense loop into panels (paper Algorithm 3; the width is
        chosen per input by ``tensor_compiler.choose_panel``): the loop nest runs once per
        panel of ``panel`` columns on shifted base pointers of the operands the loop
        streams and of the output, with the register kernel of that width; a last, narrower
        panel runs the generic chunk function."""
        L = self.s.loop_order[-1]
        shifted = [f"t{i}_vals" for i in sorted(self.unit)] + (["out_vals"] if self.out_unit == L else [])
        w("    cdef Args b")
        w("    cdef int64_t pp, pw")
        w("    cdef chunk_fn pfn")
        w(f"    if panel > 0 and panel < a.N_{L} and panel in {self.panels()!r}:")
        w("        pfn = run_chunk")
        for W in self.panels():
            w(f"        if panel == {W}:")
            w(f"            pfn = run_chunk_w{W}")
        w("        pp = 0")
        w(f"        while pp < a.N_{L}:")   # a C loop (a range with a run-time step is not)
        w(f"            pw = min(panel, a.N_{L} - pp)")
        w("            b = a")
        w(f"            b.N_{L} = pw")
        for f in shifted:
            w(f"            b.{f} = a.{f} + pp")
        w("            fn = pfn if pw == panel else run_chunk")
        self.run_chunks(w, "fn", "NULL, NULL", "NULL, NULL", " " * 12, "&b")
        w("            pp += panel")
        w("        return")

    def generate(self) -> str:
        self.collect_args()
        self.decide_chunking()
        # chunk-function variants: (name, condition that selects it, (locals, lines))
        nests = [("run_chunk", None, self.nest(None))]
        store_all = self.store_all
        L = self.s.loop_order[-1] if self.s.loop_order else None
        for W in self.widths():
            nests.append((f"run_chunk_w{W}", f"a.N_{L} == {W}", self.nest(W)))
        if self.rt_ws:
            size = " * ".join(f"a.N_{v}" for v in self.out.ws_vars)
            nests.append(("run_chunk_map", f"{size} > {DENSE_WS_LIMIT}", self.nest(None, ws_map=True)))
        src: List[str] = []
        w = src.append
        w("# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True")
        w("# distutils: language = c++")
        w(f"# scorch generated kernel (codegen v{CODEGEN_VERSION})")
        w(f"# {self.s.assignment}")
        w(f"# loop order: {', '.join(self.s.loop_order)}")
        for ap in self.s.accesses:
            desc = f"{ap.format} levels {ap.level_vars}" if ap.sparse else f"dense strided {ap.indices}"
            w(f"# T{ap.tensor} access {ap.id}: {desc}")
        pat = f", values in access {self.out.pattern}'s pattern" if self.out.pattern >= 0 else ""
        w(f"# output: {'dense' if self.out.dense else self.out.format} ({self.out.mode}{pat})")
        w("from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t")
        w("from libc.string cimport memcpy, memset")
        if self.out.mode == "ws" and self.out.ws_dense:
            w("from libc.stdlib cimport calloc, free")
        w("from libcpp.vector cimport vector")
        if self.out.mode == "ws" and self.rt_ws:
            w("from scorch._runtime.workspace cimport (AppendBuffer, DenseScratch, SparseWorkspace,\n"
              "                                        dense_scratch, dense_ws_drain)")
        elif self.rows:
            w("from scorch._runtime.workspace cimport AppendBuffer")
        elif self.out.mode == "ws" and not self.out.ws_dense:
            w("from libcpp.map cimport map as cmap")
        w("from cython.operator cimport dereference as deref, preincrement as inc")
        w("from cython.parallel cimport prange")
        if not self.out.dense and self.out.pattern < 0:
            w("import numpy as np")
        w("")
        w("cdef struct Args:")
        for name, ct, _ in self.args:
            w(f"    {ct} {name}")
        if self.rows:
            w("    int64_t* out_pos   # row counts, then (prefix sum) the compressed level's pos")
        w("")
        if self.widths():
            w("cdef extern from *:")
            w('    """')
            w("    typedef float scorch_vf __attribute__((vector_size(64), aligned(4), may_alias));")
            w("    typedef double scorch_vd __attribute__((vector_size(64), aligned(8), may_alias));")
            w("    static inline scorch_vf scorch_vf_zero(void) { scorch_vf z = {0}; return z; }")
            w("    static inline scorch_vd scorch_vd_zero(void) { scorch_vd z = {0}; return z; }")
            w("    static inline float scorch_vf_hsum(scorch_vf v) { float s = 0; for (int i = 0; i < 16; i++) s += v[i]; return s; }")
            w("    static inline double scorch_vd_hsum(scorch_vd v) { double s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }")
            w('    """')
            w(f"    ctypedef {self.vt} {self.vtype}")
            w(f"    {self.vtype} {self.vtype}_zero() noexcept nogil")
            w(f"    {self.vt} {self.vtype}_hsum({self.vtype}) noexcept nogil")
            w("")
        if len(nests) > 1:
            w(f"ctypedef void (*chunk_fn)(Args*, int64_t, int64_t, {self.crd_buf}*, "
              f"{self.val_buf}*) noexcept nogil")
            w("")
        for fn, _, (locs, nest) in nests:
            w(f"cdef void {fn}(Args* pa, int64_t clo, int64_t chi, {self.crd_buf}* ocrd, "
              f"{self.val_buf}* oval) noexcept nogil:")
            w("    cdef Args a = pa[0]")
            for name, ct in locs.items():
                w(f"    cdef {ct} {name}")
            src.extend(nest)
            w("")
        if self.c_entry:
            # the body runs without the GIL; ``kernel`` (Python) and ``KERNEL_C`` (a capsule
            # for the C fast path, ``scorch/_runtime/fastcall.cpp``) both call it
            w("cdef void kernel_c(const int64_t* args, int nthreads, int panel) noexcept nogil:")
        else:
            w("def kernel(list args, int nthreads, int panel=0):")
        w("    cdef Args a")
        for n, (name, ct, _) in enumerate(self.args):
            cast = f"<{ct}><size_t>args[{n}]" if ct.endswith("*") else f"args[{n}]"
            w(f"    a.{name} = {cast}")
        if self.out.mode == "ws":
            prod = " * ".join(f"<object>a.N_{v}" for v in self.out.ws_vars)
            w(f"    if {prod} >= 4611686018427387904:")
            w(f"        raise OverflowError('workspace over {','.join(self.out.ws_vars)} is too large to index with int64')")
        w("    cdef int64_t lo0 = 0, hi0 = 0, nchunks = 1, t, n, total, off")
        if self.chunk_kind == "dense":
            w(f"    hi0 = a.N_{self.s.loop_order[0]}")
        elif self.chunk_kind == "sparse":
            lv = self.chunk_level
            w(f"    lo0 = a.t{lv.access}_pos{lv.k}[0]")
            w(f"    hi0 = a.t{lv.access}_pos{lv.k}[1]")
        if self.chunk_kind is not None:
            w("    if nthreads > 1 and hi0 - lo0 >= 64:")
            w("        nchunks = min(hi0 - lo0, 8 * nthreads, 1024)")
        if self.out.dense and not store_all:
            # the output arrives uninitialized (torch.empty: cheaper than torch.zeros' dispatch)
            size = " * ".join(f"a.N_{v}" for v in self.out.vars) or "1"
            w(f"    memset(<void*>a.out_vals, 0, {size} * sizeof({self.vt}))")
        if len(nests) > 1:
            w("    cdef chunk_fn fn = run_chunk")
            for fn, cond, _ in nests[1:]:
                w(f"    if {cond}:")
                w(f"        fn = {fn}")
        w("    cdef int64_t bounds[1025]   # chunk boundaries (at most 1024 chunks)")
        w("    if nchunks > 1:")
        w("        for t in range(nchunks + 1):")
        w("            bounds[t] = lo0 + ((hi0 - lo0) * t) // nchunks")
        bal = self.balance_pos()
        if bal is not None:
            # equal numbers of stored entries per chunk, not equal rows: a power-law row
            # distribution would otherwise leave one thread with most of the work
            w("    cdef int64_t btot, btarget, blo, bhi, bmid")
            w("    if nchunks > 1:")
            w(f"        btot = {bal}[hi0] - {bal}[lo0]")
            w("        blo = lo0")
            w("        for t in range(1, nchunks):")
            w(f"            btarget = {bal}[lo0] + (btot * t) // nchunks")
            w("            bhi = hi0")
            w("            while blo < bhi:")
            w("                bmid = (blo + bhi) // 2")
            w(f"                if {bal}[bmid] < btarget:")
            w("                    blo = bmid + 1")
            w("                else:")
            w("                    bhi = bmid")
            w("            bounds[t] = blo")
        if self.rows:
            self.rows_epilogue(w, nests)
        else:
            self.tuples_epilogue(w, nests)
        w("")
        if self.c_entry:
            n = len(self.args)
            w("def kernel(list args, int nthreads, int panel=0):")
            w(f"    cdef int64_t values[{n}]")
            w("    cdef int i")
            w(f"    for i in range({n}):")
            w("        values[i] = args[i]")
            w("    with nogil:")
            w("        kernel_c(values, nthreads, panel)")
            w("    return None")
            w("")
            w("cdef extern from \"Python.h\":")
            w("    object PyCapsule_New(void*, const char*, void*)")
            w("")
            w(f"KERNEL_C = PyCapsule_New(<void*>kernel_c, b\"{KERNEL_C_CAPSULE}\", NULL)")
            w("")
        return "\n".join(src)

    @property
    def c_entry(self) -> bool:
        """Kernels that only write a preallocated output (dense, or values in an operand's
        pattern) run entirely without the GIL and get a C entry point (``kernel_c``)."""
        return (self.out.dense or self.out.pattern >= 0) and self.out.mode != "ws" and not self.rows

    def tuples_epilogue(self, w, nests) -> None:
        """Run the chunks, then concatenate their coordinate tuples (level-major) and values."""
        fn = "fn" if len(nests) > 1 else "run_chunk"
        if self.out.dense or self.out.pattern >= 0:
            # nothing is appended: no buffers (their allocation showed in small kernels)
            if self.panels():
                self.panel_loop(w)
            self.run_chunks(w, fn, "NULL, NULL", "NULL, NULL")
            w("    return")
            return
        R = max(1, len(self.out.level_vars))
        w("    cdef vector[vector[int64_t]] crds")
        w(f"    cdef vector[vector[{self.vt}]] vals")
        w(f"    crds.resize(nchunks * {R})")
        w("    vals.resize(nchunks)")
        self.run_chunks(w, fn, "&crds[0], &vals[0]", f"&crds[t * {R}], &vals[t]")
        w("    total = 0")
        w("    for t in range(nchunks):")
        w("        total += vals[t].size()")
        w(f"    crd_arr = np.empty({R} * total, dtype=np.int64)  # level-major: row l = level l")
        w(f"    val_arr = np.empty(total, dtype=np.{self.npvt})")
        w("    cdef size_t cp = crd_arr.ctypes.data, vp = val_arr.ctypes.data")
        w("    cdef int64_t l")
        w("    off = 0")
        w("    for t in range(nchunks):")
        w("        n = vals[t].size()")
        w("        if n:")
        w(f"            for l in range({R}):")
        w(f"                memcpy(<void*>(cp + (l * total + off) * sizeof(int64_t)), crds[t * {R} + l].data(), n * sizeof(int64_t))")
        w(f"            memcpy(<void*>(vp + off * sizeof({self.vt})), vals[t].data(), n * sizeof({self.vt}))")
        w("        off += n")
        w("    return crd_arr, val_arr")

    def rows_epilogue(self, w, nests) -> None:
        """Run the chunks (each counts its rows' entries into ``out_pos[row + 1]`` and appends
        the entries to its own buffers), prefix-sum the counts into ``pos``, and copy the
        buffers, in chunk order, into the output arrays in parallel. Returns ``(pos, crd,
        vals)`` in the output's index type (int32 unless a count or extent needs int64)."""
        it, vt = self.oit, self.vt
        dense_vars = self.out.level_vars[:self.rows]
        P = " * ".join(f"a.N_{v}" for v in dense_vars)
        last = self.out.level_vars[-1]
        if it == "int32_t":
            w(f"    if a.N_{last} > 2147483647:")
            w(f"        raise OverflowError('output dimension {last} ({{}}) does not fit the int32 "
              f"coordinates of this kernel'.format(a.N_{last}))")
        w(f"    cdef int64_t P = {P}")
        w("    pos_arr = np.zeros(P + 1, dtype=np.int64)")
        w("    a.out_pos = <int64_t*><size_t>pos_arr.ctypes.data")
        w(f"    cdef vector[{self.crd_buf}] crds")
        w(f"    cdef vector[{self.val_buf}] vals")
        w("    crds.resize(nchunks)")
        w("    vals.resize(nchunks)")
        fn = "fn" if len(nests) > 1 else "run_chunk"
        self.run_chunks(w, fn, "&crds[0], &vals[0]", "&crds[t], &vals[t]")
        w("    cdef int64_t* pp = a.out_pos")
        w("    with nogil:")
        w("        for t in range(P):")
        w("            pp[t + 1] += pp[t]")
        w("    total = pp[P]")
        w("    cdef vector[int64_t] offs")
        w("    offs.resize(nchunks + 1)")
        w("    offs[0] = 0")
        w("    for t in range(nchunks):")
        w("        offs[t + 1] = offs[t] + vals[t].size()")
        w("    if offs[nchunks] != total:")
        w("        raise RuntimeError('scorch kernel: row counts and appended entries disagree')")
        w(f"    cdef bint wide = max(total, P, {', '.join(f'a.N_{v}' for v in self.out.level_vars)}) > 2147483647")
        w("    crd_arr = np.empty(total, dtype=np.int64 if wide else np.int32)")
        w(f"    val_arr = np.empty(total, dtype=np.{self.npvt})")
        w("    cdef size_t cp = crd_arr.ctypes.data, vp = val_arr.ctypes.data")
        w("    cdef int64_t e")
        w("    for t in prange(nchunks, nogil=True, schedule='dynamic', num_threads=nthreads):")
        w("        n = vals[t].size()")
        w("        if n:")
        w(f"            memcpy(<void*>(vp + offs[t] * sizeof({vt})), vals[t].data(), n * sizeof({vt}))")
        if it == "int32_t":
            w("            if wide:")
            w("                for e in range(n):")
            w("                    (<int64_t*>cp)[offs[t] + e] = crds[t].data()[e]")
            w("            else:")
            w("                memcpy(<void*>(cp + offs[t] * sizeof(int32_t)), crds[t].data(), n * sizeof(int32_t))")
        else:
            w("            if wide:")
            w("                memcpy(<void*>(cp + offs[t] * sizeof(int64_t)), crds[t].data(), n * sizeof(int64_t))")
            w("            else:")
            w("                for e in range(n):")
            w("                    (<int32_t*>cp)[offs[t] + e] = <int32_t>crds[t].data()[e]")
        w("    return (pos_arr if wide else pos_arr.astype(np.int32)), crd_arr, val_arr")


def relayouts(s: Schedule) -> Dict[int, Tuple[int, Tuple[int, ...], Tuple[int, ...]]]:
    """Dense accesses the innermost loop streams (``unit_stride_accesses``), each with the
    dimension that must have stride 1 and the permutation that lays the operand out in loop
    order (and its inverse): the caller re-lays such an operand out when it arrives with
    another stride (e.g. SDDMM's C, read along k)."""
    rank = {v: n for n, v in enumerate(s.loop_order)}
    out = {}
    for i in unit_stride_accesses(s):
        ap = s.accesses[i]
        perm = sorted(range(len(ap.indices)), key=lambda d: rank[ap.indices[d]])
        inv = [0] * len(perm)
        for n, d in enumerate(perm):
            inv[d] = n
        out[ap.id] = (ap.indices.index(s.loop_order[-1]), tuple(perm), tuple(inv))
    return out


def panel_widths(s: Schedule, value_dtype: torch.dtype) -> Tuple[int, ...]:
    """The panel widths a kernel for ``s`` accepts (``_Gen.panels``; empty: no tiling)."""
    if value_dtype not in (torch.float32, torch.float64) or not s.loop_order:
        return ()
    return _Gen(s, value_dtype, {}).panels()


def short_rows(s: Schedule) -> Optional[Tuple[int, Tuple[str, ...]]]:
    """Whether the kernel has a short-rows variant, decided per input: the innermost loop
    is a reduction into a scalar over one sparse level (SpMV's ``acc += A[q] * x[crd[q]]``)
    whose parents are dense levels over the outer loops. gcc vectorizes that loop with
    emulated gathers, which pays on rows of a dozen entries and more but costs 10-15% on
    rows of 3-5 (NotreDame, mdual, arrow, bcspwr10), where the plain scalar loop wins; so
    a second module compiled without loop vectorization runs when ``nnz <=
    short_rows_limit(dtype) * rows``. Returns (access id, the dense parents' variables: rows = their extents'
    product), or None."""
    order, out = s.loop_order, s.output
    if not order or not out.dense or out.acc_depth != len(order) - 1:
        return None
    L = order[-1]
    if L not in s.assignment.reduction:
        return None
    iters = [(ap, lv) for ap in s.accesses if ap.sparse for lv in ap.levels if lv.var == L]
    if len(iters) != 1:
        return None
    ap, lv = iters[0]
    if (lv.k != len(ap.levels) - 1 or lv.kind is not LevelKind.COMPRESSED
            or any(p.kind is not LevelKind.DENSE for p in ap.levels[:-1])
            or tuple(p.var for p in ap.levels[:-1]) != tuple(order[:-1])):
        return None
    return ap.id, tuple(order[:-1])


def generate(s: Schedule, value_dtype: torch.dtype, index_dtypes: Dict[int, torch.dtype],
             scalar_inner: bool = False):
    """Cython source of the kernel and its argument list (field, C type, meaning).
    ``scalar_inner``: the short-rows variant (see :func:`short_rows`), built without loop
    vectorization."""
    g = _Gen(s, value_dtype, index_dtypes)
    src = g.generate()
    if scalar_inner:
        lines = src.split("\n")
        lines.insert(2, "# scorch-cflags: -fno-tree-vectorize")
        lines.insert(3, f"# short-rows variant: segments of <= {short_rows_limit(value_dtype)} "
                        f"entries on average")
        src = "\n".join(lines)
    return src, g.args
