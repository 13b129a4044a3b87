import os, sys, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
import kernels as kb
for m in sys.argv[1].split(","):
    A = kb.load_matrix(m); d = os.path.join(os.environ.get("PROTO_DATA", "/tmp/scorch-proto-spmv"), m); os.makedirs(d, exist_ok=True)
    np.asarray([A.shape[0], A.shape[1], A.nnz], dtype=np.int64).tofile(d + "/shape")
    A.indptr.astype(np.int32).tofile(d + "/pos"); A.indices.astype(np.int32).tofile(d + "/crd")
    A.data.astype(np.float32).tofile(d + "/vals")
