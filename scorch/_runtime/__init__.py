"""Compiled runtime: level-format conversions (``convert``) and the sparse workspaces that
generated kernels cimport (``workspace``). Built in place by ``python setup.py build_ext --inplace``."""
from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def unbuilt() -> list:
    """The runtime modules that have a ``.pyx`` here but no compiled extension beside it
    (a source checkout that was never built or installed)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return sorted(p.stem for p in _HERE.glob("*.pyx")
                  if not any((_HERE / (p.stem + s)).exists() for s in suffixes))


def require_built() -> None:
    """Raise an ImportError that says why when this ``scorch`` is a source tree without its
    compiled extensions: Python found it first because its parent folder is on ``sys.path``
    (the current directory, or PYTHONPATH), ahead of any installed copy."""
    missing = unbuilt()
    if not missing:
        return
    package = _HERE.parent
    root = package.parent
    other = _installed_elsewhere(root)
    shadowed = (f" It hides the installed scorch at {other}, which Python imports from "
                f"another directory." if other else "")
    raise ImportError(
        f"scorch: the source tree at {package} has no built extensions (scorch._runtime: "
        f"{', '.join(missing)} not compiled); Python imports it because {root} is on sys.path "
        f"(the current directory or PYTHONPATH).{shadowed} Run `pip install -e .` in {root} "
        f"to build it, or run Python from another directory.")


def _installed_elsewhere(root: Path):
    """Where Python would find ``scorch`` with ``root`` off ``sys.path`` (an editable
    install's finder included), or None."""
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != root]
    for finder in sys.meta_path:
        try:
            if isinstance(finder, type) and issubclass(finder, importlib.machinery.PathFinder):
                spec = finder.find_spec("scorch", elsewhere)
            else:
                spec = finder.find_spec("scorch", None)
        except Exception:  # noqa: BLE001  (a third-party finder: only a hint is at stake)
            continue
        if spec is not None and spec.origin and Path(spec.origin).resolve().parent.parent != root:
            return Path(spec.origin).resolve().parent
    return None
