"""Module locks that a forked child gets anew. A child forked while another thread held one
(a kernel compile in progress when a DataLoader forks its workers) would otherwise wait
forever for a thread it does not have."""
from __future__ import annotations

import os
import threading
from typing import Callable

__all__ = ["fork_safe_lock"]


def fork_safe_lock(namespace: dict, name: str, factory: Callable = threading.Lock):
    """``namespace[name] = factory()``, replaced by a fresh one in every forked child;
    returns the lock (code must read it through the module global)."""
    namespace[name] = factory()
    os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, factory()))
    return namespace[name]
