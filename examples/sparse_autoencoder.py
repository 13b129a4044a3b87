"""The paper's sparse autoencoder on MNIST or Fashion-MNIST, as plain PyTorch with
``import scorch as torch``: each batch goes in as a sparse CSR tensor (most pixels are 0), the
encoder is a linear layer whose weight is a scorch sparse tensor (a fixed random pattern, or
pruned by magnitude while training), the decoder a dense linear layer; MSE reconstruction loss.

    python examples/sparse_autoencoder.py                          # MNIST, 10 epochs
    python examples/sparse_autoencoder.py --dataset fashion-mnist --epochs 3
    python examples/sparse_autoencoder.py --prune --weight-density 0.05 --threads 2

Paper setup (Appendix E.3): encoder sparse Linear(784 -> 256) + ReLU, decoder Linear(256 -> 784)
+ sigmoid, Adam lr 0.01, batch 64, 10 epochs. Reports the test reconstruction loss.
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

FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def load_images(dataset: str, split: str, folder: str = None, limit: int = None) -> torch.Tensor:
    """Images of an IDX data set as a float tensor (N, 784) in [0, 1]."""
    images = load_idx(data_dir(folder) / dataset / FILES[split][0])
    x = torch.from_numpy(images.reshape(len(images), -1).copy()).float() / 255
    return x[:limit] if limit else x


def random_pattern(rows: int, cols: int, density: float, generator=None) -> torch.Tensor:
    """A scorch CSR matrix with about ``density * cols`` normal entries per row at random
    columns, built from coordinates (no dense rows x cols array)."""
    per_row = max(1, round(cols * density))
    r = torch.arange(rows).repeat_interleave(per_row)
    c = torch.randint(0, cols, (rows * per_row,), generator=generator)
    lin = (r * cols + c).unique()
    return torch.sparse_tensor((torch.stack([lin // cols, lin % cols]), torch.randn(lin.numel(), generator=generator)),
                               size=(rows, cols), format="csr")


class SparseLinear(nn.Module):
    """A linear layer whose weight is a sparse parameter: only the stored weights exist and
    are trained (the optimizer keeps the pattern)."""

    def __init__(self, in_features: int, out_features: int, density: float, generator=None):
        super().__init__()
        w = random_pattern(out_features, in_features, density, generator)
        # Kaiming-uniform-like scale for the ~density * in_features inputs of each unit
        self.weight = nn.Parameter(w * (1.0 / math.sqrt(max(1.0, density * in_features))))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @torch.no_grad()
    def prune_(self, keep: float) -> None:
        """Keep the ``keep`` fraction of stored weights with the largest magnitude."""
        w = self.weight.to_format("coo")
        values, indices = w.values(), w.indices()
        k = max(1, int(values.numel() * keep))
        top = values.abs().topk(k).indices
        pruned = torch.sparse_tensor((indices[:, top], values[top]), size=w.shape, format="csr")
        self.weight = nn.Parameter(pruned)


class SparseAutoencoder(nn.Module):
    def __init__(self, inputs: int = 784, hidden: int = 256, density: float = 0.1, generator=None):
        super().__init__()
        self.encoder = SparseLinear(inputs, hidden, density, generator)
        self.decoder = nn.Linear(hidden, inputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.decoder(F.relu(self.encoder(x))))


def batches(x: torch.Tensor, batch_size: int, shuffle: bool, generator=None):
    order = torch.randperm(len(x), generator=generator) if shuffle else torch.arange(len(x))
    for i in range(0, len(x), batch_size):
        yield x[order[i: i + batch_size]]


def evaluate(model: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for xb in batches(x, batch_size, shuffle=False):
            xs = torch.sparse_tensor(xb, format="csr")
            total += F.mse_loss(model(xs), xb, reduction="sum").item()
    return total / x.numel()


def train(x_train: torch.Tensor, x_test: torch.Tensor, hidden: int = 256, density: float = 0.1,
          epochs: int = 10, batch_size: int = 64, lr: float = 0.01, prune: bool = False,
          seed: int = 0, quiet: bool = False) -> Dict[str, object]:
    """Train; returns the loss of every step, the mean loss per epoch and the test loss.
    With ``prune`` the encoder starts at 4x the target density and is pruned by magnitude
    after each epoch until it reaches the target."""
    g = torch.Generator().manual_seed(seed)
    start = min(1.0, 4 * density) if prune else density
    model = SparseAutoencoder(x_train.shape[1], hidden, start, g)
    steps: List[float] = []
    epoch_losses: List[float] = []
    for epoch in range(epochs):
        opt = torch.optim.Adam(model.parameters(), lr=lr)  # fresh after a pruning step
        model.train()
        n_batches = -(-len(x_train) // batch_size)
        seen = []
        for xb in progress(batches(x_train, batch_size, True, g), f"sae epoch {epoch + 1}/{epochs}",
                           n_batches, quiet):
            xs = torch.sparse_tensor(xb, format="csr")     # the batch as a sparse input
            loss = F.mse_loss(model(xs), xb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(loss.item())
        steps += seen
        epoch_losses.append(sum(seen) / len(seen))
        w = model.encoder.weight
        if prune and w.nnz > density * w.shape[0] * w.shape[1] * 1.01:
            target = density * w.shape[0] * w.shape[1]
            model.encoder.prune_(max(target / w.nnz, 0.5))
        if not quiet:
            print(f"epoch {epoch + 1}: train loss {epoch_losses[-1]:.5f}, encoder weight "
                  f"{model.encoder.weight.nnz} stored ({model.encoder.weight.format})", file=sys.stderr)
    return {"steps": steps, "epochs": epoch_losses, "test_loss": evaluate(model, x_test),
            "weight_nnz": model.encoder.weight.nnz}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["mnist", "fashion-mnist"], default="mnist")
    parser.add_argument("--train-size", type=int, default=None, help="first N training images (default: all)")
    parser.add_argument("--test-size", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--weight-density", type=float, default=0.1)
    parser.add_argument("--prune", action="store_true", help="start denser and prune by magnitude each epoch")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    add_common_args(parser)
    args = parser.parse_args()
    apply_common_args(args)
    x_train = load_images(args.dataset, "train", args.data_dir, args.train_size)
    x_test = load_images(args.dataset, "test", args.data_dir, args.test_size)
    print(f"{args.dataset}: {len(x_train)} train / {len(x_test)} test images, "
          f"{(x_train != 0).float().mean().item():.1%} of pixels non-zero")
    r = train(x_train, x_test, args.hidden, args.weight_density, args.epochs, args.batch_size,
              args.lr, args.prune, args.seed, args.quiet)
    print(f"train loss {r['epochs'][0]:.5f} -> {r['epochs'][-1]:.5f}; encoder weight "
          f"{r['weight_nnz']} stored; test reconstruction loss (MSE) {r['test_loss']:.5f}")


if __name__ == "__main__":
    main()
