"""The GCN of examples/gcn.py trained on 2 processes with torch.distributed (gloo on loopback)
and DistributedDataParallel, the normalized adjacency partitioned by rows: this is how a user
past one machine runs Scorch, on torch.distributed.

    python examples/distributed_gcn.py                          # 2 processes, Cora scale
    python examples/distributed_gcn.py --dataset pubmed --epochs 50
    python examples/distributed_gcn.py --dropout 0 --check      # losses equal to one process

Each rank keeps its block of rows of A_hat (a scorch CSR tensor) and the rows' labels; the
features and the weights are replicated. A layer computes its own rows, ``A_hat[rows] @ (H W)``,
and the hidden rows of all ranks are gathered (``dist.all_gather`` in a small autograd Function)
before the second layer. DDP averages the weight gradients; each rank's loss is
scaled so that the average is the gradient of the single-process loss. With dropout the masks
are drawn per rank, so losses match the single-process run only with ``--dropout 0``.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import sys
from pathlib import Path
from typing import List

import scorch as torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scorch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import apply_common_args, progress  # noqa: E402
from gcn import GCN, graph_args, graph_from_args, train  # noqa: E402


class AllGatherRows(torch.autograd.Function):
    """Every rank's block of rows, concatenated; the backward sums the gradients of all ranks
    and keeps this rank's block."""

    @staticmethod
    def forward(ctx, block: torch.Tensor) -> torch.Tensor:
        blocks = [torch.empty_like(block) for _ in range(dist.get_world_size())]
        dist.all_gather(blocks, block.contiguous())
        return torch.cat(blocks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


class RowPartitionedGCN(GCN):
    """The GCN on one rank's rows: layer outputs are computed for rows [lo, hi) only."""

    def __init__(self, *args, n: int, world_size: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.n, self.world_size = n, world_size
        self.chunk = -(-n // world_size)  # rows per rank (the last rank's block is padded)

    def forward(self, a_rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(a_rows, x))
        h = F.dropout(h, self.dropout, self.training)
        h = F.pad(h, (0, 0, 0, self.chunk - h.shape[0]))  # all_gather needs equal blocks
        h_all = AllGatherRows.apply(h)[: self.n]
        return self.conv2(a_rows, h_all)


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, results) -> None:
    faulthandler.enable()  # a crash in torch.distributed's C++ prints where Python was
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        apply_common_args(args)
        graph = graph_from_args(args)
        n = graph.a_hat.shape[0]
        chunk = -(-n // world_size)
        lo, hi = rank * chunk, min(n, (rank + 1) * chunk)
        a_rows = graph.a_hat[lo:hi]                    # this rank's rows: a scorch CSR tensor
        y_rows, train_rows = graph.y[lo:hi], graph.train[lo:hi]
        n_train = int(graph.train.sum())
        x, classes = graph.x, int(graph.y.max()) + 1
        del graph                                      # keep only this rank's rows of A_hat

        torch.manual_seed(args.seed)                   # the same initial weights as gcn.train
        model = RowPartitionedGCN(x.shape[1], args.hidden, classes, args.dropout, n=n,
                                  world_size=world_size)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr, weight_decay=5e-4)
        losses: List[float] = []
        for _ in progress(range(args.epochs), f"rank {rank} epochs", args.epochs, args.quiet or rank > 0):
            opt.zero_grad()
            out = ddp(a_rows, x)
            # sum over this rank's training rows / all training rows; DDP divides the summed
            # gradients by world_size, so scale by it: the result is the one-process gradient
            local = F.cross_entropy(out[train_rows], y_rows[train_rows], reduction="sum") / n_train
            (local * world_size).backward()
            opt.step()
            total = local.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item())
        if rank == 0:
            results.put(losses)
        dist.barrier()   # both ranks done with every collective before either tears down
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_distributed(args: argparse.Namespace, world_size: int = 2) -> List[float]:
    """Run the training on world_size processes; the global loss per epoch."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world_size, free_port(), args, results), nprocs=world_size,
                       join=True, start_method="spawn")
    return results.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    graph_args(parser)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--check", action="store_true",
                        help="also train in one process and compare the losses (use with --dropout 0)")
    args = parser.parse_args()
    losses = train_distributed(args, args.world_size)
    print(f"{args.world_size} processes: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if args.check:
        apply_common_args(args)
        single = train(graph_from_args(args), args.hidden, args.epochs, args.lr,
                       dropout=args.dropout, seed=args.seed, quiet=args.quiet)["losses"]
        worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, single))
        print(f"1 process:   loss {single[0]:.4f} -> {single[-1]:.4f}; largest relative "
              f"difference per epoch {worst:.2e}")
        if worst > 1e-4:
            raise SystemExit("losses differ from the single-process run")


if __name__ == "__main__":
    main()
