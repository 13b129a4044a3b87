"""Make ``import scorch.X`` work for every torch submodule scorch does not extend.

``scorch.X`` attribute access already falls back to ``torch.X`` (module ``__getattr__``);
this finder does the same for import statements (``import scorch.linalg``), by aliasing
the torch module object itself, so nothing is copied or wrapped.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _TorchAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("scorch.") or fullname.startswith("scorch._"):
            return None
        torch_name = "torch." + fullname[len("scorch."):]
        try:
            spec = importlib.util.find_spec(torch_name)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module("torch." + spec.name[len("scorch."):])
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    # appended last: scorch's own submodules are always found first
    if not any(isinstance(f, _TorchAliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_TorchAliasFinder())
