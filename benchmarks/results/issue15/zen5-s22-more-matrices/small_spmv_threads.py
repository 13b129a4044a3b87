import time, statistics, torch, scorch, sys, os
os.environ["SCORCH_DATA_DIR"] = "/work/shared/data"
sys.path.insert(0, "/work/main/benchmarks")
import kernels as K
from scorch.tensor_compiler import threads
for name in ("G51", "Franz6_id1959_aug", "bcspwr10", "4elt"):
    M = K.load_matrix(name)
    A = scorch.sparse_tensor(M)
    At = torch.sparse_csr_tensor(torch.from_numpy(M.indptr).long(), torch.from_numpy(M.indices).long(), torch.from_numpy(M.data).float(), M.shape)
    A = scorch.sparse_tensor(M.astype("float32"))
    x = torch.rand(M.shape[1])
    def tm(f, n=3000):
        for i in range(200): f()
        time.sleep(0.2)
        for i in range(200): f()
        v = []
        for i in range(n):
            t = time.perf_counter(); f(); v.append(time.perf_counter() - t)
        return statistics.median(v) * 1e6
    out = []
    for T in (1, 2):
        torch.set_num_threads(T)
        out.append((T, round(tm(lambda: A @ x), 2), round(tm(lambda: At @ x), 2)))
    print(name, M.shape, M.nnz, "work", M.nnz + M.shape[0] + M.shape[1], out)
