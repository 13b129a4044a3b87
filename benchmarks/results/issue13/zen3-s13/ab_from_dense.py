"""The batch conversion A/B of session 13: run once per tree, alternating:
    PYTHONPATH=<tree> SCORCH_DATA_DIR=../shared/data python benchmarks/results/issue13/zen3-s13/ab_from_dense.py
median of scorch.sparse_tensor(x, format=\"csr\") on a 64 x 784 MNIST batch and a 6400 x 784 block."""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4] / "examples"))
import scorch
import sparse_autoencoder as sae
torch.set_num_threads(1)
xs = sae.load_images("mnist", "test", limit=64*8).split(64)
big = sae.load_images("mnist", "test", limit=6400)
def t(f, n):
    for i in range(10): f(i)
    ts=[]
    for i in range(n):
        a=time.perf_counter(); f(i); ts.append(time.perf_counter()-a)
    ts.sort(); return ts[len(ts)//2]*1e6
print(scorch.__file__, "batch64 %.0f us" % t(lambda i: scorch.sparse_tensor(xs[i%8], format="csr"), 2000),
      "6400x784 %.0f us" % t(lambda i: scorch.sparse_tensor(big, format="csr"), 30))
