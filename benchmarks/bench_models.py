"""The paper's models (examples/*.py): one training step (forward + loss + backward) and one
inference pass of each, scorch next to torch.sparse (CSR where it works, COO otherwise), PyG's
GCNConv for the GCN, dense masked attention for BigBird and the dense-gate einsum for the MoE.

    python -m pytest benchmarks/bench_models.py --benchmark-columns=median     # pytest-benchmark
    python benchmarks/report_models.py                                        # table + plots

A case is (model, data set); ``make_case`` builds every implementation of it on the same data
and initial weights and returns, per implementation, a ``train`` and an ``infer`` callable.
Training steps leave the optimizer out (torch's Adam rejects torch.sparse gradients), so every
implementation does the same work: forward, loss, backward. Threads: ``SCORCH_BENCH_THREADS``
(default "1 2") for pytest; the report takes ``--threads``.
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")

import scorch  # noqa: E402

# model -> data sets (the report's --quick takes the first of each)
CASES = {
    "gcn": ["cora", "pubmed", "arxiv", "cora-nodropout"],
    "sae": ["mnist", "fashion-mnist"],
    "bigbird": ["n4096", "n2048-b8"],
    "moe": ["mnist-b1024", "mnist-b1024-h128"],
}
LABELS = {"scorch": "scorch", "scorch_dense_x": "scorch (dense input)", "scorch_wxt": "scorch (W @ x^T)", "torch_csr": "torch.sparse CSR",
          "torch_coo": "torch.sparse COO", "pyg": "PyG GCNConv", "dense_masked": "dense masked",
          "dense_gate": "dense-gate einsum", "shared_dense": "dense part both run"}
# ``shared_*`` implementations time the part of a step that scorch and its peers run alike
# (plain torch): peer ms / shared ms bounds the ratio any scorch step can reach.
# diagnostic variants, left out of the target means
DIAGNOSTIC = {"cora-nodropout", "mnist-b1024-h128", "n2048-b8"}
# (model, peer) -> the target for peer time / scorch time of a training step
TARGETS = {("gcn", "torch_csr"): 2.5, ("gcn", "pyg"): 1.5, ("sae", "torch_csr"): 2.0,
           ("bigbird", "dense_masked"): 1.5, ("moe", "dense_gate"): 2.0}


class Unavailable(Exception):
    """An implementation that cannot run here (an optional package is missing)."""


@dataclass
class Impl:
    train: Callable[[], object]
    infer: Callable[[], object]


@dataclass
class Case:
    model: str
    dataset: str
    description: str
    impls: Dict[str, Impl] = field(default_factory=dict)
    unavailable: Dict[str, str] = field(default_factory=dict)


def _zero(params) -> None:
    for p in params:
        p.grad = None


def _node_classifier(model, inputs, g) -> "Impl":
    """A training step (cross-entropy on the training nodes) and an inference pass of a node
    classifier called as ``model(*inputs)``."""
    def train():
        _zero(model.parameters())
        model.train()
        loss = F.cross_entropy(model(*inputs)[g.train], g.y[g.train])
        loss.backward()
        return loss

    def infer():
        model.eval()
        with torch.no_grad():
            return model(*inputs)
    return Impl(train, infer)


# --------------------------------------------------------------------------- GCN

def gcn_case(dataset: str) -> Case:
    """``<name>-nodropout``: the same without the hidden dropout, whose RNG (torch's bernoulli,
    the peers' dropout) costs as much as the rest of a Cora-scale step."""
    import gcn
    name, _, variant = dataset.partition("-")
    dropout = 0.0 if variant == "nodropout" else 0.5
    g = gcn.load_graph(name)
    n, classes = g.a_hat.shape[0], int(g.y.max()) + 1
    case = Case("gcn", dataset, f"{gcn.DATASETS[name][0]}: {n} nodes, A_hat {g.a_hat.nnz} stored, "
                f"features {tuple(g.x.shape)}{' sparse' if type(g.x) is not torch.Tensor else ''}, "
                f"hidden 128, {classes} classes, dropout {dropout}")
    torch.manual_seed(0)
    template = gcn.GCN(g.x.shape[1], 128, classes, dropout=dropout)

    class TorchGCN(gcn.GCN):
        """The example's model as a torch.sparse user writes it (``import torch``): torch's
        own ``F.dropout``, where the example, through ``scorch.nn.functional``, gets scorch's."""

        def forward(self, a_hat, x):
            h = F.dropout(F.relu(self.conv1(a_hat, x)), self.dropout, self.training)
            return self.conv2(a_hat, h)

    def module_impl(a_hat, x, model_class=gcn.GCN) -> Impl:
        model = model_class(g.x.shape[1], 128, classes, dropout=dropout)
        model.load_state_dict(template.state_dict())

        return _node_classifier(model, (a_hat, x), g)

    dense_x = type(g.x) is torch.Tensor
    case.impls["scorch"] = module_impl(g.a_hat, g.x)
    torch_a = g.a_hat.to_torch()
    torch_x = g.x if dense_x else g.x.to_torch()
    case.impls["torch_csr"] = module_impl(torch_a, torch_x, TorchGCN)
    try:
        case.impls["pyg"] = _pyg_impl(g, template, classes)
    except Unavailable as e:
        case.unavailable["pyg"] = str(e)
    return case


def _pyg_impl(g, template, classes) -> Impl:
    try:
        from torch_geometric.nn import GCNConv
    except ImportError as e:  # optional benchmark dependency
        raise Unavailable(f"torch_geometric not importable ({e}): PyG column skipped") from e
    dropout = template.dropout

    class PygGCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(g.x.shape[1], 128, cached=True)
            self.conv2 = GCNConv(128, classes, cached=True)

        def forward(self, x, edge_index):
            h = F.dropout(F.relu(self.conv1(x, edge_index)), dropout, self.training)
            return self.conv2(h, edge_index)

    model = PygGCN()
    with torch.no_grad():  # the same weights as the scorch model (GCNConv's lin is x @ W^T)
        for ours, theirs in ((template.conv1, model.conv1), (template.conv2, model.conv2)):
            theirs.lin.weight.copy_(ours.weight.t())
            theirs.bias.copy_(ours.bias)
    x = g.x if type(g.x) is torch.Tensor else g.x.to_torch()   # the same torch CSR features
    edge_index = g.edge_index

    return _node_classifier(model, (x, edge_index), g)


# --------------------------------------------------------------------------- sparse autoencoder

def sae_case(dataset: str, batch: int = 64, density: float = 0.1, batches: int = 8) -> Case:
    """Each call takes the next of ``batches`` batches of the test set (rotating), for every
    implementation alike: a training step sees a new batch, so nothing kept per batch (a
    converted copy) carries over from the previous step."""
    import sparse_autoencoder as sae
    xs = sae.load_images(dataset, "test", limit=batch * batches).split(batch)
    turn = {}

    def next_batch(impl: str) -> torch.Tensor:
        turn[impl] = (turn.get(impl, -1) + 1) % len(xs)
        return xs[turn[impl]]
    nonzero = torch.cat(xs).ne(0).float().mean().item()
    case = Case("sae", dataset, f"batch {batch} x 784 ({nonzero:.0%} non-zero; {len(xs)} batches in turn), "
                f"encoder 784 -> 256 at {density:.0%} stored (CSR), decoder 256 -> 784 dense")
    torch.manual_seed(0)
    model = sae.SparseAutoencoder(784, 256, density, torch.Generator().manual_seed(0))

    def loss_impl(name: str, step, params) -> Impl:
        """A training step (the loss of ``step`` on the next batch, backward) and an
        inference pass of an implementation with parameters ``params``."""
        def train():
            _zero(params)
            loss = step(next_batch(name))
            loss.backward()
            return loss

        def infer():
            with torch.no_grad():
                return step(next_batch(name))
        return Impl(train, infer)

    def scorch_step(sparse_input: bool):
        def step(x):
            inp = scorch.sparse_tensor(x, format="csr") if sparse_input else x
            return F.mse_loss(model(inp), x)
        return step

    case.impls["scorch"] = loss_impl("scorch", scorch_step(True), list(model.parameters()))
    case.impls["scorch_dense_x"] = loss_impl("scorch_dense_x", scorch_step(False), list(model.parameters()))

    def wxt_step(x):  # diagnostic: the encoder as torch.sparse users write it
        h = F.relu((model.encoder.weight @ x.t()).t() + model.encoder.bias)
        return F.mse_loss(torch.sigmoid(model.decoder(h)), x)
    case.impls["scorch_wxt"] = loss_impl("scorch_wxt", wxt_step, list(model.parameters()))

    # torch.sparse: a CSR weight; torch multiplies it with a dense input (sparse x sparse CSR
    # products have no backward in torch), W @ x^T through torch.sparse.mm
    w = model.encoder.weight.detach().to_torch().requires_grad_()
    b = model.encoder.bias.detach().clone().requires_grad_()
    dec = torch.nn.Linear(256, 784)
    dec.load_state_dict(model.decoder.state_dict())
    params = [w, b, *dec.parameters()]

    def torch_step(x):
        h = F.relu(torch.sparse.mm(w, x.t()).t() + b)
        return F.mse_loss(torch.sigmoid(dec(h)), x)
    case.impls["torch_csr"] = loss_impl("torch_csr", torch_step, params)

    # the paper's dense decoder, loss and their backward: the same torch calls on both sides
    hidden = torch.rand(batch, 256, generator=torch.Generator().manual_seed(1)).requires_grad_()

    def shared_step(x):
        return F.mse_loss(torch.sigmoid(dec(hidden)), x)
    case.impls["shared_dense"] = loss_impl("shared_dense", shared_step, [hidden, *dec.parameters()])
    return case


# --------------------------------------------------------------------------- BigBird attention

def bigbird_case(dataset: str, heads: int = 4, head_dim: int = 32, block: int = 16) -> Case:
    """``dataset``: ``n<tokens>`` (batch 1), or ``n<tokens>-b<batch>`` (a diagnostic: the
    batch and the heads as dense levels under the pattern)."""
    import sparse_attention as sa
    n, _, batch = dataset[1:].partition("-b")
    n, batch = int(n), int(batch or 1)
    pattern = sa.bigbird_pattern(n, block, generator=torch.Generator().manual_seed(0))
    case = Case("bigbird", dataset, f"attention fwd(+bwd): {batch} x {heads} heads x {n} tokens x {head_dim}, "
                f"BigBird pattern (block {block}) {pattern.nnz / n ** 2:.1%} stored")
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(batch, heads, n, head_dim, generator=gen).requires_grad_() for _ in range(3)]
    scale = 1 / math.sqrt(head_dim)

    def attention_impl(attend) -> Impl:
        def train():
            _zero(qkv)
            out = attend(*qkv)
            out.pow(2).mean().backward()
            return out

        def infer():
            with torch.no_grad():
                return attend(*qkv)
        return Impl(train, infer)

    def sparse(q, k, v):
        scores = scorch.einsum("ij,bhid,bhjd->bhij", pattern, q, k) * scale
        return torch.softmax(scores, dim=-1) @ v

    allowed = pattern.to_dense() != 0

    def dense_masked(q, k, v):
        scores = (q @ k.transpose(-1, -2)) * scale
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v

    case.impls["scorch"] = attention_impl(sparse)
    case.impls["dense_masked"] = attention_impl(dense_masked)
    return case


# --------------------------------------------------------------------------- MoE

def moe_case(dataset: str, batch: int = 1024, hidden: int = 512, experts: int = 8, k: int = 2) -> Case:
    """``<name>-h<hidden>``: another hidden size (``-h128``: the example's default, where an
    expert's 784 x 128 weights fit a core's L2 cache; at 512 they do not)."""
    import moe
    if "-h" in dataset:
        hidden = int(dataset.rsplit("-h", 1)[1])
    x = moe.load_images("mnist", "test", limit=batch)
    case = Case("moe", dataset, f"MoE layer: {batch} inputs x 784 -> {hidden}, {experts} experts, top-{k} gate")
    torch.manual_seed(0)
    layer = moe.MoE(784, hidden, experts, k)

    def train_sparse():
        _zero(layer.parameters())
        y, _ = layer(x)
        y.pow(2).mean().backward()
        return y

    def infer_sparse():
        with torch.no_grad():
            return layer(x)[0]

    def dense_gate_forward():
        top, chosen = layer.gate(x).topk(k, dim=1)
        gates = torch.zeros(batch, experts).scatter(1, chosen, F.softmax(top, dim=1))
        return torch.einsum("bd,ndh,bn->bh", x, layer.weight, gates) + gates @ layer.bias

    def train_dense():
        _zero(layer.parameters())
        dense_gate_forward().pow(2).mean().backward()

    def infer_dense():
        with torch.no_grad():
            return dense_gate_forward()

    case.impls["scorch"] = Impl(train_sparse, infer_sparse)
    case.impls["dense_gate"] = Impl(train_dense, infer_dense)
    return case


BUILDERS = {"gcn": gcn_case, "sae": sae_case, "bigbird": bigbird_case, "moe": moe_case}


def make_case(model: str, dataset: str) -> Case:
    return BUILDERS[model](dataset)


# --------------------------------------------------------------------------- pytest-benchmark
try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None and "pytest" in sys.modules and __name__ != "__main__":
    pytest.importorskip("pytest_benchmark")
    _CASES: Dict[tuple, Case] = {}
    _THREADS = [int(t) for t in os.environ.get("SCORCH_BENCH_THREADS", "1 2").split()]
    _IMPLS = {"gcn": ["scorch", "torch_csr", "pyg"],
              "sae": ["scorch", "scorch_dense_x", "scorch_wxt", "torch_csr", "shared_dense"],
              "bigbird": ["scorch", "dense_masked"], "moe": ["scorch", "dense_gate"]}
    _PARAMS = [(m, d, impl) for m, ds in CASES.items() for d in ds[:1] for impl in _IMPLS[m]]

    def _case(model: str, dataset: str) -> Case:
        if (model, dataset) not in _CASES:
            try:
                _CASES[(model, dataset)] = make_case(model, dataset)
            except FileNotFoundError as e:
                pytest.skip(str(e))
        return _CASES[(model, dataset)]

    @pytest.mark.parametrize("threads", _THREADS)
    @pytest.mark.parametrize("phase", ["train", "infer"])
    @pytest.mark.parametrize("model,dataset,impl", _PARAMS)
    def test_model(benchmark, model, dataset, impl, phase, threads):
        case = _case(model, dataset)
        if impl in case.unavailable:
            pytest.skip(case.unavailable[impl])
        fn = getattr(case.impls[impl], phase)
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            fn()  # first call: compiles scorch's kernels
            benchmark.group = f"{model} {dataset} {phase} T{threads}"
            benchmark.extra_info.update({"model": model, "dataset": dataset, "impl": impl})
            benchmark(fn)
        finally:
            torch.set_num_threads(saved)
