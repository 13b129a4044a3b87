"""How many threads a kernel call runs on."""
from __future__ import annotations

import os
import threading
import time

import torch

from ..level_storage import Storage
from .build import env_flag

__all__ = ["PARALLEL_MIN_WORK", "PASSIVE_MIN_WORK", "PASSIVE", "WORK_PER_THREAD", "threads_for", "work_of"]


def _env_count(name: str, default: int) -> int:
    """A non-negative whole number from the environment variable ``name``; a malformed one
    is an error that names the variable (at import: these are read once)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        try:
            f = float(raw)        # "1e6"
            value = int(f) if f.is_integer() else -1
        except (ValueError, OverflowError):
            value = -1
    if value < 0:
        raise ValueError(f"scorch: {name}={raw!r} is not a non-negative whole number "
                         f"(the default is {default})")
    return value


#: below this much work (stored entries + dense elements) a call runs on one thread: waking
#: a second costs more than it saves. SpMV on G51 (12k entries, work 13.8k) took 6.7 us at
#: 2 threads against 6.9 at 1 on an earlier machine, and 7.2 against 5.1 on the Zen 5
#: (libgomp's default wait policy lets the worker sleep between calls); bcspwr10 (work 32k)
#: still gains from the second thread on both (8.7 -> 6.8 us here)
PARALLEL_MIN_WORK = _env_count("SCORCH_PARALLEL_MIN_WORK", 20_000)
#: the least work each thread gets (0: none, every free core for any call past
#: PARALLEL_MIN_WORK). On the 16-core Xeon a 25 us SpMV (4elt) ran no faster on 16 threads
#: than on 8 (0.76x torch there); the next measurement there sets a default
#: (``benchmarks/device_kernels.sh OUT 3``), until then it is off
WORK_PER_THREAD = _env_count("SCORCH_WORK_PER_THREAD", 0)
#: under ``OMP_WAIT_POLICY=PASSIVE`` idle OpenMP workers sleep, and every parallel region
#: wakes them: 40-80 us a region on the 2-core VMs (with spinning workers, a few us). A call
#: then needs this much work to go parallel. A sparse layer's step (784 -> 256, 1 % stored,
#: batch 32, fwd + bwd, 2 threads) ran 253 us with PARALLEL_MIN_WORK, 74 us with this, and
#: 78 us on 1 thread
PASSIVE_MIN_WORK = _env_count("SCORCH_PASSIVE_MIN_WORK", 200_000)
#: whether this process's OpenMP workers sleep when idle (libgomp reads OMP_WAIT_POLICY once,
#: when it loads)
PASSIVE = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
#: the load estimate averages the machine's busy time over windows of at least this long
#: (``convert._runnable_others``); its first reading only opens the first window
LOAD_WINDOW_S = 0.1
_ADAPTIVE = env_flag("SCORCH_ADAPTIVE_THREADS")
_free_cores = None
_load_known_at = None    # monotonic time from which the load estimate covers a whole window
_load_known = not _ADAPTIVE
_START_LOCK = threading.Lock()   # the load estimate's start (``_start_load_estimate``), once


#: called when the requested thread count (``torch.get_num_threads()``) differs from the one
#: the last call saw: plans priced for the old count are dropped (``api``), so a process that
#: runs at 1 thread and then at 2 gets plans for 2 (A.t() @ Y on 4elt: 0.36 -> 0.11 ms)
_ON_CHANGE: list = []
#: the count each Python thread saw last (per thread: OpenMP keeps it per thread, and a
#: thread started before a ``set_num_threads`` keeps the old count; one shared value would
#: flip between them and drop the plans on every call)
_seen = threading.local()


def on_thread_count_change(fn) -> None:
    _ON_CHANGE.append(fn)


def _check_requested(T: int) -> None:
    last = getattr(_seen, "count", None)
    if T != last:
        if last is not None:
            for fn in _ON_CHANGE:
                fn()
        _seen.count = T


def check_requested() -> None:
    """Notice a changed ``torch.get_num_threads()`` before a plan is looked up (the einsum
    entry, ``checked``): ``threads_for`` notices it only as the kernel starts, when the call
    already holds a plan priced for the old count, so under use_deterministic_algorithms
    the first call after 1 -> 2 summed in another order than every later 2-thread call."""
    T = torch.get_num_threads()
    if T != getattr(_seen, "count", None):
        _check_requested(T)


def checked(dispatch):
    """``dispatch`` (the C warm call: plan lookup and kernel in one step) after
    ``check_requested``."""
    def checked_dispatch(table, equation, operands, _get=torch.get_num_threads, _seen=_seen,
                         _dispatch=dispatch):
        T = _get()       # (check_requested inlined: ~0.15 us on a ~3.3 us warm call)
        if T != getattr(_seen, "count", None):
            _check_requested(T)
        return _dispatch(table, equation, operands)
    return checked_dispatch


def threads_for(work: int) -> int:
    """``torch.get_num_threads()``, except: small problems run on one thread (waking a
    second costs more than it saves), and an oversubscribed machine gets only its free
    cores (every parallel region ends in a barrier, and a worker waiting for a core costs a
    scheduler time slice, far more than a small kernel). The load estimate is the
    runtime's (``convert.free_cores``), which does not count this process's own spinning
    OpenMP workers as load. Until it has measured one whole window, one thread: its first
    reading reports no load, and the first 2-thread SpMV calls of a process on a busy
    machine took 20-50 ms instead of 13 us."""
    global _load_known
    T = torch.get_num_threads()
    if T != getattr(_seen, "count", None):
        _check_requested(T)
    if WORK_PER_THREAD:
        T = min(T, work // WORK_PER_THREAD)
    if T <= 1 or work < PARALLEL_MIN_WORK or (PASSIVE and work < PASSIVE_MIN_WORK):
        return 1
    if _free_cores is None:
        _start_load_estimate(T)
    if not _load_known:
        if time.monotonic() < _load_known_at:
            return 1
        _load_known = True
    return _free_cores(T)


def _start_load_estimate(T: int) -> None:
    """Open the load estimate's first window, once per process. Under a lock, and
    ``_free_cores`` set last: the first reading releases the GIL (it reads /proc), and a
    second thread that saw ``_free_cores`` before ``_load_known_at`` compared the clock with
    None (TypeError in user threads, and a lost gradient where a backward thread died)."""
    global _free_cores, _load_known_at
    with _START_LOCK:
        if _free_cores is not None:
            return
        from .._runtime.convert import free_cores
        free_cores(T)    # opens the first window
        _load_known_at = time.monotonic() + LOAD_WINDOW_S
        _free_cores = free_cores


def work_of(data) -> int:
    w = 0
    for x in data.values():
        w += x.values.numel() if isinstance(x, Storage) else x.numel()
    return w
