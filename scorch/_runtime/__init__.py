"""Compiled runtime: level-format conversions (``convert``) and the sparse workspaces that
generated kernels cimport (``workspace``). Built in place by ``python setup.py build_ext --inplace``."""
