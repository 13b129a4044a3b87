import sys, numpy as np
sys.path.insert(0, "benchmarks")
import kernels
for name in sys.argv[1:]:
    m = kernels.load_matrix(name)
    with open(f"./{name}.bin", "wb") as f:
        np.array([m.shape[0], m.shape[1], m.nnz], dtype=np.int64).tofile(f)
        m.indptr.astype(np.int32).tofile(f); m.indices.astype(np.int32).tofile(f); m.data.astype(np.float32).tofile(f)
    print(name, m.shape, m.nnz)
