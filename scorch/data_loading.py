"""Sparse tensors between processes: DataLoader batches and multiprocessing queues.

``torch.utils.data.default_collate`` for sparse samples: a batch of SparseTensors is
their ``torch.stack``, sparse, in the main process and in DataLoader workers alike.

torch's own rule for tensors would, in a worker, allocate a shared dense block of the
batch's full size and stack into it (``out=``): a dense batch (4 samples of 3000 x 3000:
144 MB, where the samples store a few entries). torch's collate looks a sample's exact type
up in ``default_collate_fn_map`` before its ``isinstance`` rules, so this entry wins for
SparseTensor samples and leaves every other type to torch.

A queue (``torch.multiprocessing``) refuses a non-leaf sparse tensor that requires grad, as
torch refuses a dense one: autograd does not cross processes, and the copy would arrive as a
fresh leaf whose gradients reach nothing."""
from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import collate as _collate

from .tensor_type import SparseTensor

__all__ = ["collate_sparse"]

#: torch's words (torch.multiprocessing.reductions), for the same refusal
NON_LEAF_ACROSS_PROCESSES = (
    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does "
    "not support crossing process boundaries.  If you just want to transfer the data, call "
    "detach() on the tensor before serializing (e.g., putting it on the queue).")


def collate_sparse(batch, *, collate_fn_map=None) -> torch.Tensor:
    """Stack sparse samples along a new first dim (a sparse batch; the samples' shapes must
    agree, as torch's stack says). In a worker process, samples that require grad are
    refused here, where the DataLoader carries the error to the main process (a batch
    autograd recorded could not be sent, and the send failed in the result queue's thread:
    the main process waited forever); torch refuses dense ones the same way."""
    if torch.is_grad_enabled() and get_worker_info() is not None and \
            any(isinstance(x, torch.Tensor) and x.requires_grad for x in batch):
        raise RuntimeError(
            "collate: a sample requires grad, and a DataLoader worker cannot send a batch that "
            "autograd records to the main process; return samples without grad from the "
            "dataset (.detach()), or use num_workers=0")
    return torch.stack(list(batch), 0)


_collate.default_collate_fn_map[SparseTensor] = collate_sparse


def _reduce_for_processes(t: SparseTensor):
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(NON_LEAF_ACROSS_PROCESSES)
    return t.__reduce_ex__(2)


ForkingPickler.register(SparseTensor, _reduce_for_processes)
