"""Write the quick matrices as MATRIX.bin for prototype.cpp: int64 m, n, nnz, then int32
indptr (m + 1) and int32 indices (nnz), CSR as benchmarks/kernels.load_matrix gives it;
with ``--permuted`` also MATRIX.perm.bin, the rows permuted in storage (reverse
Cuthill-McKee of A + A^T; a non-square matrix: rows by first column), for row_order.txt.
Run from the repository root with SCORCH_DATA_DIR set: python dump_matrices.py [DIR] [--permuted]"""
import os
import sys

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from kernels import MATRICES_QUICK, MATRICES_SYNTHETIC_QUICK, load_matrix  # noqa: E402


def write(path, A):
    with open(path, "wb") as f:
        np.array([A.shape[0], A.shape[1], A.nnz], dtype=np.int64).tofile(f)
        A.indptr.astype(np.int32).tofile(f)
        A.indices.astype(np.int32).tofile(f)


def row_order(A):
    m, n = A.shape
    if m == n:
        P = sp.csr_matrix((np.ones(A.nnz, dtype=np.int8), A.indices, A.indptr), shape=A.shape)
        return reverse_cuthill_mckee((P + P.T).tocsr(), symmetric_mode=True)
    first = np.where(np.diff(A.indptr) > 0, A.indices[np.minimum(A.indptr[:-1], A.nnz - 1)], n)
    return np.argsort(first, kind="stable")


args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = args[0] if args else "."
for name in MATRICES_QUICK + MATRICES_SYNTHETIC_QUICK:
    A = load_matrix(name)
    write(os.path.join(out, name + ".bin"), A)
    if "--permuted" in sys.argv and A.shape[0] <= 65536:
        P = sp.csr_array(A[row_order(A)])
        P.sort_indices()
        write(os.path.join(out, name + ".perm.bin"), P)
    print(name, A.shape, A.nnz)
