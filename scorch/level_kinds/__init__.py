"""Level kinds: one module per kind, each registered here (one line a kind)."""
from .base import LevelKind, parse_level, register, registered  # noqa: F401
from .compressed_level import Compressed
from .coordinate_level import Coordinate
from .dense_level import Dense
from .singleton_level import Singleton

dense = register(Dense())
compressed = register(Compressed())
coordinate = register(Coordinate())
singleton = register(Singleton())

__all__ = ["LevelKind", "parse_level", "register", "registered", "dense", "compressed",
           "coordinate", "singleton"]
