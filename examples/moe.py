"""A mixture-of-experts classifier with a sparse top-k gate, as plain PyTorch with
``import scorch as torch``: the gate is a scorch sparse tensor (k stored entries per input), and
each MoE layer is ONE fused einsum, ``einsum("bd,ndh,bn->bh", x, experts, gates)``, that computes
only the chosen experts of each input (a dense gate would compute all of them).

    python examples/moe.py                                   # MNIST, 8 experts, top-2
    python examples/moe.py --experts 16 --top-k 1 --epochs 3 --threads 2
    python examples/moe.py --dataset fashion-mnist

The gate weights are the softmax of the top-k gate logits (Shazeer et al. 2017, without the
noise), differentiable through the sparse tensor's values; a small load-balancing loss keeps
every expert in use. Reports the test accuracy.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, List

import scorch as torch
from scorch import nn
from scorch.datasets import data_dir, load_idx
from scorch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_common_args, apply_common_args, progress  # noqa: E402
from sparse_autoencoder import FILES, load_images  # noqa: E402


def load_labels(dataset: str, split: str, folder: str = None, limit: int = None) -> torch.Tensor:
    y = torch.from_numpy(load_idx(data_dir(folder) / dataset / FILES[split][1]).astype("int64"))
    return y[:limit] if limit else y


class MoE(nn.Module):
    """N experts (each a Linear in_features -> out_features), a top-k gate, one fused einsum."""

    def __init__(self, in_features: int, out_features: int, experts: int, k: int):
        super().__init__()
        self.k, self.experts = k, experts
        self.gate = nn.Linear(in_features, experts)
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(experts, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(experts, out_features))

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """The (batch, experts) gate as a sparse CSR tensor with k entries per row."""
        top, chosen = self.gate(x).topk(self.k, dim=1)
        rows = torch.arange(x.shape[0]).repeat_interleave(self.k)
        return torch.sparse_tensor((torch.stack([rows, chosen.reshape(-1)]), F.softmax(top, dim=1).reshape(-1)),
                                   size=(x.shape[0], self.experts), format="csr")

    def forward(self, x: torch.Tensor):
        g = self.gates(x)
        y = torch.einsum("bd,ndh,bn->bh", x, self.weight, g) + g @ self.bias
        return y, g

    def balance_loss(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Switch-transformer style: fraction routed to each expert x mean gate probability."""
        routed = torch.bincount(g.to_format("coo").indices()[1], minlength=self.experts).float()
        prob = F.softmax(self.gate(x), dim=1).mean(0)
        return self.experts * (routed / routed.sum() * prob).sum()


class MoEClassifier(nn.Module):
    def __init__(self, inputs: int, hidden: int, classes: int, experts: int, k: int):
        super().__init__()
        self.moe = MoE(inputs, hidden, experts, k)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor):
        h, g = self.moe(x)
        return self.head(F.relu(h)), g


def train(x_train, y_train, x_test, y_test, hidden: int = 128, experts: int = 8, k: int = 2,
          epochs: int = 2, batch_size: int = 256, lr: float = 1e-3, balance: float = 0.01,
          seed: int = 0, quiet: bool = False) -> Dict[str, object]:
    torch.manual_seed(seed)
    model = MoEClassifier(x_train.shape[1], hidden, int(y_train.max()) + 1, experts, k)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    steps: List[float] = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=g)
        starts = range(0, len(x_train), batch_size)
        for i in progress(starts, f"moe epoch {epoch + 1}/{epochs}", len(starts), quiet):
            xb, yb = x_train[order[i: i + batch_size]], y_train[order[i: i + batch_size]]
            logits, gates = model(xb)
            loss = F.cross_entropy(logits, yb)
            total = loss + balance * model.moe.balance_loss(xb, gates)
            opt.zero_grad()
            total.backward()
            opt.step()
            steps.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits, gates = model(x_test)
        acc = (logits.argmax(1) == y_test).float().mean().item()
        used = torch.bincount(gates.to_format("coo").indices()[1], minlength=experts)
    return {"steps": steps, "test_acc": acc, "expert_use": used.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["mnist", "fashion-mnist"], default="mnist")
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--test-size", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    add_common_args(parser)
    args = parser.parse_args()
    apply_common_args(args)
    x_train = load_images(args.dataset, "train", args.data_dir, args.train_size)
    y_train = load_labels(args.dataset, "train", args.data_dir, args.train_size)
    x_test = load_images(args.dataset, "test", args.data_dir, args.test_size)
    y_test = load_labels(args.dataset, "test", args.data_dir, args.test_size)
    r = train(x_train, y_train, x_test, y_test, args.hidden, args.experts, args.top_k, args.epochs,
              args.batch_size, args.lr, seed=args.seed, quiet=args.quiet)
    n = len(r["steps"]) // 10 or 1
    print(f"loss {sum(r['steps'][:n]) / n:.4f} (first steps) -> {sum(r['steps'][-n:]) / n:.4f} (last); "
          f"inputs per expert on the test set {r['expert_use']}; test accuracy {r['test_acc']:.3f}")


if __name__ == "__main__":
    main()
