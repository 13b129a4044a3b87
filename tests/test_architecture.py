"""The package's shape: no import cycles among scorch's modules (counting imports inside
functions too: a lazy import hides a cycle, it does not remove it) and no submodule shadowed
by a function or class of the same name."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path
from typing import Dict, List, Set

import scorch

ROOT = Path(scorch.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(mod: str, is_pkg: bool, level: int, target: str) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph() -> Dict[str, Set[str]]:
    """module -> the scorch modules it imports (anywhere in its body)."""
    mods = _modules()
    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (_resolve(mod, is_pkg, node.level, node.module or "") if node.level
                        else node.module or "")
                # ``from pkg import sub`` imports the submodule when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                while t and t not in mods:   # ``import scorch.x.y`` where y is an attribute
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_imports():
    g = import_graph()
    assert "scorch.formats" in g["scorch.level_storage"]
    assert "scorch.tensor_type" in g["scorch.constructors"]


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles among scorch modules: " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_submodule_shadowed():
    """``scorch.X`` is the module ``scorch/X.py`` wherever both exist (the old
    ``scorch/tensor.py`` was hidden behind the ``scorch.tensor`` function)."""
    bad = []
    for info in pkgutil.walk_packages(scorch.__path__, "scorch."):
        if info.name.endswith("__main__"):
            continue
        parent, _, leaf = info.name.rpartition(".")
        pkg = importlib.import_module(parent)
        importlib.import_module(info.name)
        if not isinstance(getattr(pkg, leaf, None), types.ModuleType):
            bad.append(info.name)
    assert not bad, f"submodules shadowed by another object of the same name: {bad}"
