"""``scorch.nn``: torch.nn, with ``functional`` extended for sparse operands and ``Dropout``'s
dense mask drawn faster (``scorch.nn.dropout``)."""
import torch.nn as _torch_nn
globals().update({k: getattr(_torch_nn, k) for k in dir(_torch_nn) if not k.startswith('_')})

import importlib as _importlib

functional = _importlib.import_module(".functional", __name__)
from .dropout import Dropout  # noqa: E402,F401


def __getattr__(name: str):
    return getattr(_torch_nn, name)


def __dir__():
    return sorted(set(dir(_torch_nn)) | set(globals()))
