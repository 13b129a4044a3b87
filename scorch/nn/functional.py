"""``scorch.nn.functional``: torch.nn.functional; sparse operands dispatch to scorch through
``SparseTensor.__torch_function__``, so torch's own functions are re-exported unchanged,
except ``dropout``, whose dense path draws its mask faster (``scorch.nn.dropout``)."""
import torch.nn.functional as _torch_F
globals().update({k: getattr(_torch_F, k) for k in dir(_torch_F) if not k.startswith('_')})

from .dropout import dropout  # noqa: E402,F401


def __getattr__(name: str):
    return getattr(_torch_F, name)


def __dir__():
    return sorted(set(dir(_torch_F)) | set(globals()))
