"""Shared benchmark fixtures: real matrices through ``scorch.datasets`` (the data folder is a
setting, ``$SCORCH_DATA_DIR``, defaulting to ``<repo>/../shared/data``)."""
from __future__ import annotations

import functools

import pytest

from scorch import datasets


@functools.lru_cache(maxsize=4)
def load_matrix(name: str, dtype: str = "float32"):
    """A scipy CSR array with sorted indices (pattern matrices get 1.0, symmetric ones both
    triangles), cached per process."""
    import numpy as np
    return datasets.load_matrix(name, dtype=np.dtype(dtype))


@pytest.fixture(scope="session")
def matrix_loader():
    return load_matrix
