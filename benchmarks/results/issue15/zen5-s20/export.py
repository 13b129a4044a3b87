import sys; sys.path.insert(0,'/work/main/benchmarks')
import numpy as np, kernels as K
for name in sys.argv[1:]:
    A = K.load_matrix(name).astype("float32").tocsr()
    A.sort_indices()
    with open(f"/tmp/s20/{name}.bin","wb") as f:
        np.array([A.shape[0], A.shape[1], A.nnz], np.int64).tofile(f)
        A.indptr.astype(np.int32).tofile(f); A.indices.astype(np.int32).tofile(f); A.data.astype(np.float32).tofile(f)
    print(name, A.shape, A.nnz)
