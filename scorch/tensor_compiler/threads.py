"""How many threads a kernel call runs on."""
from __future__ import annotations

import os

import torch

from ..level_storage import Storage

__all__ = ["PARALLEL_MIN_WORK", "threads_for", "work_of"]


PARALLEL_MIN_WORK = int(os.environ.get("SCORCH_PARALLEL_MIN_WORK", 10_000))
_free_cores = None


def threads_for(work: int) -> int:
    """``torch.get_num_threads()``, except: small problems run on one thread (waking a
    second costs more than it saves), and an oversubscribed machine gets only its free
    cores (every parallel region ends in a barrier, and a worker waiting for a core costs a
    scheduler time slice, far more than a small kernel). The load estimate is the
    runtime's (``convert.free_cores``), which does not count this process's own spinning
    OpenMP workers as load."""
    global _free_cores
    T = torch.get_num_threads()
    if T == 1 or work < PARALLEL_MIN_WORK:
        return 1
    if _free_cores is None:
        from .._runtime.convert import free_cores
        _free_cores = free_cores
    return _free_cores(T)


def work_of(data) -> int:
    w = 0
    for x in data.values():
        w += x.values.numel() if isinstance(x, Storage) else x.numel()
    return w
