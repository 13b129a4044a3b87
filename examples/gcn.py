"""A 2-layer GCN (Kipf & Welling) trained full-batch for node classification on a real graph,
written as plain PyTorch with ``import scorch as torch``: the normalized adjacency and the node
features are scorch sparse tensors, everything else is ordinary torch.

    python examples/gcn.py                              # Cora scale: bcspwr10, 1,433 sparse features
    python examples/gcn.py --dataset pubmed             # PubMed scale: 4elt
    python examples/gcn.py --dataset arxiv --epochs 50  # ogbn-arxiv scale: mdual, 128 dense features
    python examples/gcn.py --matrix G51 --epochs 20 --threads 2

The public graph sets (Cora, PubMed, ogbn-arxiv) cannot be downloaded here, so the graphs are
real SuiteSparse/METIS graphs of matching size, and the labels and node features are generated
with a fixed seed: labels that follow the graph (a random field smoothed over it, so neighbours
mostly agree, as in citation graphs), features that carry the label noisily (sparse binary
bag-of-words with class-specific words, or dense Gaussian features around a class mean).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List


import scorch as torch
from scorch import nn
from scorch.datasets import load_matrix
from scorch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_common_args, apply_common_args, progress  # noqa: E402

# dataset -> (graph, feature dimension, feature density (1.0: dense features), classes)
DATASETS = {
    "cora": ("bcspwr10", 1433, 0.013, 7),
    "citeseer": ("G51", 3703, 0.0085, 6),
    "pubmed": ("4elt", 500, 0.10, 3),
    "arxiv": ("mdual", 128, 1.0, 40),
}


@dataclass
class Graph:
    a_hat: torch.Tensor       # D^-1/2 (A + I) D^-1/2, a scorch CSR tensor
    x: torch.Tensor           # node features (scorch CSR, or dense when the density is 1)
    y: torch.Tensor           # labels
    train: torch.Tensor       # boolean node masks
    val: torch.Tensor
    test: torch.Tensor
    edge_index: torch.Tensor  # 2 x E, the symmetric edges without self loops (for PyG)


def normalized_adjacency(m) -> torch.Tensor:
    """The GCN propagation matrix of a scipy graph: symmetrised, self loops, D^-1/2 (A+I) D^-1/2."""
    a = torch.from_scipy(m).to_format("coo")
    rows, cols = a.indices()
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    n = m.shape[0]
    loops = torch.arange(n)
    # both directions plus self loops; duplicates are summed by the constructor, so mark
    # each edge once through its linear position
    lin = torch.cat([rows * n + cols, cols * n + rows, loops * n + loops]).unique()
    rows, cols = lin // n, lin % n
    deg = torch.bincount(rows, minlength=n).float()
    dinv = deg.rsqrt()
    a_hat = torch.sparse_tensor((torch.stack([rows, cols]), dinv[rows] * dinv[cols]), size=(n, n),
                                format="csr")
    return a_hat, torch.stack([rows[rows != cols], cols[rows != cols]])


def smooth_labels(a_hat: torch.Tensor, classes: int, generator: torch.Generator,
                  steps: int = 10) -> torch.Tensor:
    """Labels that follow the graph (neighbours mostly agree, as in citation graphs): the
    argmax of a random field smoothed by ``steps`` propagations through A_hat, each step
    less its stationary part. A_hat's top eigenvector, D^1/2 1 (eigenvalue 1; D^-1 is A_hat's
    diagonal), would otherwise take over on a graph that mixes fast: on G51 (citeseer scale)
    plain smoothing gave 995 of the 1,000 nodes one class."""
    field = torch.randn(a_hat.shape[0], classes, generator=generator)
    top = a_hat.diagonal().to_dense().rsqrt()
    top = (top / top.norm()).unsqueeze(1)
    for _ in range(steps):
        field = a_hat @ field
        field = field - top @ (top.t() @ field)
    return field.argmax(1)


def class_features(y: torch.Tensor, dim: int, density: float, classes: int,
                   generator: torch.Generator, signal: float = 0.5) -> torch.Tensor:
    """Features that carry the label: binary bag-of-words (scorch CSR) where a ``signal``
    share of each node's words come from its class's block of the vocabulary; dense
    Gaussian features around a class mean when the density is 1."""
    n = y.numel()
    if density >= 1.0:
        means = torch.randn(classes, dim, generator=generator) * signal
        return means[y] + torch.randn(n, dim, generator=generator)
    per_row = max(1, round(dim * density))
    rows = torch.arange(n).repeat_interleave(per_row)
    block = dim // classes
    topical = y[rows] * block + torch.randint(0, block, (rows.numel(),), generator=generator)
    anywhere = torch.randint(0, dim, (rows.numel(),), generator=generator)
    cols = torch.where(torch.rand(rows.numel(), generator=generator) < signal, topical, anywhere)
    lin = (rows * dim + cols).unique()
    return torch.sparse_tensor((torch.stack([lin // dim, lin % dim]), torch.ones(lin.numel())),
                               size=(n, dim), format="csr")


def load_graph(dataset: str = "cora", matrix: str = None, features: int = None,
               density: float = None, classes: int = None, data_dir: str = None,
               seed: int = 0) -> Graph:
    """A real graph with generated labels and features and a 10 / 10 / 80 % node split."""
    d_matrix, d_features, d_density, d_classes = DATASETS[dataset]
    matrix, features = matrix or d_matrix, features or d_features
    density = d_density if density is None else density
    classes = classes or d_classes
    a_hat, edge_index = normalized_adjacency(load_matrix(matrix, data_dir))
    n = a_hat.shape[0]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        y = smooth_labels(a_hat, classes, g)
    x = class_features(y, features, density, classes, g)
    order = torch.randperm(n, generator=g)
    train, val, test = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
    train[order[: n // 10]] = True
    val[order[n // 10: n // 5]] = True
    test[order[n // 5:]] = True
    return Graph(a_hat, x, y, train, val, test, edge_index)


class GCNLayer(nn.Module):
    """H' = A_hat @ (H @ W) + b (Kipf & Welling's layer; W is in x out, Glorot-initialised)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(in_features, out_features)))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, a_hat: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return a_hat @ (h @ self.weight) + self.bias


class GCN(nn.Module):
    def __init__(self, in_features: int, hidden: int, classes: int, dropout: float = 0.5):
        super().__init__()
        self.conv1 = GCNLayer(in_features, hidden)
        self.conv2 = GCNLayer(hidden, classes)
        self.dropout = dropout

    def forward(self, a_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(a_hat, x))
        h = F.dropout(h, self.dropout, self.training)
        return self.conv2(a_hat, h)


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return (logits[mask].argmax(1) == y[mask]).float().mean().item()


def train(graph: Graph, hidden: int = 128, epochs: int = 200, lr: float = 0.01,
          weight_decay: float = 5e-4, dropout: float = 0.5, seed: int = 0,
          quiet: bool = False) -> Dict[str, List[float]]:
    """Full-batch training (the paper's setup: Adam, lr 0.01, weight decay 5e-4); returns the
    training losses per epoch and the final accuracies."""
    torch.manual_seed(seed)
    model = GCN(graph.x.shape[1], hidden, int(graph.y.max()) + 1, dropout)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for epoch in progress(range(epochs), "gcn epochs", epochs, quiet):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(graph.a_hat, graph.x)[graph.train], graph.y[graph.train])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(graph.a_hat, graph.x)
    return {"losses": losses, "train_acc": accuracy(logits, graph.y, graph.train),
            "val_acc": accuracy(logits, graph.y, graph.val),
            "test_acc": accuracy(logits, graph.y, graph.test)}


def graph_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="cora")
    parser.add_argument("--matrix", default=None, help="graph from ../shared/data/matrices (overrides the dataset's)")
    parser.add_argument("--features", type=int, default=None)
    parser.add_argument("--feature-density", type=float, default=None, help="1.0: dense features")
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--dropout", type=float, default=0.5)
    add_common_args(parser)


def graph_from_args(args: argparse.Namespace) -> Graph:
    return load_graph(args.dataset, args.matrix, args.features, args.feature_density,
                      args.classes, args.data_dir, args.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    graph_args(parser)
    args = parser.parse_args()
    apply_common_args(args)
    graph = graph_from_args(args)
    print(f"graph: {graph.a_hat.shape[0]} nodes, {graph.a_hat.nnz} stored entries in A_hat; "
          f"features {tuple(graph.x.shape)} ({type(graph.x).__name__}); {int(graph.y.max()) + 1} classes")
    result = train(graph, args.hidden, args.epochs, args.lr, dropout=args.dropout, seed=args.seed,
                   quiet=args.quiet)
    print(f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}; accuracy train "
          f"{result['train_acc']:.3f}, val {result['val_acc']:.3f}, test {result['test_acc']:.3f}")


if __name__ == "__main__":
    main()
