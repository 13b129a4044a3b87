"""Where the SAE training step goes, scorch (CSR batch and dense batch) next to torch.sparse:
blocks of 10 back-to-back steps per implementation, interleaved, wall time per phase.

    python benchmarks/results/issue13/zen5-s22/phases.py [threads]
"""
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "examples"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import scorch  # noqa: E402
import sparse_autoencoder as sae  # noqa: E402

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
xs = sae.load_images("mnist", "test", limit=64 * 8).split(64)
model = sae.SparseAutoencoder(784, 256, 0.1, torch.Generator().manual_seed(0))
w = model.encoder.weight.detach().to_torch().requires_grad_()
b = model.encoder.bias.detach().clone().requires_grad_()
dec = torch.nn.Linear(256, 784)
dec.load_state_dict(model.decoder.state_dict())


def scorch_step(i, out, sparse):
    x = xs[i % 8]
    for p in model.parameters():
        p.grad = None
    t0 = time.perf_counter()
    xc = scorch.sparse_tensor(x, format="csr") if sparse else x
    t1 = time.perf_counter()
    h = model.encoder(xc)
    t2 = time.perf_counter()
    loss = F.mse_loss(torch.sigmoid(model.decoder(F.relu(h))), x)
    t3 = time.perf_counter()
    loss.backward()
    t4 = time.perf_counter()
    for k, a, z in (("to CSR", t0, t1), ("encoder", t1, t2), ("decoder + loss", t2, t3), ("backward", t3, t4),
                    ("step", t0, t4)):
        out[k].append(z - a)


def torch_step(i, out):
    x = xs[i % 8]
    for p in (w, b, *dec.parameters()):
        p.grad = None
    t1 = time.perf_counter()
    h = F.relu(torch.sparse.mm(w, x.t()).t() + b)
    t2 = time.perf_counter()
    loss = F.mse_loss(torch.sigmoid(dec(h)), x)
    t3 = time.perf_counter()
    loss.backward()
    t4 = time.perf_counter()
    for k, a, z in (("encoder", t1, t2), ("decoder + loss", t2, t3), ("backward", t3, t4), ("step", t1, t4)):
        out[k].append(z - a)


for i in range(30):
    scorch_step(i, collections.defaultdict(list), True)
    scorch_step(i, collections.defaultdict(list), False)
    torch_step(i, collections.defaultdict(list))
runs = {name: collections.defaultdict(list) for name in ("scorch, CSR batch", "scorch, dense batch", "torch.sparse")}
for r in range(30):
    for k in range(10):
        scorch_step(r * 10 + k, runs["scorch, CSR batch"], True)
    for k in range(10):
        torch_step(r * 10 + k, runs["torch.sparse"])
    for k in range(10):
        scorch_step(r * 10 + k, runs["scorch, dense batch"], False)
print(f"{torch.get_num_threads()} thread(s), median us per phase")
for name, out in runs.items():
    print(f"{name:20s}", {k: round(statistics.median(v) * 1e6) for k, v in out.items()})
