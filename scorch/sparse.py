"""``scorch.sparse``: torch.sparse; functions with sparse support in scorch take
scorch sparse tensors through ``SparseTensor.__torch_function__``."""
import torch.sparse as _torch_sparse
globals().update({k: getattr(_torch_sparse, k) for k in dir(_torch_sparse) if not k.startswith('_')})


def __getattr__(name: str):
    return getattr(_torch_sparse, name)


def __dir__():
    return sorted(set(dir(_torch_sparse)) | set(globals()))
