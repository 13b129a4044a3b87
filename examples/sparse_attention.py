"""BigBird-style sparse attention (window + global + random blocks) in a small text classifier
on the IMDB reviews, as plain PyTorch with ``import scorch as torch``: the attention pattern is a
scorch sparse tensor, the scores are an SDDMM on it, the softmax runs over the stored entries,
and the weighted sum is a sparse @ dense product. Nothing n x n is ever formed.

    python examples/sparse_attention.py                                 # 2,000 reviews, 512 tokens
    python examples/sparse_attention.py --train-size 5000 --epochs 2 --threads 2
    python examples/sparse_attention.py --attention dense               # dense masked attention

Paper setup (Appendix E.4, scaled down to run in minutes on a laptop CPU): embedding and hidden
size 128, FFN 256 with GELU, 2 layers, 4 heads, block size 16, 2 global blocks, 2 random blocks
per block row, a sliding window of 3 blocks; AdamW lr 1e-3. Reports the test accuracy.
``--attention dense`` runs the same model with dense masked attention (the usual way to get a
BigBird pattern in plain PyTorch: n x n scores, masked_fill, softmax), for comparison.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import scorch as torch
from scorch import nn
from scorch.datasets import data_dir
from scorch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_common_args, apply_common_args, progress  # noqa: E402

PAD, UNK = 0, 1


def bigbird_pattern(n: int, block: int = 16, window: int = 3, global_blocks: int = 2,
                    random_blocks: int = 2, generator=None) -> torch.Tensor:
    """The BigBird attention pattern over n tokens as a scorch CSR matrix of ones: block i
    attends to its ``window`` neighbouring blocks, to ``random_blocks`` random blocks and to the
    first ``global_blocks`` blocks, which attend to everything. Built from block coordinates."""
    if n % block:
        raise ValueError(f"sequence length {n} is not a multiple of the block size {block}")
    nb = n // block
    rows = torch.arange(nb)
    pairs = [torch.stack([rows, (rows + off).clamp(0, nb - 1)]) for off in range(-(window // 2), window // 2 + 1)]
    pairs.append(torch.stack([rows.repeat_interleave(random_blocks),
                              torch.randint(0, nb, (nb * random_blocks,), generator=generator)]))
    g = torch.arange(min(global_blocks, nb))
    pairs += [torch.stack([g.repeat_interleave(nb), rows.repeat(len(g))]),
              torch.stack([rows.repeat(len(g)), g.repeat_interleave(nb)])]
    blocks = torch.cat(pairs, 1)
    blocks = (blocks[0] * nb + blocks[1]).unique()
    bi, bj = blocks // nb, blocks % nb
    t = torch.arange(block)
    i = (bi[:, None, None] * block + t[None, :, None]).expand(-1, block, block).reshape(-1)
    j = (bj[:, None, None] * block + t[None, None, :]).expand(-1, block, block).reshape(-1)
    return torch.sparse_tensor((torch.stack([i, j]), torch.ones(i.numel())), size=(n, n), format="csr")


class BigBirdSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, pattern: torch.Tensor, dense: bool = False,
                 attention_dropout: float = 0.0):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dense, self.attention_dropout = dense, attention_dropout
        self.register_buffer("pattern", pattern)
        if dense:  # the baseline: a dense boolean n x n mask
            self.register_buffer("allowed", pattern.to_dense() != 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.dense:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            probs = scores.masked_fill(~self.allowed, float("-inf")).softmax(-1)
        else:
            # SDDMM: scores only where the pattern stores an entry; softmax over stored entries
            scores = torch.einsum("ij,bhid,bhjd->bhij", self.pattern, q, k) / math.sqrt(self.head_dim)
            probs = torch.softmax(scores, dim=-1)
        if self.attention_dropout:
            probs = F.dropout(probs, self.attention_dropout, self.training)
        y = probs @ v                                   # (b, heads, n, head_dim), dense
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, pattern, dense: bool, dropout: float,
                 attention_dropout: float):
        super().__init__()
        self.attention = BigBirdSelfAttention(dim, heads, pattern, dense, attention_dropout)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class BigBirdClassifier(nn.Module):
    def __init__(self, vocab: int, seq_len: int, classes: int = 2, dim: int = 128, heads: int = 4,
                 ffn: int = 256, layers: int = 2, block: int = 16, dense: bool = False,
                 dropout: float = 0.1, attention_dropout: float = 0.0, seed: int = 0):
        super().__init__()
        pattern = bigbird_pattern(seq_len, block, generator=torch.Generator().manual_seed(seed))
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn, pattern, dense, dropout, attention_dropout)
                                    for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        for layer in self.layers:
            x = layer(x)
        keep = (tokens != PAD).unsqueeze(-1).float()
        return self.head((x * keep).sum(1) / keep.sum(1).clamp(min=1))


def load_reviews(folder: str = None, limit: int = None, seed: int = 0) -> Tuple[List[str], torch.Tensor]:
    """IMDB training reviews (shuffled with the seed: the file is sorted by label)."""
    with gzip.open(data_dir(folder) / "imdb" / "imdb_train_25k.csv.gz", "rt", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    if limit:
        order = order[:limit]
    return [rows[i]["text"] for i in order], torch.tensor([int(rows[i]["label"]) for i in order])


def tokenize(texts: List[str], seq_len: int, vocab: Dict[str, int] = None, size: int = 20000):
    """Lower-case word ids padded/truncated to seq_len; the vocabulary comes from these texts
    when not given."""
    words = [re.findall(r"[a-z0-9']+", t.lower().replace("<br />", " ")) for t in texts]
    if vocab is None:
        counts = collections.Counter(w for ws in words for w in ws)
        vocab = {w: i + 2 for i, (w, _) in enumerate(counts.most_common(size - 2))}
    ids = torch.full((len(texts), seq_len), PAD, dtype=torch.long)
    for r, ws in enumerate(words):
        row = [vocab.get(w, UNK) for w in ws[:seq_len]]
        ids[r, :len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, vocab


def train(train_ids, y_train, test_ids, y_test, vocab_size: int, block: int = 16, epochs: int = 1,
          batch_size: int = 32, lr: float = 1e-3, dense: bool = False, attention_dropout: float = 0.0,
          seed: int = 0, quiet: bool = False, **model_kwargs) -> Dict[str, object]:
    torch.manual_seed(seed)
    model = BigBirdClassifier(vocab_size, train_ids.shape[1], block=block, dense=dense,
                              attention_dropout=attention_dropout, seed=seed, **model_kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    steps: List[float] = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(train_ids), generator=g)
        starts = range(0, len(train_ids), batch_size)
        for i in progress(starts, f"bigbird epoch {epoch + 1}/{epochs}", len(starts), quiet):
            idx = order[i: i + batch_size]
            loss = F.cross_entropy(model(train_ids[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps.append(loss.item())
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(test_ids), batch_size):
            correct += (model(test_ids[i: i + batch_size]).argmax(1) == y_test[i: i + batch_size]).sum().item()
    return {"steps": steps, "test_acc": correct / len(test_ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--attention", choices=["sparse", "dense"], default="sparse")
    parser.add_argument("--attention-dropout", type=float, default=0.0, help="the paper uses 0.1")
    add_common_args(parser)
    args = parser.parse_args()
    apply_common_args(args)
    texts, labels = load_reviews(args.data_dir, args.train_size + args.test_size, args.seed)
    ids, vocab = tokenize(texts[: args.train_size], args.seq_len, size=args.vocab)
    test_ids, _ = tokenize(texts[args.train_size:], args.seq_len, vocab)
    pattern = bigbird_pattern(args.seq_len, args.block)
    print(f"IMDB: {len(ids)} train / {len(test_ids)} test reviews, {args.seq_len} tokens, "
          f"vocabulary {len(vocab) + 2}; attention pattern {pattern.nnz} of {args.seq_len ** 2} "
          f"({pattern.nnz / args.seq_len ** 2:.1%}) stored, {args.attention} attention")
    r = train(ids, labels[: args.train_size], test_ids, labels[args.train_size:], len(vocab) + 2,
              args.block, args.epochs, args.batch_size, args.lr, args.attention == "dense",
              args.attention_dropout, args.seed, args.quiet)
    n = len(r["steps"]) // 10 or 1
    print(f"loss {sum(r['steps'][:n]) / n:.4f} (first steps) -> {sum(r['steps'][-n:]) / n:.4f} (last); "
          f"test accuracy {r['test_acc']:.3f}")


if __name__ == "__main__":
    main()
