"""The on-disk kernel cache, as users see it (``scorch.cache_info()``, ``scorch.cache_clear()``).
Both work in a fresh process: the build layer is imported on the call."""
from __future__ import annotations


def cache_info() -> dict:
    """Kernel cache: directory, kernels on disk and in memory, hits and misses."""
    from .tensor_compiler import build
    return build.cache_info()


def cache_clear() -> None:
    """Empty the kernel cache (disk and memory)."""
    from .tensor_compiler import build
    build.cache_clear()
