"""torch sampled_addmm on the quick matrices, C as n x K, K = 128, 1 thread: thread CPU time min
(the peer of prototype.cpp). Usage: python torch_sampled_addmm.py bcspwr10,4elt ROUNDS."""
import sys, os, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import numpy as np, torch
from kernels import load_matrix
torch.set_num_threads(1)
for name in sys.argv[1].split(","):
    A = load_matrix(name); m, n = A.shape; K = 128
    rng = np.random.default_rng(0)
    B = torch.from_numpy(rng.standard_normal((m, K), dtype=np.float32))
    C = torch.from_numpy(rng.standard_normal((n, K), dtype=np.float32)).t()
    At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr), torch.from_numpy(A.indices), torch.from_numpy(A.data), size=A.shape)
    def f():
        r = torch.sparse.sampled_addmm(At, B, C, beta=0.0); r.values().mul_(At.values()); return r
    f(); ts = []
    for _ in range(int(sys.argv[2])):
        c0 = time.thread_time(); f(); ts.append(time.thread_time() - c0)
    print(f"torch {name:12s} min {min(ts)*1e3:8.3f} ms  {min(ts)*1e9/A.nnz:6.1f} ns/entry", flush=True)
