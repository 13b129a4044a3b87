"""What the model examples share: the data folder flag, thread flag and a progress bar
(tqdm when it is installed, else a plain line every few steps)."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Iterable, Iterator, Optional, TypeVar

import scorch as torch

T = TypeVar("T")


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None,
                        help="folder with matrices/, mnist/, imdb/ (default: $SCORCH_DATA_DIR or ../shared/data)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress output, only the final metric")


def apply_common_args(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


def progress(items: Iterable[T], desc: str, total: Optional[int] = None, quiet: bool = False) -> Iterator[T]:
    """Iterate with a progress bar on stderr (tqdm if installed, else a line per tenth)."""
    if quiet:
        yield from items
        return
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(items, desc=desc, total=total, leave=False, file=sys.stderr)
        return
    total = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    start, every = time.perf_counter(), max(1, (total or 100) // 10)
    for i, item in enumerate(items):
        if i % every == 0:
            of = f"/{total}" if total else ""
            print(f"{desc}: {i}{of} ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
        yield item

