"""The machine kernels are built for: its ISA level, vector width, vector registers and the
compiler flags that select them.

Kernels keep output rows in vector registers (``lower/facts.py``: register rows, vector
dots), so the vector width and the register budget decide which row widths get their own
variant, the panel widths (``tiling``) and the short-rows threshold; ``build.py`` compiles
with the same target's flags. A 64-byte GCC vector type on a machine with 32-byte
registers is not split into two registers per accumulator: gcc lowers such a row loop
through the stack (8x slower than 32-byte vectors on an AVX2-only EPYC), hence one target
per ISA level, not one vector size for all.

The native target is detected from ``/proc/cpuinfo``'s flags (x86: AVX-512 F/BW/DQ/VL ->
``avx512``, AVX2 with FMA -> ``avx2``, SSE4.2 -> ``sse``; aarch64 -> ``neon``; anything
else ``generic``) and built with ``-march=native``. ``SCORCH_TARGET=avx512|avx2|sse|generic``
chooses another one (read once, at first use; :func:`set_target` switches in process):
kernels are then built with ``-march=x86-64-v4`` / ``-march=haswell`` / ``-march=x86-64-v2``
(AVX2 kernels built and run on an AVX-512 machine), their sources say so on a
``# scorch-target:`` line (so the kernel cache keys differ), and the plan key carries the
target. Kernels of a target this CPU cannot run are refused at build time, not at their
first illegal instruction.

The CPU's maker (``cpu``: ``intel``, ``amd`` or ``other``, from ``/proc/cpuinfo``'s
``vendor_id``; ``SCORCH_CPU`` overrides it) goes with every target, whichever ISA level it
builds for: the kernels run on this CPU, and some loop choices measured on one maker's cores
lose on the other's (``lower/facts.py``'s ``row_loop_tuning``: hardware gathers and
non-temporal stream requests in SpMV's row loop).
"""
from __future__ import annotations

import os
import platform
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

__all__ = ["Target", "TARGETS", "TARGET_ENV", "CPU_ENV", "CPU_MAKERS", "cpu_maker", "ROW_BYTES", "MIN_VECTOR_BYTES", "value_bytes", "vector_type_name", "current", "set_target", "use_target", "target_named",
           "native_target", "cpu_flags", "runnable", "on_change", "SOURCE_TAG",
           "openmp_library", "openmp_link_flags"]

#: the environment variable that overrides the detected target
TARGET_ENV = "SCORCH_TARGET"
#: the environment variable that overrides the detected CPU maker
CPU_ENV = "SCORCH_CPU"
#: the CPU makers whose cores the loop choices know (anything else: ``other``)
CPU_MAKERS = ("intel", "amd", "other")
#: ``/proc/cpuinfo``'s ``vendor_id`` -> maker
_VENDOR_IDS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}
#: the kernel-source line naming a chosen (not native) target: ``# scorch-target: avx2``
SOURCE_TAG = "# scorch-target: "

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_ARM = platform.machine().lower() in ("aarch64", "arm64")

#: the widest output row kept in registers (bytes): 8 AVX-512 registers
ROW_BYTES = 512
#: the narrowest vector a register row uses (bytes): one SSE / NEON register, 4 float32
MIN_VECTOR_BYTES = 16
#: the value types' sizes (bytes), for lanes per vector
_SIZES = {"float": 4, "double": 8}


def value_bytes(ctype: str) -> int:
    """The size of a floating value type of the kernels (``float``: 4, ``double``: 8)."""
    return _SIZES[ctype]


@dataclass(frozen=True)
class Target:
    """One ISA level: ``vector_bytes`` per vector register, ``vector_registers`` of them,
    ``march`` (the flags choosing the ISA when built for it by name), ``requires`` (the
    ``/proc/cpuinfo`` flags a CPU needs to run its kernels), ``native`` (detected here:
    built with ``-march=native``) and ``cpu``, the maker of the CPU the kernels run on
    (:func:`cpu_maker`)."""
    name: str
    vector_bytes: int
    vector_registers: int
    march: Tuple[str, ...]
    requires: FrozenSet[str] = frozenset()
    native: bool = False
    cpu: str = "other"

    def lanes(self, ctype: str) -> int:
        """Values of C type ``ctype`` (``float``, ``double``) per vector register."""
        return self.vector_bytes // _SIZES[ctype]

    def row_widths(self, ctype: str) -> Tuple[int, ...]:
        """Output-row widths kept in registers, one kernel variant each: rows of 16 and 32
        bytes (narrower than the register: one half- or quarter-width vector, see
        :meth:`vector_bytes_for`), then 1, 2, 4, ... full vectors up to a 512-byte row (128
        float32) or the register file, whichever is smaller. AVX-512: 16 B, 32 B, 1-8 zmm;
        AVX2: 16 B, 1-16 ymm (at 16 accumulators gcc keeps two of them in L1, still faster
        than 64-wide panels or the generic row loop: SpMM K = 128 on copter2 45 ms against
        64 and 63 ms, ``benchmarks/report_targets.py``; on a real AVX2-only Zen 3, 4elt
        4.9 ms against 6.9 ms in 64-wide panels, rmat16 equal). Without the narrow rows a K = 8
        float32 row on AVX-512 ran gcc's run-time-width loop, whose 16-wide body never
        runs: 0.13-0.62x of torch CSR."""
        n = MIN_VECTOR_BYTES // _SIZES[ctype]
        most = min(ROW_BYTES, self.vector_registers * self.vector_bytes) // _SIZES[ctype]
        out = []
        while n <= most:
            out.append(n)
            n *= 2
        return tuple(out)

    def vector_bytes_for(self, ctype: str, width: int) -> int:
        """The vector size (bytes) a register row of ``width`` values of ``ctype`` is kept
        in: the target's register, or the row itself when it is narrower (a 32-byte row on
        AVX-512 is one ymm, not a zmm half of which is loaded past the row's end)."""
        return min(self.vector_bytes, width * _SIZES[ctype])

    @property
    def tag(self) -> str:
        """What the kernel source says about its target: nothing for the native one."""
        return "" if self.native else self.name

    @property
    def key(self) -> Tuple[str, bool, str]:
        """The target's part of a plan key."""
        return (self.name, self.native, self.cpu)


def vector_type_name(ctype: str, nbytes: int, register_bytes: int) -> str:
    """The GCC vector type's name in kernel sources: ``scorch_vf`` / ``scorch_vd`` for one
    whole register, ``scorch_vf32`` etc. for a narrower vector of ``nbytes``."""
    base = "scorch_vf" if ctype == "float" else "scorch_vd"
    return base if nbytes >= register_bytes else f"{base}{nbytes}"


def _x86(name: str, vbytes: int, regs: int, march: Tuple[str, ...], requires: str) -> Target:
    return Target(name, vbytes, regs, march, frozenset(requires.split()))


#: the targets a user can choose by name (``SCORCH_TARGET``)
TARGETS: Dict[str, Target] = {
    "avx512": _x86("avx512", 64, 32,
                   ("-march=x86-64-v4", "-mprefer-vector-width=512", "-mtune-ctrl=^use_gather"),
                   "avx512f avx512bw avx512dq avx512vl avx512cd avx2 fma bmi2 movbe"),
    "avx2": _x86("avx2", 32, 16, ("-march=haswell", "-mtune-ctrl=^use_gather"),
                 "avx2 fma bmi1 bmi2 f16c movbe popcnt"),
    "sse": _x86("sse", 16, 16, ("-march=x86-64-v2",), "sse4_2 ssse3 popcnt"),
}
TARGETS["generic"] = (Target("generic", 16, 16, ("-march=x86-64-v2",), TARGETS["sse"].requires)
                      if _X86 else Target("generic", 16, 16, ()))


def cpu_flags() -> FrozenSet[str]:
    """The ISA flags of this machine's first CPU (``/proc/cpuinfo``'s ``flags`` or, on
    ARM, ``Features``); empty where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_maker() -> str:
    """This CPU's maker, one of :data:`CPU_MAKERS`: ``$SCORCH_CPU`` if set, else
    ``/proc/cpuinfo``'s ``vendor_id`` (``other`` where unknown, and on non-x86 machines)."""
    name = os.environ.get(CPU_ENV, "").strip().lower()
    if name:
        if name not in CPU_MAKERS:
            raise ValueError(f"{CPU_ENV}={name!r} is not a known CPU maker; choose one of "
                             f"{', '.join(CPU_MAKERS)}")
        return name
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return _VENDOR_IDS.get(value.strip(), "other")
    except OSError:
        pass
    return "other"


def _detect(flags: FrozenSet[str]) -> Target:
    """The best target this machine runs, as its native build."""
    if _X86:
        for name in ("avx512", "avx2", "sse"):
            t = TARGETS[name]
            if t.requires <= flags:
                return Target(t.name, t.vector_bytes, t.vector_registers, ("-march=native",),
                              t.requires, native=True, cpu=cpu_maker())
    if _ARM:
        return Target("neon", 16, 32, ("-march=native",), native=True, cpu=cpu_maker())
    return Target("generic", 16, 16, ("-march=native",), native=True, cpu=cpu_maker())


_native: List[Target] = []
_chosen: List[Target] = []
_hooks: List[Callable[[], None]] = []


def native_target() -> Target:
    """This machine's target (detected once per process)."""
    if not _native:
        _native.append(_detect(cpu_flags()))
    return _native[0]


def target_named(name: str) -> Target:
    """The target called ``name``; the native one's name gives the native build. Raises
    ValueError for an unknown name (naming the ones there are)."""
    nat = native_target()
    if name in ("native", nat.name):
        return nat
    t = TARGETS.get(name)
    if t is None:
        raise ValueError(f"{TARGET_ENV}={name!r} is not a known target; choose one of "
                         f"{', '.join(['native', *TARGETS])}")
    if t.march and t.march[0].startswith("-march=x86") and not _X86:
        raise ValueError(f"{TARGET_ENV}={name!r} is an x86 target and this machine is "
                         f"{platform.machine()}")
    return replace(t, cpu=nat.cpu)


def runnable(t: Target) -> bool:
    """Whether this CPU runs ``t``'s kernels."""
    return t.native or t.requires <= cpu_flags()


def current() -> Target:
    """The target kernels are generated and built for now: ``set_target``'s, else
    ``$SCORCH_TARGET``'s (read once), else the native one."""
    if not _chosen:
        _chosen.append(_from_environment())
    return _chosen[0]


def on_change(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`set_target` changes the target (the warm-call plan
    table, keyed without it, is emptied that way)."""
    _hooks.append(hook)


def set_target(name: Optional[str], cpu: Optional[str] = None) -> Target:
    """Generate and build kernels for target ``name`` from now on in this process (None:
    back to ``$SCORCH_TARGET`` / the native one), tuned for the cores of CPU maker ``cpu``
    (None: this CPU's, :func:`cpu_maker`); returns the target now in use."""
    if cpu is not None and cpu not in CPU_MAKERS:
        raise ValueError(f"cpu={cpu!r} is not a known CPU maker; choose one of {', '.join(CPU_MAKERS)}")
    chosen = None
    if name is not None:
        chosen = target_named(name.strip().lower())
    if cpu is not None:
        chosen = replace(chosen or _from_environment(), cpu=cpu)
    return _set(chosen)


def _from_environment() -> Target:
    name = os.environ.get(TARGET_ENV, "").strip().lower()
    return target_named(name) if name else native_target()


def _set(chosen: Optional[Target]) -> Target:
    before = _chosen[0] if _chosen else None
    _chosen.clear()
    if chosen is not None:
        _chosen.append(chosen)
    now = current()
    if now != before:
        for hook in _hooks:
            hook()
    return now


@contextmanager
def use_target(name: Optional[str], cpu: Optional[str] = None) -> Iterator[Target]:
    """``set_target(name, cpu)`` for the ``with`` block, then the previous target again."""
    before = current()
    try:
        yield set_target(name, cpu)
    finally:
        _set(before)


def openmp_library(torch_lib: Optional[Path] = None) -> Optional[Path]:
    """The OpenMP runtime torch ships in its ``lib`` folder (``libgomp*.so*``), or None."""
    if torch_lib is None:
        import torch
        torch_lib = Path(torch.__file__).resolve().parent / "lib"
    found = sorted(torch_lib.glob("libgomp*.so*")) if torch_lib.is_dir() else []
    return found[0] if found else None


def openmp_link_flags(torch_lib: Optional[Path] = None) -> Tuple[str, ...]:
    """Link flags that make a kernel use the OpenMP runtime torch already loaded. Two
    runtimes in one process each keep their own spinning thread pool (a GCN step on a
    loaded machine: 130 ms instead of 2). The loader shares a library by its soname, so a
    copy named ``libgomp.so.1`` (torch's wheels today) is the one ``-fopenmp``'s
    ``-lgomp`` resolves to at load time: no flags needed. A renamed copy
    (``libgomp-<hash>.so.1``, older wheels) is linked by path, found through the rpath,
    and ``--as-needed`` drops the system ``-lgomp`` that ``-fopenmp`` appends."""
    lib = openmp_library(torch_lib)
    if lib is None or lib.name == "libgomp.so.1":
        return ()
    return ("-Wl,--as-needed", str(lib), f"-Wl,-rpath,{lib.parent}")
