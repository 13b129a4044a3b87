import sys, numpy as np
sys.path.insert(0, "/work/wt-spmv8/benchmarks")
import kernels as K
names = sys.argv[1:] or ["bcspwr10","4elt","Groebner_id2003_aug","rmat16","uniform16","rmat18","uniform18"]
for n in names:
    A = K.load_matrix(n).tocsr().astype(np.float32)
    A.sort_indices()
    m, k = A.shape
    with open(f"/tmp/spmv8h/{n}.bin", "wb") as f:
        np.array([m, k, A.nnz], dtype=np.int64).tofile(f)
        A.indptr.astype(np.int32).tofile(f); A.indices.astype(np.int32).tofile(f); A.data.astype(np.float32).tofile(f)
    rl = np.diff(A.indptr)
    print(n, m, k, A.nnz, "mean", rl.mean().round(2), "empty", (rl==0).mean().round(2), "<=8", (rl<=8).mean().round(2), "max", rl.max())
