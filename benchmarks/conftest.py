"""Shared benchmark fixtures: where the real data lives and how to read a matrix.

The data folder is a setting, ``$SCORCH_DATA_DIR``, defaulting to ``<repo>/../shared/data``
(the layout of the project's machines), so that users elsewhere can point it at their copy.
"""
from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("SCORCH_DATA_DIR", REPO.parent / "shared" / "data"))


@functools.lru_cache(maxsize=4)
def load_matrix(name: str, dtype: str = "float32"):
    """A Matrix Market matrix from ``<data>/matrices/<name>.mtx.gz`` as a scipy CSR array with
    sorted indices (pattern matrices get 1.0, symmetric ones both triangles)."""
    import numpy as np
    import scipy.io
    import scipy.sparse as sp

    path = data_dir() / "matrices" / f"{name}.mtx.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (set SCORCH_DATA_DIR to the folder holding matrices/)")
    with gzip.open(path) as f:
        m = sp.csr_array(scipy.io.mmread(f), dtype=np.dtype(dtype))
    m.sum_duplicates()
    m.sort_indices()
    return m


@pytest.fixture(scope="session")
def matrix_loader():
    return load_matrix
