"""Real data for examples, tests and benchmarks: SuiteSparse matrices, MNIST-style IDX files.

The folder is a setting: ``data_dir`` argument, else ``$SCORCH_DATA_DIR``, else
``../shared/data`` next to a source checkout. Matrices not present locally can be
downloaded from the SuiteSparse collection when ``download=True`` (needs network).
"""
from __future__ import annotations

import gzip
import os
import urllib.request
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

__all__ = ["data_dir", "load_matrix", "load_idx", "MATRICES"]

# name -> SuiteSparse group (for download); METIS graphs are not in SuiteSparse under these names
MATRICES = {
    "NotreDame_www": "Barabasi", "Groebner_id2003_aug": "Mongoose", "Franz6_id1959_aug": "Mongoose",
    "arrow_spqr_46500": "Mongoose", "Pd": "Mongoose", "bcspwr10": "HB", "G51": "Gset",
    "dwt_992": "HB", "jagmesh7": "HB", "lp_e226": "LPnetlib", "Erdos971": "Pajek",
    "pts5ldd03": "Mongoose", "bcspwr06": "HB", "west0067": "HB",
    "4elt": None, "copter2": None, "mdual": None,
}


def data_dir(path: Optional[str] = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("SCORCH_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _download(name: str, dest: Path) -> None:
    group = MATRICES.get(name)
    if group is None:
        raise FileNotFoundError(f"matrix {name!r} is not in {dest.parent} and has no download source")
    import tarfile
    import tempfile
    url = f"https://suitesparse-collection-website.herokuapp.com/MM/{group}/{name}.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / f"{name}.tar.gz"
        urllib.request.urlretrieve(url, archive)
        with tarfile.open(archive) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(f"{name}.mtx"))
            raw = tar.extractfile(member).read()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dest, "wb") as f:
        f.write(raw)


def load_matrix(name: str, data_dir_: Optional[str] = None, download: bool = False,
                dtype=np.float32):
    """A SuiteSparse/METIS matrix as a scipy.sparse CSR array (pattern matrices get 1.0,
    symmetric ones are expanded to both triangles, as Matrix Market defines)."""
    import scipy.io
    import scipy.sparse as sp
    path = data_dir(data_dir_) / "matrices" / f"{name}.mtx.gz"
    if not path.exists():
        if not download:
            raise FileNotFoundError(
                f"{path} not found: set SCORCH_DATA_DIR to the folder holding matrices/, "
                f"or pass download=True")
        _download(name, path)
    with gzip.open(path) as f:
        m = sp.csr_array(scipy.io.mmread(f), dtype=dtype)
    m.sum_duplicates()  # canonical: sorted indices, no duplicates
    return m


def load_idx(path: str) -> np.ndarray:
    """An IDX file (MNIST format, optionally gzipped) as a numpy array."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
