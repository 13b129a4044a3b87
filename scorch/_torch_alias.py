"""Make ``import scorch.X`` work for every torch submodule scorch does not extend.

``scorch.X`` attribute access already falls back to ``torch.X`` (module ``__getattr__``);
this finder does the same for import statements (``import scorch.linalg``), by aliasing
the torch module object itself, so nothing is copied or wrapped.

Two places on ``sys.meta_path``:

- last, for a child of one of scorch's own packages (``scorch.linalg``, ``scorch.nn.init``):
  scorch's own submodules are always found first;
- first, for a child of an alias (``scorch.optim.lr_scheduler``): the parent *is* torch's
  module, whose ``__path__`` is torch's folder, so Python's ``PathFinder`` would execute
  torch's source file again as a new module and rebind ``torch.optim.lr_scheduler`` to
  that copy (duplicate classes for the whole process; a second registration of a pybind
  type aborts the interpreter). The alias must win before ``PathFinder`` runs.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _TorchAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, children_of_aliases: bool = False):
        self.children_of_aliases = children_of_aliases

    def _torch_name(self, fullname):
        """The torch module ``fullname`` stands for, or None when this finder does not
        answer for it."""
        if not fullname.startswith("scorch.") or fullname.startswith("scorch._"):
            return None
        parent_name, _, tail = fullname.rpartition(".")
        parent = getattr(sys.modules.get(parent_name), "__name__", parent_name)
        if (parent != parent_name) != self.children_of_aliases:
            return None
        if parent != parent_name:             # parent is an alias of torch module `parent`
            return parent + "." + tail
        return "torch." + fullname[len("scorch."):]

    def find_spec(self, fullname, path=None, target=None):
        torch_name = self._torch_name(fullname)
        if torch_name is None:
            return None
        try:
            spec = importlib.util.find_spec(torch_name)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, self)
        spec.loader_state = torch_name
        return spec

    def create_module(self, spec):
        module = importlib.import_module(spec.loader_state)
        # the import system sets ``module.__spec__`` to this alias spec after this call;
        # keep torch's own (``importlib.reload(torch.optim)``, ``find_spec("torch.optim")``)
        spec.loader_state = (spec.loader_state, module.__spec__)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        torch_spec = module.__spec__.loader_state[1]
        if torch_spec is not None:
            module.__spec__ = torch_spec


def install() -> None:
    if not any(isinstance(f, _TorchAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchAliasFinder(children_of_aliases=True))
        sys.meta_path.append(_TorchAliasFinder())
