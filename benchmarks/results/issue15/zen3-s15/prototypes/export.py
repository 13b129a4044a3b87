import os, sys, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb
K = 128
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m)
    rng = np.random.default_rng(0)
    d = os.path.join(os.environ.get("PROTO_DATA", "/tmp/scorch-proto"), m)
    import os; os.makedirs(d, exist_ok=True)
    np.asarray([A.shape[0], A.shape[1], A.nnz], dtype=np.int64).tofile(d + "/shape")
    A.indptr.astype(np.int64).tofile(d + "/pos"); A.indices.astype(np.int64).tofile(d + "/crd")
    A.data.astype(np.float32).tofile(d + "/vals")
    rng.standard_normal((A.shape[0], K), dtype=np.float32).tofile(d + "/B")
    rng.standard_normal((A.shape[1], K), dtype=np.float32).tofile(d + "/C")
